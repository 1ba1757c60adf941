"""Speed and memory of servesim's trace replay, next to Dynamo's mocker on the same input.

A benchmark, not a test: it measures and reports, and never treats a wall-clock time as a pass
or fail limit. What it does check is that both simulators give the same answer (mean TTFT and
completed requests) in every case, so a speed number never hides a wrong result.

For every case and every repetition, each simulator runs in a fresh subprocess, so interpreter
start-up, imports and peak memory are its own:

* **servesim**: this script re-runs itself (`--child`) in the servesim interpreter (default: the
  one running this script), which imports `model`, validates the RunConfig composed here and
  calls `simulate()`. The config is what `experiments/compare_dynamo.py` composes from `conf/`:
  `experiment=dynamo_compat workload=mooncake workload.path=TRACE topology.num_workers=N
  output.progress=off` (the mocker's defaults). With `--fast-forward both` a second servesim
  variant also runs with `engine.fast_forward=false` (every pass stepped).
* **mocker**: `experiments/_mocker_runner.py` in the mocker's interpreter ($SERVESIM_MOCKER_PYTHON,
  else /work/venvs/dynamo/bin/python; skipped if neither exists), calling
  `dynamo._core.run_mocker_trace_replay` with the engine settings translated from the same
  RunConfig by `compare_dynamo.mocker_kwargs`.

Per run it records the wall time of the whole process (spawn to exit, measured here), the wall
time of `simulate()` / of the replay call alone (measured inside the child), peak RSS and user+sys
CPU of that one process (`os.wait4` resource usage of the child, ru_maxrss). Repetitions are
interleaved (servesim, mocker, servesim, mocker, ...) so that load drifting on a shared machine
hits both sides alike; the median and the minimum are reported.

Cases (`--cases`, comma-separated; default all four):

    conv4    conversation_trace.jsonl (12,031 requests), 4 workers  -- the main case
    conv1    conversation_trace.jsonl, 1 worker (overloaded: queues, preemptions)
    conv2    conversation_trace.jsonl, 2 workers
    synth2   synthetic_trace.jsonl (3,993 requests), 2 workers

`--scale` adds Mooncake-style traces of 1k / 10k / 100k requests (`--scale-sizes`) generated on
the fly into a temporary directory with servesim's synthetic generator, lengths and prefix
sharing fitted to synthetic_trace.jsonl (lognormal input mean 15,325 / std 18,380 tokens, output
mean 149 / std 178, 30 % of a prompt's blocks shared within 50 prefix groups, Poisson arrivals at
3.9 req/s, replayed on 2 workers), so that simulated time and work grow linearly with requests.

`--profile` also runs servesim once more under cProfile on the first selected case and prints
the functions with the largest own time (tottime).

    /work/venvs/dev/bin/python benchmarks/bench_replay.py                       # all four cases
    /work/venvs/dev/bin/python benchmarks/bench_replay.py --cases conv4 --repeat 5
    /work/venvs/dev/bin/python benchmarks/bench_replay.py --fast-forward both --scale \\
        --out bench.json --markdown bench.md

Exit status: 0, or 1 if the simulators disagree on mean TTFT (beyond 2 %, the latency target of
compare_dynamo.py) or completed requests (beyond 1 %) in any case, 2 on a run error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
RUNNER = EXPERIMENTS / "_mocker_runner.py"
COMPARE = EXPERIMENTS / "compare_dynamo.py"
DEFAULT_MOCKER_PYTHON = Path("/work/venvs/dynamo/bin/python")
DEFAULT_TRACES = Path("/work/shared/traces")

# agreement tolerances (the targets of experiments/compare_dynamo.py)
TTFT_TOL = 0.02
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
COMPLETED_TOL = 0.01


@dataclass(frozen=True)
class CaseSpec:
    name: str
    trace: str  # file name under --traces, or a generated path for scale cases
    workers: int
    label: str
    generated: int = 0  # >0: number of requests of a generated trace


CASES: dict[str, CaseSpec] = {
    "conv4": CaseSpec(
        "conv4", "conversation_trace.jsonl", 4, "conversation trace, 4 workers (main case)"
    ),
    "conv1": CaseSpec("conv1", "conversation_trace.jsonl", 1, "conversation trace, 1 worker"),
    "conv2": CaseSpec("conv2", "conversation_trace.jsonl", 2, "conversation trace, 2 workers"),
    "synth2": CaseSpec("synth2", "synthetic_trace.jsonl", 2, "synthetic trace, 2 workers"),
}

# generated traces for --scale: statistics fitted to synthetic_trace.jsonl (see module doc)
SCALE_WORKERS = 2
SCALE_RATE_RPS = 3.9
SCALE_SEED = 0
SCALE_WORKLOAD: dict[str, Any] = {
    "kind": "synthetic",
    "turns_per_session": 1,
    "input_tokens": {"dist": "lognormal", "mean": 15325, "std": 18380, "min": 13, "max": 191378},
    "output_tokens": {"dist": "lognormal", "mean": 149, "std": 178, "min": 1, "max": 893},
    "shared_prefix_ratio": 0.3,
    "num_prefix_groups": 50,
    "trace_block_size": 512,
    "rate_rps": SCALE_RATE_RPS,
}


# --------------------------------------------------------------------------- child (servesim)


def child_main(request_path: str, result_path: str) -> int:
    """Inside the fresh servesim interpreter: import, validate, simulate, report."""
    t0 = time.perf_counter()
    from model import simulate, validate_config

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
        profile_rows = _top_functions(stats, int(request.get("profile_top", 25)))
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
    if profile_rows is not None:
        out["profile"] = profile_rows
        out["profile_total_s"] = sum(r["tottime_s"] for r in profile_rows)
    Path(result_path).write_text(json.dumps(out, default=str))
    return 0


def _short(filename: str) -> str:
    for marker in ("/site-packages/", str(REPO) + "/", "/lib/python"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _top_functions(stats: Any, n: int) -> list[dict[str, Any]]:
    total = stats.total_tt
    rows = []
    for (filename, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append(
            {
                "function": f"{_short(filename)}:{line}({func})",
                "ncalls": nc,
                "primitive_calls": cc,
                "tottime_s": tt,
                "tottime_share": tt / total if total else 0.0,
                "cumtime_s": ct,
            }
        )
    rows.sort(key=lambda r: r["tottime_s"], reverse=True)
    return [{"profiled_total_s": total, **r} for r in rows[:n]]


# --------------------------------------------------------------------------- measuring


@dataclass
class Sample:
    wall_s: float  # whole process, spawn to exit
    sim_s: float  # simulate() / the replay call alone
    peak_rss_mb: float  # ru_maxrss of the process
    cpu_s: float  # user + sys of the process
    summary: dict[str, Any]
    import_s: float | None = None


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
    cmd = [python, str(Path(__file__).resolve()), "--child", str(request), str(result)]
    wall, usage = run_measured(cmd)
    out = json.loads(result.read_text())
    sample = _sample(wall, usage, out["simulate_s"], out["summary"], import_s=out["import_s"])
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


# --------------------------------------------------------------------------- configs


def _compare_module() -> Any:
    """experiments/compare_dynamo.py (config composition and the mocker translation)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_dynamo", COMPARE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def generate_trace(n: int, path: Path, seed: int = SCALE_SEED) -> dict[str, Any]:
    """A Mooncake JSONL trace of `n` single-turn requests (servesim's synthetic generator for
    lengths and hash ids, Poisson arrivals rounded to whole ms). Returns its statistics."""
    import numpy as np

    from model.config.schema import SyntheticWorkload
    from model.sim import random_streams
    from model.workload.synthetic import generate

    cfg = SyntheticWorkload.model_validate({**SCALE_WORKLOAD, "num_sessions": n})
    streams = random_streams(seed)
    gaps = streams["arrivals"].exponential(1000.0 / SCALE_RATE_RPS, size=n)
    times = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
    inputs, outputs = [], []
    with path.open("w") as fh:
        rows = generate(cfg, streams["lengths"], streams["prefix_groups"])
        for row, t in zip(rows, times, strict=True):
            inputs.append(row.input_length)
            outputs.append(row.output_length)
            rec = {
                "timestamp": int(round(float(t))),
                "input_length": row.input_length,
                "output_length": row.output_length,
                "hash_ids": row.hash_ids,
            }
            fh.write(json.dumps(rec) + "\n")
    return {
        "requests": n,
        "span_s": float(times[-1]) / 1000.0,
        "input_mean": float(np.mean(inputs)),
        "input_std": float(np.std(inputs)),
        "input_median": float(np.median(inputs)),
        "output_mean": float(np.mean(outputs)),
        "output_std": float(np.std(outputs)),
        "total_input_tokens": int(np.sum(inputs)),
        "bytes": path.stat().st_size,
    }


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
    trace_stats: dict[str, Any] | None = None
    agreement: list[dict[str, Any]] = field(default_factory=list)
    loadavg: list[tuple[float, float, float]] = field(default_factory=list)


