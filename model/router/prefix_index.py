"""What the router believes each (worker, DP rank) caches: a prefix index fed only by KV events.

Block ids are parent-chained (`servesim.workload.hashing`), so a block id stands for its whole
prefix and "the leading blocks of a prompt that target t holds" is a walk down the prompt's ids
while t still holds each one. `Holders` keeps, per block id, which targets hold it (with a count),
so one walk scores every target at once: its cost is the sum, over the prompt's leading blocks,
of how many targets still match, never the number of targets times the prompt length.

`PrefixIndex` has one `Holders` for the device tier (G1 pools' `stored` / `removed` events)
and, per host/disk tier pool, the set of ids it holds. A target's host overlap is the run of
blocks after its device prefix found in its host pool (the blocks a G2 load would bring back),
its disk overlap the run after that found in its disk pool, as the engine's admission looks them
up. With `lag_ms` > 0 an event becomes visible that much after it happened (`advance(now)`
applies what is due before a decision).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter

from servesim.kv.pool_base import STORED


class Holders:
    """Block id -> who holds it: a target id (an int) when one target holds it once, which is
    most blocks, else {target: count}."""

    __slots__ = ("by_block",)

    def __init__(self) -> None:
        self.by_block: dict[int, int | dict[int, int]] = {}

    def add(self, target: int, blocks: Sequence[int]) -> int:
        """Count `blocks` held by `target` once more; returns how many it did not hold."""
        by_block = self.by_block
        new = 0
        for h in blocks:
            holders = by_block.get(h)
            if holders is None:
                by_block[h] = target
                new += 1
            elif holders.__class__ is int:
                if holders == target:
                    by_block[h] = {target: 2}
                else:
                    by_block[h] = {holders: 1, target: 1}  # type: ignore[dict-item]
                    new += 1
            else:
                n = holders.get(target, 0)  # type: ignore[union-attr]
                holders[target] = n + 1  # type: ignore[index]
                new += not n
        return new

    def remove(self, target: int, blocks: Sequence[int]) -> int:
        """Count `blocks` held by `target` once less; returns how many it no longer holds."""
        by_block = self.by_block
        gone = 0
        for h in blocks:
            holders = by_block.get(h)
            if holders is None:
                continue  # a removal of what was never seen (e.g. stored before a lag cut-off)
            if holders.__class__ is int:
                if holders == target:
                    del by_block[h]
                    gone += 1
                continue
            n = holders.get(target)  # type: ignore[union-attr]
            if n is None:
                continue
            if n > 1:
                holders[target] = n - 1  # type: ignore[index]
            else:
                gone += 1
                del holders[target]  # type: ignore[union-attr]
                if not holders:
                    del by_block[h]
        return gone

    def holders_of(self, h: int) -> list[int]:
        """The targets holding block `h` (for inspection)."""
        holders = self.by_block.get(h)
        if holders is None:
            return []
        return [holders] if holders.__class__ is int else list(holders)  # type: ignore[arg-type]

    def depths(self, blocks: Sequence[int], n_targets: int) -> list[int]:
        """For each target, how many leading `blocks` it holds."""
        out = [0] * n_targets
        by_block = self.by_block
        alive: set[int] | None = None
        depth = 0
        for h in blocks:
            holders = by_block.get(h)
            if holders is None:
                break
            if holders.__class__ is int:
                now_alive = {holders} if alive is None or holders in alive else set()
            else:
                now_alive = set(holders) if alive is None else alive.intersection(holders)  # type: ignore[arg-type]
            if alive is not None:
                for t in alive - now_alive:
                    out[t] = depth
            alive = now_alive
            if not alive:
                break
            depth += 1
        if alive:
            for t in alive:
                out[t] = depth
        return out


class PrefixIndex:
    """The router's view of what every target caches, per tier, from KV events only."""

    def __init__(self, n_targets: int, lag_ms: float = 0.0) -> None:
        self.n_targets = n_targets
        self.lag_ms = lag_ms
        self.device = Holders()
        self.device_pool: dict[str, int] = {}  # G1 pool name -> target
        self.tier_blocks: dict[str, set[int]] = {}  # host/disk pool name -> ids it holds
        self.host_pools: list[str | None] = [None] * n_targets
        self.disk_pools: list[str | None] = [None] * n_targets
        self._due: list[tuple[float, int, str, str, int]] = []  # (visible_ms, seq, pool, kind, h)
        self._seq = 0
        self.n_events = 0

    def bind_device(self, pool: str, target: int) -> None:
        self.device_pool[pool] = target

    def bind_tiers(self, target: int, host: str | None, disk: str | None) -> None:
        for name in (host, disk):
            if name is not None:
                self.tier_blocks.setdefault(name, set())
        self.host_pools[target] = host
        self.disk_pools[target] = disk

    @property
    def has_tiers(self) -> bool:
        return bool(self.tier_blocks)

    def on_event(self, t_ms: float, pool: str, kind: str, block_hash: int) -> None:
        """A KV event happened at `t_ms` (events of pools the router does not route to are
        ignored)."""
        self.on_events(t_ms, pool, [(kind, block_hash)])

    def hear(
        self,
        t_ms: float,
        pool: str,
        worker: int,
        dp_rank: int,
        events: list[tuple[str, int]],
        tier: str,
        worker_order: int,
    ) -> None:
        """The index as a listener on the cluster's KV event bus (servesim.kv.events)."""
        self.on_events(t_ms, pool, events)

    def on_events(self, t_ms: float, pool: str, events: list[tuple[str, int]]) -> None:
        """`on_event` for events of one pool at one instant, in order."""
        target = self.device_pool.get(pool)
        if target is None and pool not in self.tier_blocks:
            return
        if self.lag_ms > 0.0:
            for kind, block_hash in events:
                heapq.heappush(self._due, (t_ms + self.lag_ms, self._seq, pool, kind, block_hash))
                self._seq += 1
        elif target is not None:  # the hot path: device events, seen at once
            self.n_events += len(events)
            device = self.device
            # runs of one kind, in order
            for kind, run in groupby(events, itemgetter(0)):
                blocks = [h for _, h in run]
                if kind == STORED:
                    device.add(target, blocks)
                else:
                    device.remove(target, blocks)
        else:
            for kind, block_hash in events:
                self._apply(pool, kind, block_hash)

    def advance(self, now_ms: float) -> None:
        """Apply every lagged event visible by `now_ms`."""
        due = self._due
        while due and due[0][0] <= now_ms:
            _, _, pool, kind, h = heapq.heappop(due)
            self._apply(pool, kind, h)

    def _apply(self, pool: str, kind: str, h: int) -> None:
        self.n_events += 1
        target = self.device_pool.get(pool)
        if target is not None:
            if kind == STORED:
                self.device.add(target, (h,))
            else:
                self.device.remove(target, (h,))
            return
        blocks = self.tier_blocks[pool]
        if kind == STORED:
            blocks.add(h)
        else:
            blocks.discard(h)

    def overlaps(self, blocks: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """Per target: leading blocks held on device, then the run after it held in the host
        pool, then the run after that held on disk."""
        n = self.n_targets
        device = self.device.depths(blocks, n)
        host = [0] * n
        disk = [0] * n
        if self.has_tiers:
            for t in range(n):
                k = device[t]
                h_name = self.host_pools[t]
                if h_name is not None:
                    k = _run(self.tier_blocks[h_name], blocks, k)
                    host[t] = k - device[t]
                d_name = self.disk_pools[t]
                if d_name is not None:
                    disk[t] = _run(self.tier_blocks[d_name], blocks, k) - k
        return device, host, disk


def _run(held: set[int], blocks: Sequence[int], start: int) -> int:
    """The index of the first of `blocks[start:]` not in `held`."""
    k = start
    n = len(blocks)
    while k < n and blocks[k] in held:
        k += 1
    return k
