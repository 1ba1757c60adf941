"""The vLLM scheduler and worker pass loop, pinned on small traces with closed-form times."""

from __future__ import annotations

import tracemalloc

import pytest

from servesim import simulate

FIXED = {"kind": "fixed", "prefill_ms": 50.0, "decode_ms": 10.0}


def p(t: float) -> float:
    return round(4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142, 6)


def run(config, trace, rows, engine=None, timing=None, workers=1, **extra):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        engine=engine or {},
        timing=timing or FIXED,
        topology={"num_workers": workers},
        **extra,
    )
    return simulate(cfg)


def row(t, n_in, n_out, ids):
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def uniq(start, n):
    return list(range(start, start + n))


def test_mixed_passes_and_chunked_prefill(config, trace):
    """AISimulate's published vLLM trace: decode and prefill chunks share a pass lasting
    prefill_ms + decode_ms; a 20,000-token prompt takes three 8192-token chunks."""
    r = run(
        config,
        trace,
        [
            row(0, 100, 20, uniq(0, 2)),
            row(55, 100, 5, uniq(10, 2)),
            row(56, 20000, 3, uniq(20, 313)),
        ],
    ).requests.set_index("request_id")
    assert r.loc["1", "first_token_ms"] == 50
    assert r.loc["2", "first_admit_ms"] == 60, "an arrival mid-pass waits for the pass boundary"
    assert r.loc["2", "first_token_ms"] == 120
    assert r.loc["3", "first_token_ms"] == 240
    assert r.loc["1", "last_token_ms"] == 390


def test_lone_request_polynomial_matches_mocker(config, trace):
    """TTFT = P(1000); each later token costs D(u) with u = sequence length / KV tokens."""
    r = run(config, trace, [row(1000, 1000, 5, uniq(0, 16))], timing={"kind": "polynomial"})
    req = r.requests.iloc[0]
    assert req.arrival_ms == 0.0, "the first arrival is at time 0"
    assert req.ttft_ms == pytest.approx(32.105859, abs=1e-9)
    assert req.e2e_latency_ms == pytest.approx(55.272311, abs=1e-9)  # mocker's record


def test_arrival_at_a_pass_end_joins_the_next_pass(config, trace):
    """Pass completions come before arrivals at the same instant, and passes start last."""
    r = run(config, trace, [row(0, 100, 3, uniq(0, 2)), row(50, 100, 2, uniq(10, 2))])
    second = r.requests.iloc[1]
    assert second.first_admit_ms == 50
    assert second.first_token_ms == 50 + 50 + 10  # mixed pass: its prefill + r0's decode


def test_prefix_reuse_recomputes_the_last_token(config, trace):
    """A repeated 1000-token prompt reuses floor(999/64)*64 = 960 tokens; a 1024-token one also
    960; a zero-output request may reuse all 1024 and completes with no work."""
    ids = uniq(0, 16)
    rows = [
        row(0, 1000, 2, ids),
        row(1000, 1000, 2, ids),
        row(2000, 1024, 2, ids),
        row(3000, 1024, 0, ids),
    ]
    r = run(config, trace, rows).requests
    assert list(r.reused_input_tokens) == [0, 960, 960, 1024]
    zero = r.iloc[3]
    assert zero.terminal_status == "completed" and zero.terminal_ms == zero.arrival_ms
    assert zero.output_length == 0 and zero.ttft_ms != zero.ttft_ms  # NaN: no token


def test_blocks_registered_at_allocation_are_shared_in_the_same_pass(config, trace):
    ids = uniq(0, 16)
    r = run(config, trace, [row(0, 1000, 2, ids), row(0, 1000, 2, ids)]).requests
    assert list(r.reused_input_tokens) == [0, 960]


def test_zero_output_request_frees_all_blocks(config, trace):
    r = run(config, trace, [row(0, 1000, 0, uniq(0, 16))])
    assert r.requests.iloc[0].terminal_ms == 50
    assert r.passes.iloc[0].decode_seqs == 0
    assert r.kv.iloc[-1].used_blocks == 0


def test_max_num_seqs_caps_the_running_set(config, trace):
    rows = [row(0, 64, 3, [i]) for i in range(3)]
    r = run(config, trace, rows, engine={"max_num_seqs": 2}).requests
    # two run together: prefill (50) then two decode passes (10 each)
    assert list(r.first_admit_ms) == [0, 0, 70]


def test_max_num_batched_tokens_chunks_and_limits_admission(config, trace):
    rows = [row(0, 100, 1, [1, 2]), row(0, 100, 1, [3, 4])]
    r = run(config, trace, rows, engine={"max_num_batched_tokens": 150}).requests
    # pass 1: all of r1 (100) + 50 of r2; pass 2: r2's other 50 tokens
    assert list(r.first_token_ms) == [50, 100]


