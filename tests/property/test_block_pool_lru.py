"""The G1 block pool against a plain per-block reference: same LRU, same answers.

`BlockPool` keeps inactive blocks as runs (one per release) so that a block's life costs a few
dict operations (see its module docstring). This pins it to the rules stated directly, block by
block, in `Reference` (an OrderedDict in release order): random sequences of admissions (match,
acquire, allocate), prefills (register), releases, pins and unpins of tier copies, on prompts
that share prefixes and content computed twice, must give the same match results, levels, LRU
order, evictions, KV events and per-request holdings after every step; pinned blocks are
evicted in LRU order like the others and reported as fenced.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import servesim.kv.block_pool as block_pool
from servesim.kv.block_pool import REMOVED, STORED, BlockPool
from servesim.workload.request import Request


class Reference:
    """Per-block LRU with prefix caching, duplicate copies and pins, as the rules say it."""

    def __init__(self, capacity: int, record_events: bool) -> None:
        self.capacity = capacity
        self.refcount: dict[Any, int] = {}
        self.inactive: OrderedDict[Any, None] = OrderedDict()  # oldest first
        self.copies: dict[int, list[Any]] = {}
        self.n_private = 0
        self.pinned: dict[Any, int] = {}
        self.record_events = record_events
        self.events: list[tuple[str, int]] = []
        self.n_evictions = 0
        self.serial = 0
        self.fenced: list[Any] = []

    def n_pinned_inactive(self) -> int:
        return sum(1 for k in self.inactive if k in self.pinned)

    def free_blocks(self) -> int:
        return self.capacity - len(self.refcount) - self.n_private

    def oldest(self, h: int) -> Any:
        if h in self.refcount or h in self.inactive:
            return h
        keys = self.copies.get(h)
        return keys[0] if keys else None

    def match(self, hashes: list[int]) -> tuple[int, int]:
        n = n_active = 0
        for h in hashes:
            key = self.oldest(h)
            if key is None:
                break
            n += 1
            n_active += key in self.refcount
        return n, n_active

    def acquire(self, req: Request, hashes: list[int]) -> None:
        for h in hashes:
            key = self.oldest(h)
            if key in self.inactive:
                del self.inactive[key]
            self.refcount[key] = self.refcount.get(key, 0) + 1
            req.held_hashes.append(key)

    def allocate(self, req: Request, n: int) -> bool:
        if n <= 0:
            return True
        if n > self.free_blocks():
            return False
        empty = self.capacity - len(self.refcount) - self.n_private - len(self.inactive)
        victims = list(self.inactive)[: max(0, n - empty)]
        for key in victims:
            if key in self.pinned:
                self.fenced.append(key)
            del self.inactive[key]
            self.n_evictions += 1
            h = key[0] if isinstance(key, tuple) else key
            keys = self.copies.get(h)
            if keys is not None:
                keys.remove(key)
                if keys:
                    continue
                del self.copies[h]
            if self.record_events:
                self.events.append((REMOVED, h))
        self.n_private += n
        req.held_private_blocks += n
        return True

    def register(self, req: Request, h: int) -> None:
        self.n_private -= 1
        req.held_private_blocks -= 1
        existing = self.oldest(h)
        key: Any = h
        if existing is None:
            if self.record_events:
                self.events.append((STORED, h))
        else:
            self.serial += 1
            key = (h, self.serial)
            self.copies.setdefault(h, [existing]).append(key)
        self.refcount[key] = 1
        req.held_hashes.append(key)

    def release(self, req: Request) -> None:
        for key in reversed(req.held_hashes):
            self.refcount[key] -= 1
            if self.refcount[key] == 0:
                del self.refcount[key]
                self.inactive[key] = None
        req.held_hashes = []
        self.n_private -= req.held_private_blocks
        req.held_private_blocks = 0

    def pin(self, keys: list[Any]) -> None:
        for key in keys:
            self.pinned[key] = self.pinned.get(key, 0) + 1

    def unpin(self, keys: list[Any]) -> None:
        for key in keys:
            self.pinned[key] -= 1
            if self.pinned[key] == 0:
                del self.pinned[key]


# prompts of 2-9 blocks over a small tree of contents: shared prefixes, and contents two
# requests can compute at once (duplicates)
PROMPTS = [
    [1, 2, 3, 4, 5, 6],
    [1, 2, 3, 7, 8],
    [1, 2, 9, 10, 11, 12, 13, 14, 15],
    [20, 21],
    [1, 2, 3, 4, 5, 6, 30, 31],
    [20, 21, 22, 23, 24],
    [40, 41, 42, 43, 44, 45, 46],
    [1, 50, 51],
    [40, 41, 60, 61, 62, 63, 64, 65],
]
SLOTS = st.integers(0, 7)

op = st.one_of(
    st.tuples(st.just("admit"), SLOTS, st.integers(0, len(PROMPTS) - 1)),
    st.tuples(st.just("admit"), SLOTS, st.integers(0, len(PROMPTS) - 1)),
    st.tuples(st.just("admit"), SLOTS, st.integers(0, len(PROMPTS) - 1)),
    st.tuples(st.just("compute"), SLOTS, st.integers(1, 9)),
    st.tuples(st.just("compute"), SLOTS, st.integers(1, 9)),
    st.tuples(st.just("release"), SLOTS, st.just(0)),
    st.tuples(st.just("release"), SLOTS, st.just(0)),
    st.tuples(st.just("pin"), SLOTS, st.integers(1, 4)),
    st.tuples(st.just("unpin"), SLOTS, st.just(0)),
)


@contextmanager
def compact_slack(slack: int) -> Iterator[None]:
    """Runs compacted at `slack` entries past twice the inactive blocks (0: at almost every
    release) while the block runs."""
    kept = block_pool.COMPACT_SLACK
    block_pool.COMPACT_SLACK = slack
    try:
        yield
    finally:
        block_pool.COMPACT_SLACK = kept


def follow_reference(
    pool: Any, ref: Reference, prompts: list[list[Any]], ops: list[tuple[str, int, int]]
) -> None:
    """Apply `ops` to `pool` and to the reference alike, comparing answers, levels, LRU order,
    evictions, events and holdings after every step. A compute of one block registers it
    alone (`register`), of more at once (`register_many`, which may get a single block, or
    none, at the prompt's end)."""
    # per request slot: (pool's request, reference's request, prompt, registered blocks)
    slots: dict[int, list[Any]] = {}
    pins: dict[int, list[Any]] = {}  # pin slot -> keys pinned (same keys on both sides)
    for kind, slot, arg in ops:
        if kind == "admit" and slot not in slots:  # (it may evict pinned blocks: fenced)
            prompt = prompts[arg]
            a, b = Request(slot, f"a{slot}", 1, 1, prompt), Request(slot, f"b{slot}", 1, 1, prompt)
            hit = pool.match(prompt)
            assert hit == ref.match(prompt)
            free = pool.free_blocks
            assert free == ref.free_blocks()
            if free < len(prompt) - hit[1]:
                continue  # the scheduler's admission check
            pool.acquire(a, prompt[: hit[0]])
            ref.acquire(b, prompt[: hit[0]])
            need = len(prompt) - hit[0]
            assert pool.allocate(a, need) == ref.allocate(b, need) is True
            slots[slot] = [a, b, prompt, hit[0]]
        elif kind == "compute" and slot in slots:
            a, b, prompt, done = slots[slot]
            new = prompt[done : done + arg]
            if arg == 1 and new:
                pool.register(a, new[0])
            else:
                pool.register_many(a, new)
            for h in new:
                ref.register(b, h)
            slots[slot][3] = done + len(new)
        elif kind == "release" and slot in slots:
            a, b, _, _ = slots.pop(slot)
            pool.release(a)
            ref.release(b)
        elif kind == "pin" and slot in slots and slot not in pins:
            keys = slots[slot][0].held_hashes[:arg]
            assert keys == slots[slot][1].held_hashes[:arg]
            pool.pin(keys)
            ref.pin(keys)
            pins[slot] = keys
        elif kind == "unpin" and slot in pins:
            keys = pins.pop(slot)
            pool.unpin(keys)
            ref.unpin(keys)
        assert pool.inactive == list(ref.inactive)
        assert pool.refcount == ref.refcount
        assert pool.n_private == ref.n_private
        assert pool.n_cached == len(ref.inactive) - ref.n_pinned_inactive()
        assert pool.n_active == len(ref.refcount) + ref.n_private + ref.n_pinned_inactive()
        assert pool.free_blocks == ref.free_blocks()
        assert pool.n_evictions == ref.n_evictions
        assert pool.take_events() == ref.events
        ref.events = []
        assert pool.take_fenced() == ref.fenced
        ref.fenced = []
        for a, b, _, _ in slots.values():
            assert a.held_hashes == b.held_hashes
            assert a.held_private_blocks == b.held_private_blocks


def random_ops(
    rng: np.random.Generator, kinds: tuple[str, ...], n_prompts: int, max_arg: int, n: int = 200
) -> list[tuple[str, int, int]]:
    """`n` seeded operations on 8 slots: a prompt index to admit, else an argument up to
    `max_arg` (blocks to compute, keys to pin)."""
    ops = []
    for _ in range(n):
        kind = str(rng.choice(kinds))
        admit = kind == "admit"
        arg = int(rng.integers(0, n_prompts)) if admit else int(rng.integers(1, max_arg))
        ops.append((kind, int(rng.integers(0, 8)), arg))
    return ops


@settings(max_examples=400, deadline=None)
@given(
    capacity=st.integers(4, 20),
    record_events=st.booleans(),
    slack=st.sampled_from([0, 3, 4096]),
    ops=st.lists(op, min_size=10, max_size=150),
)
def test_pool_follows_the_per_block_lru(capacity, record_events, slack, ops):
    with compact_slack(slack):
        pool = BlockPool(capacity, record_events=record_events)
        follow_reference(pool, Reference(capacity, record_events), PROMPTS, ops)


KINDS = ("admit", "admit", "admit", "compute", "compute", "release", "release", "pin", "unpin")


@pytest.mark.parametrize("seed", range(12))
def test_pool_follows_the_per_block_lru_on_long_random_runs(seed):
    """Long seeded sequences (hypothesis keeps its examples short): many evictions of runs
    that were shortened, made stale, held by pins and compacted."""
    rng = np.random.default_rng(seed)
    with compact_slack(int(rng.choice([0, 8, 4096]))):
        for _ in range(25):
            ops = random_ops(rng, KINDS, len(PROMPTS), 10)
            capacity, record_events = int(rng.integers(4, 21)), bool(rng.integers(0, 2))
            pool = BlockPool(capacity, record_events=record_events)
            follow_reference(pool, Reference(capacity, record_events), PROMPTS, ops)
