"""Mooncake JSONL traces: one request per line, prompt content as hash ids per trace block.

Row fields (aliases in parentheses): `hash_ids` (required), `output_length` (`output_tokens`,
required, >= 0), `input_length` (`input_tokens`, default len(hash_ids) x trace_block_size, must
fit in that capacity), `timestamp` (`created_time`, ms; required on a session's first turn),
`session_id` (rows sharing it form one closed-loop multi-turn session), `delay` (`delay_ms`,
ms after the previous turn completes; not allowed on a first turn; when absent on a later turn,
the difference of the two turns' timestamps), `request_id`. Unknown fields are ignored.

The reader streams: it parses one line at a time and yields validated rows with their line
numbers. Every problem is a `TraceError` naming the file and line (a byte that is not UTF-8,
anywhere in the row, included); with `skip_malformed` a bad row is skipped and counted
instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servesim.workload.errors import (
    SkipCounter,
    TraceError,
    TraceRow,
    bounded,
    check_utf8,
    existing,
    open_text,
)

__all__ = ["SkipCounter", "TraceRow", "read_mooncake"]


def _field(obj: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in obj:
            return obj[name]
    return None


def _int(value: Any, what: str, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"{where}: {what} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise TraceError(f"{where}: {what} must be an integer, got {value!r}")
        value = int(value)
    if value < minimum:
        raise TraceError(f"{where}: {what} must be >= {minimum}, got {value}")
    return value


def _ms(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"{where}: {what} must be a number of milliseconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: {what} must be finite and >= 0, got {value!r}")
    return float(value)


def non_negative_ints(values: Any) -> bool:
    """Whether `values` is a list of non-negative ints (bools are not), checked in C: the set of
    the elements' exact types, then their minimum."""
    return isinstance(values, list) and (
        not values or (set(map(type, values)) == {int} and min(values) >= 0)
    )


def parse_row(obj: Any, where: str, line: int, trace_block_size: int) -> TraceRow:
    """Validate one decoded JSON row."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    hash_ids = obj.get("hash_ids")
    if hash_ids is None:
        raise TraceError(f"{where}: trace line {line} is missing hash_ids")
    if not non_negative_ints(hash_ids):
        raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
    out = _field(obj, "output_length", "output_tokens")
    if out is None:
        raise TraceError(f"{where}: trace line {line} is missing output_length")
    output_length = _int(out, "output_length", where, 0)
    capacity = len(hash_ids) * trace_block_size
    inp = _field(obj, "input_length", "input_tokens")
    input_length = capacity if inp is None else _int(inp, "input_length", where, 0)
    if input_length > capacity:
        raise TraceError(
            f"{where}: trace line {line} input_length {input_length} exceeds hash_ids capacity "
            f"{capacity} ({len(hash_ids)} hash ids x trace_block_size {trace_block_size})"
        )
    if input_length <= 0:
        raise TraceError(f"{where}: input_length must be positive (got {input_length})")
    ts = _field(obj, "timestamp", "created_time")
    timestamp = None if ts is None else _ms(ts, "timestamp", where)
    delay = _field(obj, "delay", "delay_ms")
    if "delay" in obj and "delay_ms" in obj:
        raise TraceError(f"{where}: sets both delay and delay_ms")
    sid = obj.get("session_id")
    rid = obj.get("request_id")
    return TraceRow(
        line=line,
        timestamp_ms=timestamp,
        input_length=input_length,
        output_length=output_length,
        hash_ids=hash_ids,
        session_id=None if sid is None else str(sid),
        delay_ms=None if delay is None else _ms(delay, "delay", where),
        request_id=None if rid is None else str(rid),
    )


def read_mooncake(
    path: str | Path,
    trace_block_size: int = 512,
    skip_malformed: bool = False,
    skipped: SkipCounter | None = None,
    max_requests: int | None = None,
    require_timestamps: bool = True,
) -> Iterator[TraceRow]:
    """Stream validated rows of a Mooncake JSONL file (blank lines ignored). First turns need
    a timestamp, in time order, unless `require_timestamps` is off (a load that sets its own
    arrival times)."""
    path = existing(path)
    rows = _rows(path, trace_block_size, skip_malformed, skipped, require_timestamps)
    return bounded(path, rows, max_requests)


def _rows(
    path: Path,
    trace_block_size: int,
    skip_malformed: bool,
    skipped: SkipCounter | None,
    require_timestamps: bool,
) -> Iterator[TraceRow]:
    skipped = skipped if skipped is not None else SkipCounter()
    sessions_seen: set[str] = set()
    last_first_turn_ms = -math.inf
    with open_text(path) as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                if not text.isascii():  # the common all-ASCII row pays one flag test
                    check_utf8(text, where)
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    raise TraceError(f"{where}: not valid JSON ({e.msg})") from None
                row = parse_row(obj, where, line_no, trace_block_size)
                first_turn = row.session_id is None or row.session_id not in sessions_seen
                if first_turn:
                    if row.delay_ms is not None and row.session_id is not None:
                        raise TraceError(
                            f"{where}: trace line {line_no} sets delay on the first turn of "
                            f"session {row.session_id}"
                        )
                    if not require_timestamps:
                        pass
                    elif row.timestamp_ms is None:
                        raise TraceError(
                            f"{where}: the first turn of a session needs a timestamp (ms)"
                        )
                    elif row.timestamp_ms < last_first_turn_ms:
                        raise TraceError(
                            f"{where}: timestamp {row.timestamp_ms} is earlier than the previous "
                            f"arrival {last_first_turn_ms}; arrivals must be in time order"
                        )
            except TraceError as e:
                if not skip_malformed:
                    raise
                skipped.add(str(e))
                continue
            if first_turn:
                if row.timestamp_ms is not None:
                    last_first_turn_ms = row.timestamp_ms
                if row.session_id is not None:
                    sessions_seen.add(row.session_id)
            yield row
