"""The one sink the model writes to: append-only rows, turned into tables once at the end.

The hot path only appends (a tuple per terminal request or KV level change, a value per column
per pass); no pandas is touched until `servesim.metrics.tables` builds the frames. Rows are kept
column by column in typed arrays (`Columns`), so a replay of a million requests holds 8 bytes a
number instead of a tuple of boxed floats.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from servesim.metrics.gaps import Multiset
from servesim.metrics.records import COMPLETED as COMPLETED
from servesim.metrics.records import INCOMPLETE as INCOMPLETE
from servesim.metrics.records import REJECTED as REJECTED
from servesim.metrics.records import REQUEST_FIELDS, request_row
from servesim.workload.request import Request

# pass records are many (one per engine step): kept column by column in typed arrays
PASS_COLUMNS = {
    "worker": "i",
    "dp_rank": "i",
    "start_ms": "d",
    "end_ms": "d",
    "prefill_tokens": "q",
    "prefill_seqs": "i",
    "decode_seqs": "i",
    "kv_used_blocks": "q",
    "preemptions": "i",
    "role": "b",  # coded: see ROLES
}
ROLES = ("aggregated", "prefill", "decode")
# pool and tier are a few distinct names: stored as codes
KV_COLUMNS = {
    "t_ms": "d",
    "pool": "c",
    "tier": "c",
    "used_blocks": "q",
    "cached_blocks": "q",
    "worker": "q",
    "dp_rank": "q",
}
# values learnt after a request's row was written (see Recorder.request_late)
LATE_COLUMNS = {"idx": "q", "column": "c", "value": "o"}
TRANSFER_COLUMNS = (
    "request_id",
    "link",
    "kind",
    "src_tier",
    "dst_tier",
    "submit_ms",
    "start_ms",
    "end_ms",
    "bytes",
    "tokens",
)
# what each kind of copy moves between: P/D handoffs GPU to GPU, tier copies
TRANSFER_TIERS = {
    "pd": ("device", "device"),
    "d2h": ("device", "host"),
    "h2d": ("host", "device"),
    "g2_to_g3": ("host", "disk"),
    "g3_to_g2": ("disk", "host"),
}
KV_EVENT_COLUMNS = (
    "t_ms",
    "pool",
    "worker",
    "dp_rank",
    "event_id",
    "kind",
    "tier",
    "block_hash",
    "worker_order",  # sort key (workers across pools, prefill first); not in the table
)

# one row per routing decision (the KV router's; Dynamo's per-request routing_history)
ROUTING_COLUMNS = (
    "request_id",
    "pool",  # agg | prefill | decode
    "outcome",  # immediate | queued
    "queue_entered_ms",
    "released_ms",
    "queue_wait_ms",
    "worker",
    "dp_rank",
    "scheduler_id",  # worker x dp_size + dp_rank
    "selected_overlap_blocks",  # the chosen target's device overlap, as the router saw it
    "best_overlap_blocks",  # the best device overlap any target had
    "overlap_regret_blocks",  # best - selected
)

# the tables built from the rows (see Recorder.table_built)
TABLES = ("requests", "passes", "kv", "kv_events", "transfers", "routing")


class Appended:
    """Arrays of one typecode appended end to end, read back as one numpy array.

    The arrays are kept as they are and joined a few thousand at a time: one array grown by
    `extend` would be reallocated, and copied, every time it grows by a sixteenth."""

    JOIN_EVERY = 4096

    __slots__ = ("typecode", "_parts", "_chunks", "_n")

    def __init__(self, typecode: str) -> None:
        self.typecode = typecode
        self._parts: list[array[Any]] = []  # appended since the last join
        self._chunks: list[bytes] = []
        self._n = 0

    def append(self, values: array[Any]) -> None:
        """Append `values` (an array of this typecode; kept, not copied, until joined)."""
        if values.typecode != self.typecode:
            raise TypeError(f"expected an array {self.typecode!r}, got {values.typecode!r}")
        self._parts.append(values)
        self._n += len(values)
        if len(self._parts) >= self.JOIN_EVERY:
            self._chunks.append(b"".join(self._parts))
            self._parts = []

    def __len__(self) -> int:
        return self._n

    def absorb(self, other: Appended) -> None:
        """Append every value of `other` (of this typecode) after this one's."""
        self._chunks.append(b"".join(self._parts))
        self._parts = []
        self._chunks.extend([*other._chunks, b"".join(other._parts)])
        self._n += other._n

    def numpy(self) -> np.ndarray:
        """Every value appended, in order (a new array)."""
        joined = b"".join([*self._chunks, *self._parts])
        return np.frombuffer(joined, dtype=self.typecode)


