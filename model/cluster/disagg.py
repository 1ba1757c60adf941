"""A disaggregated (xPyD) cluster: a pool of prefill workers, a pool of decode workers, and KV
transfer links between them.

A request arrives at a prefill worker (the prefill router picks it) as a *prefill copy*: the
same prompt, at most one output token, its KV held when it finishes. Its finish starts the
request's handoff (`servesim.cluster.handoff`): the decode router picks a destination, the
destination reserves KV, the link moves it, the destination activates the request and decodes
every output token, and the source releases its KV. The request's record is the decode side's:
TTFT includes prefill queueing and compute, the wait for a reservation, the transfer and the
first decode pass.

How a request waits for KV on its decode rank is servesim.cluster.reservation; its path from
the prefill copy's finish to the source's release is servesim.cluster.handoff, one process.
"""

from __future__ import annotations

import numpy as np
import simpy

from servesim.clock import TRANSFER_END, fire
from servesim.cluster.base import ClusterBase
from servesim.cluster.handoff import handoff
from servesim.cluster.reservation import Reservations
from servesim.config.plan import Plan
from servesim.config.schema import DisaggTopology
from servesim.kv.link import Link
from servesim.metrics.recorder import REJECTED, Recorder
from servesim.router import RouterSite, build_router
from servesim.timing import build_step_time
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request


