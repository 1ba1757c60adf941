"""Host KV pool sizing: TTFT, prefix reuse by tier and bytes moved against the G2 pool size.

One trace is replayed with a host pool of each size under every worker's G1 (HBM) pool; one
CSV and one three-panel figure (TTFT p50/p90, reuse by tier, bytes moved).

    python experiments/host_pool_sweep.py --trace TRACE.jsonl [--host-blocks 0,6430,...]
        [--out DIR] [--max-requests N] [--jobs J] [HYDRA_OVERRIDE ...]

It runs one Hydra multirun of `servesim` with `experiment=host_pool` (conf/experiment/
host_pool.yaml: Llama-3.1-8B on H100, 4 aggregated workers, round-robin router, polynomial
timing, HBM-sized G1 pool of 6,430 blocks, a host pool per worker over 32 GB/s each way),
one job per host pool size (`kv_cache.host_offload.num_host_blocks`; 0 runs with the host
tier off, `null`, as the schema has no empty pool), into DIR/runs; then reads every job's
summary with experiments/collect.py's `collect` and writes DIR/host_pool.csv (one row per
size, smallest first), DIR/host_pool.png and DIR/meta.json (the command and wall time), and
prints the table as markdown.

The default sizes are 0, 0.5, 1, 2, 4, 8, 16 and 32 times the experiment's G1 pool; the
`host_to_g1_ratio` column divides by each run's own `num_gpu_blocks`, so it stays right when
an override changes the G1 pool. Reuse by tier is `g1_reused_ratio` and `host_reused_ratio`
(input tokens served from each tier over all input tokens); bytes are `d2h_bytes` (stores to
host) and `h2d_bytes` (loads from host), in decimal GB.

Options:
  --trace FILE          Mooncake JSONL trace (workload=mooncake)
  --host-blocks LIST    host blocks per worker, comma-separated (0 = no host tier)
  --out DIR             output directory (default multirun/host_pool/DATE_TIME)
  --max-requests N      replay only the first N requests of the trace (quick runs)
  --jobs J              run J jobs at a time with hydra/launcher=joblib, if the
                        hydra-joblib-launcher plugin is installed (`pip install -e .[sweep]`);
                        else jobs run one after another (Hydra's basic launcher)
  HYDRA_OVERRIDE ...    appended to the multirun, e.g. engine.num_gpu_blocks=2000 seed=1

Exit status: 0, or 2 for bad arguments, or servesim's status if the multirun fails (its log
is DIR/runs/servesim.log), or 1 if its jobs are not the host pools asked for.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect import (  # noqa: E402
    collect,
    joblib_available,
    report_sweep,
    run_multirun,
    servesim_command,
)
from collect import markdown as markdown_table  # noqa: E402

EXPERIMENT = "host_pool"
HOST_KEY = "kv_cache.host_offload.num_host_blocks"
G1_BLOCKS = 6430  # experiment=host_pool's HBM-derived pool (80 GB x 0.9 - weights - reserve)
DEFAULT_HOST_BLOCKS = tuple(int(G1_BLOCKS * m) for m in (0, 0.5, 1, 2, 4, 8, 16, 32))
GB = 1e9

METRICS = (
    "num_requests",
    "completed_requests",
    "total_input_tokens",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_ttft_ms",
    "mean_e2e_latency_ms",
    "prefix_cache_reused_ratio",
    "g1_reused_ratio",
    "host_reused_ratio",
    "g1_reused_input_tokens",
    "host_reused_input_tokens",
    "d2h_bytes",
    "h2d_bytes",
    "mean_host_used_ratio",
    "host_evicted_blocks",
    "host_dropped_blocks",
    "mean_kv_used_ratio",
    "n_kv_evictions",
    "n_preemptions",
    "duration_ms",
    "wall_time_ms",
)

# the columns printed (and written to the docs); the CSV has all of them
SHOWN = (
    "num_host_blocks",
    "host_to_g1_ratio",
    "host_gb",
    "median_ttft_ms",
    "p90_ttft_ms",
    "mean_ttft_ms",
    "g1_reused_ratio",
    "host_reused_ratio",
    "prefix_cache_reused_ratio",
    "d2h_gb",
    "h2d_gb",
    "mean_host_used_ratio",
    "host_evicted_blocks",
    "completed_requests",
    "wall_s",
)


def parse_host_blocks(text: str) -> list[int]:
    """`0,6430,12860` -> sorted distinct block counts; raises ValueError on a bad or negative
    entry."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        n = int(item)
        if n < 0:
            raise ValueError(f"{n}: host blocks cannot be negative")
        values.append(n)
    if not values:
        raise ValueError("no host block counts given")
    return sorted(set(values))


