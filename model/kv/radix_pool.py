"""SGLang's G1 (GPU HBM) KV pool of one rank: pages in a radix tree, evicted leaf by leaf.

Where vLLM's pool (`BlockPool`) keeps one LRU list of unreferenced blocks, SGLang keeps what it
has computed as a radix tree of pages: every edge of the tree is a run of pages (a stretch of
tokens), a node splits where two cached sequences part, and every node remembers when it was
last *touched* (a request matched through it, or cached pages under it). Pages on the path of a
running request are *locked*; the others are evictable. Eviction takes the least recently
touched unlocked **leaf**, from its end (newest pages first), only as many pages as needed; a
leaf emptied that way leaves the tree, and its parent may become a leaf in turn (ordered by its
own last touch). So a prefix shared by many requests outlives the branches below it, and a
branch that was touched recently outlives one that was not, whatever order their pages were
freed in.

Besides the tree, a request may hold *private* pages: ones allocated but not yet full, or not
yet cached. What a request holds is kept as in `BlockPool`: `req.held_hashes` (its pages in the
tree, in sequence order) and `req.held_private_blocks`; the pool remembers the node that ends
each request's path (its lock).

The scheduler's calls map onto SGLang's radix operations:

- `match` is the read-only prefix match (admission sizing, `lpm` ordering);
- `acquire` matches again at admission, touching the matched nodes (splitting an edge where the
  match ends inside it) and locks the path;
- `register_many` caches the request's newly completed pages under its path (touching the path,
  extending its own leaf in place, sharing content already cached: the request's duplicate page
  is freed) and moves its lock to the new end;
- `release` unlocks the path and frees the private pages (finish and retraction alike).

The Dynamo mocker's `sglang` backend keeps the same tree (its `RadixCache`, with SGLang's LRU
leaf eviction); servesim orders touches with a counter where the mocker reads a clock.
"""

from __future__ import annotations

import heapq
from itertools import count

from servesim.kv.pool_base import REMOVED, STORED, CountedPool, Key
from servesim.workload.request import Request


class Node:
    """One edge of the radix tree: its pages (content keys, in sequence order), its children
    by the first key of their edge, its lock count (running requests whose path goes through
    it) and when it was last touched."""

    __slots__ = ("parent", "children", "keys", "locks", "touched", "serial")

    def __init__(self, parent: Node | None, keys: list[Key], touched: int, serial: int) -> None:
        self.parent = parent
        self.children: dict[Key, Node] = {}
        self.keys = keys
        self.locks = 0
        self.touched = touched
        self.serial = serial  # creation order: breaks ties between leaves touched together


def common_length(edge: list[Key], keys: list[Key], start: int) -> int:
    """How many leading keys of `edge` equal `keys[start:]`."""
    n = 0
    for a, b in zip(edge, keys[start:], strict=False):
        if a != b:
            break
        n += 1
    return n


