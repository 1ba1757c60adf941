"""What every G1 (GPU HBM) KV pool of a scheduler rank offers and keeps alike (`PoolBase`, the
type the engine and the tiers hold a pool by), and the block keys and events they share.

`BlockPool` (servesim.kv.block_pool) keeps one entry per block; the speed layer's `GroupPool`
(servesim.speed.group_pool) one per group of blocks a trace block tiles: same answers.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from servesim.workload.request import Request

STORED = "stored"
REMOVED = "removed"

Key = Any  # int content hash (first copy) or (hash, serial) for a duplicate copy


def count_in(counts: dict[Any, int], keys: list[Any]) -> None:
    """One more holder of each of `keys` (a multiset kept as key -> count)."""
    for key in keys:
        counts[key] = counts.get(key, 0) + 1


def count_out(counts: dict[Any, int], keys: list[Any]) -> list[Any]:
    """One holder fewer of each of `keys`; returns the keys nobody holds any more."""
    freed = []
    for key in keys:
        c = counts[key] - 1
        if c:
            counts[key] = c
        else:
            del counts[key]
            freed.append(key)
    return freed


def evict_oldest(ordered: OrderedDict[Any, None], kept: dict[Any, int], n: int) -> list[Any]:
    """Remove and return the n oldest keys of `ordered` that are not in `kept` (pinned)."""
    victims = []
    for key in ordered:
        if key not in kept:
            victims.append(key)
            if len(victims) == n:
                break
    for key in victims:
        del ordered[key]
    return victims


class PoolBase:
    """What both G1 pools keep alike: the counters, the release runs, duplicate copies and
    buffered KV events, and fresh allocations (empty blocks first, then evicting). Subclasses
    keep the resident blocks (`BlockPool` one entry per block, `GroupPool` per group) and give
    the levels and the eviction."""

    __slots__ = (
        "capacity_blocks",
        "enable_caching",
        "n_inactive",
        "runs",
        "_front_run",
        "_next_run",
        "_run_entries",
        "copies",
        "n_private",
        "pinned",
        "n_pinned_inactive",
        "fenced",
        "fenced_ranks",
        "fenced_blocks",
        "record_events",
        "pending_events",
        "n_evictions",
        "generation",
        "_serial",
    )

    def __init__(self, capacity_blocks: int, enable_caching: bool, record_events: bool) -> None:
        self.capacity_blocks = capacity_blocks
        self.enable_caching = enable_caching
        self.n_inactive = 0
        # releases that made blocks inactive, by id: [keys (or spans) in eviction order, next
        # position, end of the range still to consider, stale (some key in the range may no
        # longer be inactive in this run)]; ids count up from the oldest
        self.runs: dict[int, list[Any]] = {}
        self._front_run = 1  # the oldest run that may still hold inactive blocks
        self._next_run = 1
        self._run_entries = 0  # entries listed by all runs
        self.copies: dict[int, list[Key]] = {}  # hash -> its copies, oldest first (duplicates only)
        self.n_private = 0  # active blocks without a hash (partial, or caching off)
        # blocks a copy to a lower tier is reading (key -> copies): released, they keep their
        # place in the LRU; evicting one *fences* the new owner's compute until that copy has
        # landed (vLLM reuses the block once the copy is done), and the evicted keys are kept
        # in `fenced` until the caller takes them
        self.pinned: dict[Key, int] = {}
        self.n_pinned_inactive = 0
        self.fenced: list[Key] = []
        # for each fenced key, its rank among the blocks its eviction took; and, by request,
        # the positions of the blocks it was granted from under a copy still in flight in the
        # pass being formed (cleared as a pass is formed; such a block is not copied in it)
        self.fenced_ranks: list[int] = []
        self.fenced_blocks: dict[Request, list[int]] = {}
        self.record_events = record_events
        self.pending_events: list[tuple[str, int]] = []
        self.n_evictions = 0
        self.generation = 0  # counts releases: capacity can only grow when it changes
        self._serial = 0

    @property
    def n_empty(self) -> int:
        """Blocks holding nothing (taken before any cached block is evicted)."""
        raise NotImplementedError

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request (empty or evictable, pinned ones included)."""
        raise NotImplementedError

    def _evict(self, n: int) -> None:
        raise NotImplementedError

    def allocate(self, req: Request, n_blocks: int) -> bool:
        """Grant `req` n fresh private blocks, evicting cached ones in LRU order; False if they
        do not fit. Evicting a pinned block fences (its key goes to `fenced`)."""
        if n_blocks <= 0:
            return True
        if n_blocks > self.free_blocks:
            return False
        empty = self.n_empty
        if n_blocks > empty:
            n_fenced = len(self.fenced)
            n_evicted = n_blocks - empty
            self._evict(n_evicted)
            if len(self.fenced) > n_fenced:
                # as in Dynamo, the blocks taken by eviction go to the request's first new
                # positions, the last one evicted first
                start = len(req.held_hashes) + req.held_private_blocks + n_evicted - 1
                self.fenced_blocks.setdefault(req, []).extend(
                    [start - rank for rank in self.fenced_ranks[n_fenced:]]
                )
        self.n_private += n_blocks
        req.held_private_blocks += n_blocks
        return True

    def take_fenced(self, since: int = 0) -> list[Key]:
        """The pinned blocks evicted since the last call (their copies fence the reuse), from
        the `since`-th on (those before it stay for whoever evicted them)."""
        fenced = self.fenced
        taken = fenced[since:]
        del fenced[since:]
        del self.fenced_ranks[since:]
        return taken

    def _evicted(self, key: Key, events: list[tuple[str, int]] | None) -> None:
        """Bookkeeping after evicting `key`: drop it from its copies; `removed` when it was
        the content's last copy."""
        h = key[0] if isinstance(key, tuple) else key
        keys = self.copies.get(h)
        if keys is not None:
            keys.remove(key)
            if keys:
                return  # another copy still holds this content
            del self.copies[h]
        if events is not None:
            events.append((REMOVED, h))

    def take_events(self) -> list[tuple[str, int]]:
        """The buffered KV events, oldest first (the buffer starts empty again)."""
        events = self.pending_events
        self.pending_events = []
        return events

    # ------------------------------------------------------------ what each pool keeps its way

    @property
    def n_active(self) -> int:
        """Blocks held by at least one request."""
        raise NotImplementedError

    @property
    def n_cached(self) -> int:
        """Inactive blocks (cached, evictable)."""
        raise NotImplementedError

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """Leading blocks of `hashes` resident, and how many of them are active."""
        raise NotImplementedError

    def acquire(self, req: Request, hashes: list[int]) -> None:
        """`req` takes the resident blocks `hashes` (a prefix hit)."""
        raise NotImplementedError

    def register(self, req: Request, h: int) -> None:
        """`req`'s newest full block now holds content `h` (cacheable, shareable)."""
        raise NotImplementedError

    def register_many(self, req: Request, hashes: list[int]) -> None:
        raise NotImplementedError

    def release(self, req: Request) -> None:
        """`req` lets go of every block it holds, last block first."""
        raise NotImplementedError

    def pin(self, keys: list[Key]) -> None:
        """A copy to a lower tier reads `keys` (released, they keep their LRU place)."""
        raise NotImplementedError

    def unpin(self, keys: list[Key]) -> None:
        raise NotImplementedError


class CountedPool(PoolBase):
    """A pool that counts the blocks resident in it (`n_resident`, cached or held, of which
    `n_inactive` nobody holds): its levels follow from the counters. The radix pool
    (servesim.kv.radix_pool) and the speed layer's grouped pool keep these counts."""

    __slots__ = ("n_resident",)

    def __init__(self, capacity_blocks: int, enable_caching: bool, record_events: bool) -> None:
        super().__init__(capacity_blocks, enable_caching, record_events)
        self.n_resident = 0

    @property
    def n_active(self) -> int:
        """Blocks held by a request: resident and held, or private."""
        return self.n_resident - self.n_inactive + self.n_private

    @property
    def n_cached(self) -> int:
        """Resident blocks nobody holds (evictable)."""
        return self.n_inactive

    @property
    def n_empty(self) -> int:
        """Blocks holding nothing (taken before any cached block is evicted)."""
        return self.capacity_blocks - self.n_resident - self.n_private

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request (empty or evictable)."""
        return self.capacity_blocks - self.n_resident - self.n_private + self.n_inactive


Pool = PoolBase  # a rank's G1 pool, whichever keeps it
