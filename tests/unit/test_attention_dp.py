"""Attention data parallelism: ranks with their own scheduler and KV pool, in lock-step."""

from __future__ import annotations

import pytest

from servesim import simulate

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def row(t, n_in, n_out, ids):
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def run(config, trace, rows, workers=1, dp=2, **engine):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        engine={"dp_size": dp, **engine},
        timing=FIXED,
        topology={"num_workers": workers},
    )
    return simulate(cfg)


def test_round_robin_places_on_workers_then_each_workers_ranks(config, trace):
    """Request k goes to worker k mod W; each worker hands its requests to its ranks in turn."""
    rows = [row(0, 64, 1, [i]) for i in range(8)]
    r = run(config, trace, rows, workers=2).requests
    placed = list(zip(r.decode_worker_idx, r.dp_rank, strict=True))
    assert placed == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0), (1, 0), (0, 1), (1, 1)]


def test_ranks_run_in_lock_step(config, trace):
    """A pass lasts as long as the slowest rank: rank 0's decode token waits for rank 1's
    prefill. r0 (rank 0) decodes from t=10; r1 arrives at 11 on rank 1 and joins the pass at 12,
    which then lasts 10 ms (rank 1's prefill), not 2."""
    r = run(config, trace, [row(0, 100, 5, [1, 2]), row(11, 100, 1, [3, 4])])
    req = r.requests
    assert list(req.dp_rank) == [0, 1]
    assert req.first_token_ms.iloc[1] == 22.0
    assert req.last_token_ms.iloc[0] == 10 + 2 + 10 + 2 + 2  # tokens at 10, 12, 22, 24, 26
    passes = r.passes
    both = passes[passes.start_ms == 12.0]
    assert sorted(both.dp_rank) == [0, 1] and (both.end_ms == 22.0).all()


def test_each_rank_has_its_own_kv_pool(config, trace):
    """Ranks do not share prefix caches: the same prompt on the other rank reuses nothing;
    on the same rank it does; KV levels are reported per rank pool."""
    ids = list(range(16))
    rows = [row(0, 1000, 1, ids), row(100, 1000, 1, ids), row(200, 1000, 1, ids)]
    r = run(config, trace, rows)
    assert list(r.requests.dp_rank) == [0, 1, 0]
    assert list(r.requests.reused_input_tokens) == [0, 0, 960]
    assert set(r.kv.pool) == {"cluster.w0.r0", "cluster.w0.r1"}
    assert set(r.kv.dp_rank) == {0, 1}


def test_dp_pool_capacity_is_per_rank(config, trace):
    """num_gpu_blocks is per rank: two 10-block prompts fit a 12-block pool only when they go
    to different ranks."""
    rows = [row(0, 640, 1, list(range(10))), row(0, 640, 1, list(range(10, 20)))]
    r = run(config, trace, rows, num_gpu_blocks=12)
    assert list(r.requests.first_token_ms) == [10.0, 10.0]
    single = run(config, trace, rows, dp=1, num_gpu_blocks=12).requests
    assert list(single.first_token_ms) == [10.0, 20.0]


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_summary_counts_gpus_per_worker(config, trace, dp):
    r = run(config, trace, [row(0, 64, 2, [1])], dp=dp, tp_size=2)
    assert r.summary["decode_gpus_per_worker"] == 2 * dp
