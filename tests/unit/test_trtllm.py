"""The TRT-LLM engine (guaranteed_no_evict), pinned on small traces with closed-form times.

Blocks of 32 tokens, trace blocks of 32 tokens, fixed timing: a pass with prefill costs
10 ms, one with decode 2 ms more. A pool of 10 blocks holds 320 tokens.
"""

from __future__ import annotations

import re
from pathlib import Path

from servesim import simulate

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def engine(kind: str = "trtllm", **changes):
    out = {"kind": kind, "block_size": 32, "num_gpu_blocks": 10, **changes}
    if kind == "trtllm":
        out["capacity_scheduler_policy"] = "guaranteed_no_evict"
    return out


def run(config, trace, rows, eng=None, **sections):
    sections.setdefault("topology", {"num_workers": 1})
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 32},
        engine=eng or engine(),
        timing=FIXED,
        **sections,
    )
    return simulate(cfg)


def row(t, n_in, n_out, ids):
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def uniq(start, n):
    return list(range(start, start + n))


def by_arrival(result):
    return result.requests.sort_values(["arrival_ms", "request_id"]).reset_index(drop=True)


# A: 100 + 100 tokens, 7 blocks to completion; it holds 4 after its prefill (and 4 until
# token 128), so 10 - 4 - 3 = 3 blocks are left beside its reservation.
A = row(0, 100, 100, uniq(1, 4))
A_END = 10 + 99 * 2  # prefill pass, then 99 decode passes


def test_a_request_waits_until_its_whole_footprint_fits(config, trace):
    """B (64 + 60 tokens: 4 blocks) fits the free blocks but not beside A's reservation: it
    is admitted when A ends. vLLM, which asks only for B's prompt blocks, runs both at once."""
    rows = [A, row(1, 64, 60, uniq(11, 2))]
    r = by_arrival(run(config, trace, rows))
    assert r.first_admit_ms[1] == A_END == 208
    assert r.first_token_ms[1] == A_END + 10
    assert r.terminal_ms[1] == A_END + 10 + 59 * 2
    vllm = by_arrival(run(config, trace, rows, engine("vllm")))
    assert vllm.first_admit_ms[1] == 10  # at the first pass boundary after its arrival


def test_a_footprint_that_fits_beside_the_reservations_goes_at_once(config, trace):
    """B (64 + 30 tokens: 3 blocks) fits exactly beside A's 3 promised blocks."""
    r = by_arrival(run(config, trace, [A, row(0, 64, 30, uniq(11, 2))]))
    assert list(r.first_admit_ms) == [0, 0]
    assert r.terminal_ms[1] == 10 + 29 * 2


def test_nothing_is_preempted_where_vllm_preempts(config, trace):
    """On 8 blocks vLLM admits both and preempts B when A's decode needs a block; TRT-LLM
    keeps B waiting for A's end instead, and no request is ever preempted."""
    rows = [A, row(0, 64, 60, uniq(11, 2))]
    small = engine(num_gpu_blocks=8)
    r = run(config, trace, rows, small)
    assert r.summary["n_preemptions"] == 0
    assert (r.requests.n_preemptions == 0).all()
    b = by_arrival(r).iloc[1]
    assert b.first_admit_ms == A_END
    assert b.terminal_ms == A_END + 10 + 59 * 2
    assert run(config, trace, rows, engine("vllm", num_gpu_blocks=8)).summary["n_preemptions"] > 0


def test_outputs_are_clamped_to_what_the_pool_holds(config, trace):
    """prompt + output fits 320 tokens: 200 + 500 runs 120 tokens, 319 + 10 runs 1; the
    requested length stays the trace's."""
    rows = [row(0, 200, 500, uniq(1, 7)), row(1000, 319, 10, uniq(20, 10))]
    r = by_arrival(run(config, trace, rows))
    assert list(r.output_length) == [120, 1]
    assert list(r.requested_output_length) == [500, 10]
    assert r.terminal_ms[0] == 10 + 119 * 2
    assert r.terminal_ms[1] == 1000 + 10


def test_a_prompt_of_the_whole_pool_is_rejected_at_the_head_of_the_queue(config, trace):
    """A 320-token prompt leaves no room for a token. It is rejected when it reaches the head
    of the queue (behind B, which waits for A), at the end of that pass, not on arrival."""
    rows = [A, row(1, 64, 60, uniq(11, 2)), row(2, 320, 5, uniq(20, 10))]
    r = by_arrival(run(config, trace, rows))
    assert r.terminal_status[2] == "rejected"
    assert "leaves no room for output" in r.reason[2]
    assert r.terminal_ms[2] == A_END + 10  # B's prefill pass, in which it is looked at


def test_max_model_len_clamps_outputs_and_footprints(config, trace):
    """max_model_len 150: 100 + 100 runs 50 tokens and 64 + 100 runs 86, so each reserves 5
    blocks and both fit at once; a 150-token prompt is rejected."""
    rows = [A, row(0, 64, 100, uniq(11, 2)), row(0, 150, 5, uniq(20, 5))]
    r = by_arrival(run(config, trace, rows, engine(max_model_len=150)))
    assert list(r.output_length) == [50, 86, 0]
    assert list(r.first_admit_ms[:2]) == [0, 0]
    assert r.terminal_status[2] == "rejected"