def _all_ints(values: tuple[Any, ...]) -> bool:
    """Whether every value is an int (what an int64 array takes: a float, even 1.0, is not)."""
    try:
        array("q", values)
    except (TypeError, OverflowError):
        return False
    return True


class Columns:
    """Rows of a fixed schema, kept column by column.

    The hot path appends one tuple per row; every `CHUNK` rows the tuples move into one column
    per field, so a long run holds its values rather than its tuples: an array 'd' (float) or
    'q' (int) holds 8 bytes a number where a tuple slot and a boxed float take 32, a list holds
    objects ("o"), and a column of a few distinct values ("c": statuses, pool names) holds a
    4-byte code per row.

    A float column that has only ever received ints comes out int64, as pandas infers it from
    the values (SimPy's clock starts at the int 0: a run whose arrivals all come at t=0 stamps
    ints).
    """

    CHUNK = 4096

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields
        self.rows: list[tuple] = []  # appended, not yet moved into the columns
        self.columns: dict[str, array[Any] | list[Any]] = {
            name: [] if kind == "o" else array("i" if kind == "c" else kind)
            for name, kind in fields.items()
        }
        # per coded column, value -> code (in code order)
        self.codes: dict[str, dict[Any, int]] = {
            name: {} for name, kind in fields.items() if kind == "c"
        }
        # float columns that have seen no float yet
        self.ints_only = {name for name, kind in fields.items() if kind == "d"}

    def append(self, row: tuple) -> None:
        rows = self.rows
        rows.append(row)
        if len(rows) >= self.CHUNK:
            self.flush()

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) + len(self.rows)

    def flush(self) -> None:
        """Move the appended rows into the columns."""
        rows = self.rows
        if not rows:
            return
        ints_only = self.ints_only
        for (name, kind), values in zip(self.fields.items(), zip(*rows, strict=True), strict=True):
            column = self.columns[name]
            if kind == "c":
                codes = self.codes[name]
                for v in dict.fromkeys(values):  # new values coded by first appearance
                    if v not in codes:
                        codes[v] = len(codes)
                column.extend(map(codes.__getitem__, values))
                continue
            if name in ints_only and not _all_ints(values):
                ints_only.discard(name)
            column.extend(values)
        rows.clear()

    def absorb(self, other: Columns) -> None:
        """Move `other`'s rows (the same fields) after this one's, a column at a time: `other`
        is left empty, each of its columns freed once copied."""
        self.flush()
        other.flush()
        for name, kind in self.fields.items():
            column = self.columns[name]
            theirs = other.columns[name]
            other.columns[name] = theirs[:0]
            if kind == "c":
                codes = self.codes[name]
                for v in other.codes[name]:
                    codes.setdefault(v, len(codes))
                recode = [codes[v] for v in other.codes[name]]
                column.extend(map(recode.__getitem__, theirs))  # type: ignore[arg-type]
            else:
                column.extend(theirs)  # type: ignore[arg-type]
        self.ints_only &= other.ints_only

    def array(self, name: str, copy: bool = True) -> np.ndarray:
        """One column in row order, as a numpy array: float64 or int64 for numbers (a float
        column of ints only is still float64 here: see `ints_only`), objects otherwise. With
        `copy=False` a number column is a read-only view of the stored values (valid until the
        next append), for a caller that copies what it keeps anyway."""
        self.flush()
        column = self.columns[name]
        if isinstance(column, list):
            out = np.empty(len(column), dtype=object)
            out[:] = column
            return out
        values = np.frombuffer(column, dtype=column.typecode)
        if self.fields[name] == "c":
            decoded = np.empty(len(self.codes[name]), dtype=object)
            decoded[:] = list(self.codes[name])
            return decoded[values]
        return values.copy() if copy else values

    def coded(self, name: str) -> tuple[np.ndarray, tuple[Any, ...]]:
        """A coded column as its codes (a read-only view, valid until the next append) and
        the value of each code."""
        self.flush()
        column = self.columns[name]
        assert isinstance(column, array) and self.fields[name] == "c"
        return np.frombuffer(column, dtype=column.typecode), tuple(self.codes[name])


