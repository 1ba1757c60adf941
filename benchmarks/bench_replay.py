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
  (every pass stepped); with `--processes N` (N > 1) one runs with `parallel.processes=N`
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
when one of the current sources exists (model/native.py); the header names it, or says source.

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
import hashlib
import json
import math
import os
import platform
import re
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
# the public traces beside the checkout (as the tests look for them)
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
DEFAULT_TRACE_CACHE = Path(tempfile.gettempdir()) / "servesim_bench_traces"
# the mocker keeps the whole replay in memory (6.0 GB at 100k generated requests in
# docs/performance.md); above this many requests it is not run (--mocker-max-requests)
DEFAULT_MOCKER_MAX_REQUESTS = 200_000

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
# issue 8: a 1,000,000-request generated trace on 4 workers in under 2 GB (reported, not asserted)
MEMORY_TARGET_MB = 2048.0
MEMORY_TARGET_REQUESTS = 1_000_000
MEMORY_TARGET_WORKERS = 4

CONV = "conversation_trace.jsonl"


@dataclass(frozen=True)
class CaseSpec:
    name: str
    trace: str  # file name under --traces; "" for a generated trace (path from the cache)
    workers: int  # aggregated workers; in P/D, prefill + decode workers
    label: str
    generated: int = 0  # >0: number of requests of a generated trace
    pd: str | None = None  # "PxD" pools, composed as `compare_dynamo.py --pd PxD`
    overrides: tuple[str, ...] = ()  # Hydra overrides; compare_dynamo translates them too


CASES: dict[str, CaseSpec] = {
    "conv4": CaseSpec("conv4", CONV, 4, "conversation trace, 4 workers (main case)"),
    "conv1": CaseSpec("conv1", CONV, 1, "conversation trace, 1 worker"),
    "conv2": CaseSpec("conv2", CONV, 2, "conversation trace, 2 workers"),
    "synth2": CaseSpec("synth2", "synthetic_trace.jsonl", 2, "synthetic trace, 2 workers"),
    "synth100k": CaseSpec(
        "synth100k", "", 2, "generated Mooncake-style trace, 2 workers", generated=100_000
    ),
    "kv4": CaseSpec(
        "kv4", CONV, 4, "conversation trace, 4 workers, KV router", overrides=("router=kv",)
    ),
    "pd22": CaseSpec(
        "pd22", CONV, 4, "conversation trace, 2P2D (2 prefill + 2 decode workers)", pd="2x2"
    ),
}
DEFAULT_CASES = "conv4,conv1,conv2,synth2"

# generated traces (synth100k, --scale): statistics fitted to synthetic_trace.jsonl (module doc)
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
# arrival gaps are drawn in chunks of this many (the same numbers as one draw of all of them)
GAP_CHUNK = 65_536
# bump when generate_trace writes different rows for the same settings (invalidates the cache)
TRACE_FORMAT = 1


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
    if request.get("read_passes"):  # simulate() leaves the passes table to its first read
        t4 = time.perf_counter()
        out["passes_rows"] = len(result.passes)
        out["passes_s"] = time.perf_counter() - t4
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
    cmd = [python, str(Path(__file__).resolve()), "--child", str(request), str(result)]
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


def compose_case(spec: CaseSpec, trace: Path, compare: Any, extra: Sequence[str] = ()) -> Any:
    """The case's servesim RunConfig, composed as compare_dynamo.py composes it (`--pd PxD`
    for P/D cases, else `--workers N`, then the case's and `extra` overrides)."""
    shape = compare.parse_pd(spec.pd) if spec.pd else spec.workers
    return compare.compose_run_config(trace, shape, [*spec.overrides, *extra])


