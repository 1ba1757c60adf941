"""Compare servesim with NVIDIA Dynamo's mocker (offline trace replay) on the same traces.

For every trace x worker count this runs

* servesim: `model.simulate` on a RunConfig composed from conf/ with Hydra's compose API
  (`experiment=dynamo_compat workload=mooncake workload.path=TRACE topology.num_workers=N
  output.progress=off` plus every `--override`), and
* the mocker: `dynamo._core.run_mocker_trace_replay([TRACE], ...)` with the engine settings
  translated from that same RunConfig (`mocker_kwargs`): the engine block (num_gpu_blocks,
  block_size, max_num_seqs, max_num_batched_tokens, prefix caching, chunked prefill,
  max_model_len, speed-up ratios, preemption mode, tensor parallel size) and the timing model
  (polynomial or fixed) become `extra_engine_args={"engine": {...}}`; the workload's
  trace_block_size, the load's arrival_speedup_ratio or concurrency and the stop time become
  keyword arguments. A setting the mocker cannot express stops the run (exit status 2).

and prints, per case, servesim's value, the mocker's value and their difference for: mean,
median and p90 of TTFT, ITL, TPOT and E2E latency; request, output and total throughput; prefix
cache reuse; duration; completed requests. Targets: latencies within 2 % (relative),
throughputs, duration and completed requests within 1 % (relative), prefix reuse within 0.01
(absolute). The mocker's ITL percentiles come from a DDSketch (0.1 % error); servesim's are
exact. Each side's wall time (the simulate / replay call alone) and their ratio are reported.
With `--per-request` every servesim request is also joined with the mocker's per-request records
(`report_jsonl_path`) and the differences are counted (informational).

The mocker is imported if `dynamo._core` is importable here; otherwise it runs in its own
interpreter (`--mocker-python`, default $SERVESIM_MOCKER_PYTHON, else
/work/venvs/dynamo/bin/python) through experiments/_mocker_runner.py, with JSON in and out.

    python experiments/compare_dynamo.py --trace conversation_trace.jsonl,synthetic_trace.jsonl \\
        --workers 1,2,4 --out results.json --markdown table.md
    python experiments/compare_dynamo.py --trace T --override engine.num_gpu_blocks=4096 \\
        --override timing=fixed --override timing.prefill_ms=10

Exit status: 0 if every target is met, 1 if any is missed, 2 on a configuration or run error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, cast

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from model import Result, RunConfig, simulate, validate_config
from model.config import num_gpu_blocks
from model.config.schema import (
    ConcurrencyLoad,
    FixedTiming,
    MooncakeWorkload,
    PolynomialTiming,
    RoundRobinRouter,
    TraceLoad,
)

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
RUNNER = Path(__file__).resolve().with_name("_mocker_runner.py")
DEFAULT_MOCKER_PYTHON = Path("/work/venvs/dynamo/bin/python")
BASE_OVERRIDES = ("experiment=dynamo_compat", "workload=mooncake", "output.progress=off")

Kind = Literal["latency", "throughput", "reuse"]
TARGETS: dict[Kind, float] = {"latency": 0.02, "throughput": 0.01, "reuse": 0.01}


@dataclass(frozen=True)
class Metric:
    key: str
    kind: Kind


METRICS: tuple[Metric, ...] = (
    *(
        Metric(f"{stat}_{name}_ms", "latency")
        for name in ("ttft", "itl", "tpot", "e2e_latency")
        for stat in ("mean", "median", "p90")
    ),
    Metric("request_throughput_rps", "throughput"),
    Metric("output_throughput_tok_s", "throughput"),
    Metric("total_throughput_tok_s", "throughput"),
    Metric("prefix_cache_reused_ratio", "reuse"),
    Metric("duration_ms", "throughput"),
    Metric("completed_requests", "throughput"),
)


class UnsupportedConfig(ValueError):
    """A servesim setting that the mocker's trace replay cannot express."""


# --------------------------------------------------------------------------- servesim


