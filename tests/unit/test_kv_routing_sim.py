"""The KV router inside whole runs (fixed timing: 10 ms per pass with prefill work, 1 ms per
decode pass): prefix reuse it wins over round robin, its pending queue losing nothing, the
lag of KV events, P/D pools, session affinity."""

from __future__ import annotations

import pytest

from servesim import simulate

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}


def row(t, n_in, n_out, ids, session=None):
    r = {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}
    if session is not None:
        r["session_id"] = session
    return r


def ids(start, n_tokens):
    return list(range(start, start + -(-n_tokens // 64)))


def run(config, trace, rows, router, workers=2, **extra):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        topology=extra.pop("topology", {"kind": "aggregated", "num_workers": workers}),
        router=router,
        **extra,
    )
    return simulate(cfg)


# A 1280-token prompt (20 blocks), then one that extends it by 640 tokens, after A is done.
SHARED = [row(0, 1280, 2, ids(0, 1280)), row(100, 1920, 2, ids(0, 1280) + ids(500, 640))]


def test_kv_router_sends_a_shared_prefix_where_it_is_cached(config, trace):
    rr = run(config, trace, SHARED, {"kind": "round_robin"})
    kv = run(config, trace, SHARED, {"kind": "kv"})
    assert list(rr.requests.decode_worker_idx) == [0, 1]
    assert list(rr.requests.reused_input_tokens) == [0, 0]
    assert kv.requests.decode_worker_idx.nunique() == 1
    assert list(kv.requests.reused_input_tokens) == [0, 1280]
    routing = kv.routing
    assert list(routing.outcome) == ["immediate", "immediate"]
    assert list(routing.selected_overlap_blocks) == [0, 20]
    assert list(routing.overlap_regret_blocks) == [0, 0]
    assert kv.summary["router_agg_decisions"] == 2
    assert len(rr.routing) == 0  # round robin keeps no routing history


def test_lagged_events_hide_the_cache_until_they_land(config, trace):
    """A's blocks are stored at its pass end (10 ms); with a 200 ms lag B (at 100 ms) does not
    see them."""
    lag = run(config, trace, SHARED, {"kind": "kv", "kv_event_lag_ms": 200.0})
    assert list(lag.routing.selected_overlap_blocks) == [0, 0]
    late = [SHARED[0], {**SHARED[1], "timestamp": 210}]
    seen = run(config, trace, late, {"kind": "kv", "kv_event_lag_ms": 200.0})
    assert list(seen.routing.selected_overlap_blocks) == [0, 20]


def test_pending_queue_holds_requests_and_loses_none(config, trace):
    """Threshold 0.05 x 8192 = 409.6 tokens: one 1000-token prompt makes a worker busy, so of
    eight arriving together two go at once and the rest wait for first tokens."""
    rows = [row(0, 1000, 3, ids(100 * i, 1000)) for i in range(8)]
    r = run(config, trace, rows, {"kind": "kv", "queue_threshold": 0.05})
    assert r.summary["terminal_status_counts"] == {"completed": 8}
    routing = r.routing.sort_values("released_ms", kind="stable")
    assert list(routing.outcome).count("immediate") == 2
    assert r.summary["router_agg_queued"] == 6
    # each release follows a first token at a pass end on a multiple of 10 ms (+1 ms decodes)
    assert (routing.queue_wait_ms >= 0).all()
    assert routing.released_ms.max() > 0
    assert r.summary["router_agg_mean_queue_wait_ms"] > 0


@pytest.mark.parametrize("policy", ["fcfs", "lcfs", "wspt"])
def test_queue_policies_complete_everything(config, trace, policy):
    rows = [row(i, 200 + 300 * (i % 3), 2, ids(100 * i, 200 + 300 * (i % 3))) for i in range(12)]
    r = run(config, trace, rows, {"kind": "kv", "queue_threshold": 0.01, "queue_policy": policy})
    assert r.summary["terminal_status_counts"] == {"completed": 12}
    assert len(r.routing) == 12


def test_pd_prefill_router_scores_overlap_and_decode_router_balances(config, trace):
    rows = [row(0, 1280, 4, ids(0, 1280)), row(100, 1920, 4, ids(0, 1280) + ids(500, 640))]
    topo = {"kind": "disagg", "num_prefill_workers": 2, "num_decode_workers": 2}
    r = run(config, trace, rows, {"kind": "kv"}, topology=topo)
    assert r.requests.prefill_worker_idx.nunique() == 1  # B follows A's cached prefix
    assert r.requests.iloc[1].reused_input_tokens == 1280
    pools = r.routing.groupby("pool").size().to_dict()
    assert pools == {"prefill": 2, "decode": 2}
    assert (r.routing[r.routing.pool == "decode"].selected_overlap_blocks == 0).all()


def test_session_affinity_holds_a_session_against_the_cost(config, trace):
    """s0's first turn goes to worker X at 0 ms; big prompts R (1 ms) and R2 (2 ms) load Y
    and then X; s0's second turn arrives (its first turn ends at 21 ms, + 5 ms delay) while
    R2 on X is still prefilling and R on Y is not: the cost says Y, affinity keeps X."""
    rows = [
        row(0, 300, 2, ids(0, 300), "s0"),
        row(1, 10000, 50, ids(1000, 10000)),
        row(2, 10000, 50, ids(2000, 10000)),
        {
            "session_id": "s0",
            "delay": 5.0,
            "input_length": 300,
            "output_length": 2,
            "hash_ids": ids(3000, 300),
        },
    ]
    free = run(config, trace, rows, {"kind": "kv"})
    bound = run(config, trace, rows, {"kind": "kv", "affinity": {"mode": "session"}})
    for r in (free, bound):
        assert r.summary["terminal_status_counts"] == {"completed": 4}
    turns = free.requests[free.requests.session_id == "s0"].sort_values("turn_index")
    assert turns.decode_worker_idx.nunique() == 2  # the cost moves the second turn
    turns = bound.requests[bound.requests.session_id == "s0"].sort_values("turn_index")
    assert turns.decode_worker_idx.nunique() == 1
    assert float(turns.iloc[1].arrival_ms) == 26.0


def test_requests_waiting_in_the_router_at_the_stop_are_in_flight(config, trace):
    rows = [row(0, 1000, 3, ids(100 * i, 1000)) for i in range(8)]
    r = run(
        config,
        trace,
        rows,
        {"kind": "kv", "queue_threshold": 0.05},
        stop={"max_virtual_time_ms": 5.0},
    )
    assert r.summary["terminal_status_counts"] == {"incomplete": 8}
    assert set(r.requests.reason) == {"in flight at max_virtual_time_ms"}
    assert len(r.routing) == 2  # two were sent; six were still waiting