def host_value(blocks: int) -> str:
    """The override value for a host pool of `blocks`: 0 is the tier off (`null`)."""
    return "null" if blocks == 0 else str(blocks)


def multirun_args(
    host_blocks: list[int] | tuple[int, ...],
    trace: Path,
    sweep_dir: Path,
    *,
    max_requests: int | None = None,
    jobs: int = 1,
    extra: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The servesim arguments of the multirun: one job per host pool size."""
    args = [
        "--multirun",
        f"experiment={EXPERIMENT}",
        f"workload.path={trace}",
        f"{HOST_KEY}=" + ",".join(host_value(b) for b in host_blocks),
    ]
    if max_requests is not None:
        args.append(f"workload.max_requests={max_requests}")
    if jobs > 1:
        args += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    args += list(extra)
    args.append(f"hydra.sweep.dir={sweep_dir}")
    return args


def _job_pools(job_dir: Path) -> dict[str, int]:
    """Workers, G1 blocks per worker and KV bytes per token, from the job's summary metadata."""
    meta = json.loads((job_dir / "summary.json").read_text())["metadata"]
    return {
        "num_workers": int(meta["num_workers"]),
        "num_gpu_blocks": int(meta["num_gpu_blocks"]),
        "kv_bytes_per_token": int(meta["kv_bytes_per_token"]),
        "block_size": int(meta["config"]["engine"]["block_size"]),
    }


def sweep_table(sweep_dir: Path) -> pd.DataFrame:
    """One row per job of the multirun, smallest host pool first: the pool sizes, METRICS and
    the derived columns (host/G1 ratio, host GB, bytes in GB, wall seconds)."""
    df = collect(sweep_dir, METRICS)
    if HOST_KEY not in df:
        raise ValueError(f"{sweep_dir}: no job overrides {HOST_KEY}")
    host = df[HOST_KEY].map(lambda v: 0 if str(v) in ("null", "None", "") else int(v))
    pools = pd.DataFrame([_job_pools(sweep_dir / str(j)) for j in df["job"]])
    table = pd.concat([pd.DataFrame({"num_host_blocks": host}), pools, df[list(METRICS)]], axis=1)
    table["host_to_g1_ratio"] = table["num_host_blocks"] / table["num_gpu_blocks"]
    block_bytes = table["block_size"] * table["kv_bytes_per_token"]
    table["host_gb"] = table["num_host_blocks"] * block_bytes / GB
    table["d2h_gb"] = table["d2h_bytes"] / GB
    table["h2d_gb"] = table["h2d_bytes"] / GB
    table["wall_s"] = table["wall_time_ms"] / 1000.0
    table["run_dir"] = [f"runs/{j}" for j in df["job"]]
    table = table.sort_values("num_host_blocks", kind="stable").reset_index(drop=True)
    lead = ["num_host_blocks", "host_to_g1_ratio", "host_gb", "num_gpu_blocks"]
    return table[lead + [c for c in table.columns if c not in lead]]


def markdown(df: pd.DataFrame, digits: int = 1) -> str:
    """The table as markdown; ratios to 3 decimals, except the host/G1 pool ratio."""
    return markdown_table(df, lambda c: "ratio" in c and c != "host_to_g1_ratio", digits=digits)


def plot(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Three panels against the host pool (in multiples of G1, evenly spaced): TTFT p50 and
    p90; input tokens reused from G1 and from host, stacked; TB stored to and loaded from
    host."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(table)))
    labels = [
        "off" if b == 0 else f"{r:g}x\n{b:,}"
        for b, r in zip(table["num_host_blocks"], table["host_to_g1_ratio"], strict=True)
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))

    ax = axes[0]
    ax.plot(xs, table["median_ttft_ms"], marker="o", color="C0", label="TTFT p50")
    ax.plot(xs, table["p90_ttft_ms"], marker="s", color="C3", label="TTFT p90")
    ax.set_title("TTFT (ms)", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, frameon=False)

    ax = axes[1]
    g1 = table["g1_reused_ratio"]
    ax.bar(xs, g1, color="C2", label="from G1 (HBM)")
    ax.bar(xs, table["host_reused_ratio"], bottom=g1, color="C1", label="from G2 (host)")
    ax.set_title("input tokens reused (fraction of all input)", fontsize=10)
    # headroom above the tallest bar for the legend
    ax.set_ylim(0, 1.3 * max(float((g1 + table["host_reused_ratio"]).max()), 1e-3))
    ax.legend(fontsize=8, frameon=False, loc="upper left", ncol=2)

    ax = axes[2]
    ax.plot(xs, table["d2h_bytes"] / 1e12, marker="o", color="C4", label="stored G1 -> host")
    ax.plot(xs, table["h2d_bytes"] / 1e12, marker="s", color="C5", label="loaded host -> G1")
    ax.set_title("bytes moved, all workers (TB)", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, frameon=False)

    for ax in axes:
        ax.set_xticks(xs, labels)
        ax.set_xlabel("host blocks per worker (x G1 pool)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", required=True, help="Mooncake JSONL trace")
    ap.add_argument(
        "--host-blocks",
        default=",".join(str(b) for b in DEFAULT_HOST_BLOCKS),
        help="host blocks per worker, comma-separated; 0 = no host tier",
    )
    ap.add_argument("--out", help="output directory (default multirun/host_pool/DATE_TIME)")
    ap.add_argument("--max-requests", type=int, help="replay only the first N requests")
    ap.add_argument("--jobs", type=int, default=1, help="parallel jobs (needs joblib launcher)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args(argv)

    trace = Path(args.trace).resolve()
    if not trace.is_file():
        print(f"host_pool_sweep: --trace {args.trace}: no such file", file=sys.stderr)
        return 2
    try:
        host_blocks = parse_host_blocks(args.host_blocks)
    except ValueError as e:
        print(f"host_pool_sweep: --host-blocks {args.host_blocks}: {e}", file=sys.stderr)
        return 2
    if args.max_requests is not None and args.max_requests < 1:
        print("host_pool_sweep: --max-requests must be positive", file=sys.stderr)
        return 2
    jobs = args.jobs
    if jobs > 1 and not joblib_available():
        print(
            "host_pool_sweep: hydra-joblib-launcher is not installed; running jobs one at a time",
            file=sys.stderr,
        )
        jobs = 1
    out = Path(args.out or f"multirun/host_pool/{dt.datetime.now():%Y-%m-%d_%H-%M-%S}").resolve()
    sweep_dir = out / "runs"
    sweep_dir.mkdir(parents=True, exist_ok=True)

    cmd = servesim_command() + multirun_args(
        host_blocks,
        trace,
        sweep_dir,
        max_requests=args.max_requests,
        jobs=jobs,
        extra=args.overrides,
    )
    print(f"host_pool_sweep: {len(host_blocks)} job(s) -> {sweep_dir}", flush=True)
    print("  " + shlex.join(cmd), flush=True)
    code, wall = run_multirun(cmd, sweep_dir, out, "host_pool_sweep")
    meta: dict[str, object] = {
        "argv": sys.argv if argv is None else ["experiments/host_pool_sweep.py", *argv],
        "host_blocks": host_blocks,
        "jobs": jobs,
        "command": shlex.join(cmd),
        "wall_s": round(wall, 2),
    }
    if code != 0:
        return code
    print(f"  done in {wall:.1f} s", flush=True)

    table = sweep_table(sweep_dir)
    got = list(table["num_host_blocks"])
    if got != host_blocks:
        print(
            f"host_pool_sweep: expected host pools {host_blocks}, found {got} under {sweep_dir}",
            file=sys.stderr,
        )
        return 1
    csv = out / "host_pool.csv"
    table.to_csv(csv, index=False)

    n_req = int(table["num_requests"].iloc[0])
    g1 = int(table["num_gpu_blocks"].iloc[0])
    workers = int(table["num_workers"].iloc[0])
    title = (
        f"{trace.name} ({n_req:,} requests), {workers} workers, G1 pool {g1:,} blocks per worker"
    )
    png = plot(table, out / "host_pool.png", title=title)
    report_sweep(
        out, meta, csv, png, markdown(table[[c for c in SHOWN if c in table]]), wall, len(table)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
