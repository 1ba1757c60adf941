"""The timed runs: each simulator in a fresh process, repetitions interleaved, answers checked."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_replay_cases import EXPERIMENTS, CaseSpec, compose_case
from bench_replay_env import mem_total_gb
from bench_replay_profile import top_functions

# servesim's child is the benchmark script itself, re-run with --child
SCRIPT = Path(__file__).resolve().with_name("bench_replay.py")
RUNNER = EXPERIMENTS / "_mocker_runner.py"

# agreement tolerances (the targets of experiments/compare_dynamo.py)
TTFT_TOL = 0.02
COMPLETED_TOL = 0.01
# servesim summary keys carried into the benchmark results
REPORTED_KEYS = (
    "num_requests",
    "completed_requests",
    "mean_ttft_ms",
    "duration_ms",
    "prefix_cache_reused_ratio",
    "n_passes",
    "n_preemptions",
)


# --------------------------------------------------------------------------- child (servesim)


def child_main(request_path: str, result_path: str) -> int:
    """Inside the fresh servesim interpreter: import, validate, simulate, report."""
    t0 = time.perf_counter()
    from servesim import simulate, validate_config

    t1 = time.perf_counter()
    request = json.loads(Path(request_path).read_text())
    cfg = validate_config(request["config"])
    t2 = time.perf_counter()
    profile_rows: list[dict[str, Any]] | None = None
    if request.get("profile"):
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        result = simulate(cfg)
        prof.disable()
        t3 = time.perf_counter()
        stats = pstats.Stats(prof)
        if request.get("profile_out"):
            stats.dump_stats(request["profile_out"])
        profile_rows = top_functions(stats, int(request.get("profile_top", 25)))
    else:
        result = simulate(cfg)
        t3 = time.perf_counter()
    s = result.summary
    out = {
        "import_s": t1 - t0,
        "config_s": t2 - t1,
        "simulate_s": t3 - t2,
        "summary": {k: s.get(k) for k in REPORTED_KEYS},
    }
    if request.get("read_passes"):  # simulate() leaves the passes table to its first read
        t4 = time.perf_counter()
        out["passes_rows"] = len(result.passes)
        out["passes_s"] = time.perf_counter() - t4
    if profile_rows is not None:
        out["profile"] = profile_rows
        out["profile_total_s"] = sum(r["tottime_s"] for r in profile_rows)
    Path(result_path).write_text(json.dumps(out, default=str))
    return 0


# --------------------------------------------------------------------------- measuring


@dataclass
class Sample:
    wall_s: float  # whole process, spawn to exit
    sim_s: float  # simulate() / the replay call alone
    peak_rss_mb: float  # ru_maxrss of the process
    cpu_s: float  # user + sys of the process
    summary: dict[str, Any]
    import_s: float | None = None
    passes_s: float | None = None  # reading result.passes after simulate() (--read-passes)


class RunFailed(RuntimeError):
    pass


def run_measured(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, Any]:
    """Run `cmd` as one child; its wall time and its own resource usage (os.wait4)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-20:]
            raise RunFailed(f"{cmd[0]} exited {proc.returncode}:\n" + "\n".join(tail))
    return wall, usage


def _sample(wall: float, usage: Any, sim_s: float, summary: dict[str, Any], **kw: Any) -> Sample:
    return Sample(
        wall_s=wall,
        sim_s=sim_s,
        peak_rss_mb=usage.ru_maxrss / 1024.0,  # Linux: KiB
        cpu_s=usage.ru_utime + usage.ru_stime,
        summary=summary,
        **kw,
    )


def run_servesim(python: str, config: dict[str, Any], tmp: Path, **extra: Any) -> Sample:
    request, result = tmp / "servesim_request.json", tmp / "servesim_result.json"
    request.write_text(json.dumps({"config": config, **extra}))
    result.unlink(missing_ok=True)
    cmd = [python, str(SCRIPT), "--child", str(request), str(result)]
    # a profile is of the source: cProfile sees nothing inside compiled modules
    env = {**os.environ, "SERVESIM_NATIVE": "0"} if extra.get("profile") else None
    wall, usage = run_measured(cmd, env)
    out = json.loads(result.read_text())
    sample = _sample(
        wall,
        usage,
        out["simulate_s"],
        out["summary"],
        import_s=out["import_s"],
        passes_s=out.get("passes_s"),
    )
    if "profile" in out:
        sample.summary["_profile"] = out["profile"]
    return sample


def run_mocker(python: str, trace: Path, kwargs: dict[str, Any], tmp: Path) -> Sample:
    request, result = tmp / "mocker_request.json", tmp / "mocker_result.json"
    request.write_text(json.dumps({"trace_files": [str(trace)], "kwargs": kwargs}))
    result.unlink(missing_ok=True)
    wall, usage = run_measured([python, str(RUNNER), str(request), str(result)])
    out = json.loads(result.read_text())
    return _sample(wall, usage, float(out["call_wall_s"]), out["summary"])


# --------------------------------------------------------------------------- one case


@dataclass
class Variant:
    name: str  # servesim | servesim_step | mocker
    label: str
    samples: list[Sample] = field(default_factory=list)

    def stat(self, attr: str, how: str = "median") -> float:
        xs = [getattr(s, attr) for s in self.samples]
        return statistics.median(xs) if how == "median" else min(xs)

    @property
    def num_requests(self) -> int:
        return int(self.samples[0].summary["num_requests"])


