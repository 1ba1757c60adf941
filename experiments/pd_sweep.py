"""P:D sizing for a fixed GPU budget: every prefill/decode split of N GPUs, and N aggregated
workers, on one trace; one CSV and one three-panel figure (TTFT p90, ITL p90, goodput).

    python experiments/pd_sweep.py --trace TRACE.jsonl [--gpus 8] [--out DIR]
        [--bandwidth-gbps 50] [--max-requests N] [--jobs J] [HYDRA_OVERRIDE ...]

It runs two Hydra multiruns of `servesim` with `experiment=pd_ratio` (conf/experiment/
pd_ratio.yaml: Llama-3.1-8B on H100, polynomial timing, HBM-sized KV pool, InfiniBand link,
SLO ttft_ms=2000 / itl_ms=25), one worker per GPU:

* DIR/disagg: N-1 jobs, 1P(N-1)D ... (N-1)P1D, swept as one value per split of the `topology`
  node (`topology={num_prefill_workers:P,num_decode_workers:D}`, P + D = N);
* DIR/aggregated: 1 job, `topology=aggregated topology.num_workers=N`;

then reads every job's summary with experiments/collect.py's `collect` and writes
DIR/pd_sweep.csv (one row per split, aggregated last), DIR/pd_sweep.png and DIR/meta.json (the
commands and wall times), and prints the table as markdown.

Goodput is `goodput_request_throughput_rps`: completed requests meeting both the TTFT bound and
the mean-ITL bound ((E2E - TTFT) / (tokens - 1)), per second of the run. The ITL panel shows p90
of every inter-token gap pooled (`p90_itl_ms`); the CSV also has p90 of the per-request mean
(`p90_tpot_ms`), the quantity the SLO checks.

Options:
  --trace FILE          Mooncake JSONL trace (workload=mooncake)
  --gpus N              GPU budget, 1 GPU per worker (default 8; at least 2)
  --out DIR             output directory (default multirun/pd_sweep/DATE_TIME)
  --bandwidth-gbps X    link bandwidth in GB/s (default: link=infiniband's 50)
  --max-requests N      replay only the first N requests of the trace (quick runs)
  --jobs J              run J jobs at a time with hydra/launcher=joblib, if the
                        hydra-joblib-launcher plugin is installed (`pip install -e .[sweep]`);
                        else jobs run one after another (Hydra's basic launcher)
  HYDRA_OVERRIDE ...    appended to both multiruns, e.g. slo.ttft_ms=1000 seed=1

Exit status: 0, or 2 for bad arguments, or servesim's status if a multirun fails (its log is
DIR/<mode>/servesim.log).
"""

from __future__ import annotations

import argparse
import datetime as dt
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

EXPERIMENT = "pd_ratio"

METRICS = (
    "num_requests",
    "completed_requests",
    "goodput_completed_requests",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p90_itl_ms",
    "p99_itl_ms",
    "p90_tpot_ms",
    "mean_e2e_latency_ms",
    "request_throughput_rps",
    "output_throughput_tok_s",
    "goodput_request_throughput_rps",
    "goodput_output_throughput_tok_s",
    "mean_kv_used_ratio",
    "n_preemptions",
    "duration_ms",
    "wall_time_ms",
)

# the columns printed (and written to the docs); the CSV has all of them
SHOWN = (
    "split",
    "prefill_workers",
    "decode_workers",
    "p90_ttft_ms",
    "p90_itl_ms",
    "p90_tpot_ms",
    "goodput_request_throughput_rps",
    "good_fraction",
    "request_throughput_rps",
    "wall_time_ms",
)


def splits(gpus: int) -> list[tuple[int, int]]:
    """(prefill, decode) workers of every split of `gpus` one-GPU workers: 1P(N-1)D first."""
    return [(p, gpus - p) for p in range(1, gpus)]


