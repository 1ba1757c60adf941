"""Prefill/decode disaggregation: the handoff's order and times in closed form (fixed timing:
10 ms per pass with prefill work, 1 ms per pass with decode work), reservations, routing."""

from __future__ import annotations

import pytest

from servesim import simulate
from servesim.config import ConfigError

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
LIFECYCLE = [
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "first_token_ms",
    "last_token_ms",
]


def row(t, n_in, n_out, ids):
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def ids(start, n_tokens):
    return list(range(start, start + -(-n_tokens // 64)))


def run(config, trace, rows, link=None, p=1, d=1, prefill=None, decode=None, **extra):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        topology={
            "kind": "disagg",
            "num_prefill_workers": p,
            "num_decode_workers": d,
            "prefill": prefill or {},
            "decode": decode or {},
        },
        link=link or {},
        **extra,
    )
    return simulate(cfg)


def lifecycle(result, i=0):
    return [float(result.requests.iloc[i][c]) for c in LIFECYCLE]


def test_lone_request_handoff_in_order(config, trace):
    """Prefill (10) -> source held -> reserved -> activated -> released all at 10 with an
    instant link; the decode side makes every token, one pass each: 11, 12, ... 15."""
    r = run(config, trace, [row(0, 1000, 5, ids(0, 1000))])
    assert lifecycle(r) == [0, 10, 10, 10, 10, 10, 11, 15]
    req = r.requests.iloc[0]
    assert req.ttft_ms == 11 and req.output_length == 5 and req.tpot_ms == 1
    assert (req.prefill_worker_idx, req.decode_worker_idx) == (0, 0)
    passes = r.passes
    assert list(passes.role) == ["prefill"] + ["decode"] * 5
    assert (passes[passes.role == "prefill"].decode_seqs == 0).all()


def test_transfer_time_is_tokens_times_bytes_over_bandwidth(config, trace):
    """1000 tokens x 131,072 B at 1 GB/s = 131.072 ms between reservation and activation (the
    mocker's value); TTFT = prefill + transfer + one decode pass."""
    r = run(config, trace, [row(0, 1000, 5, ids(0, 1000))], link={"bandwidth_gbps": 1.0})
    assert lifecycle(r) == pytest.approx([0, 10, 10, 141.072, 141.072, 141.072, 142.072, 146.072])
    t = r.transfers.iloc[0]
    assert (t.bytes, t.tokens, t.start_ms, t.end_ms) == (131_072_000, 1000, 10.0, 141.072)
    assert t.link == "link.p0-d0"


def test_latency_adds_to_each_transfer(config, trace):
    r = run(
        config,
        trace,
        [row(0, 1000, 1, ids(0, 1000))],
        link={"bandwidth_gbps": 1.0, "latency_ms": 2.0},
    )
    assert r.requests.iloc[0].destination_activated_ms == pytest.approx(143.072)


def test_held_source_kv_blocks_prefill_admission(config, trace):
    """The prefill copy's KV stays active until its source is released (at activation): a
    second prompt that does not fit beside it waits. Prefill pool 20 blocks; A = 16 blocks,
    transfer 100 ms; B (8 blocks) arrives at 1 and is admitted when A's source is released."""
    rows = [row(0, 1000, 1, ids(0, 1000)), row(1, 512, 1, ids(100, 512))]
    r = run(
        config,
        trace,
        rows,
        link={"bandwidth_gbps": 1.0, "kv_bytes_per_token": 100_000},
        prefill={"num_gpu_blocks": 20},
    )
    a, b = r.requests.iloc[0], r.requests.iloc[1]
    assert (a.source_held_ms, a.destination_activated_ms, a.source_released_ms) == (10, 110, 110)
    assert b.prefill_admit_ms == 110 and b.source_held_ms == 120


def test_a_full_decode_pool_queues_reservations(config, trace):
    """Decode pool 20 blocks: A (16) is reserved at once; B (8) waits at the head of the
    decode rank's queue until A completes (13) and frees its blocks; then it is reserved."""
    rows = [row(0, 1000, 3, ids(0, 1000)), row(0, 512, 2, ids(100, 512))]
    r = run(config, trace, rows, decode={"num_gpu_blocks": 20})
    a, b = r.requests.iloc[0], r.requests.iloc[1]
    assert a.destination_reserved_ms == 10 and a.last_token_ms == 13
    assert b.source_held_ms == 10
    assert b.destination_reserved_ms == 13 and b.first_token_ms == 14


def test_destination_missing_charges_only_what_the_decode_side_lacks(config, trace):
    """The second copy of a prompt finds all its blocks resident on the decode worker (cached
    after the first finished, at 145): nothing to move. full_prompt moves all 1024 tokens
    again. (Blocks still in transfer do not count: see the next test.)"""
    rows = [row(0, 1024, 1, ids(0, 1024)), row(300, 1024, 1, ids(0, 1024))]
    link = {"bandwidth_gbps": 1.0, "timing_mode": "destination_missing"}
    r = run(config, trace, rows, link=link)
    assert list(r.requests.transfer_tokens) == [1024, 0]
    second = r.requests.iloc[1]
    assert second.destination_activated_ms == second.destination_reserved_ms
    full = run(config, trace, rows, link={"bandwidth_gbps": 1.0})
    assert list(full.requests.transfer_tokens) == [1024, 1024]


def test_blocks_still_in_transfer_are_not_resident(config, trace):
    """The same prompt reserved while the first copy is still in transfer (134 ms) finds
    nothing registered on the decode side yet: it moves everything."""
    rows = [row(0, 1024, 1, ids(0, 1024)), row(100, 1024, 1, ids(0, 1024))]
    link = {"bandwidth_gbps": 1.0, "timing_mode": "destination_missing"}
    r = run(config, trace, rows, link=link)
    assert list(r.requests.transfer_tokens) == [1024, 1024]


def test_zero_output_request_ends_at_activation(config, trace):
    r = run(config, trace, [row(0, 1000, 0, ids(0, 1000))], link={"bandwidth_gbps": 1.0})
    req = r.requests.iloc[0]
    assert req.terminal_status == "completed" and req.output_length == 0
    assert req.terminal_ms == req.destination_activated_ms == pytest.approx(141.072)
    assert len(r.passes[r.passes.role == "decode"]) == 0


def test_zero_output_request_on_a_busy_decode_worker_joins_its_next_pass(config, trace):
    """A decodes 40 tokens from 11 (passes 10-11, 11-12, ...). B (output 0) is prefilled
    10-20 and delivered at 20, between A's passes: it joins the pass 20-21 at no cost and ends
    at its end, as Dynamo's replay does."""
    rows = [row(0, 100, 40, ids(0, 100)), row(10, 100, 0, ids(100, 100))]
    r = run(config, trace, rows)
    b = r.requests.iloc[1]
    assert (b.destination_activated_ms, b.decode_admit_ms, b.terminal_ms) == (20, 20, 21)
    assert b.terminal_status == "completed" and b.output_length == 0
    decode = r.passes[r.passes.role == "decode"]
    assert (decode.end_ms - decode.start_ms == 1).all()  # B added no time


def test_prefill_worker_with_work_starts_its_next_pass_before_arrivals(config, trace):
    """A is prefilled 0-10; B (arrived 5) waits. C arrives at exactly 10, when A's pass ends:
    the prefill worker starts B's pass at 10 before C arrives, so C waits for 20-30. The
    same trace on an aggregated worker admits C at 10 with B."""
    rows = [row(0, 100, 1, ids(0, 100)), row(5, 100, 1, ids(100, 100))]
    rows.append(row(10, 100, 1, ids(200, 100)))
    r = run(config, trace, rows)
    assert list(r.requests.prefill_admit_ms) == [0, 10, 20]
    agg = simulate(
        config(
            workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
            timing=FIXED,
            topology={"num_workers": 1},
        )
    )
    assert list(agg.requests.first_admit_ms) == [0, 10, 10]


@pytest.mark.parametrize("contention", ["per_request", "fifo_lanes", "shared"])
def test_source_release_at_a_prefill_pass_end_is_not_deferred(config, trace, contention):
    """A's 100 MB transfer (1 GB/s, 10-110) lands at 110, the end of B's prefill pass (100-110)
    while C (arrived 105) waits: A's source is released at 110, in the transfer phase, before
    the prefill worker starts C's pass at that instant, whatever the link's contention model."""
    rows = [row(0, 100, 3, ids(0, 100)), row(100, 100, 3, ids(100, 100))]
    rows.append(row(105, 100, 3, ids(200, 100)))
    link = {"bandwidth_gbps": 1.0, "kv_bytes_per_token": 1_000_000, "contention": contention}
    r = run(config, trace, rows, link=link)
    a, c = r.requests.iloc[0], r.requests.iloc[2]
    assert (a.destination_activated_ms, a.source_released_ms) == (110, 110)
    assert c.prefill_admit_ms == 110


def test_a_prompt_no_decode_pool_can_hold_is_rejected(config, trace):
    """It fits the prefill pool but not a decode worker's: rejected at source held with a
    reason; its held prefill KV is given back; nothing is lost."""
    rows = [row(0, 1000, 2, ids(0, 1000)), row(0, 200, 2, ids(100, 200))]
    r = run(config, trace, rows, decode={"num_gpu_blocks": 8})
    req = r.requests
    assert list(req.terminal_status) == ["rejected", "completed"]
    assert "decode worker" in req.iloc[0].reason
    assert r.kv[r.kv.pool == "cluster.p0"].iloc[-1].used_blocks == 0
    assert r.summary["completed_requests"] + r.summary["rejected_requests"] == 2


def test_each_role_has_its_own_step_time(config, trace):
    """decode speedup_ratio 2 halves the decode passes only (1 -> 0.5 ms); prefill stays 10."""
    r = run(config, trace, [row(0, 1000, 5, ids(0, 1000))], decode={"speedup_ratio": 2.0})
    assert lifecycle(r)[-2:] == [10.5, 12.5]
    p = r.passes
    assert list(p.end_ms - p.start_ms) == [10.0] + [0.5] * 5


def test_roles_block_size_cuts_the_prompt_content(config, trace):
    """Both roles at block_size 32 (engine's stays 64): the trace's 64-token hash blocks
    become 32-token blocks, so a repeated 128-token prompt reuses 96 tokens (the last block is
    recomputed), as it would with engine.block_size=32."""
    rows = [row(0, 128, 1, [1, 2]), row(100, 128, 1, [1, 2])]
    roles = run(config, trace, rows, prefill={"block_size": 32}, decode={"block_size": 32})
    assert list(roles.requests.reused_input_tokens) == [0, 96]
    engine = run(config, trace, rows, engine={"block_size": 32})
    assert list(engine.requests.reused_input_tokens) == [0, 96]


def test_kv_events_name_their_pool(config, trace):
    """A 1000-token prompt stores its 15 full blocks on the prefill worker at its pass end
    (10) and again on the decode worker when its KV lands (10, after the prefill's)."""
    r = run(config, trace, [row(0, 1000, 2, ids(0, 1000))], output={"kv_events": True})
    ev = r.kv_events
    stored = ev[ev.kind == "stored"]
    assert list(stored.groupby("pool", sort=False).size().items()) == [
        ("cluster.p0", 15),
        ("cluster.d0", 15),
    ]
    assert (stored.t_ms == 10).all() and list(ev.event_id) == list(range(len(ev)))


def test_pools_route_round_robin_prefill_by_arrival_decode_by_prefill_finish(config, trace):
    """A (3 chunks, on p0) arrives first but finishes its prefill after B (on p1): B takes the
    first decode worker, A the second."""
    rows = [row(0, 20000, 1, ids(0, 20000)), row(0, 100, 1, ids(1000, 100))]
    r = run(config, trace, rows, p=2, d=2)
    req = r.requests
    assert list(req.prefill_worker_idx) == [0, 1]
    assert list(req.source_held_ms) == [30, 10]
    assert list(req.decode_worker_idx) == [1, 0]


def test_attention_dp_in_both_pools(config, trace):
    """Each pool rotates over its ranks worker-major. The prefill pool in arrival order; the
    decode pool in prefill-finish order, which within one lock-step pass is rank by rank
    (rank 0 finishes requests 0 and 2, then rank 1 requests 1 and 3)."""
    rows = [row(0, 100, 2, ids(64 * i, 100)) for i in range(4)]
    r = run(config, trace, rows, prefill={"dp_size": 2}, decode={"dp_size": 2})
    req = r.requests
    assert list(req.prefill_dp_rank) == [0, 1, 0, 1]
    assert list(req.dp_rank) == [0, 0, 1, 1]
    assert r.summary["prefill_gpus_per_worker"] == 2 and r.summary["decode_gpus_per_worker"] == 2


def test_pool_sizes_in_the_summary(config, trace):
    r = run(config, trace, [row(0, 100, 2, ids(0, 100))], p=2, d=3)
    s = r.summary
    assert s["prefill_worker_seconds"] == pytest.approx(2 * s["duration_ms"] / 1000)
    assert s["decode_worker_seconds"] == pytest.approx(3 * s["duration_ms"] / 1000)
    assert s["metadata"]["num_workers"] == 5


@pytest.mark.parametrize(
    "sections,path",
    [
        ({"topology": {"kind": "disagg", "decode": {"block_size": 32}}}, "block_size"),
        ({"topology": {"kind": "disagg", "num_prefill_workers": 0}}, "num_prefill_workers"),
        ({"link": {"bandwidth_gbps": 0}}, "link.bandwidth_gbps"),
        ({"link": {"bandwidth_gbps": -1.0}}, "link.bandwidth_gbps"),
        (
            {
                "topology": {"kind": "disagg", "decode": {"enable_prefix_caching": False}},
                "link": {"timing_mode": "destination_missing"},
            },
            "destination_missing",
        ),
        (
            {
                "topology": {"kind": "disagg", "num_decode_workers": 2},
                "link": {"pairs": [{"decode_workers": [2], "bandwidth_gbps": 450}]},
            },
            r"link.pairs\[0\].decode_workers: \[2\] out of range",
        ),
    ],
)
def test_bad_disagg_configs_name_their_fields(config, sections, path):
    with pytest.raises(ConfigError, match=path):
        config(**sections)
