"""Router comparison: round robin, random, KV-aware and KV-aware + session affinity on a Mooncake
trace and a multi-turn synthetic workload; one CSV and one two-panel figure (prefix reuse, TTFT
p90).

    python experiments/router_compare.py [--trace TRACE.jsonl | --no-trace] [--out DIR]
        [--quick] [--sessions N] [--max-requests N] [--jobs J] [HYDRA_OVERRIDE ...]

It runs `servesim` with `experiment=router_compare` (conf/experiment/router_compare.yaml: 4
aggregated Llama-3.1-8B / H100 workers, the Dynamo mocker's engine settings and polynomial
timing) as two Hydra multiruns per trace:

* DIR/<trace>/routers: 3 jobs, `router=round_robin,random,kv`;
* DIR/<trace>/affinity: 1 job, `router=kv router.affinity.mode=session`

(Hydra's sweeper crosses its axes, so kv + affinity cannot be a fourth `router=` value without
another option file; see the experiment file). The traces:

* mooncake: the Mooncake JSONL given by --trace (default: conversation_trace.jsonl in
  $SERVESIM_SHARED_TRACES, else in ../shared/traces beside the checkout), `workload=mooncake`;
* synthetic: `workload=synthetic` with SYNTHETIC below: N sessions (--sessions, default 200) of
  4 turns 2 s apart, each turn's prompt the previous prompt + answer + a new message, the first
  turn's leading 30 % from one of 8 shared prefix groups, first turns at 4 per second.

Then it reads every job's summary with experiments/collect.py's `collect` and writes
DIR/router_compare.csv (one row per trace x router variant), DIR/router_compare.png and
DIR/meta.json (the commands and wall times), and prints the table as markdown.

Options:
  --trace FILE          Mooncake JSONL trace (default: the shared conversation trace)
  --no-trace            run the synthetic workload only
  --out DIR             output directory (default multirun/router_compare/DATE_TIME)
  --quick               a smoke run: 40 synthetic sessions, the first 300 trace requests
  --sessions N          synthetic sessions (default 200; 40 with --quick)
  --max-requests N      replay only the first N requests of the trace (300 with --quick)
  --jobs J              run J jobs at a time with hydra/launcher=joblib, if the
                        hydra-joblib-launcher plugin is installed (`pip install -e .[sweep]`);
                        else jobs run one after another (Hydra's basic launcher)
  HYDRA_OVERRIDE ...    appended to every multirun, e.g. topology.num_workers=8 seed=1

Exit status: 0, or 2 for bad arguments, or servesim's status if a multirun fails (its log is
DIR/<trace>/<multirun>/servesim.log), or 1 if the jobs found are not the variants asked for.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect import (  # noqa: E402
    collect,
    joblib_available,
    report_sweep,
    run_multirun,
    servesim_command,
)
from collect import markdown as markdown_table  # noqa: E402

EXPERIMENT = "router_compare"
TRACES = ("mooncake", "synthetic")
VARIANTS = ("round_robin", "random", "kv", "kv+session")
# the two multiruns of each trace and the overrides that make their jobs
MULTIRUNS: dict[str, tuple[str, ...]] = {
    "routers": ("router=round_robin,random,kv",),
    "affinity": ("router=kv", "router.affinity.mode=session"),
}
SYNTHETIC = {
    "turns_per_session": 4,
    "inter_turn_delay_ms": 2000.0,
    "num_prefix_groups": 8,
    "shared_prefix_ratio": 0.3,
    "rate_rps": 4.0,
}
SESSIONS, QUICK_SESSIONS = 200, 40
QUICK_MAX_REQUESTS = 300

METRICS = (
    "num_requests",
    "completed_requests",
    "total_input_tokens",
    "prefix_cache_reused_ratio",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "mean_e2e_latency_ms",
    "request_throughput_rps",
    "mean_kv_used_ratio",
    "n_kv_evictions",
    "n_preemptions",
    "router_agg_decisions",
    "router_agg_queued",
    "router_agg_mean_queue_wait_ms",
    "router_agg_mean_overlap_regret_blocks",
    "duration_ms",
    "wall_time_ms",
)

# the columns printed (and written to the docs); the CSV has all of them
SHOWN = (
    "trace",
    "router",
    "prefix_cache_reused_ratio",
    "mean_ttft_ms",
    "p90_ttft_ms",
    "mean_e2e_latency_ms",
    "completed_requests",
    "wall_s",
)


def default_trace() -> Path:
    """conversation_trace.jsonl in $SERVESIM_SHARED_TRACES, else in ../shared/traces beside
    the checkout (where the tests look too)."""
    beside = Path(__file__).resolve().parents[2] / "shared" / "traces"
    return Path(os.environ.get("SERVESIM_SHARED_TRACES", beside)) / "conversation_trace.jsonl"


def synthetic_overrides(num_sessions: int) -> list[str]:
    """`workload=synthetic` with SYNTHETIC's shape and `num_sessions` sessions."""
    return ["workload=synthetic", f"workload.num_sessions={num_sessions}"] + [
        f"workload.{k}={v}" for k, v in SYNTHETIC.items()
    ]


