"""Golden cases of the TRT-LLM engine (`engine=trtllm`: guaranteed_no_evict on vLLM's passes),
each pinning one rule of the mocker's `trtllm` backend (ai-dynamo-runtime 1.6.1).

Loaded by make_fixtures.py (`cases(Case, ENGINES)`); the traces are made here from fixed seeds
or by hand. Breaking the rule a case names makes it fail (tests/golden/mocker/README.md).
"""

from __future__ import annotations

import random
from typing import Any

Row = dict[str, Any]
FIXED_10_2 = {"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}}
FIXED_10_2_OVERRIDES = ("timing=fixed", "timing.prefill_ms=10.0", "timing.decode_ms=2.0")


def _row(t: int, prompt: int, output: int, hashes: list[int]) -> Row:
    return {"timestamp": t, "input_length": prompt, "output_length": output, "hash_ids": hashes}


def _ids(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def reservation_trace() -> list[Row]:
    """32-token trace blocks, a pool of 10 blocks. A (100 + 100 tokens: 7 blocks) runs; B (64 +
    60: 4 blocks) waits, as only 10 - 4 held - 3 A still lacks = 3 blocks are left; C (64 +
    30: 3 blocks, which would fit) waits behind B; later D (3 blocks) goes first and E (100 +
    150: 8 blocks) waits for D to finish."""
    return [
        _row(0, 100, 100, _ids(1, 4)),
        _row(1, 64, 60, _ids(11, 2)),
        _row(2, 64, 30, _ids(21, 2)),
        _row(600, 64, 30, _ids(31, 2)),
        _row(600, 100, 150, _ids(41, 4)),
    ]


def prefix_trace() -> list[Row]:
    """A pool of 10 x 32-token blocks. B shares A's 3-block prompt while A runs: that active
    prefix is not counted against B's footprint, so B goes at once (C, without it, waits for
    A); D reuses the same prefix once it is only cached (inactive: counted). Then whole-prompt
    hits: a 64-token prompt repeated (all 64 tokens reused, its first token a decode step), a
    0-output repeat (done at arrival) and an extension of it."""
    return [
        _row(0, 96, 100, [1, 2, 3]),
        _row(20, 128, 60, [1, 2, 3, 4]),
        _row(21, 128, 60, [9, 2, 3, 4]),
        _row(400, 128, 60, [1, 2, 3, 5]),
        _row(401, 100, 190, [7, 8, 10, 11]),
        _row(15000, 64, 3, [21, 22]),
        _row(15100, 64, 3, [21, 22]),
        _row(15200, 64, 0, [21, 22]),
        _row(15300, 70, 3, [21, 22, 23]),
    ]


def clamp_trace() -> list[Row]:
    """A pool of 10 x 32 = 320 tokens: outputs are clamped so prompt + output fits it (319 + 10
    runs 1 token, 200 + 500 runs 120), and a prompt of 320 tokens is rejected when it reaches
    the head of the queue (behind B, waiting for A's reservation), not on arrival."""
    return [
        _row(0, 100, 100, _ids(1, 4)),
        _row(1, 64, 60, _ids(11, 2)),
        _row(2, 320, 5, _ids(21, 10)),
        _row(3, 200, 500, _ids(41, 7)),
        _row(700, 319, 10, _ids(61, 10)),
        _row(701, 330, 5, _ids(81, 11)),
    ]


def model_len_trace() -> list[Row]:
    """max_model_len 150: outputs clamped to 150 - prompt (their footprints then fit together),
    prompts of 150 tokens or more rejected."""
    return [
        _row(0, 100, 100, _ids(1, 4)),
        _row(0, 150, 5, _ids(11, 5)),
        _row(0, 200, 5, _ids(21, 7)),
        _row(0, 64, 100, _ids(31, 2)),
        _row(300, 149, 5, _ids(41, 5)),
    ]


def tight_trace(seed: int, n: int, tbs: int, gap_ms: float, max_out: int) -> list[Row]:
    """Short prompts arriving fast enough to fill a small pool: 60 % extend one of 5 shared
    system prompts, the rest are unique."""
    rng = random.Random(seed)
    next_id = [0]

    def ids(k: int) -> list[int]:
        out = _ids(next_id[0], k)
        next_id[0] += k
        return out

    systems = [ids(rng.randint(2, 8)) for _ in range(5)]
    rows: list[Row] = []
    t = 0
    for _ in range(n):
        t += int(rng.expovariate(1 / gap_ms))
        if rng.random() < 0.6:
            hashes = rng.choice(systems) + ids(rng.randint(0, 8))
        else:
            hashes = ids(rng.randint(1, 18))
        cap = len(hashes) * tbs
        prompt = rng.randint(max(1, cap - tbs + 1), cap)
        rows.append(_row(t, prompt, rng.randint(1, max_out), hashes))
    return rows


def pd_tails_trace() -> list[Row]:
    """P/D, decode pool 12 x 32 tokens, slow link. A (7 blocks) and B (3) reserve on the decode
    rank; C (4) cannot while their transfers run, as the blocks A and B will still take once
    running (3 + 1) are promised to them: it reserves when B ends. Then a 0-output request and
    a prompt the prefill worker holds whole."""
    return [
        _row(0, 100, 100, _ids(1, 4)),
        _row(0, 64, 30, _ids(11, 2)),
        _row(0, 64, 60, _ids(21, 2)),
        _row(30, 64, 0, [1, 2]),
        _row(31, 96, 10, [1, 2, 3]),
    ]


def pd_whole_hit_trace() -> list[Row]:
    """P/D with fixed timing (prefill 10 ms, decode 3 ms): a prompt the prefill worker holds
    whole costs it nothing (its one token is free), alone and beside a prefill."""
    return [
        _row(0, 96, 100, [1, 2, 3]),
        _row(50, 96, 10, [1, 2, 3]),
        _row(60, 96, 10, [1, 2, 3]),
        _row(60, 64, 10, [7, 8]),
        _row(120, 96, 10, [1, 2, 3]),
        _row(121, 64, 10, [9, 10]),
    ]


def cases(Case: Any, ENGINES: dict[str, dict[str, Any]]) -> list[Any]:
    trt = ENGINES["trtllm"]
    small = {**trt, **FIXED_10_2, "num_gpu_blocks": 10}
    small_overrides = ("engine=trtllm", "engine.num_gpu_blocks=10", *FIXED_10_2_OVERRIDES)
    tight = {**trt, "num_gpu_blocks": 200, "block_size": 16, "max_num_batched_tokens": 256}
    tight_overrides = (
        "engine=trtllm",
        "engine.num_gpu_blocks=200",
        "engine.block_size=16",
        "engine.max_num_batched_tokens=256",
    )
    return [
        Case(
            "zt1_trtllm_admit_to_completion",
            "TRT-LLM, 10 x 32-token blocks, fixed 10 / 2 ms: a request is admitted only when its "
            "prompt + output fits beside what running requests still lack; FIFO (no skip-ahead)",
            reservation_trace,
            trace_block_size=32,
            engine=small,
            servesim_overrides=small_overrides,
        ),
        Case(
            "zt2_trtllm_no_preemption_tight_kv",
            "TRT-LLM, 200 x 16-token blocks, 256-token budget: 150 short requests that make vLLM "
            "preempt queue for their footprint instead; nothing is readmitted",
            lambda: tight_trace(seed=21, n=150, tbs=32, gap_ms=25.0, max_out=250),
            trace_block_size=32,
            engine=tight,
            servesim_overrides=tight_overrides,
        ),
        Case(
            "zt3_trtllm_prefix_hits",
            "TRT-LLM, 10 x 32-token blocks, polynomial timing: an active cached prefix is not "
            "counted in the footprint, an inactive one is; a whole prompt can be a hit",
            prefix_trace,
            trace_block_size=32,
            engine={**trt, "num_gpu_blocks": 10},
            servesim_overrides=("engine=trtllm", "engine.num_gpu_blocks=10"),
        ),
        Case(
            "zt4_trtllm_clamp_to_pool",
            "TRT-LLM, 10 x 32-token blocks, fixed 10 / 2 ms: outputs clamped so the sequence fits "
            "the pool; a prompt of the whole pool rejected at the head of the queue",
            clamp_trace,
            trace_block_size=32,
            engine=small,
            servesim_overrides=small_overrides,
        ),
        Case(
            "zt5_trtllm_max_model_len",
            "TRT-LLM, max_model_len 150, fixed 10 / 2 ms: outputs clamped to it (footprints "
            "too), prompts reaching it rejected",
            model_len_trace,
            trace_block_size=32,
            engine={**small, "max_model_len": 150},
            servesim_overrides=(*small_overrides, "engine.max_model_len=150"),
        ),
        Case(
            "zt6_trtllm_round_robin_4w",
            "TRT-LLM, 4 round-robin workers of 120 x 32-token blocks, polynomial timing: "
            "reservations and prefix reuse per worker",
            lambda: tight_trace(seed=22, n=200, tbs=64, gap_ms=12.0, max_out=600),
            num_workers=4,
            trace_block_size=64,
            engine={**trt, "num_gpu_blocks": 120},
            servesim_overrides=("engine=trtllm", "engine.num_gpu_blocks=120"),
        ),
        Case(
            "zt7_trtllm_pd_promised_tails",
            "TRT-LLM P/D 1P1D at 0.2 GB/s, decode pool 12 x 32 tokens, fixed 10 / 2 ms: a decode "
            "reservation needs the whole footprint beside the tails promised to reserved requests",
            pd_tails_trace,
            trace_block_size=32,
            engine={**trt, **FIXED_10_2},
            servesim_overrides=("engine=trtllm", *FIXED_10_2_OVERRIDES),
            pd=(1, 1),
            decode={"num_gpu_blocks": 12},
            bandwidth_gbps=0.2,
        ),
        Case(
            "zt8_trtllm_pd_tight_decode",
            "TRT-LLM P/D 2P2D at 25 GB/s, pools of 200 x 16 tokens, 256-token budget: decode "
            "reservations queue for their footprints, never a preemption",
            lambda: tight_trace(seed=23, n=150, tbs=32, gap_ms=25.0, max_out=250),
            trace_block_size=32,
            engine=tight,
            servesim_overrides=tight_overrides,
            pd=(2, 2),
            bandwidth_gbps=25.0,
        ),
        Case(
            "zt9_trtllm_pd_prefill_whole_hit",
            "TRT-LLM P/D 1P1D, fixed 10 / 3 ms: a prompt the prefill worker holds whole yields "
            "its token at no cost (no decode time on a prefill worker)",
            pd_whole_hit_trace,
            trace_block_size=32,
            engine={
                **trt,
                "timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 3.0},
            },
            servesim_overrides=(
                "engine=trtllm",
                "timing=fixed",
                "timing.prefill_ms=10.0",
                "timing.decode_ms=3.0",
            ),
            pd=(1, 1),
        ),
    ]