class RadixPool(CountedPool):
    __slots__ = ("root", "lock_of", "_leaves", "_clock", "_serials")

    def __init__(
        self, capacity_blocks: int, enable_caching: bool = True, record_events: bool = False
    ) -> None:
        super().__init__(capacity_blocks, enable_caching, record_events)
        self._clock = count(1)
        self._serials = count(1)
        self.root = Node(None, [], 0, 0)  # (n_resident counts the pages in the tree)
        self.lock_of: dict[Request, Node] = {}  # the node ending each running request's path
        # evictable leaves, oldest touch first: (touched, serial, node), stale entries skipped
        self._leaves: list[tuple[int, int, Node]] = []

    # ------------------------------------------------------------------ the tree

    def _walk(self, keys: list[Key]) -> tuple[int, int]:
        """Leading keys of `keys` in the tree, and how many of them are on locked paths."""
        node = self.root
        n = n_locked = 0
        while n < len(keys):
            child = node.children.get(keys[n])
            if child is None:
                break
            m = common_length(child.keys, keys, n)
            n += m
            if child.locks:
                n_locked += m
            if m < len(child.keys):
                break
            node = child
        return n, n_locked

    def _is_evictable_leaf(self, node: Node) -> bool:
        return node is not self.root and not node.children and not node.locks

    def _index_leaf(self, node: Node) -> None:
        """(Re)list `node` among the evictable leaves at its current touch."""
        if self._is_evictable_leaf(node):
            heapq.heappush(self._leaves, (node.touched, node.serial, node))

    def _touch(self, node: Node, now: int) -> None:
        node.touched = now
        self._index_leaf(node)  # the entry at its old touch goes stale

    def _split(self, child: Node, at: int) -> Node:
        """Cut `child`'s edge after `at` keys: a new node takes the first `at` (inheriting the
        touch and locks), `child` keeps the rest below it."""
        parent = child.parent
        assert parent is not None
        upper = Node(parent, child.keys[:at], child.touched, next(self._serials))
        upper.locks = child.locks
        parent.children[upper.keys[0]] = upper
        child.keys = child.keys[at:]
        child.parent = upper
        upper.children[child.keys[0]] = child
        return upper

    def _add_child(self, parent: Node, keys: list[Key]) -> Node:
        node = Node(parent, keys, next(self._clock), next(self._serials))
        parent.children[keys[0]] = node
        self.n_resident += len(keys)
        self.n_inactive += len(keys)  # unlocked until the caller locks it
        self._index_leaf(node)
        return node

    def _lock(self, node: Node) -> None:
        """One more running request's path ends at `node`: lock it and its ancestors."""
        while node is not self.root:
            if not node.locks:
                self.n_inactive -= len(node.keys)
            node.locks += 1
            node = node.parent  # type: ignore[assignment]

    def _unlock(self, node: Node) -> None:
        while node is not self.root:
            node.locks -= 1
            if not node.locks:
                self.n_inactive += len(node.keys)
                self._index_leaf(node)
            node = node.parent  # type: ignore[assignment]

    # ------------------------------------------------------------------ prefix lookups

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """Leading pages of `hashes` cached, and how many of them running requests hold."""
        if not self.enable_caching:
            return 0, 0
        return self._walk(hashes)

    def acquire(self, req: Request, hashes: list[int]) -> None:
        """Admission of `req` with the cached prefix `hashes`: match it again, touching every
        node it passes whole (an edge where the match ends inside is split, the upper part
        keeping its touch), and lock the path."""
        assert req not in self.lock_of, f"{req} already holds a path"
        now = next(self._clock)
        node = self.root
        n = 0
        while n < len(hashes):
            child = node.children[hashes[n]]
            m = common_length(child.keys, hashes, n)
            n += m
            if m < len(child.keys):
                node = self._split(child, m)
                break
            node = child
            node.touched = now  # (locked next: no longer an evictable leaf)
        assert n == len(hashes), f"{len(hashes) - n} pages of the prefix are not cached"
        self._lock(node)
        self.lock_of[req] = node
        req.held_hashes.extend(hashes)

    # ------------------------------------------------------------------ allocation

    def _evict(self, n: int) -> None:
        """Free n pages from the least recently touched unlocked leaves, newest pages of a
        leaf first; a leaf left empty leaves the tree (its parent may become a leaf)."""
        events = self.pending_events if self.record_events else None
        leaves = self._leaves
        left = n
        while left:
            touched, _, node = heapq.heappop(leaves)
            if node.touched != touched or not self._is_evictable_leaf(node) or not node.keys:
                continue  # stale: touched again, locked, grown a child or gone
            take = min(left, len(node.keys))
            victims = node.keys[len(node.keys) - take :]
            del node.keys[len(node.keys) - take :]
            left -= take
            if events is not None:
                events.extend([(REMOVED, key) for key in reversed(victims)])
            if node.keys:
                heapq.heappush(leaves, (touched, node.serial, node))
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[victims[0]]
            node.parent = None
            self._index_leaf(parent)
        self.n_resident -= n
        self.n_inactive -= n
        self.n_evictions += n

    def register(self, req: Request, h: int) -> None:
        """`req`'s newest private page became full with content `h`: cache it."""
        self.register_many(req, [h])

    def register_many(self, req: Request, hashes: list[int]) -> None:
        """`req`'s next private pages became full with contents `hashes`: cache them under its
        path, touching the path. The request's own leaf grows in place; content already cached
        there is shared (the request's page is freed); the rest becomes a new branch. Its lock
        moves to the new end of its path."""
        if not self.enable_caching or not hashes:
            return
        start = self.lock_of.get(req, self.root)
        now = next(self._clock)
        node: Node | None = start
        while node is not None and node is not self.root:
            self._touch(node, now)
            node = node.parent
        end = self._insert(start, hashes, now)
        self.n_private -= len(hashes)
        req.held_private_blocks -= len(hashes)
        req.held_hashes.extend(hashes)
        if end is not start:
            self._lock(end)
            if start is not self.root:
                self._unlock(start)
            self.lock_of[req] = end

    def _insert(self, start: Node, hashes: list[int], now: int) -> Node:
        """Cache `hashes` below `start`; returns the node ending them."""
        node = start
        n = 0
        while n < len(hashes):
            own_leaf = node is start and node.locks == 1
            if node is not self.root and not node.children and (not node.locks or own_leaf):
                return self._extend_leaf(node, hashes[n:], now)
            child = node.children.get(hashes[n])
            if child is None:
                return self._add_child(node, self._stored(hashes[n:]))
            m = common_length(child.keys, hashes, n)
            n += m
            self.generation += m  # the request's copies of cached content are freed
            if m < len(child.keys):
                upper = self._split(child, m)
                if n < len(hashes):
                    return self._add_child(upper, self._stored(hashes[n:]))
                return upper
            node = child
            self._touch(node, now)
        return node

    def _extend_leaf(self, node: Node, keys: list[Key], now: int) -> Node:
        node.keys.extend(self._stored(keys))
        self.n_resident += len(keys)
        if not node.locks:
            self.n_inactive += len(keys)
        self._touch(node, now)
        return node

    def _stored(self, keys: list[Key]) -> list[Key]:
        """New content joins the tree: announce it (KV events)."""
        if self.record_events:
            self.pending_events.extend([(STORED, key) for key in keys])
        return list(keys)

    def release(self, req: Request) -> None:
        """`req` lets go: its path is unlocked (its pages stay cached), its private pages are
        freed."""
        node = self.lock_of.pop(req, None)
        if node is not None:
            self._unlock(node)
        req.held_hashes = []
        self.n_private -= req.held_private_blocks
        req.held_private_blocks = 0
        self.generation += 1

    def pin(self, keys: list[Key]) -> None:
        raise NotImplementedError("the radix pool has no copies to a lower tier")

    def unpin(self, keys: list[Key]) -> None:
        raise NotImplementedError("the radix pool has no copies to a lower tier")