def multirun_args(
    trace: str,
    multirun: str,
    sweep_dir: Path,
    *,
    trace_path: Path | None = None,
    num_sessions: int = SESSIONS,
    max_requests: int | None = None,
    jobs: int = 1,
    extra: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The servesim arguments of one multirun (`trace` mooncake or synthetic, `multirun` one of
    MULTIRUNS)."""
    if multirun not in MULTIRUNS:
        raise ValueError(f"multirun {multirun!r}: one of {list(MULTIRUNS)}")
    args = ["--multirun", f"experiment={EXPERIMENT}"]
    if trace == "mooncake":
        if trace_path is None:
            raise ValueError("the mooncake multiruns need trace_path")
        args.append(f"workload.path={trace_path}")
        if max_requests is not None:
            args.append(f"workload.max_requests={max_requests}")
    elif trace == "synthetic":
        args += synthetic_overrides(num_sessions)
    else:
        raise ValueError(f"trace {trace!r}: one of {list(TRACES)}")
    args += list(MULTIRUNS[multirun])
    if jobs > 1:
        args += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    args += list(extra)
    args.append(f"hydra.sweep.dir={sweep_dir}")
    return args


def variant_name(router: dict) -> str:
    """round_robin, random, kv, or kv+MODE for a KV router with affinity on."""
    kind = str(router["kind"])
    mode = str((router.get("affinity") or {}).get("mode", "off"))
    return kind if kind != "kv" or mode == "off" else f"kv+{mode}"


def _job_info(job_dir: Path) -> dict[str, object]:
    """The router variant and the workload, from the job's composed config."""
    cfg = yaml.safe_load((job_dir / ".hydra" / "config.yaml").read_text())
    wl = cfg["workload"]
    label = Path(str(wl["path"])).stem if wl["kind"] == "mooncake" else str(wl["kind"])
    return {"router": variant_name(cfg["router"]), "trace": label, "num_workers": _workers(cfg)}


def _workers(cfg: dict) -> int:
    topo = cfg["topology"]
    if topo["kind"] == "aggregated":
        return int(topo["num_workers"])
    return int(topo["num_prefill_workers"]) + int(topo["num_decode_workers"])


def sweep_table(out: Path, traces: tuple[str, ...] | list[str] = TRACES) -> pd.DataFrame:
    """One row per job of every multirun under `out`: trace, router variant, METRICS (missing
    ones, e.g. the router_agg_* keys of the non-KV routers, empty), wall seconds and run dir;
    ordered by `traces`, then VARIANTS."""
    frames = []
    for trace in traces:
        for multirun in MULTIRUNS:
            sweep_dir = out / trace / multirun
            df = collect(sweep_dir, METRICS)
            info = pd.DataFrame([_job_info(sweep_dir / str(j)) for j in df["job"]])
            frames.append(
                pd.concat([info, df[list(METRICS)]], axis=1).assign(
                    workload=trace,
                    run_dir=[f"{trace}/{multirun}/{j}" for j in df["job"]],
                )
            )
    table = pd.concat(frames, ignore_index=True)
    table["wall_s"] = pd.to_numeric(table["wall_time_ms"], errors="coerce") / 1000.0
    trace_order = {t: i for i, t in enumerate(traces)}
    variant_order = {v: i for i, v in enumerate(VARIANTS)}
    table = (
        table.assign(
            _t=table["workload"].map(trace_order),
            _v=table["router"].map(lambda v: variant_order.get(v, len(VARIANTS))),
        )
        .sort_values(["_t", "_v"], kind="stable")
        .drop(columns=["_t", "_v"])
        .reset_index(drop=True)
    )
    lead = ["trace", "workload", "router", "num_workers"]
    return table[lead + [c for c in table.columns if c not in lead]]


def markdown(df: pd.DataFrame, digits: int = 1) -> str:
    """The table as markdown; ratios and rates (req/s) to 3 decimals."""
    return markdown_table(df, lambda c: "ratio" in c or "rps" in c, digits=digits)


def plot(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Two panels of bars, one group per trace and one bar per router variant: the fraction
    of input tokens served from the prefix cache, and TTFT p90 (log scale when the traces are
    far apart)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(table["trace"]))
    variants = [v for v in VARIANTS if v in set(table["router"])]
    variants += [v for v in dict.fromkeys(table["router"]) if v not in variants]
    width = 0.8 / max(len(variants), 1)
    panels = (
        ("prefix_cache_reused_ratio", "prefix cache reuse (fraction of input tokens)", "{:.3f}"),
        ("p90_ttft_ms", "TTFT p90 (ms)", "{:,.0f}"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (col, label, fmt) in zip(axes, panels, strict=True):
        values = pd.to_numeric(table[col], errors="coerce")
        for i, variant in enumerate(variants):
            xs, ys = [], []
            for g, trace in enumerate(traces):
                row = (table["trace"] == trace) & (table["router"] == variant)
                if row.any():
                    xs.append(g + (i - (len(variants) - 1) / 2) * width)
                    ys.append(float(values[row].iloc[0]))
            bars = ax.bar(xs, ys, width=width, color=f"C{i}", label=variant)
            ax.bar_label(bars, [fmt.format(y) for y in ys], fontsize=6, padding=1)
        finite = values.dropna()
        if col == "p90_ttft_ms" and len(finite) and finite.max() > 20 * max(finite.min(), 1e-9):
            ax.set_yscale("log")
            ax.set_ylim(top=finite.max() * 3)
        else:
            ax.set_ylim(0, 1.15 * max(float(finite.max()) if len(finite) else 0.0, 1e-3))
        ax.set_xticks(range(len(traces)), traces)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.tick_params(labelsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", help="Mooncake JSONL trace (default: the shared conversation one)")
    ap.add_argument("--no-trace", action="store_true", help="run the synthetic workload only")
    ap.add_argument("--out", help="output directory (default multirun/router_compare/DATE_TIME)")
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--sessions", type=int, help=f"synthetic sessions (default {SESSIONS})")
    ap.add_argument("--max-requests", type=int, help="replay only the first N trace requests")
    ap.add_argument("--jobs", type=int, default=1, help="parallel jobs (needs joblib launcher)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args(argv)

    prog = "router_compare"
    if args.no_trace and args.trace:
        print(f"{prog}: --trace and --no-trace exclude each other", file=sys.stderr)
        return 2
    trace_path: Path | None = None
    if not args.no_trace:
        trace_path = Path(args.trace).resolve() if args.trace else default_trace()
        if not trace_path.is_file():
            print(
                f"{prog}: trace {trace_path}: no such file (give --trace FILE, or --no-trace)",
                file=sys.stderr,
            )
            return 2
    sessions = args.sessions or (QUICK_SESSIONS if args.quick else SESSIONS)
    max_requests = args.max_requests
    if max_requests is None and args.quick:
        max_requests = QUICK_MAX_REQUESTS
    if sessions < 1 or (max_requests is not None and max_requests < 1):
        print(f"{prog}: --sessions and --max-requests must be positive", file=sys.stderr)
        return 2
    jobs = args.jobs
    if jobs > 1 and not joblib_available():
        print(
            f"{prog}: hydra-joblib-launcher is not installed; running jobs one at a time",
            file=sys.stderr,
        )
        jobs = 1
    out = Path(
        args.out or f"multirun/router_compare/{dt.datetime.now():%Y-%m-%d_%H-%M-%S}"
    ).resolve()
    out.mkdir(parents=True, exist_ok=True)
    traces = [t for t in TRACES if t != "mooncake" or trace_path is not None]

    servesim = servesim_command()
    meta: dict[str, object] = {
        "argv": sys.argv if argv is None else ["experiments/router_compare.py", *argv],
        "trace": None if trace_path is None else str(trace_path),
        "sessions": sessions,
        "max_requests": max_requests,
        "jobs": jobs,
        "multiruns": {},
    }
    t_start = time.perf_counter()
    for trace in traces:
        for multirun in MULTIRUNS:
            sweep_dir = out / trace / multirun
            cmd = servesim + multirun_args(
                trace,
                multirun,
                sweep_dir,
                trace_path=trace_path,
                num_sessions=sessions,
                max_requests=max_requests,
                jobs=jobs,
                extra=args.overrides,
            )
            print(f"{prog}: {trace}/{multirun} -> {sweep_dir}", flush=True)
            print("  " + shlex.join(cmd), flush=True)
            code, wall = run_multirun(cmd, sweep_dir, out, prog)
            meta["multiruns"][f"{trace}/{multirun}"] = {  # type: ignore[index]
                "command": shlex.join(cmd),
                "wall_s": round(wall, 2),
            }
            if code != 0:
                return code
            print(f"  done in {wall:.1f} s", flush=True)
    total = time.perf_counter() - t_start
    meta["wall_s"] = round(total, 2)

    table = sweep_table(out, traces)
    for trace in traces:
        got = list(table.loc[table["workload"] == trace, "router"])
        if got != list(VARIANTS):
            print(
                f"{prog}: {trace}: expected routers {list(VARIANTS)}, found {got} under {out}",
                file=sys.stderr,
            )
            return 1
    csv = out / "router_compare.csv"
    table.to_csv(csv, index=False)

    workers = int(table["num_workers"].iloc[0])
    parts = [
        f"{t} ({int(n):,} requests)"
        for t, n in table.groupby("trace", sort=False)["num_requests"].first().items()
    ]
    title = f"{workers} aggregated workers; " + ", ".join(parts)
    png = plot(table, out / "router_compare.png", title=title)
    report_sweep(
        out, meta, csv, png, markdown(table[[c for c in SHOWN if c in table]]), total, len(table)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
