"""Random small traces replayed by servesim and by Dynamo's mocker under one engine (sglang,
trtllm or vllm), compared request by request.

    python experiments/engine_fuzz.py --engine sglang [--cases 200] [--seed 0]
        [--override KEY=VALUE ...] [--mocker-python PY]

Each case: 2-24 Mooncake rows (prompts of 1-600 tokens sharing prefixes in 4 families, 64
tokens per trace hash id, outputs 0-80), fixed or polynomial timing, 1 or 2 workers, a tight KV
pool and budgets drawn per engine (sglang: 1- or 16-token pages, a pool of up to 4,000 tokens,
chunked_prefill_size, max_prefill_tokens, clip_max_new_tokens, schedule_policy, max_num_seqs;
trtllm and vllm: 32-token blocks, up to 80 blocks, max_num_batched_tokens, max_num_seqs); every
pool holds the longest sequence (the mocker stops with an error on a request that never fits).
A case matches when every request's arrival, first admission, first token and end agree to
1e-6 ms and its reused tokens, output length and status are equal. Prints each differing case
(its first differences) and `M of N cases match`.

Exit status 0 (differences are reported, not failures), 2 for bad arguments or no mocker.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_dynamo as cd  # noqa: E402
from tier_fuzz import differences  # noqa: E402

from servesim import simulate  # noqa: E402


def random_rows(rng: random.Random) -> list[dict[str, Any]]:
    """2-24 rows: prompts of 1-600 tokens sharing prefixes in 4 families (64-token ids)."""
    rows = []
    t = 0
    for i in range(rng.randint(2, 24)):
        t += rng.choice([0, 0, 5, 10, 20, 50, rng.randint(0, 200)])
        n_in = rng.randint(1, 600)
        n_blocks = -(-n_in // 64)
        family = rng.randint(0, 3)
        ids = [family * 1000 + k for k in range(n_blocks // 2 + rng.randint(0, 1))][:n_blocks]
        ids += [10000 + i * 100 + k for k in range(n_blocks - len(ids))]
        n_out = rng.choice([0, 1, 2, rng.randint(0, 80), rng.randint(0, 80)])
        rows.append({"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids})
    return rows


def engine_overrides(engine: str, rng: random.Random, longest: int) -> list[str]:
    """A tight pool and budgets for `engine` (a pool that holds the `longest` sequence: the
    mocker stops with an error when a request can never be admitted)."""
    if engine == "sglang":
        page = rng.choice([1, 1, 16])
        chunk = rng.choice([64, 128, 512, 8192])
        return [
            "engine=sglang",
            f"engine.block_size={page}",
            f"engine.num_gpu_blocks={rng.randint(longest + 64, 4000) // page}",
            f"engine.chunked_prefill_size={chunk}",
            f"engine.max_prefill_tokens={rng.choice([128, 512, 16384])}",
            f"engine.clip_max_new_tokens={rng.choice([16, 4096])}",
            f"engine.schedule_policy={rng.choice(['fifo', 'lpm'])}",
            f"engine.max_num_seqs={rng.choice([2, 4, 256])}",
        ]
    return [
        f"engine={engine}",
        "engine.block_size=32",
        f"engine.num_gpu_blocks={rng.randint(-(-longest // 32) + 1, 80)}",
        f"engine.max_num_batched_tokens={rng.choice([64, 256, 8192])}",
        f"engine.max_num_seqs={rng.choice([2, 4, 256])}",
    ]


def random_case(engine: str, seed: int, out: Path) -> tuple[Path, int, list[str]]:
    """One case's trace file, worker count and servesim overrides."""
    rng = random.Random(seed)
    rows = random_rows(rng)
    path = out / f"case{seed}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    timing = (
        ["timing=polynomial"]
        if rng.random() < 0.3
        else [
            "timing=fixed",
            f"timing.prefill_ms={rng.choice([10.0, 7.0])}",
            f"timing.decode_ms={rng.choice([1.0, 3.0])}",
        ]
    )
    longest = max(r["input_length"] + r["output_length"] for r in rows)
    overrides = [*timing, "workload.trace_block_size=64", *engine_overrides(engine, rng, longest)]
    return path, rng.choice([1, 1, 2]), overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["sglang", "trtllm", "vllm"], required=True)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="first case's seed")
    parser.add_argument("--override", action="append", default=[], help="added to every case")
    parser.add_argument("--show", type=int, default=4, help="differences shown per case")
    parser.add_argument("--mocker-python", default=None, help="default: $SERVESIM_MOCKER_PYTHON")
    args = parser.parse_args(argv)
    if args.cases <= 0:
        parser.error("--cases must be positive")
    try:
        runner = cd.choose_runner(args.mocker_python)
    except RuntimeError as e:
        parser.error(str(e))
    if runner.python is not None:  # some cases make the mocker spin: stop it, go on
        runner = dataclasses.replace(runner, timeout_s=120.0, memory_bytes=8 << 30)
    ok = 0
    with tempfile.TemporaryDirectory(prefix="engine_fuzz_") as tmp:
        out = Path(tmp)
        for seed in range(args.seed, args.seed + args.cases):
            path, workers, overrides = random_case(args.engine, seed, out)
            overrides += args.override
            cfg = cd.compose_run_config(path, workers, overrides)
            report = out / f"mocker{seed}.jsonl"
            try:
                runner.run(path, {**cd.mocker_kwargs(cfg), "report_jsonl_path": str(report)})
            except Exception as e:  # the mocker's own checks or invariants
                print(f"case {seed}: the mocker fails: {str(e)[-300:]}")
                continue
            ref = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
            diffs = differences(cd.servesim_records(simulate(cfg)), ref)
            if diffs:
                print(f"case {seed} ({workers} worker(s); {' '.join(overrides)}):")
                for d in diffs[: args.show]:
                    print("   ", d)
            else:
                ok += 1
    print(f"{args.engine}: {ok} of {args.cases} cases match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
