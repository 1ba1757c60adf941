"""An aggregated cluster: N identical workers that each prefill and decode their own requests,
behind one router. Dispatch stamps the arrival and routes; completion and rejection end the
request in the recorder and wake whoever waits on it."""

from __future__ import annotations

import math
from array import array

import numpy as np
import simpy

from model.config.derived import num_gpu_blocks
from model.config.schema import RunConfig
from model.engine.vllm import VllmScheduler
from model.engine.worker import Worker
from model.kv.block_pool import BlockPool
from model.metrics.recorder import COMPLETED, REJECTED, Recorder
from model.router import build_router
from model.timing import build_step_time
from model.workload.hashing import BlockHasher
from model.workload.request import Request, Status


class AggregatedCluster:
    def __init__(
        self,
        env: simpy.Environment,
        cfg: RunConfig,
        hasher: BlockHasher,
        recorder: Recorder,
        router_rng: np.random.Generator,
    ) -> None:
        self.env = env
        self.recorder = recorder
        self.n_in_flight = 0
        self.n_dispatched = 0
        # when a completion can trigger a dispatch (closed loop, multi-turn sessions) any event
        # may reach a worker; otherwise only the driver's next arrival or the stop time can
        self.completion_dispatches = True
        self.next_arrival_ms = math.inf
        self.stop_ms = cfg.stop.max_virtual_time_ms or math.inf
        blocks = num_gpu_blocks(cfg)
        step_time = build_step_time(cfg)
        self.workers: list[Worker] = []
        for w in range(cfg.topology.num_workers):
            scheds = [
                VllmScheduler(
                    cfg.engine,
                    BlockPool(blocks, cfg.engine.enable_prefix_caching, cfg.output.kv_events),
                    hasher,
                    self._admitted,
                )
                for _ in range(cfg.engine.dp_size)
            ]
            self.workers.append(
                Worker(
                    env,
                    w,
                    scheds,
                    step_time,
                    recorder,
                    self._completed,
                    self._rejected,
                    cfg.topology.num_workers,
                    self.horizon,
                    cfg.engine.fast_forward,
                )
            )
        self.router = build_router(cfg.router, len(self.workers), router_rng, cfg.engine.dp_size)

    def horizon(self) -> float:
        """The earliest time a request could next reach any worker."""
        if self.completion_dispatches:
            return self.env.peek()
        return min(self.next_arrival_ms, self.stop_ms)

    def announce_arrival(self, t_ms: float) -> None:
        """The open-loop driver's next dispatch time (inf when it has no more)."""
        self.next_arrival_ms = t_ms

    def dispatch(self, req: Request) -> None:
        """A request arrives now: stamp it and hand it to the worker the router picks."""
        req.arrival_ms = self.env.now
        req.token_times_ms = array("d")
        self.n_in_flight += 1
        self.n_dispatched += 1
        worker, rank = self.router.route(req)
        self.workers[worker].submit(req, rank)

    def _admitted(self, req: Request, reused_tokens: int, now_ms: float) -> None:
        if req.n_admissions == 1:
            req.first_admit_ms = now_ms
            req.first_admission_reused_tokens = reused_tokens
        if reused_tokens > req.reused_input_tokens:
            req.reused_input_tokens = reused_tokens

    def _end(self, req: Request, status: str, reason: str = "") -> None:
        req.status = Status.DONE
        self.n_in_flight -= 1
        self.recorder.request_terminal(req, status, self.env.now, reason)
        if req.done is not None:
            req.done.succeed()

    def _completed(self, req: Request) -> None:
        self._end(req, COMPLETED)

    def _rejected(self, req: Request, reason: str) -> None:
        self._end(req, REJECTED, reason)

    def in_flight(self) -> list[Request]:
        """Requests dispatched but not ended, worker by worker (running, then waiting)."""
        out: list[Request] = []
        for w in self.workers:
            for rank in w.ranks:
                out.extend(rank.scheduler.running)
                out.extend(rank.scheduler.waiting)
        return out
