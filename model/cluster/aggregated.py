"""An aggregated cluster: N identical workers that each prefill and decode their own requests,
behind one router. Dispatch stamps the arrival and routes; completion and rejection end the
request in the recorder and wake whoever waits on it."""

from __future__ import annotations

import numpy as np
import simpy

from servesim.cluster.base import ClusterBase
from servesim.config.plan import Plan
from servesim.config.schema import AggregatedTopology
from servesim.metrics.recorder import Recorder
from servesim.router import KvRouter, RouterSite, build_router
from servesim.router.round_robin import RoundRobin
from servesim.timing import build_step_time
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request


class AggregatedCluster(ClusterBase):
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
        assert isinstance(topo, AggregatedTopology)
        self.build_pool(
            "aggregated",
            cfg.engine,
            topo.num_workers,
            plan.gpu_blocks["aggregated"],
            build_step_time(cfg),
            hasher,
            self._completed,
        )
        e = cfg.engine
        self.router = build_router(
            cfg.router,
            RouterSite(
                len(self.workers), e.dp_size, False, env, e, "aggregated", recorder, router_rng,
                self._send,
            ),
        )  # fmt: skip
        self.attach_router(self.router, self.workers)
        if isinstance(self.router, KvRouter):
            for w in self.workers:
                w.on_first_token = self.router.prefill_done

    def dispatch(self, req: Request) -> None:
        """A request arrives now: stamp it and hand it to the router (which sends it to a
        worker now, or later if it keeps it waiting)."""
        if self.replays_worker is not None:
            # a part of a partitioned run sees only its own rows: the round robin skips the
            # ones routed in the other parts
            assert isinstance(self.router, RoundRobin)
            self.router.skip_to(req.idx)
        self.arrive(req)
        self.after_frontend(req, self.router.submit)

    def _send(self, req: Request, worker: int, rank: int) -> None:
        if self.replays_worker is not None and not self.replays_worker(worker):
            raise RuntimeError(
                f"request {req.request_id} (row {req.idx}) was routed to worker {worker}, "
                "which another part of the partitioned run replays"
            )
        self.workers[worker].submit(req, rank)
