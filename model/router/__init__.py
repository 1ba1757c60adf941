"""Routers: which worker takes each request."""

from __future__ import annotations

import numpy as np
import simpy

from servesim.config.schema import KvRouter as KvRouterConfig
from servesim.config.schema import RandomRouter as RandomRouterConfig
from servesim.config.schema import RouterConfig, VllmEngineConfig
from servesim.metrics.recorder import Recorder
from servesim.router.base import Router
from servesim.router.kv import KvRouter
from servesim.router.random import RandomRouter
from servesim.router.round_robin import RoundRobin


def build_router(
    cfg: RouterConfig,
    num_workers: int,
    rng: np.random.Generator,
    dp_size: int = 1,
    flat: bool = False,
    *,
    env: simpy.Environment | None = None,
    engine: VllmEngineConfig | None = None,
    role: str = "aggregated",
    recorder: Recorder | None = None,
) -> Router:
    """The configured policy over `num_workers` workers of `dp_size` ranks each (`flat`: rotate
    over all ranks worker-major, as for P/D pools). The KV router also needs the simulation
    (`env`), the pool's `engine` (block size, token budget), its `role` and the `recorder`."""
    if isinstance(cfg, KvRouterConfig):
        assert env is not None and engine is not None and recorder is not None
        return KvRouter(
            env,
            cfg,
            num_workers,
            dp_size,
            rng,
            engine.block_size,
            engine.max_num_batched_tokens,
            role,
            recorder,
        )
    if isinstance(cfg, RandomRouterConfig):
        return RandomRouter(num_workers, rng, dp_size)
    return RoundRobin(num_workers, dp_size, flat)


__all__ = ["KvRouter", "Router", "build_router"]
