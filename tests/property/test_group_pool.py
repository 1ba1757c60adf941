"""The G1 pool kept by trace-block group against the per-block reference: same LRU, same answers.

`GroupPool` keeps the blocks of a trace block as one entry while they are alike and per block
once they diverge. Random admissions (match, acquire, allocate), prefills in chunks that start
and end anywhere inside a group, releases and generated (ungrouped) blocks, on packed prompt ids
that share whole and partial groups and content computed twice, must give the reference's
match results, levels, LRU order, evictions, KV events and holdings after every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import model.kv.block_pool as block_pool
from model.kv.block_pool import BlockPool
from model.kv.group_pool import GroupPool, choose_pool
from model.workload.hashing import BlockHasher
from model.workload.request import Request
from tests.property.test_block_pool_lru import Reference

PER = 4  # engine blocks per trace block
BS = 16


def _prompts() -> list[list[int]]:
    hasher = BlockHasher(BS)
    trace = [  # (trace hash ids, input tokens, generated blocks)
        ([0, 1, 2], 3 * PER * BS, 0),
        ([0, 1, 3], 3 * PER * BS - 2 * BS, 0),  # ends inside its last group
        ([0, 1, 2, 4], 4 * PER * BS - BS, 2),
        ([0, 5], 2 * PER * BS, 1),
        ([6, 7], PER * BS + 3 * BS + 5, 0),
        ([0, 1, 2], 2 * PER * BS + BS, 0),  # a prefix of the first, to inside a group
        ([6], 2 * BS, 2),
        ([8, 9, 10], 3 * PER * BS, 0),
        ([0, 1, 2, 11], 4 * PER * BS, 0),
    ]
    out = []
    for k, (ids, n_tokens, generated) in enumerate(trace):
        hashes = hasher.prompt_hashes(ids, n_tokens, PER * BS)
        out.append(hashes + [BlockHasher.unique_block(k, j) for j in range(generated)])
    return out


PROMPTS = _prompts()
SLOTS = st.integers(0, 7)
op = st.one_of(
    st.tuples(st.just("admit"), SLOTS, st.integers(0, len(PROMPTS) - 1)),
    st.tuples(st.just("compute"), SLOTS, st.integers(1, 2 * PER + 1)),
    st.tuples(st.just("compute"), SLOTS, st.integers(1, 3)),
    st.tuples(st.just("release"), SLOTS, st.just(0)),
)


def run_ops(capacity: int, record_events: bool, ops: list[tuple[str, int, int]]) -> None:
    pool = GroupPool(capacity, PER, record_events=record_events)
    ref = Reference(capacity, record_events)
    slots: dict[int, list[Any]] = {}  # slot -> [pool's request, reference's, prompt, registered]
    for kind, slot, arg in ops:
        if kind == "admit" and slot not in slots:
            prompt = PROMPTS[arg]
            a, b = Request(slot, f"a{slot}", 1, 1, prompt), Request(slot, f"b{slot}", 1, 1, prompt)
            hit = pool.match(prompt)
            assert hit == ref.match(prompt)
            if pool.free_blocks < len(prompt) - hit[1]:
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
        assert pool.inactive == list(ref.inactive)
        assert pool.refcount == ref.refcount
        assert pool.n_private == ref.n_private
        assert pool.n_cached == len(ref.inactive)
        assert pool.free_blocks == ref.free_blocks()
        assert pool.n_active == len(ref.refcount) + ref.n_private
        assert pool.n_evictions == ref.n_evictions
        assert pool.take_events() == ref.events
        ref.events = []
        for a, b, _, _ in slots.values():
            assert a.held_hashes == b.held_hashes
            assert a.held_private_blocks == b.held_private_blocks


@settings(max_examples=400, deadline=None)
@given(
    capacity=st.integers(4, 40),
    record_events=st.booleans(),
    slack=st.sampled_from([0, 3, 4096]),
    ops=st.lists(op, min_size=10, max_size=150),
)
def test_group_pool_follows_the_per_block_lru(capacity, record_events, slack, ops):
    kept = block_pool.COMPACT_SLACK
    block_pool.COMPACT_SLACK = slack  # 0: compact the runs at almost every release
    try:
        run_ops(capacity, record_events, ops)
    finally:
        block_pool.COMPACT_SLACK = kept


KINDS = ("admit", "admit", "compute", "compute", "release", "release")


@pytest.mark.parametrize("seed", range(12))
def test_group_pool_follows_the_per_block_lru_on_long_random_runs(seed):
    rng = np.random.default_rng(seed)
    kept = block_pool.COMPACT_SLACK
    block_pool.COMPACT_SLACK = int(rng.choice([0, 8, 4096]))
    try:
        for _ in range(25):
            ops = []
            for _ in range(200):
                kind = str(rng.choice(KINDS))
                arg = (
                    int(rng.integers(0, len(PROMPTS)))
                    if kind == "admit"
                    else int(rng.integers(1, 2 * PER + 2))
                )
                ops.append((kind, int(rng.integers(0, 8)), arg))
            run_ops(int(rng.integers(4, 41)), bool(rng.integers(0, 2)), ops)
    finally:
        block_pool.COMPACT_SLACK = kept


def test_choose_pool():
    assert isinstance(choose_pool(8, True, False, 8), GroupPool)
    assert isinstance(choose_pool(8, True, False, 1), BlockPool)
    assert isinstance(choose_pool(8, True, False, 6), BlockPool)  # ids span 8 values a group
    assert isinstance(choose_pool(8, False, False, 8), BlockPool)
