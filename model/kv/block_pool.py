"""The G1 (GPU HBM) KV block pool of one scheduler rank, with prefix caching.

A pool holds `capacity_blocks` physical blocks. A block is *active* while at least one request
holds it and *inactive* (cached, evictable) after the last holder lets go; only full blocks carry
a content hash and can be shared or cached, a partly filled block is private to its request.
Ownership is recorded at grant time: every call that hands blocks to a request writes them into
that request's `held_hashes` / `held_private_blocks` before returning, so a preemption that
lands between two calls can always give back exactly what the request holds.

Eviction is plain LRU over inactive blocks, ordered by when each became unreferenced; a request
lets go of its blocks last block first, so its suffix is evicted before the prefix it shares.
Fresh allocations use empty blocks before evicting anything.

If two requests compute the same content without seeing each other (both were admitted before
either registered it), each keeps its own physical copy: both count as active, each is cached
and evicted on its own, and lookups use the oldest copy. The first copy is keyed by the content
hash itself, later copies by `(hash, serial)`.

KV events (`stored` on a new registration, `removed` when the last copy of a content is evicted)
are buffered until the worker publishes them at pass end.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from model.workload.request import Request

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


class BlockPool:
    __slots__ = (
        "capacity_blocks",
        "enable_caching",
        "refcount",
        "inactive",
        "copies",
        "n_private",
        "pinned",
        "n_pinned_inactive",
        "record_events",
        "pending_events",
        "n_evictions",
        "generation",
        "_serial",
    )

    def __init__(
        self, capacity_blocks: int, enable_caching: bool = True, record_events: bool = False
    ) -> None:
        self.capacity_blocks = capacity_blocks
        self.enable_caching = enable_caching
        self.refcount: dict[Key, int] = {}  # active cached blocks: key -> holders
        self.inactive: OrderedDict[Key, None] = OrderedDict()  # eviction order, oldest first
        self.copies: dict[int, list[Key]] = {}  # hash -> its copies, oldest first (duplicates only)
        self.n_private = 0  # active blocks without a hash (partial, or caching off)
        # blocks a copy to a lower tier is reading (key -> copies): they keep their place in
        # the LRU when released, but are not evicted until the copy lands
        self.pinned: dict[Key, int] = {}
        self.n_pinned_inactive = 0
        self.record_events = record_events
        self.pending_events: list[tuple[str, int]] = []
        self.n_evictions = 0
        self.generation = 0  # counts releases: capacity can only grow when it changes
        self._serial = 0

    # ------------------------------------------------------------------ levels

    @property
    def n_active(self) -> int:
        """Blocks in use: held by a request, or pinned by a copy out of this pool."""
        return len(self.refcount) + self.n_private + self.n_pinned_inactive

    @property
    def n_cached(self) -> int:
        """Cached blocks nobody holds (evictable)."""
        return len(self.inactive) - self.n_pinned_inactive

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request nor pinned (empty or evictable)."""
        return self.capacity_blocks - len(self.refcount) - self.n_private - self.n_pinned_inactive

    # ------------------------------------------------------------------ prefix lookups

    def _oldest(self, h: int) -> Key | None:
        """The copy of content `h` that lookups use, or None if `h` is not resident."""
        if h in self.refcount or h in self.inactive:
            return h
        keys = self.copies.get(h)
        return keys[0] if keys else None

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """Leading blocks of `hashes` resident (active or inactive), and how many of them take
        no free block to reuse (active, or pinned by a copy)."""
        if not self.enable_caching:
            return 0, 0
        refcount = self.refcount
        inactive = self.inactive
        pinned = self.pinned
        n = n_active = 0
        for h in hashes:
            if h in refcount:
                n_active += 1
            elif h in inactive:
                if pinned and h in pinned:
                    n_active += 1
            else:
                key = self._oldest(h)
                if key is None:
                    break
                if key in refcount or key in pinned:
                    n_active += 1
            n += 1
        return n, n_active

    def acquire(self, req: Request, hashes: list[int]) -> None:
        """Grant `req` the resident blocks `hashes` (a prefix hit): share or reactivate them."""
        refcount = self.refcount
        inactive = self.inactive
        held = req.held_hashes
        for h in hashes:
            key = h if (h in refcount or h in inactive) else self._oldest(h)
            assert key is not None, f"block {h} was not resident"
            c = refcount.get(key)
            if c is None:
                del inactive[key]
                if key in self.pinned:
                    self.n_pinned_inactive -= 1
                refcount[key] = 1
            else:
                refcount[key] = c + 1
            held.append(key)

    # ------------------------------------------------------------------ allocation

    def allocate(self, req: Request, n_blocks: int) -> bool:
        """Grant `req` n fresh private blocks, evicting cached ones; False if they do not fit."""
        if n_blocks <= 0:
            return True
        if n_blocks > self.free_blocks:
            return False
        empty = self.capacity_blocks - len(self.refcount) - self.n_private - len(self.inactive)
        if n_blocks > empty:
            copies = self.copies
            events = self.pending_events if self.record_events else None
            if self.n_pinned_inactive:
                victims = evict_oldest(self.inactive, self.pinned, n_blocks - empty)
            else:
                popitem = self.inactive.popitem
                victims = [popitem(False)[0] for _ in range(n_blocks - empty)]  # oldest first
            for key in victims:
                if copies or events is not None:
                    self._evicted(key, events)
            self.n_evictions += n_blocks - empty
        self.n_private += n_blocks
        req.held_private_blocks += n_blocks
        return True

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

    def register(self, req: Request, h: int) -> None:
        """A private block of `req` became full with content `h`: make it a cacheable block."""
        if not self.enable_caching:
            return
        self.n_private -= 1
        req.held_private_blocks -= 1
        existing = self._oldest(h)
        if existing is None:
            key: Key = h
            if self.record_events:
                self.pending_events.append((STORED, h))
        else:
            # the same content computed twice: this request keeps its own copy
            self._serial += 1
            key = (h, self._serial)
            keys = self.copies.get(h)
            if keys is None:
                self.copies[h] = [existing, key]
            else:
                keys.append(key)
        self.refcount[key] = 1
        req.held_hashes.append(key)

    def register_many(self, req: Request, hashes: list[int]) -> None:
        """`register` for consecutive blocks of `req` that became full together."""
        if not self.enable_caching:
            return
        refcount = self.refcount
        inactive = self.inactive
        copies = self.copies
        # the usual case, content nobody holds or caches: one dict entry each, in one loop
        n_fresh = 0
        for h in hashes:
            if h in refcount or h in inactive or h in copies:
                break
            refcount[h] = 1
            n_fresh += 1
        fresh = hashes if n_fresh == len(hashes) else hashes[:n_fresh]
        req.held_hashes.extend(fresh)
        if self.record_events:
            self.pending_events.extend([(STORED, h) for h in fresh])
        self.n_private -= n_fresh
        req.held_private_blocks -= n_fresh
        for h in hashes[n_fresh:]:
            self.register(req, h)  # from the first known content on, block by block

    def release(self, req: Request) -> None:
        """`req` lets go of everything it holds; cached blocks join the LRU last block first."""
        refcount = self.refcount
        inactive = self.inactive
        pinned = self.pinned
        if pinned:
            for key in reversed(req.held_hashes):
                c = refcount[key]
                if c == 1:
                    del refcount[key]
                    inactive[key] = None
                    if key in pinned:
                        self.n_pinned_inactive += 1
                else:
                    refcount[key] = c - 1
        else:
            for key in reversed(req.held_hashes):
                c = refcount[key]
                if c == 1:
                    del refcount[key]
                    inactive[key] = None
                else:
                    refcount[key] = c - 1
        req.held_hashes = []
        self.n_private -= req.held_private_blocks
        req.held_private_blocks = 0
        self.generation += 1

    def pin(self, keys: list[Key]) -> None:
        """A copy out of this pool reads blocks (active ones, by key): released, they keep
        their place in the LRU but are not evicted until `unpin`."""
        count_in(self.pinned, keys)

    def unpin(self, keys: list[Key]) -> None:
        """A copy out of this pool landed: blocks nobody holds become evictable."""
        inactive = self.inactive
        for key in count_out(self.pinned, keys):
            if key in inactive:
                self.n_pinned_inactive -= 1
        self.generation += 1

    def take_events(self) -> list[tuple[str, int]]:
        events = self.pending_events
        self.pending_events = []
        return events
