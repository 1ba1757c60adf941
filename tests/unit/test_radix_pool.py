"""SGLang's radix pool: pages on tree edges, locks on running paths, eviction of the least
recently touched unlocked leaf from its end, shared content held once, events."""

from __future__ import annotations

import pytest

from servesim.kv.radix_pool import REMOVED, STORED, RadixPool
from servesim.workload.request import Request


def req(name: str = "r") -> Request:
    return Request(0, name, 8, 1, [])


def prefill(pool: RadixPool, r: Request, hashes: list[int], hit: int = 0) -> None:
    """Admit `r` with its first `hit` pages cached, compute the rest and cache them."""
    if hit:
        pool.acquire(r, hashes[:hit])
    assert pool.allocate(r, len(hashes) - hit)
    pool.register_many(r, hashes[hit:])


def evicted(pool: RadixPool, n: int) -> list[int]:
    """The pages a fresh allocation of n evicts, in eviction order."""
    pool.take_events()
    assert pool.allocate(req("new"), n)
    return [key for kind, key in pool.take_events() if kind == REMOVED]


def test_levels_count_locked_cached_and_private_pages():
    pool = RadixPool(10)
    a = req("a")
    prefill(pool, a, [1, 2, 3])
    assert pool.allocate(a, 1)  # the page of its next token: private
    assert (pool.n_active, pool.n_cached, pool.n_empty, pool.free_blocks) == (4, 0, 6, 6)
    pool.release(a)
    assert (pool.n_active, pool.n_cached, pool.n_empty, pool.free_blocks) == (0, 3, 7, 10)
    assert a.held_hashes == [] and a.held_private_blocks == 0


def test_locked_pages_are_never_evicted():
    pool = RadixPool(4, record_events=True)
    a, b = req("a"), req("b")
    prefill(pool, a, [1, 2])
    prefill(pool, b, [3, 4])
    pool.release(b)
    assert pool.free_blocks == 2
    assert not pool.allocate(req("c"), 3)
    assert evicted(pool, 2) == [4, 3]


def test_the_least_recently_touched_leaf_goes_first_whatever_the_release_order():
    """a is released before b, but a's branch is touched again (a match at admission) after
    b's: b's branch is evicted first. vLLM's pool would evict a's blocks first."""
    pool = RadixPool(6, record_events=True)
    a, b = req("a"), req("b")
    prefill(pool, a, [1, 2, 3])
    prefill(pool, b, [7, 8, 9])
    pool.release(a)
    pool.release(b)
    c = req("c")
    pool.acquire(c, [1, 2, 3])  # touches a's branch
    pool.release(c)
    assert evicted(pool, 4) == [9, 8, 7, 3]


def test_a_leaf_is_evicted_from_its_end_only_as_far_as_needed():
    pool = RadixPool(5, record_events=True)
    a = req("a")
    prefill(pool, a, [1, 2, 3, 4, 5])
    pool.release(a)
    assert evicted(pool, 2) == [5, 4]
    assert pool.match([1, 2, 3, 4, 5]) == (3, 0)


def test_a_shared_prefix_outlives_the_branches_below_it():
    """Two prompts share [1, 2]: the tree splits there. The shared node becomes a leaf only once
    both branches are gone, and keeps its own touch (b's, the newest)."""
    pool = RadixPool(7, record_events=True)
    a, b, c = req("a"), req("b"), req("c")
    prefill(pool, a, [1, 2, 3])
    prefill(pool, c, [5, 6])
    prefill(pool, b, [1, 2, 4], hit=2)  # splits a's edge after [1, 2]
    for r in (a, b, c):
        pool.release(r)
    # leaves by last touch: a's [3], c's [5, 6], b's [4]; then [1, 2], touched by b
    assert evicted(pool, 7) == [3, 6, 5, 4, 2, 1]


def test_content_cached_already_is_shared_and_the_new_copy_freed():
    """b computed [1, 2] without a hit (admitted before a cached it): caching them again shares
    a's pages; b's own copies go back, and b's path now runs through a's node."""
    pool = RadixPool(8, record_events=True)
    a, b = req("a"), req("b")
    assert pool.allocate(a, 2) and pool.allocate(b, 3)
    pool.register_many(a, [1, 2])
    pool.register_many(b, [1, 2, 3])
    assert pool.take_events() == [(STORED, 1), (STORED, 2), (STORED, 3)]
    assert (pool.n_active, pool.free_blocks) == (3, 5)
    assert pool.match([1, 2, 3]) == (3, 3)
    pool.release(a)
    assert pool.match([1, 2, 3]) == (3, 3), "b still holds the shared prefix"
    pool.release(b)
    assert (pool.n_cached, pool.free_blocks) == (3, 8)


def test_a_request_extends_its_own_leaf_as_it_decodes():
    pool = RadixPool(8)
    a = req("a")
    prefill(pool, a, [1, 2])
    for h in (3, 4):
        assert pool.allocate(a, 1)
        pool.register_many(a, [h])
    assert a.held_hashes == [1, 2, 3, 4]
    assert pool.match([1, 2, 3, 4]) == (4, 4)


def test_caching_off_keeps_every_page_private():
    pool = RadixPool(4, enable_caching=False)
    a = req("a")
    assert pool.allocate(a, 2)
    pool.register_many(a, [1, 2])
    assert pool.match([1, 2]) == (0, 0)
    pool.release(a)
    assert pool.free_blocks == 4 and pool.n_cached == 0


def test_a_prefix_not_cached_cannot_be_acquired():
    pool = RadixPool(4)
    with pytest.raises(KeyError):
        pool.acquire(req(), [1])