def run_case(
    spec: CaseSpec,
    trace: Path,
    args: argparse.Namespace,
    compare: Any,
    mocker_python: str | None,
    tmp: Path,
) -> CaseResult:
    base = compare.compose_run_config(trace, spec.workers)
    kwargs = compare.mocker_kwargs(base)
    configs = {"servesim": base.model_dump(mode="json")}
    labels = {"servesim": "servesim", "servesim_step": "servesim, fast_forward=false"}
    if args.fast_forward == "both":
        step = compare.compose_run_config(trace, spec.workers, ["engine.fast_forward=false"])
        configs["servesim_step"] = step.model_dump(mode="json")
    variants = {name: Variant(name, labels[name]) for name in configs}
    if mocker_python is not None:
        variants["mocker"] = Variant("mocker", "mocker")
    case = CaseResult(spec, trace, variants, kwargs)
    for rep in range(args.repeat):
        case.loadavg.append(os.getloadavg())
        for name, variant in variants.items():
            if name == "mocker":
                assert mocker_python is not None
                sample = run_mocker(mocker_python, trace, kwargs, tmp)
            else:
                sample = run_servesim(args.servesim_python, configs[name], tmp)
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


# --------------------------------------------------------------------------- reporting


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def variant_stats(v: Variant) -> dict[str, Any]:
    n = v.num_requests
    wall, sim = v.stat("wall_s"), v.stat("sim_s")
    return {
        "label": v.label,
        "wall_s_median": wall,
        "wall_s_min": v.stat("wall_s", "min"),
        "sim_s_median": sim,
        "sim_s_min": v.stat("sim_s", "min"),
        "req_per_wall_s": n / wall,
        "req_per_sim_s": n / sim,
        "peak_rss_mb_median": v.stat("peak_rss_mb"),
        "peak_rss_mb_max": max(s.peak_rss_mb for s in v.samples),
        "cpu_s_median": v.stat("cpu_s"),
        "import_s_median": (
            statistics.median(s.import_s for s in v.samples if s.import_s is not None)
            if v.samples[0].import_s is not None
            else None
        ),
        "num_requests": n,
    }


