"""Golden cases of the SGLang engine (`engine=sglang`: prefill-only or decode-only passes,
reserve-then-wait admission, retraction), each pinning one rule of the mocker's `sglang` backend
(ai-dynamo-runtime 1.6.1).

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


def prefill_first_trace() -> list[Row]:
    """64-token trace blocks. A decodes; B and C arrive together and are prefilled in one pass
    while A waits (no decode that pass); D shares A's first block: a hit of 63 tokens (one
    short of its whole prompt, the last token is recomputed); E, a 0-output request, ends at
    its prefill pass."""
    return [
        _row(0, 200, 10, _ids(1, 4)),
        _row(15, 100, 5, _ids(11, 2)),
        _row(15, 50, 3, [21]),
        _row(40, 64, 4, [1]),
        _row(41, 30, 0, [31]),
    ]


def reserve_trace() -> list[Row]:
    """A pool of 600 one-token pages. A (100 + 400) runs; B (200 + 300) waits while its prompt
    and output would not fit beside A's remaining output scaled by new_token_ratio; C (10 + 10)
    waits behind B (head-of-line), both admitted as A's remaining output and the ratio fall."""
    return [
        _row(0, 100, 400, _ids(1, 2)),
        _row(1, 200, 300, _ids(11, 4)),
        _row(2, 10, 10, [21]),
    ]


def chunk_trace() -> list[Row]:
    """chunked_prefill_size 64, max_prefill_tokens 128: A's 300-token prompt goes in 64-token
    chunks, each continuation at the head of the queue; B arrives mid-way and waits for A's
    last chunk; C fits beside B's."""
    return [
        _row(0, 300, 5, _ids(1, 5)),
        _row(12, 50, 5, [11]),
        _row(13, 40, 3, [21]),
    ]


def lpm_trace() -> list[Row]:
    """max_num_seqs 1: requests queue behind A. With lpm the waiting request with the longest
    cached prefix of A's prompt goes first (D, then B); C and E, with nothing cached, keep their
    arrival order."""
    return [
        _row(0, 256, 30, _ids(1, 4)),
        _row(1, 100, 3, [1, 41]),
        _row(2, 60, 3, [51]),
        _row(3, 250, 3, [1, 2, 3, 61]),
        _row(4, 60, 3, [71]),
    ]


def tight_trace(seed: int, n: int, tbs: int, gap_ms: float, max_out: int) -> list[Row]:
    """Prompts arriving fast enough to fill a small pool: 60 % extend one of 5 shared system
    prompts, the rest are unique."""
    rng = random.Random(seed)
    next_id = [0]

    def ids(k: int) -> list[int]:
        out = _ids(next_id[0], k)
        next_id[0] += k
        return out

    systems = [ids(rng.randint(1, 4)) for _ in range(5)]
    rows: list[Row] = []
    t = 0
    for _ in range(n):
        t += int(rng.expovariate(1 / gap_ms))
        if rng.random() < 0.6:
            hashes = rng.choice(systems) + ids(rng.randint(0, 4))
        else:
            hashes = ids(rng.randint(1, 8))
        cap = len(hashes) * tbs
        prompt = rng.randint(max(1, cap - tbs + 1), cap)
        rows.append(_row(t, prompt, rng.randint(1, max_out), hashes))
    return rows


def last_token_slot_trace() -> list[Row]:
    """A pool of 130 one-token pages. A (64 + 2) ends holding 66 cached pages (its prompt and
    both output tokens'). B (66 + 1) takes 66 pages, evicting A's two output pages; its only
    token is its last, so it takes no page for it (one more would evict A's last prompt page).
    C (128 + 1) then reuses A's whole first 64-token block."""
    return [
        _row(0, 64, 2, [1]),
        _row(20, 66, 1, [2, 4]),
        _row(40, 128, 1, [1, 3]),
    ]


def pd_trace() -> list[Row]:
    """P/D: decode pool of 500 one-token pages, a slow link. A (200 + 100) and B (100 + 50)
    reserve their decode pages as they arrive, before their prefills; C (150 + 20) cannot until
    A ends, so its prefill waits too (destination first). D (0 output) never needs a decode
    reservation."""
    return [
        _row(0, 200, 100, _ids(1, 4)),
        _row(0, 100, 50, _ids(11, 2)),
        _row(5, 150, 20, _ids(21, 3)),
        _row(6, 64, 0, _ids(31, 1)),
        _row(30, 64, 5, [1]),
    ]