def compose_run_config(trace: Path, workers: int, overrides: Sequence[str] = ()) -> RunConfig:
    """servesim's RunConfig for one case, composed from conf/ as the `servesim` CLI would."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *BASE_OVERRIDES,
                f"workload.path={trace}",
                f"topology.num_workers={workers}",
                *overrides,
            ],
        )
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return validate_config(cast(dict[str, Any], data))


def run_servesim(cfg: RunConfig) -> tuple[Result, float]:
    """The run's result and the wall time of `simulate` in seconds."""
    start = time.perf_counter()
    result = simulate(cfg)
    return result, time.perf_counter() - start


# --------------------------------------------------------------------------- translation


def _timing_model(cfg: RunConfig, problems: list[str]) -> dict[str, Any]:
    timing = cfg.timing
    if isinstance(timing, PolynomialTiming):
        if timing != PolynomialTiming():
            problems.append(
                "timing: the mocker's polynomial has fixed coefficients; servesim's differ "
                f"({timing.model_dump(exclude={'kind'})})"
            )
        return {"type": "polynomial"}
    if isinstance(timing, FixedTiming):
        return {"type": "fixed", "prefill_ms": timing.prefill_ms, "decode_ms": timing.decode_ms}
    problems.append(f"timing={timing.kind}: the mocker takes only polynomial or fixed timing")
    return {}


def mocker_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments of `run_mocker_trace_replay` equivalent to servesim's `cfg` (the
    trace list and report path aside). Raises UnsupportedConfig naming every setting the
    mocker cannot express."""
    problems: list[str] = []
    engine = cfg.engine
    engine_args = {
        "backend": "vllm",
        "num_gpu_blocks": num_gpu_blocks(cfg),
        "block_size": engine.block_size,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "enable_chunked_prefill": engine.enable_chunked_prefill,
        "max_model_len": engine.max_model_len,
        "speedup_ratio": engine.speedup_ratio,
        "decode_speedup_ratio": engine.decode_speedup_ratio,
        "preemption_mode": engine.preemption_mode,
        "timing_model": _timing_model(cfg, problems),
    }
    kwargs: dict[str, Any] = {
        "num_workers": cfg.topology.num_workers,
        "router_mode": "round_robin",
    }
    if not isinstance(cfg.router, RoundRobinRouter):
        problems.append(f"router={cfg.router.kind}: the mocker replays with round_robin only")
    workload = cfg.workload
    if isinstance(workload, MooncakeWorkload):
        kwargs["trace_block_size"] = workload.trace_block_size
        if workload.max_requests is not None:
            problems.append("workload.max_requests: the mocker replays whole files")
    else:
        problems.append(f"workload={workload.kind}: the comparison replays Mooncake traces")
    load = cfg.load
    if isinstance(load, TraceLoad):
        kwargs["arrival_speedup_ratio"] = load.arrival_speedup_ratio
    elif isinstance(load, ConcurrencyLoad):
        kwargs["replay_concurrency"] = load.concurrency
    else:
        problems.append(f"load={load.kind}: the mocker's trace replay has no rate load")
    if cfg.stop.max_virtual_time_ms is not None:
        kwargs["max_sim_time_ms"] = cfg.stop.max_virtual_time_ms
    kwargs["extra_engine_args"] = {"engine": engine_args, "tensor_parallel_size": engine.tp_size}
    if problems:
        raise UnsupportedConfig("cannot run on the mocker:\n  " + "\n  ".join(problems))
    return kwargs


# --------------------------------------------------------------------------- mocker


@dataclass(frozen=True)
class MockerRunner:
    """How the mocker runs: in this interpreter, or in `python` through the runner script."""

    python: Path | None  # None: in-process

    def describe(self) -> str:
        return "in-process" if self.python is None else f"subprocess: {self.python}"

    def run(self, trace: Path, kwargs: dict[str, Any]) -> tuple[dict[str, Any], float, float]:
        """The mocker's summary, the wall time of the replay call and of the whole run (s).
        With `report_jsonl_path` in `kwargs` the mocker also writes its per-request records."""
        start = time.perf_counter()
        if self.python is None:
            out = _runner_module().run([str(trace)], kwargs)
        else:
            out = self._subprocess(trace, kwargs)
        return out["summary"], float(out["call_wall_s"]), time.perf_counter() - start

    def _subprocess(self, trace: Path, kwargs: dict[str, Any]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="compare_dynamo_") as tmp:
            request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
            request.write_text(json.dumps({"trace_files": [str(trace)], "kwargs": kwargs}))
            proc = subprocess.run(
                [str(self.python), str(RUNNER), str(request), str(result)],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
                raise RuntimeError(
                    f"mocker run failed (exit {proc.returncode}) for {trace}:\n{tail}"
                )
            return json.loads(result.read_text())


def _runner_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_mocker_runner", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _mocker_importable() -> bool:
    try:
        return importlib.util.find_spec("dynamo._core") is not None
    except ModuleNotFoundError:
        return False


def choose_runner(mocker_python: str | None) -> MockerRunner:
    """In-process if `dynamo._core` imports here, else the given or default interpreter."""
    if _mocker_importable():
        return MockerRunner(None)
    candidate = mocker_python or os.environ.get("SERVESIM_MOCKER_PYTHON")
    if candidate is None and DEFAULT_MOCKER_PYTHON.exists():
        candidate = str(DEFAULT_MOCKER_PYTHON)
    if candidate is None:
        raise RuntimeError(
            "dynamo._core is not importable here and no mocker interpreter was found: pass "
            "--mocker-python or set SERVESIM_MOCKER_PYTHON"
        )
    if not Path(candidate).exists():
        raise RuntimeError(f"mocker interpreter {candidate} does not exist")
    return MockerRunner(Path(candidate))


# --------------------------------------------------------------------------- comparison


@dataclass
class Row:
    metric: str
    kind: Kind
    servesim: float | None
    mocker: float | None
    diff: float | None  # relative (latency, throughput) or absolute (reuse); None: missing
    target: float
    ok: bool


def difference(kind: Kind, ours: float | None, ref: float | None) -> float | None:
    """servesim minus mocker: relative to the mocker's value, or absolute for reuse."""
    if ours is None or ref is None:
        return None
    if kind == "reuse":
        return ours - ref
    if ref == 0:
        return 0.0 if ours == 0 else math.inf
    return (ours - ref) / abs(ref)


