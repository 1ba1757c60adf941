"""Golden cases of speculative decoding (MTP): `engine.speculative.*` against the mocker's
`aic_nextn`, `aic_nextn_accept_rates`, `aic_mtp_seed`, on the vLLM backend.

Every case uses acceptance rates of 0 and 1 only, so the bursts are deterministic and the
mocker's random generator (which servesim cannot reproduce) draws nothing that matters: each
request's times must match exactly. Loaded by make_fixtures.py (`cases(Case, ENGINES)`); the
traces are generated here from fixed rows or seeds.
"""

from __future__ import annotations

import random
from typing import Any

Row = dict[str, Any]
SEED = 42


def spec(k: int, rates: list[float]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The mocker's engine keys and servesim's overrides of k drafts with these rates, as
    experiments/compare_dynamo_mocker.py renders them."""
    engine = {
        "aic_nextn": k,
        "aic_nextn_accept_rates": ",".join(repr(float(r)) for r in rates),
        "aic_mtp_seed": SEED,
    }
    overrides = (
        f"engine.speculative.num_speculative_tokens={k}",
        f"engine.speculative.acceptance_rates=[{','.join(repr(float(r)) for r in rates)}]",
    )
    return engine, overrides


def fixed(
    prefill_ms: float = 10.0, decode_ms: float = 2.0
) -> tuple[dict[str, Any], tuple[str, ...]]:
    return (
        {"timing_model": {"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms}},
        ("timing=fixed", f"timing.prefill_ms={prefill_ms}", f"timing.decode_ms={decode_ms}"),
    )


def engine_keys(**changes: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Engine changes for both sides (`engine.<key>=<value>` for servesim)."""
    return dict(changes), tuple(f"engine.{k}={v}" for k, v in changes.items())


def combine(*parts: tuple[dict[str, Any], tuple[str, ...]]) -> dict[str, Any]:
    engine: dict[str, Any] = {}
    overrides: tuple[str, ...] = ()
    for e, o in parts:
        engine |= e
        overrides += o
    return {"engine": engine, "servesim_overrides": overrides}


# --------------------------------------------------------------------------- traces


def row(t: int, isl: int, osl: int, ids: list[int]) -> Row:
    return {"timestamp": t, "input_length": isl, "output_length": osl, "hash_ids": ids}


def burst_rows() -> list[Row]:
    """One request at a time (fixed 10 / 2 ms), outputs 0..10; then two that share a pass
    (one decoding, one prefilled in it); then a 10,240-token prompt (two chunks)."""
    rows = [row(100 * i, 100 + i, out, [i]) for i, out in enumerate([0, 1, 2, 3, 4, 5, 7, 10])]
    rows += [row(1000, 300, 10, [50]), row(1013, 50, 4, [51])]  # the second joins at 1014
    rows += [row(1200, 10240, 5, list(range(60, 80)))]  # 8192 + 2048: two prefill passes
    return rows


def leading_rows() -> list[Row]:
    """Requests one at a time, and a few overlapping, with outputs 1..13 (trace block 512)."""
    rows = [row(60 * i, 200 + 7 * i, i + 1, [i]) for i in range(13)]
    rows += [row(900 + 3 * i, 500, 9 + i, [100 + i]) for i in range(4)]
    return rows


def prefix_rows() -> list[Row]:
    """Repeats of two prompts (1000 and 1024 tokens, 16 blocks of 64) after the first has
    ended: each hit loses one more block with speculation; an output-0 repeat keeps it all.
    A one-block prompt repeated (its hit is below the recomputed block)."""
    a, b = [1, 2], [3, 4]
    return [
        row(0, 1000, 4, a),
        row(100, 1000, 4, a),
        row(200, 1024, 4, b),
        row(300, 1024, 4, b),
        row(400, 1024, 0, b),
        row(500, 1000, 3, a),
        row(600, 80, 3, [9]),
        row(700, 80, 3, [9]),
    ]


def tight_rows() -> list[Row]:
    """On 3 blocks of 16 tokens: A (30 tokens) and B (14) share the first pass; the burst
    reservation (A 1 block, B 1 block, none free) preempts B (lifo) or A (fifo). Then C and
    D, later, alone."""
    return [
        row(0, 30, 6, [1, 2]),
        row(0, 14, 6, [3]),
        row(100, 20, 9, [4, 5]),
        row(100, 12, 4, [6]),
    ]


def evict_rows() -> list[Row]:
    """6 blocks of 16, rates 0 (one token a step, reservations for three): A (64 tokens,
    4 blocks) ends and is cached; B (14 tokens, output 20) decodes; at its pass from 62 B
    (30 tokens) reserves a block for a burst of three, which evicts A's last cached block,
    and gives it back unused. C, A's prompt with output 0, arrives at 63: it finds 3 of A's
    4 blocks (with an allocation for the burst actually emitted it would find all 4)."""
    return [
        row(0, 64, 1, [1, 2, 3, 4]),
        row(20, 14, 20, [5]),
        row(63, 64, 0, [1, 2, 3, 4]),
    ]


def model_len_rows() -> list[Row]:
    """max_model_len 105: bursts stop at the limit."""
    return [row(0, 100, 20, [1]), row(50, 101, 2, [2]), row(100, 90, 50, [3])]


def tight_kv_rows(seed: int = 7, n: int = 120) -> list[Row]:
    """Short prompts arriving fast enough to overflow a 200 x 16-token pool (trace block 32):
    preemptions, chunked prefill (256-token budget), shared prefixes; every request fits the
    pool alone."""
    rng = random.Random(seed)
    next_id = [0]

    def ids(k: int) -> list[int]:
        out = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return out

    systems = [ids(rng.randint(2, 8)) for _ in range(5)]
    rows: list[Row] = []
    t = 0
    for _ in range(n):
        t += int(rng.expovariate(1 / 25.0))
        hashes = (
            rng.choice(systems) + ids(rng.randint(0, 8))
            if rng.random() < 0.6
            else ids(rng.randint(1, 18))
        )
        cap = len(hashes) * 32
        rows.append(row(t, rng.randint(max(1, cap - 31), cap), rng.randint(1, 250), hashes))
    return rows


def pd_rows() -> list[Row]:
    """P/D, 3 blocks of 16 per prefill rank: A (32 tokens, block-aligned) and B (16) share a
    prefill pass; the prefill copy's one-token reservation (A needs a third block) preempts
    B there. The decode worker then emits bursts from its first pass. Later requests: a
    repeat (the prefill side's hit loses a block), an output-1 and an output-0 request."""
    return [
        row(0, 32, 5, [1, 2]),
        row(0, 16, 5, [3]),
        row(100, 40, 7, [4, 5, 6]),
        row(200, 40, 7, [4, 5, 6]),
        row(300, 20, 1, [7, 8]),
        row(400, 20, 0, [9, 10]),
    ]


# --------------------------------------------------------------------------- cases


def cases(Case: Any, ENGINES: dict[str, dict[str, Any]]) -> list[Any]:  # noqa: N803
    assert "aic_nextn" not in ENGINES["vllm"]  # the cases add speculation themselves
    k2 = spec(2, [1.0, 1.0])
    small16 = engine_keys(block_size=16)
    return [
        Case(
            "zs1_burst_first_token",
            "k=2, rates 1,1, fixed 10/2 ms: bursts of 3 capped by the output left, the first "
            "token from the first decode step (prefill pass + decode), output 0 ends at the "
            "prefill, a mixed pass, a two-chunk prompt",
            burst_rows,
            **combine(k2, fixed()),
        ),
        Case(
            "zs2_leading_accepts_poly",
            "k=3, rates 1,0,1 (bursts of 2: acceptance stops at the first rejection), "
            "polynomial timing: the decode step priced on the sequences before the burst",
            leading_rows,
            **combine(spec(3, [1.0, 0.0, 1.0])),
        ),
        Case(
            "zs3_prefix_hit_one_block_less",
            "k=2, rates 1,1: a prefix hit loses one more block (vLLM's drafter recomputes it), "
            "not for an output-0 request; fixed 10/2 ms",
            prefix_rows,
            **combine(k2, fixed()),
        ),
        Case(
            "zs4_burst_reservation_preempts_lifo",
            "k=2, rates 1,1, 3 x 16-token blocks: the burst's KV reservation preempts the "
            "newest request (lifo); fixed 10/2 ms",
            tight_rows,
            trace_block_size=16,
            **combine(k2, fixed(), engine_keys(num_gpu_blocks=3, block_size=16)),
        ),
        Case(
            "zs5_burst_reservation_preempts_fifo",
            "zs4 with fifo preemption: the reservation preempts the oldest request",
            tight_rows,
            trace_block_size=16,
            **combine(
                k2,
                fixed(),
                engine_keys(num_gpu_blocks=3, block_size=16, preemption_mode="fifo"),
            ),
        ),
        Case(
            "zs6_reservation_evicts_cached",
            "k=2, rates 0,0 (one token a step), 6 x 16-token blocks: the reservation for a "
            "burst of 3 evicts a cached block it then gives back unused",
            evict_rows,
            trace_block_size=16,
            **combine(spec(2, [0.0, 0.0]), fixed(), engine_keys(num_gpu_blocks=6, block_size=16)),
        ),
        Case(
            "zs7_max_model_len",
            "k=2, rates 1,1, max_model_len 105: bursts capped at the model length",
            model_len_rows,
            **combine(k2, fixed(), engine_keys(max_model_len=105)),
        ),
        Case(
            "zs8_tight_kv_lifo",
            "k=2, rates 1,1 on case c's engine (200 x 16-token blocks, 256-token budget, "
            "32 seqs, lifo), polynomial timing: preemptions by bursts and decode steps, chunks",
            tight_kv_rows,
            trace_block_size=32,
            **combine(
                k2,
                engine_keys(
                    num_gpu_blocks=200, block_size=16, max_num_batched_tokens=256, max_num_seqs=32
                ),
            ),
        ),
        Case(
            "zs9_pd_prefill_reserves_one_token",
            "P/D 1P1D, k=2, rates 1,1, 3 x 16-token blocks per rank, fixed 10/2 ms: the "
            "prefill copy reserves for its one token (preempting), decode bursts from the "
            "first decode pass",
            pd_rows,
            trace_block_size=16,
            pd=(1, 1),
            **combine(k2, fixed(), small16, engine_keys(num_gpu_blocks=3)),
        ),
    ]
