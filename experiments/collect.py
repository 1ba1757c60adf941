"""Turn a Hydra multirun directory into one table (and optionally one plot) of its runs.

    python experiments/collect.py multirun/2026-12-02/18-00-00 [--out sweep.csv]
        [--metrics mean_ttft_ms,p90_ttft_ms,...] [--plot p90_ttft_ms --x topology.num_workers]

Each job directory holds `.hydra/overrides.yaml` (the overrides Hydra applied) and what
servesim wrote (docs/running.md): `summary.json` once the run finished, `error.json` if it
failed or was interrupted. The table has one row per job: its status (`completed`, `failed`:
its error.json says so, `incomplete`: no summary.json), its overrides (read by Hydra's own
override parser, so `8` is a number, `null` is None and `lru` a string), the chosen metrics
(empty unless the job has a summary) and, for a job that did not complete, its exit status and
error. It is printed as markdown (tabulate, in the `sweep` and `dev` extras); jobs that did
not complete are also listed on stderr.

`--plot METRIC --x KEY` draws METRIC against KEY (a swept override, or another column):
a line over a numeric KEY (on a log axis when its values span two orders of magnitude or
more), one bar per value of a categorical one (strings, booleans, null), and, when the sweep
varied other overrides too, one line or bar series per combination of them. The title names
what was swept.

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
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from servesim import rundir

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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


def markdown(
    df: pd.DataFrame,
    three_digits: Callable[[str], bool],
    digits: int = 1,
    *,
    aligned: bool = False,
) -> str:
    """The table as GitHub markdown (`DataFrame.to_markdown`): floats rounded to `digits`, or to
    3 in the columns `three_digits` picks; integers with thousands separators; missing values as
    `-`; text columns as they are (a job named `10` stays text). Cells are padded to their
    column's width only when `aligned` (for a terminal), so a row of the sweep scripts' tables
    reads the same whatever the other rows hold."""
    cells = df.astype(object).where(df.notna(), None)
    text = [i for i, c in enumerate(df.columns) if all(isinstance(v, str) for v in df[c].dropna())]
    return cells.to_markdown(
        index=False,
        tablefmt="github",
        floatfmt=tuple(",.3f" if three_digits(str(c)) else f",.{digits}f" for c in df.columns),
        intfmt=",",
        missingval="-",
        disable_numparse=text,
        numalign="decimal" if aligned else None,
        stralign="left" if aligned else None,
    )


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


# the columns of a collected table that are neither overrides nor metrics
JOB_COLUMNS = ("job", "status", "exit_status", "error")


def overrides(job: Path) -> dict[str, Any]:
    """The overrides Hydra applied to a job, as typed values (`8` an int, `null` None, `[1,2]`
    a list), by key (`+key`, `~key` and `group@package` keep their key and package)."""
    path = job / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    lines = [str(item) for item in yaml.safe_load(path.read_text()) or []]
    out = {}
    for o in OverridesParser.create().parse_overrides(lines):
        key = o.key_or_group if o.package is None else f"{o.key_or_group}@{o.package}"
        out[key] = o.value()
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
    applied = []
    for job in job_dirs(sweep) if sweep.is_dir() else []:
        status, exit_status, message = rundir.run_status(job)
        summary: dict[str, Any] = {}
        if status != rundir.INCOMPLETE_RUN and (job / rundir.SUMMARY).is_file():
            summary = json.loads((job / rundir.SUMMARY).read_text())
        applied.append(overrides(job))
        row: dict[str, object] = {"job": job.name, "status": status, **applied[-1]}
        for m in metrics:
            row[m] = metric(summary, m)
        if status != rundir.COMPLETED:
            row["exit_status"] = exit_status
            row["error"] = " ".join(message.split()) or "no summary.json, no error.json"
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no job directories under {sweep_dir}: is it a multirun dir?")
    df = pd.DataFrame(rows)
    for key in dict.fromkeys(k for a in applied for k in a):
        values = [a.get(key) for a in applied]
        if any(v is None for v in values):
            # a `null` (or a job without the override) stays None beside numbers, which pandas
            # would turn into NaN in a float column
            df[key] = pd.Series(values, dtype=object)
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


def override_columns(df: pd.DataFrame, metrics: Sequence[str]) -> list[str]:
    """The columns of a collected table that hold overrides."""
    return [c for c in df.columns if c not in JOB_COLUMNS and c not in metrics]


def swept(df: pd.DataFrame, metrics: Sequence[str]) -> list[str]:
    """The overrides that differ between the jobs of a collected table."""
    return [c for c in override_columns(df, metrics) if df[c].map(repr).nunique() > 1]


def log_scale(values: np.ndarray) -> dict[str, Any] | None:
    """The scale for an axis of these values when their nonzero magnitudes span two orders of
    magnitude or more: `log`, or `symlog` (linear below the smallest magnitude) when a value
    is 0 or negative; else None (linear)."""
    finite = values[np.isfinite(values)]
    nonzero = np.abs(finite[finite != 0])
    if not len(nonzero) or nonzero.max() < 100 * nonzero.min():
        return None
    if (finite > 0).all():
        return {"value": "log"}
    return {"value": "symlog", "linthresh": float(nonzero.min())}


def _label(value: Any) -> str:
    """An override value as it is written on Hydra's command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def plot(df: pd.DataFrame, y: str, x: str, metrics: Sequence[str]) -> Figure:
    """`y` against `x` over the jobs of a collected table (see the module's docstring).

    ValueError if a column is missing or no job has a numeric `y` (the figure would be empty).
    """
    import matplotlib.pyplot as plt

    for name, column in (("--x", x), ("--plot", y)):
        if column not in df:
            raise ValueError(f"{name} {column!r} is not a column; the columns: {list(df.columns)}")
    values = pd.to_numeric(df[y], errors="coerce").astype(float)
    if not values.notna().any():
        raise ValueError(f"no job has a numeric {y} to plot ({len(df)} jobs)")
    varied = swept(df, metrics)
    # one series per combination of the other swept overrides (when x is one of them: against
    # another column, such as a throughput, every job is one point of one curve)
    others = [c for c in varied if c != x] if x in varied else []
    series = (
        df[others].apply(lambda r: ", ".join(f"{c}={_label(r[c])}" for c in others), axis=1)
        if others
        else pd.Series("", index=df.index)
    )
    numeric = pd.api.types.is_numeric_dtype(df[x]) and not pd.api.types.is_bool_dtype(df[x])
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    names = list(dict.fromkeys(series))
    if numeric:
        xs = df[x].to_numpy(dtype=float)
        for name in names:
            sel = (series == name).to_numpy()
            order = np.argsort(xs[sel], kind="stable")
            ax.plot(xs[sel][order], values[sel].to_numpy()[order], marker="o", label=name or y)
        scale = log_scale(xs)
        if scale:
            ax.set_xscale(**scale)
    else:
        _bars(ax, df[x].map(_label), values, series, names)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    what = ", ".join(f"{c} ({df[c].map(repr).nunique()} values)" for c in varied)
    ax.set_title(f"{y} against {x}\nsweep of {what or 'nothing (no override differs)'}")
    if others:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _bars(ax: Axes, x: pd.Series, y: pd.Series, series: pd.Series, names: list[str]) -> None:
    """One bar per category of `x` (in the order the jobs ran), side by side per series."""
    categories = list(dict.fromkeys(x))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        sel = series == name
        pos = x[sel].map(categories.index).to_numpy(dtype=float)
        ax.bar(pos - 0.4 + width * (i + 0.5), y[sel], width=width, label=name or None)
    ax.set_xticks(range(len(categories)), categories)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--metrics", default=",".join(DEFAULT_METRICS))
    ap.add_argument("--out", help="write the table as CSV here")
    ap.add_argument("--plot", help="a metric to plot against --x")
    ap.add_argument("--x", help="the swept override on the x axis, e.g. topology.num_workers")
    ap.add_argument("--plot-out", default="sweep.png")
    args = ap.parse_args(argv)
    metrics = tuple(m for m in args.metrics.split(",") if m)
    try:
        df = collect(args.sweep_dir, metrics)
    except FileNotFoundError as e:
        print(f"collect: {e}", file=sys.stderr)
        return 2
    try:
        print(markdown(df, lambda c: "ratio" in c or "rps" in c or "fraction" in c, aligned=True))
    except ImportError:  # tabulate comes with the sweep and dev extras
        print(df.to_string(index=False))
    bad = not_completed(df)
    if bad:
        print(f"collect: {len(bad)} of {len(df)} jobs did not complete:", file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
    if args.out:
        df.to_csv(args.out, index=False)
    if args.plot:
        if not args.x:
            print(f"collect: --plot needs --x, one of {list(df.columns)}", file=sys.stderr)
            return 2
        import matplotlib

        matplotlib.use("Agg")
        try:
            fig = plot(df, args.plot, args.x, metrics)
        except ValueError as e:
            print(f"collect: {e}", file=sys.stderr)
            return 2
        fig.savefig(args.plot_out, dpi=120)
        print(f"plot: {args.plot_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
