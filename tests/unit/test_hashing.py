"""BlockHasher: trace hash ids -> canonical ids -> synthesised tokens -> parent-chained engine
block ids (spec §1.1 "Token synthesis", loader cases 1, 2, 10, 11)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from servesim.workload import hashing
from servesim.workload.hashing import ROOT, BlockHasher


def tokens(canonical: list[int], input_length: int, trace_block_size: int) -> list[int]:
    """The reference synthesis: canonical id of trace block k repeated trace_block_size times,
    truncated to the prompt length."""
    return [c for c in canonical for _ in range(trace_block_size)][:input_length]


def test_canonical_ids_by_first_appearance():
    """Trace ids are renumbered 0, 1, ... in order of first appearance across the whole run."""
    h = BlockHasher(4)
    assert h.canonical([7, 8]) == [0, 1]
    assert h.canonical([8, 9, 7, 9]) == [1, 2, 0, 2]


def first_appearance(rows: list[list[int]]) -> list[list[int]]:
    """The reference renumbering: each id by the order of its first appearance."""
    seen: dict[int, int] = {}
    return [[seen.setdefault(h, len(seen)) for h in row] for row in rows]


@pytest.mark.parametrize("seed", range(40))
def test_canonical_matches_first_appearance_over_many_rows(seed):
    """Rows that number their ids by first appearance (the fast path), rows that repeat new
    ids, skip ids, restart or go backwards (the table): always the reference renumbering."""
    rng = np.random.default_rng(seed)
    rows, top = [], 0
    for _ in range(30):
        kind = rng.integers(5)
        if kind == 0:  # seen ids, then the next new ones in order
            row = [int(x) for x in rng.integers(0, top + 1, rng.integers(0, 6))]
            n_new = int(rng.integers(0, 5))
            row += list(range(top + 1, top + 1 + n_new))
            top += n_new
        elif kind == 1:  # a new id repeated, or two new ids out of order
            row = [top + 1, top + 1, int(rng.integers(0, top + 1))]
            if rng.integers(2):
                row = [top + 2, top + 1]
            top = max(row)
        else:  # any ids, large ones and gaps included
            row = [int(x) for x in rng.integers(0, top + 10, rng.integers(1, 8))]
            top = max(top, *row)
            if kind == 2:
                row.append(2**40 + int(rng.integers(3)))
        rows.append(row)
    h = BlockHasher(4)
    assert [h.canonical(row) for row in rows] == first_appearance(rows)
    negative = [[0, 1], [-3, 2], [2, 3]]
    h = BlockHasher(4)
    assert [h.canonical(row) for row in negative] == first_appearance(negative)


@pytest.mark.parametrize("seed", range(20))
def test_canonical_keeps_a_numbering_by_first_appearance_row_after_row(seed):
    """A trace numbered by first appearance (Mooncake's) keeps its ids for many rows (seen ids
    in any order, then the next new ones), until a row breaks the pattern (a new id repeated or
    skipped, an old id after a new one, a tuple id): then the table takes over."""
    rng = np.random.default_rng(seed)
    rows: list[list] = []
    top = -1  # the largest id seen
    at = int(rng.integers(20, 40))  # where the row that breaks the pattern comes
    for i in range(40):
        if i == at:
            breaks = [
                [top + 1, top + 1],
                [top + 2],
                [top + 2, top + 1, top + 2],
                [top + 1, 0],
                [(1, top + 1)],
                [top + 1, -1],
                [-1, top + 1],
            ]
            rows.append(breaks[seed % len(breaks)])
            top = max([top] + [x for x in rows[-1] if isinstance(x, int)])
            continue
        row = [int(x) for x in rng.integers(0, top + 1, rng.integers(0, 5))] if top >= 0 else []
        n_new = int(rng.integers(0 if row else 1, 4))
        row += list(range(top + 1, top + 1 + n_new))
        top += n_new
        rows.append(row)
    h = BlockHasher(4)
    assert [h.canonical(row) for row in rows] == first_appearance(rows)
    # (a tuple of ids numbers alike)
    assert BlockHasher(4).canonical((0, 1, 0, 2)) == [0, 1, 0, 2]


def test_ids_above_u32_keep_identity():
    """64-bit ids are not truncated: 2**32 + 1 and 1 are different blocks, equal ids stay equal."""
    h = BlockHasher(4)
    big = 2**32 + 1
    assert h.canonical([big, 1, big, 2**63 - 1, 2**32]) == [0, 1, 0, 2, 3]


def test_spec_example_tokens():
    """hash_ids [1, 2], input_length 6, trace block 4 => tokens [1,1,1,1,2,2] (case 10): with
    engine block 4 there is 1 full block, with engine block 2 there are 3 (case 11), and equal
    block contents at different positions still get different (parent-chained) ids."""
    h = BlockHasher(4)
    assert tokens(h.canonical([1, 2]), 6, 4) == [0, 0, 0, 0, 1, 1]
    assert len(h.prompt_hashes([1, 2], 6, 4)) == 1
    two = BlockHasher(2).prompt_hashes([1, 2], 6, 4)
    assert len(two) == 3
    assert len(set(two)) == 3  # blocks [1,1], [1,1] share content, not prefix


def test_only_full_engine_blocks_hashed():
    """A partial tail block has no hash; a prompt shorter than one block has none at all."""
    h = BlockHasher(64)
    assert len(h.prompt_hashes([1, 2], 1000, 512)) == 15
    assert len(h.prompt_hashes([1, 2], 1024, 512)) == 16
    assert h.prompt_hashes([1], 63, 512) == []


def test_block_ids_stand_for_their_whole_prefix():
    """The same prompt gets the same ids again, a shorter prompt with the same tokens gets a
    prefix of them, a different first block changes every later id; chained ids are
    non-negative and never meet the negative ids of unshared content."""
    h = BlockHasher(4)
    first = h.prompt_hashes([5, 6], 8, 4)
    assert len(set(first)) == 2 and all(x >= 0 for x in first)
    assert h.prompt_hashes([5, 6], 8, 4) == first
    assert h.prompt_hashes([5, 6], 7, 4) == first[:1]
    other = h.prompt_hashes([5, 7], 8, 4)
    assert other[0] == first[0] and other[1] != first[1]
    assert h.prompt_hashes([4, 6], 8, 4)[1] != first[1], "block 2 depends on block 1"
    assert all(h.unique_block(0, j) < 0 for j in range(3))


def test_aligned_blocks_shared_until_trace_ids_differ():
    """Trace block 512, engine block 64: prompts [1, 2] and [1, 3] share the 8 engine blocks of
    the first trace block and nothing after it."""
    h = BlockHasher(64)
    a = h.prompt_hashes([1, 2], 1024, 512)
    b = h.prompt_hashes([1, 3], 1024, 512)
    assert a[:8] == b[:8]
    assert all(x != y for x, y in zip(a[8:], b[8:], strict=True))


def test_non_aligned_blocks_share_exact_token_prefix():
    """Trace block 6, engine block 4: tokens 1x6 2x6 3x6 -> engine blocks [0:4] [4:8] [8:12]
    [12:16]. Changing trace block 1 changes engine block 1 (tokens 4..8 straddle it) and every
    block after it, even block 3 whose own tokens are the same (parent chain)."""
    h = BlockHasher(4)
    a = h.prompt_hashes([1, 2, 3], 18, 6)
    changed_third = h.prompt_hashes([1, 2, 4], 18, 6)
    changed_second = h.prompt_hashes([1, 9, 3], 18, 6)
    assert len(a) == 4
    assert changed_third[:3] == a[:3] and changed_third[3] != a[3]
    assert changed_second[0] == a[0]
    assert all(x != y for x, y in zip(changed_second[1:], a[1:], strict=True))


@pytest.mark.parametrize(
    "trace_bs, engine_bs", [(512, 64), (12, 4), (16, 2), (6, 4), (4, 6), (3, 2), (1, 2), (4, 4)]
)
def test_shared_block_iff_same_token_prefix(trace_bs, engine_bs):
    """For random prompts over a small id alphabet, two prompts share engine block j exactly
    when their synthesised tokens agree up to the end of block j."""
    rng = np.random.default_rng(trace_bs * 100 + engine_bs)
    h = BlockHasher(engine_bs)
    prompts = []
    for _ in range(30):
        n_blocks = int(rng.integers(1, 5))
        ids = [int(x) for x in rng.integers(0, 3, size=n_blocks)]
        length = int(rng.integers(1, n_blocks * trace_bs + 1))
        hashes = h.prompt_hashes(ids, length, trace_bs)
        toks = tokens(h.canonical(ids), length, trace_bs)
        assert len(hashes) == length // engine_bs
        assert all(0 <= x < 2**63 for x in hashes)  # int64 block ids (KV events, tables)
        prompts.append((hashes, toks))
    outcomes = set()
    for (ha, ta), (hb, tb) in itertools.combinations(prompts, 2):
        for j in range(min(len(ha), len(hb))):
            end = (j + 1) * engine_bs
            same = ta[:end] == tb[:end]
            assert (ha[j] == hb[j]) == same
            outcomes.add(same)
    assert outcomes == {True, False}  # the sample exercised both directions


def test_unique_blocks_never_collide():
    """Unshared blocks are distinct from each other, from ROOT and from every prompt block id,
    and the same id comes back for the same (request, block)."""
    h = BlockHasher(4)
    prompt = h.prompt_hashes([1, 2, 3], 12, 4)
    u1 = [h.unique_block(0, j) for j in range(3)]
    u2 = [h.unique_block(1, j) for j in range(2)]
    prompt2 = h.prompt_hashes([4, 5], 8, 4)
    every = prompt + u1 + u2 + prompt2
    assert len(set(every)) == len(every) == 10
    assert ROOT not in every
    assert h.unique_block(1, 1) == u2[1]


@pytest.mark.parametrize("block_size,trace_block_size", [(64, 512), (16, 16), (4, 8), (3, 12)])
def test_long_prompts_get_the_same_ids_in_bulk(monkeypatch, block_size, trace_block_size):
    """Prompts of NUMPY_MIN_BLOCKS or more engine blocks get their ids from numpy: the same
    Python ints the block-by-block loop makes, whatever the prompt's length."""
    ids = list(range(400))
    lengths = [1, 47 * block_size, 48 * block_size + 1, 49 * block_size - 1, 3000, 70_000]
    lengths = [n for n in lengths if n <= len(ids) * trace_block_size]
    bulk = [BlockHasher(block_size).prompt_hashes(ids, n, trace_block_size) for n in lengths]
    monkeypatch.setattr(hashing, "NUMPY_MIN_BLOCKS", 1 << 62)
    loop = [BlockHasher(block_size).prompt_hashes(ids, n, trace_block_size) for n in lengths]
    assert bulk == loop
    assert all(type(h) is int for hs in bulk for h in hs)
    assert [len(hs) for hs in bulk] == [n // block_size for n in lengths]
