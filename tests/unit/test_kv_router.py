"""The KV router in isolation: cost terms, tie-break, temperature sampling, load tracking, the
pending queue's order, session affinity's leases and TTL, and the prefix index's lag. Every
expectation is computed by hand (block size 4 unless said)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.config.schema import KvRouter as KvRouterConfig
from servesim.kv.block_pool import REMOVED, STORED
from servesim.metrics.recorder import Recorder
from servesim.router.kv import KvRouter, softmax_pick
from servesim.router.prefix_index import Holders, PrefixIndex
from servesim.workload.request import Request

BS = 4


def make_router(n=2, dp=1, role="aggregated", seed=0, budget=8, **knobs):
    env = simpy.Environment()
    rec = Recorder()
    router = KvRouter(
        env,
        KvRouterConfig(**knobs),
        n,
        dp,
        np.random.default_rng(seed),
        BS,
        budget,
        role,
        rec,
    )
    sent: list[tuple[str, int, int]] = []
    router.send = lambda req, w, r: sent.append((req.request_id, w, r))
    for t in range(n * dp):
        router.index.bind_device(f"w{t}", t)
    return env, router, sent


_counter = iter(range(10**9))


def req(isl, blocks, session=None, rid=None, arrival=0.0, group=None):
    i = next(_counter)
    r = Request(i, rid or f"r{i}", isl, 4, list(blocks), session_id=session)
    r.arrival_ms = arrival
    r.affinity_group = group
    return r


def store(router, target, blocks, t=0.0):
    for h in blocks:
        router.index.on_event(t, f"w{target}", STORED, h)


# ---------------------------------------------------------------------- cost


def test_cost_terms_by_hand():
    """isl 10 (2 full blocks [1, 2]); target 0 caches block 1 on device.
    t0: prefill (0 + 10)/4 - 1 = 1.5, decode 0 + 2 -> 3.5; t1: 2.5 + 2 -> 4.5."""
    _, router, _ = make_router()
    store(router, 0, [1])
    r = req(10, [1, 2])
    assert router.costs(r, router._overlaps(r)) == [3.5, 4.5]


def test_prefill_load_scale_and_credit_weights():
    """scale 2, credit 0.5: t0 = 2 x (2.5 - 0.5) + 2 = 6; t1 = 2 x 2.5 + 2 = 7."""
    _, router, _ = make_router(prefill_load_scale=2.0, overlap_score_credit=0.5)
    store(router, 0, [1])
    r = req(10, [1, 2])
    assert router.costs(r, router._overlaps(r)) == [6.0, 7.0]


def test_credit_clamps_at_zero():
    """A fully cached 8-token prompt: raw 2, credit 2 -> prefill 0, decode 2."""
    _, router, _ = make_router()
    store(router, 0, [1, 2])
    r = req(8, [1, 2])
    assert router.costs(r, router._overlaps(r))[0] == 2.0


def test_host_and_disk_credit_after_the_device_prefix():
    """Target 1: device holds [1], its host pool [2, 3], its disk pool [4]; prompt of 16 tokens
    [1, 2, 3, 4]: credit 1 + 0.75 x 2 + 0.25 x 1 = 2.75, prefill 4 - 2.75 = 1.25, decode 4."""
    _, router, _ = make_router()
    router.index.bind_tiers(1, "h1", "d1")
    store(router, 1, [1])
    for h in (2, 3):
        router.index.on_event(0.0, "h1", STORED, h)
    router.index.on_event(0.0, "d1", STORED, 4)
    r = req(16, [1, 2, 3, 4])
    overlaps = router._overlaps(r)
    assert [o[1] for o in overlaps] == [1, 2, 1]
    assert router.costs(r, overlaps)[1] == pytest.approx(5.25)


def test_decode_term_counts_shared_active_blocks_once():
    """Target 0 serves an active [1, 2, 3] prompt (3 unique blocks). A new prompt [1, 2, 9]
    shares 2 leading blocks: decode 3 + (3 - 2) = 4; prefill (A_0 = 12 + 12)/4 = 6 -> 10."""
    _, router, _ = make_router(n=2)
    a = req(12, [1, 2, 3])
    router.submit(a)  # both targets cost 6: tie
    t = router.flights[a.idx].target
    b = req(12, [1, 2, 9])
    costs = router.costs(b, router._overlaps(b))
    assert costs[t] == 10.0
    assert costs[1 - t] == 6.0


def test_decode_active_request_weight():
    _, router, _ = make_router(decode_active_request_weight=3.0)
    a = req(4, [1])
    router.submit(a)
    t = router.flights[a.idx].target
    b = req(4, [5])
    # A = 4 tokens on t: prefill (4 + 4)/4 = 2, decode 1 + 1, active 3 x 1 -> 7; other: 1 + 1
    costs = router.costs(b, router._overlaps(b))
    assert costs[t] == 7.0 and costs[1 - t] == 2.0


def test_prefill_pool_has_no_decode_term_and_decode_pool_no_prefill_term():
    _, pre, _ = make_router(role="prefill")
    store(pre, 0, [1])
    r = req(10, [1, 2])
    assert pre.costs(r, pre._overlaps(r)) == [1.5, 2.5]
    _, dec, _ = make_router(role="decode")
    store(dec, 0, [1])  # ignored: the decode router gives no overlap credit
    a = req(8, [1, 2])
    dec.submit(a)
    t = dec.flights[a.idx].target
    # no sharing in the decode pool: active 2 private blocks + 2 for [1, 2]
    assert dec.costs(req(8, [1, 2]), dec._overlaps(a))[t] == 4.0


# ---------------------------------------------------------------------- selection


def test_zero_temperature_takes_the_minimum():
    _, router, _ = make_router(n=3)
    assert router.select([3.0, 1.0, 2.0]) == 1


def test_ties_are_broken_uniformly_and_reproducibly():
    _, a, _ = make_router(n=3, seed=7)
    _, b, _ = make_router(n=3, seed=7)
    picks = [a.select([1.0, 1.0, 1.0]) for _ in range(3000)]
    assert picks == [b.select([1.0, 1.0, 1.0]) for _ in range(3000)]
    counts = np.bincount(picks, minlength=3)
    assert all(abs(c - 1000) < 100 for c in counts)  # ~5 sigma
    _, c, _ = make_router(n=3, seed=8)
    assert picks != [c.select([1.0, 1.0, 1.0]) for _ in range(3000)]


def test_temperature_sampling_probabilities():
    """Costs 20 and 40 at T = 1: p(40) = e^-1 / (1 + e^-1) = 0.2689; at T = 0.5: e^-2/(1 +
    e^-2) = 0.1192; only the normalised gap matters (2 and 4 gives the same)."""
    import random

    rand = random.Random(1)
    n = 20000
    for costs, t, p in (([20, 40], 1.0, 0.2689), ([20, 40], 0.5, 0.1192), ([2, 4], 1.0, 0.2689)):
        worse = sum(softmax_pick(costs, t, rand) for _ in range(n)) / n
        assert abs(worse - p) < 0.012, (costs, t, worse)
    # equal costs: uniform
    draws = [softmax_pick([5.0, 5.0, 5.0, 5.0], 1.0, rand) for _ in range(8000)]
    assert all(abs(c - 2000) < 200 for c in np.bincount(draws))


def test_softmax_pick_is_the_cumulative_draw():
    class Fixed:
        def __init__(self, u):
            self.u = u

        def random(self):
            return self.u

    p_worse = math.exp(-1) / (1 + math.exp(-1))
    assert softmax_pick([20, 40], 1.0, Fixed(1 - p_worse - 1e-9)) == 0
    assert softmax_pick([20, 40], 1.0, Fixed(1 - p_worse + 1e-9)) == 1


# ---------------------------------------------------------------------- load tracking


def test_load_added_on_dispatch_prefill_off_at_first_token_rest_at_end():
    _, router, sent = make_router()
    store(router, 1, [1])
    a = req(10, [1, 2])
    router.submit(a)
    assert sent == [(a.request_id, 1, 0)]  # t1: 1.5 + 2 beats t0: 2.5 + 2
    # new tokens only: 10 - 1 x 4 cached
    assert router.prefill_tokens == [0, 6]
    assert router.n_active_blocks == [0, 2] and router.active_requests == [0, 1]
    router.prefill_done(a)
    assert router.prefill_tokens == [0, 0] and router.n_active_blocks == [0, 2]
    router.finished(a)
    assert router.n_active_blocks == [0, 0] and router.active_requests == [0, 0]
    router.finished(a)  # a second end changes nothing
    assert router.active_requests == [0, 0]


# ---------------------------------------------------------------------- pending queue


def queued_router(policy):
    """Threshold 1 x budget 8: a target is busy above 8 uncached prompt tokens."""
    env, router, sent = make_router(n=1, queue_threshold=1.0, queue_policy=policy)
    return env, router, sent


def test_requests_wait_while_every_target_is_busy_and_leave_in_fcfs_order():
    env, router, sent = queued_router("fcfs")
    big = req(12, [1, 2, 3], rid="big")
    router.submit(big)  # 12 > 8: busy from now
    waiting = [req(4 * k, range(100 * k, 100 * k + k), rid=f"q{k}", arrival=k) for k in (3, 1, 2)]
    for w in waiting:
        router.submit(w)
    assert [s[0] for s in sent] == ["big"] and router.has_waiting
    router.prefill_done(big)  # load 0: q1 (4 tokens), then q2 (8 more: 12 > 8, busy again)
    router.settle()
    assert [s[0] for s in sent] == ["big", "q1", "q2"]
    router.prefill_done(waiting[1])  # q1's 4 off: 8 is not above 8, so q3 goes
    router.settle()
    assert [s[0] for s in sent] == ["big", "q1", "q2", "q3"]
    assert not router.has_waiting
    rows = router.recorder.routing
    assert [r[2] for r in rows] == ["immediate", "queued", "queued", "queued"]


def test_lcfs_releases_the_latest_arrival_first():
    _, router, sent = queued_router("lcfs")
    big = req(12, [1, 2, 3], rid="big")
    router.submit(big)
    for k in (1, 2, 3):
        router.submit(req(12, [10 * k], rid=f"q{k}", arrival=k))
    router.prefill_done(big)
    router.settle()
    assert [s[0] for s in sent] == ["big", "q3"]


def test_wspt_releases_the_least_uncached_work_first():
    _, router, sent = queued_router("wspt")
    big = req(12, [1, 2, 3], rid="big")
    router.submit(big)
    router.submit(req(40, range(50, 60), rid="long", arrival=1))
    router.submit(req(8, [70, 71], rid="short", arrival=2))
    # "cached" shares blocks 1-3 with what target 0 stored: 16 - 12 = 4 uncached tokens
    store(router, 0, [1, 2, 3])
    router.submit(req(16, [1, 2, 3, 4], rid="cached", arrival=3))
    router.prefill_done(big)
    router.settle()
    # arrival-time overlaps: "cached" was seen with 3 blocks -> 4 tokens; short 8; long 40
    assert [s[0] for s in sent][:3] == ["big", "cached", "short"]


def test_queue_wait_is_recorded():
    env, router, sent = queued_router("fcfs")
    big = req(12, [1, 2, 3], rid="big")
    router.submit(big)
    q = req(4, [9], rid="q", arrival=0.0)
    router.submit(q)
    env.run(until=5.0)
    router.prefill_done(big)
    router.settle()
    row = router.recorder.routing[-1]
    assert row[0] == "q" and row[2] == "queued" and row[3] == 0.0 and row[4] == 5.0
    assert row[5] == 5.0


@pytest.mark.parametrize(("admitted", "q_target"), [("ab", 1), ("ba", 0)])
def test_a_pass_ends_first_tokens_apply_one_at_a_time_in_running_order(admitted, q_target):
    """Dynamo's replay applies a pass end's signals one by one in batch (running) order and
    re-examines the queue after each. Busy above 8 tokens, prefill_load_scale 10. Target 0
    caches blocks 1-8 and 40-47; d (32 tokens, 40-47) runs there with nothing to prefill;
    a (41 tokens, blocks 1-10) is charged 9 and b (36 tokens, blocks 1-8 and 11) 4 on target
    0 (load 13); c (9 tokens) 9 on target 1: both busy, q (4 tokens) waits. Target 0's pass
    gives a and b their first tokens (signals arriving b first). Admitted a then b: a's alone
    frees target 0 (load 4), and q sees b's 4 tokens there: 10 x 8/4 + 19 + 1 = 40 against
    target 1's 10 x 13/4 + 2 + 1 = 35.5, so it goes to 1 (with both applied target 0 would
    cost 30). Admitted b then a: b's leaves 9 (busy), a's frees it at 0: q goes to 0."""
    _, router, sent = make_router(queue_threshold=1.0, prefill_load_scale=10.0)
    store(router, 0, [*range(1, 9), *range(40, 48)])
    d = req(32, range(40, 48), rid="d")
    a = req(41, range(1, 11), rid="a")
    b = req(36, [*range(1, 9), 11], rid="b")
    c = req(9, [20, 21], rid="c")
    q = req(4, [30], rid="q")
    for r in (d, a, b, c, q):
        router.submit(r)
    assert sent == [("d", 0, 0), ("a", 0, 0), ("b", 0, 0), ("c", 1, 0)] and router.has_waiting
    assert router.prefill_tokens == [13, 9]
    order = {"a": a, "b": b}
    for r in (d, order[admitted[0]], order[admitted[1]], c):
        router.admitted(r)
    router.prefill_done(b)
    router.prefill_done(a)
    assert router.prefill_tokens == [13, 9] and len(sent) == 4  # held until settle
    router.settle()
    assert sent[4] == ("q", q_target, 0)
    assert router.prefill_tokens == ([0, 13] if q_target else [4, 9])  # q's 4 tokens
    assert not router.has_waiting


# ---------------------------------------------------------------------- affinity


def test_session_requests_follow_their_binding():
    _, router, sent = make_router(n=2, affinity={"mode": "session"})
    a = req(4, [1], session="s")
    router.submit(a)
    home = sent[-1][1]
    # make home the costlier target for an unrelated prompt; the session still goes home
    router.submit(req(40, range(10, 20), session="s"))
    assert sent[-1][1] == home
    router.submit(req(4, [99], session="other"))
    assert sent[-1][1] == 1 - home  # a new key: normal selection


def test_binding_expires_only_without_a_lease_after_the_ttl():
    env, router, sent = make_router(n=2, affinity={"mode": "session", "ttl_seconds": 1.0})
    a = req(4, [1], session="s")
    router.submit(a)
    home = sent[-1][1]
    b = router.bindings["s"]
    env.run(until=5000.0)  # long past the TTL, but a holds a lease
    assert router._binding_valid(b, env.now)
    router.finished(a)  # idle from 5000 ms
    env.run(until=5999.0)
    assert router._binding_valid(b, env.now)
    env.run(until=6000.0)
    assert not router._binding_valid(b, env.now)
    # expired: the next request re-selects (load it away from home first)
    router.submit(req(40, range(10, 20), session="x"))
    busy = sent[-1][1]
    router.submit(req(4, [1], session="s"))
    assert router.bindings["s"].target == sent[-1][1]
    assert sent[-1][1] == 1 - busy
    del home


def test_later_requests_of_a_key_wait_for_the_first_dispatch():
    env, router, sent = make_router(n=1, queue_threshold=1.0, affinity={"mode": "session"})
    big = req(12, [1, 2, 3], rid="big")
    router.submit(big)  # busy
    first = req(4, [5], session="s", rid="first")
    router.submit(first)  # queued; initialises the binding
    second = req(4, [6], session="s", rid="second")
    router.submit(second)  # waits for first's dispatch, outside the queue
    assert router.bindings["s"].target == -1 and len(router.bindings["s"].waiters) == 1
    router.prefill_done(big)
    router.settle()
    assert [s[0] for s in sent] == ["big", "first", "second"]
    assert router.bindings["s"].leases == 2


def test_unroutable_binding_reselects():
    _, router, sent = make_router(n=2, affinity={"mode": "session"})
    router.submit(req(4, [1], session="s"))
    home = sent[-1][1]
    router.close_target(home)
    router.submit(req(4, [2], session="s"))
    assert sent[-1][1] == 1 - home
    assert router.bindings["s"].target == 1 - home


def test_sibling_group_binds_by_family():
    _, router, sent = make_router(n=2, affinity={"mode": "sibling_group"})
    router.submit(req(4, [1], session="a", group="g0"))
    home = sent[-1][1]
    router.submit(req(40, range(10, 20), session="b", group="g0"))
    assert sent[-1][1] == home


# ---------------------------------------------------------------------- prefix index


def test_holders_depths_walk():
    h = Holders()
    h.add(0, [1, 2, 3])
    h.add(1, [1, 2])
    h.add(2, [7])
    assert h.depths([1, 2, 3, 4], 3) == [3, 2, 0]
    h.remove(0, [3])
    assert h.depths([1, 2, 3], 3) == [2, 2, 0]
    h.remove(1, [1])  # a hole: block 2 without its parent no longer matches a prefix
    assert h.depths([1, 2], 3) == [2, 0, 0]


def test_lagged_events_become_visible_lag_ms_later():
    index = PrefixIndex(1, lag_ms=10.0)
    index.bind_device("w0", 0)
    index.on_event(26.0, "w0", STORED, 1)
    index.advance(35.9)
    assert index.overlaps([1])[0] == [0]
    index.advance(36.0)
    assert index.overlaps([1])[0] == [1]
    index.on_event(40.0, "w0", REMOVED, 1)
    index.advance(49.0)
    assert index.overlaps([1])[0] == [1]
    index.advance(50.0)
    assert index.overlaps([1])[0] == [0]


def test_events_of_other_pools_are_ignored():
    index = PrefixIndex(1)
    index.bind_device("cluster.p0", 0)
    index.on_event(0.0, "cluster.d0", STORED, 1)
    assert index.overlaps([1])[0] == [0] and index.n_events == 0


def test_expired_bindings_are_dropped_from_the_table():
    env, router, _ = make_router(n=2, affinity={"mode": "session", "ttl_seconds": 1.0})
    reqs = [req(4, [k], session=f"s{k}") for k in range(50)]
    for r in reqs:
        router.submit(r)
    for r in reqs:
        router.finished(r)
    assert len(router.bindings) == 50
    env.run(until=999.0)
    router.submit(req(4, [999], session="late"))
    assert len(router.bindings) == 51  # not expired yet
    env.run(until=1000.0)
    router.submit(req(4, [998], session="later"))
    assert set(router.bindings) == {"late", "later"}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 3), st.lists(st.integers(0, 9), max_size=6)),
        max_size=40,
    ),
    st.lists(st.integers(0, 9), max_size=8),
)
def test_holders_count_like_a_multiset_of_block_target_pairs(ops, prompt):
    """Whatever mix of adds and removes (blocks held once or many times, by one target or
    several): each call returns how many blocks the target gained or lost, and the depths
    are those of a plain count of (block, target) pairs."""
    h = Holders()
    counts: dict[tuple[int, int], int] = {}
    for is_add, target, blocks in ops:
        before = {b for (b, t), c in counts.items() if t == target and c > 0}
        for b in blocks:
            if is_add:
                counts[(b, target)] = counts.get((b, target), 0) + 1
            elif counts.get((b, target), 0) > 0:
                counts[(b, target)] -= 1
        after = {b for (b, t), c in counts.items() if t == target and c > 0}
        got = h.add(target, blocks) if is_add else h.remove(target, blocks)
        assert got == (len(after - before) if is_add else len(before - after))
    expected = []
    for target in range(4):
        depth = 0
        while depth < len(prompt) and counts.get((prompt[depth], target), 0) > 0:
            depth += 1
        expected.append(depth)
    assert h.depths(prompt, 4) == expected
    for b in range(10):
        assert sorted(h.holders_of(b)) == sorted(t for (x, t), c in counts.items() if x == b and c)
