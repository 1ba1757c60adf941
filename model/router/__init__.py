"""Routers: which worker takes each request."""

from __future__ import annotations

import numpy as np

from model.config.schema import RandomRouter as RandomRouterConfig
from model.config.schema import RouterConfig
from model.router.base import Router
from model.router.random import RandomRouter
from model.router.round_robin import RoundRobin


def build_router(
    cfg: RouterConfig,
    num_workers: int,
    rng: np.random.Generator,
    dp_size: int = 1,
    flat: bool = False,
) -> Router:
    """The configured policy over `num_workers` workers of `dp_size` ranks each (`flat`: rotate
    over all ranks worker-major, as for P/D pools)."""
    if isinstance(cfg, RandomRouterConfig):
        return RandomRouter(num_workers, rng, dp_size)
    return RoundRobin(num_workers, dp_size, flat)


__all__ = ["Router", "build_router"]
