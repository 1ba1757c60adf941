"""The SGLang engine, pinned on small traces with closed-form times.

Pages of one token, trace blocks of 16 tokens, fixed timing: a pass with prefill costs 10 ms,
a decode-only pass 2 ms (an SGLang pass is one or the other).
"""

from __future__ import annotations

import pytest

from servesim import simulate
from servesim.engine.sglang import RETRACT_DECODE_STEPS

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def run(config, trace, rows, engine=None, **sections):
    sections.setdefault("topology", {"num_workers": 1})
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 16},
        engine={"kind": "sglang", "block_size": 1, "num_gpu_blocks": 4000, **(engine or {})},
        timing=FIXED,
        **sections,
    )
    return simulate(cfg)


def row(t, n_in, n_out, ids):
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def by_arrival(result):
    return result.requests.sort_values(["arrival_ms", "request_id"]).reset_index(drop=True)


def test_a_prefill_pass_pauses_decoding(config, trace):
    """A decodes from 10 ms; B arrives at 13 ms: the pass from 14 ms prefills B alone (A emits
    nothing in it), so A's gap spans 2 + 10 ms and B's first token is at 24 ms."""
    r = by_arrival(run(config, trace, [row(0, 16, 6, [1]), row(13, 16, 3, [2])]))
    assert list(r.first_token_ms) == [10.0, 24.0]
    # A: tokens at 10, 12, 14, then B's prefill pass 14-24, then A and B decode together
    assert r.terminal_ms[0] == 14 + 10 + 3 * 2
    assert r.terminal_ms[1] == 24 + 2 * 2


def retraction_rows():
    """A and B: 10 + 12 tokens each (B 11 ms later) in a pool of 42 pages: at 40 ms they need a
    page each and one is free."""
    return [row(0, 10, 12, [1]), row(11, 10, 12, [11])]


def test_a_retraction_takes_the_least_decoded_and_requeues_it(config, trace):
    """B, with fewer tokens decoded, is retracted at the 40 ms pass (A finishes at its end);
    it is admitted again at 42 ms with 19 of its 20 tokens cached (a 1-token prefill pass)."""
    r = by_arrival(run(config, trace, retraction_rows(), {"num_gpu_blocks": 42}))
    assert list(r.n_preemptions) == [0, 1]
    assert r.terminal_ms[0] == 42.0
    assert r.n_readmissions[1] == 1
    assert r.terminal_ms[1] == 42 + 10 + 2  # its recompute pass, then its last decode step


def test_after_a_retraction_the_ratio_is_re_estimated_from_the_survivors():
    """min(1, (decoded + 20 x survivors) / (their outputs + 1)): one survivor that decoded 11
    of 12 tokens gives (11 + 20) / 13, capped at 1; two that decoded 100 of 1,000 give
    (200 + 40) / 2,001."""
    assert RETRACT_DECODE_STEPS == 20
    assert min(1.0, (11 + 20) / 13) == 1.0
    assert min(1.0, (200 + 2 * 20) / 2001) == pytest.approx(0.11994, rel=1e-4)


def test_retracted_requests_go_behind_the_queue(config, trace):
    """B is retracted at 40 ms while C and D (4 + 2 tokens each) wait: with two seats, C and D
    are admitted at 42 ms and B, at the back of the queue, after them (at 52 ms)."""
    rows = [*retraction_rows(), row(30, 4, 2, [21]), row(31, 4, 2, [22])]
    r = by_arrival(run(config, trace, rows, {"num_gpu_blocks": 42, "max_num_seqs": 2}))
    b, c, d = r.iloc[1], r.iloc[2], r.iloc[3]
    assert b.n_preemptions == 1
    assert c.first_admit_ms == d.first_admit_ms == 42.0
    assert c.first_token_ms == d.first_token_ms == 52.0
    assert b.terminal_ms > d.terminal_ms


def test_pd_prefill_starts_once_the_decode_rank_has_reserved(config, trace):
    """1P1D, a decode pool of 40 pages: A (20 + 15) and B (15 + 5) reserve at arrival; C (20 +
    5) cannot until the decode pass at 16 ms retracts A (the least decoded, on ties the
    earliest) and frees its pages, so its prefill starts then. The same times as the mocker."""
    rows = [row(0, 20, 15, [1, 2]), row(0, 15, 5, [3]), row(1, 20, 5, [4, 5])]
    r = by_arrival(
        run(
            config,
            trace,
            rows,
            topology={
                "kind": "disagg",
                "num_prefill_workers": 1,
                "num_decode_workers": 1,
                "decode": {"num_gpu_blocks": 40},
            },
        )
    )
    c = r.iloc[2]
    assert r.n_preemptions[0] == 1
    assert c.prefill_admit_ms == c.destination_reserved_ms == 16.0
    assert c.source_held_ms == 26.0  # one 10 ms prefill pass
    assert (r.terminal_status == "completed").all()
