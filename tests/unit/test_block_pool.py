"""The G1 block pool: ownership at grant time, LRU eviction order, duplicate copies, events."""

from __future__ import annotations

from servesim.kv.block_pool import REMOVED, STORED, BlockPool
from servesim.workload.request import Request


def req(name: str = "r") -> Request:
    return Request(0, name, 8, 1, [])


def fill(pool: BlockPool, r: Request, hashes: list[int]) -> None:
    """Allocate one private block per hash and register it (a prefill of full blocks)."""
    assert pool.allocate(r, len(hashes))
    for h in hashes:
        pool.register(r, h)


def test_grant_records_ownership_before_returning():
    """Blocks handed out are on the request's books as soon as the call returns."""
    pool = BlockPool(4)
    r = req()
    assert pool.allocate(r, 3)
    assert r.held_private_blocks == 3 and pool.n_active == 3 and pool.free_blocks == 1
    assert not pool.allocate(r, 2), "more than free must fail and change nothing"
    assert r.held_private_blocks == 3 and pool.n_active == 3


def test_release_caches_full_blocks_and_frees_private_ones():
    pool = BlockPool(8)
    r = req()
    fill(pool, r, [10, 11])
    assert pool.allocate(r, 1)  # a partial tail block
    pool.release(r)
    assert pool.n_active == 0 and pool.n_cached == 2 and pool.free_blocks == 8
    assert r.held_hashes == [] and r.held_private_blocks == 0


def test_eviction_is_lru_in_release_order_suffix_first():
    """A request releases last block first, so its suffix is evicted before its prefix; an
    earlier release is evicted before a later one."""
    pool = BlockPool(4, record_events=True)
    a, b = req("a"), req("b")
    fill(pool, a, [1, 2])
    fill(pool, b, [3, 4])
    pool.release(a)  # inactive order: 2, 1
    pool.release(b)  # then 4, 3
    pool.take_events()
    c = req("c")
    assert pool.allocate(c, 3)
    assert pool.take_events() == [(REMOVED, 2), (REMOVED, 1), (REMOVED, 4)]
    assert list(pool.inactive) == [3]


def test_empty_blocks_are_used_before_evicting():
    pool = BlockPool(4)
    a = req()
    fill(pool, a, [1, 2])
    pool.release(a)
    b = req()
    assert pool.n_empty == 2
    assert pool.allocate(b, 2)
    assert pool.n_evictions == 0 and pool.n_cached == 2 and pool.n_empty == 0
    assert pool.allocate(b, 1)
    assert pool.n_evictions == 1 and pool.n_cached == 1 and pool.n_empty == 0


def test_match_counts_leading_resident_blocks_and_active_ones():
    pool = BlockPool(8)
    a, b = req("a"), req("b")
    fill(pool, a, [1, 2, 3])
    fill(pool, b, [9])
    pool.release(a)  # 1, 2, 3 inactive
    c = req("c")
    pool.acquire(c, [1])  # 1 active again
    assert pool.match([1, 2, 3, 4]) == (3, 1)
    assert pool.match([2, 3]) == (2, 0)
    assert pool.match([5, 1]) == (0, 0), "a prefix hit must start at the first block"


def test_acquire_shares_active_and_reactivates_inactive():
    pool = BlockPool(8)
    a, b = req("a"), req("b")
    fill(pool, a, [1, 2])
    pool.acquire(b, [1])
    assert pool.refcount[1] == 2
    pool.release(a)
    assert 1 not in pool.inactive and 2 in pool.inactive
    pool.acquire(b, [2])
    assert pool.n_cached == 0 and pool.refcount[2] == 1


def test_stored_event_only_for_new_content():
    pool = BlockPool(8, record_events=True)
    a, b = req("a"), req("b")
    fill(pool, a, [1, 2])
    pool.acquire(b, [1, 2])
    assert pool.take_events() == [(STORED, 1), (STORED, 2)]


def test_duplicate_content_keeps_its_own_copy():
    """Two requests that computed the same block each hold a physical copy; the content stays
    resident until its last copy is evicted, and only then is `removed` emitted."""
    pool = BlockPool(3, record_events=True)
    a, b = req("a"), req("b")
    fill(pool, a, [7])
    fill(pool, b, [7])
    assert pool.n_active == 2 and pool.take_events() == [(STORED, 7)]
    pool.release(a)
    pool.release(b)
    assert pool.n_cached == 2
    c = req("c")
    assert pool.allocate(c, 2)  # one empty block, then evict the older copy
    assert pool.take_events() == []
    assert pool.match([7]) == (1, 0)
    assert pool.allocate(c, 1)  # evicts the last copy
    assert pool.take_events() == [(REMOVED, 7)]
    assert pool.match([7]) == (0, 0)


def test_caching_disabled_keeps_everything_private():
    pool = BlockPool(4, enable_caching=False)
    a = req()
    fill(pool, a, [1, 2])
    assert pool.refcount == {} and pool.n_private == 2 and pool.match([1]) == (0, 0)
    pool.release(a)
    assert pool.n_active == 0 and pool.n_cached == 0


def test_evictions_are_counted():
    pool = BlockPool(2)
    a = req()
    fill(pool, a, [1, 2])
    pool.release(a)
    assert pool.allocate(req(), 2) and pool.n_evictions == 2