def compare(servesim: dict[str, Any], mocker: dict[str, Any]) -> list[Row]:
    """One row per metric; a value missing on one side only misses its target."""
    rows = []
    for m in METRICS:
        ours, ref = servesim.get(m.key), mocker.get(m.key)
        diff = difference(m.kind, ours, ref)
        target = TARGETS[m.kind]
        ok = (ours is None and ref is None) if diff is None else abs(diff) <= target
        rows.append(Row(m.key, m.kind, ours, ref, diff, target, ok))
    return rows


# --------------------------------------------------------------------------- per request

TIME_ABS_MS = 1e-7  # a tenth of a nanosecond: the mocker keeps pass durations in whole ns
TIME_REL = 0.0  # float noise stays below 1e-9 ms even at 4.6e6 ms


@dataclass
class PerRequest:
    """servesim's requests joined with the mocker's report_jsonl_path records."""

    joined: int
    unmatched: int  # records of (input, output) groups whose sizes differ between the sides
    off_tolerance: int  # arrival, first token or terminal off by > TIME_ABS_MS
    count_mismatches: int  # reused_input_tokens or output_length differ
    worst_abs_ms: float

    def line(self) -> str:
        return (
            f"per request: {self.joined:,} joined, {self.unmatched} unmatched; "
            f"{self.off_tolerance} with a time off by > {TIME_ABS_MS:g} ms "
            f"(worst {self.worst_abs_ms:.2e} ms); {self.count_mismatches} with "
            "different reused tokens or output length"
        )


