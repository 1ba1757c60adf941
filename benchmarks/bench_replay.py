"""Speed and memory of servesim's trace replay, next to Dynamo's mocker on the same input.

A benchmark, not a test: it measures and reports, and never treats a wall-clock time or a memory
figure as a pass or fail limit. What it does check is that both simulators give the same answer
(mean TTFT and completed requests) in every case where both ran, so a speed number never hides
a wrong result.

For every case and every repetition, each simulator runs in a fresh subprocess, so interpreter
start-up, imports and peak memory are its own:

* **servesim**: this script re-runs itself (`--child`) in the servesim interpreter (default: the
  one running this script), which imports `model`, validates the RunConfig composed here and
  calls `simulate()`. The config is what `experiments/compare_dynamo.py` composes from `conf/`
  (`compose_run_config`): `experiment=dynamo_compat workload=mooncake workload.path=TRACE
  output.progress=off`, the case's cluster shape (`topology.num_workers=N`, or for P/D what
  `compare_dynamo.py --pd PxD` adds: `topology=disagg topology.num_prefill_workers=P
  topology.num_decode_workers=D`) and the case's overrides (e.g. `router=kv`). With
  `--fast-forward both` a second servesim variant also runs with `engine.fast_forward=false`
  (every pass stepped); with `--processes N` (N > 1) one runs with `speed.processes=N`
  (workers replayed in N processes where they never interact; its CPU time is all of them).
* **mocker**: `experiments/_mocker_runner.py` in the mocker's interpreter (`--mocker-python`, else
  $SERVESIM_MOCKER_PYTHON; skipped if neither is given),
  calling `dynamo._core.run_mocker_trace_replay` with the keyword arguments that
  `compare_dynamo.mocker_kwargs` translates from the same RunConfig (`router_mode="kv_router"`
  and a `router_config` for router=kv; `num_prefill_workers`, `num_decode_workers`,
  `prefill_engine_args` and `decode_engine_args` for P/D). A trace of more than
  `--mocker-max-requests` requests (default 200,000) is not given to the mocker: its memory
  grows with the trace (several GB at 100k requests), and the report says it was not run, and
  why.

Per run it records the wall time of the whole process (spawn to exit, measured here), the wall
time of `simulate()` / of the replay call alone (measured inside the child), peak RSS and user+sys
CPU of that one process (`os.wait4` resource usage of the child, ru_maxrss). Repetitions are
interleaved, every other one in reverse order (servesim, mocker, mocker, servesim, ...), so that
load drifting on a shared machine hits both sides alike; the median and the minimum are
reported, with requests per wall-second, the ratios servesim / mocker of wall, simulate(), CPU
and peak RSS, and the wall ratio within each repetition. `simulate()` returns
before building the passes table (one row per engine pass; built on the first read of
`result.passes`); `--read-passes` also times that read, reported apart.

Cases (`--cases`, comma-separated; default conv4,conv1,conv2,synth2):

    conv4      conversation_trace.jsonl (12,031 requests), 4 workers, round robin -- the main case
    conv1      conversation_trace.jsonl, 1 worker (overloaded: queues, preemptions)
    conv2      conversation_trace.jsonl, 2 workers
    synth2     synthetic_trace.jsonl (3,993 requests), 2 workers
    synth100k  generated Mooncake-style trace of 100,000 requests (below), 2 workers
    kv4        conversation_trace.jsonl, 4 workers, KV-aware router (router=kv)
    pd22       conversation_trace.jsonl, 2P2D: 2 prefill + 2 decode workers, instant KV link

Generated traces (synth100k and the `--scale` cases) are Mooncake JSONL written by servesim's
synthetic generator (`servesim.workload.synthetic.generate`, seed 0), lengths and prefix sharing
fitted to synthetic_trace.jsonl (lognormal input mean 15,325 / std 18,380 tokens, output mean
149 / std 178, 30 % of a prompt's blocks shared within 50 prefix groups) and Poisson arrivals at
3.9 req/s, so that simulated time and work grow linearly with requests. Rows are streamed to
disk one at a time (a 1M-request trace is about 315 MB and never held in memory), into a cache
directory (`--trace-cache`, default $TMPDIR/servesim_bench_traces) under a name keyed by the
size, the seed, the generator settings and the generator's source, so each trace is generated
once and reused by later cases and runs.

`--scale` adds generated traces of `--scale-sizes` requests (default 1k / 10k / 100k) replayed
on each of `--scale-workers` worker counts (default 2), and a scaling table: requests per
simulate()-second and per wall-second at every size (constant = time linear in requests),
peak RSS, and the growth exponent of time between successive sizes (1.0 = linear).

`--profile` also runs servesim once more under cProfile on each of `--profile-cases` (default:
the first selected case) and reports the functions with the largest own time (tottime) per case;
a profile is always of the source (`SERVESIM_NATIVE=0`). Timed runs use servesim's native build
when `SERVESIM_NATIVE=1` asks for it (model/speed/native.py); the header names it, or says source.

    .venv/bin/python benchmarks/bench_replay.py                         # the four real-trace cases
    .venv/bin/python benchmarks/bench_replay.py --cases conv4 --repeat 5
    .venv/bin/python benchmarks/bench_replay.py --cases conv4,synth100k,kv4,pd22 \\
        --profile-cases conv4,synth100k,kv4,pd22 --out bench.json --markdown bench.md
    .venv/bin/python benchmarks/bench_replay.py --cases none --scale-workers 4 \\
        --scale-sizes 1000,10000,100000,1000000 --repeat 1 --out scale.json --markdown scale.md

Exit status: 0, or 1 if the simulators disagree on mean TTFT (beyond 2 %, the latency target of
compare_dynamo.py) or completed requests (beyond 1 %) in any case, 2 on a run error (e.g. a
child killed for memory: the cases that ended before it are still reported and written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package
# the pieces, by topic
from bench_replay_cases import (  # noqa: E402
    CASES,
    DEFAULT_CASES,
    REPO,
    CaseSpec,
    cached_trace,
    compare_module,
    compose_case,
    count_rows,
    scale_spec,
    scale_specs,
)
from bench_replay_env import environment, revision  # noqa: E402
from bench_replay_profile import profile_path  # noqa: E402
from bench_replay_report import render, to_json  # noqa: E402
from bench_replay_runner import (  # noqa: E402
    CaseResult,
    RunFailed,
    child_main,
    run_case,
    run_servesim,
)

# the public traces beside the checkout (as the tests look for them)
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
DEFAULT_TRACE_CACHE = Path(tempfile.gettempdir()) / "servesim_bench_traces"
# the mocker keeps the whole replay in memory (6.0 GB at 100k generated requests in
# docs/performance.md); above this many requests it is not run (--mocker-max-requests)
DEFAULT_MOCKER_MAX_REQUESTS = 200_000


# --------------------------------------------------------------------------- main


def resolve_mocker(arg: str | None) -> str | None:
    if arg == "none":
        return None
    candidate = arg or os.environ.get("SERVESIM_MOCKER_PYTHON")
    if candidate:
        if not Path(candidate).exists():
            raise SystemExit(f"bench_replay: mocker interpreter {candidate} does not exist")
        return candidate
    return None


def _names(text: str | None) -> list[str]:
    return [] if text in (None, "none") else [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="cases:\n"
        + "\n".join(f"  {c.name:<10} {c.label}" for c in CASES.values())
        + "\n  scale-SIZE-Nw  a generated trace of SIZE requests on N workers (--scale)"
        + "\n\nMethod, generated traces and exit status: the module docstring and "
        "benchmarks/README.md.",
    )
    p.add_argument(
        "--cases",
        default=DEFAULT_CASES,
        help=f"comma-separated, from {', '.join(CASES)} (default {DEFAULT_CASES}); 'none' for "
        "only --scale / --profile-cases",
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per simulator and case (3)")
    p.add_argument(
        "--fast-forward",
        choices=("on", "both"),
        default="on",
        help="both: also time servesim with engine.fast_forward=false",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="N > 1: also time servesim with speed.processes=N (workers replayed in N "
        "processes where they never interact; docs/architecture.md)",
    )
    p.add_argument(
        "--scale",
        action="store_true",
        help="add generated traces of --scale-sizes requests on --scale-workers workers",
    )
    p.add_argument(
        "--scale-sizes",
        help="requests per generated trace (default 1000,10000,100000; implies --scale)",
    )
    p.add_argument(
        "--scale-workers",
        help="worker counts the generated traces replay on, e.g. 4 or 2,4 (default 2; implies "
        "--scale)",
    )
    p.add_argument(
        "--mocker-max-requests",
        type=int,
        default=DEFAULT_MOCKER_MAX_REQUESTS,
        help="do not run the mocker on traces of more requests than this (default "
        f"{DEFAULT_MOCKER_MAX_REQUESTS:,}: it needs several GB per 100k requests); 0 = no limit",
    )
    p.add_argument(
        "--trace-cache",
        type=Path,
        default=DEFAULT_TRACE_CACHE,
        help=f"where generated traces are kept and reused (default {DEFAULT_TRACE_CACHE})",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile servesim once more on each --profile-cases case",
    )
    p.add_argument(
        "--profile-cases",
        help="cases to profile, e.g. conv4,synth100k,kv4,pd22 (names of --cases or of the "
        "--scale cases, e.g. scale-10k-4w; default the first case; implies --profile)",
    )
    p.add_argument("--profile-top", type=int, default=25, help="functions listed per case (25)")
    p.add_argument(
        "--read-passes",
        action="store_true",
        help="after simulate(), also time reading result.passes (the passes table is built on "
        "its first read); reported apart, not in simulate()",
    )
    p.add_argument(
        "--profile-out",
        help="write the pstats file here; with several cases FILE.CASE.prof, or put {case} in it",
    )
    p.add_argument("--profile-max-requests", type=int, help="profile only the first N trace rows")
    p.add_argument(
        "--traces",
        default=os.environ.get("SERVESIM_TRACES", str(DEFAULT_TRACES)),
        help=f"directory of the shared traces (default $SERVESIM_TRACES, else {DEFAULT_TRACES})",
    )
    p.add_argument(
        "--servesim-python",
        default=sys.executable,
        help="interpreter servesim runs in (default: this one)",
    )
    p.add_argument(
        "--mocker-python",
        help="mocker interpreter (default $SERVESIM_MOCKER_PYTHON; without either the mocker "
        "is skipped); 'none' to skip the mocker",
    )
    p.add_argument(
        "--servesim-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override for servesim's config in every case (repeatable), e.g. "
        "output.pass_table=false for the 1M-request scale case; the mocker is unaffected",
    )
    p.add_argument("--out", help="write every sample and statistic as JSON here")
    p.add_argument("--markdown", help="also write the markdown report here")
    p.add_argument("--child", nargs=2, metavar=("REQUEST", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.mocker_max_requests < 0:
        p.error("--mocker-max-requests must be >= 0")
    args.scale = args.scale or args.scale_sizes is not None or args.scale_workers is not None
    try:
        args.scale_sizes = [int(x) for x in _names(args.scale_sizes or "1000,10000,100000")]
        args.scale_workers = [int(x) for x in _names(args.scale_workers or "2")]
    except ValueError:
        p.error("--scale-sizes and --scale-workers take comma-separated integers")
    if any(x < 1 for x in [*args.scale_sizes, *args.scale_workers]):
        p.error("--scale-sizes and --scale-workers must be positive")
    args.profile = args.profile or args.profile_cases is not None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(*args.child)
    # output files may go to folders that do not exist yet (a failed write at the end would
    # lose the whole run)
    for out in (args.out, args.markdown, args.profile_out):
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
    names = _names(args.cases)
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"bench_replay: unknown case(s) {unknown}; choose: {list(CASES)}", file=sys.stderr)
        return 2
    specs = [CASES[c] for c in names]
    if args.scale:
        specs += scale_specs(args)
    profile_specs: list[CaseSpec] = specs[:1] if args.profile else []
    if args.profile_cases:
        known = {s.name: s for s in [*CASES.values(), *specs]}
        found = {x: known.get(x) or scale_spec(x) for x in _names(args.profile_cases)}
        unknown = [x for x, spec in found.items() if spec is None]
        if unknown:
            print(
                f"bench_replay: unknown profile case(s) {unknown}; choose from {list(known)} "
                "or scale-SIZE-Nw (e.g. scale-10k-4w)",
                file=sys.stderr,
            )
            return 2
        profile_specs = [spec for spec in found.values() if spec is not None]
    if not specs and not profile_specs:
        print("bench_replay: nothing to run", file=sys.stderr)
        return 2
    mocker_python = resolve_mocker(args.mocker_python)
    env_info = environment(args, mocker_python)
    print(
        f"bench_replay: mocker {'at ' + mocker_python if mocker_python else 'not available'}; "
        f"servesim {revision(env_info)}; {env_info['cpu_count']} CPUs, "
        f"load {env_info['loadavg_start']}; generated traces in {args.trace_cache}",
        file=sys.stderr,
    )
    compare = compare_module()
    traces_dir = Path(args.traces)

    def locate(spec: CaseSpec) -> tuple[Path, dict[str, Any] | None, int]:
        """The case's trace, its statistics if generated, and its number of rows."""
        if spec.generated:
            trace, stats, fresh = cached_trace(spec.generated, args.trace_cache)
            how = f"generated in {stats['generate_s']:.1f} s" if fresh else "cached"
            print(f"  [{spec.name}] trace {trace} ({how}; {stats})", file=sys.stderr)
            return trace, stats, spec.generated
        trace = traces_dir / spec.trace
        if not trace.exists():
            raise FileNotFoundError(f"trace {trace} not found")
        return trace, None, count_rows(trace)

    results: list[CaseResult] = []
    profiles: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_replay_") as tmpname:
        tmp = Path(tmpname)
        try:
            for spec in specs:
                trace, stats, n_rows = locate(spec)
                case = run_case(spec, trace, args, compare, mocker_python, tmp, n_rows)
                case.trace_stats = stats
                results.append(case)
            for spec in profile_specs:
                trace, _, _ = locate(spec)
                overrides = list(args.servesim_override)
                if args.profile_max_requests:
                    overrides.append(f"workload.max_requests={args.profile_max_requests}")
                cfg = compose_case(spec, trace, compare, overrides)
                pstats_file = profile_path(args.profile_out, spec.name, len(profile_specs) > 1)
                print(f"  [{spec.name}] profiling servesim", file=sys.stderr, flush=True)
                sample = run_servesim(
                    args.servesim_python,
                    cfg.model_dump(mode="json"),
                    tmp,
                    profile=True,
                    profile_top=args.profile_top,
                    profile_out=pstats_file,
                )
                where = f"{spec.name} ({spec.label})"
                if args.profile_max_requests:
                    where += f", first {args.profile_max_requests:,} rows"
                profiles.append(
                    {
                        "case": where,
                        "case_name": spec.name,
                        "wall_s": sample.wall_s,
                        "simulate_s_profiled": sample.sim_s,
                        "pstats": pstats_file,
                        "rows": sample.summary.pop("_profile"),
                        "summary": sample.summary,
                    }
                )
        except (RunFailed, FileNotFoundError) as e:
            # e.g. a child killed for memory on the largest trace: report what did finish
            print(f"bench_replay: {e}", file=sys.stderr)
            if not results and not profiles:
                return 2
            env_info["error"] = str(e)
    env_info["loadavg_end"] = os.getloadavg()
    report = render(results, profiles, env_info)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps(to_json(results, profiles, env_info), indent=2) + "\n")
    bad = [
        (c.spec.name, r["variant"]) for c in results for r in c.agreement if r.get("agree") is False
    ]
    if bad:
        print(f"bench_replay: servesim and the mocker disagree in {bad}", file=sys.stderr)
        return 1
    return 2 if "error" in env_info else 0


if __name__ == "__main__":
    sys.exit(main())
