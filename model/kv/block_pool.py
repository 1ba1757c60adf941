"""The G1 (GPU HBM) KV block pool of one scheduler rank, with prefix caching.

A pool holds `capacity_blocks` blocks. A block is *active* while at least one request holds it
and *inactive* (cached, evictable) after the last holder lets go; only full blocks carry a
content hash and can be shared or cached, a partly filled block is private to its request.
Ownership is recorded at grant time: every call that hands blocks to a request writes them into
that request's `held_hashes` / `held_private_blocks` before returning, so a preemption that
lands between two calls can always give back exactly what the request holds.

Eviction takes the least recently released inactive block; blocks released together are queued
deepest first, so a request's suffix blocks are evicted before the prefix it shares with others.
KV events (`stored` on a new registration, `removed` on eviction) are buffered until the worker
publishes them at pass end.
"""

from __future__ import annotations

from collections import OrderedDict

from model.workload.request import Request

STORED = "stored"
REMOVED = "removed"


class BlockPool:
    __slots__ = (
        "capacity_blocks",
        "enable_caching",
        "refcount",
        "inactive",
        "n_private",
        "record_events",
        "pending_events",
        "n_evictions",
    )

    def __init__(
        self, capacity_blocks: int, enable_caching: bool = True, record_events: bool = False
    ) -> None:
        self.capacity_blocks = capacity_blocks
        self.enable_caching = enable_caching
        self.refcount: dict[int, int] = {}  # active full blocks: hash -> holders
        self.inactive: OrderedDict[int, None] = OrderedDict()  # eviction order, oldest first
        self.n_private = 0  # active blocks without a hash (partial, or caching off)
        self.record_events = record_events
        self.pending_events: list[tuple[str, int]] = []
        self.n_evictions = 0

    # ------------------------------------------------------------------ levels

    @property
    def n_active(self) -> int:
        return len(self.refcount) + self.n_private

    @property
    def n_cached(self) -> int:
        return len(self.inactive)

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request (empty or evictable)."""
        return self.capacity_blocks - len(self.refcount) - self.n_private

    # ------------------------------------------------------------------ prefix lookups

    def match(self, hashes: list[int], max_blocks: int) -> tuple[int, int]:
        """Leading blocks of `hashes` resident (active or inactive), and how many are active."""
        if not self.enable_caching:
            return 0, 0
        refcount = self.refcount
        inactive = self.inactive
        n = n_active = 0
        for h in hashes[:max_blocks]:
            if h in refcount:
                n_active += 1
            elif h not in inactive:
                break
            n += 1
        return n, n_active

    def acquire(self, req: Request, hashes: list[int]) -> None:
        """Grant `req` the resident blocks `hashes` (a prefix hit): share or reactivate them."""
        refcount = self.refcount
        inactive = self.inactive
        held = req.held_hashes
        for h in hashes:
            c = refcount.get(h)
            if c is None:
                del inactive[h]
                refcount[h] = 1
            else:
                refcount[h] = c + 1
            held.append(h)

    # ------------------------------------------------------------------ allocation

    def allocate(self, req: Request, n_blocks: int) -> bool:
        """Grant `req` n fresh private blocks, evicting cached ones; False if they do not fit."""
        if n_blocks <= 0:
            return True
        if n_blocks > self.free_blocks:
            return False
        empty = self.capacity_blocks - len(self.refcount) - self.n_private - len(self.inactive)
        for _ in range(n_blocks - empty):
            h, _ = self.inactive.popitem(last=False)
            self.n_evictions += 1
            if self.record_events:
                self.pending_events.append((REMOVED, h))
        self.n_private += n_blocks
        req.held_private_blocks += n_blocks
        return True

    def register(self, req: Request, h: int) -> None:
        """A private block of `req` became full with content `h`: make it a cacheable block."""
        if not self.enable_caching:
            return
        refcount = self.refcount
        self.n_private -= 1
        req.held_private_blocks -= 1
        c = refcount.get(h)
        if c is not None:
            # identical content computed twice: share the resident copy, free the duplicate
            refcount[h] = c + 1
        elif h in self.inactive:
            del self.inactive[h]
            refcount[h] = 1
        else:
            refcount[h] = 1
            if self.record_events:
                self.pending_events.append((STORED, h))
        req.held_hashes.append(h)

    def release(self, req: Request) -> None:
        """`req` lets go of everything it holds; full blocks stay cached, deepest first in line."""
        refcount = self.refcount
        inactive = self.inactive
        for h in reversed(req.held_hashes):
            c = refcount[h]
            if c == 1:
                del refcount[h]
                inactive[h] = None
            else:
                refcount[h] = c - 1
        req.held_hashes = []
        self.n_private -= req.held_private_blocks
        req.held_private_blocks = 0

    def take_events(self) -> list[tuple[str, int]]:
        events = self.pending_events
        self.pending_events = []
        return events
