"""Azure LLM inference traces (Splitwise, 2023): CSV of TIMESTAMP, ContextTokens, GeneratedTokens.

Timestamps are absolute wall-clock strings with up to 7 fractional digits
(`2023-11-16 18:15:46.6805900`); they become milliseconds after the first row. The file has no
prefix information, so every prompt's content is unique (no prefix-cache hits). The reader
streams rows and names the file and line of any problem.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

from servesim.workload.errors import (
    SkipCounter,
    TraceError,
    TraceRow,
    bounded,
    existing,
    not_utf8,
    open_text,
    utf8_message,
)

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


EPOCH = datetime(1970, 1, 1)
TICKS_PER_S = 10_000_000  # the trace's resolution: 100 ns


def parse_timestamp_ticks(text: str) -> int:
    """100 ns ticks since the epoch (UTC-naive) of `YYYY-MM-DD HH:MM:SS[.fffffff]`, exact."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    if frac and not frac.isdigit():
        raise ValueError(f"bad fractional seconds {frac!r}")
    seconds = (base - EPOCH) // timedelta(seconds=1)
    return seconds * TICKS_PER_S + int((frac + "0000000")[:7])


def _count(value: str, what: str, where: str, minimum: int) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {what} must be an integer, got {value!r}") from None
    if n < minimum:
        raise TraceError(f"{where}: {what} must be >= {minimum}, got {n}")
    return n


def _check_utf8(fields: list[str], names: list[str], where: str) -> None:
    """A TraceError at `where` if a field holds a byte that is not UTF-8 (fields are read by
    `open_text`)."""
    for k, text in enumerate(fields):
        bad = not_utf8(text)
        if bad is not None:
            byte, offset = bad
            name = f" ({names[k]})" if k < len(names) else ""
            head = fields[0][:2].encode("utf-8", "surrogateescape")
            message = utf8_message(byte, offset, f"field {k + 1}{name}", head)
            raise TraceError(f"{where}: {message}")


def read_azure(
    path: str | Path,
    skip_malformed: bool = False,
    skipped: SkipCounter | None = None,
    max_requests: int | None = None,
) -> Iterator[TraceRow]:
    """Stream rows as TraceRow (no hash ids; timestamps relative to the first row)."""
    path = existing(path)
    return bounded(path, _rows(path, skip_malformed, skipped), max_requests)


def _rows(path: Path, skip_malformed: bool, skipped: SkipCounter | None) -> Iterator[TraceRow]:
    skipped = skipped if skipped is not None else SkipCounter()
    t0: int | None = None
    last = -1
    with open_text(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return
        _check_utf8(header, [], f"{path}:{reader.line_num}")
        header = [h.strip() for h in header]
        if tuple(header[:3]) != COLUMNS:
            raise TraceError(f"{path}:1: expected header {','.join(COLUMNS)}, got {header}")
        for fields in reader:
            line = reader.line_num
            if not fields or not any(f.strip() for f in fields):
                continue
            where = f"{path}:{line}"
            try:
                if not "".join(fields).isascii():  # one flag test for the usual ASCII row
                    _check_utf8(fields, header, where)
                if len(fields) < 3:
                    raise TraceError(f"{where}: expected 3 fields, got {len(fields)}")
                try:
                    ts = parse_timestamp_ticks(fields[0])
                except ValueError:
                    raise TraceError(
                        f"{where}: TIMESTAMP must look like 2023-11-16 18:15:46.6805900, "
                        f"got {fields[0]!r}"
                    ) from None
                if ts < last:
                    raise TraceError(
                        f"{where}: TIMESTAMP {fields[0]} is earlier than the previous row's; "
                        "arrivals must be in time order"
                    )
                inp = _count(fields[1], "ContextTokens", where, 1)
                out = _count(fields[2], "GeneratedTokens", where, 0)
            except TraceError as e:
                if not skip_malformed:
                    raise
                skipped.add(str(e))
                continue
            last = ts
            if t0 is None:
                t0 = ts
            yield TraceRow(line, (ts - t0) / (TICKS_PER_S / 1000), inp, out, [])