class DisaggCluster(ClusterBase):
    def __init__(
        self,
        env: simpy.Environment,
        plan: Plan,
        hasher: BlockHasher,
        recorder: Recorder,
        router_rng: np.random.Generator,
    ) -> None:
        super().__init__(env, plan, recorder)
        cfg = plan.cfg
        topo = cfg.topology
        assert isinstance(topo, DisaggTopology)
        engines = plan.engines
        self.engines = engines
        self.prefill = self.build_pool(
            "prefill",
            engines["prefill"],
            topo.num_prefill_workers,
            plan.gpu_blocks["prefill"],
            build_step_time(cfg, engines["prefill"]),
            hasher,
            self._source_held,
            name="p",
        )
        self.decode = self.build_pool(
            "decode",
            engines["decode"],
            topo.num_decode_workers,
            plan.gpu_blocks["decode"],
            build_step_time(cfg, engines["decode"]),
            hasher,
            self._completed,
            name="d",
            horizon=self.decode_horizon,
        )
        # requests reserved on a decode rank whose transfer is not on its link yet
        self.awaiting_link: set[int] = set()
        only_missing = cfg.link.timing_mode == "destination_missing"
        # each decode rank's KV reservations, tried between the worker's passes
        self.destinations = {
            (w.idx, r.dp_rank): Reservations(env, w, r, only_missing, self.awaiting_link)
            for w in self.decode
            for r in w.ranks
        }
        for w in self.decode:
            w.kv_waiters = [self.destinations[(w.idx, r.dp_rank)] for r in w.ranks]
        # each pool rotates over its scheduler ids (worker-major), as Dynamo's P/D replay
        p, d = engines["prefill"], engines["decode"]
        self.prefill_router = build_router(
            cfg.router,
            RouterSite(
                len(self.prefill), p.dp_size, True, env, p, "prefill", recorder, router_rng,
                self._to_prefill,
            ),
        )  # fmt: skip
        self.decode_router = build_router(
            cfg.router,
            RouterSite(
                len(self.decode), d.dp_size, True, env, d, "decode", recorder, router_rng,
                self._to_decode,
            ),
        )  # fmt: skip
        # only prefill workers' KV events reach a router (the decode router balances load)
        self.attach_router(self.prefill_router, self.prefill)
        self.routers.append(self.decode_router)
        self.link_cfg = cfg.link
        self.transfer_bytes_per_token = plan.transfer_bytes_per_token
        self.state_bytes = cfg.link.state_bytes
        self.links: dict[tuple[int, int], Link] = {}
        self._accepted = 0
        # requests whose prefill is done and whose decode has not begun (waiting for KV on a
        # decode rank, or in transfer), by request index
        self.between_pools: dict[int, Request] = {}
        self.prefill_copies: dict[int, Request] = {}  # by request index, until handed off
        # SGLang reserves the destination first: the decode rank is chosen as the request
        # arrives and the request is prefilled once that rank has taken KV for its prompt (vLLM
        # and TRT-LLM: a decode rank is sought after the prefill); the handoff's transfer then
        # waits for its prefill (events by request index)
        self.destination_first = engines["decode"].kind == "sglang"
        self.prefilled: dict[int, simpy.Event] = {}

    @property
    def completion_dispatches(self) -> bool:
        return True  # a prefill copy's finish hands its request to the decode pool

    def decode_horizon(self) -> float:
        """The earliest time anything can reach a decode worker (its horizon).

        In an open loop of single requests, what reaches a decode rank is a reservation (a
        prefill copy's finish, at a prefill pass end) or a transfer landing (a link timer).
        A prefill pass can also follow a source release, which happens at a landing, at the
        end of the pass a decode worker's deferred activation waits for, or after a
        reservation that a decode worker's pass end lets through (it frees blocks). So: the
        next arrival or the stop time, every prefill worker's next pass end, the pass end of
        every decode worker with deferred commands or a reservation waiting on it, every
        link's next timer. Anything else (a
        frontend hand-over, a waiting router, a completion that dispatches, a reservation
        whose transfer is not submitted yet) falls back to the next event on the queue."""
        if (
            super().completion_dispatches  # sessions, or a frontend hand-over
            or self.awaiting_link
            or any(r.has_waiting for r in self.routers)
        ):
            return self.horizon()
        h = min(self.next_arrival_ms, self.stop_ms)
        for w in self.prefill:
            h = min(h, w.next_end_bound())
        destinations = self.destinations
        for w in self.decode:
            if (
                w._deferred
                or w._landed
                or any(destinations[(w.idx, r.dp_rank)].pending for r in w.ranks)
            ):
                h = min(h, w.next_end_bound())
        for link in self.links.values():
            h = min(h, link.next_event_ms())
        return h

    # ------------------------------------------------------------------ arrival

    def dispatch(self, req: Request) -> None:
        """A request arrives now: its prefill copy goes to the prefill worker the router picks
        (destination first: to the decode router, to reserve KV on a decode rank first)."""
        self.arrive(req)
        if self.destination_first:
            self.after_frontend(req, self._reserve_first)
        else:
            self.after_frontend(req, self.prefill_router.submit)

    def _reserve_first(self, req: Request) -> None:
        """SGLang: the decode router picks a rank for the request as it arrives; once that rank
        has reserved KV for the prompt, the handoff sends it to the prefill router."""
        reason = self._never_fits_decode(req)
        if reason:  # no decode rank could ever reserve its prompt
            self.end(req, REJECTED, reason)
            return
        self.prefilled[req.idx] = self.env.event()
        self.between_pools[req.idx] = req
        self.decode_router.submit(req)

    def _to_prefill(self, req: Request, worker: int, rank: int) -> None:
        req.prefill_worker_idx = worker
        req.prefill_dp_rank = rank
        copy = req.prefill_copy()
        self.prefill_copies[req.idx] = copy
        self.prefill[worker].submit(copy, rank)

    def _admitted(self, req: Request, reused_tokens: int, now_ms: float) -> None:
        parent = req.parent
        if parent is not None:  # a prefill admission
            parent.n_prefill_admissions = req.n_admissions
            if req.n_admissions == 1:
                parent.prefill_admit_ms = parent.first_admit_ms = now_ms
                parent.first_admission_reused_tokens = reused_tokens
            parent.note_reuse(reused_tokens, req.admit_host_tokens, req.admit_disk_tokens)
            # KV routers with a pending queue: the one that routed this prefill copy orders
            # its signals by admission (a decode router's flights are admitted in arrival order)
            for router in self.ordered_routers:
                router.admitted(req)
            return
        if req.n_admissions == 1:  # a decode admission
            req.decode_admit_ms = now_ms
        req.decode_reused_input_tokens = max(req.decode_reused_input_tokens, reused_tokens)

    # ------------------------------------------------------------------ handoff

    def _source_held(self, copy: Request) -> None:
        """A prefill copy finished (now): its KV stays on the prefill worker; the request goes
        to a decode rank's reservation queue."""
        req = copy.parent
        assert req is not None
        req.source_held_ms = self.env.now
        self.prefill_router.prefill_done(req)
        self.prefill_router.finished(req)  # the prefill pool is done with it
        if self.destination_first:  # its handoff goes on with the instant's transfers
            fire(self.env, self.prefilled.pop(req.idx), TRANSFER_END)
            return
        reason = self._never_fits_decode(req)
        if reason:
            source = self.prefill[req.prefill_worker_idx]
            source.ranks[req.prefill_dp_rank].scheduler.release_held(copy)
            source.sample_kv()
            del self.prefill_copies[req.idx]
            self.end(req, REJECTED, reason)
            return
        self.between_pools[req.idx] = req
        self.decode_router.submit(req)  # its load-only cost never makes a request wait

    def _to_decode(self, req: Request, w: int, r: int) -> None:
        copy = None if self.destination_first else self.prefill_copies.pop(req.idx)
        req.worker_idx, req.dp_rank = w, r
        dest = self.destinations[(w, r)]
        self._accepted += 1
        req.accept_seq = self._accepted
        reserved = dest.request(req)
        prefilled = self.prefilled.get(req.idx)
        self.env.process(handoff(self, copy, req, reserved, dest, prefilled))
        if not dest.worker.busy:
            dest.attempt()

    def _never_fits_decode(self, req: Request) -> str:
        engine = self.engines["decode"]
        blocks = -(-req.input_length // engine.block_size)
        capacity = self.decode[0].ranks[0].pool.capacity_blocks
        if blocks > capacity:
            return (
                f"prompt of {req.input_length} tokens needs {blocks} KV blocks; a decode "
                f"worker's pool holds {capacity}"
            )
        if engine.max_model_len is not None and req.input_length >= engine.max_model_len:
            return (
                f"prompt of {req.input_length} tokens reaches the decode side's "
                f"max_model_len {engine.max_model_len}"
            )
        return ""

    def link(self, prefill_worker: int, decode_worker: int) -> Link:
        """The link from a prefill worker to a decode worker (made on first use)."""
        key = (prefill_worker, decode_worker)
        link = self.links.get(key)
        if link is None:
            cfg = self.link_cfg
            bandwidth, latency = cfg.bandwidth_gbps, cfg.latency_ms
            for pair in cfg.pairs:
                if (pair.prefill_workers is None or prefill_worker in pair.prefill_workers) and (
                    pair.decode_workers is None or decode_worker in pair.decode_workers
                ):
                    if pair.bandwidth_gbps is not None:
                        bandwidth = pair.bandwidth_gbps
                    if pair.latency_ms is not None:
                        latency = pair.latency_ms
                    break
            link = Link(
                self.env,
                f"link.p{prefill_worker}-d{decode_worker}",
                bandwidth,
                latency,
                cfg.contention,
                self.recorder,
                cfg.lanes,
            )
            self.links[key] = link
        return link

    def in_flight(self) -> list[Request]:
        """Requests dispatched but not ended: prefill copies stand for their requests, and
        requests between the pools (waiting for KV, or in transfer) count too."""
        out: list[Request] = []
        seen: set[int] = set()
        for req in super().in_flight():
            target = req.parent or req
            if target.idx not in seen:
                seen.add(target.idx)
                out.append(target)
        for req in self.between_pools.values():
            if req.idx not in seen:
                seen.add(req.idx)
                out.append(req)
        return out