def case_markdown(case: CaseResult) -> str:
    spec = case.spec
    n = next(iter(case.variants.values())).num_requests
    title = f"### {spec.name}: {spec.label}, {n:,} requests"
    lines = [
        title,
        "",
        f"Trace `{case.trace.name if spec.generated else case.trace}`; "
        f"{len(next(iter(case.variants.values())).samples)} runs each, median (min).",
        "",
        "| simulator | wall s (process) | simulate() s | req / wall-s | req / simulate-s "
        "| peak RSS MB | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    stats = {name: variant_stats(v) for name, v in case.variants.items()}
    for st in stats.values():
        lines.append(
            f"| {st['label']} | {_f(st['wall_s_median'])} ({_f(st['wall_s_min'])}) "
            f"| {_f(st['sim_s_median'])} ({_f(st['sim_s_min'])}) "
            f"| {_f(st['req_per_wall_s'], 0)} | {_f(st['req_per_sim_s'], 0)} "
            f"| {_f(st['peak_rss_mb_median'], 0)} | {_f(st['cpu_s_median'])} |"
        )
    if "mocker" in stats:
        m = stats["mocker"]
        for name, st in stats.items():
            if name == "mocker":
                continue
            lines.append(
                f"| **{st['label']} / mocker** "
                f"| {_ratio(st['wall_s_median'], m['wall_s_median'])} "
                f"({_ratio(st['wall_s_min'], m['wall_s_min'])}) "
                f"| {_ratio(st['sim_s_median'], m['sim_s_median'])} "
                f"({_ratio(st['sim_s_min'], m['sim_s_min'])}) "
                f"| | | {_ratio(st['peak_rss_mb_median'], m['peak_rss_mb_median'])} "
                f"| {_ratio(st['cpu_s_median'], m['cpu_s_median'])} |"
            )
    if "servesim_step" in stats:
        ff, step = stats["servesim"], stats["servesim_step"]
        lines.append(
            "| **fast_forward=false / true** "
            f"| {_ratio(step['wall_s_median'], ff['wall_s_median'])} "
            f"| {_ratio(step['sim_s_median'], ff['sim_s_median'])} | | | "
            f"{_ratio(step['peak_rss_mb_median'], ff['peak_rss_mb_median'])} | |"
        )
    imports = stats["servesim"]["import_s_median"]
    lines += [
        "",
        f"servesim's process wall includes {imports:.2f} s to import `model` (median).",
        "",
        "Answers (same in every run: " + agreement_stability(case) + "):",
        "",
    ]
    for row in case.agreement:
        if row["variant"] == "mocker":
            continue
        if "mocker_mean_ttft_ms" in row:
            verdict = "agree" if row["agree"] else "**DISAGREE**"
            lines.append(
                f"* {case.variants[row['variant']].label} vs mocker: mean TTFT "
                f"{row['mean_ttft_ms']:.6f} vs {row['mocker_mean_ttft_ms']:.6f} ms "
                f"(rel. diff {row['ttft_rel_diff']:+.1e}); completed "
                f"{row['completed_requests']:,} vs {row['mocker_completed_requests']:,} "
                f"(rel. diff {row['completed_rel_diff']:+.1e}): {verdict}"
            )
        else:
            lines.append(
                f"* {case.variants[row['variant']].label}: mean TTFT {row['mean_ttft_ms']:.6f} ms, "
                f"completed {row['completed_requests']:,} (mocker not run)"
            )
    return "\n".join(lines)


def agreement_stability(case: CaseResult) -> str:
    bad = [r["variant"] for r in case.agreement if not r["repeats_identical"]]
    return "yes" if not bad else "NO for " + ", ".join(bad)


def overview_markdown(cases: Sequence[CaseResult]) -> str:
    lines = [
        "| case | requests | servesim wall s | mocker wall s | wall ratio | servesim simulate() s "
        "| mocker call s | simulate ratio | CPU ratio | servesim RSS MB | mocker RSS MB "
        "| RSS ratio | mean TTFT rel. diff | completed equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in cases:
        s = variant_stats(c.variants["servesim"])
        m = variant_stats(c.variants["mocker"]) if "mocker" in c.variants else None
        ag = next(r for r in c.agreement if r["variant"] == "servesim")
        ttft = ag.get("ttft_rel_diff")
        completed = "-"
        if "completed_rel_diff" in ag:
            completed = "yes" if ag["completed_rel_diff"] == 0 else "no"
        lines.append(
            f"| {c.spec.name} | {s['num_requests']:,} | {_f(s['wall_s_median'])} "
            f"| {_f(m['wall_s_median']) if m else '-'} "
            f"| {_ratio(s['wall_s_median'], m['wall_s_median']) if m else '-'} "
            f"| {_f(s['sim_s_median'])} | {_f(m['sim_s_median']) if m else '-'} "
            f"| {_ratio(s['sim_s_median'], m['sim_s_median']) if m else '-'} "
            f"| {_ratio(s['cpu_s_median'], m['cpu_s_median']) if m else '-'} "
            f"| {_f(s['peak_rss_mb_median'], 0)} | {_f(m['peak_rss_mb_median'], 0) if m else '-'} "
            f"| {_ratio(s['peak_rss_mb_median'], m['peak_rss_mb_median']) if m else '-'} "
            f"| {'-' if ttft is None else f'{ttft:+.1e}'} | {completed} |"
        )
    return "\n".join(lines)


def profile_markdown(rows: list[dict[str, Any]], wall: float, case: str) -> str:
    total = rows[0]["profiled_total_s"] if rows else 0.0
    lines = [
        f"cProfile of servesim `simulate()` on {case}: {total:.2f} s profiled "
        f"(process wall {wall:.2f} s; profiling inflates times). Top functions by own time:",
        "",
        "| # | function | calls | tottime s | share | cumtime s |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"| {i} | `{r['function']}` | {r['ncalls']:,} | {r['tottime_s']:.2f} "
            f"| {100 * r['tottime_share']:.1f} % | {r['cumtime_s']:.2f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- environment


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _version(python: str, dist: str) -> str | None:
    code = f"from importlib.metadata import version; print(version({dist!r}))"
    try:
        return subprocess.run(
            [python, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _revision(env_info: dict[str, Any]) -> str:
    git = env_info.get("servesim_git")
    return f"git {git}" if git else f"from {env_info['servesim_repo']} (not a git checkout)"


def environment(args: argparse.Namespace, mocker_python: str | None) -> dict[str, Any]:
    return {
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "servesim_python": args.servesim_python,
        "servesim_repo": str(REPO),
        "servesim_git": _git("describe", "--always", "--dirty"),
        "servesim_git_dirty_files": (
            _git("status", "--porcelain", "--untracked-files=no") or ""
        ).splitlines(),
        "python": platform.python_version(),
        "mocker_python": mocker_python,
        "mocker_version": _version(mocker_python, "ai-dynamo-runtime") if mocker_python else None,
        "repeat": args.repeat,
    }


# --------------------------------------------------------------------------- main


def resolve_mocker(arg: str | None) -> str | None:
    if arg == "none":
        return None
    candidate = arg or os.environ.get("SERVESIM_MOCKER_PYTHON")
    if candidate:
        if not Path(candidate).exists():
            raise SystemExit(f"bench_replay: mocker interpreter {candidate} does not exist")
        return candidate
    return str(DEFAULT_MOCKER_PYTHON) if DEFAULT_MOCKER_PYTHON.exists() else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--cases",
        default="conv4,conv1,conv2,synth2",
        help="comma-separated, from " + ", ".join(CASES) + "; 'none' for only --scale/--profile",
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per simulator and case (3)")
    p.add_argument(
        "--fast-forward",
        choices=("on", "both"),
        default="on",
        help="both: also time servesim with engine.fast_forward=false",
    )
    p.add_argument("--scale", action="store_true", help="add generated traces (--scale-sizes)")
    p.add_argument("--scale-sizes", default="1000,10000,100000", help="requests per trace")
    p.add_argument("--profile", action="store_true", help="cProfile servesim on the first case")
    p.add_argument("--profile-top", type=int, default=25, help="functions listed (25)")
    p.add_argument("--profile-out", help="write the pstats file here")
    p.add_argument("--profile-max-requests", type=int, help="profile only the first N trace rows")
    p.add_argument("--traces", default=os.environ.get("SERVESIM_TRACES", str(DEFAULT_TRACES)))
    p.add_argument("--servesim-python", default=sys.executable)
    p.add_argument(
        "--mocker-python",
        help="mocker interpreter (default $SERVESIM_MOCKER_PYTHON, else "
        f"{DEFAULT_MOCKER_PYTHON} if present); 'none' to skip the mocker",
    )
    p.add_argument("--out", help="write every sample and statistic as JSON here")
    p.add_argument("--markdown", help="also write the markdown report here")
    p.add_argument("--child", nargs=2, metavar=("REQUEST", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(*args.child)
    names = [] if args.cases == "none" else [c.strip() for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"bench_replay: unknown case(s) {unknown}; choose: {list(CASES)}", file=sys.stderr)
        return 2
    specs = [CASES[c] for c in names]
    if args.scale:
        for n in (int(x) for x in args.scale_sizes.split(",")):
            tag = f"{n // 1000}k" if n % 1000 == 0 else str(n)
            specs.append(
                CaseSpec(
                    f"scale-{tag}",
                    f"generated_{n}.jsonl",
                    SCALE_WORKERS,
                    f"generated Mooncake-style trace, {SCALE_WORKERS} workers",
                    generated=n,
                )
            )
    if not specs:
        print("bench_replay: nothing to run", file=sys.stderr)
        return 2
    mocker_python = resolve_mocker(args.mocker_python)
    env_info = environment(args, mocker_python)
    print(
        f"bench_replay: mocker {'at ' + mocker_python if mocker_python else 'not available'}; "
        f"servesim {_revision(env_info)}; {env_info['cpu_count']} CPUs, "
        f"load {env_info['loadavg_start']}",
        file=sys.stderr,
    )
    compare = _compare_module()
    traces_dir = Path(args.traces)
    results: list[CaseResult] = []
    profile: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="bench_replay_") as tmpname:
        tmp = Path(tmpname)
        try:
            for spec in specs:
                stats = None
                if spec.generated:
                    trace = tmp / spec.trace
                    t0 = time.perf_counter()
                    stats = generate_trace(spec.generated, trace)
                    stats["generate_s"] = time.perf_counter() - t0
                    print(f"  generated {trace} ({stats})", file=sys.stderr)
                else:
                    trace = traces_dir / spec.trace
                    if not trace.exists():
                        print(f"bench_replay: trace {trace} not found", file=sys.stderr)
                        return 2
                case = run_case(spec, trace, args, compare, mocker_python, tmp)
                case.trace_stats = stats
                results.append(case)
                if spec.generated:
                    trace.unlink()
            if args.profile:
                spec = specs[0]
                trace = traces_dir / spec.trace
                if spec.generated:
                    trace = tmp / spec.trace
                    generate_trace(spec.generated, trace)
                overrides = []
                if args.profile_max_requests:
                    overrides.append(f"workload.max_requests={args.profile_max_requests}")
                cfg = compare.compose_run_config(trace, spec.workers, overrides)
                sample = run_servesim(
                    args.servesim_python,
                    cfg.model_dump(mode="json"),
                    tmp,
                    profile=True,
                    profile_top=args.profile_top,
                    profile_out=str(Path(args.profile_out).resolve()) if args.profile_out else None,
                )
                where = f"{spec.name} ({spec.label})"
                if args.profile_max_requests:
                    where += f", first {args.profile_max_requests:,} rows"
                profile = {
                    "case": where,
                    "wall_s": sample.wall_s,
                    "simulate_s_profiled": sample.sim_s,
                    "rows": sample.summary.pop("_profile"),
                    "summary": sample.summary,
                }
        except RunFailed as e:
            print(f"bench_replay: {e}", file=sys.stderr)
            return 2
    env_info["loadavg_end"] = os.getloadavg()
    report = render(results, profile, env_info)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps(to_json(results, profile, env_info), indent=2) + "\n")
    bad = [
        (c.spec.name, r["variant"]) for c in results for r in c.agreement if r.get("agree") is False
    ]
    if bad:
        print(f"bench_replay: servesim and the mocker disagree in {bad}", file=sys.stderr)
        return 1
    return 0


def render(
    results: Sequence[CaseResult], profile: dict[str, Any] | None, env_info: dict[str, Any]
) -> str:
    parts = [
        "## servesim vs mocker: replay speed and memory",
        "",
        f"`{env_info['command']}`",
        "",
        f"servesim {_revision(env_info)} (Python {env_info['python']}), mocker "
        f"ai-dynamo-runtime {env_info['mocker_version'] or '-'}; {env_info['cpu']} x "
        f"{env_info['cpu_count']}; load average at start {env_info['loadavg_start']}, "
        f"at end {env_info['loadavg_end']}. Medians of {env_info['repeat']} runs; ratio = "
        "servesim / mocker (below 1 would mean servesim is faster / smaller).",
        "",
    ]
    if results:
        parts += [overview_markdown(results), ""]
        for case in results:
            parts += [case_markdown(case), ""]
            if case.trace_stats:
                ts = case.trace_stats
                parts += [
                    f"Generated trace: {ts['requests']:,} requests over {ts['span_s']:,.0f} s, "
                    f"input mean {ts['input_mean']:,.0f} / std {ts['input_std']:,.0f} / median "
                    f"{ts['input_median']:,.0f} tokens, output mean {ts['output_mean']:,.0f} / "
                    f"std {ts['output_std']:,.0f}, {ts['total_input_tokens']:,} input tokens.",
                    "",
                ]
    if profile:
        parts += [profile_markdown(profile["rows"], profile["wall_s"], profile["case"]), ""]
    return "\n".join(parts).rstrip()


def to_json(
    results: Sequence[CaseResult], profile: dict[str, Any] | None, env_info: dict[str, Any]
) -> dict[str, Any]:
    cases = []
    for c in results:
        variants = {}
        for name, v in c.variants.items():
            variants[name] = {
                **variant_stats(v),
                "samples": [
                    {
                        "wall_s": s.wall_s,
                        "sim_s": s.sim_s,
                        "peak_rss_mb": s.peak_rss_mb,
                        "cpu_s": s.cpu_s,
                        "import_s": s.import_s,
                    }
                    for s in v.samples
                ],
                "summary": {
                    k: v.samples[0].summary.get(k)
                    for k in REPORTED_KEYS
                    if k in v.samples[0].summary
                },
            }
        ratios = {}
        if "mocker" in variants:
            m = variants["mocker"]
            for name, st in variants.items():
                if name != "mocker":
                    ratios[name] = {
                        key: st[key] / m[key]
                        for key in (
                            "wall_s_median",
                            "wall_s_min",
                            "sim_s_median",
                            "sim_s_min",
                            "peak_rss_mb_median",
                            "cpu_s_median",
                        )
                    }
        cases.append(
            {
                "case": c.spec.name,
                "label": c.spec.label,
                "trace": str(c.trace),
                "workers": c.spec.workers,
                "generated_trace": c.trace_stats,
                "mocker_kwargs": c.mocker_kwargs,
                "variants": variants,
                "ratios_servesim_over_mocker": ratios,
                "agreement": c.agreement,
                "loadavg_per_repeat": c.loadavg,
            }
        )
    return {"environment": env_info, "cases": cases, "profile": profile}


if __name__ == "__main__":
    sys.exit(main())
