"""What every cluster shape shares: building a pool of workers, stamping arrivals, ending
requests in the recorder (and waking whoever waits on them), and telling workers how far
ahead nothing can reach them."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

import simpy

from servesim.cluster.tier_builder import TierBuilder
from servesim.config.errors import ConfigError
from servesim.config.plan import Plan
from servesim.config.schema import EngineConfig, RunConfig
from servesim.engine.registry import scheduler_class
from servesim.engine.scheduler_base import SchedulerBase
from servesim.engine.speculative import burst_sampler
from servesim.engine.worker import Worker
from servesim.kv.events import KvEventBus
from servesim.metrics.recorder import COMPLETED, REJECTED, Recorder
from servesim.router import KvRouter, Router
from servesim.speed.fast_worker import FastWorker
from servesim.speed.pool_choice import choose_pool
from servesim.timing import frontend_latency_ms
from servesim.timing.base import StepTime
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request, Status


def total_workers(cfg: RunConfig) -> int:
    topo = cfg.topology
    if topo.kind == "disagg":
        return topo.num_prefill_workers + topo.num_decode_workers
    return topo.num_workers


class ClusterBase:
    def __init__(self, env: simpy.Environment, plan: Plan, recorder: Recorder) -> None:
        self.env = env
        self.plan = plan
        cfg = self.cfg = plan.cfg
        self.recorder = recorder
        self.n_in_flight = 0
        self.n_dispatched = 0
        # whether a completion can dispatch a request (closed loop, multi-turn sessions,
        # agentic replays); sim.py clears it for an open loop of single requests
        self.sessions_dispatch = True
        self.next_arrival_ms = math.inf
        self.stop_ms = cfg.stop.max_virtual_time_ms or math.inf
        self.workers: list[Worker] = []
        # every KV pool's stored / removed events: the recorder keeps them as a table, KV
        # routers' prefix indexes subscribe as they are attached
        self.kv_bus = KvEventBus()
        if recorder.keep_kv_events:
            self.kv_bus.subscribe(recorder.kv_event_batch)
        self.tiers = TierBuilder(env, plan, recorder, self.kv_bus)
        self.routers: list[Router] = []
        # KV routers with a pending queue: they apply a pass end's signals in the pass's
        # running order, so each admission to their workers is told to them
        self.ordered_routers: list[KvRouter] = []
        # the timing model's per-request frontend latency (tokenization, API, scheduling)
        # between a request's arrival and its reaching the router; counts in TTFT
        self.frontend_ms = frontend_latency_ms(cfg)
        self.in_frontend: dict[int, Request] = {}  # arrived, not yet at the router (by idx)
        # in one part of a partitioned run (model/speed/parallel.py): whether worker k is replayed
        # here (None: every worker is); only its workers' requests are dispatched
        self.replays_worker: Callable[[int], bool] | None = None

    @property
    def completion_dispatches(self) -> bool:
        """Whether an event other than the driver's next arrival can reach a worker (then any
        event may): a completion that dispatches, or a frontend hand-over (a delayed
        hand-over is an event like any other)."""
        return self.sessions_dispatch or self.frontend_ms > 0

    def group_blocks(self, engine: EngineConfig) -> int:
        """Engine blocks per trace block when they tile it (prompt ids packed by trace block,
        kept by group in the pool), else 1. A pool that KV tiers copy out of is kept per block
        (copies pin blocks by key)."""
        tbs = getattr(self.cfg.workload, "trace_block_size", None)
        if tbs is None or tbs % engine.block_size or self.tiers.enabled:
            return 1
        return tbs // engine.block_size

    def build_pool(
        self,
        role: str,
        engine: EngineConfig,
        n_workers: int,
        n_blocks: int,
        step_time: StepTime,
        hasher: BlockHasher,
        on_complete: Callable[[Request], None],
        name: str = "w",
        horizon: Callable[[], float] | None = None,
    ) -> list[Worker]:
        """`n_workers` workers of `engine`, each with `dp_size` ranks of `n_blocks` blocks.

        With the speed layer's fast-forward on (and no KV tiers: their copies start and land at
        pass boundaries, so every pass is stepped), each is a FastWorker looking ahead to
        `horizon` (default: the earliest time a request could reach any worker)."""
        first = len(self.workers)
        pool = []
        group = self.group_blocks(engine) if self.cfg.speed.grouped_pool else 1
        fast = self.cfg.speed.fast_forward and not self.tiers.enabled
        policy = scheduler_class(engine.kind)
        speculative = engine.speculative.num_speculative_tokens is not None
        if speculative and not getattr(policy, "draws_bursts", False):
            raise ConfigError(
                f"engine.speculative.num_speculative_tokens: engine.kind={engine.kind} does not "
                "draw speculative bursts (its scheduler class sets no `draws_bursts`)"
            )
        for k in range(n_workers):
            scheds = [
                policy(
                    engine,
                    choose_pool(
                        n_blocks,
                        engine.enable_prefix_caching,
                        self.plan.kv_events,
                        group,
                        getattr(policy, "radix_cache", False),
                    ),
                    hasher,
                    self._admitted,
                    role,
                )
                for _ in range(engine.dp_size)
            ]
            if speculative:
                for dp_rank, sched in enumerate(scheds):
                    # its burst draws, seeded by the rank's scheduler id in this pool
                    assert isinstance(sched, SchedulerBase)
                    sched.speculator = burst_sampler(engine, k * engine.dp_size + dp_rank)
            args = (self.env, k, scheds, step_time, self.recorder, on_complete, self._rejected)
            n, worker_name, order = total_workers(self.cfg), f"cluster.{name}{k}", first + k
            worker = (
                FastWorker(*args, n, worker_name, role, order, self.kv_bus, horizon or self.horizon)
                if fast
                else Worker(*args, n, worker_name, role, order, self.kv_bus)
            )
            if self.tiers.enabled:
                for rank in worker.ranks:
                    rank.scheduler.tiers = self.tiers.for_rank(worker, rank, engine)
            pool.append(worker)
        self.workers.extend(pool)
        return pool

    def attach_router(self, router: Router, workers: list[Worker]) -> None:
        """Let `router` hear about `workers`: their G1 (and G2/G3) KV events feed a KV
        router's prefix index, flat target worker x dp_size + rank."""
        self.routers.append(router)
        if not isinstance(router, KvRouter):
            return
        for worker in workers:
            worker.on_signals_done = router.settle
        if router.busy_tokens is not None:
            self.ordered_routers.append(router)
        index = router.index
        for k, worker in enumerate(workers):
            for rank in worker.ranks:
                target = k * router.dp_size + rank.dp_rank
                index.bind_device(rank.name, target)
                tiers = rank.scheduler.tiers
                if tiers is not None:
                    index.bind_tiers(
                        target, tiers.g2.name, tiers.g3.name if tiers.g3 is not None else None
                    )
        self.kv_bus.subscribe(index.hear)

    def horizon(self) -> float:
        """The earliest time a request could next reach any worker."""
        if any(r.has_waiting for r in self.routers):
            return self.env.now  # any pass end may release a waiting request
        if self.completion_dispatches:
            # any event may dispatch; the stop time is not an event once the run reaches it
            return min(self.env.peek(), self.stop_ms)
        return min(self.next_arrival_ms, self.stop_ms)

    def announce_arrival(self, t_ms: float) -> None:
        """The open-loop driver's next dispatch time (inf when it has no more)."""
        self.next_arrival_ms = t_ms

    def dispatch(self, req: Request) -> None:
        """A request arrives now (each cluster shape routes it its own way)."""
        raise NotImplementedError

    def after_frontend(self, req: Request, submit: Callable[[Request], None]) -> None:
        """Hand `req` to `submit` now, or once the frontend latency has passed."""
        if self.frontend_ms <= 0:
            submit(req)
            return
        self.in_frontend[req.idx] = req

        def hand_over(_ev: object) -> None:
            del self.in_frontend[req.idx]
            submit(req)

        self.env.timeout(self.frontend_ms).callbacks.append(hand_over)

    def arrive(self, req: Request) -> None:
        """Stamp an arrival now."""
        req.arrival_ms = self.env.now
        req.token_times_ms = array("d")
        self.n_in_flight += 1
        self.n_dispatched += 1

    def _admitted(self, req: Request, reused_tokens: int, now_ms: float) -> None:
        if req.n_admissions == 1:
            req.first_admit_ms = now_ms
            req.first_admission_reused_tokens = reused_tokens
        req.note_reuse(reused_tokens, req.admit_host_tokens, req.admit_disk_tokens)
        for router in self.ordered_routers:
            router.admitted(req)

    def end(self, req: Request, status: str, reason: str = "") -> None:
        req.status = Status.DONE
        self.n_in_flight -= 1
        for router in self.routers:
            router.finished(req)
        self.recorder.request_terminal(req, status, self.env.now, reason)
        if req.done is not None:
            req.done.succeed()

    def _completed(self, req: Request) -> None:
        self.end(req, COMPLETED)

    def _rejected(self, req: Request, reason: str) -> None:
        self.end(req.parent or req, REJECTED, reason)

    def in_flight(self) -> list[Request]:
        """Requests dispatched but not ended: those still in the frontend, those waiting in a
        router, then worker by worker (rejected by the pass it computes, running, waiting)."""
        out: list[Request] = list(self.in_frontend.values())
        for router in self.routers:
            out.extend(router.waiting())
        for w in self.workers:
            out.extend(w.rejecting)
            for rank in w.ranks:
                sched = rank.scheduler
                out.extend(sched.running)
                out.extend(sched.queued())
        return out
