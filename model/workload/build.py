"""From a workload config to sessions of requests with engine-block hashes and arrival plans.

A session is a list of requests replayed in order: its first turn arrives at a planned time (or
when a concurrency slot frees), each later turn after its predecessor completes plus its delay.
Rows without a session id are single-request sessions. First-turn times are normalised so the
first arrival is at 0 and divided by `arrival_speedup_ratio` (trace load) or replaced by a
Poisson/constant process (rate load).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servesim.config.schema import (
    AgenticMooncakeWorkload,
    AgenticSyntheticWorkload,
    AzureWorkload,
    DynamoTraceWorkload,
    LoadConfig,
    MooncakeWorkload,
    RateLoad,
    SyntheticWorkload,
    TraceLoad,
    WekaWorkload,
    WorkloadConfig,
)
from servesim.workload.agentic import read_agentic_mooncake
from servesim.workload.agentic_graph import AgenticGraph
from servesim.workload.azure import read_azure
from servesim.workload.errors import TraceError
from servesim.workload.hashing import BlockHasher
from servesim.workload.mooncake import SkipCounter, TraceRow, read_mooncake
from servesim.workload.request import Request
from servesim.workload.synthetic import generate

Session = list[Request]


@dataclass
class Workload:
    sessions: list[Session]
    skipped: SkipCounter = field(default_factory=SkipCounter)

    @property
    def num_requests(self) -> int:
        return sum(len(s) for s in self.sessions)


def read_source(
    cfg: WorkloadConfig, streams: dict[str, np.random.Generator]
) -> AgenticGraph | list[TraceRow] | None:
    """An agentic workload's validated graph (a Dynamo trace without `agent_context`: its
    plain rows); None for the other workloads, which `build_workload` reads."""
    if isinstance(cfg, AgenticMooncakeWorkload):
        return read_agentic_mooncake(cfg.path, cfg.trace_block_size)
    if isinstance(cfg, WekaWorkload):
        from servesim.workload.weka import read_weka

        graph, _basis = read_weka(cfg.path, cfg.trace_block_size, cfg.nested_timestamp_basis)
        return graph
    if isinstance(cfg, DynamoTraceWorkload):
        from servesim.workload.dynamo_trace import read_dynamo_trace

        return read_dynamo_trace(cfg.path, cfg.trace_block_size)
    if isinstance(cfg, AgenticSyntheticWorkload):
        from servesim.workload.agentic_synthetic import generate_agentic

        return generate_agentic(cfg, streams["lengths"])
    return None


def _rows(
    cfg: WorkloadConfig,
    load: LoadConfig,
    skipped: SkipCounter,
    streams: dict[str, np.random.Generator],
    given: list[TraceRow] | None = None,
) -> tuple[Iterable[TraceRow], int | None]:
    """The rows of the source and their trace block size (None: no prefix content)."""
    if given is not None:  # already read (a plain Dynamo trace)
        tbs = getattr(cfg, "trace_block_size", None)
        return given, tbs if tbs is not None else _block_size_of(given)
    if isinstance(cfg, MooncakeWorkload):
        rows = read_mooncake(
            cfg.path,
            cfg.trace_block_size,
            cfg.skip_malformed,
            skipped,
            cfg.max_requests,
            require_timestamps=isinstance(load, TraceLoad),
        )
        return rows, cfg.trace_block_size
    if isinstance(cfg, AzureWorkload):
        return read_azure(cfg.path, cfg.skip_malformed, skipped, cfg.max_requests), None
    if isinstance(cfg, SyntheticWorkload):
        return generate(cfg, streams["lengths"], streams["prefix_groups"]), cfg.trace_block_size
    raise TypeError(f"unknown workload kind {cfg!r}")  # pragma: no cover


def _block_size_of(rows: list[TraceRow]) -> int:
    from servesim.workload.dynamo_trace import trace_block_size_of

    return trace_block_size_of(rows)


def build_workload(
    cfg: WorkloadConfig,
    load: LoadConfig,
    hasher: BlockHasher,
    streams: dict[str, np.random.Generator],
    given_rows: list[TraceRow] | None = None,
) -> Workload:
    """Sessions of requests from the workload (or from `given_rows`, rows already read)."""
    skipped = SkipCounter()
    rows, tbs = _rows(cfg, load, skipped, streams, given_rows)
    sessions: list[Session] = []
    by_id: dict[str, Session] = {}
    prev_ts: dict[str, float | None] = {}
    source = getattr(cfg, "path", "synthetic workload")
    names = RequestIds(source)
    for idx, row in enumerate(rows):
        prompt = _prompt(hasher, idx, row, tbs)
        request_id = names.take(row)
        sid = row.session_id
        session = by_id.get(sid) if sid is not None else None
        if session is None:
            delay = 0.0
            turn = 0
        else:
            assert sid is not None  # a session was found by its id
            turn = len(session)
            delay = _follow_up_delay(
                row,
                prev_ts[sid],
                f"{source}:{row.line}",
                isinstance(load, TraceLoad),
            )
        req = Request(
            idx=idx,
            request_id=request_id,
            input_length=row.input_length,
            output_length=row.output_length,
            prompt_hashes=prompt,
            planned_arrival_ms=row.timestamp_ms if session is None else None,
            session_id=sid,
            turn_index=turn,
            delay_ms=delay,
        )
        req.affinity_group = row.group_id
        if tbs is not None and hasher.keep_canonical_ids:
            req.canonical_ids = (hasher.canonical(row.hash_ids), tbs)
        if session is None:
            session = [req]
            sessions.append(session)
            if sid is not None:
                by_id[sid] = session
        else:
            session.append(req)
        if sid is not None:
            prev_ts[sid] = row.timestamp_ms if row.timestamp_ms is not None else prev_ts.get(sid)
    workload = Workload(sessions, skipped)
    if isinstance(cfg, SyntheticWorkload):
        _stamp(workload, cfg.rate_rps, cfg.arrival_process, streams["arrivals"])
    _plan_arrivals(workload, load, streams["arrivals"])
    return workload


def _prompt(hasher: BlockHasher, idx: int, row: TraceRow, tbs: int | None) -> list[int]:
    """The engine-block hashes of row `idx`'s prompt (unshared content without hash ids)."""
    if tbs is None:
        return [hasher.unique_block(idx, j) for j in range(row.input_length // hasher.block_size)]
    return hasher.prompt_hashes(row.hash_ids, row.input_length, tbs)


class RequestIds:
    """Request ids handed out so far: a row's `request_id`, else its line number. Only the
    explicit ids are kept as strings; the line numbers used as ids, one bit each."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.explicit: set[str] = set()
        self.lines = bytearray()  # bit k: line k named a row without a request_id

    def _line_taken(self, line: int) -> bool:
        byte = line >> 3
        return byte < len(self.lines) and bool(self.lines[byte] >> (line & 7) & 1)

    def take(self, row: TraceRow) -> str:
        rid = row.request_id
        if rid is None:
            rid = str(row.line)
            taken = rid in self.explicit
        else:
            taken = rid in self.explicit or (
                rid.isascii()
                and rid.isdigit()
                and rid == str(int(rid))
                and self._line_taken(int(rid))
            )
        if taken:
            raise TraceError(
                f"{self.source}:{row.line}: request_id {rid!r} is already taken "
                "(rows without a request_id are named by their line number)"
            )
        if row.request_id is None:
            byte = row.line >> 3
            if byte >= len(self.lines):
                self.lines.extend(bytes(byte + 1 - len(self.lines)))
            self.lines[byte] |= 1 << (row.line & 7)
        else:
            self.explicit.add(rid)
        return rid


class StreamedWorkload:
    """An open-loop trace replay whose rows are single requests, read as the driver reaches
    them: a request (with its prompt's block hashes) exists from just before its arrival
    until it ends, so memory holds the requests in flight, not the trace.

    A bad row fails when the driver reaches it (its TraceError names the file and line and
    ends the run: a run cut short is never reported as complete). Rows the run never
    reached (a stop time) are read at the end, to be recorded as not arrived."""

    def __init__(
        self,
        rows: Iterable[TraceRow],
        tbs: int | None,
        hasher: BlockHasher,
        load: TraceLoad,
        source: str,
        skipped: SkipCounter,
    ) -> None:
        self.skipped = skipped
        self._rows = iter(rows)
        self._tbs = tbs
        self._hasher = hasher
        self._ratio = load.arrival_speedup_ratio
        self._names = RequestIds(source)
        self._next_idx = 0
        self._t0: float | None = None
        self._last: Request | None = None
        # in one part of a partitioned run (model/speed/parallel.py): whether the request of row
        # `idx` is replayed here; None: every one is
        self.replays_row: Callable[[int], bool] | None = None

    def _make(self, row: TraceRow, hashed: bool) -> Request:
        idx = self._next_idx
        self._next_idx += 1
        ts = row.timestamp_ms or 0.0
        if self._t0 is None:
            self._t0 = ts
        req = Request(
            idx=idx,
            request_id=self._names.take(row),
            input_length=row.input_length,
            output_length=row.output_length,
            prompt_hashes=_prompt(self._hasher, idx, row, self._tbs) if hashed else [],
            planned_arrival_ms=(ts - self._t0) / self._ratio,
        )
        req.affinity_group = row.group_id
        if hashed and self._tbs is not None and self._hasher.keep_canonical_ids:
            req.canonical_ids = (self._hasher.canonical(row.hash_ids), self._tbs)
        return req

    def _elsewhere(self, row: TraceRow) -> bool:
        """Whether another part of the run replays this row's request. Such a row is passed
        over, but it still takes its place (the next index), its request id and its trace
        ids' canonical numbers here, so every later row gets the same in every part."""
        if self.replays_row is None or self.replays_row(self._next_idx):
            return False
        self._next_idx += 1
        self._names.take(row)
        if self._t0 is None:
            self._t0 = row.timestamp_ms or 0.0
        if self._tbs is not None:
            self._hasher.canonical(row.hash_ids)
        return True

    @property
    def sessions(self) -> Iterator[Session]:
        """One single-request session per row (of this part's rows, in a part of a
        partitioned run), made when the driver asks for it."""
        for row in self._rows:
            if not self._elsewhere(row):
                req = self._last = self._make(row, hashed=True)
                yield [req]
        self._last = None

    def not_arrived(self) -> Iterator[Request]:
        """After the run: the request the driver held for its arrival (if it had not arrived),
        then one per row never reached (no prompt hashes: they never run); in a part of a
        partitioned run, only this part's rows."""
        if self._last is not None and self._last.terminal_status == "":
            yield self._last
        self._last = None
        for row in self._rows:
            if not self._elsewhere(row):
                yield self._make(row, hashed=False)


def streams_rows(cfg: WorkloadConfig, load: LoadConfig) -> bool:
    """Whether `stream_workload` streams this workload: an open-loop trace replay (trace
    timestamps) of a Mooncake or Azure file whose rows are all single requests (no
    `session_id` anywhere in the file)."""
    if not isinstance(load, TraceLoad) or not isinstance(cfg, MooncakeWorkload | AzureWorkload):
        return False
    return not (isinstance(cfg, MooncakeWorkload) and _mentions(cfg.path, b'"session_id"'))


def stream_workload(
    cfg: WorkloadConfig,
    load: LoadConfig,
    hasher: BlockHasher,
    streams: dict[str, np.random.Generator],
) -> StreamedWorkload | None:
    """The streamed form of a workload `streams_rows` accepts; None for every other
    workload, which `build_workload` reads whole."""
    if not streams_rows(cfg, load):
        return None
    assert isinstance(cfg, MooncakeWorkload | AzureWorkload) and isinstance(load, TraceLoad)
    skipped = SkipCounter()
    rows, tbs = _rows(cfg, load, skipped, streams)
    return StreamedWorkload(rows, tbs, hasher, load, str(cfg.path), skipped)


def _mentions(path: str | Path, needle: bytes) -> bool:
    """Whether the file's bytes contain `needle` (read in chunks; False if unreadable, so
    the reader reports the problem)."""
    try:
        with open(path, "rb") as fh:
            tail = b""
            while chunk := fh.read(1 << 24):
                if needle in tail + chunk[: len(needle)] or needle in chunk:
                    return True
                tail = chunk[-len(needle) :]
    except OSError:
        return False
    return False


def _follow_up_delay(
    row: TraceRow, prev_ts: float | None, where: str, timestamps_required: bool = True
) -> float:
    """A later turn's wait after its predecessor completes: `delay`, else the difference of
    the two turns' timestamps, else 0 (also when the load sets its own arrival times and the
    session has no earlier timestamp)."""
    if row.delay_ms is not None:
        return row.delay_ms
    if row.timestamp_ms is None or (prev_ts is None and not timestamps_required):
        return 0.0
    if prev_ts is None:
        raise TraceError(
            f"{where}: trace line {row.line} for session {row.session_id} cannot infer delay "
            "without a previous timestamp"
        )
    delay = row.timestamp_ms - prev_ts
    if delay < 0:
        raise TraceError(f"{where}: trace line {row.line} has invalid delay {delay}")
    return delay


def _stamp(workload: Workload, rate_rps: float, process: str, rng: np.random.Generator) -> None:
    """First turns at a constant or Poisson (exponential gaps) rate, the first at 0."""
    firsts = [s[0] for s in workload.sessions]
    gap_ms = 1000.0 / rate_rps
    if process == "constant":
        times = np.arange(len(firsts)) * gap_ms
    else:
        gaps = rng.exponential(gap_ms, size=len(firsts))
        times = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
    for r, t in zip(firsts, times, strict=True):
        r.planned_arrival_ms = float(t)


def _plan_arrivals(workload: Workload, load: LoadConfig, rng: np.random.Generator) -> None:
    firsts = [s[0] for s in workload.sessions]
    if isinstance(load, TraceLoad):
        t0 = firsts[0].planned_arrival_ms or 0.0
        ratio = load.arrival_speedup_ratio
        for r in firsts:
            r.planned_arrival_ms = ((r.planned_arrival_ms or 0.0) - t0) / ratio
        if ratio != 1.0:
            for s in workload.sessions:
                for r in s[1:]:
                    r.delay_ms /= ratio
    elif isinstance(load, RateLoad):
        _stamp(workload, load.rate_rps, load.process, rng)
    else:  # concurrency: arrival is stamped at dispatch
        for r in firsts:
            r.planned_arrival_ms = None