def test_an_active_cached_prefix_is_not_counted_in_the_footprint(config, trace):
    """A (96 + 100: 7 blocks) runs. B (128 + 60: 6 blocks) shares A's 3 prompt blocks, which
    are active: it needs 3 more, exactly what is left, and goes at once; C (same size, no
    shared prefix) waits for A, whose passes B's prefill lengthened once."""
    rows = [
        row(0, 96, 100, [1, 2, 3]),
        row(20, 128, 60, [1, 2, 3, 4]),
        row(21, 128, 60, [9, 2, 3, 4]),
    ]
    r = by_arrival(run(config, trace, rows))
    assert r.reused_input_tokens[1] == 96
    assert r.first_admit_ms[1] == 20
    assert r.first_admit_ms[2] == r.terminal_ms[0] == 10 + 99 * 2 + 10


def test_a_whole_prompt_can_be_a_prefix_hit(config, trace):
    """The last prompt token is not recomputed: a repeated 64-token prompt reuses all 64 and
    its first token is a decode step (2 ms); with output 0 it ends on arrival."""
    rows = [row(0, 64, 3, [1, 2]), row(100, 64, 3, [1, 2]), row(200, 64, 0, [1, 2])]
    r = by_arrival(run(config, trace, rows))
    assert list(r.reused_input_tokens) == [0, 64, 64]
    assert r.first_token_ms[1] == 102
    assert r.terminal_ms[2] == 200


def pd(decode_blocks: int, bandwidth_gbps: float | None = None, **link_changes):
    link = {"kv_bytes_per_token": 1_000_000, **link_changes}
    if bandwidth_gbps is not None:
        link["bandwidth_gbps"] = bandwidth_gbps
    return {
        "topology": {
            "kind": "disagg",
            "num_prefill_workers": 1,
            "num_decode_workers": 1,
            "decode": {"num_gpu_blocks": decode_blocks},
        },
        "link": link,
    }


def test_a_decode_reservation_counts_the_tails_promised_to_reserved_requests(config, trace):
    """P/D, a decode pool of 12 blocks, 1 MB a token at 1 GB/s (1 ms a token). A (7 blocks to
    completion) and B (64 + 30: 3) reserve at 10; C (64 + 60: 4) finds 12 - 4 - 2 = 6 free
    blocks, but 3 + 1 of them are promised to A and B: it reserves when B ends."""
    rows = [A, row(0, 64, 30, uniq(11, 2)), row(0, 64, 60, uniq(21, 2))]
    r = by_arrival(run(config, trace, rows, engine(num_gpu_blocks=200), **pd(12, 1.0)))
    b_end = 10 + 64 + 2 + 29 * 2  # transfer of 64 tokens, then 30 decode passes
    assert list(r.destination_reserved_ms[:2]) == [10, 10]
    assert r.terminal_ms[1] == b_end
    assert r.destination_reserved_ms[2] == b_end
    assert r.first_token_ms[2] == b_end + 64 + 2


def test_a_decode_reservation_reuses_no_resident_prefix(config, trace):
    """The decode rank takes fresh blocks for the whole prompt even when it holds it cached, so
    with link.timing_mode=destination_missing all 96 tokens still move (vLLM's decode rank
    pins the 3 cached blocks and nothing moves)."""
    rows = [row(0, 96, 3, [1, 2, 3]), row(500, 96, 3, [1, 2, 3])]
    link = pd(200, 1.0, timing_mode="destination_missing")
    trt = by_arrival(run(config, trace, rows, engine(num_gpu_blocks=200), **link))
    vllm = by_arrival(run(config, trace, rows, engine("vllm", num_gpu_blocks=200), **link))
    assert list(trt.transfer_tokens) == [96, 96]
    assert list(vllm.transfer_tokens) == [96, 0]


def test_a_prefill_worker_prices_no_decode(config, trace):
    """A prompt the prefill worker holds whole yields the prefill copy's token at no cost: its
    source is held at its arrival."""
    rows = [row(0, 96, 3, [1, 2, 3]), row(50, 96, 3, [1, 2, 3])]
    r = by_arrival(run(config, trace, rows, engine(num_gpu_blocks=200), **pd(200)))
    assert r.reused_input_tokens[1] == 96
    assert r.source_held_ms[1] == 50


def test_the_docs_scenario_prints_what_the_docs_show(capsys):
    """docs/schedulers.md#trt-llm: its script, run as written, prints the pass history shown
    under it."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "schedulers.md").read_text()
    start = doc.index("\n## TRT-LLM")
    end = doc.find("\n## ", start + 1)
    section = doc[start : end if end >= 0 else len(doc)]
    ((code, shown),) = re.findall(r"```py\n(.*?)```\n\n```\n(.*?)```", section, re.S)
    exec(compile(code, "docs/schedulers.md", "exec"), {})
    assert capsys.readouterr().out == shown
