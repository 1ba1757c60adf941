"""The one sink the model writes to: append-only tuples, turned into tables once at the end.

The hot path only appends (a tuple per terminal request, per pass, per KV level change); no
pandas is touched until `model.metrics.tables` builds the frames.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from model.workload.request import Request

REQUEST_COLUMNS = (
    "request_id",
    "session_id",
    "turn_index",
    "arrival_ms",
    "first_admit_ms",
    "first_token_ms",
    "last_token_ms",
    "terminal_ms",
    "ttft_ms",
    "ttst_ms",
    "itl_ms",
    "e2e_latency_ms",
    "input_length",
    "requested_output_length",
    "output_length",
    "reused_input_tokens",
    "g1_reused_input_tokens",
    "host_reused_input_tokens",
    "disk_reused_input_tokens",
    "first_admission_reused_input_tokens",
    "prefill_worker_idx",
    "decode_worker_idx",
    "dp_rank",
    "n_preemptions",
    "terminal_status",
    "reason",
    # P/D handoff (NaN in aggregated clusters)
    "prefill_dp_rank",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "decode_reused_input_tokens",
    "transfer_tokens",
)
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
KV_COLUMNS = ("t_ms", "pool", "tier", "used_blocks", "cached_blocks", "worker", "dp_rank")
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

COMPLETED = "completed"
REJECTED = "rejected"
INCOMPLETE = "incomplete"
NAN = float("nan")


class Recorder:
    def __init__(self, per_token: bool = False, keep_kv_events: bool = True) -> None:
        self.per_token = per_token
        # KV events go to the table only when asked for; listeners (a KV router's prefix
        # index) hear every one: (t_ms, pool, kind, block_hash)
        self.keep_kv_events = keep_kv_events
        self.kv_listeners: list[Callable[[float, str, str, int], None]] = []
        self.routing: list[tuple] = []
        self.requests: list[tuple] = []
        self.passes: dict[str, array[Any]] = {
            name: array(code) for name, code in PASS_COLUMNS.items()
        }
        p = self.passes
        self._pass_appends: tuple[Callable[[Any], None], ...] = (
            p["worker"].append,
            p["dp_rank"].append,
            p["start_ms"].append,
            p["end_ms"].append,
            p["prefill_tokens"].append,
            p["prefill_seqs"].append,
            p["decode_seqs"].append,
            p["kv_used_blocks"].append,
            p["preemptions"].append,
            p["role"].append,
        )
        self.kv: list[tuple] = []
        self.kv_events: list[tuple] = []
        self.transfers: list[tuple] = []
        # values learnt after a request's row was written: (request index, column) -> value
        self.late: dict[tuple[int, str], Any] = {}
        self.itl_gaps_ms = array("d")  # every inter-token gap of every completed request
        self.token_times: dict[str, array] = {}
        self.last_event_ms = 0.0  # the latest pass end or request end recorded
        self._n_kv_events = 0

    # ------------------------------------------------------------------ requests

    def request_terminal(self, req: Request, status: str, now_ms: float, reason: str = "") -> None:
        req.terminal_status = status
        req.reason = reason
        req.terminal_ms = now_ms
        if status != INCOMPLETE and now_ms > self.last_event_ms:
            self.last_event_ms = now_ms
        n = req.num_output_tokens
        first = req.first_token_ms
        ttft = first - req.arrival_ms if n else NAN
        ttst = req.second_token_ms - first if n >= 2 else NAN
        tpot = (req.last_token_ms - first) / (n - 1) if n >= 2 else NAN
        e2e = req.last_token_ms - req.arrival_ms if n else NAN
        times = req.token_times_ms
        if status == COMPLETED and times is not None and len(times) >= 2:
            stamps = np.frombuffer(times, dtype=float)
            self.itl_gaps_ms.frombytes((stamps[1:] - stamps[:-1]).tobytes())
        if self.per_token and times is not None:
            self.token_times[req.request_id] = times
        req.token_times_ms = None
        worker = req.worker_idx if req.worker_idx >= 0 else None
        self.requests.append(
            (
                req.idx,
                req.request_id,
                req.session_id,
                req.turn_index,
                req.arrival_ms,
                req.first_admit_ms,
                first,
                req.last_token_ms,
                now_ms,
                ttft,
                ttst,
                tpot,
                e2e,
                req.input_length,
                req.output_length,
                n,
                req.reused_input_tokens,
                req.reused_input_tokens
                - req.host_reused_input_tokens
                - req.disk_reused_input_tokens,
                req.host_reused_input_tokens,
                req.disk_reused_input_tokens,
                req.first_admission_reused_tokens,
                req.prefill_worker_idx if req.prefill_worker_idx >= 0 else None,
                worker,
                req.dp_rank,
                req.n_preemptions,
                status,
                reason,
                req.prefill_dp_rank if req.prefill_worker_idx >= 0 else None,
                req.prefill_admit_ms,
                req.source_held_ms,
                req.destination_reserved_ms,
                req.destination_activated_ms,
                req.decode_admit_ms,
                req.source_released_ms,
                req.decode_reused_input_tokens,
                req.transfer_tokens,
            )
        )

    def request_late(self, req: Request, column: str, value: Any) -> None:
        """Set a column of a request that has already ended (e.g. its P/D source released
        after the decode side completed)."""
        self.late[(req.idx, column)] = value

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
        starts: list[float],
        ends: list[float],
        decode_seqs: int,
        kv_used_blocks: array,
        role: str,
    ) -> None:
        """`pass_done` for decode-only passes of rank 0 applied at once (decode
        fast-forward): `decode_seqs` sequences each, `kv_used_blocks` per pass."""
        k = len(ends)
        if ends[-1] > self.last_event_ms:
            self.last_event_ms = ends[-1]
        p = self.passes
        zeros = array("i", (0,)) * k
        p["worker"].extend(array("i", (worker,)) * k)
        p["dp_rank"].extend(zeros)
        p["start_ms"].fromlist(starts)
        p["end_ms"].fromlist(ends)
        p["prefill_tokens"].extend(array("q", (0,)) * k)
        p["prefill_seqs"].extend(zeros)
        p["decode_seqs"].extend(array("i", (decode_seqs,)) * k)
        p["kv_used_blocks"].extend(kv_used_blocks)
        p["preemptions"].extend(zeros)
        p["role"].extend(array("b", (ROLES.index(role),)) * k)

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
        for listener in self.kv_listeners:
            listener(t_ms, pool, kind, block_hash)
        if not self.keep_kv_events:
            return
        self.kv_events.append(
            (t_ms, pool, worker, dp_rank, self._n_kv_events, kind, tier, block_hash, worker_order)
        )
        self._n_kv_events += 1

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
