"""Regenerate the golden mocker fixtures in this directory.

Each case directory holds a small hand-shaped Mooncake trace (generated here from a fixed seed,
never copied from a shared trace), `case.json` (the servesim Hydra overrides and the exact
keyword arguments given to Dynamo's mocker), and the mocker's outputs: `summary.json` and
`requests.jsonl` (its `report_jsonl_path` records, trimmed to `REQUEST_FIELDS`).

    /work/venvs/dynamo/bin/python tests/golden/mocker/make_fixtures.py           # everything
    python tests/golden/mocker/make_fixtures.py --traces-only                   # no mocker

Only the standard library is used, so the first form runs in the mocker's own environment
(`ai-dynamo-runtime`, module `dynamo._core`); servesim is not needed here.

Normalisation of the mocker outputs, so that a regeneration gives a clean diff:
* `summary.json`: the host-speed keys (`wall_time_ms`, `processed_tokens_per_s`,
  `processed_output_tokens_per_s`) are dropped;
* `requests.jsonl`: only the fields in `REQUEST_FIELDS` are kept (those the golden test reads
  plus a few times and counts useful when a case fails), in that order, with the values the
  mocker wrote; the rest (the random `uuid`, routing and admission histories, disaggregation
  fields that are null here, ...) is dropped. The rows are sorted by (arrival_time_ms,
  input_length, requested_output_length, first_token_ms, terminal_time_ms), because the
  mocker writes rows with equal arrival times in a random order.
"""

from __future__ import annotations

import argparse
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


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    trace: Callable[[], list[Row]]
    num_workers: int
    trace_block_size: int = 512
    engine: dict[str, Any] = field(default_factory=dict)  # changes to DEFAULT_ENGINE
    servesim_overrides: tuple[str, ...] = ()

    def mocker_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `run_mocker_trace_replay` (without the trace list and
        report path)."""
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

    def overrides(self) -> list[str]:
        """servesim Hydra overrides (add `workload.path=<case dir>/trace.jsonl`)."""
        return [
            *BASE_OVERRIDES,
            f"topology.num_workers={self.num_workers}",
            f"workload.trace_block_size={self.trace_block_size}",
            *self.servesim_overrides,
        ]


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
]


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
    result = core.run_mocker_trace_replay(
        [str(case_dir / "trace.jsonl")], report_jsonl_path=str(raw), **case.mocker_kwargs()
    )
    wall = time.perf_counter() - t0
    summary = {k: v for k, v in dict(result.summary).items() if k not in WALL_KEYS}
    summary["_mocker_version"] = f"ai-dynamo-runtime {metadata.version('ai-dynamo-runtime')}"
    (case_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    raw_records = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    raw.unlink()
    missing = sorted({f for rec in raw_records for f in REQUEST_FIELDS if f not in rec})
    if missing:
        raise SystemExit(f"{case.name}: the mocker's records lack {missing}")
    records = [{f: rec[f] for f in REQUEST_FIELDS} for rec in raw_records]
    records.sort(key=_sort_key)
    (case_dir / "requests.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    )
    readmitted = sum(1 for r in records if r["admission_count"] > 1)
    print(
        f"{case.name}: {len(records)} records, {summary['completed_requests']} completed, "
        f"{readmitted} readmitted, mocker {wall:.3f} s"
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
        }
        (case_dir / "case.json").write_text(json.dumps(spec, indent=1) + "\n")
        if not args.traces_only:
            run_mocker(case, case_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