def multirun_args(
    mode: str,
    gpus: int,
    trace: Path,
    sweep_dir: Path,
    *,
    bandwidth_gbps: float | None = None,
    max_requests: int | None = None,
    jobs: int = 1,
    extra: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The servesim arguments of one of the two multiruns (`mode` is disagg or aggregated)."""
    args = ["--multirun", f"experiment={EXPERIMENT}", f"workload.path={trace}"]
    if mode == "disagg":
        args.append(
            "topology="
            + ",".join(
                f"{{num_prefill_workers:{p},num_decode_workers:{d}}}" for p, d in splits(gpus)
            )
        )
    elif mode == "aggregated":
        args += ["topology=aggregated", f"topology.num_workers={gpus}"]
    else:
        raise ValueError(f"mode {mode!r}: disagg or aggregated")
    if bandwidth_gbps is not None:
        args.append(f"link.bandwidth_gbps={bandwidth_gbps}")
    if max_requests is not None:
        args.append(f"workload.max_requests={max_requests}")
    if jobs > 1:
        args += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    args += list(extra)
    args.append(f"hydra.sweep.dir={sweep_dir}")
    return args


def _job_shape(job_dir: Path) -> dict[str, object]:
    """Workers of each pool, from the job's composed config (.hydra/config.yaml)."""
    cfg = yaml.safe_load((job_dir / ".hydra" / "config.yaml").read_text())
    topo = cfg["topology"]
    if topo["kind"] == "disagg":
        p, d = int(topo["num_prefill_workers"]), int(topo["num_decode_workers"])
        return {"mode": "disagg", "split": f"{p}P{d}D", "prefill_workers": p, "decode_workers": d}
    n = int(topo["num_workers"])
    return {
        "mode": "aggregated",
        "split": f"{n} agg",
        "prefill_workers": 0,
        "decode_workers": 0,
        "aggregated_workers": n,
    }


def sweep_table(out: Path) -> pd.DataFrame:
    """One row per run of both multiruns under `out`: split, pool sizes, then METRICS."""
    frames = []
    for mode in ("disagg", "aggregated"):
        sweep_dir = out / mode
        df = collect(sweep_dir, METRICS)
        shape = pd.DataFrame([_job_shape(sweep_dir / str(j)) for j in df["job"]])
        metrics = df[[m for m in METRICS if m in df]]
        frames.append(
            pd.concat([shape, metrics], axis=1).assign(run_dir=[f"{mode}/{j}" for j in df["job"]])
        )
    table = pd.concat(frames, ignore_index=True)
    if "aggregated_workers" not in table:
        table["aggregated_workers"] = 0
    table["aggregated_workers"] = table["aggregated_workers"].fillna(0).astype(int)
    table["gpus"] = table["prefill_workers"] + table["decode_workers"] + table["aggregated_workers"]
    table["good_fraction"] = pd.to_numeric(
        table["goodput_completed_requests"], errors="coerce"
    ) / pd.to_numeric(table["num_requests"], errors="coerce")
    disagg = table[table["mode"] == "disagg"].sort_values("prefill_workers")
    agg = table[table["mode"] == "aggregated"]
    table = pd.concat([disagg, agg], ignore_index=True)
    lead = ["mode", "split", "gpus", "prefill_workers", "decode_workers", "aggregated_workers"]
    rest = [c for c in table.columns if c not in lead]
    return table[lead + rest]


def markdown(df: pd.DataFrame, digits: int = 1) -> str:
    """The table as markdown; fractions, ratios and rates (req/s) to 3 decimals."""
    return markdown_table(
        df, lambda c: "fraction" in c or "ratio" in c or "rps" in c, digits=digits
    )


def plot(table: pd.DataFrame, path: Path, slo: dict | None = None, title: str = "") -> Path:
    """Three panels against the split: TTFT p90, ITL p90, goodput; aggregated as a separate
    marker at the right and a dashed line across each panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    disagg = table[table["mode"] == "disagg"].reset_index(drop=True)
    agg = table[table["mode"] == "aggregated"].reset_index(drop=True)
    xs = list(range(len(disagg)))
    x_agg = len(disagg) + 0.5
    panels = (
        ("p90_ttft_ms", "TTFT p90 (ms)", (slo or {}).get("ttft_ms"), "TTFT SLO"),
        ("p90_itl_ms", "ITL p90, all gaps (ms)", (slo or {}).get("itl_ms"), "ITL SLO (req. mean)"),
        ("goodput_request_throughput_rps", "goodput (req/s meeting SLO)", None, None),
    )
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (col, label, bound, bound_label) in zip(axes, panels, strict=True):
        ax.plot(xs, disagg[col], marker="o", color="C0", label="disaggregated")
        for _, row in agg.iterrows():
            ax.axhline(row[col], color="C3", ls="--", lw=1)
            ax.plot(
                [x_agg],
                [row[col]],
                marker="*",
                ms=12,
                color="C3",
                ls="none",
                label=f"aggregated x{row['aggregated_workers']}",
            )
        if bound is not None:
            ax.axhline(bound, color="grey", ls=":", lw=1, label=bound_label)
        values = pd.concat([disagg[col], agg[col]]).dropna()
        if col == "p90_ttft_ms" and len(values) and values.max() > 20 * max(values.min(), 1e-9):
            ax.set_yscale("log")
        ax.set_xticks(xs + [x_agg], list(disagg["split"]) + list(agg["split"]), rotation=45)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[-1].set_ylim(bottom=0)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", required=True, help="Mooncake JSONL trace")
    ap.add_argument("--gpus", type=int, default=8, help="GPU budget, 1 GPU per worker")
    ap.add_argument("--out", help="output directory (default multirun/pd_sweep/DATE_TIME)")
    ap.add_argument("--bandwidth-gbps", type=float, help="link bandwidth, GB/s")
    ap.add_argument("--max-requests", type=int, help="replay only the first N requests")
    ap.add_argument("--jobs", type=int, default=1, help="parallel jobs (needs joblib launcher)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args(argv)

    trace = Path(args.trace).resolve()
    if not trace.is_file():
        print(f"pd_sweep: --trace {args.trace}: no such file", file=sys.stderr)
        return 2
    if args.gpus < 2:
        print(
            "pd_sweep: --gpus must be at least 2 (one prefill and one decode worker)",
            file=sys.stderr,
        )
        return 2
    if args.max_requests is not None and args.max_requests < 1:
        print("pd_sweep: --max-requests must be positive", file=sys.stderr)
        return 2
    jobs = args.jobs
    if jobs > 1 and not joblib_available():
        print(
            "pd_sweep: hydra-joblib-launcher is not installed; running jobs one at a time",
            file=sys.stderr,
        )
        jobs = 1
    out = Path(args.out or f"multirun/pd_sweep/{dt.datetime.now():%Y-%m-%d_%H-%M-%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)

    servesim = servesim_command()
    meta: dict[str, object] = {
        "argv": sys.argv if argv is None else ["experiments/pd_sweep.py", *argv],
        "gpus": args.gpus,
        "jobs": jobs,
        "multiruns": {},
    }
    t_start = time.perf_counter()
    for mode in ("disagg", "aggregated"):
        sweep_dir = out / mode
        cmd = servesim + multirun_args(
            mode,
            args.gpus,
            trace,
            sweep_dir,
            bandwidth_gbps=args.bandwidth_gbps,
            max_requests=args.max_requests,
            jobs=jobs,
            extra=args.overrides,
        )
        n_jobs = args.gpus - 1 if mode == "disagg" else 1
        print(f"pd_sweep: {mode}: {n_jobs} job(s) -> {sweep_dir}", flush=True)
        print("  " + shlex.join(cmd), flush=True)
        code, wall = run_multirun(cmd, sweep_dir, out, "pd_sweep")
        meta["multiruns"][mode] = {"command": shlex.join(cmd), "wall_s": round(wall, 2)}  # type: ignore[index]
        if code != 0:
            return code
        print(f"  done in {wall:.1f} s", flush=True)
    total = time.perf_counter() - t_start
    meta["wall_s"] = round(total, 2)

    table = sweep_table(out)
    expected = splits(args.gpus)
    got = list(
        zip(
            table.loc[table["mode"] == "disagg", "prefill_workers"],
            table.loc[table["mode"] == "disagg", "decode_workers"],
            strict=True,
        )
    )
    if got != expected:
        print(f"pd_sweep: expected splits {expected}, found {got} under {out}", file=sys.stderr)
        return 1
    csv = out / "pd_sweep.csv"
    table.to_csv(csv, index=False)

    slo = yaml.safe_load((out / "disagg" / "0" / ".hydra" / "config.yaml").read_text())["slo"]
    n_req = int(table["num_requests"].iloc[0])
    title = (
        f"{args.gpus} GPUs, {trace.name} ({n_req:,} requests); "
        f"SLO TTFT <= {slo['ttft_ms']:g} ms, mean ITL <= {slo['itl_ms']:g} ms"
        if slo.get("ttft_ms") and slo.get("itl_ms")
        else f"{args.gpus} GPUs, {trace.name} ({n_req:,} requests)"
    )
    png = plot(table, out / "pd_sweep.png", slo=slo, title=title)
    report_sweep(
        out, meta, csv, png, markdown(table[[c for c in SHOWN if c in table]]), total, len(table)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
