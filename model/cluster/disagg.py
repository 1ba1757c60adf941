"""A disaggregated (xPyD) cluster: a pool of prefill workers, a pool of decode workers, and KV
transfer links between them.

A request arrives at a prefill worker (the prefill router picks it) as a *prefill copy*: the
same prompt, at most one output token, its KV held when it finishes. Its finish starts the
request's handoff (`model/cluster/handoff.py`): the decode router picks a destination, the
destination reserves KV, the link moves it, the destination activates the request and decodes
every output token, and the source releases its KV. The request's record is the decode side's:
TTFT includes prefill queueing and compute, the wait for a reservation, the transfer and the
first decode pass.

Reservations follow Dynamo's replay: each decode rank keeps a FIFO of requests waiting for KV;
an attempt looks at its head only and reserves at most one, when the rank is between passes
(a request for it arrives, one of its passes ends, or a transfer lands on it). A head that does
not fit (blocks, or `max_num_seqs` running) blocks the queue until the rank frees capacity.
With a G2 tier, a reservation may evict cached blocks a store to G2 is still reading: it holds
its blocks and is reserved (its transfer starts) at the first attempt after those stores land.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from servesim.clock import SETTLE_DELIVERED, TRANSFER_END, at_time, fire
from servesim.cluster.base import ClusterBase
from servesim.cluster.handoff import handoff
from servesim.config.plan import Plan
from servesim.config.schema import DisaggTopology
from servesim.engine.worker import Rank, Worker
from servesim.kv.link import Link
from servesim.metrics.recorder import COMPLETED, REJECTED, Recorder
from servesim.router import build_router
from servesim.timing import build_step_time
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request


class Destination:
    """The requests waiting for KV on one decode rank, in acceptance order."""

    __slots__ = ("worker", "rank", "pending", "failed_generation", "held")

    def __init__(self, worker: Worker, rank: Rank) -> None:
        self.worker = worker
        self.rank = rank
        self.pending: deque[Request] = rank.scheduler.pending_reservations
        self.failed_generation = -1  # the rank's pool generation when its head last failed
        # the head's blocks, taken while stores to G2 still read some of them: its prefix
        # hit in blocks and those stores' landings
        self.held: tuple[int, list[simpy.Event]] | None = None


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
            after_pass=self._retry_reservations,
            pass_end_pending=self._reservation_pending,
            name="d",
        )
        for w in self.decode:
            # blocks a finished tier copy unpinned may let a waiting reservation through
            w.on_kv_freed = self._retry_after_landing
            w.horizon = self.decode_horizon
        self.destinations = {
            (w.idx, r.dp_rank): Destination(w, r) for w in self.decode for r in w.ranks
        }
        # each pool rotates over its scheduler ids (worker-major), as Dynamo's P/D replay
        self.prefill_router = build_router(
            cfg.router,
            len(self.prefill),
            router_rng,
            engines["prefill"].dp_size,
            flat=True,
            env=env,
            engine=engines["prefill"],
            role="prefill",
            recorder=recorder,
        )
        self.decode_router = build_router(
            cfg.router,
            len(self.decode),
            router_rng,
            engines["decode"].dp_size,
            flat=True,
            env=env,
            engine=engines["decode"],
            role="decode",
            recorder=recorder,
        )
        self.prefill_router.send = self._to_prefill
        self.decode_router.send = self._to_decode
        # only prefill workers' KV events reach a router (the decode router balances load)
        self.attach_router(self.prefill_router, self.prefill)
        self.routers.append(self.decode_router)
        self.link_cfg = cfg.link
        self.kv_bytes_per_token = plan.transfer_bytes_per_token
        self.links: dict[tuple[int, int], Link] = {}
        self._accepted = 0
        # requests whose prefill is done and whose decode has not begun (waiting for KV on a
        # decode rank, or in transfer), by request index
        self.between_pools: dict[int, Request] = {}
        self.prefill_copies: dict[int, Request] = {}  # by request index, until handed off
        # reservations made whose transfer is not on its link yet (it is, within the instant)
        self.unsubmitted = 0

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
            or self.unsubmitted
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
        """A request arrives now: its prefill copy goes to the prefill worker the router picks."""
        self.arrive(req)
        self.after_frontend(req, self.prefill_router.submit)

    def _to_prefill(self, req: Request, worker: int, rank: int) -> None:
        req.prefill_worker_idx = worker
        req.prefill_dp_rank = rank
        copy = req.prefill_copy()
        self.prefill_copies[req.idx] = copy
        self.prefill[worker].submit(copy, rank)

    def _admitted(self, req: Request, reused_tokens: int, now_ms: float) -> None:
        parent = req.parent
        if parent is not None:  # a prefill admission
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
        copy = self.prefill_copies.pop(req.idx)
        req.worker_idx, req.dp_rank = w, r
        dest = self.destinations[(w, r)]
        self._accepted += 1
        req.accept_seq = self._accepted
        req.reserved = self.env.event()
        dest.pending.append(req)
        self.env.process(handoff(self, copy, req, dest))
        if not dest.worker.busy:
            self.try_reserve(dest)

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

    def try_reserve(self, dest: Destination) -> None:
        """One reservation attempt on a decode rank: its queue's head, if it fits now.

        The blocks it takes may include cached ones a store to G2 is still reading (plain LRU
        eviction): it then holds them, and is reserved (its transfer starts) at the first
        attempt after those stores have landed."""
        if not dest.pending:
            return
        pool = dest.rank.pool
        req = dest.pending[0]
        held = dest.held
        if held is not None:
            reused_blocks, landings = held
            if not all(e.processed for e in landings):
                return
            dest.held = None
        else:
            if pool.generation == dest.failed_generation:
                return  # nothing freed since the head last failed
            taken = dest.rank.scheduler.reserve(req)
            if taken is None:
                dest.failed_generation = pool.generation
                return
            reused_blocks, landings = taken
            dest.worker.sample_kv()
            if landings:
                dest.held = (reused_blocks, landings)
                dest.failed_generation = pool.generation  # (a landing tries it again)
                return
        dest.pending.popleft()
        dest.failed_generation = -1
        req.destination_reserved_ms = self.env.now
        bs = self.engines["decode"].block_size
        if self.link_cfg.timing_mode == "destination_missing":
            req.transfer_tokens = (-(-req.input_length // bs) - reused_blocks) * bs
        else:
            req.transfer_tokens = req.input_length
        assert req.reserved is not None
        self.unsubmitted += 1  # until the handoff puts its transfer on the link
        fire(self.env, req.reserved, TRANSFER_END)

    def _reservation_pending(self, worker: Worker) -> bool:
        """Whether a reservation attempt at this decode worker's next pass end may succeed
        (a queue head not yet tried since its rank last freed capacity)."""
        for rank in worker.ranks:
            dest = self.destinations[(worker.idx, rank.dp_rank)]
            if dest.pending and rank.pool.generation != dest.failed_generation:
                return True
        return False

    def _retry_reservations(self, worker: Worker) -> None:
        """A decode worker's pass ended: one attempt on each of its ranks."""
        for rank in worker.ranks:
            self.try_reserve(self.destinations[(worker.idx, rank.dp_rank)])

    def _retry_after_landing(self, worker: Worker) -> None:
        """A store to G2 landed between the decode worker's passes and gave G1 blocks back:
        one attempt on each rank. At the instant a pass ended, Dynamo settles the landing
        before the pass end's attempt: a rank whose attempt then reserved is not tried
        again."""
        at_pass_end = worker.last_end_ms == self.env.now
        for rank in worker.ranks:
            dest = self.destinations[(worker.idx, rank.dp_rank)]
            if at_pass_end and dest.failed_generation == -1:
                continue
            self.try_reserve(dest)

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

    def activate(self, req: Request, dest: Destination) -> None:
        """The transfer landed (now, between the decode worker's passes)."""
        req.destination_activated_ms = self.env.now
        del self.between_pools[req.idx]
        if req.output_length == 0 and not dest.worker.has_work():
            # nothing to decode on an idle worker: whether it ends here or joins a pass is
            # settled once every transfer of this instant has landed
            at_time(self.env, self.env.now, SETTLE_DELIVERED).callbacks.append(
                lambda _: self._settle_delivered(req, dest)
            )
            return
        dest.rank.scheduler.activate(req)
        dest.worker.sample_kv()
        dest.worker.wake()
        self.try_reserve(dest)

    def _settle_delivered(self, req: Request, dest: Destination) -> None:
        """A request with nothing to decode was delivered (now) to an idle decode worker.
        If nothing else was delivered there at this instant, it ends here (admitted and done
        at once, as in Dynamo) and its reserved KV goes back; otherwise it joins the pass that
        starts now like any delivered request, at no cost, and ends at that pass's end."""
        if dest.worker.has_work():
            dest.rank.scheduler.activate(req)
            dest.worker.sample_kv()
            dest.worker.wake()
            self.try_reserve(dest)
            return
        req.decode_admit_ms = self.env.now
        # its prompt blocks are registered (and stay cached once released); Dynamo tries the
        # rank's reservation queue once while they are still held, and again after
        dest.rank.scheduler.materialize(req)
        self.try_reserve(dest)
        tiers = dest.rank.scheduler.tiers
        if tiers is not None:  # its prompt is stored to G2 before its blocks go back
            tiers.store_delivered(req)
        dest.rank.pool.release(req)
        dest.worker.sample_kv()
        dest.worker.wake()  # the freed blocks may admit what waits there
        self.end(req, COMPLETED)
        self.try_reserve(dest)

    def release_source(self, copy: Request) -> None:
        """The source lets go of the KV it held (now, between the prefill worker's passes)."""
        req = copy.parent
        assert req is not None
        worker = self.prefill[req.prefill_worker_idx]
        worker.ranks[req.prefill_dp_rank].scheduler.release_held(copy)
        worker.sample_kv()
        req.source_released_ms = self.env.now
        if req.terminal_status:  # the decode side finished first: its row is written
            self.recorder.request_late(req, "source_released_ms", self.env.now)
        worker.wake()  # freed blocks may admit what waits there

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
