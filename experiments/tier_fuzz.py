"""Random small traces with a G2 host tier, replayed by servesim and by Dynamo's mocker
(`native_host_offload`), compared request by request.

    python experiments/tier_fuzz.py [--cases 150] [--seed 0] [--pd | --g3] [--mocker-python PY]

Each case: 2-14 Mooncake rows (prompts of 1-400 tokens sharing prefixes in 4 families, outputs
0-30), fixed timing, a G1 pool of 8-40 blocks of 64 tokens, a G2 pool of 1-40 blocks (per rank,
or cluster-shared in about 30 % of the cases), copy bandwidths drawn from 0 (instant), 1,
8.388608 (one Llama-3.1-8B block per ms) and 32 GB/s, 1 or 2 workers. A case matches when every
request's arrival, first admission, first token and end agree to 1e-6 ms and its reused tokens,
output length and status are equal. Prints each differing case (its first differences) and one
line per scope: `dp_rank_local: M of N cases match`.

With `--pd` each case is 1P1D instead: the same kind of trace, a prefill pool of 40 blocks, a
tight decode pool of 8-30 blocks, G2 on both roles (per rank), copy bandwidths as above and a
transfer link of 1, 8.388608 or 32 GB/s or instant; the P/D lifecycle fields (prefill
admission, source held and released, destination reserved and activated, decode admission,
decode-side reused tokens) are compared too.

With `--g3` each case (one worker or two, per-rank G2) also has a worker-local G3 pool of 4-80
blocks under its G2, read and write bandwidths drawn as above, the default 0.1 ms latency.

Exit status 0 (differences are reported, not failures), 2 for bad arguments or no mocker
(`dynamo._core` not importable here and neither --mocker-python nor $SERVESIM_MOCKER_PYTHON
set).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_dynamo as cd  # noqa: E402

from servesim import simulate  # noqa: E402

FIELDS = (
    "arrival_time_ms",
    "first_admit_ms",
    "first_token_ms",
    "terminal_time_ms",
    "reused_input_tokens",
    "output_length",
    "terminal_status",
)
PD_FIELDS = (*cd.PD_TIME_FIELDS, "decode_reused_input_tokens")


def random_rows(rng: random.Random) -> list[dict[str, Any]]:
    """2-14 Mooncake rows: prompts of 1-400 tokens sharing prefixes in 4 families."""
    rows = []
    t = 0
    for i in range(rng.randint(2, 14)):
        t += rng.choice([0, 5, 10, 20, 50, 100, rng.randint(0, 300)])
        n_in = rng.randint(1, 400)
        n_blocks = -(-n_in // 64)
        family = rng.randint(0, 3)
        ids = [family * 1000 + k for k in range(n_blocks // 2 + rng.randint(0, 1))][:n_blocks]
        ids += [10000 + i * 100 + k for k in range(n_blocks - len(ids))]
        n_out = rng.choice([0, 1, 2, rng.randint(0, 30)])
        rows.append({"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids})
    return rows


BANDWIDTHS = [0.0, 1.0, 8.388608, 32.0]


def random_case(seed: int, out: Path, g3: bool = False) -> tuple[Path, int, list[str]]:
    """One case's trace file, worker count and servesim overrides (with `g3`: per-rank G2 over
    a G3 pool)."""
    rng = random.Random(seed)
    rows = random_rows(rng)
    path = out / f"case{seed}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bandwidths = BANDWIDTHS
    overrides = [
        "timing=fixed",
        f"timing.prefill_ms={rng.choice([10.0, 7.0])}",
        f"timing.decode_ms={rng.choice([1.0, 3.0])}",
        "workload.trace_block_size=64",
        f"engine.num_gpu_blocks={rng.randint(8, 40)}",
        f"engine.max_num_batched_tokens={rng.choice([64, 256, 8192])}",
        f"kv_cache.host_offload.num_host_blocks={rng.randint(1, 40)}",
        f"kv_cache.host_offload.d2h_bandwidth_gbps={rng.choice(bandwidths)}",
        f"kv_cache.host_offload.h2d_bandwidth_gbps={rng.choice(bandwidths)}",
    ]
    workers = rng.choice([1, 1, 2])
    if g3:
        overrides += [
            f"kv_cache.disk.num_g3_blocks={rng.randint(4, 80)}",
            f"kv_cache.disk.read_bandwidth_gbps={rng.choice(bandwidths)}",
            f"kv_cache.disk.write_bandwidth_gbps={rng.choice(bandwidths)}",
        ]
    elif rng.random() < 0.3:
        overrides.append("kv_cache.host_offload.scope=cluster_shared")
    return path, workers, overrides


def random_pd_case(seed: int, out: Path) -> tuple[Path, cd.Shape, list[str]]:
    """One 1P1D case's trace file, shape and servesim overrides."""
    rng = random.Random(seed)
    rows = random_rows(rng)
    path = out / f"pd{seed}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    link = rng.choice([None, 1.0, 8.388608, 32.0])
    overrides = [
        "timing=fixed",
        f"timing.prefill_ms={rng.choice([10.0, 7.0])}",
        f"timing.decode_ms={rng.choice([1.0, 3.0])}",
        "workload.trace_block_size=64",
        "engine.num_gpu_blocks=40",
        f"topology.decode.num_gpu_blocks={rng.randint(8, 30)}",
        f"engine.max_num_batched_tokens={rng.choice([64, 256, 8192])}",
        f"kv_cache.host_offload.num_host_blocks={rng.randint(1, 40)}",
        f"kv_cache.host_offload.d2h_bandwidth_gbps={rng.choice(BANDWIDTHS)}",
        f"kv_cache.host_offload.h2d_bandwidth_gbps={rng.choice(BANDWIDTHS)}",
    ]
    if link is not None:
        overrides.append(f"link.bandwidth_gbps={link}")
    return path, cd.Shape(prefill=1, decode=1), overrides