def test_chunked_prefill_disabled_waits_for_a_whole_prompt(config, trace):
    rows = [row(0, 100, 1, [1, 2]), row(0, 100, 1, [3, 4])]
    r = run(
        config,
        trace,
        rows,
        engine={"max_num_batched_tokens": 150, "enable_chunked_prefill": False},
    ).requests
    assert list(r.first_token_ms) == [50, 100]
    assert list(r.first_admit_ms) == [0, 50]


def test_preemption_recomputes_and_keeps_emitted_tokens(config, trace):
    """Two requests that together outgrow 4 blocks of 16: LIFO preempts the newer one; it
    restarts from scratch (recompute) and still emits exactly its output length."""
    rows = [row(0, 30, 20, [1]), row(0, 30, 20, [2])]
    r = run(
        config,
        trace,
        rows,
        engine={"num_gpu_blocks": 5, "block_size": 16, "enable_prefix_caching": False},
    )
    req = r.requests
    assert list(req.terminal_status) == ["completed", "completed"]
    assert list(req.output_length) == [20, 20]
    assert list(req.n_preemptions) == [0, 1], "lifo: the newest running request is the victim"
    assert r.summary["n_preemptions"] == 1


def test_fifo_preemption_takes_the_oldest(config, trace):
    rows = [row(0, 30, 20, [1]), row(0, 30, 20, [2])]
    r = run(
        config,
        trace,
        rows,
        engine={
            "num_gpu_blocks": 5,
            "block_size": 16,
            "enable_prefix_caching": False,
            "preemption_mode": "fifo",
        },
    )
    assert list(r.requests.n_preemptions) == [1, 0]


def test_requests_that_can_never_fit_are_rejected_with_a_reason(config, trace):
    rows = [row(0, 500, 2, uniq(0, 8)), row(0, 100, 2, [50, 51]), row(0, 2000, 2, uniq(60, 32))]
    r = run(config, trace, rows, engine={"num_gpu_blocks": 20, "max_model_len": 1000})
    req = r.requests
    assert list(req.terminal_status) == ["completed", "completed", "rejected"]
    assert "max_model_len" in req.iloc[2].reason
    r = run(config, trace, rows[:2], engine={"num_gpu_blocks": 4})
    assert list(r.requests.terminal_status) == ["rejected", "completed"]
    assert "KV blocks" in r.requests.iloc[0].reason
    s = r.summary
    assert s["completed_requests"] + s["rejected_requests"] + s["incomplete_requests"] == 2


@pytest.mark.parametrize("fast_forward", [True, False])
def test_any_output_length_runs_in_memory_bounded_by_the_pool(config, trace, fast_forward):
    """An output far beyond what the pool holds decodes until its sequence outgrows the pool
    and is then rejected with the reason; fast-forward plans at most a pool's worth of block
    allocations however long the outputs (it once listed one per future block: 1e9 tokens
    took 1.75 GB)."""
    tracemalloc.start()
    try:
        r = run(
            config,
            trace,
            [row(0, 100, 10**8, [1, 2]), row(0, 100, 10**11, [3, 4])],
            engine={"num_gpu_blocks": 128},
            speed={"fast_forward": fast_forward},
        )
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    req = r.requests
    assert list(req.terminal_status) == ["rejected", "rejected"]
    # each ran until its sequence needed one block more than the pool has
    assert all("needs 129 KV blocks; the pool holds 128" in reason for reason in req.reason)
    assert list(req.output_length) == [128 * 64 - 100 + 1] * 2
    assert peak_mb < 30, f"{peak_mb:.0f} MB"


def test_max_model_len_stops_generation(config, trace):
    r = run(config, trace, [row(0, 100, 50, [1, 2])], engine={"max_model_len": 110})
    req = r.requests.iloc[0]
    assert req.terminal_status == "completed" and req.output_length == 10


def test_max_virtual_time_is_a_soft_cutoff(config, trace):
    rows = [row(0, 100, 5, [1, 2]), row(60, 100, 50, [3, 4]), row(10_000, 100, 2, [5, 6])]
    r = run(config, trace, rows, stop={"max_virtual_time_ms": 200.0})
    req = r.requests
    assert list(req.terminal_status) == ["completed", "incomplete", "incomplete"]
    assert req.iloc[2].reason.startswith("not arrived")
    assert r.summary["num_requests"] == 2, "num_requests counts arrived requests (Dynamo)"
    assert r.summary["terminal_status_counts"] == {"completed": 1, "incomplete": 2}


def test_round_robin_and_random_routing(config, trace):
    rows = [row(0, 64, 1, [i]) for i in range(6)]
    rr = run(config, trace, rows, workers=3).requests
    assert list(rr.decode_worker_idx) == [0, 1, 2, 0, 1, 2]
    a = run(config, trace, rows, workers=3, router={"kind": "random"}, seed=1).requests
    b = run(config, trace, rows, workers=3, router={"kind": "random"}, seed=1).requests
    assert list(a.decode_worker_idx) == list(b.decode_worker_idx)
