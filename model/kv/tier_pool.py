"""One pool of a KV tier below HBM (a G2 host pool or a G3 disk pool): its blocks by content hash.

Resident blocks are kept in LRU order (oldest first), incoming ones (a copy into the tier in
flight) hold their room until they land, and pinned ones (read by a copy out of the tier) are
never evicted. The copies themselves, and the rules of when they happen, are `servesim.kv.tiers`'.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import simpy

from servesim.kv.events import KvEventBus
from servesim.kv.pool_base import REMOVED, STORED, count_in, count_out, evict_oldest
from servesim.metrics.recorder import Recorder


class Reader(Protocol):
    """What reads a pool (a rank's tiers): told when blocks land, a request may wait for them."""

    def blocks_arrived(self) -> None: ...


class TierPool:
    """Blocks of one lower tier, by content hash: resident (LRU order, oldest first), incoming
    (a copy into this tier in flight: room taken, not yet readable) and pins (held by a copy out
    of this tier; never evicted)."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        tier: str,
        capacity_blocks: int,
        recorder: Recorder,
        kv_bus: KvEventBus | None,
        worker: int = -1,
        dp_rank: int = 0,
        order: int = 0,
    ) -> None:
        self.env = env
        self.name = name
        self.tier = tier
        self.capacity_blocks = capacity_blocks
        self.recorder = recorder
        self.kv_bus = kv_bus  # where its stored / removed events go (None: nowhere)
        self.worker = worker
        self.dp_rank = dp_rank
        self.order = order
        self.resident: OrderedDict[int, None] = OrderedDict()
        self.incoming: set[int] = set()
        self.pins: dict[int, int] = {}
        self.n_admitted = 0  # blocks that landed here
        self.n_evicted = 0
        self.n_dropped = 0  # blocks a copy could not find room for
        self._level = (-1, -1)
        # the LRU order changes only by `touch` and `refresh` (evicting keeps the others'
        # order): `_moves` counts them, `_touched` is the last key list touched, at `_touched_at`
        self._moves = 0
        self._touched: list[int] | None = None
        self._touched_at = -1
        # the ranks that read this tier (one, or every rank of a shared pool), told when
        # blocks land: a request there may be waiting for them
        self.readers: list[Reader] = []

    @property
    def free_blocks(self) -> int:
        return self.capacity_blocks - len(self.resident) - len(self.incoming)

    @property
    def evictable_blocks(self) -> int:
        """Resident blocks no copy out of this tier is reading (few are: count the pins)."""
        resident = self.resident
        return len(resident) - sum(1 for k in self.pins if k in resident)

    def lookup(self, keys: list[int]) -> int:
        """How many leading `keys` are resident (readable)."""
        n = 0
        for k in keys:
            if k not in self.resident:
                break
            n += 1
        return n

    def touch(self, keys: list[int]) -> None:
        """Mark `keys` recently used; the first key ends up the most recent (a prefix outlives
        its suffix)."""
        if keys is self._touched and self._moves == self._touched_at:
            return  # touched last, and no block moved since: the order is already this one
        resident = self.resident
        move_to_end = resident.move_to_end
        for k in filter(resident.__contains__, reversed(keys)):
            move_to_end(k)
        self._moves += 1
        self._touched = keys
        self._touched_at = self._moves

    def reserve(self, keys: list[int], counted: int = 0) -> list[int] | None:
        """Take room for the `keys` this tier lacks (in order, each once), evicting least
        recently used unpinned blocks; returns them. All or nothing: when they cannot all have
        room, nothing is taken or evicted and the answer is None (the copy is dropped, and its
        blocks count in `n_dropped`, but for the first `counted` keys: a retry of a copy
        refused before)."""
        resident = self.resident
        incoming = self.incoming
        seen: set[int] = set()
        missing = []
        n_new = 0  # missing blocks not counted by an earlier refusal
        for i, k in enumerate(keys):
            if k in resident or k in incoming or k in seen:
                continue
            seen.add(k)
            missing.append(k)
            if i >= counted:
                n_new += 1
        if not missing:
            return []
        short = len(missing) - self.free_blocks
        if short > 0:
            if self.evictable_blocks < short:
                self.n_dropped += n_new
                return None
            self._evict(short)
        incoming.update(missing)
        self._sample()
        return missing

    def can_hold(self, keys: set[int]) -> bool:
        """Whether room for all of `keys` can be had without evicting any of them."""
        resident, incoming, pins = self.resident, self.incoming, self.pins
        missing = sum(1 for k in keys if k not in resident and k not in incoming)
        evictable = sum(1 for k in resident if k not in pins and k not in keys)
        return missing <= self.free_blocks + evictable

    def _evict(self, n: int) -> None:
        victims = evict_oldest(self.resident, self.pins, n)
        for k in victims:
            self._event(REMOVED, k)
        self.n_evicted += len(victims)

    def land(self, keys: list[int]) -> None:
        """A copy into this tier arrived: its blocks become resident, the most recent, in
        the order given (the first the oldest of them; `RankTiers.cohort` orders a store's)."""
        self.refresh(keys)
        for k in keys:
            self.incoming.discard(k)
            self._event(STORED, k)
        self.n_admitted += len(keys)
        self._sample()
        for reader in self.readers:
            reader.blocks_arrived()

    def refresh(self, keys: list[int]) -> None:
        """Make `keys` the most recently used, in their order (the first the oldest)."""
        self._moves += 1
        resident = self.resident
        for k in keys:
            resident[k] = None
            resident.move_to_end(k)

    def pin(self, keys: list[int]) -> None:
        count_in(self.pins, keys)
        self._sample()

    def unpin(self, keys: list[int]) -> None:
        count_out(self.pins, keys)
        self._sample()

    def _event(self, kind: str, h: int) -> None:
        if self.kv_bus is not None:
            self.kv_bus.publish(
                self.env.now,
                self.name,
                self.worker,
                self.dp_rank,
                [(kind, h)],
                self.tier,
                self.order,
            )

    def _sample(self) -> None:
        used = len(self.resident) + len(self.incoming)
        cached = self.evictable_blocks
        level = (used, cached)
        if level != self._level:
            self._level = level
            self.recorder.kv_level(
                self.env.now, self.name, self.tier, used, cached, self.worker, self.dp_rank
            )
