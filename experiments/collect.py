"""Turn a Hydra multirun directory into one table (and optionally one plot) of its runs.

    python experiments/collect.py multirun/2026-12-02/18-00-00 [--out sweep.csv]
        [--metrics mean_ttft_ms,p90_ttft_ms,...] [--plot p90_ttft_ms --x topology.num_workers]

Each job directory holds `.hydra/overrides.yaml` (the overrides Hydra applied) and what
servesim wrote (docs/running.md): `summary.json` once the run finished, `error.json` if it
failed or was interrupted. The table has one row per job: its status (`completed`, `failed`:
its error.json says so, `incomplete`: no summary.json), its overrides, the chosen metrics
(empty unless the job has a summary) and, for a job that did not complete, its exit status and
error. Jobs that did not complete are also listed on stderr.

A metric is a summary key or a dotted path into the summary (`metadata.num_gpu_blocks`); the
host-time keys kept under `metadata.wall` (`wall_time_ms`, `processed_tokens_per_s`, ...) are
found by their own name too.

The sweep scripts (pd_sweep.py, host_pool_sweep.py) also take from here how to call servesim,
how to run one multirun with its log, and a markdown table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from servesim import rundir

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


def servesim_command() -> list[str]:
    """The servesim console script next to this interpreter, else `python -m servesim.cli`."""
    script = Path(sys.executable).parent / "servesim"
    if script.exists():
        return [str(script)]
    found = shutil.which("servesim")
    return [found] if found else [sys.executable, "-m", "servesim.cli"]


def joblib_available() -> bool:
    try:
        return importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None
    except ModuleNotFoundError:
        return False


def run_multirun(cmd: Sequence[str], sweep_dir: Path, cwd: Path, prog: str) -> tuple[int, float]:
    """Run one servesim multirun with its output in `sweep_dir`/servesim.log; returns its exit
    status and wall seconds, and on failure prints the log's tail (as `prog`) to stderr."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log = sweep_dir / "servesim.log"
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(list(cmd), stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        print(f"{prog}: servesim failed ({proc.returncode}); {log}:\n{tail}", file=sys.stderr)
    return proc.returncode, wall


def markdown(df: pd.DataFrame, three_digits: Callable[[str], bool], digits: int = 1) -> str:
    """A GitHub markdown table (no tabulate needed): floats rounded to `digits`, or to 3 in the
    columns `three_digits` picks; missing values as `-`."""

    def fmt(col: str, v: object) -> str:
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if three_digits(col) else f"{v:,.{digits}f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.astype(object).itertuples(index=False):
        lines.append("| " + " | ".join(fmt(c, v) for c, v in zip(cols, row, strict=True)) + " |")
    return "\n".join(lines)


def report_sweep(
    out: Path, meta: dict, csv: Path, png: Path, table_md: str, wall_s: float, n_runs: int
) -> None:
    """What every sweep script ends with: `meta.json` (with the csv and png paths) in `out`,
    then the Markdown table, the files and the sweep's wall time on stdout."""
    meta["csv"] = str(csv)
    meta["png"] = str(png)
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print()
    print(table_md)
    print()
    print(f"csv: {csv}")
    print(f"plot: {png}")
    print(f"sweep wall time: {wall_s:.1f} s ({n_runs} runs)")


def _overrides(job: Path) -> dict[str, str]:
    path = job / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    out = {}
    for item in yaml.safe_load(path.read_text()) or []:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def metric(summary: dict[str, Any], name: str) -> Any:
    """A summary value by key, by dotted path, or (the host-time keys) under metadata.wall."""
    if name in summary:
        return summary[name]
    node: Any = summary
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            node = None
            break
        node = node[part]
    if node is not None:
        return node
    return summary.get("metadata", {}).get("wall", {}).get(name)


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of a multirun: those Hydra wrote overrides to, or servesim a
    summary or error to."""
    marks = ("summary.json", "error.json", ".hydra/overrides.yaml")
    return sorted(
        {d for d in sweep_dir.iterdir() if d.is_dir() and any((d / m).is_file() for m in marks)}
    )


def collect(sweep_dir: str | Path, metrics: tuple[str, ...] = DEFAULT_METRICS) -> pd.DataFrame:
    """One row per job of the sweep: its status, its overrides and the chosen summary metrics
    (with `exit_status` and `error` when some job did not complete)."""
    sweep = Path(sweep_dir)
    rows = []
    for job in job_dirs(sweep) if sweep.is_dir() else []:
        status, exit_status, message = rundir.run_status(job)
        summary: dict[str, Any] = {}
        if status != rundir.INCOMPLETE_RUN and (job / rundir.SUMMARY).is_file():
            summary = json.loads((job / rundir.SUMMARY).read_text())
        row: dict[str, object] = {"job": job.name, "status": status, **_overrides(job)}
        for m in metrics:
            row[m] = metric(summary, m)
        if status != rundir.COMPLETED:
            row["exit_status"] = exit_status
            row["error"] = " ".join(message.split()) or "no summary.json, no error.json"
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no job directories under {sweep_dir}: is it a multirun dir?")
    df = pd.DataFrame(rows)
    if "exit_status" in df:
        df["exit_status"] = df["exit_status"].astype("Int64")
    numeric_job = pd.to_numeric(df["job"], errors="coerce")
    return df.iloc[numeric_job.argsort(kind="stable")].reset_index(drop=True)


def not_completed(df: pd.DataFrame) -> list[str]:
    """One line per job of a collected table that did not complete."""
    bad = df[df["status"] != rundir.COMPLETED]
    return [
        f"job {r.job}: {r.status}"
        + (f" (exit status {int(r.exit_status)})" if pd.notna(r.exit_status) else "")
        + f": {r.error}"
        for r in bad.itertuples(index=False)
    ]


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
    bad = not_completed(df)
    if bad:
        print(f"collect: {len(bad)} of {len(df)} jobs did not complete:", file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
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
