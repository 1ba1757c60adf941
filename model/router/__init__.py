"""Routers: which worker takes each request."""

from __future__ import annotations

import numpy as np

from model.config.schema import RandomRouter as RandomRouterConfig
from model.config.schema import RouterConfig
from model.router.base import Router
from model.router.random import RandomRouter
from model.router.round_robin import RoundRobin


def build_router(cfg: RouterConfig, num_workers: int, rng: np.random.Generator) -> Router:
    if isinstance(cfg, RandomRouterConfig):
        return RandomRouter(num_workers, rng)
    return RoundRobin(num_workers)


__all__ = ["Router", "build_router"]
