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

How it is kept (a block's whole life is a few dict operations, most blocks are never looked up
again): one dict maps every resident block to its holder count when active, or, when inactive,
to the negated id of the *release* that made it so. A release appends its blocks, suffix first,
as one run; the LRU order is the runs in release order. Eviction takes blocks off the oldest run
without searching. A run keeps the range of its keys still to consider: blocks another request
still held at the release (a shared prefix: the run's tail) are left out of it, and a block
acquired back from the end of that range shortens it. A run whose range holds only its own
inactive blocks is evicted as a slice; one with blocks acquired from its middle ("stale") block by
block, skipping keys whose entry no longer names the run. Runs full of such stale entries are
compacted once they outnumber the inactive blocks.

If two requests compute the same content without seeing each other (both were admitted before
either registered it), each keeps its own physical copy: both count as active, each is cached
and evicted on its own, and lookups use the oldest copy. The first copy is keyed by the content
hash itself, later copies by `(hash, serial)`.

KV events (`stored` on a new registration, `removed` when the last copy of a content is evicted)
are buffered until the worker publishes them at pass end.
"""

from __future__ import annotations

from servesim.kv.pool_base import REMOVED, STORED, Key, PoolBase, count_in, count_out
from servesim.workload.request import Request

# runs are compacted when their entries exceed twice the inactive blocks plus this many
COMPACT_SLACK = 4096


class BlockPool(PoolBase):
    __slots__ = ("blocks",)

    def __init__(
        self, capacity_blocks: int, enable_caching: bool = True, record_events: bool = False
    ) -> None:
        super().__init__(capacity_blocks, enable_caching, record_events)
        # resident cached blocks: key -> holders (>= 1) while active, -(run id) while inactive
        self.blocks: dict[Key, int] = {}

    # ------------------------------------------------------------------ levels

    @property
    def n_active(self) -> int:
        """Blocks in use: held by a request, or read by a copy out of this pool (those count
        as used although an allocation may evict them, its reuse then waiting for the copy)."""
        return len(self.blocks) - self.n_inactive + self.n_private + self.n_pinned_inactive

    @property
    def n_cached(self) -> int:
        """Cached blocks nobody holds and no copy reads."""
        return self.n_inactive - self.n_pinned_inactive

    @property
    def n_empty(self) -> int:
        """Blocks holding nothing (taken before any cached block is evicted)."""
        return self.capacity_blocks - len(self.blocks) - self.n_private

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request (empty or evictable, pinned ones included)."""
        return self.capacity_blocks - len(self.blocks) + self.n_inactive - self.n_private

    @property
    def refcount(self) -> dict[Key, int]:
        """Active cached blocks and their holders (a new dict: for inspection)."""
        return {key: c for key, c in self.blocks.items() if c > 0}

    @property
    def inactive(self) -> list[Key]:
        """Inactive blocks, oldest (next to be evicted) first (a new list: for inspection)."""
        return self._lru_order()

    def _lru_order(self) -> list[Key]:
        blocks = self.blocks
        order = []
        for run_id in range(self._front_run, self._next_run):
            run = self.runs.get(run_id)
            if run is not None:
                tag = -run_id
                order.extend([k for k in run[0][run[1] : run[2]] if blocks.get(k) == tag])
        return order

    # ------------------------------------------------------------------ prefix lookups

    def _oldest(self, h: int) -> Key | None:
        """The copy of content `h` that lookups use, or None if `h` is not resident."""
        if h in self.blocks:
            return h
        keys = self.copies.get(h)
        return keys[0] if keys else None

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """Leading blocks of `hashes` resident (active or inactive), and how many of them are
        active (take no free block to reuse)."""
        if not self.enable_caching:
            return 0, 0
        blocks = self.blocks
        n = n_active = 0
        for h in hashes:
            c = blocks.get(h)
            if c is None:
                key = self._oldest(h)
                if key is None:
                    break
                if blocks[key] > 0:
                    n_active += 1
            elif c > 0:
                n_active += 1
            n += 1
        return n, n_active

    def acquire(self, req: Request, hashes: list[int]) -> None:
        """Grant `req` the resident blocks `hashes` (a prefix hit): share or reactivate them."""
        blocks = self.blocks
        held = req.held_hashes
        for h in hashes:
            c = blocks.get(h)
            key: Key = h
            if c is None:
                key = self._oldest(h)
                assert key is not None, f"block {h} was not resident"
                c = blocks[key]
            if c < 0:
                # back to life: the end of its run's range, or a hole in it (stale)
                run = self.runs[-c]
                end = run[2] - 1
                if end >= run[1] and run[0][end] == key:
                    run[2] = end
                else:
                    run[3] = True
                self.n_inactive -= 1
                if key in self.pinned:
                    self.n_pinned_inactive -= 1
                blocks[key] = 1
            else:
                blocks[key] = c + 1
            held.append(key)

    # ------------------------------------------------------------------ allocation

    def _evict(self, n: int) -> None:
        """Evict the n least recently released blocks (there are n); pinned ones go to
        `fenced`."""
        blocks = self.blocks
        runs = self.runs
        events = self.pending_events if self.record_events else None
        # evicted keys are needed for their copies' bookkeeping and `removed` events only
        victims: list[Key] | None = [] if (self.copies or events is not None) else None
        pinned = self.pinned if self.n_pinned_inactive else None
        left = n
        run_id = self._front_run
        while left:
            run = runs.get(run_id)
            if run is None:  # pragma: no cover - the caller checked there are n to evict
                raise RuntimeError(f"{left} blocks left to evict and no inactive block")
            keys, pos, end, stale = run
            if not stale and pinned is None:
                stop = min(end, pos + left)
                taken = keys[pos:stop]
                for key in taken:
                    del blocks[key]
                if victims is not None:
                    victims.extend(taken)
                left -= stop - pos
                pos = stop
            else:
                tag = -run_id
                while pos < end and left:
                    key = keys[pos]
                    pos += 1
                    if blocks.get(key) != tag:
                        continue  # came back to life since this run
                    if pinned is not None and key in pinned:
                        self.n_pinned_inactive -= 1
                        self.fenced.append(key)
                        self.fenced_ranks.append(n - left)
                    del blocks[key]
                    left -= 1
                    if victims is not None:
                        victims.append(key)
            run[1] = pos
            if pos < end:
                break  # (left is 0)
            del runs[run_id]
            self._run_entries -= len(keys)
            self._front_run = run_id + 1
            run_id += 1
        self.n_inactive -= n
        self.n_evictions += n
        if victims is not None:
            if self.copies:
                for key in victims:
                    self._evicted(key, events)
            elif events is not None:  # no duplicate copies: every key is its content hash
                events.extend([(REMOVED, key) for key in victims])

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
        self.blocks[key] = 1
        req.held_hashes.append(key)

    def register_many(self, req: Request, hashes: list[int]) -> None:
        """`register` for consecutive blocks of `req` that became full together."""
        if not self.enable_caching:
            return
        blocks = self.blocks
        copies = self.copies
        # the usual case, content nobody holds or caches: one dict entry each, in one loop
        # (a content with copies is resident too, so with no copies `blocks` is all to ask)
        n_fresh = 0
        for h in hashes:
            if h in blocks or (copies and h in copies):
                break
            blocks[h] = 1
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
        held = req.held_hashes
        if held:
            blocks = self.blocks
            run_id = self._next_run
            tag = -run_id
            keys = held[::-1]  # eviction order: suffix first
            # the blocks only this request held come first (a shared prefix is the tail)
            for key in keys:
                c = blocks[key]
                if c != 1:
                    break
                blocks[key] = tag
            else:
                key = None
            end = n_freed = len(keys) if key is None else keys.index(key)
            mixed = False  # blocks freed past a kept one: the run's range holds kept keys
            if key is not None:
                for key in keys[end:]:
                    c = blocks[key]
                    if c == 1:  # (a holder count that grows again past a shared block)
                        blocks[key] = tag
                        n_freed += 1
                        mixed = True
                    else:
                        blocks[key] = c - 1
                if mixed:
                    end = len(keys)
            if n_freed:
                self._next_run = run_id + 1
                self.runs[run_id] = [keys, 0, end, mixed]
                self._run_entries += len(keys)
                self.n_inactive += n_freed
                pinned = self.pinned
                if pinned:
                    self.n_pinned_inactive += sum(
                        1 for key in keys if key in pinned and blocks[key] == tag
                    )
                if self._run_entries > 2 * self.n_inactive + COMPACT_SLACK:
                    self._compact()
            req.held_hashes = []
        self.n_private -= req.held_private_blocks
        req.held_private_blocks = 0
        self.generation += 1

    def _compact(self) -> None:
        """One run of every inactive block, in LRU order, in place of runs of stale entries."""
        order = self._lru_order()
        run_id = self._next_run
        self._next_run = run_id + 1
        self.blocks.update(dict.fromkeys(order, -run_id))
        self.runs = {run_id: [order, 0, len(order), False]}
        self._front_run = run_id
        self._run_entries = len(order)

    def pin(self, keys: list[Key]) -> None:
        """A copy out of this pool reads blocks (active ones, by key): released, they keep
        their place in the LRU; evicting one before `unpin` fences its reuse (`fenced`)."""
        count_in(self.pinned, keys)

    def unpin(self, keys: list[Key]) -> None:
        """A copy out of this pool landed: blocks nobody holds are plain cached blocks again."""
        blocks = self.blocks
        for key in count_out(self.pinned, keys):
            c = blocks.get(key)
            if c is not None and c < 0:
                self.n_pinned_inactive -= 1
        self.generation += 1