def _size_tag(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def trace_cache_name(n: int, seed: int = SCALE_SEED) -> str:
    """The cache file name of a generated trace: size, seed and a digest of everything that
    decides its rows (generator settings, the generator's and the streams' source, numpy)."""
    import numpy as np

    from servesim.sim import STREAMS
    from servesim.workload import synthetic

    key = {
        "format": TRACE_FORMAT,
        "workload": SCALE_WORKLOAD,
        "rate_rps": SCALE_RATE_RPS,
        "gap_chunk": GAP_CHUNK,
        "streams": list(STREAMS),
        "generator": hashlib.sha256(Path(synthetic.__file__).read_bytes()).hexdigest(),
        "numpy": np.__version__,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"mooncake_{n}_seed{seed}_{digest}.jsonl"


def cached_trace(n: int, cache: Path) -> tuple[Path, dict[str, Any], bool]:
    """A generated trace of `n` requests from the cache, generating it first if it is missing;
    its statistics (kept next to it as .json) and whether it was generated now."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / trace_cache_name(n)
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return path, json.loads(meta.read_text()), False
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    t0 = time.perf_counter()
    try:
        stats = generate_trace(n, partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    stats["generate_s"] = time.perf_counter() - t0
    os.replace(partial, path)  # a trace in the cache is always complete
    stats["bytes"] = path.stat().st_size
    meta.write_text(json.dumps(stats, indent=1) + "\n")
    return path, stats, True


def generate_trace(n: int, path: Path, seed: int = SCALE_SEED) -> dict[str, Any]:
    """A Mooncake JSONL trace of `n` single-turn requests (servesim's synthetic generator for
    lengths and hash ids, Poisson arrivals rounded to whole ms), streamed to `path` row by
    row. Returns its statistics. Only the lengths (16 bytes a row) stay in memory, for them."""
    import numpy as np

    from servesim.config.schema import SyntheticWorkload
    from servesim.sim import random_streams
    from servesim.workload.synthetic import generate

    cfg = SyntheticWorkload.model_validate({**SCALE_WORKLOAD, "num_sessions": n})
    streams = random_streams(seed)
    mean_gap_ms = 1000.0 / SCALE_RATE_RPS
    inputs = np.empty(n, dtype=np.int64)
    outputs = np.empty(n, dtype=np.int64)
    t = last_t = 0.0  # the first request arrives at 0, request i at the sum of i gaps
    gaps: Any = ()
    with path.open("w") as fh:
        rows = generate(cfg, streams["lengths"], streams["prefix_groups"])
        for i, row in enumerate(rows):
            if i % GAP_CHUNK == 0:
                gaps = streams["arrivals"].exponential(mean_gap_ms, size=min(GAP_CHUNK, n - i))
            inputs[i] = row.input_length
            outputs[i] = row.output_length
            rec = {
                "timestamp": int(round(t)),
                "input_length": row.input_length,
                "output_length": row.output_length,
                "hash_ids": row.hash_ids,
            }
            fh.write(json.dumps(rec) + "\n")
            last_t, t = t, t + float(gaps[i % GAP_CHUNK])
    return {
        "requests": n,
        "span_s": last_t / 1000.0,
        "input_mean": float(np.mean(inputs)),
        "input_std": float(np.std(inputs)),
        "input_median": float(np.median(inputs)),
        "output_mean": float(np.mean(outputs)),
        "output_std": float(np.std(outputs)),
        "total_input_tokens": int(np.sum(inputs)),
        "bytes": path.stat().st_size,
        "seed": seed,
    }


def count_rows(path: Path) -> int:
    """Rows of a JSONL trace (its lines), read in 1 MB pieces: for --mocker-max-requests."""
    n = 0
    last = b"\n"
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")  # a last row without a newline


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
        f"requests in docs/performance.md), and this machine has {_mem_total_gb():.0f} GB"
    )


def _plan_processes(cfg: Any) -> tuple[int, str]:
    """How many processes servesim replays `cfg` in (servesim.parallel.plan_processes)."""
    from servesim.parallel import plan_processes

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
        "servesim_parallel": f"servesim, parallel.processes={args.processes}",
    }
    if args.fast_forward == "both":
        step = compose_case(
            spec, trace, compare, [*args.servesim_override, "engine.fast_forward=false"]
        )
        configs["servesim_step"] = step.model_dump(mode="json")
    if args.processes > 1:
        split = compose_case(
            spec, trace, compare, [*args.servesim_override, f"parallel.processes={args.processes}"]
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


# --------------------------------------------------------------------------- reporting


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _median_if_any(values: list[float | None]) -> float | None:
    """The median of the values measured (None where a sample has none), or None."""
    measured = [x for x in values if x is not None]
    return statistics.median(measured) if measured else None


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
        "import_s_median": _median_if_any([s.import_s for s in v.samples]),
        "passes_s_median": _median_if_any([s.passes_s for s in v.samples]),
        "num_requests": n,
    }


def paired_ratios(case: CaseResult, key: str = "wall_s", variant: str = "servesim") -> list[float]:
    """servesim (or another servesim variant) / mocker of `key` within each repetition (the
    two ran minutes apart at most, under the same load); empty when the mocker did not run."""
    if "mocker" not in case.variants or variant not in case.variants:
        return []
    ours, theirs = case.variants[variant].samples, case.variants["mocker"].samples
    return [getattr(a, key) / getattr(b, key) for a, b in zip(ours, theirs, strict=True)]


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def _setup_line(case: CaseResult) -> str:
    """How the case is configured on both sides."""
    spec, kw = case.spec, case.mocker_kwargs
    ours = f"cluster {case.shape}"
    if spec.pd:
        ours += f" (`compare_dynamo.py --pd {spec.pd}`)"
    if spec.overrides:
        ours += ", overrides `" + " ".join(spec.overrides) + "`"
    theirs = [f"router_mode={kw.get('router_mode')}"]
    if "num_prefill_workers" in kw:
        theirs.append(
            f"num_prefill_workers={kw['num_prefill_workers']}, "
            f"num_decode_workers={kw['num_decode_workers']}"
        )
    else:
        theirs.append(f"num_workers={kw.get('num_workers')}")
    return f"servesim: {ours}; mocker: `{', '.join(theirs)}` (from `compare_dynamo.mocker_kwargs`)."


def case_markdown(case: CaseResult) -> str:
    spec = case.spec
    n = next(iter(case.variants.values())).num_requests
    title = f"### {spec.name}: {spec.label}, {n:,} requests"
    lines = [
        title,
        "",
        f"Trace `{case.trace.name if spec.generated else case.trace}`; "
        f"{_runs(len(next(iter(case.variants.values())).samples))} each, median (min). "
        + _setup_line(case),
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
    elif case.mocker_skipped:
        lines.append("| mocker | not run (--mocker-max-requests, below) | | | | | |")
    if "servesim_step" in stats:
        ff, step = stats["servesim"], stats["servesim_step"]
        lines.append(
            "| **fast_forward=false / true** "
            f"| {_ratio(step['wall_s_median'], ff['wall_s_median'])} "
            f"| {_ratio(step['sim_s_median'], ff['sim_s_median'])} | | | "
            f"{_ratio(step['peak_rss_mb_median'], ff['peak_rss_mb_median'])} | |"
        )
    imports = stats["servesim"]["import_s_median"]
    passes = stats["servesim"]["passes_s_median"]
    paired = paired_ratios(case)
    if len(paired) > 1:
        lines += [
            "",
            "Wall ratio servesim / mocker within each repetition: "
            + ", ".join(f"{r:.2f}x" for r in paired)
            + f" (median {statistics.median(paired):.2f}x).",
        ]
    split = paired_ratios(case, variant="servesim_parallel")
    if len(split) > 1:
        lines += [
            "",
            f"Wall ratio {case.variants['servesim_parallel'].label} / mocker within each "
            "repetition: "
            + ", ".join(f"{r:.2f}x" for r in split)
            + f" (median {statistics.median(split):.2f}x); its CPU time is every process's, "
            "its peak RSS the largest process's.",
        ]
    lines += [
        "",
        f"servesim's process wall includes {imports:.2f} s to import `model` (median)"
        + (
            f" and {passes:.2f} s to read `result.passes` after `simulate()` (`--read-passes`: "
            "the passes table is built on its first read, not by `simulate()`)."
            if passes is not None
            else "."
        ),
        "",
        "Answers (same in every run: " + agreement_stability(case) + "):",
        "",
    ]
    not_run = "mocker not run" + (f": {case.mocker_skipped}" if case.mocker_skipped else "")
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
                f"completed {row['completed_requests']:,} ({not_run})"
            )
    if case.mocker_kwargs.get("router_mode") == "kv_router" and "mocker" in case.variants:
        mocker_ttft = [s.summary.get("mean_ttft_ms") for s in case.variants["mocker"].samples]
        lines += [
            "",
            "The mocker's kv_router breaks cost ties with an unseeded random choice, so its "
            "runs differ from one another (servesim's tie-break is seeded); the check compares "
            "each side's first run. Mocker mean TTFT per run: "
            + ", ".join(f"{x:.3f}" for x in mocker_ttft if x is not None)
            + " ms.",
        ]
    return "\n".join(lines)


def agreement_stability(case: CaseResult) -> str:
    bad = [r["variant"] for r in case.agreement if not r["repeats_identical"]]
    return "yes" if not bad else "NO for " + ", ".join(bad)


def overview_markdown(cases: Sequence[CaseResult]) -> str:
    lines = [
        "| case | requests | servesim wall s | mocker wall s | wall ratio | servesim simulate() s "
        "| mocker call s | simulate ratio | CPU ratio | servesim req / wall-s "
        "| mocker req / wall-s | servesim RSS MB | mocker RSS MB | RSS ratio "
        "| mean TTFT rel. diff | completed equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    skipped = []
    for c in cases:
        s = variant_stats(c.variants["servesim"])
        m = variant_stats(c.variants["mocker"]) if "mocker" in c.variants else None
        ag = next(r for r in c.agreement if r["variant"] == "servesim")
        ttft = ag.get("ttft_rel_diff")
        completed = "-"
        if "completed_rel_diff" in ag:
            completed = "yes" if ag["completed_rel_diff"] == 0 else "no"
        name = c.spec.name
        if c.mocker_skipped:
            skipped.append(c)
            name += " *"
        lines.append(
            f"| {name} | {s['num_requests']:,} | {_f(s['wall_s_median'])} "
            f"| {_f(m['wall_s_median']) if m else '-'} "
            f"| {_ratio(s['wall_s_median'], m['wall_s_median']) if m else '-'} "
            f"| {_f(s['sim_s_median'])} | {_f(m['sim_s_median']) if m else '-'} "
            f"| {_ratio(s['sim_s_median'], m['sim_s_median']) if m else '-'} "
            f"| {_ratio(s['cpu_s_median'], m['cpu_s_median']) if m else '-'} "
            f"| {_f(s['req_per_wall_s'], 0)} | {_f(m['req_per_wall_s'], 0) if m else '-'} "
            f"| {_f(s['peak_rss_mb_median'], 0)} | {_f(m['peak_rss_mb_median'], 0) if m else '-'} "
            f"| {_ratio(s['peak_rss_mb_median'], m['peak_rss_mb_median']) if m else '-'} "
            f"| {'-' if ttft is None else f'{ttft:+.1e}'} | {completed} |"
        )
    if skipped:
        lines.append("")
        lines += [f"\\* mocker not run on {c.spec.name}: {c.mocker_skipped}." for c in skipped]
    return "\n".join(lines)


def _exponent(t0: float | None, t1: float | None, n0: int, n1: int) -> str:
    """log(t1 / t0) / log(n1 / n0): how time grows between two sizes (1.00 = linearly)."""
    if not t0 or not t1 or n1 == n0:
        return "-"
    return f"{math.log(t1 / t0) / math.log(n1 / n0):.2f}"


def scaling_markdown(cases: Sequence[CaseResult], workers: int) -> str:
    """One table over the --scale cases on `workers` workers, smallest trace first."""
    rows = sorted(
        (c for c in cases if c.spec.name.startswith("scale-") and c.spec.workers == workers),
        key=lambda c: c.spec.generated,
    )
    lines = [
        f"#### Scaling with the number of requests, {workers} workers",
        "",
        "Generated traces (`--scale`), medians. Time grows linearly with requests when req / s "
        "stays the same from size to size; *growth* is log(time ratio) / log(request ratio) "
        "against the previous size (1.00 = linear, 2.00 = quadratic).",
        "",
        "| requests | input tokens | simulated s | passes | servesim simulate() s "
        "| servesim req / simulate-s | growth | servesim wall s | servesim req / wall-s "
        "| servesim peak RSS MB | mocker call s | mocker req / call-s | growth | mocker wall s "
        "| mocker req / wall-s | mocker peak RSS MB | simulate ratio | wall ratio | RSS ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|---:|",
    ]
    prev: tuple[int, dict[str, Any], dict[str, Any] | None] | None = None
    for c in rows:
        n = c.spec.generated
        s = variant_stats(c.variants["servesim"])
        m = variant_stats(c.variants["mocker"]) if "mocker" in c.variants else None
        summary = c.variants["servesim"].samples[0].summary
        ts = c.trace_stats or {}
        grow_s = grow_m = "-"
        if prev is not None:
            n0, s0, m0 = prev
            grow_s = _exponent(s0["sim_s_median"], s["sim_s_median"], n0, n)
            if m and m0:
                grow_m = _exponent(m0["sim_s_median"], m["sim_s_median"], n0, n)
        prev = (n, s, m)
        not_run = "not run" if c.mocker_skipped else "-"
        lines.append(
            f"| {n:,} | {ts.get('total_input_tokens', 0) / 1e6:,.1f} M "
            f"| {_f((summary.get('duration_ms') or 0) / 1000, 0)} "
            f"| {summary.get('n_passes') or 0:,} "
            f"| {_f(s['sim_s_median'])} | {_f(s['req_per_sim_s'], 0)} | {grow_s} "
            f"| {_f(s['wall_s_median'])} | {_f(s['req_per_wall_s'], 0)} "
            f"| {_f(s['peak_rss_mb_median'], 0)} "
            + (
                f"| {_f(m['sim_s_median'])} | {_f(m['req_per_sim_s'], 0)} | {grow_m} "
                f"| {_f(m['wall_s_median'])} | {_f(m['req_per_wall_s'], 0)} "
                f"| {_f(m['peak_rss_mb_median'], 0)} "
                f"| {_ratio(s['sim_s_median'], m['sim_s_median'])} "
                f"| {_ratio(s['wall_s_median'], m['wall_s_median'])} "
                f"| {_ratio(s['peak_rss_mb_median'], m['peak_rss_mb_median'])} |"
                if m
                else f"| {not_run} | | | | | | | | |"
            )
        )
    for c in rows:
        if c.mocker_skipped:
            lines += ["", f"Mocker not run at {c.spec.generated:,} requests: {c.mocker_skipped}."]
    target = next((c for c in rows if c.spec.generated == MEMORY_TARGET_REQUESTS), None)
    if target is not None and workers == MEMORY_TARGET_WORKERS:
        rss = variant_stats(target.variants["servesim"])["peak_rss_mb_max"]
        verdict = "met" if rss < MEMORY_TARGET_MB else "**missed**"
        lines += [
            "",
            f"Issue 8's memory target, a {MEMORY_TARGET_REQUESTS:,}-request trace on "
            f"{MEMORY_TARGET_WORKERS} workers under 2 GB ({MEMORY_TARGET_MB:,.0f} MB): servesim's "
            f"largest peak RSS {rss:,.0f} MB, {verdict} (reported, not asserted).",
        ]
    return "\n".join(lines)


def profile_markdown(profile: dict[str, Any]) -> str:
    rows = profile["rows"]
    total = rows[0]["profiled_total_s"] if rows else 0.0
    s = profile.get("summary", {})
    lines = [
        f"### Profile: {profile['case']}",
        "",
        f"cProfile of servesim `simulate()`: {total:.2f} s profiled (process wall "
        f"{profile['wall_s']:.2f} s; profiling inflates times) for {s.get('num_requests') or 0:,} "
        f"requests and {s.get('n_passes') or 0:,} passes. Top functions by own time:",
        "",
        "| # | function | calls | tottime s | share | cumtime s |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"| {i} | `{r['function']}` | {r['ncalls']:,} | {r['tottime_s']:.2f} "
            f"| {100 * r['tottime_share']:.1f} % | {r['cumtime_s']:.2f} |"
        )
    if profile.get("pstats"):
        lines += ["", f"pstats file: `{profile['pstats']}`."]
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


def _mem_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2  # kB
    except (OSError, ValueError, IndexError):
        pass
    return math.nan


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
    where = f"git {git}" if git else f"from {env_info['servesim_repo']} (not a git checkout)"
    build = env_info.get("servesim_native")
    return f"{where}, {'native build ' + build if build else 'source (no native build)'}"


def _native_build(python: str) -> str | None:
    """The native build (model/native.py) the servesim interpreter uses, if any."""
    code = "import servesim, servesim.native as n; print(n.ACTIVE or '')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def environment(args: argparse.Namespace, mocker_python: str | None) -> dict[str, Any]:
    return {
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "mem_total_gb": _mem_total_gb(),
        "loadavg_start": os.getloadavg(),
        "servesim_python": args.servesim_python,
        "servesim_native": _native_build(args.servesim_python),
        "servesim_repo": str(REPO),
        "servesim_git": _git("describe", "--always", "--dirty"),
        "servesim_git_dirty_files": (
            _git("status", "--porcelain", "--untracked-files=no") or ""
        ).splitlines(),
        "python": platform.python_version(),
        "mocker_python": mocker_python,
        "mocker_version": _version(mocker_python, "ai-dynamo-runtime") if mocker_python else None,
        "mocker_max_requests": args.mocker_max_requests,
        "servesim_overrides": list(args.servesim_override),
        "trace_cache": str(args.trace_cache),
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
        help="N > 1: also time servesim with parallel.processes=N (workers replayed in N "
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


def make_scale_spec(n: int, workers: int) -> CaseSpec:
    """A --scale case: a generated trace of `n` requests on `workers` workers (scale-10k-4w)."""
    return CaseSpec(
        f"scale-{_size_tag(n)}-{workers}w",
        "",
        workers,
        f"generated Mooncake-style trace, {workers} worker{'s' if workers > 1 else ''}",
        generated=n,
    )


def scale_spec(name: str) -> CaseSpec | None:
    """The --scale case a name such as scale-10k-4w or scale-1M-4w stands for, else None."""
    m = re.fullmatch(r"scale-(\d+)([kM]?)-(\d+)w", name)
    if m is None or int(m[1]) < 1 or int(m[3]) < 1:
        return None
    return make_scale_spec(int(m[1]) * {"": 1, "k": 1000, "M": 1_000_000}[m[2]], int(m[3]))


def scale_specs(args: argparse.Namespace) -> list[CaseSpec]:
    """The --scale cases: every size on every worker count."""
    return [make_scale_spec(n, w) for w in args.scale_workers for n in args.scale_sizes]


def profile_path(template: str | None, case: str, several: bool) -> str | None:
    if not template:
        return None
    if "{case}" in template:
        return str(Path(template.format(case=case)).resolve())
    path = Path(template).resolve()
    return str(path.with_name(f"{path.stem}.{case}{path.suffix}")) if several else str(path)


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
        f"servesim {_revision(env_info)}; {env_info['cpu_count']} CPUs, "
        f"load {env_info['loadavg_start']}; generated traces in {args.trace_cache}",
        file=sys.stderr,
    )
    compare = _compare_module()
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


def render(
    results: Sequence[CaseResult], profiles: Sequence[dict[str, Any]], env_info: dict[str, Any]
) -> str:
    parts = [
        "## servesim vs mocker: replay speed and memory",
        "",
        f"`{env_info['command']}`",
        "",
        f"servesim {_revision(env_info)} (Python {env_info['python']}), mocker "
        f"ai-dynamo-runtime {env_info['mocker_version'] or '-'}; {env_info['cpu']} x "
        f"{env_info['cpu_count']}, {env_info['mem_total_gb']:.0f} GB RAM; load average at start "
        f"{env_info['loadavg_start']}, at end {env_info['loadavg_end']}. Medians of "
        f"{_runs(env_info['repeat'])}; ratio = servesim / mocker (below 1 would mean servesim is "
        "faster / smaller).",
        "",
    ]
    if "error" in env_info:
        first = env_info["error"].splitlines()[0]
        parts += [f"**The run stopped early** ({first}); the cases below are those that ended.", ""]
    if results:
        parts += [overview_markdown(results), ""]
        scale_workers = sorted(
            {c.spec.workers for c in results if c.spec.name.startswith("scale-")}
        )
        for w in scale_workers:
            parts += [scaling_markdown(results, w), ""]
        for case in results:
            parts += [case_markdown(case), ""]
            if case.trace_stats:
                ts = case.trace_stats
                parts += [
                    f"Generated trace: {ts['requests']:,} requests over {ts['span_s']:,.0f} s, "
                    f"input mean {ts['input_mean']:,.0f} / std {ts['input_std']:,.0f} / median "
                    f"{ts['input_median']:,.0f} tokens, output mean {ts['output_mean']:,.0f} / "
                    f"std {ts['output_std']:,.0f}, {ts['total_input_tokens']:,} input tokens, "
                    f"{ts['bytes'] / 1e6:,.1f} MB.",
                    "",
                ]
    for profile in profiles:
        parts += [profile_markdown(profile), ""]
    return "\n".join(parts).rstrip()


def to_json(
    results: Sequence[CaseResult], profiles: Sequence[dict[str, Any]], env_info: dict[str, Any]
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
                        "passes_s": s.passes_s,
                        "mean_ttft_ms": s.summary.get("mean_ttft_ms"),
                        "completed_requests": s.summary.get("completed_requests"),
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
                "shape": c.shape,
                "pd": c.spec.pd,
                "overrides": list(c.spec.overrides),
                "generated_trace": c.trace_stats,
                "mocker_kwargs": c.mocker_kwargs,
                "mocker_skipped": c.mocker_skipped,
                "variants": variants,
                "ratios_servesim_over_mocker": ratios,
                "wall_ratios_per_repeat": paired_ratios(c),
                "agreement": c.agreement,
                "loadavg_per_repeat": c.loadavg,
            }
        )
    return {
        "environment": env_info,
        "cases": cases,
        "profiles": list(profiles),
        "profile": profiles[0] if profiles else None,  # the first, as before several cases
    }


if __name__ == "__main__":
    sys.exit(main())
