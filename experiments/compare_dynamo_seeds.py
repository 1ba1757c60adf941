"""Compare servesim with Dynamo's mocker over several seeds of speculative decoding's draws.

With acceptance rates strictly between 0 and 1 each side draws its bursts from its own random
generator (servesim's cannot reproduce the mocker's Rust stream), so one seed's run is not
comparable request by request. This runs the same case (experiments/compare_dynamo.py's
`run_case`: servesim and the mocker on one trace, the mocker's settings translated from
servesim's config) once per `engine.speculative.seed` (the mocker's `aic_mtp_seed`), and
prints, per metric, each side's mean and spread over the seeds and the difference of the
means in units of the mocker's own spread (its standard deviation across seeds): that spread
is the tolerance.

    python experiments/compare_dynamo_seeds.py --trace conversation_trace.jsonl \\
        --workers 4 --seeds 1,2,3,4,5 \\
        --override engine.speculative.num_speculative_tokens=3

`--override` and `--workers` / `--pd` are compare_dynamo.py's. Exit status 0 when every
metric's servesim mean lies within the mocker's range over the seeds widened by one of its
standard deviations, 1 otherwise, 2 on a configuration or run error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/ is not a package
from compare_dynamo import METRICS, case_shapes, choose_runner, run_case  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", required=True, help="one Mooncake JSONL trace")
    ap.add_argument("--workers", help="aggregated workers (one count)")
    ap.add_argument("--pd", help="one P/D shape, PxD")
    ap.add_argument("--seeds", default="1,2,3,4,5", help="engine.speculative.seed values")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, help="write every seed's summaries as JSON")
    ap.add_argument("--mocker-python", help="as in compare_dynamo.py")
    return ap.parse_args(argv)


def spread(values: list[float]) -> tuple[float, float, float, float]:
    """Mean, standard deviation (population), min and max."""
    return statistics.fmean(values), statistics.pstdev(values), min(values), max(values)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        shapes = case_shapes(args.workers, args.pd, args.override)
        if len(shapes) != 1 or len(seeds) < 2:
            raise ValueError("give one shape (--workers N or --pd PxD) and at least two seeds")
        if any(o.startswith("engine.speculative.seed=") for o in args.override):
            raise ValueError("the seeds come from --seeds, not --override")
        runner = choose_runner(args.mocker_python)
        trace = Path(args.trace).resolve()
        cases = []
        for seed in seeds:
            overrides = [*args.override, f"engine.speculative.seed={seed}"]
            case = run_case(trace, shapes[0], overrides, runner)
            print(f"seed {seed}: servesim {case.servesim_wall_s:.1f} s, mocker "
                  f"{case.mocker_wall_s:.1f} s", flush=True)  # fmt: skip
            cases.append(case)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"compare_dynamo_seeds: {e}", file=sys.stderr)
        return 2
    ok = True
    print(f"\n{trace.name}, {cases[0].shape}, seeds {seeds}, {' '.join(args.override)}")
    header = (
        f"{'metric':<28} {'servesim mean':>14} {'std':>10} {'mocker mean':>14} {'std':>10} "
        f"{'mocker min':>12} {'mocker max':>12} {'diff/std':>9}"
    )
    print(header)
    for metric in METRICS:
        ours = [c.servesim_summary.get(metric.key) for c in cases]
        ref = [c.mocker_summary.get(metric.key) for c in cases]
        if any(v is None for v in ours + ref):
            continue
        m_s, sd_s, _, _ = spread([float(v) for v in ours])
        m_m, sd_m, lo, hi = spread([float(v) for v in ref])
        within = lo - sd_m <= m_s <= hi + sd_m
        ok &= within
        units = (m_s - m_m) / sd_m if sd_m > 0 else (0.0 if m_s == m_m else float("inf"))
        print(
            f"{metric.key:<28} {m_s:>14.4f} {sd_s:>10.4f} {m_m:>14.4f} {sd_m:>10.4f} "
            f"{lo:>12.4f} {hi:>12.4f} {units:>9.2f}{'' if within else '  OUTSIDE'}"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "seeds": seeds,
                    "overrides": args.override,
                    "cases": [c.to_json() for c in cases],
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
