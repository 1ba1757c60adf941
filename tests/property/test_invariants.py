"""Invariants over random traces and engine settings: nothing lost, blocks conserved,
timestamps monotone, levels within capacity, same seed same answer."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pandas as pd
from conftest import make_config
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from servesim import simulate

rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 400),  # gap to previous arrival, ms
        st.integers(1, 300),  # input length
        st.integers(0, 40),  # output length
        st.integers(0, 3),  # prefix family
    ),
    min_size=1,
    max_size=25,
)
engine_strategy = st.fixed_dictionaries(
    {
        "num_gpu_blocks": st.integers(4, 120),
        "block_size": st.sampled_from([2, 4, 16]),
        "max_num_batched_tokens": st.sampled_from([16, 64, 256, 8192]),
        "max_num_seqs": st.sampled_from([1, 2, 8, 256]),
        "enable_prefix_caching": st.booleans(),
        "enable_chunked_prefill": st.booleans(),
        "preemption_mode": st.sampled_from(["lifo", "fifo"]),
        "dp_size": st.sampled_from([1, 1, 2]),
    }
)


def write_rows(rows) -> str:
    t = 0
    lines = []
    for gap, n_in, n_out, fam in rows:
        t += gap
        n_blocks = -(-n_in // 16)
        ids = [fam * 1000 + k for k in range(n_blocks // 2)] + [
            10_000 + t * 100 + k for k in range(n_blocks - n_blocks // 2)
        ]
        lines.append(
            {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}
        )
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    return f.name


def run(rows, engine, workers, stop_ms=None, timing="fixed", topology=None, link=None, router=None):
    path = write_rows(rows)
    engine = dict(engine)
    speed = {"fast_forward": engine.pop("fast_forward", True)}
    try:
        cfg = make_config(
            workload={"kind": "mooncake", "path": path, "trace_block_size": 16},
            engine=engine,
            speed=speed,
            timing={"kind": "fixed", "prefill_ms": 7.0, "decode_ms": 3.0}
            if timing == "fixed"
            else {"kind": "polynomial"},
            topology=topology or {"num_workers": workers},
            link=link or {},
            router=router or {"kind": "round_robin"},
            stop={"max_virtual_time_ms": stop_ms},
            output={"progress": "off", "kv_events": True},
        )
        return simulate(cfg)
    finally:
        Path(path).unlink()


COMMON = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(rows=rows_strategy, engine=engine_strategy, workers=st.integers(1, 3))
def test_no_request_lost_and_blocks_conserved(rows, engine, workers):
    r = simulate_checked(rows, engine, workers)
    req = r.requests
    assert len(req) == len(rows)
    assert set(req.terminal_status) <= {"completed", "rejected"}
    done = req[req.terminal_status == "completed"]
    assert (done.output_length == done.requested_output_length).all()
    # every pool ends empty of active blocks, and never exceeds capacity
    kv = r.kv
    last = kv.groupby("pool").tail(1)
    assert (last.used_blocks == 0).all()
    assert ((kv.used_blocks + kv.cached_blocks) <= engine["num_gpu_blocks"]).all()
    assert (kv.used_blocks >= 0).all() and (kv.cached_blocks >= 0).all()


def simulate_checked(rows, engine, workers, stop_ms=None):
    r = run(rows, engine, workers, stop_ms)
    req = r.requests
    s = r.summary
    counts = s["terminal_status_counts"]
    assert sum(counts.values()) == len(rows)
    assert (
        s["completed_requests"] + s["rejected_requests"] + s["incomplete_requests"]
        == (s["num_requests"])
    )
    # timestamps monotone per request
    tok = req[req.output_length > 0]
    assert (tok.first_admit_ms >= tok.arrival_ms).all()
    assert (tok.first_token_ms >= tok.first_admit_ms).all()
    assert (tok.last_token_ms >= tok.first_token_ms).all()
    ended = req[req.terminal_status == "completed"]
    assert (ended.terminal_ms >= ended.arrival_ms).all()
    # passes of one worker rank do not overlap
    for _, g in r.passes.groupby(["worker", "dp_rank"]):
        starts = g.start_ms.to_numpy()
        ends = g.end_ms.to_numpy()
        assert (ends >= starts).all()
        assert (starts[1:] >= ends[:-1] - 1e-9).all()
    return r


@COMMON
@given(rows=rows_strategy, engine=engine_strategy, cut=st.floats(1.0, 2000.0))
def test_cutoff_loses_nothing(rows, engine, cut):
    r = simulate_checked(rows, engine, 2, stop_ms=cut)
    req = r.requests
    assert set(req.terminal_status) <= {"completed", "rejected", "incomplete"}
    done = req[req.terminal_status == "completed"]
    assert (done.terminal_ms <= cut).all()
    # nothing is stamped after the stop: a pass still running then never ends
    assert (req.last_token_ms.dropna() <= cut).all()
    assert (r.passes.end_ms <= cut).all()
    assert r.summary["n_preemptions"] == int(req.n_preemptions.sum())


@settings(max_examples=15, deadline=None)
@given(rows=rows_strategy, engine=engine_strategy)
def test_same_config_same_answer(rows, engine):
    a = run(rows, engine, 2, timing="polynomial")
    b = run(rows, engine, 2, timing="polynomial")
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.passes, b.passes)
    sa = {
        k: v
        for k, v in a.summary.items()
        if "wall" not in k and "per_s" not in k and k != "metadata"
    }
    sb = {
        k: v
        for k, v in b.summary.items()
        if "wall" not in k and "per_s" not in k and k != "metadata"
    }
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)


@COMMON
@given(rows=rows_strategy, engine=engine_strategy)
def test_kv_events_balance(rows, engine):
    """Every `removed` follows a `stored` of the same block; what is still stored at the end
    is exactly what the pools still cache."""
    r = run(rows, engine, 1)
    ev = r.kv_events
    live: set[tuple[int, int, int]] = set()  # (worker, rank, block) stored in that rank's pool
    for kind, w, k, h in zip(ev.kind, ev.worker, ev.dp_rank, ev.block_hash, strict=True):
        key = (w, k, h)
        if kind == "stored":
            assert key not in live
            live.add(key)
        else:
            assert key in live
            live.remove(key)
    if not engine["enable_prefix_caching"]:
        assert len(ev) == 0
    assert not math.isnan(r.summary["duration_ms"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_strategy,
    engine=engine_strategy,
    workers=st.integers(1, 3),
    max_model_len=st.sampled_from([None, 64, 400]),
)
def test_fast_forward_gives_the_step_by_step_answer(rows, engine, workers, max_model_len):
    """Chained and fast-forwarded passes produce exactly the pass-by-pass tables."""
    engine = dict(engine, max_model_len=max_model_len)
    fast = run(rows, dict(engine, fast_forward=True), workers, timing="polynomial")
    step = run(rows, dict(engine, fast_forward=False), workers, timing="polynomial")
    pd.testing.assert_frame_equal(fast.requests, step.requests)
    pd.testing.assert_frame_equal(fast.passes, step.passes)
    pd.testing.assert_frame_equal(fast.kv, step.kv)
    pd.testing.assert_frame_equal(fast.kv_events, step.kv_events)


kv_router_strategy = st.fixed_dictionaries(
    {
        "kind": st.just("kv"),
        "queue_threshold": st.sampled_from([None, 0.0, 0.5, 2.0]),
        "queue_policy": st.sampled_from(["fcfs", "lcfs", "wspt"]),
        "temperature": st.sampled_from([0.0, 0.0, 1.0]),
        "kv_event_lag_ms": st.sampled_from([0.0, 0.0, 25.0]),
        "decode_active_request_weight": st.sampled_from([0.0, 2.0]),
    }
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_strategy,
    engine=engine_strategy,
    workers=st.integers(2, 3),
    router=kv_router_strategy,
    stop_ms=st.sampled_from([None, None, 500.0]),
)
def test_kv_router_loses_nothing_and_fast_forward_changes_nothing(
    rows, engine, workers, router, stop_ms
):
    """With the KV router (any queue threshold, policy, temperature, lag) every request ends
    once, each routing decision is for a dispatched request, and chaining / fast-forward give
    the step-by-step tables (the router hears first tokens of chained passes early, which
    nothing can observe; while requests wait in the router nothing chains)."""
    fast = run(rows, dict(engine, fast_forward=True), workers, stop_ms, router=router)
    step = run(rows, dict(engine, fast_forward=False), workers, stop_ms, router=router)
    pd.testing.assert_frame_equal(fast.requests, step.requests)
    pd.testing.assert_frame_equal(fast.passes, step.passes)
    pd.testing.assert_frame_equal(fast.routing, step.routing)
    req = fast.requests
    assert len(req) == len(rows) and req.request_id.is_unique
    counts = fast.summary["terminal_status_counts"]
    assert sum(counts.values()) == len(rows)
    if stop_ms is None:
        assert set(counts) <= {"completed", "rejected"}
    dispatched = req[req.arrival_ms.notna()]
    assert set(fast.routing.request_id) <= set(dispatched.request_id)
    assert fast.routing.request_id.is_unique
    assert (fast.routing.queue_wait_ms >= 0).all()


pd_strategy = st.fixed_dictionaries(
    {
        "kind": st.just("disagg"),
        "num_prefill_workers": st.integers(1, 2),
        "num_decode_workers": st.integers(1, 2),
        "prefill": st.fixed_dictionaries(
            {"num_gpu_blocks": st.integers(20, 120), "dp_size": st.sampled_from([1, 2])}
        ),
        "decode": st.fixed_dictionaries(
            {
                "num_gpu_blocks": st.integers(4, 120),
                "max_num_seqs": st.sampled_from([1, 4, 256]),
                "dp_size": st.sampled_from([1, 2]),
            }
        ),
    }
)
link_strategy = st.fixed_dictionaries(
    {
        "bandwidth_gbps": st.sampled_from([None, 0.001, 0.01]),
        "timing_mode": st.sampled_from(["full_prompt", "destination_missing"]),
        "contention": st.sampled_from(["per_request", "fifo_lanes", "shared"]),
    }
)

# one 4-block pool of 2-token blocks, one sequence at a time: the P/D examples' engine
TINY_ENGINE = {
    "num_gpu_blocks": 4,
    "block_size": 2,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 1,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": False,
    "preemption_mode": "lifo",
    "dp_size": 1,
}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_strategy,
    engine=engine_strategy.map(lambda e: dict(e, enable_prefix_caching=True)),
    topology=pd_strategy,
    link=link_strategy,
    cut=st.sampled_from([None, 300.0]),
)
# an arrival at exactly the stop time: its prefill pass ends past the stop, so it is in flight
@example(
    rows=[(0, 1, 0, 0), (65, 1, 0, 0), (235, 1, 0, 0)],
    engine=TINY_ENGINE,
    topology={
        "kind": "disagg",
        "num_prefill_workers": 1,
        "num_decode_workers": 1,
        "prefill": {"num_gpu_blocks": 20, "dp_size": 1},
        "decode": {"num_gpu_blocks": 4, "max_num_seqs": 1, "dp_size": 1},
    },
    link={"bandwidth_gbps": None, "timing_mode": "full_prompt", "contention": "per_request"},
    cut=300.0,
)
# a decode pass end that frees blocks lets a waiting reservation through, whose source release
# starts a prefill pass that reaches the other decode worker mid-pass: that worker must not
# chain past the pass end it then waits for
@example(
    rows=[(0, 27, 2, 0), (0, 29, 3, 0), (0, 111, 0, 0), (0, 1, 0, 0)],
    engine={
        "num_gpu_blocks": 4,
        "block_size": 2,
        "max_num_batched_tokens": 256,
        "max_num_seqs": 1,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": False,
        "preemption_mode": "lifo",
        "dp_size": 1,
    },
    topology={
        "kind": "disagg",
        "num_prefill_workers": 1,
        "num_decode_workers": 2,
        "prefill": {"num_gpu_blocks": 56, "dp_size": 1},
        "decode": {"num_gpu_blocks": 56, "max_num_seqs": 4, "dp_size": 1},
    },
    link={"bandwidth_gbps": None, "timing_mode": "full_prompt", "contention": "per_request"},
    cut=None,
)
# a request the decode worker rejects in a pass that is still computing at the stop: it has
# left `running` when the pass was formed, and is in flight until the pass end delivers it
@example(
    rows=[(0, 1, 9, 0), (0, 1, 8, 0)],
    engine=TINY_ENGINE,
    topology={
        "kind": "disagg",
        "num_prefill_workers": 1,
        "num_decode_workers": 1,
        "prefill": {"num_gpu_blocks": 20, "dp_size": 1},
        "decode": {"num_gpu_blocks": 4, "max_num_seqs": 1, "dp_size": 2},
    },
    link={"bandwidth_gbps": 0.01, "timing_mode": "full_prompt", "contention": "per_request"},
    cut=300.0,
)
def test_disagg_loses_nothing_and_fast_forward_changes_nothing(rows, engine, topology, link, cut):
    """Every request of a P/D run ends completed, rejected or incomplete; every pool ends with
    no KV held by finished work; stepping every pass gives the same tables."""
    fast = run(rows, dict(engine, fast_forward=True), 1, cut, "polynomial", topology, link)
    step = run(rows, dict(engine, fast_forward=False), 1, cut, "polynomial", topology, link)
    req = fast.requests
    assert len(req) == len(rows)
    assert set(req.terminal_status) <= {"completed", "rejected", "incomplete"}
    s = fast.summary
    assert (
        s["completed_requests"] + s["rejected_requests"] + s["incomplete_requests"]
        == (s["num_requests"])
    )
    if cut is None:
        assert set(req.terminal_status) <= {"completed", "rejected"}
        last = fast.kv.groupby("pool").tail(1)
        assert (last.used_blocks == 0).all(), last
        done = req[req.terminal_status == "completed"]
        assert (done.output_length == done.requested_output_length).all()
        pd_done = done[done.output_length > 0]
        order = [
            "prefill_admit_ms",
            "source_held_ms",
            "destination_reserved_ms",
            "destination_activated_ms",
            "decode_admit_ms",
            "first_token_ms",
        ]
        for a, b in zip(order, order[1:], strict=False):
            assert (pd_done[a] <= pd_done[b]).all(), (a, b)
        assert (pd_done.destination_activated_ms <= pd_done.source_released_ms).all()
    pd.testing.assert_frame_equal(fast.requests, step.requests)
    pd.testing.assert_frame_equal(fast.passes, step.passes)
    pd.testing.assert_frame_equal(fast.transfers, step.transfers)