def cases(Case: Any, ENGINES: dict[str, dict[str, Any]]) -> list[Any]:
    sg = ENGINES["sglang"]
    knobs = sg["sglang"]
    fixed = {**sg, **FIXED_10_2}
    fixed_overrides = ("engine=sglang", *FIXED_10_2_OVERRIDES)
    return [
        Case(
            "zg1_sglang_prefill_first",
            "SGLang, fixed 10 / 2 ms: a pass is prefill-only if anything waiting can be admitted "
            "(running requests skip it), else one decode step; a request's first token comes "
            "from its prefill pass; a prefix hit of whole pages short of the last token",
            prefill_first_trace,
            trace_block_size=64,
            engine=fixed,
            servesim_overrides=fixed_overrides,
        ),
        Case(
            "zg2_sglang_reserve_then_wait",
            "SGLang, 600 one-token pages, fixed 10 / 2 ms: admission keeps back each running "
            "request's remaining output x new_token_ratio (0.7, falling per pass); a request "
            "that does not fit waits, and blocks those behind it",
            reserve_trace,
            trace_block_size=64,
            engine={**fixed, "num_gpu_blocks": 600},
            servesim_overrides=(*fixed_overrides, "engine.num_gpu_blocks=600"),
        ),
        Case(
            "zg3_sglang_clip_max_new_tokens",
            "SGLang as zg2 with clip_max_new_tokens 64: the reserve counts at most 64 tokens of "
            "each request's output, so B and C get in far sooner",
            reserve_trace,
            trace_block_size=64,
            engine={
                **fixed,
                "num_gpu_blocks": 600,
                "sglang": {**knobs, "clip_max_new_tokens": 64},
            },
            servesim_overrides=(
                *fixed_overrides,
                "engine.num_gpu_blocks=600",
                "engine.clip_max_new_tokens=64",
            ),
        ),
        Case(
            "zg4_sglang_chunked_prefill",
            "SGLang, chunked_prefill_size 64, max_prefill_tokens 128, fixed 10 / 2 ms: a long "
            "prompt in 64-token chunks, the continuation at the head of the queue",
            chunk_trace,
            trace_block_size=64,
            engine={
                **fixed,
                "sglang": {**knobs, "chunked_prefill_size": 64, "max_prefill_tokens": 128},
            },
            servesim_overrides=(
                *fixed_overrides,
                "engine.chunked_prefill_size=64",
                "engine.max_prefill_tokens=128",
            ),
        ),
        Case(
            "zg5_sglang_lpm",
            "SGLang, schedule_policy lpm, max_num_seqs 1, fixed 10 / 2 ms: the longest cached "
            "prefix first, ties in arrival order",
            lpm_trace,
            trace_block_size=64,
            engine={**fixed, "max_num_seqs": 1, "sglang": {**knobs, "schedule_policy": "lpm"}},
            servesim_overrides=(
                *fixed_overrides,
                "engine.max_num_seqs=1",
                "engine.schedule_policy=lpm",
            ),
        ),
        Case(
            "zg6_sglang_retraction",
            "SGLang, 2,000 one-token pages, polynomial timing: as new_token_ratio falls, "
            "admission overcommits; a decode step that lacks pages retracts the request with "
            "the fewest decoded tokens, which is readmitted with its cached prefix",
            lambda: tight_trace(seed=31, n=120, tbs=64, gap_ms=20.0, max_out=300),
            trace_block_size=64,
            engine={**sg, "num_gpu_blocks": 2000},
            servesim_overrides=("engine=sglang", "engine.num_gpu_blocks=2000"),
        ),
        Case(
            "zg7_sglang_pages_of_16",
            "SGLang, 16-token pages, 150 pages, polynomial timing: prefix hits in whole pages, "
            "partial last pages kept out of what admission may use",
            lambda: tight_trace(seed=32, n=100, tbs=64, gap_ms=25.0, max_out=150),
            trace_block_size=64,
            engine={**sg, "block_size": 16, "num_gpu_blocks": 150},
            servesim_overrides=(
                "engine=sglang",
                "engine.block_size=16",
                "engine.num_gpu_blocks=150",
            ),
        ),
        Case(
            "zg8_sglang_round_robin_4w",
            "SGLang, 4 round-robin workers of 3,000 one-token pages, polynomial timing",
            lambda: tight_trace(seed=33, n=240, tbs=64, gap_ms=6.0, max_out=400),
            num_workers=4,
            trace_block_size=64,
            engine={**sg, "num_gpu_blocks": 3000},
            servesim_overrides=("engine=sglang", "engine.num_gpu_blocks=3000"),
        ),
        Case(
            "zg9_sglang_pd_destination_first",
            "SGLang P/D 1P1D at 0.2 GB/s, decode pool 500 one-token pages, fixed 10 / 2 ms: a "
            "request's decode pages are reserved as it arrives, before its prefill; one that "
            "cannot reserve waits for its prefill too",
            pd_trace,
            trace_block_size=64,
            engine=fixed,
            servesim_overrides=fixed_overrides,
            pd=(1, 1),
            decode={"num_gpu_blocks": 500},
            bandwidth_gbps=0.2,
        ),
        Case(
            "zg10_sglang_pd_2p2d",
            "SGLang P/D 2P2D at 25 GB/s, decode pools of 3,000 one-token pages, polynomial "
            "timing: destination-first reservations under pressure",
            lambda: tight_trace(seed=34, n=160, tbs=64, gap_ms=10.0, max_out=300),
            trace_block_size=64,
            engine=sg,
            servesim_overrides=("engine=sglang",),
            pd=(2, 2),
            decode={"num_gpu_blocks": 3000},
            bandwidth_gbps=25.0,
        ),
        Case(
            "zg12_sglang_no_page_for_a_last_first_token",
            "SGLang, 130 one-token pages, fixed 10 / 2 ms: a prefill pass takes a page for each "
            "request's first token and caches it, except where that token is the request's last",
            last_token_slot_trace,
            trace_block_size=64,
            engine={**fixed, "num_gpu_blocks": 130},
            servesim_overrides=(*fixed_overrides, "engine.num_gpu_blocks=130"),
        ),
        Case(
            "zg11_sglang_speculative",
            "SGLang with 2 speculative tokens accepted as [1, 0] (bursts of 2), 1,500 one-token "
            "pages, polynomial timing: the first token from the prefill pass, then bursts; each "
            "decode step makes room for every request's widest burst, retracting if it must",
            lambda: tight_trace(seed=35, n=100, tbs=64, gap_ms=20.0, max_out=200),
            trace_block_size=64,
            engine={
                **sg,
                "num_gpu_blocks": 1500,
                "aic_nextn": 2,
                "aic_nextn_accept_rates": "1.0,0.0",
                "aic_mtp_seed": 42,
            },
            servesim_overrides=(
                "engine=sglang",
                "engine.num_gpu_blocks=1500",
                "engine.speculative.num_speculative_tokens=2",
                "engine.speculative.acceptance_rates=[1.0,0.0]",
            ),
        ),
    ]