class Recorder:
    """Every row of a run, appended as it happens (see the module docstring)."""

    def __init__(
        self, per_token: bool = False, keep_kv_events: bool = True, pass_table: bool = True
    ) -> None:
        self.per_token = per_token
        # KV events go to the table only when asked for; listeners (a KV router's prefix
        # index) hear every one: (t_ms, pool, kind, block_hash)
        self.keep_kv_events = keep_kv_events
        # without the passes table, passes are only counted
        self.pass_table = pass_table
        self._n_unkept_passes = 0  # passes not kept in `passes`
        # decode stretches (see pass_stretch), kept as runs: per stretch (single passes
        # recorded before it, worker, passes, decoding sequences, role code, start), and the
        # end time and active blocks of each of its passes
        self.stretches: list[tuple[int, int, int, int, int, float]] = []
        self.stretch_ends = Appended("d")
        self.stretch_kv_used = Appended("q")
        # listeners take (t_ms, pool, [(kind, block_hash), ...]): the events of one pool at
        # one instant, in order
        self.kv_listeners: list[Callable[[float, str, list[tuple[str, int]]], None]] = []
        self.routing: list[tuple] = []
        self.requests = Columns(REQUEST_FIELDS)
        self.passes: dict[str, array[Any]] = {
            name: array(code) for name, code in PASS_COLUMNS.items()
        }
        self._pass_appends: tuple[Callable[[Any], None], ...] = ()
        self._bind_pass_appends()
        self.kv = Columns(KV_COLUMNS)
        self.kv_events: list[tuple] = []
        self.transfers: list[tuple] = []
        # values learnt after a request's row was written: (request index, column, value)
        self.late_values = Columns(LATE_COLUMNS)
        # every inter-token gap of every completed request (as distinct values and counts)
        self.itl_gaps_ms = Multiset()
        self.token_times: dict[str, array] = {}
        self.last_event_ms = 0.0  # the latest pass end or request end recorded
        self._n_kv_events = 0
        self._tables_built: set[str] = set()  # whose rows forget_rows lets go of

    def __getstate__(self) -> dict[str, Any]:
        # (bound appends are rebuilt on unpickling; listeners belong to the run that made them)
        state = dict(self.__dict__)
        del state["_pass_appends"]
        state["kv_listeners"] = []
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind_pass_appends()

    def _bind_pass_appends(self) -> None:
        p = self.passes
        self._pass_appends = tuple(p[name].append for name in PASS_COLUMNS)

    def absorb(self, other: Recorder) -> None:
        """Append the rows `other` recorded after this recorder's: the recorder of another
        part of the same run whose workers never met this one's (model/parallel.py). Its row
        columns are moved, not copied (`other` is not to be used again). Every table sorts
        its rows by time and worker, keeping recording order only among rows of one worker,
        so the tables come out as if one recorder had heard both parts."""
        self.requests.absorb(other.requests)
        self.late_values.absorb(other.late_values)
        n_single = len(self.passes["end_ms"])
        for name, column in self.passes.items():
            theirs = other.passes[name]
            other.passes[name] = theirs[:0]  # (freed once copied)
            column.extend(theirs)
        self.stretches.extend(
            [(at + n_single, w, k, n, role, t) for at, w, k, n, role, t in other.stretches]
        )
        self.stretch_ends.absorb(other.stretch_ends)
        self.stretch_kv_used.absorb(other.stretch_kv_used)
        self._n_unkept_passes += other._n_unkept_passes
        self.kv.absorb(other.kv)
        self.kv_events.extend(other.kv_events)  # numbered by the table, in its order
        self._n_kv_events += other._n_kv_events
        self.transfers.extend(other.transfers)
        self.routing.extend(other.routing)
        self.itl_gaps_ms.absorb(other.itl_gaps_ms)
        self.token_times.update(other.token_times)
        self.last_event_ms = max(self.last_event_ms, other.last_event_ms)

    @property
    def n_passes(self) -> int:
        """Engine passes recorded, whether or not the passes table keeps them."""
        return len(self.passes["end_ms"]) + len(self.stretch_ends) + self._n_unkept_passes

    @property
    def late(self) -> dict[tuple[int, str], Any]:
        """The late values as {(request index, column): value} (the last one set wins)."""
        late = self.late_values
        return dict(
            zip(
                zip(late.array("idx").tolist(), late.array("column").tolist(), strict=True),
                late.array("value").tolist(),
                strict=True,
            )
        )

    def table_built(self, name: str) -> None:
        """The `name` table (one of TABLES) is built: its rows can go (see forget_rows)."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}: one of {TABLES}")
        self._tables_built.add(name)
        self.forget_rows()

    def forget_rows(self) -> None:
        """Let go of the rows of every table built so far, so the end of a long run does not
        hold one table's rows next to the tables built after it. A recorder whose rows must
        outlive the run (a test building the tables again) overrides this."""
        built = self._tables_built
        if "requests" in built:
            self.requests = Columns(REQUEST_FIELDS)
            self.late_values = Columns(LATE_COLUMNS)
        if "passes" in built and self.n_passes > self._n_unkept_passes:
            self._n_unkept_passes = self.n_passes  # n_passes still counts them
            self.passes = {name: array(code) for name, code in PASS_COLUMNS.items()}
            self._bind_pass_appends()
            self.stretches = []
            self.stretch_ends = Appended("d")
            self.stretch_kv_used = Appended("q")
        if "kv" in built:
            self.kv = Columns(KV_COLUMNS)
        if "kv_events" in built:
            self.kv_events = []
        if "transfers" in built:
            self.transfers = []
        if "routing" in built:
            self.routing = []

    # ------------------------------------------------------------------ requests

    def request_terminal(self, req: Request, status: str, now_ms: float, reason: str = "") -> None:
        req.terminal_status = status
        req.reason = reason
        req.terminal_ms = now_ms
        if status != INCOMPLETE and now_ms > self.last_event_ms:
            self.last_event_ms = now_ms
        times = req.token_times_ms
        if status == COMPLETED and times is not None:
            self.itl_gaps_ms.add_gaps_of(times)
        if self.per_token and times is not None:
            self.token_times[req.request_id] = times
        req.token_times_ms = None
        self.requests.append(request_row(req, status, now_ms, reason))

    def request_late(self, req: Request, column: str, value: Any) -> None:
        """Set a column of a request that has already ended (e.g. its P/D source released
        after the decode side completed)."""
        self.late_values.append((req.idx, column, value))

    # ------------------------------------------------------------------ engine

    def pass_done(
        self,
        worker: int,
        dp_rank: int,
        start_ms: float,
        end_ms: float,
        prefill_tokens: int,
        prefill_seqs: int,
        decode_seqs: int,
        kv_used_blocks: int,
        preemptions: int,
        role: str = "aggregated",
    ) -> None:
        if end_ms > self.last_event_ms:
            self.last_event_ms = end_ms
        if not self.pass_table:
            self._n_unkept_passes += 1
            return
        (a_w, a_r, a_s, a_e, a_pt, a_ps, a_ds, a_kv, a_pre, a_role) = self._pass_appends
        a_w(worker)
        a_r(dp_rank)
        a_s(start_ms)
        a_e(end_ms)
        a_pt(prefill_tokens)
        a_ps(prefill_seqs)
        a_ds(decode_seqs)
        a_kv(kv_used_blocks)
        a_pre(preemptions)
        a_role(ROLES.index(role))

    def pass_stretch(
        self,
        worker: int,
        start_ms: float,
        ends: array,
        decode_seqs: int,
        kv_used_blocks: array,
        role: str,
    ) -> None:
        """`pass_done` for decode-only passes of rank 0 applied at once (decode
        fast-forward): back to back from `start_ms`, ending at `ends`, `decode_seqs`
        sequences each, `kv_used_blocks` per pass."""
        k = len(ends)
        if ends[-1] > self.last_event_ms:
            self.last_event_ms = ends[-1]
        if not self.pass_table:
            self._n_unkept_passes += k
            return
        self.stretches.append(
            (
                len(self.passes["end_ms"]),
                worker,
                k,
                decode_seqs,
                ROLES.index(role),
                start_ms,
            )
        )
        self.stretch_ends.append(ends)
        self.stretch_kv_used.append(kv_used_blocks)

    def pass_columns(self) -> dict[str, np.ndarray]:
        """Every kept pass as columns (numpy arrays): the passes recorded one by one, then the
        decode stretches' runs expanded, and `seq`, each pass's place in recording order."""
        single = {name: np.frombuffer(col, dtype=col.typecode) for name, col in self.passes.items()}
        n_single = len(single["end_ms"])
        if not self.stretches:
            return {**single, "seq": np.arange(n_single)}
        at, worker, k, decode_seqs, role, start = (
            np.array(c) for c in zip(*self.stretches, strict=True)
        )
        ends = self.stretch_ends.numpy()
        n_stretch = len(ends)
        first = np.cumsum(k) - k  # each stretch's first row among the run rows
        # each pass starts where the previous pass of its stretch ended
        starts = np.empty(n_stretch)
        starts[1:] = ends[:-1]
        starts[first] = start
        zeros = np.zeros(n_stretch, dtype=np.int8)
        runs = {
            "worker": np.repeat(worker, k),
            "dp_rank": zeros,
            "start_ms": starts,
            "end_ms": ends,
            "prefill_tokens": zeros,
            "prefill_seqs": zeros,
            "decode_seqs": np.repeat(decode_seqs, k),
            "kv_used_blocks": self.stretch_kv_used.numpy(),
            "preemptions": zeros,
            "role": np.repeat(role, k),
        }
        out = {
            name: np.concatenate((values, runs[name].astype(values.dtype, copy=False)))
            for name, values in single.items()
        }
        # recording order: a single pass comes after the run rows of every stretch recorded
        # before it; a stretch's j-th run row after the `at` single passes recorded before
        # that stretch and the run rows before it
        rows_before = np.concatenate(([0], np.cumsum(k)))
        single_seq = np.arange(n_single)
        single_seq += rows_before[np.searchsorted(at, single_seq, "right")]
        out["seq"] = np.concatenate((single_seq, np.repeat(at, k) + np.arange(n_stretch)))
        return out

    def kv_level(
        self,
        t_ms: float,
        pool: str,
        tier: str,
        used: int,
        cached: int,
        worker: int = -1,
        dp_rank: int = 0,
    ) -> None:
        self.kv.append((t_ms, pool, tier, used, cached, worker, dp_rank))

    def transfer(
        self,
        request_id: str,
        link: str,
        kind: str,
        submit_ms: float,
        start_ms: float,
        end_ms: float,
        n_bytes: int,
        n_tokens: int,
    ) -> None:
        src, dst = TRANSFER_TIERS[kind]
        self.transfers.append(
            (request_id, link, kind, src, dst, submit_ms, start_ms, end_ms, n_bytes, n_tokens)
        )

    def kv_event(
        self,
        t_ms: float,
        pool: str,
        worker: int,
        dp_rank: int,
        kind: str,
        tier: str,
        block_hash: int,
        worker_order: int,
    ) -> None:
        """A block `stored` in or `removed` from `pool` (a rank's name, e.g. cluster.d0)."""
        self.kv_event_batch(t_ms, pool, worker, dp_rank, [(kind, block_hash)], tier, worker_order)

    def kv_event_batch(
        self,
        t_ms: float,
        pool: str,
        worker: int,
        dp_rank: int,
        events: list[tuple[str, int]],
        tier: str,
        worker_order: int,
    ) -> None:
        """`kv_event` for several events of one pool at one instant, in order."""
        for listener in self.kv_listeners:
            listener(t_ms, pool, events)
        if not self.keep_kv_events:
            return
        first = self._n_kv_events
        self.kv_events.extend(
            [
                (t_ms, pool, worker, dp_rank, first + i, kind, tier, h, worker_order)
                for i, (kind, h) in enumerate(events)
            ]
        )
        self._n_kv_events += len(events)

    def routed(
        self,
        request_id: str,
        pool: str,
        outcome: str,
        entered_ms: float,
        released_ms: float,
        worker: int,
        dp_rank: int,
        scheduler_id: int,
        selected_overlap_blocks: int,
        best_overlap_blocks: int,
    ) -> None:
        """One routing decision (see ROUTING_COLUMNS)."""
        self.routing.append(
            (
                request_id,
                pool,
                outcome,
                entered_ms,
                released_ms,
                released_ms - entered_ms,
                worker,
                dp_rank,
                scheduler_id,
                selected_overlap_blocks,
                best_overlap_blocks,
                best_overlap_blocks - selected_overlap_blocks,
            )
        )