@dataclass
class CaseResult:
    spec: CaseSpec
    trace: Path
    variants: dict[str, Variant]
    mocker_kwargs: dict[str, Any]
    shape: str = ""  # compare_dynamo.shape_title: "4 workers", "2P2D"
    trace_stats: dict[str, Any] | None = None
    mocker_skipped: str | None = None  # why the mocker did not run on this case
    agreement: list[dict[str, Any]] = field(default_factory=list)
    loadavg: list[tuple[float, float, float]] = field(default_factory=list)


def mocker_skip_reason(n_requests: int, args: argparse.Namespace) -> str | None:
    limit = args.mocker_max_requests
    if not limit or n_requests <= limit:
        return None
    return (
        f"{n_requests:,} requests is above --mocker-max-requests {limit:,}: the mocker keeps "
        "the whole replay in memory, which grows with the trace (6.0 GB at 100k generated "
        f"requests in docs/performance.md), and this machine has {mem_total_gb():.0f} GB"
    )


def _plan_processes(cfg: Any) -> tuple[int, str]:
    """How many processes servesim replays `cfg` in (servesim.speed.parallel.plan_processes)."""
    from servesim.speed.parallel import plan_processes

    return plan_processes(cfg)


def run_case(
    spec: CaseSpec,
    trace: Path,
    args: argparse.Namespace,
    compare: Any,
    mocker_python: str | None,
    tmp: Path,
    n_requests: int,
) -> CaseResult:
    base = compose_case(spec, trace, compare, args.servesim_override)
    kwargs = compare.mocker_kwargs(base)
    configs = {"servesim": base.model_dump(mode="json")}
    labels = {
        "servesim": "servesim",
        "servesim_step": "servesim, fast_forward=false",
        "servesim_parallel": f"servesim, speed.processes={args.processes}",
    }
    if args.fast_forward == "both":
        step = compose_case(
            spec, trace, compare, [*args.servesim_override, "engine.fast_forward=false"]
        )
        configs["servesim_step"] = step.model_dump(mode="json")
    if args.processes > 1:
        split = compose_case(
            spec, trace, compare, [*args.servesim_override, f"speed.processes={args.processes}"]
        )
        n, why = _plan_processes(split)
        if n > 1:
            configs["servesim_parallel"] = split.model_dump(mode="json")
        else:
            print(f"  [{spec.name}] no parallel variant: {why}", file=sys.stderr)
    variants = {name: Variant(name, labels[name]) for name in configs}
    skipped = None
    if mocker_python is not None:
        skipped = mocker_skip_reason(n_requests, args)
        if skipped is None:
            variants["mocker"] = Variant("mocker", "mocker")
        else:
            print(f"  [{spec.name}] mocker not run: {skipped}", file=sys.stderr)
    case = CaseResult(
        spec, trace, variants, kwargs, shape=compare.shape_title(base), mocker_skipped=skipped
    )
    for rep in range(args.repeat):
        case.loadavg.append(os.getloadavg())
        # every other repetition in reverse order: a machine slowing down or speeding up over
        # the run does not favour whichever simulator always runs first
        order = list(variants.items())
        for name, variant in order[::-1] if rep % 2 else order:
            if name == "mocker":
                assert mocker_python is not None
                sample = run_mocker(mocker_python, trace, kwargs, tmp)
            else:
                sample = run_servesim(
                    args.servesim_python, configs[name], tmp, read_passes=args.read_passes
                )
            variant.samples.append(sample)
            print(
                f"  [{spec.name} {rep + 1}/{args.repeat}] {variant.label:<30} "
                f"wall {sample.wall_s:7.2f} s  sim {sample.sim_s:7.2f} s  "
                f"rss {sample.peak_rss_mb:7.0f} MB",
                file=sys.stderr,
                flush=True,
            )
    case.agreement = agreement(case)
    return case


def _rel(ours: float | None, ref: float | None) -> float | None:
    if ours is None or ref is None:
        return None
    if ref == 0:
        return 0.0 if ours == 0 else float("inf")
    return (ours - ref) / abs(ref)


def agreement(case: CaseResult) -> list[dict[str, Any]]:
    """Each servesim variant against the mocker (mean TTFT, completed requests); also whether
    every repetition of a variant gave the same answer."""
    rows = []
    ref = case.variants.get("mocker")
    for name, v in case.variants.items():
        first = v.samples[0].summary
        stable = all(
            s.summary.get("mean_ttft_ms") == first.get("mean_ttft_ms")
            and s.summary.get("completed_requests") == first.get("completed_requests")
            for s in v.samples
        )
        row: dict[str, Any] = {
            "variant": name,
            "mean_ttft_ms": first.get("mean_ttft_ms"),
            "completed_requests": first.get("completed_requests"),
            "num_requests": first.get("num_requests"),
            "repeats_identical": stable,
        }
        if ref is not None and name != "mocker":
            r = ref.samples[0].summary
            row["mocker_mean_ttft_ms"] = r.get("mean_ttft_ms")
            row["mocker_completed_requests"] = r.get("completed_requests")
            row["ttft_rel_diff"] = _rel(first.get("mean_ttft_ms"), r.get("mean_ttft_ms"))
            row["completed_rel_diff"] = _rel(
                first.get("completed_requests"), r.get("completed_requests")
            )
            row["agree"] = (
                row["ttft_rel_diff"] is not None
                and abs(row["ttft_rel_diff"]) <= TTFT_TOL
                and row["completed_rel_diff"] is not None
                and abs(row["completed_rel_diff"]) <= COMPLETED_TOL
            )
        rows.append(row)
    return rows