def _servesim_records(result: Result) -> list[dict[str, Any]]:
    df = result.requests
    df = df[df["terminal_status"] != "incomplete"]
    return [
        {
            "arrival_time_ms": float(r.arrival_ms),
            "input_length": int(r.input_length),
            "requested_output_length": int(r.requested_output_length),
            "output_length": int(r.output_length),
            "first_token_ms": None if math.isnan(r.first_token_ms) else float(r.first_token_ms),
            "terminal_time_ms": float(r.terminal_ms),
            "reused_input_tokens": int(r.reused_input_tokens),
        }
        for r in df.itertuples(index=False)
    ]


def _join_order(rec: dict[str, Any]) -> tuple[float, float, float]:
    first = rec["first_token_ms"]
    return (
        round(rec["arrival_time_ms"], 3),
        -1.0 if first is None else first,
        rec["terminal_time_ms"],
    )


def per_request(result: Result, mocker_jsonl: Path) -> PerRequest:
    """Join on (arrival, input length, requested output) -- the mocker writes no request id:
    records are grouped on the two lengths and paired in (arrival, first token, terminal)
    order, so equal keys pair in sorted order and computed arrivals may differ by float
    rounding -- then compare times, reused tokens and output lengths."""
    groups: dict[tuple[int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    with mocker_jsonl.open() as fh:
        mocker = [json.loads(line) for line in fh if line.strip()]
    for side, records in enumerate((_servesim_records(result), mocker)):
        for rec in records:
            key = (rec["input_length"], rec["requested_output_length"])
            groups.setdefault(key, ([], []))[side].append(rec)
    joined = unmatched = off = counts = 0
    worst = 0.0
    for ours, ref in groups.values():
        if len(ours) != len(ref):
            unmatched += len(ours) + len(ref)
            continue
        for a, b in zip(sorted(ours, key=_join_order), sorted(ref, key=_join_order), strict=True):
            joined += 1
            bad = False
            for f in ("arrival_time_ms", "first_token_ms", "terminal_time_ms"):
                x, y = a[f], b[f]
                if x is None or y is None:
                    bad |= (x is None) != (y is None)
                    continue
                worst = max(worst, abs(x - y))
                bad |= not math.isclose(x, y, rel_tol=TIME_REL, abs_tol=TIME_ABS_MS)
            off += bad
            counts += any(a[f] != b[f] for f in ("reused_input_tokens", "output_length"))
    return PerRequest(joined, unmatched, off, counts, worst)


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    trace: str
    workers: int
    overrides: list[str]
    mocker_kwargs: dict[str, Any]
    servesim_wall_s: float
    mocker_wall_s: float
    mocker_process_wall_s: float
    rows: list[Row]
    servesim_summary: dict[str, Any] = field(repr=False)
    mocker_summary: dict[str, Any] = field(repr=False)
    label: str = ""  # the trace's name in tables: its file name unless that is ambiguous
    per_request: PerRequest | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def wall_ratio(self) -> float:
        return self.servesim_wall_s / self.mocker_wall_s if self.mocker_wall_s > 0 else math.inf

    @property
    def title(self) -> str:
        return f"{self.label or self.trace}, {self.workers} worker{'s' if self.workers > 1 else ''}"

    def worst(self, kind: Kind) -> float:
        diffs = [abs(r.diff) for r in self.rows if r.kind == kind and r.diff is not None]
        return max(diffs, default=math.nan)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ok=self.ok, wall_ratio=self.wall_ratio)
        return out


def run_case(
    trace: Path,
    workers: int,
    overrides: Sequence[str],
    runner: MockerRunner,
    label: str = "",
    check_requests: bool = False,
) -> Case:
    cfg = compose_run_config(trace, workers, overrides)
    kwargs = mocker_kwargs(cfg)
    result, servesim_wall = run_servesim(cfg)
    servesim = result.summary
    joined = None
    if check_requests:
        with tempfile.TemporaryDirectory(prefix="compare_dynamo_") as tmp:
            report = Path(tmp) / "requests.jsonl"
            mocker, mocker_wall, mocker_process_wall = runner.run(
                trace, {**kwargs, "report_jsonl_path": str(report)}
            )
            joined = per_request(result, report)
    else:
        mocker, mocker_wall, mocker_process_wall = runner.run(trace, kwargs)
    return Case(
        trace=str(trace),
        workers=workers,
        overrides=list(overrides),
        mocker_kwargs=kwargs,
        servesim_wall_s=servesim_wall,
        mocker_wall_s=mocker_wall,
        mocker_process_wall_s=mocker_process_wall,
        rows=compare(servesim, mocker),
        servesim_summary=servesim,
        mocker_summary=mocker,
        label=label or trace.name,
        per_request=joined,
    )


# --------------------------------------------------------------------------- formatting


def fmt_value(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or (float(x).is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.1f}"
    if abs(x) >= 1:
        return f"{x:,.3f}"
    return f"{x:.5f}"


def _signed(x: float, decimals: int) -> str:
    """Fixed point, or scientific when fixed point would round a non-zero value to zero."""
    if x == 0:
        return "0"
    if abs(x) < 0.5 * 10**-decimals:
        return f"{x:+.1e}"
    return f"{x:+.{decimals}f}"


def fmt_diff(kind: Kind, diff: float | None) -> str:
    if diff is None:
        return "missing"
    if kind == "reuse":
        return _signed(diff, 5)
    return _signed(diff * 100, 4) + " %"


def fmt_target(kind: Kind) -> str:
    return f"±{TARGETS[kind]:.2f}" if kind == "reuse" else f"±{TARGETS[kind] * 100:g} %"


def _cells(row: Row) -> list[str]:
    return [
        row.metric,
        fmt_value(row.servesim),
        fmt_value(row.mocker),
        fmt_diff(row.kind, row.diff),
        fmt_target(row.kind),
        "ok" if row.ok else "MISS",
    ]


HEADER = ["metric", "servesim", "mocker", "diff", "target", ""]


def wall_line(case: Case) -> str:
    return (
        f"wall time: servesim {case.servesim_wall_s:.2f} s, mocker {case.mocker_wall_s:.2f} s "
        f"(replay call; {case.mocker_process_wall_s:.2f} s with process start-up), "
        f"servesim / mocker = {case.wall_ratio:.1f}x"
    )


def text_table(case: Case) -> str:
    lines = [[*HEADER], *(_cells(r) for r in case.rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    out = [f"== {case.title}" + (f"  ({' '.join(case.overrides)})" if case.overrides else "")]
    for k, line in enumerate(lines):
        out.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append(wall_line(case))
    if case.per_request is not None:
        out.append(case.per_request.line())
    out.append(
        "all targets met"
        if case.ok
        else "TARGETS MISSED: " + ", ".join(r.metric for r in case.rows if not r.ok)
    )
    return "\n".join(out)


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def worst_per_metric(cases: Sequence[Case]) -> list[tuple[Metric, float | None, str]]:
    """Per metric, the difference of largest magnitude over the cases and the case it is in
    ("all" when every case has the same difference, e.g. 0; None: missing in some case)."""
    out: list[tuple[Metric, float | None, str]] = []
    for i, m in enumerate(METRICS):
        diffs = [(c.rows[i].diff, c.title) for c in cases]
        if any(d is None for d, _ in diffs):
            out.append((m, None, next(t for d, t in diffs if d is None)))
            continue
        worst, title = max(diffs, key=lambda dt: abs(cast(float, dt[0])))
        if len(cases) > 1 and all(d == worst for d, _ in diffs):
            title = "all"
        out.append((m, worst, title))
    return out


def markdown(cases: Sequence[Case], overrides: Sequence[str]) -> str:
    """An overview table, the worst difference per metric and one side-by-side table per
    case."""
    extra = f" with overrides `{' '.join(overrides)}`" if overrides else ""
    out = [
        f"Overview (servesim vs mocker{extra}; diff = servesim / mocker - 1, prefix reuse as an "
        "absolute difference; wall = the simulate / replay call alone):",
        "",
        _md_row(
            [
                "trace",
                "workers",
                "worst latency diff",
                "worst throughput diff",
                "prefix reuse diff",
                "servesim wall s",
                "mocker wall s",
                "servesim / mocker",
                "targets",
            ]
        ),
        _md_row(["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---"]),
    ]
    for c in cases:
        reuse = next(r for r in c.rows if r.kind == "reuse")
        out.append(
            _md_row(
                [
                    c.label,
                    str(c.workers),
                    _signed(c.worst("latency") * 100, 4).lstrip("+") + " %",
                    _signed(c.worst("throughput") * 100, 4).lstrip("+") + " %",
                    fmt_diff("reuse", reuse.diff),
                    f"{c.servesim_wall_s:.2f}",
                    f"{c.mocker_wall_s:.2f}",
                    f"{c.wall_ratio:.1f}x",
                    "met" if c.ok else "**missed**",
                ]
            )
        )
    out += [
        "",
        "Worst difference per metric over these cases:",
        "",
        _md_row(["metric", "worst diff", "case"]),
        _md_row(["---", "---:", "---"]),
    ]
    for m, diff, title in worst_per_metric(cases):
        out.append(_md_row([m.key, fmt_diff(m.kind, diff), title]))
    for c in cases:
        out += ["", f"### {c.title}", "", _md_row(HEADER), _md_row(["---", *["---:"] * 5])]
        out += [_md_row(_cells(r)) for r in c.rows]
        out += ["", wall_line(c) + "."]
        if c.per_request is not None:
            line = c.per_request.line()
            out += ["", line[0].upper() + line[1:] + "."]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- CLI


def _split(values: Sequence[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--trace", action="append", required=True, help="Mooncake JSONL (repeatable, or a,b,c)"
    )
    ap.add_argument("--workers", default="1", help="worker counts, e.g. 1,2,4 (default 1)")
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override for servesim (repeatable); translated for the mocker too",
    )
    ap.add_argument("--out", type=Path, help="write every case (rows, summaries) as JSON")
    ap.add_argument("--markdown", type=Path, help="write the tables as Markdown")
    ap.add_argument(
        "--per-request",
        action="store_true",
        help="also join every request with the mocker's report_jsonl_path records and count "
        "differences (informational; the mocker's wall time then includes writing them)",
    )
    ap.add_argument(
        "--mocker-python",
        help="interpreter with dynamo._core when it is not importable here "
        "(default: $SERVESIM_MOCKER_PYTHON, else /work/venvs/dynamo/bin/python)",
    )
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    given = _split(args.trace)
    traces = [Path(t).resolve() for t in given]
    names = [t.name for t in traces]
    labels = [n if names.count(n) == 1 else g for n, g in zip(names, given, strict=True)]
    try:
        workers = [int(w) for w in _split([args.workers])]
    except ValueError:
        print(f"compare_dynamo: --workers must be integers, got {args.workers!r}", file=sys.stderr)
        return 2
    try:
        runner = choose_runner(args.mocker_python)
        cases = []
        for trace, label in zip(traces, labels, strict=True):
            if not trace.is_file():
                raise FileNotFoundError(f"trace {trace} does not exist")
            for n in workers:
                case = run_case(trace, n, args.override, runner, label, args.per_request)
                print(text_table(case) + "\n", flush=True)
                cases.append(case)
    except (RuntimeError, OSError, ValueError, HydraException, OmegaConfBaseException) as e:
        # ValueError covers UnsupportedConfig, servesim's ConfigError and TraceError
        print(f"compare_dynamo: {e}", file=sys.stderr)
        return 2
    ok = all(c.ok for c in cases)
    print(
        f"{sum(c.ok for c in cases)}/{len(cases)} cases met every target; mocker ran "
        f"{runner.describe()}"
    )
    if args.out:
        command = [Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]
        args.out.write_text(
            json.dumps(
                {
                    "command": command,
                    "mocker": runner.describe(),
                    "targets": TARGETS,
                    "all_targets_met": ok,
                    "cases": [c.to_json() for c in cases],
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    if args.markdown:
        args.markdown.write_text(markdown(cases, args.override))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
