"""Turn a Hydra multirun directory into one table (and optionally one plot) of its runs.

    python experiments/collect.py multirun/2026-12-02/18-00-00 [--out sweep.csv]
        [--metrics mean_ttft_ms,p90_ttft_ms,...] [--plot p90_ttft_ms --x topology.num_workers]

Each job directory holds `summary.json` (written by servesim) and `.hydra/overrides.yaml` (the
overrides Hydra applied); the table has one row per job: its overrides, then the chosen metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

DEFAULT_METRICS = (
    "completed_requests",
    "mean_ttft_ms",
    "p90_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2e_latency_ms",
    "request_throughput_rps",
    "output_throughput_tok_s",
    "prefix_cache_reused_ratio",
    "wall_time_ms",
)


def _overrides(job: Path) -> dict[str, str]:
    path = job / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    out = {}
    for item in yaml.safe_load(path.read_text()) or []:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def collect(sweep_dir: str | Path, metrics: tuple[str, ...] = DEFAULT_METRICS) -> pd.DataFrame:
    """One row per job of the sweep: its overrides and the chosen summary metrics."""
    rows = []
    for summary_path in sorted(Path(sweep_dir).glob("*/summary.json")):
        job = summary_path.parent
        summary = json.loads(summary_path.read_text())
        row: dict[str, object] = {"job": job.name, **_overrides(job)}
        for m in metrics:
            row[m] = summary.get(m)
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no */summary.json under {sweep_dir}: is it a multirun dir?")
    df = pd.DataFrame(rows)
    numeric_job = pd.to_numeric(df["job"], errors="coerce")
    return df.iloc[numeric_job.argsort(kind="stable")].reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--metrics", default=",".join(DEFAULT_METRICS))
    ap.add_argument("--out", help="write the table as CSV here")
    ap.add_argument("--plot", help="a metric to plot against --x")
    ap.add_argument("--x", help="the swept override on the x axis, e.g. topology.num_workers")
    ap.add_argument("--plot-out", default="sweep.png")
    args = ap.parse_args(argv)
    try:
        df = collect(args.sweep_dir, tuple(m for m in args.metrics.split(",") if m))
    except FileNotFoundError as e:
        print(f"collect: {e}", file=sys.stderr)
        return 2
    print(df.to_markdown(index=False) if _has_tabulate() else df.to_string(index=False))
    if args.out:
        df.to_csv(args.out, index=False)
    if args.plot:
        if not args.x or args.x not in df:
            print(f"collect: --plot needs --x, one of {list(df.columns)}", file=sys.stderr)
            return 2
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        x = pd.to_numeric(df[args.x], errors="coerce")
        order = x.argsort()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(x.iloc[order], df[args.plot].iloc[order], marker="o")
        ax.set_xlabel(args.x)
        ax.set_ylabel(args.plot)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot_out, dpi=120)
        print(f"plot: {args.plot_out}")
    return 0


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
