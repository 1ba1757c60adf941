"""Records a run as it happens: request ends, engine passes, KV levels and events, transfers.

The one sink the model writes to (routing decisions too): append-only rows, turned into tables
once at the end. The hot path only appends (a row per terminal request or KV level change, a
value per column per pass); no pandas is touched until `servesim.metrics.tables` builds the
frames. Request and KV rows are kept column by column (`servesim.metrics.columns`); the request
row's fields are defined in `servesim.metrics.records`, passes are kept by
`servesim.metrics.passes`, and the row layouts of the other tables are here.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from servesim.metrics.columns import Columns
from servesim.metrics.gaps import Multiset
from servesim.metrics.passes import ROLES, PassLog
from servesim.metrics.records import COMPLETED as COMPLETED
from servesim.metrics.records import INCOMPLETE as INCOMPLETE
from servesim.metrics.records import REJECTED as REJECTED
from servesim.metrics.records import REQUEST_FIELDS, request_row
from servesim.workload.request import Request

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


class Recorder:
    """Every row of a run, appended as it happens (see the module docstring)."""

    def __init__(
        self,
        per_token: bool = False,
        keep_kv_events: bool = True,
        pass_table: bool = True,
        engines: dict[str, str] | None = None,
    ) -> None:
        self.per_token = per_token
        # each role's engine kind ({"aggregated": kind}, or "prefill" and "decode"): the
        # tables' `engine` column (null for a role not named here)
        self.engines = dict(engines or {})
        # KV events (heard from the cluster's KV event bus) go to the table only when asked for
        self.keep_kv_events = keep_kv_events
        # without the passes table, passes are only counted
        self.pass_table = pass_table
        self._n_unkept_passes = 0  # passes not kept in `passes`
        self.routing: list[tuple] = []
        self.requests = Columns(REQUEST_FIELDS)
        self.passes = PassLog()
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

    def absorb(self, other: Recorder) -> None:
        """Append the rows `other` recorded after this recorder's: the recorder of another
        part of the same run whose workers never met this one's (model/speed/parallel.py). Its row
        columns are moved, not copied (`other` is not to be used again). Every table sorts
        its rows by time and worker, keeping recording order only among rows of one worker,
        so the tables come out as if one recorder had heard both parts."""
        self.requests.absorb(other.requests)
        self.late_values.absorb(other.late_values)
        self.passes.absorb(other.passes)
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
        return len(self.passes) + self._n_unkept_passes

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
        if "passes" in built and len(self.passes):
            self._n_unkept_passes += len(self.passes)  # n_passes still counts them
            self.passes = PassLog()
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
        (a_w, a_r, a_s, a_e, a_pt, a_ps, a_ds, a_kv, a_pre, a_role) = self.passes.appends
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
        self.passes.add_stretch(worker, start_ms, ends, decode_seqs, kv_used_blocks, role)

    def pass_columns(self) -> dict[str, np.ndarray]:
        """Every kept pass as columns (numpy arrays): the passes recorded one by one, then the
        decode stretches' runs expanded, and `seq`, each pass's place in recording order."""
        return self.passes.columns()

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

    def kv_levels(self, rows: list[tuple[float, str, str, int, int, int, int]]) -> None:
        """`kv_level` for many changes at once, each row its arguments in order."""
        self.kv.extend(rows)

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
        """Blocks `stored` in or `removed` from `pool` (a rank's name, e.g. cluster.d0, or a
        tier pool's) at one instant, in order: rows of the kv_events table (the recorder
        listens on the cluster's KV event bus when the table is kept)."""
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
