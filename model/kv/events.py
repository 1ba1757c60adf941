"""The KV event bus: where every KV pool's `stored` / `removed` events go, and who hears them.

A pool buffers its events; its worker publishes them at the pass end (or as a change between
passes lands), a G2 / G3 pool as they happen. The recorder subscribes to keep the kv_events
table; a KV router's prefix index subscribes to learn which worker holds which blocks. One bus
per cluster.
"""

from __future__ import annotations

from collections.abc import Callable

# (t_ms, pool, worker, dp_rank, [(kind, block hash), ...], tier, worker_order)
KvListener = Callable[[float, str, int, int, list[tuple[str, int]], str, int], None]


class KvEventBus:
    """Publishes each batch of one pool's events, in order, to every subscriber."""

    __slots__ = ("listeners",)

    def __init__(self) -> None:
        self.listeners: list[KvListener] = []

    def subscribe(self, listener: KvListener) -> None:
        self.listeners.append(listener)

    def publish(
        self,
        t_ms: float,
        pool: str,
        worker: int,
        dp_rank: int,
        events: list[tuple[str, int]],
        tier: str,
        worker_order: int,
    ) -> None:
        """Events of `pool` (a rank's name, e.g. cluster.d0, or a tier pool's) at `t_ms`."""
        for listener in self.listeners:
            listener(t_ms, pool, worker, dp_rank, events, tier, worker_order)
