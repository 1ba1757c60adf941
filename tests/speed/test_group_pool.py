"""The G1 pool kept by trace-block group against the per-block reference: same LRU, same answers.

`GroupPool` keeps the blocks of a trace block as one entry while they are alike and per block
once they diverge. Random admissions (match, acquire, allocate), prefills in chunks that start
and end anywhere inside a group, releases and generated (ungrouped) blocks, on packed prompt ids
that share whole and partial groups and content computed twice, must give the reference's
match results, levels, LRU order, evictions, KV events and holdings after every step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.kv.block_pool import BlockPool
from servesim.speed import group_pool
from servesim.speed.group_pool import GroupPool
from servesim.speed.pool_choice import choose_pool
from servesim.workload.hashing import BlockHasher
from tests.property.test_block_pool_lru import (
    Reference,
    compact_slack,
    follow_reference,
    random_ops,
)

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
        ([12, 13], PER * BS + 2 * BS, 6),  # a longer run of generated blocks
    ]
    out = []
    for k, (ids, n_tokens, generated) in enumerate(trace):
        hashes = hasher.prompt_hashes(ids, n_tokens, PER * BS)
        out.append(hashes + [BlockHasher.unique_block(k, j) for j in range(generated)])
    # prefixes that end inside a run of generated blocks: a later turn takes back part of a
    # run of single keys released together
    out.append(out[2][:-1])
    out.append(out[9][:-3])
    return out


PROMPTS = _prompts()
SLOTS = st.integers(0, 7)
op = st.one_of(
    st.tuples(st.just("admit"), SLOTS, st.integers(0, len(PROMPTS) - 1)),
    st.tuples(st.just("compute"), SLOTS, st.integers(1, 2 * PER + 1)),
    st.tuples(st.just("compute"), SLOTS, st.integers(1, 3)),
    st.tuples(st.just("release"), SLOTS, st.just(0)),
)


@contextmanager
def singles_at_once(n: int) -> Iterator[None]:
    """Runs of generated (single) keys from `n` long handled by whole-list operations."""
    kept = group_pool.SINGLES_AT_ONCE
    group_pool.SINGLES_AT_ONCE = n
    try:
        yield
    finally:
        group_pool.SINGLES_AT_ONCE = kept


# 1 and 2: the whole-list paths for generated keys on these short prompts; 16: key by key
AT_ONCE = st.sampled_from([1, 2, 16])


@settings(max_examples=400, deadline=None)
@given(
    capacity=st.integers(4, 40),
    record_events=st.booleans(),
    slack=st.sampled_from([0, 3, 4096]),
    at_once=AT_ONCE,
    ops=st.lists(op, min_size=10, max_size=150),
)
def test_group_pool_follows_the_per_block_lru(capacity, record_events, slack, at_once, ops):
    with compact_slack(slack), singles_at_once(at_once):
        pool = GroupPool(capacity, PER, record_events=record_events)
        follow_reference(pool, Reference(capacity, record_events), PROMPTS, ops)


KINDS = ("admit", "admit", "compute", "compute", "release", "release")


@pytest.mark.parametrize("seed", range(12))
def test_group_pool_follows_the_per_block_lru_on_long_random_runs(seed):
    rng = np.random.default_rng(seed)
    at_once = singles_at_once(int(rng.choice([1, 2, 16])))
    with compact_slack(int(rng.choice([0, 8, 4096]))), at_once:
        for _ in range(25):
            ops = random_ops(rng, KINDS, len(PROMPTS), 2 * PER + 2)
            capacity, record_events = int(rng.integers(4, 41)), bool(rng.integers(0, 2))
            pool = GroupPool(capacity, PER, record_events=record_events)
            follow_reference(pool, Reference(capacity, record_events), PROMPTS, ops)


def test_choose_pool():
    assert isinstance(choose_pool(8, True, False, 8), GroupPool)
    assert isinstance(choose_pool(8, True, False, 1), BlockPool)
    assert isinstance(choose_pool(8, True, False, 6), BlockPool)  # ids span 8 values a group
    assert isinstance(choose_pool(8, False, False, 8), BlockPool)
