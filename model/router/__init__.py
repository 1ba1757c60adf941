"""Routers: which worker takes each request. A registry keyed by `router.kind` builds them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from servesim.config.errors import ConfigError
from servesim.config.schema import EngineConfig, RouterConfig
from servesim.config.schema import KvRouter as KvRouterConfig
from servesim.metrics.recorder import Recorder
from servesim.router.base import Router
from servesim.router.kv import KvRouter
from servesim.router.random import RandomRouter
from servesim.router.round_robin import RoundRobin
from servesim.workload.request import Request


@dataclass(frozen=True)
class RouterSite:
    """What a router is built over: `num_workers` workers of `dp_size` ranks each (`flat`:
    rotate over all ranks worker-major, as for P/D pools), the simulation, the pool's engine
    (block size, token budget), its role, the recorder, and where a routed request goes
    (`send(request, worker, rank)`)."""

    num_workers: int
    dp_size: int
    flat: bool
    env: simpy.Environment
    engine: EngineConfig
    role: str
    recorder: Recorder
    rng: np.random.Generator
    send: Callable[[Request, int, int], None]


RouterFactory = Callable[[RouterConfig, RouterSite], Router]


def _kv(cfg: RouterConfig, site: RouterSite) -> Router:
    assert isinstance(cfg, KvRouterConfig)
    e = site.engine
    return KvRouter(
        site.env,
        cfg,
        site.num_workers,
        site.dp_size,
        site.rng,
        e.block_size,
        e.max_num_batched_tokens,
        site.role,
        site.recorder,
    )


ROUTERS: dict[str, RouterFactory] = {
    "round_robin": lambda cfg, s: RoundRobin(s.num_workers, s.dp_size, s.flat),
    "random": lambda cfg, s: RandomRouter(s.num_workers, s.rng, s.dp_size),
    "kv": _kv,
}


def register_router(kind: str, factory: RouterFactory) -> None:
    """Build routers of `router.kind=kind` with `factory(router_config, site)` (the kind must
    have a section in the config schema; a registered factory may replace a shipped one)."""
    ROUTERS[kind] = factory


def build_router(cfg: RouterConfig, site: RouterSite) -> Router:
    """The router `cfg.kind` names, over `site`."""
    factory = ROUTERS.get(cfg.kind)
    if factory is None:
        raise ConfigError(
            f"router.kind: no router {cfg.kind!r} is registered; registered: "
            f"{', '.join(sorted(ROUTERS))}"
        )
    router = factory(cfg, site)
    router.send = site.send
    return router


__all__ = ["KvRouter", "Router", "RouterSite", "build_router", "register_router"]
