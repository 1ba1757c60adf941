"""Regenerate the golden mocker fixtures in this directory.

Each case directory holds a small hand-shaped Mooncake trace (generated here from a fixed seed,
never copied from a shared trace), `case.json` (the servesim Hydra overrides and the exact
keyword arguments given to Dynamo's mocker), and the mocker's outputs: `summary.json` and
`requests.jsonl` (its `report_jsonl_path` records, trimmed to `REQUEST_FIELDS`).

    MOCKER_PYTHON tests/golden/mocker/make_fixtures.py                          # everything
    python tests/golden/mocker/make_fixtures.py --traces-only                   # no mocker

MOCKER_PYTHON is the mocker's interpreter (a virtual environment with `pip install
ai-dynamo-runtime==1.6.1`, module `dynamo._core`). Only the standard library is used, so the
first form runs there; servesim is not needed here.

Normalisation of the mocker outputs, so that a regeneration gives a clean diff:
* `summary.json`: the host-speed keys (`wall_time_ms`, `processed_tokens_per_s`,
  `processed_output_tokens_per_s`) are dropped;
* `requests.jsonl`: only the fields in `REQUEST_FIELDS` (P/D cases: `PD_REQUEST_FIELDS`, which
  adds the disaggregation lifecycle) are kept (those the golden test reads plus a few times and
  counts useful when a case fails), in that order, with the values the mocker wrote; the rest
  (the random `uuid`, routing and admission histories, disaggregation fields of aggregated
  cases, which are null, ...) is dropped. The rows are sorted by (arrival_time_ms,
  input_length, requested_output_length, first_token_ms, terminal_time_ms), because the
  mocker writes rows with equal arrival times in a random order.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WALL_KEYS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")
MAX_TRACE_BYTES = 100_000
# The per-request fields kept from the mocker's report_jsonl_path records. The golden test reads
# arrival_time_ms, input_length, requested_output_length, output_length, first_token_ms,
# terminal_time_ms, reused_input_tokens, terminal_status and decode_worker_idx; the others are
# kept for debugging a failing case.
REQUEST_FIELDS = (
    "arrival_time_ms",
    "first_admit_ms",
    "first_token_ms",
    "last_token_ms",
    "terminal_time_ms",
    "ttft_ms",
    "itl_ms",
    "e2e_latency_ms",
    "input_length",
    "requested_output_length",
    "output_length",
    "reused_input_tokens",
    "decode_worker_idx",
    "admission_count",
    "terminal_status",
)
# P/D cases keep the disaggregation lifecycle too (all null for aggregated workers).
PD_REQUEST_FIELDS = (
    *REQUEST_FIELDS,
    "prefill_worker_idx",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "decode_reused_input_tokens",
)

Row = dict[str, Any]

# The mocker's defaults (ai-dynamo-runtime 1.6.1, vLLM backend), written out in full so each
# case.json states exactly what the mocker was given.
DEFAULT_ENGINE: dict[str, Any] = {
    "backend": "vllm",
    "num_gpu_blocks": 16384,
    "block_size": 64,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "max_model_len": None,
    "speedup_ratio": 1.0,
    "decode_speedup_ratio": 1.0,
    "preemption_mode": "lifo",
    "timing_model": {"type": "polynomial"},
}
BASE_OVERRIDES = ["experiment=dynamo_compat", "workload=mooncake", "output.progress=off"]
# Llama-3.1-8B: 32 layers x 2 (K, V) x 8 KV heads x 128 dims x 2 bytes, servesim's default
# (`link.kv_bytes_per_token: null` derives it from the llm geometry).
KV_BYTES_PER_TOKEN = 131072
# the model agentic cases project every node onto (servesim's default llm)
EXECUTION_MODEL = "llama3_8b"


# --------------------------------------------------------------------------- traces


def _hash_ids(next_id: list[int], n: int) -> list[int]:
    out = list(range(next_id[0], next_id[0] + n))
    next_id[0] += n
    return out


def shared_prefix_trace(seed: int = 1, n: int = 200) -> list[Row]:
    """~n requests over ~25 s: system prompts shared by groups, follow-ups that extend an
    earlier prompt, exact repeats, prompts longer than the 8192-token budget (chunked), tied
    timestamps, and outputs from 1 to ~400 tokens. Trace block size 512."""
    rng = random.Random(seed)
    tbs = 512
    next_id = [0]
    systems = [_hash_ids(next_id, rng.randint(1, 6)) for _ in range(8)]
    rows: list[Row] = []
    t = 0
    while len(rows) < n:
        if rng.random() < 0.75:
            t += int(rng.expovariate(1 / 130.0))
        # else: same timestamp as the previous row (ties are common in real traces)
        kind = rng.random()
        if kind < 0.15 and rows:
            # a follow-up: an earlier prompt plus new content
            base = rng.choice(rows)
            hashes = base["hash_ids"] + _hash_ids(next_id, rng.randint(1, 4))
        elif kind < 0.22 and rows:
            # an exact repeat of an earlier prompt
            base = rng.choice(rows)
            hashes = list(base["hash_ids"])
            rows.append(
                {
                    "timestamp": t,
                    "input_length": base["input_length"],
                    "output_length": rng.randint(1, 300),
                    "hash_ids": hashes,
                }
            )
            continue
        elif kind < 0.30:
            hashes = _hash_ids(next_id, rng.randint(17, 26))  # > 8192 tokens: chunked
        else:
            hashes = rng.choice(systems) + _hash_ids(next_id, rng.randint(0, 10))
        if not hashes:
            hashes = _hash_ids(next_id, 1)
        cap = len(hashes) * tbs
        input_length = rng.randint(max(1, cap - tbs + 1), cap)
        out = rng.choice([1, 2, rng.randint(3, 60), rng.randint(60, 400), rng.randint(3, 200)])
        rows.append(
            {"timestamp": t, "input_length": input_length, "output_length": out, "hash_ids": hashes}
        )
    return rows


def tight_kv_trace(seed: int = 2, n: int = 150) -> list[Row]:
    """Short prompts arriving fast enough to overflow a 200 x 16-token KV pool. Trace block
    size 32; every request fits the pool alone (prompt + output < 3200 tokens)."""
    rng = random.Random(seed)
    tbs = 32
    next_id = [0]
    systems = [_hash_ids(next_id, rng.randint(2, 8)) for _ in range(5)]
    rows: list[Row] = []
    t = 0
    for _ in range(n):
        t += int(rng.expovariate(1 / 25.0))
        if rng.random() < 0.6:
            hashes = rng.choice(systems) + _hash_ids(next_id, rng.randint(0, 8))
        else:
            hashes = _hash_ids(next_id, rng.randint(1, 18))
        cap = len(hashes) * tbs
        input_length = rng.randint(max(1, cap - tbs + 1), cap)
        rows.append(
            {
                "timestamp": t,
                "input_length": input_length,
                "output_length": rng.randint(1, 250),
                "hash_ids": hashes,
            }
        )
    return rows


def fixed_timing_trace(seed: int = 3, n: int = 60) -> list[Row]:
    """Rows with output_length 0 and 1 among ordinary ones, including 0-output repeats of a
    completed prompt that is cached in full blocks (they complete at their arrival time) and
    a prompt longer than the budget. Trace block size 512."""
    rng = random.Random(seed)
    tbs = 512
    next_id = [0]
    rows: list[Row] = []
    t = 0
    full = _hash_ids(next_id, 2)  # 1024 tokens: exactly 16 engine blocks of 64
    rows.append({"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": full})
    for i in range(1, n):
        t += rng.choice([0, 1, 5, 10, 17, 40, 120])
        if i in (20, 45):
            # a 0-output repeat of the fully cached prompt: no work at all
            rows.append(
                {"timestamp": t, "input_length": 1024, "output_length": 0, "hash_ids": full}
            )
            continue
        if i == 30:
            hashes = _hash_ids(next_id, 20)  # 10240 tokens: two prefill passes
        elif rng.random() < 0.3:
            hashes = full + _hash_ids(next_id, rng.randint(0, 3))
        else:
            hashes = _hash_ids(next_id, rng.randint(1, 6))
        cap = len(hashes) * tbs
        input_length = rng.randint(max(1, cap - tbs + 1), cap)
        out = rng.choice([0, 0, 1, 1, 2, rng.randint(3, 30)])
        rows.append(
            {"timestamp": t, "input_length": input_length, "output_length": out, "hash_ids": hashes}
        )
    return rows


def session_trace(seed: int = 4, n_sessions: int = 30) -> list[Row]:
    """Multi-turn sessions: each later turn re-sends the conversation so far plus a new user
    message and arrives `delay` ms after the previous turn completes (some delays are 0).
    Rows of different sessions interleave in the file; first turns are in time order.
    Trace block size 512."""
    rng = random.Random(seed)
    tbs = 512
    next_id = [0]
    system = _hash_ids(next_id, 2)
    rows: list[Row] = []
    t = 0
    for s in range(n_sessions):
        t += int(rng.expovariate(1 / 400.0))
        hashes = system + _hash_ids(next_id, rng.randint(1, 4))
        for turn in range(rng.randint(2, 5)):
            if turn:
                hashes = hashes + _hash_ids(next_id, rng.randint(1, 3))
            cap = len(hashes) * tbs
            row: Row = {
                "session_id": f"s{s:02d}",
                "input_length": rng.randint(max(1, cap - tbs + 1), cap),
                "output_length": rng.randint(1, 200),
                "hash_ids": hashes,
            }
            if turn == 0:
                row = {"timestamp": t, **row}
            else:
                row["delay"] = rng.choice([0, 0, 50, 250, 1000, rng.randint(1, 3000)])
            rows.append(row)
    # interleave sessions without reordering a session's own turns or the first turns
    firsts = [r for r in rows if "timestamp" in r]
    later: dict[str, list[Row]] = {}
    for r in rows:
        if "timestamp" not in r:
            later.setdefault(r["session_id"], []).append(r)
    out: list[Row] = []
    pending: list[Row] = []
    for first in firsts:
        out.append(first)
        pending.extend(later.get(first["session_id"], []))
        while pending and rng.random() < 0.5:
            out.append(pending.pop(0))
    out.extend(pending)
    return out


def mixed_pass_trace() -> list[Row]:
    """Per-part nanosecond rounding of mixed passes. Requests 2 and 3 each arrive during a pass
    and are prefilled (2 new tokens) in a pass that also decodes request 1. In both mixed
    passes the prefill part (16.5317885640 ms) and the decode part (5.7433479178 /
    5.7434509275 ms) round up to the nanosecond separately, but their sum rounds down: a
    simulator that rounds the sum instead of each part (as the mocker does) ends request 3
    2 ns early."""
    return [
        {"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [0]},
        {"timestamp": 1, "input_length": 2, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 40, "input_length": 2, "output_length": 1, "hash_ids": [2]},
    ]


def recompute_trace() -> list[Row]:
    """Two 50-token prompts that outgrow a 10 x 16-token pool while decoding: the second is
    preempted, then readmitted with generated tokens to recompute (trace block size 64)."""
    return [
        {"timestamp": 0, "input_length": 50, "output_length": 60, "hash_ids": [0]},
        {"timestamp": 0, "input_length": 50, "output_length": 60, "hash_ids": [1]},
    ]


def half_ns_tie_trace() -> list[Row]:
    """Two requests under fixed timing whose prefill part, 102.9435925 ms, is exactly half a
    nanosecond in decimal. Its binary value is just below the tie, so round(x, 6) gives
    102.943592 ms; the mocker converts x / 1000 seconds to whole nanoseconds and gets
    102.943593 ms. Each prefill pass is 1 ns longer in the mocker (trace block size 512)."""
    return [
        {"timestamp": 0, "input_length": 64, "output_length": 3, "hash_ids": [0]},
        {"timestamp": 1000, "input_length": 64, "output_length": 2, "hash_ids": [1]},
    ]


def decode_tie_trace() -> list[Row]:
    """One 57-token prompt with 2 output tokens on a 13 x 16-token pool: its decode pass holds
    58 of 208 tokens, u = 58 / 208, and the decode polynomial lands on a half-nanosecond tie,
    18.7990625 ms, where the last bit depends on how a u^2 + b u + c is evaluated: (a u) u
    gives 18.799062499999998, a (u u) gives 18.7990625. Trace block size 64."""
    return [{"timestamp": 0, "input_length": 57, "output_length": 2, "hash_ids": [0]}]


def decode_overflow_trace(seed: int = 5, n: int = 60) -> list[Row]:
    """For a decode pool of 100 x 64 tokens (6400): 54 requests whose prompt and output fit it
    (prompt + output <= 3100 tokens; ~400 ms apart with short outputs, so the decode rank is
    never short of blocks) and 6 prompts of 6500 to 12000 tokens, which fit the prefill pool
    (16384 blocks) but never a decode rank. Some ties; trace block size 512."""
    rng = random.Random(seed)
    tbs = 512
    next_id = [0]
    system = _hash_ids(next_id, 2)
    big = set(rng.sample(range(5, n), 6))
    rows: list[Row] = []
    t = 0
    for i in range(n):
        if rng.random() < 0.85:
            t += int(rng.expovariate(1 / 400.0))
        if i in big:
            hashes = _hash_ids(next_id, rng.randint(13, 23))
            cap = len(hashes) * tbs
            input_length = rng.randint(max(6500, cap - tbs + 1), cap)
            out = rng.randint(1, 50)
        else:
            if rng.random() < 0.5:
                hashes = system + _hash_ids(next_id, rng.randint(0, 4))
            else:
                hashes = _hash_ids(next_id, rng.randint(1, 6))
            cap = len(hashes) * tbs
            input_length = rng.randint(max(1, cap - tbs + 1), cap)
            out = rng.randint(1, 60)
        rows.append(
            {"timestamp": t, "input_length": input_length, "output_length": out, "hash_ids": hashes}
        )
    return rows


def retry_before_activation_trace() -> list[Row]:
    """P/D, fixed timing (prefill 5, decode 1 ms), 1 GB/s, destination_missing, a decode pool
    of 10 x 16-token blocks (trace block size 16). R (16 tokens, 12 out) decodes from 7.097 to
    19.097; A (64 tokens) is reserved at 10.097 and its transfer lands mid-pass, so its
    activation waits for the pass end at 19.097; B (80 tokens, A's 4 blocks plus one) is held
    at 16, fails to reserve (4 free blocks, needs 5) and is retried when R ends at 19.097. At
    that pass end the mocker retries B's reservation before it applies A's activation, so A's
    blocks are not resident yet: B pins nothing and moves all 80 tokens (activated 29.583).
    Activation first would let B pin A's 4 blocks and move 16 tokens."""
    return [
        {"timestamp": 0, "input_length": 16, "output_length": 12, "hash_ids": [100]},
        {"timestamp": 1, "input_length": 64, "output_length": 5, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 11, "input_length": 80, "output_length": 5, "hash_ids": [1, 2, 3, 4, 5]},
    ]


def retry_after_preemption_trace() -> list[Row]:
    """P/D, fixed timing (prefill 5, decode 1 ms), a decode pool of 8 x 16-token blocks (trace
    block size 16). A and B (32 tokens, 40 out) decode together until the pool is full; the
    pass starting at 38 preempts B. D (16 tokens) has waited for a reservation since 35; B's
    blocks came back in that pass, so the attempt at its end (39) reserves D."""
    return [
        {"timestamp": 0, "input_length": 32, "output_length": 40, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 32, "output_length": 40, "hash_ids": [3, 4]},
        {"timestamp": 30, "input_length": 16, "output_length": 5, "hash_ids": [5]},
    ]


def admit_past_preempted_trace() -> list[Row]:
    """The trace of `retry_after_preemption_trace` plus E (48 tokens), held at 35 with D and
    queued for a reservation behind it. When D is activated at 39 the decode rank's waiting
    queue holds B (preempted at 38: it needs fresh KV, 4 blocks, 2 free) and then D. While
    the rank has a request waiting for a reservation (E), the mocker does not admit a
    request that needs fresh KV, and admits the activated D behind it at once (first token
    40); head-of-line order would keep D waiting until A ends at 45."""
    return [
        *retry_after_preemption_trace(),
        {"timestamp": 30, "input_length": 48, "output_length": 5, "hash_ids": [6, 7, 8]},
    ]


def zero_output_busy_decode_trace() -> list[Row]:
    """P/D with default engines, no bandwidth: A (1000 tokens, 50 out) decodes while B (8000
    tokens, output 0) is activated at a decode pass end (269.598923). The mocker admits B
    into the pass that starts then (decode_admit_ms 269.598923) and ends it at that pass's end
    (275.392517); B adds nothing to the pass (A's times are those of A alone). On an idle
    decode worker an output-0 request ends at its activation."""
    return [
        {"timestamp": 0, "input_length": 1000, "output_length": 50, "hash_ids": [1, 2]},
        {
            "timestamp": 100,
            "input_length": 8000,
            "output_length": 0,
            "hash_ids": list(range(10, 26)),
        },
    ]


def zero_output_idle_retry_trace() -> list[Row]:
    """P/D, fixed timing (prefill 10, decode 1 ms), 1 GB/s, decode pool 20 x 16 tokens: an
    output-0 request lands on an idle decode worker while another waits to reserve. The
    mocker tries the waiting reservation once while the output-0 request's blocks are still
    held and again after they are released (a review of servesim found the second attempt
    missing: request 5 was reserved at 44.360128 instead of 40.97152)."""
    return [
        {
            "timestamp": 0,
            "input_length": 96,
            "output_length": 5,
            "hash_ids": [100, *range(101, 106)],
        },
        {
            "timestamp": 1,
            "input_length": 160,
            "output_length": 0,
            "hash_ids": [200, *range(201, 210)],
        },
        {
            "timestamp": 4,
            "input_length": 128,
            "output_length": 1,
            "hash_ids": [300, *range(301, 308)],
        },
        {"timestamp": 5, "input_length": 32, "output_length": 1, "hash_ids": list(range(400, 402))},
        {"timestamp": 6, "input_length": 32, "output_length": 1, "hash_ids": list(range(500, 502))},
    ]


def host_tier_trace(seed: int) -> list[Row]:
    """40 rows, 0-100 ms apart, prompts of 40-400 tokens whose blocks but the last come from
    one of 4 families (so a tight G1 evicts what G2 still holds), outputs 1-10. Trace block
    size 64."""
    rng = random.Random(seed)
    rows: list[Row] = []
    t = 0
    for i in range(40):
        t += rng.choice([0, 5, 10, 20, 50, 100])
        n_in = rng.randint(40, 400)
        n_blocks = -(-n_in // 64)
        family = rng.randint(0, 3)
        ids = [family * 1000 + k for k in range(n_blocks - 1)] + [10000 + i]
        rows.append(
            {
                "timestamp": t,
                "input_length": n_in,
                "output_length": rng.choice([1, 2, 5, 10]),
                "hash_ids": ids[:n_blocks],
            }
        )
    return rows


# G2 host pools of the cases below: the mocker's `native_host_offload` with servesim's
# `kv_cache.host_offload` field for field (compare_dynamo.py sends exactly this)
HOST_OFFLOAD = {
    "num_host_blocks": 30,
    "scope": "dp_rank_local",
    "d2h_bandwidth_gbps": 8.388608,
    "h2d_bandwidth_gbps": 8.388608,
    "latency_to_first_byte_ms": 0.0,
    "shared_d2h_bandwidth_gbps": 80.0,
    "shared_h2d_bandwidth_gbps": 80.0,
}
HOST_ENGINE = {
    "num_gpu_blocks": 16,
    "timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0},
    "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN,
    "native_host_offload": HOST_OFFLOAD,
}
HOST_OVERRIDES = (
    "engine.num_gpu_blocks=16",
    "timing=fixed",
    "timing.prefill_ms=10.0",
    "timing.decode_ms=1.0",
    "kv_cache.host_offload.num_host_blocks=30",
    "kv_cache.host_offload.d2h_bandwidth_gbps=8.388608",
    "kv_cache.host_offload.h2d_bandwidth_gbps=8.388608",
)


def zero_output_caches_prompt_trace() -> list[Row]:
    """P/D, fixed timing (prefill 10, decode 1 ms), 1 GB/s, decode pool 100 x 64 tokens: the
    output-0 request 1 lands on an idle decode worker and ends at once; its prompt blocks are
    registered first, so they stay cached and request 2 (same first block) pins one of them,
    which leaves room for request 7's reservation at 265 (servesim once released them
    unregistered and reserved 7 only at 354.81824). Shrunk from a 40-row fuzz trace."""
    return [
        {
            "timestamp": 525,
            "input_length": 1308,
            "output_length": 0,
            "hash_ids": [3, *range(2150, 2170)],
        },
        {
            "timestamp": 725,
            "input_length": 1088,
            "output_length": 2,
            "hash_ids": [3, *range(2600, 2616)],
        },
        {
            "timestamp": 770,
            "input_length": 670,
            "output_length": 30,
            "hash_ids": [2, *range(2700, 2710)],
        },
        {
            "timestamp": 770,
            "input_length": 900,
            "output_length": 30,
            "hash_ids": [2, *range(2750, 2764)],
        },
        {
            "timestamp": 770,
            "input_length": 821,
            "output_length": 30,
            "hash_ids": [1, *range(2800, 2812)],
        },
        {
            "timestamp": 770,
            "input_length": 1347,
            "output_length": 2,
            "hash_ids": [3, *range(2850, 2871)],
        },
        {
            "timestamp": 780,
            "input_length": 1441,
            "output_length": 2,
            "hash_ids": [2, *range(2900, 2922)],
        },
    ]


def arrival_at_prefill_pass_end_trace() -> list[Row]:
    """P/D, fixed timing (prefill 10, decode 2 ms): A's prefill pass runs 0 -> 10; B arrives
    at 5 and waits; C arrives at 10, exactly when that pass ends. The mocker starts the prefill
    worker's next pass (B alone) before it releases the arrival at 10, so C is admitted at 20;
    without B waiting (worker idle at 10), C would be admitted at 10. Trace block size 512."""
    return [
        {"timestamp": 0, "input_length": 1386, "output_length": 22, "hash_ids": [0, 1, 2]},
        {"timestamp": 5, "input_length": 63, "output_length": 1, "hash_ids": [3]},
        {"timestamp": 10, "input_length": 100, "output_length": 1, "hash_ids": [4]},
    ]


AGENTIC_HEADER: Row = {
    "schema": "dynamo.agentic_mooncake",
    "version": 2,
    "block_size": 64,
    "hash_id_scope": "local",
    "source": {"format": "make_fixtures", "digest": "golden"},
}


def agentic_trace(seed: int = 7, n_plays: int = 12) -> list[Row]:
    """An agentic Mooncake v2 file: `n_plays` plays 150 ms apart, each a main agent of 3-6
    turns over one growing context (a 128-token system prompt shared by every play), tool waits
    of 20-400 ms between turns (completion edges), and after some turns a 2-turn sub-agent
    spawned 0-20 ms after the turn's dispatch, which the next main turn sometimes joins."""
    rng = random.Random(seed)
    next_id = [1000]
    system = [1, 2]  # two 64-token blocks every play shares
    rows: list[Row] = [AGENTIC_HEADER]

    def call(rid: str, play: str, session: str, ids: list[int], n_in: int, t0: float, deps):
        rows.append(
            {
                "request_id": rid,
                "play_id": play,
                "session_id": session,
                "model": "source-model",
                "input_length": n_in,
                "output_length": rng.randint(5, 40),
                "hash_ids": list(ids),
                "not_before_ms": t0,
                "dependencies": deps,
            }
        )
        return rows[-1]["output_length"]

    def grow(ids: list[int], n_in: int, extra: int) -> tuple[list[int], int]:
        n = n_in + extra
        need = -(-n // 64) - len(ids)
        return ids + _hash_ids(next_id, need), n

    for p in range(n_plays):
        play, t0 = f"p{p}", p * 150.0
        ids, n_in = grow(system, 128, rng.randint(64, 400))
        prev: str | None = None
        join: str | None = None
        for k in range(rng.randint(3, 6)):
            rid = f"{play}:m{k}"
            deps = []
            if prev is not None:
                deps.append(_dep(prev, "completion", rng.randint(20, 400), "sequence"))
            if join is not None:
                deps.append(_dep(join, "completion", 0, "join"))
            out = call(rid, play, f"{play}:main", ids, n_in, t0, deps)
            join = None
            if rng.random() < 0.35:  # a sub-agent off this turn
                sub_ids, sub_in = grow(system, 128, rng.randint(32, 200))
                sub_prev = None
                for j in range(2):
                    sid = f"{play}:s{k}.{j}"
                    sub_deps = (
                        [_dep(rid, "dispatch", rng.randint(0, 20), "spawn")]
                        if sub_prev is None
                        else [_dep(sub_prev, "completion", rng.randint(20, 200), "sequence")]
                    )
                    sub_out = call(sid, play, f"{play}:sub{k}", sub_ids, sub_in, t0, sub_deps)
                    sub_ids, sub_in = grow(sub_ids, sub_in, sub_out + rng.randint(16, 128))
                    sub_prev = sid
                if rng.random() < 0.5:
                    join = sub_prev
            ids, n_in = grow(ids, n_in, out + rng.randint(16, 300))
            prev = rid
    return rows


def agentic_lanes_trace(seed: int = 8, n_plays: int = 24, n_lanes: int = 8) -> list[Row]:
    """An agentic Mooncake v2 file of `n_plays` plays of very different lengths, so that the
    lane rule decides the run: every `n_lanes`-th play (p0, p8, p16 with 8 lanes: exactly the
    plays stride gives lane 0) is long, 7-9 main turns with tool waits of 150-400 ms; the others
    are short, 1-2 turns with waits of 10-60 ms. Each play is one main agent over a growing
    context behind a 128-token system prompt every play shares; plays are authored 50 ms
    apart (lanes rebase them). Play ids are zero-padded so id order is play order."""
    rng = random.Random(seed)
    next_id = [5000]
    rows: list[Row] = [AGENTIC_HEADER]
    for p in range(n_plays):
        play = f"p{p:02d}"
        long = p % n_lanes == 0
        n_turns = rng.randint(7, 9) if long else rng.randint(1, 2)
        n_in = 128 + rng.randint(64, 400)
        ids = [1, 2, *_hash_ids(next_id, -(-n_in // 64) - 2)]
        prev: str | None = None
        for k in range(n_turns):
            rid = f"{play}:m{k}"
            wait = rng.randint(150, 400) if long else rng.randint(10, 60)
            out = rng.randint(5, 40)
            deps = [] if prev is None else [_dep(prev, "completion", wait, "sequence")]
            rows.append(
                {
                    "request_id": rid,
                    "play_id": play,
                    "session_id": f"{play}:main",
                    "model": "source-model",
                    "input_length": n_in,
                    "output_length": out,
                    "hash_ids": list(ids),
                    "not_before_ms": p * 50.0,
                    "dependencies": deps,
                }
            )
            n_in += out + rng.randint(16, 200)
            ids += _hash_ids(next_id, -(-n_in // 64) - len(ids))
            prev = rid
    return rows


def _dep(rid: str, trigger: str, delay: float, relation: str) -> Row:
    return {"request_id": rid, "trigger": trigger, "delay_ms": delay, "relation": relation}


def agentic_rejected_trace() -> list[Row]:
    """Play p's second turn (2,048 tokens) reaches max_model_len 1,024: p fails, its third turn
    is never dispatched, and the lane goes on to play q."""

    def row(rid: str, play: str, n_in: int, deps: list[Row]) -> Row:
        return {
            "request_id": rid,
            "play_id": play,
            "session_id": f"{play}:main",
            "model": "source-model",
            "input_length": n_in,
            "output_length": 3,
            "hash_ids": list(range(1, -(-n_in // 64) + 1)),
            "not_before_ms": 0,
            "dependencies": deps,
        }

    return [
        AGENTIC_HEADER,
        row("p:0", "p", 64, []),
        row("p:1", "p", 2048, [_dep("p:0", "completion", 0, "sequence")]),
        row("p:2", "p", 64, [_dep("p:1", "completion", 0, "sequence")]),
        row("q:0", "q", 128, []),
        row("q:1", "q", 256, [_dep("q:0", "completion", 50, "sequence")]),
    ]


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    trace: Callable[[], list[Row]]
    num_workers: int = 1  # aggregated workers (ignored with `pd`)
    trace_block_size: int = 512
    engine: dict[str, Any] = field(default_factory=dict)  # changes to DEFAULT_ENGINE
    servesim_overrides: tuple[str, ...] = ()
    # P/D: (prefill workers, decode workers); None: aggregated
    pd: tuple[int, int] | None = None
    prefill: dict[str, Any] = field(default_factory=dict)  # engine changes on one role
    decode: dict[str, Any] = field(default_factory=dict)
    prefill_dp: int = 1
    decode_dp: int = 1
    bandwidth_gbps: float | None = None  # link.bandwidth_gbps (None: instant)
    timing_mode: str = "full_prompt"  # link.timing_mode
    # agentic_mooncake v2 traces: replayed as plays (lanes None: every play at its own start)
    agentic: bool = False
    agentic_lanes: int | None = None

    def mocker_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `run_mocker_trace_replay` (without the trace list and
        report path); agentic cases add the trace format, the lanes and the execution model."""
        out = self._cluster_kwargs()
        if self.agentic:
            out["trace_format"] = "agentic_mooncake"
            out["execution_model"] = EXECUTION_MODEL
            if self.agentic_lanes is not None:
                out["agentic_lanes"] = self.agentic_lanes
        return out

    def _cluster_kwargs(self) -> dict[str, Any]:
        """P/D: both args dicts with worker_type, the transfer settings on the prefill args
        only (the mocker reads them there), dp_size at the top of each."""
        if self.pd is None:
            return {
                "num_workers": self.num_workers,
                "router_mode": "round_robin",
                "trace_block_size": self.trace_block_size,
                "arrival_speedup_ratio": 1.0,
                "extra_engine_args": {
                    "engine": {**DEFAULT_ENGINE, **self.engine},
                    "tensor_parallel_size": 1,
                },
            }
        prefill = {
            **DEFAULT_ENGINE,
            **self.engine,
            **self.prefill,
            "worker_type": "prefill",
            "kv_transfer_bandwidth": self.bandwidth_gbps,
            "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
            "kv_transfer_timing_mode": self.timing_mode,
        }
        decode = {**DEFAULT_ENGINE, **self.engine, **self.decode, "worker_type": "decode"}
        return {
            "num_prefill_workers": self.pd[0],
            "num_decode_workers": self.pd[1],
            "prefill_engine_args": {
                "engine": prefill,
                "dp_size": self.prefill_dp,
                "tensor_parallel_size": 1,
            },
            "decode_engine_args": {
                "engine": decode,
                "dp_size": self.decode_dp,
                "tensor_parallel_size": 1,
            },
            "router_mode": "round_robin",
            "trace_block_size": self.trace_block_size,
            "arrival_speedup_ratio": 1.0,
        }

    def overrides(self) -> list[str]:
        """servesim Hydra overrides (add `workload.path=<case dir>/trace.jsonl`)."""
        out = self._cluster_overrides()
        if not self.agentic:
            return out
        out[out.index("workload=mooncake")] = "workload=agentic_mooncake"
        if self.agentic_lanes is not None:
            # the default lane rule (shared_queue) is the mocker's: no override
            out.append(f"workload.agentic_lanes={self.agentic_lanes}")
        return out

    def _cluster_overrides(self) -> list[str]:
        if self.pd is None:
            return [
                *BASE_OVERRIDES,
                f"topology.num_workers={self.num_workers}",
                f"workload.trace_block_size={self.trace_block_size}",
                *self.servesim_overrides,
            ]
        out = [
            *BASE_OVERRIDES,
            "topology=disagg",
            f"topology.num_prefill_workers={self.pd[0]}",
            f"topology.num_decode_workers={self.pd[1]}",
            f"workload.trace_block_size={self.trace_block_size}",
        ]
        if self.bandwidth_gbps is not None:
            out.append(f"link.bandwidth_gbps={self.bandwidth_gbps}")
        if self.timing_mode != "full_prompt":
            out.append(f"link.timing_mode={self.timing_mode}")
        for role, changes, dp in (
            ("prefill", self.prefill, self.prefill_dp),
            ("decode", self.decode, self.decode_dp),
        ):
            out += [f"topology.{role}.{k}={v}" for k, v in changes.items()]
            if dp != 1:
                out.append(f"topology.{role}.dp_size={dp}")
        return [*out, *self.servesim_overrides]

    @property
    def request_fields(self) -> tuple[str, ...]:
        return REQUEST_FIELDS if self.pd is None else PD_REQUEST_FIELDS


FIXED_5_1 = (
    "engine.block_size=16",
    "timing=fixed",
    "timing.prefill_ms=5.0",
    "timing.decode_ms=1.0",
)
TIGHT_ENGINE = {
    "num_gpu_blocks": 200,
    "block_size": 16,
    "max_num_batched_tokens": 256,
    "max_num_seqs": 32,
}
TIGHT_OVERRIDES = (
    "engine.num_gpu_blocks=200",
    "engine.block_size=16",
    "engine.max_num_batched_tokens=256",
    "engine.max_num_seqs=32",
)

CASES = [
    Case(
        "a_shared_prefix_1w",
        "~200 requests, shared prefixes, repeats, chunked prompts; 1 worker, default engine",
        shared_prefix_trace,
        num_workers=1,
    ),
    Case(
        "b_shared_prefix_2w",
        "the trace of case a on 2 round-robin workers, default engine",
        shared_prefix_trace,
        num_workers=2,
    ),
    Case(
        "c_tight_kv_lifo",
        "200 x 16-token KV blocks, 256-token budget, 32 seqs: preemptions, lifo; 1 worker",
        tight_kv_trace,
        num_workers=1,
        trace_block_size=32,
        engine={**TIGHT_ENGINE, "preemption_mode": "lifo"},
        servesim_overrides=(*TIGHT_OVERRIDES, "engine.preemption_mode=lifo"),
    ),
    Case(
        "d_tight_kv_fifo",
        "case c with fifo preemption",
        tight_kv_trace,
        num_workers=1,
        trace_block_size=32,
        engine={**TIGHT_ENGINE, "preemption_mode": "fifo"},
        servesim_overrides=(*TIGHT_OVERRIDES, "engine.preemption_mode=fifo"),
    ),
    Case(
        "e_fixed_timing",
        "fixed timing (prefill 10 ms, decode 2 ms) with output_length 0 and 1 rows; 1 worker",
        fixed_timing_trace,
        num_workers=1,
        engine={"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}},
        servesim_overrides=("timing=fixed", "timing.prefill_ms=10.0", "timing.decode_ms=2.0"),
    ),
    Case(
        "f_sessions_2w",
        "multi-turn sessions (session_id, delay) on 2 round-robin workers, default engine",
        session_trace,
        num_workers=2,
    ),
    Case(
        "g_mixed_pass_rounding",
        "3 requests: two mixed prefill + decode passes whose parts round up to the ns separately",
        mixed_pass_trace,
        num_workers=1,
    ),
    Case(
        "h_recompute_after_preemption",
        "2 requests on a 10 x 16-token pool: one preemption and a recompute of generated tokens",
        recompute_trace,
        num_workers=1,
        trace_block_size=64,
        engine={"num_gpu_blocks": 10, "block_size": 16},
        servesim_overrides=("engine.num_gpu_blocks=10", "engine.block_size=16"),
    ),
    Case(
        "i_half_ns_tie",
        "2 requests, fixed timing with a prefill of 102.9435925 ms: a half-nanosecond tie",
        half_ns_tie_trace,
        num_workers=1,
        engine={"timing_model": {"type": "fixed", "prefill_ms": 102.9435925, "decode_ms": 2.0}},
        servesim_overrides=(
            "timing=fixed",
            "timing.prefill_ms=102.9435925",
            "timing.decode_ms=2.0",
        ),
    ),
    Case(
        "j_decode_poly_tie",
        "1 request whose decode pass costs 18.7990625 ms (a half-nanosecond tie) by the polynomial",
        decode_tie_trace,
        num_workers=1,
        trace_block_size=64,
        engine={"num_gpu_blocks": 13, "block_size": 16},
        servesim_overrides=("engine.num_gpu_blocks=13", "engine.block_size=16"),
    ),
    Case(
        "k_pd_1p1d_instant",
        "P/D 1P1D, no bandwidth (instant KV transfer), the trace of case a, default engines",
        shared_prefix_trace,
        pd=(1, 1),
    ),
    Case(
        "l_pd_1p1d_1gbps",
        "P/D 1P1D at 1 GB/s (131072 B/token: 0.13 ms per token), the trace of case a",
        shared_prefix_trace,
        pd=(1, 1),
        bandwidth_gbps=1.0,
    ),
    Case(
        "m_pd_2p2d_25gbps",
        "P/D 2P2D at 25 GB/s, the trace of case a (shared prefixes)",
        shared_prefix_trace,
        pd=(2, 2),
        bandwidth_gbps=25.0,
    ),
    Case(
        "n_pd_tight_decode",
        "P/D 1P1D at 25 GB/s, decode pool 200 x 16 tokens: reservations queue, decode preemptions",
        tight_kv_trace,
        trace_block_size=32,
        engine={"block_size": 16},
        servesim_overrides=("engine.block_size=16",),
        pd=(1, 1),
        decode={"num_gpu_blocks": 200},
        bandwidth_gbps=25.0,
    ),
    Case(
        "o_pd_destination_missing",
        "case l with link.timing_mode=destination_missing: only blocks the decode rank lacks move",
        shared_prefix_trace,
        pd=(1, 1),
        bandwidth_gbps=1.0,
        timing_mode="destination_missing",
    ),
    Case(
        "p_pd_dp2_sessions",
        "P/D 1P2D with dp_size 2 on both roles at 25 GB/s, the multi-turn sessions of case f",
        session_trace,
        pd=(1, 2),
        prefill_dp=2,
        decode_dp=2,
        bandwidth_gbps=25.0,
    ),
    Case(
        "q_pd_decode_pool_too_small",
        "P/D 1P1D at 25 GB/s, decode pool 100 x 64 tokens: 6 prompts fit prefill, never decode",
        decode_overflow_trace,
        pd=(1, 1),
        decode={"num_gpu_blocks": 100},
        bandwidth_gbps=25.0,
    ),
    Case(
        "r_pd_fixed_timing",
        "P/D 1P1D at 1 GB/s under fixed timing (10 / 2 ms), the trace of case e (outputs 0 and 1)",
        fixed_timing_trace,
        engine={"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}},
        servesim_overrides=("timing=fixed", "timing.prefill_ms=10.0", "timing.decode_ms=2.0"),
        pd=(1, 1),
        bandwidth_gbps=1.0,
    ),
    Case(
        "s_pd_retry_before_activation",
        "3 requests, P/D: a reservation retried at a decode pass end before the activation "
        "deferred to it (destination_missing shows what was resident)",
        retry_before_activation_trace,
        trace_block_size=16,
        engine={
            "block_size": 16,
            "timing_model": {"type": "fixed", "prefill_ms": 5.0, "decode_ms": 1.0},
        },
        servesim_overrides=FIXED_5_1,
        pd=(1, 1),
        decode={"num_gpu_blocks": 10},
        bandwidth_gbps=1.0,
        timing_mode="destination_missing",
    ),
    Case(
        "t_pd_retry_after_preemption",
        "3 requests, P/D: a decode-side preemption frees blocks and the reservation waiting "
        "for them is made at the end of that pass",
        retry_after_preemption_trace,
        trace_block_size=16,
        engine={
            "block_size": 16,
            "timing_model": {"type": "fixed", "prefill_ms": 5.0, "decode_ms": 1.0},
        },
        servesim_overrides=FIXED_5_1,
        pd=(1, 1),
        decode={"num_gpu_blocks": 8},
    ),
    Case(
        "u_pd_admit_past_preempted",
        "4 requests, P/D: with a reservation pending, an activated request is admitted past a "
        "preempted one that needs fresh KV (servesim without fast-forward)",
        admit_past_preempted_trace,
        trace_block_size=16,
        engine={
            "block_size": 16,
            "timing_model": {"type": "fixed", "prefill_ms": 5.0, "decode_ms": 1.0},
        },
        servesim_overrides=(*FIXED_5_1, "speed.fast_forward=false"),
        pd=(1, 1),
        decode={"num_gpu_blocks": 8},
    ),
    Case(
        "v_pd_zero_output_busy_decode",
        "2 requests, P/D: an output-0 request activated while the decode worker is busy",
        zero_output_busy_decode_trace,
        pd=(1, 1),
    ),
    Case(
        "w_pd_arrival_at_prefill_pass_end",
        "3 requests, P/D, fixed timing: an arrival at the end of a prefill pass while another "
        "request waits on that prefill worker",
        arrival_at_prefill_pass_end_trace,
        engine={"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}},
        servesim_overrides=("timing=fixed", "timing.prefill_ms=10.0", "timing.decode_ms=2.0"),
        pd=(1, 1),
    ),
    Case(
        "x_pd_zero_output_idle_retry",
        "5 requests, P/D: an output-0 request ends on an idle decode worker while a reservation "
        "waits (an attempt before and after its blocks go back)",
        zero_output_idle_retry_trace,
        trace_block_size=16,
        engine={
            "block_size": 16,
            "timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0},
        },
        servesim_overrides=(
            "engine.block_size=16",
            "timing=fixed",
            "timing.prefill_ms=10.0",
            "timing.decode_ms=1.0",
        ),
        pd=(1, 1),
        decode={"num_gpu_blocks": 20},
        bandwidth_gbps=1.0,
    ),
    Case(
        "y_pd_zero_output_caches_prompt",
        "7 requests, P/D: an output-0 request's prompt blocks stay cached on the decode worker",
        zero_output_caches_prompt_trace,
        engine={"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}},
        servesim_overrides=("timing=fixed", "timing.prefill_ms=10.0", "timing.decode_ms=1.0"),
        pd=(1, 1),
        decode={"num_gpu_blocks": 100},
        bandwidth_gbps=1.0,
    ),
    Case(
        "z1_host_tier_1w",
        "40 requests, 1 worker, G1 16 blocks under a 30-block G2 host pool at one block per "
        "ms each way: stores, loads, a load another request waits for",
        lambda: host_tier_trace(0),
        trace_block_size=64,
        engine=HOST_ENGINE,
        servesim_overrides=HOST_OVERRIDES,
    ),
    Case(
        "z2_host_tier_2w",
        "40 requests, 2 workers, each with G1 16 blocks and its own 30-block G2 pool",
        lambda: host_tier_trace(1),
        num_workers=2,
        trace_block_size=64,
        engine=HOST_ENGINE,
        servesim_overrides=HOST_OVERRIDES,
    ),
    Case(
        "zz1_agentic_no_lanes_1w",
        "12 agent plays (growing contexts, tool waits, spawned sub-agents, joins), every play "
        "at its authored start; 1 worker",
        agentic_trace,
        trace_block_size=64,
        agentic=True,
    ),
    Case(
        "zz2_agentic_lanes3_2w",
        "the plays of zz1 on 3 lanes (a lane takes the next unstarted play when its play "
        "settles); 2 workers",
        agentic_trace,
        num_workers=2,
        trace_block_size=64,
        agentic=True,
        agentic_lanes=3,
    ),
    Case(
        "zz3_agentic_pd_lanes2",
        "the plays of zz1 on 2 lanes, 1P1D at 25 GB/s: a completion edge waits for the decode "
        "side's last token",
        agentic_trace,
        pd=(1, 1),
        trace_block_size=64,
        bandwidth_gbps=25.0,
        agentic=True,
        agentic_lanes=2,
    ),
    Case(
        "zz4_agentic_rejected",
        "a node reaching max_model_len fails its play; its successor is never dispatched and "
        "the single lane goes on",
        agentic_rejected_trace,
        trace_block_size=64,
        engine={"max_model_len": 1024},
        servesim_overrides=("engine.max_model_len=1024",),
        agentic=True,
        agentic_lanes=1,
    ),
    Case(
        "zz5_agentic_lanes8_shared_queue",
        "24 plays of very different lengths (p0, p8, p16 of 7-9 turns, the rest of 1-2) on 8 "
        "lanes, 2 workers: a lane whose play settles takes the next unstarted play (stride "
        "would give lane 0 all three long plays)",
        agentic_lanes_trace,
        num_workers=2,
        trace_block_size=64,
        agentic=True,
        agentic_lanes=8,
    ),
]


# --------------------------------------------------------------------------- issue 25: zx cases
# The settings the cases above do not reach: the KV router in front of a P/D cluster, dp_size 2
# behind the KV router, the KV-event lag, G3 (disk) under the host tier, and a cluster-shared host
# pool; plus the host-tier store rules found while comparing them. zx1-zx4 match the mocker;
# zx5-zx8 are reproducers of differences (strict xfails in the test; README.md gives the rules).

# The mocker's KvRouterConfig defaults (ai-dynamo-runtime 1.6.1), the fields compare_dynamo.py
# sends (`_router_args`)
ZX_ROUTER: dict[str, Any] = {
    "overlap_score_credit": 1.0,
    "prefill_load_scale": 1.0,
    "host_cache_hit_weight": 0.75,
    "disk_cache_hit_weight": 0.25,
    "decode_active_request_weight": 0.0,
    "router_temperature": 0.0,
    "router_queue_threshold": None,
    "router_queue_policy": "fcfs",
}
ZX_FIXED = {"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}}
ZX_FIXED_OVERRIDES = ("timing=fixed", "timing.prefill_ms=10.0", "timing.decode_ms=2.0")


def zx_host(num_host_blocks: int, scope: str = "dp_rank_local", bw: float = 8.388608) -> Row:
    """`native_host_offload` as compare_dynamo.py sends servesim's kv_cache.host_offload."""
    out: Row = {
        "num_host_blocks": num_host_blocks,
        "scope": scope,
        "d2h_bandwidth_gbps": bw,
        "h2d_bandwidth_gbps": bw,
        "latency_to_first_byte_ms": 0.0,
        "shared_d2h_bandwidth_gbps": 80.0,
        "shared_h2d_bandwidth_gbps": 80.0,
    }
    if scope == "cluster_shared":  # servesim's derived layout: 64-token blocks, Llama-3.1-8B
        out["kv_layout_id"] = f"block64x{KV_BYTES_PER_TOKEN}B"
    return out


def zx_disk(num_g3_blocks: int, bw: float) -> Row:
    """`g3_offload` as compare_dynamo.py sends servesim's kv_cache.disk."""
    return {
        "num_g3_blocks": num_g3_blocks,
        "scope": "worker_local",
        "latency_to_first_byte_ms": 0.1,
        "read_bandwidth_gbps": bw,
        "write_bandwidth_gbps": bw,
        "shared_read_bandwidth_gbps": 80.0,
        "shared_write_bandwidth_gbps": 80.0,
    }


def zx_families_trace(
    seed: int,
    n: int,
    n_families: int,
    gap_ms: tuple[int, int],
    prefix_blocks: tuple[int, int] = (6, 10),
    suffix_blocks: tuple[int, int] = (1, 4),
    output: tuple[int, int] = (2, 40),
) -> list[Row]:
    """`n` rows `gap_ms` apart (uniform integers); the first `n_families` rows open one family
    each, later rows draw one; a row is its family's system prompt plus fresh blocks. Trace
    block size 64."""
    rng = random.Random(seed)
    next_id = [100000]
    families = [
        list(range(f * 1000, f * 1000 + rng.randint(*prefix_blocks))) for f in range(n_families)
    ]
    rows: list[Row] = []
    t = 0
    for i in range(n):
        t += rng.randint(*gap_ms)
        family = rng.randrange(n_families) if i >= n_families else i
        hashes = families[family] + _hash_ids(next_id, rng.randint(*suffix_blocks))
        cap = len(hashes) * 64
        rows.append(
            {
                "timestamp": t,
                "input_length": rng.randint(cap - 63, cap),
                "output_length": rng.randint(*output),
                "hash_ids": hashes,
            }
        )
    return rows


def zx_shared_pool_trace() -> list[Row]:
    """3 workers (round robin) sharing one host pool, budget 64 tokens: A (worker 0) computes
    block 0 in its pass 0 -> 7; B (worker 1, at 5) and C (worker 2, at 8) start with block 0."""
    return [
        {"timestamp": 0, "input_length": 92, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 74, "output_length": 12, "hash_ids": [0, 100]},
        {"timestamp": 8, "input_length": 74, "output_length": 3, "hash_ids": [0, 200]},
    ]


def zx_store_trace() -> list[Row]:
    """1 worker, G1 4 blocks: A stores blocks [1, 2] to G2, B's 4 blocks evict both from G1 and
    B stores its 4 as one copy; C at 100 starts with block 1 (found in G2 or not)."""
    return [
        {"timestamp": 0, "input_length": 128, "output_length": 2, "hash_ids": [1, 2]},
        {"timestamp": 50, "input_length": 256, "output_length": 1, "hash_ids": [3, 4, 5, 6]},
        {"timestamp": 100, "input_length": 128, "output_length": 5, "hash_ids": [1, 7]},
    ]


def zx_cohort_trace() -> list[Row]:
    """zx_store_trace with A's prompt [1, 1]: A's two G2 blocks land as one cohort and the
    mocker's sequence hash of the first is the larger, so B's store evicts the second."""
    return [
        {"timestamp": 0, "input_length": 128, "output_length": 2, "hash_ids": [1, 1]},
        {"timestamp": 50, "input_length": 256, "output_length": 1, "hash_ids": [3, 4, 5, 6]},
        {"timestamp": 100, "input_length": 128, "output_length": 5, "hash_ids": [1, 7]},
    ]


def zx_g3_write_trace() -> list[Row]:
    """6 rows from 4 families on 1 worker (G1 16, G2 12, G3 60 blocks), shrunk from a 40-row
    trace: the last row starts with family 2000's 4 blocks, the 4th of which only G2's LRU
    order decides (README.md)."""
    return [
        {
            "timestamp": 506,
            "input_length": 400,
            "output_length": 1,
            "hash_ids": [3000, 3001, 3002, 3003, 3004, 100022, 100023],
        },
        {
            "timestamp": 980,
            "input_length": 359,
            "output_length": 7,
            "hash_ids": [2000, 2001, 2002, 2003, 100048, 100049],
        },
        {"timestamp": 986, "input_length": 232, "output_length": 9, "hash_ids": [0, 1, 2, 100050]},
        {
            "timestamp": 1043,
            "input_length": 334,
            "output_length": 10,
            "hash_ids": [3000, 3001, 3002, 3003, 3004, 100052],
        },
        {
            "timestamp": 1133,
            "input_length": 300,
            "output_length": 2,
            "hash_ids": [1000, 1001, 1002, 100056, 100057],
        },
        {
            "timestamp": 1217,
            "input_length": 365,
            "output_length": 7,
            "hash_ids": [2000, 2001, 2002, 2003, 100059, 100060],
        },
    ]


@dataclass(frozen=True)
class ZxCase(Case):
    """A case with the KV router (`router`: KvRouterConfig changes; None = round robin), a
    KV-event lag, attention DP on aggregated workers, and engine keys for the KV tiers
    (`tiers`: native_host_offload, g3_offload and kv_cache_bytes_per_token)."""

    router: dict[str, Any] | None = None
    kv_event_lag_ms: float = 0.0
    dp_size: int = 1
    tiers: dict[str, Any] = field(default_factory=dict)
    # the KV router breaks a tie between idle targets at random (unseeded in the mocker): the
    # test compares worker ids renumbered in order of first use ("first_use")
    worker_ids: str = "exact"

    def _cluster_kwargs(self) -> dict[str, Any]:
        out = super()._cluster_kwargs()
        engines = (
            [out["extra_engine_args"]]
            if self.pd is None
            else [out["prefill_engine_args"], out["decode_engine_args"]]
        )
        for args in engines:
            args["engine"] = {**args["engine"], **self.tiers}
        if self.pd is None and self.dp_size != 1:
            out["extra_engine_args"]["dp_size"] = self.dp_size
        if self.router is not None:
            out["router_mode"] = "kv_router"
            out["router_config"] = {**ZX_ROUTER, **self.router}
            if self.kv_event_lag_ms > 0:
                out["kv_event_lag_ms"] = self.kv_event_lag_ms
        return out

    def spec(self) -> dict[str, Any]:
        """Extra case.json keys the test reads."""
        return {"worker_ids": self.worker_ids} if self.worker_ids != "exact" else {}


def zx_router_case(
    name: str,
    description: str,
    trace: Callable[[], list[Row]],
    pool_blocks: int,
    router_overrides: tuple[str, ...],
    **kwargs: Any,
) -> ZxCase:
    """A KV-router case: fixed timing 10 / 2 ms, `pool_blocks` KV blocks per rank, a 256-token
    budget, trace block size 64, worker ids compared in order of first use."""
    return ZxCase(
        name,
        description,
        trace,
        trace_block_size=64,
        engine={**ZX_FIXED, "num_gpu_blocks": pool_blocks, "max_num_batched_tokens": 256},
        servesim_overrides=(
            *ZX_FIXED_OVERRIDES,
            f"engine.num_gpu_blocks={pool_blocks}",
            "engine.max_num_batched_tokens=256",
            "router=kv",
            *router_overrides,
        ),
        worker_ids="first_use",
        **kwargs,
    )


ZX_TIER_OVERRIDES = (
    "engine.num_gpu_blocks=16",
    "timing=fixed",
    "timing.prefill_ms=10.0",
    "timing.decode_ms=1.0",
    "kv_cache.host_offload.num_host_blocks=12",
    "kv_cache.host_offload.d2h_bandwidth_gbps=8.388608",
    "kv_cache.host_offload.h2d_bandwidth_gbps=8.388608",
    "kv_cache.disk.num_g3_blocks=60",
    "kv_cache.disk.read_bandwidth_gbps=4.194304",
    "kv_cache.disk.write_bandwidth_gbps=4.194304",
)
ZX_TIER_ENGINE = {
    "num_gpu_blocks": 16,
    "timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0},
}
ZX_TIERS = {
    "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN,
    "native_host_offload": zx_host(12),
    "g3_offload": zx_disk(60, 4.194304),
}
ZX_STORE_OVERRIDES = (
    "engine.num_gpu_blocks=4",
    "timing=fixed",
    "timing.prefill_ms=7.0",
    "timing.decode_ms=1.0",
    "kv_cache.host_offload.d2h_bandwidth_gbps=8.388608",
    "kv_cache.host_offload.h2d_bandwidth_gbps=8.388608",
)
ZX_STORE_ENGINE = {
    "num_gpu_blocks": 4,
    "timing_model": {"type": "fixed", "prefill_ms": 7.0, "decode_ms": 1.0},
}


def zx_store_case(
    name: str, description: str, host_blocks: int, trace: Callable[[], list[Row]] = zx_store_trace
) -> ZxCase:
    """The trace of `zx_store_trace` (or `trace`) on 1 worker (G1 4 blocks, fixed 7 / 1 ms)
    over a G2 of `host_blocks` blocks, one block per ms each way."""
    return ZxCase(
        name,
        description,
        trace,
        trace_block_size=64,
        engine={**ZX_STORE_ENGINE, "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN},
        servesim_overrides=(
            *ZX_STORE_OVERRIDES,
            f"kv_cache.host_offload.num_host_blocks={host_blocks}",
        ),
        tiers={"native_host_offload": zx_host(host_blocks)},
    )


ZX_CASES = [
    zx_router_case(
        "zx1_kv_router_2p1d",
        "14 requests from 3 prompt families, KV router in front of 2 prefill workers and 1 "
        "decode worker (25 GB/s), queue threshold 0.5, fixed 10 / 2 ms, 200-block pools",
        lambda: zx_families_trace(4, 14, 3, (3, 25)),
        200,
        ("router.queue_threshold=0.5",),
        pd=(2, 1),
        bandwidth_gbps=25.0,
        router={"router_queue_threshold": 0.5},
    ),
    zx_router_case(
        "zx2_kv_router_dp2",
        "the 14 requests of zx1 on 1 worker with dp_size 2 (the KV router picks a rank), "
        "queue threshold 0.5, fixed 10 / 2 ms, 120-block pools per rank",
        lambda: zx_families_trace(4, 14, 3, (3, 25)),
        120,
        ("router.queue_threshold=0.5", "+engine.dp_size=2"),
        dp_size=2,
        router={"router_queue_threshold": 0.5},
    ),
    zx_router_case(
        "zx3_kv_event_lag",
        "14 requests from 3 families on 2 workers behind the KV router with KV events 20 ms "
        "late (which changes where requests go), fixed 10 / 2 ms, 120-block pools",
        lambda: zx_families_trace(0, 14, 3, (3, 25)),
        120,
        ("router.kv_event_lag_ms=20.0",),
        num_workers=2,
        router={},
        kv_event_lag_ms=20.0,
    ),
    ZxCase(
        "zx4_g3_disk_1w",
        "40 requests from 4 families, 1 worker: G1 16 blocks, G2 12 (one block per ms each "
        "way), G3 60 (4.19 GB/s, 0.1 ms to first byte): restores from G3 through G2",
        lambda: zx_families_trace(5, 40, 4, (0, 60), (2, 5), (1, 2), (1, 10)),
        trace_block_size=64,
        engine={**ZX_TIER_ENGINE, **ZX_TIERS},
        servesim_overrides=ZX_TIER_OVERRIDES,
    ),
    ZxCase(
        "zx5_shared_pool_in_flight",
        "3 requests on 3 workers sharing one host pool: blocks another worker is computing, or "
        "has just stored, are waited for and loaded (differs: README.md)",
        zx_shared_pool_trace,
        num_workers=3,
        trace_block_size=64,
        engine={
            "num_gpu_blocks": 18,
            "max_num_batched_tokens": 64,
            "timing_model": {"type": "fixed", "prefill_ms": 7.0, "decode_ms": 1.0},
            "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN,
        },
        servesim_overrides=(
            "engine.num_gpu_blocks=18",
            "engine.max_num_batched_tokens=64",
            "timing=fixed",
            "timing.prefill_ms=7.0",
            "timing.decode_ms=1.0",
            "kv_cache.host_offload.num_host_blocks=15",
            "kv_cache.host_offload.scope=cluster_shared",
            "kv_cache.host_offload.d2h_bandwidth_gbps=0.0",
            "kv_cache.host_offload.h2d_bandwidth_gbps=32.0",
        ),
        tiers={
            "native_host_offload": {
                **zx_host(15, "cluster_shared", 0.0),
                "h2d_bandwidth_gbps": 32.0,
            }
        },
    ),
    zx_store_case(
        "zx6_g2_store_too_big",
        "3 requests, 1 worker, G2 of 3 blocks: a 4-block store does not fit and stores "
        "nothing (differs: README.md)",
        3,
    ),
    zx_store_case(
        "zx7_g2_landing_order",
        "the trace of zx6 with a G2 of 5 blocks: the 4-block store evicts one block of [1, 2], "
        "the oldest by landing order (differs: README.md)",
        5,
    ),
    zx_store_case(
        "zx9_g2_cohort_key_order",
        "zx7 with A's prompt [1, 1]: A's two blocks landed together, the store of B evicts "
        "the one with the smaller Dynamo sequence hash, A's second (differs: README.md)",
        5,
        zx_cohort_trace,
    ),
    ZxCase(
        "zx8_g3_write_refreshes_g2",
        "6 requests, the tiers of zx4: a G2 block written to G3 becomes recent in G2 when the "
        "write lands (differs: README.md)",
        zx_g3_write_trace,
        trace_block_size=64,
        engine={**ZX_TIER_ENGINE, **ZX_TIERS},
        servesim_overrides=ZX_TIER_OVERRIDES,
    ),
]
CASES += ZX_CASES


# Issue 25, rules 2 and 3 and the fence they led to (cases zy1-zy4): G1 of 64-token blocks,
# fixed timing 10 / 1 ms, a 30-block G2 per rank. README.md gives the timelines.
def _zy_row(t: float, n_in: int, n_out: int, ids: list[int]) -> Row:
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def zy_deferred_trace() -> list[Row]:
    """A 4-block prefix stored to G2 and evicted from G1 by a 16-block prompt; then, at 60 ms,
    A (the prefix + 1) loads it from G2, B (the prefix + 1 other) waits for that load, C (12
    blocks) fits and D (1 block) does not."""
    return [
        _zy_row(0, 256, 1, [1, 2, 3, 4]),
        _zy_row(20, 1024, 1, list(range(100, 116))),
        _zy_row(60, 320, 5, [1, 2, 3, 4, 200]),
        _zy_row(60, 310, 5, [1, 2, 3, 4, 201]),
        _zy_row(60, 768, 3, list(range(400, 412))),
        _zy_row(60, 64, 7, [300]),
    ]


def zy_preempt_trace() -> list[Row]:
    """Y (2 blocks) at 0; X and V (6 blocks each) at 1, whose prompts take 600 ms each to
    copy to G2 (one block per 100 ms): X's 9th block preempts V while V's copy is in flight."""
    return [
        _zy_row(0, 96, 300, [50, 51]),
        _zy_row(1, 384, 300, list(range(1, 7))),
        _zy_row(1, 380, 300, list(range(11, 17))),
    ]


def zy_fence_trace() -> list[Row]:
    """Block 10 stored and refreshed (no copy in flight), block 11 still being copied (100 ms
    a block) when a 3-block prompt needs one cached block of a 4-block pool."""
    return [
        _zy_row(0, 64, 0, [10]),
        _zy_row(200, 64, 0, [11]),
        _zy_row(220, 64, 0, [10]),
        _zy_row(240, 192, 2, [13, 14, 15]),
    ]


def zy_promised_trace() -> list[Row]:
    """Two 4-block prefixes stored to G2 and evicted from G1 by a 16-block prompt; R (3
    blocks) decodes from 50; at 60 X (prefix 1 + 6 blocks) starts its load with 12 blocks
    free, then Y (prefix 2 + 1 block) would fit the 8 left, but not beside X's 6-block tail."""
    return [
        _zy_row(0, 256, 1, [1, 2, 3, 4]),
        _zy_row(0, 256, 1, [5, 6, 7, 8]),
        _zy_row(20, 1024, 1, list(range(100, 116))),
        _zy_row(50, 192, 20, [300, 301, 302]),
        _zy_row(60, 640, 3, [1, 2, 3, 4, *range(400, 406)]),
        _zy_row(60, 320, 3, [5, 6, 7, 8, 500]),
    ]


ZY_SLOW_STORE = 0.08388608  # GB/s: one 64-token Llama-3.1-8B block per 100 ms


def zy_case(
    name: str,
    description: str,
    trace: Callable[[], list[Row]],
    g1_blocks: int,
    d2h_gbps: float,
    pd: tuple[int, int] | None = None,
) -> ZxCase:
    """1 worker (or 1P1D: the decode pool is the tight one) with fixed 10 / 1 ms passes, a G1
    of `g1_blocks` 64-token blocks over a 30-block G2 per rank, copies to G2 at `d2h_gbps`
    and back at one block per ms."""
    host = {**zx_host(30), "d2h_bandwidth_gbps": d2h_gbps}
    fixed = {"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}}
    return ZxCase(
        name,
        description,
        trace,
        trace_block_size=64,
        engine={**fixed, "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN}
        | ({"num_gpu_blocks": g1_blocks} if pd is None else {}),
        decode={} if pd is None else {"num_gpu_blocks": g1_blocks},
        pd=pd,
        servesim_overrides=(
            "timing=fixed",
            "timing.prefill_ms=10.0",
            "timing.decode_ms=1.0",
            *((f"engine.num_gpu_blocks={g1_blocks}",) if pd is None else ()),
            "kv_cache.host_offload.num_host_blocks=30",
            f"kv_cache.host_offload.d2h_bandwidth_gbps={d2h_gbps}",
            "kv_cache.host_offload.h2d_bandwidth_gbps=8.388608",
        ),
        tiers={"native_host_offload": host},
    )


ZY_CASES = [
    zy_case(
        "zy1_host_deferred_behind_load",
        "6 requests, 1 worker, G1 16 blocks: a request waiting for blocks another one is "
        "loading from G2 is skipped (the requests behind it are admitted) and retried ahead "
        "of the queue",
        zy_deferred_trace,
        16,
        8.388608,
    ),
    zy_case(
        "zy2_host_preempt_store_in_flight",
        "3 requests, 1 worker, G1 19 blocks, prompts copied to G2 at 100 ms a block: "
        "preempting a request whose copy is in flight holds the worker's next pass until the "
        "copy lands",
        zy_preempt_trace,
        19,
        ZY_SLOW_STORE,
    ),
    zy_case(
        "zy3_pd_host_preempt_store_in_flight",
        "the trace of zy2 in 1P1D (instant transfers), decode pool 19 blocks: the same hold on "
        "the decode worker",
        zy_preempt_trace,
        19,
        ZY_SLOW_STORE,
        pd=(1, 1),
    ),
    zy_case(
        "zy4_host_fence_evicted_pinned",
        "4 requests, 1 worker, G1 4 blocks: evicting a cached block still being copied to G2 "
        "(the least recently used) delays the pass that reuses it until the copy lands",
        zy_fence_trace,
        4,
        ZY_SLOW_STORE,
    ),
    zy_case(
        "zy5_host_load_waits_for_promised_blocks",
        "6 requests, 1 worker, G1 16 blocks: a copy from G2 starts only if the request's "
        "blocks fit beside those promised to loads under way (and to prompts still in "
        "prefill)",
        zy_promised_trace,
        16,
        8.388608,
    ),
]


# Rules found on golden case a's trace with a 400-block G1 over a 1,500-block G2 (cases zy6-zy8):
# each trace is a shrunk cut of that trace (rows as they come, times from the first), default
# (polynomial) timing, 512-token trace blocks. README.md gives the timelines.
def zy_fenced_store_trace() -> list[Row]:
    """4573 (output 1) takes, at 670.7 ms, blocks a store of 6952's is still reading; at 886.6
    1781 needs blocks past the cached ones of 6952 into 4573's."""
    return [
        _zy_row(0, 6908, 296, [*range(12, 16), *range(932, 942)]),
        _zy_row(137, 4548, 33, [8, 9, 10, *range(942, 948)]),
        _zy_row(177, 7081, 1, [*range(2, 7), *range(41, 46), *range(948, 952)]),
        _zy_row(177, 6952, 1, [*range(16, 20), *range(952, 962)]),
        _zy_row(177, 1425, 338, [7, 962, 963]),
        _zy_row(177, 6901, 2, [*range(12, 16), *range(964, 974)]),
        _zy_row(291, 3114, 182, [*range(16, 20), 974, 975, 976]),
        _zy_row(428, 4573, 1, [8, 9, 10, *range(977, 983)]),
        _zy_row(534, 1781, 52, [*range(20, 24)]),
    ]


def zy_deferred_before_fit_trace() -> list[Row]:
    """7147 needs blocks 5173 is loading (at 1733.3) and would not fit either: it is set aside,
    so it goes before 6574, preempted later (2474.9), when room comes (2779.6)."""
    return [
        _zy_row(0, 4476, 121, [*range(12, 16), *range(643, 648)]),
        _zy_row(0, 6232, 26, [*range(20, 24), *range(364, 373)]),
        _zy_row(0, 722, 164, [11, 648]),
        _zy_row(10, 5051, 362, [*range(16, 20), *range(194, 198), 649, 650]),
        _zy_row(186, 3860, 199, [0, 1, *range(690, 696)]),
        _zy_row(186, 5996, 1, [*range(2, 7), *range(696, 703)]),
        _zy_row(186, 2855, 29, [*range(12, 16), 703, 704]),
        _zy_row(338, 3576, 1, [*range(20, 24), 705, 706, 707]),
        _zy_row(779, 8298, 1, [*range(708, 725)]),
        _zy_row(946, 5173, 171, [*range(2, 7), *range(725, 731)]),
        _zy_row(1325, 6574, 56, [*range(2, 7), *range(731, 739)]),
        _zy_row(1537, 2138, 259, [0, 1, 739, 740, 741]),
        _zy_row(1629, 7147, 101, [*range(2, 7), *range(742, 751)]),
    ]


def zy_set_aside_order_trace() -> list[Row]:
    """At 17720.6 5196 starts a load, 1841 waits for it, 4631 starts another; at 17786.9 the
    three go in that order: 1841 before 4631, whose rest then no longer fits."""
    return [
        _zy_row(0, 7480, 65, [*range(2, 7), *range(584, 594)]),
        _zy_row(52, 6637, 126, [*range(16, 20), *range(594, 603)]),
        _zy_row(158, 2721, 102, [0, 1, *range(603, 607)]),
        _zy_row(226, 4916, 55, [0, 1, *range(76, 83), 607]),
        _zy_row(275, 12297, 36, [*range(608, 633)]),
        _zy_row(275, 6215, 203, [*range(12, 16), *range(633, 642)]),
        _zy_row(275, 2106, 84, [*range(16, 20), 642]),
        _zy_row(5186, 6908, 296, [*range(12, 16), *range(932, 942)]),
        _zy_row(5323, 4548, 33, [8, 9, 10, *range(942, 948)]),
        _zy_row(5363, 1425, 338, [7, 962, 963]),
        _zy_row(5477, 3114, 182, [*range(16, 20), 974, 975, 976]),
        _zy_row(5720, 1781, 52, [*range(20, 24)]),
        _zy_row(5886, 4636, 288, [*range(2, 7), *range(175, 179), 252]),
        _zy_row(5935, 6060, 145, [*range(20, 24), *range(983, 991)]),
        _zy_row(6149, 2716, 2, [11, *range(991, 996)]),
        _zy_row(6149, 4243, 19, [*range(12, 16), *range(996, 1001)]),
        _zy_row(6257, 10472, 151, [*range(234, 252), 1001, 1002, 1003]),
        _zy_row(6712, 10353, 16, [*range(111, 132)]),
        _zy_row(6774, 5196, 18, [7, *range(1013, 1023)]),
        _zy_row(6938, 1841, 133, [7, 1023, 1024, 1025]),
        _zy_row(6950, 4631, 1, [8, 9, 10, *range(1026, 1033)]),
    ]


def zy_g2_case(name: str, description: str, trace: Callable[[], list[Row]]) -> ZxCase:
    """1 worker, a 400-block G1 over a 1,500-block G2 at 32 GB/s each way, default timing."""
    return ZxCase(
        name,
        description,
        trace,
        engine={"num_gpu_blocks": 400, "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN},
        servesim_overrides=(
            "engine.num_gpu_blocks=400",
            "kv_cache.host_offload.num_host_blocks=1500",
        ),
        tiers={"native_host_offload": zx_host(1500, bw=32.0)},
    )


ZY_CASES += [
    zy_g2_case(
        "zy6_host_fenced_block_not_stored",
        "9 requests, 1 worker, G1 400 blocks: a block taken from under a store still in flight "
        "is not copied to G2 in that pass (its request's store waits for a later pass)",
        zy_fenced_store_trace,
    ),
    zy_g2_case(
        "zy7_host_deferred_before_fit",
        "13 requests, 1 worker, G1 400 blocks: a request whose blocks are still being loaded is "
        "set aside before its KV is checked, and goes before the queue's head later",
        zy_deferred_before_fit_trace,
    ),
    zy_g2_case(
        "zy8_host_set_aside_order",
        "21 requests, 1 worker, G1 400 blocks: requests set aside (deferred, loading, landed) "
        "are tried in the order they were set aside",
        zy_set_aside_order_trace,
    ),
]


def zy_g3_stage_trace() -> list[Row]:
    """4377 (at 1177) shares a 24-block prefix with 5775, by then only in G3: at 1266.9 the
    lookup stages it into G2 (G3 -> G2), and the copy into G1 starts at the next pass."""
    return [
        _zy_row(0, 5775, 2, [8, 9, 10, *range(1004, 1013)]),
        _zy_row(354, 10353, 16, [*range(111, 132)]),
        _zy_row(774, 8246, 2, [*range(1033, 1050)]),
        _zy_row(1053, 7150, 37, [*range(16, 20), *range(1057, 1067)]),
        _zy_row(1076, 4377, 398, [8, 9, 10, *range(1067, 1073)]),
    ]


def zy_g3_instant_read_trace() -> list[Row]:
    """tier_fuzz.py --g3 case 34: blocks read back from a G3 of unlimited bandwidth still take
    its 0.1 ms latency."""
    return [
        _zy_row(50, 15, 28, [10000]),
        _zy_row(50, 218, 1, [2000, 2001, 2002, 10100]),
        _zy_row(60, 178, 0, [0, 10200, 10201]),
        _zy_row(70, 131, 1, [0, 1, 10300]),
        _zy_row(80, 196, 6, [2000, 2001, 10400, 10401]),
        _zy_row(85, 311, 17, [1000, 1001, 1002, 10500, 10501]),
        _zy_row(90, 351, 25, [0, 1, 2, 10600, 10601, 10602]),
        _zy_row(110, 60, 1, [10700]),
        _zy_row(317, 398, 0, [*range(2000, 2004), 10800, 10801, 10802]),
        _zy_row(417, 243, 1, [3000, 3001, 3002, 10900]),
    ]


ZY_CASES += [
    ZxCase(
        "zy9_g3_stage_then_load",
        "5 requests, 1 worker, G1 400 blocks over a 300-block G2 and a 3,000-block G3: a G3 hit "
        "is staged into G2 at the lookup (the request set aside), then loaded from G2",
        zy_g3_stage_trace,
        engine={"num_gpu_blocks": 400, "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN},
        servesim_overrides=(
            "engine.num_gpu_blocks=400",
            "kv_cache.host_offload.num_host_blocks=300",
            "kv_cache.disk.num_g3_blocks=3000",
        ),
        tiers={
            "native_host_offload": zx_host(300, bw=32.0),
            "g3_offload": zx_disk(3000, 10.0),
        },
    ),
    ZxCase(
        "zy10_g3_instant_read_latency",
        "10 requests, 1 worker, fixed 7 / 3 ms, G1 16 blocks, an 11-block G2, a 42-block G3 read "
        "at unlimited bandwidth: each read still takes the 0.1 ms latency",
        zy_g3_instant_read_trace,
        trace_block_size=64,
        engine={
            "timing_model": {"type": "fixed", "prefill_ms": 7.0, "decode_ms": 3.0},
            "num_gpu_blocks": 16,
            "max_num_batched_tokens": 64,
            "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN,
        },
        servesim_overrides=(
            "timing=fixed",
            "timing.prefill_ms=7.0",
            "timing.decode_ms=3.0",
            "engine.num_gpu_blocks=16",
            "engine.max_num_batched_tokens=64",
            "kv_cache.host_offload.num_host_blocks=11",
            "kv_cache.host_offload.d2h_bandwidth_gbps=8.388608",
            "kv_cache.host_offload.h2d_bandwidth_gbps=8.388608",
            "kv_cache.disk.num_g3_blocks=42",
            "kv_cache.disk.read_bandwidth_gbps=0.0",
            "kv_cache.disk.write_bandwidth_gbps=8.388608",
        ),
        tiers={
            "native_host_offload": zx_host(11),
            "g3_offload": {**zx_disk(42, 8.388608), "read_bandwidth_gbps": 0.0},
        },
    ),
]
CASES += ZY_CASES


# P/D rules found on the tier fuzz's and the conversation trace's differences (cases zw*).
# README.md gives the timelines.
def zw_zero_output_same_instant_trace() -> list[Row]:
    """A (output 0) and B (output 6) arrive together, share a prefill pass and are delivered
    (instantly) to the idle decode worker at its end, A first: A joins B's first decode pass
    and ends at its end. C (output 0) later reaches an idle decode worker alone and ends at
    its activation."""
    return [
        {"timestamp": 0, "input_length": 32, "output_length": 0, "hash_ids": [1]},
        {"timestamp": 0, "input_length": 128, "output_length": 6, "hash_ids": [2, 3]},
        {"timestamp": 100, "input_length": 96, "output_length": 0, "hash_ids": [4, 5]},
    ]


def zw_spent_budget_trace() -> list[Row]:
    """A and B (output 20) decode from 10 and spend the decode worker's 2-token budget every
    pass; C (output 5) is delivered at 20 and waits until A and B end (30)."""
    return [
        {"timestamp": 0, "input_length": 64, "output_length": 20, "hash_ids": [1]},
        {"timestamp": 0, "input_length": 64, "output_length": 20, "hash_ids": [2]},
        {"timestamp": 5, "input_length": 64, "output_length": 5, "hash_ids": [3]},
    ]


ZW_CASES = [
    Case(
        "zw1_pd_zero_output_same_instant",
        "3 requests, P/D, fixed 10 / 3 ms, instant transfers: an output-0 request delivered to "
        "an idle decode worker at the instant another request is delivered there joins that "
        "request's first pass",
        zw_zero_output_same_instant_trace,
        trace_block_size=64,
        engine={"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 3.0}},
        servesim_overrides=("timing=fixed", "timing.prefill_ms=10.0", "timing.decode_ms=3.0"),
        pd=(1, 1),
    ),
    ZxCase(
        "zw2_pd_host_spent_budget_delivered",
        "3 requests, P/D, fixed 10 / 1 ms, a 30-block G2 per rank, decode budget 2 tokens: "
        "with KV tiers a spent budget keeps a delivered request out of the pass",
        zw_spent_budget_trace,
        trace_block_size=64,
        engine={
            "timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0},
            "kv_cache_bytes_per_token": KV_BYTES_PER_TOKEN,
        },
        decode={"max_num_batched_tokens": 2},
        pd=(1, 1),
        servesim_overrides=(
            "timing=fixed",
            "timing.prefill_ms=10.0",
            "timing.decode_ms=1.0",
            "kv_cache.host_offload.num_host_blocks=30",
            "kv_cache.host_offload.d2h_bandwidth_gbps=8.388608",
            "kv_cache.host_offload.h2d_bandwidth_gbps=8.388608",
        ),
        tiers={"native_host_offload": zx_host(30)},
    ),
]
CASES += ZW_CASES

# Engine cases (SGLang, TRT-LLM, speculative decoding) live beside this file, one module per
# engine (`cases_<engine>.py`), each with `def cases(Case, ENGINES) -> list[Case]` (ENGINES: the
# mocker's engine block of each backend as compare_dynamo.py writes it, by engine.kind).
SGLANG_ENGINE: dict[str, Any] = {
    **DEFAULT_ENGINE,
    "backend": "sglang",
    "block_size": 1,
    "sglang": {
        "schedule_policy": "fifo",
        "max_prefill_tokens": 16384,
        "chunked_prefill_size": 8192,
        "clip_max_new_tokens": 4096,
        "schedule_conservativeness": 1.0,
    },
    "prefill_decode_interval": 0,
}
TRTLLM_ENGINE: dict[str, Any] = {
    **DEFAULT_ENGINE,
    "backend": "trtllm",
    "block_size": 32,
    "trtllm": {"capacity_scheduler_policy": "guaranteed_no_evict"},
}

ENGINES = {"vllm": DEFAULT_ENGINE, "sglang": SGLANG_ENGINE, "trtllm": TRTLLM_ENGINE}


def engine_cases() -> list[Case]:
    found: list[Case] = []
    for path in sorted(HERE.glob("cases_*.py")):
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        found += module.cases(Case, ENGINES)
    return found


CASES += engine_cases()


# --------------------------------------------------------------------------- writing


def write_trace(rows: list[Row], path: Path) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    size = len(text.encode())
    if size >= MAX_TRACE_BYTES:
        raise SystemExit(f"{path}: {size} bytes; fixtures must stay under {MAX_TRACE_BYTES}")
    path.write_text(text)


def _sort_key(rec: dict[str, Any]) -> tuple[float, int, int, float, float]:
    ft = rec.get("first_token_ms")
    return (
        rec["arrival_time_ms"],
        rec["input_length"],
        rec["requested_output_length"],
        -1.0 if ft is None else ft,
        rec["terminal_time_ms"],
    )


def run_mocker(case: Case, case_dir: Path) -> None:
    import dynamo._core as core  # only in the mocker's environment

    raw = case_dir / "requests.raw.jsonl"
    t0 = time.perf_counter()
    kwargs = case.mocker_kwargs()
    if isinstance(kwargs.get("router_config"), dict):  # the KV router's config object
        kwargs["router_config"] = core.KvRouterConfig.from_json(json.dumps(kwargs["router_config"]))
    result = core.run_mocker_trace_replay(
        [str(case_dir / "trace.jsonl")], report_jsonl_path=str(raw), **kwargs
    )
    wall = time.perf_counter() - t0
    summary = {k: v for k, v in dict(result.summary).items() if k not in WALL_KEYS}
    summary["_mocker_version"] = f"ai-dynamo-runtime {metadata.version('ai-dynamo-runtime')}"
    (case_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    raw_records = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    raw.unlink()
    fields = case.request_fields
    missing = sorted({f for rec in raw_records for f in fields if f not in rec})
    if missing:
        raise SystemExit(f"{case.name}: the mocker's records lack {missing}")
    records = [{f: rec[f] for f in fields} for rec in raw_records]
    records.sort(key=_sort_key)
    (case_dir / "requests.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    )
    # a P/D request is admitted twice (prefill, then decode) without any preemption
    first = 1 if case.pd is None else 2
    readmitted = sum(1 for r in records if r["admission_count"] > first)
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r["terminal_status"]] = statuses.get(r["terminal_status"], 0) + 1
    print(
        f"{case.name}: {len(records)} records {statuses}, {readmitted} readmitted, "
        f"mocker {wall:.3f} s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces-only", action="store_true", help="write traces and case.json only")
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    args = ap.parse_args(argv)
    chosen = [c for c in CASES if not args.cases or c.name in args.cases]
    for case in chosen:
        case_dir = HERE / case.name
        case_dir.mkdir(exist_ok=True)
        write_trace(case.trace(), case_dir / "trace.jsonl")
        spec = {
            "name": case.name,
            "description": case.description,
            "trace": "trace.jsonl",
            "servesim_overrides": case.overrides(),
            "mocker_kwargs": case.mocker_kwargs(),
            **(case.spec() if isinstance(case, ZxCase) else {}),
        }
        (case_dir / "case.json").write_text(json.dumps(spec, indent=1) + "\n")
        if not args.traces_only:
            run_mocker(case, case_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