def differences(
    ours: list[dict[str, Any]], ref: list[dict[str, Any]], fields: tuple[str, ...] = FIELDS
) -> list[tuple]:
    pairs, unmatched = cd.join_records(ours, ref)
    out: list[tuple] = [("unmatched", unmatched)] if unmatched else []
    for a, b in pairs:
        for f in fields:
            x, y = a.get(f), b.get(f)
            if x == y:
                continue
            if isinstance(x, float) and isinstance(y, float) and abs(x - y) < 1e-6:
                continue
            if f == "terminal_status" and {x, y} == {"rejected", "failed"}:
                continue
            out.append((a["arrival_time_ms"], f, x, y))
    return sorted(out, key=str)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0, help="first case's seed")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--pd", action="store_true", help="1P1D cases (G2 on both roles)")
    kind.add_argument("--g3", action="store_true", help="a G3 pool under each rank's G2")
    parser.add_argument(
        "--mocker-python",
        default=None,
        help="the mocker's interpreter when dynamo._core is not importable here "
        "(default: $SERVESIM_MOCKER_PYTHON)",
    )
    args = parser.parse_args(argv)
    if args.cases <= 0:
        parser.error("--cases must be positive")
    try:
        runner = cd.choose_runner(args.mocker_python)
    except RuntimeError as e:
        parser.error(str(e))
    tally: dict[str, list[int]] = (
        {"pd_1p1d": [0, 0]}
        if args.pd
        else {"g3_worker_local": [0, 0]}
        if args.g3
        else {"dp_rank_local": [0, 0], "cluster_shared": [0, 0]}
    )
    without_g2 = 0
    with tempfile.TemporaryDirectory(prefix="tier_fuzz_") as tmp:
        out = Path(tmp)
        for seed in range(args.seed, args.seed + args.cases):
            shape: cd.Shape | int
            if args.pd:
                path, shape, overrides = random_pd_case(seed, out)
                fields, scope, what = FIELDS + PD_FIELDS, "pd_1p1d", "1P1D"
            else:
                path, shape, overrides = random_case(seed, out, args.g3)
                fields, what = FIELDS, f"{shape} worker(s)"
            cfg = cd.compose_run_config(path, shape, overrides)
            report = out / f"mocker{seed}.jsonl"
            runner.run(path, {**cd.mocker_kwargs(cfg), "report_jsonl_path": str(report)})
            ref = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
            diffs = differences(cd.servesim_records(simulate(cfg)), ref, fields)
            if args.g3:
                scope = "g3_worker_local"
            elif not args.pd:
                scope = cfg.kv_cache.host_offload.scope
            tally[scope][1] += 1
            if diffs and args.pd:
                # the same case without G2: a difference there is not the host tier's
                bare = [o for o in overrides if not o.startswith("kv_cache.")]
                cfg = cd.compose_run_config(path, shape, bare)
                try:
                    runner.run(path, {**cd.mocker_kwargs(cfg), "report_jsonl_path": str(report)})
                except Exception as e:  # the mocker's own replay invariants
                    what += f", the mocker fails without G2 ({str(e)[:60]})"
                else:
                    ref = [json.loads(x) for x in report.read_text().splitlines() if x.strip()]
                    if differences(cd.servesim_records(simulate(cfg)), ref, fields):
                        what += ", differs without G2 too"
                        without_g2 += 1
            if diffs:
                print(f"case {seed} ({what}; {' '.join(overrides[1:])}):")
                for d in diffs[:4]:
                    print("   ", d)
            else:
                tally[scope][0] += 1
    for name, (ok, n) in tally.items():
        print(f"{name}: {ok} of {n} cases match")
    if args.pd:
        n_diff = tally["pd_1p1d"][1] - tally["pd_1p1d"][0]
        print(f"of the {n_diff} differing, {without_g2} differ without G2 too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
