"""Building the KV tiers of a cluster: a G2 (and G3) pool and its links per rank, or one pool
and its links shared by every rank, as `kv_cache`'s scopes say.
"""

from __future__ import annotations

import math

import simpy

from servesim.config.plan import Plan
from servesim.config.schema import EngineConfig
from servesim.engine.worker import Rank, Worker
from servesim.kv.events import KvEventBus
from servesim.kv.link import Link
from servesim.kv.tier_pool import TierPool
from servesim.kv.tiers import DISK, HOST, RankTiers
from servesim.metrics.recorder import Recorder


def _link(
    env: simpy.Environment,
    name: str,
    recorder: Recorder,
    bandwidth_gbps: float,
    latency_ms: float,
    shared: bool,
    pool_bandwidth_gbps: float = 0.0,
    instant_latency: bool = False,
) -> Link:
    """A tier link: 0 GB/s is instant (after the latency, with `instant_latency`: G3's). A
    private link queues copies in one FIFO lane; a shared one shares `pool_bandwidth_gbps`
    (0 = unlimited) with a per-worker cap of `bandwidth_gbps`."""
    if not shared:
        bw = bandwidth_gbps or None
        return Link(env, name, bw, latency_ms if bw else 0.0, "fifo_lanes", recorder, lanes=1)
    if not bandwidth_gbps and not pool_bandwidth_gbps:
        if instant_latency and latency_ms > 0:  # no bandwidth limit: each copy takes the latency
            return Link(env, name, math.inf, latency_ms, "per_request", recorder)
        return Link(env, name, None, 0.0, "per_request", recorder)
    return Link(
        env,
        name,
        pool_bandwidth_gbps or float("inf"),
        latency_ms,
        "shared",
        recorder,
        group_bandwidth_gbps=bandwidth_gbps or None,
    )


class TierBuilder:
    """Builds the tiers of every rank of a cluster from `kv_cache`, sharing pools and links as
    the scopes say."""

    def __init__(
        self, env: simpy.Environment, plan: Plan, recorder: Recorder, kv_bus: KvEventBus
    ) -> None:
        self.env = env
        self.plan = plan
        cfg = plan.cfg
        self.recorder = recorder
        self.kv_bus = kv_bus if plan.kv_events else None  # (pools publish only if heard)
        self.host = cfg.kv_cache.host_offload
        self.disk = cfg.kv_cache.disk
        self.pools: list[TierPool] = []
        self._shared_g2: tuple[TierPool, Link, Link] | None = None
        self._shared_g3: tuple[TierPool, Link, Link] | None = None
        self._worker_g3: dict[str, tuple[TierPool, Link, Link]] = {}

    @property
    def enabled(self) -> bool:
        return self.host.num_host_blocks is not None

    def _pool(self, name: str, tier: str, n: int, worker: int, rank: int, order: int) -> TierPool:
        pool = TierPool(self.env, name, tier, n, self.recorder, self.kv_bus, worker, rank, order)
        self.pools.append(pool)
        return pool

    def for_rank(self, worker: Worker, rank: Rank, engine: EngineConfig) -> RankTiers:
        env, rec, host, disk = self.env, self.recorder, self.host, self.disk
        assert host.num_host_blocks is not None
        if host.scope == "cluster_shared":
            if self._shared_g2 is None:
                self._shared_g2 = (
                    self._pool("cluster.host", HOST, host.num_host_blocks, -1, 0, 1 << 30),
                    _link(
                        env,
                        "cluster.host.d2h",
                        rec,
                        host.d2h_bandwidth_gbps,
                        host.latency_to_first_byte_ms,
                        True,
                        host.shared_d2h_bandwidth_gbps,
                    ),
                    _link(
                        env,
                        "cluster.host.h2d",
                        rec,
                        host.h2d_bandwidth_gbps,
                        host.latency_to_first_byte_ms,
                        True,
                        host.shared_h2d_bandwidth_gbps,
                    ),
                )
            g2, d2h, h2d = self._shared_g2
        else:
            g2 = self._pool(
                f"{rank.name}.host",
                HOST,
                host.num_host_blocks,
                worker.idx,
                rank.dp_rank,
                worker.order,
            )
            d2h = _link(
                env,
                f"{rank.name}.d2h",
                rec,
                host.d2h_bandwidth_gbps,
                host.latency_to_first_byte_ms,
                False,
            )
            h2d = _link(
                env,
                f"{rank.name}.h2d",
                rec,
                host.h2d_bandwidth_gbps,
                host.latency_to_first_byte_ms,
                False,
            )
        g3 = write = read = None
        if disk.num_g3_blocks is not None:
            if disk.scope == "cluster_shared":
                if self._shared_g3 is None:
                    self._shared_g3 = self._disk("cluster.disk", -1, 1 << 30, True)
                g3, write, read = self._shared_g3
            else:
                if worker.name not in self._worker_g3:
                    self._worker_g3[worker.name] = self._disk(
                        f"{worker.name}.disk", worker.idx, worker.order, False
                    )
                g3, write, read = self._worker_g3[worker.name]
        tiers = RankTiers(
            env,
            engine.block_size * self.plan.kv_bytes_per_token,  # one block, all TP shards
            engine.block_size,
            g2,
            d2h,
            h2d,
            g3,
            write,
            read,
        )
        tiers.owner = rank
        tiers.g1 = rank.pool
        g2.readers.append(tiers)
        if g3 is not None:  # (a block landing in G3 may end a lookup's wait for it)
            g3.readers.append(tiers)
        return tiers

    def _disk(
        self, name: str, worker: int, order: int, shared: bool
    ) -> tuple[TierPool, Link, Link]:
        disk = self.disk
        assert disk.num_g3_blocks is not None
        ttfb = disk.latency_to_first_byte_ms
        pool_w = disk.shared_write_bandwidth_gbps if shared else disk.write_bandwidth_gbps
        pool_r = disk.shared_read_bandwidth_gbps if shared else disk.read_bandwidth_gbps
        env, rec = self.env, self.recorder
        write_bw, read_bw = disk.write_bandwidth_gbps, disk.read_bandwidth_gbps
        write = _link(env, f"{name}.write", rec, write_bw, ttfb, True, pool_w, True)
        read = _link(env, f"{name}.read", rec, read_bw, ttfb, True, pool_r, True)
        return self._pool(name, DISK, disk.num_g3_blocks, worker, 0, order), write, read
