"""experiments/collect.py: a Hydra multirun directory read into one table and one figure.

The fake sweeps are laid out as Hydra and servesim leave them: one numbered directory per job
with `.hydra/overrides.yaml`, and `summary.json` when the run finished (`error.json` when it
failed). The tests pin: overrides read as typed values (numbers, strings, null) by Hydra's
parser; one row per job in job-number order with its status and metrics; the markdown
layout; a line on a log axis when a numeric parameter spans two orders of magnitude; one bar
per category of a string parameter (side by side when another parameter was swept too); a
title naming what was swept; no figure (exit 2) when there is nothing to draw. One test runs a
tiny real `servesim --multirun` and the script from the command line.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from conftest import TINY_ROWS, run_servesim, write_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "collect.py"
_spec = importlib.util.spec_from_file_location("collect", SCRIPT)
assert _spec is not None and _spec.loader is not None
collect = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(collect)

METRICS = ("completed_requests", "mean_ttft_ms", "wall_time_ms", "metadata.num_gpu_blocks")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def fake_job(
    sweep: Path,
    job: int,
    overrides: list[str],
    summary: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> None:
    """One job directory: Hydra's overrides.yaml, servesim's summary.json and error.json."""
    d = sweep / str(job)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if error is not None:
        (d / "error.json").write_text(json.dumps(error))


def summary(ttft_ms: float, completed: int = 3) -> dict[str, Any]:
    meta = {"num_gpu_blocks": 1000, "wall": {"wall_time_ms": 12.5}}
    return {"completed_requests": completed, "mean_ttft_ms": ttft_ms, "metadata": meta}


def sweep_of(tmp_path: Path, key: str, values: list[str], ttft_ms: list[float]) -> pd.DataFrame:
    """A sweep of one override over `values`, every job completed with its TTFT."""
    sweep = tmp_path / "sweep"
    for job, (value, ttft) in enumerate(zip(values, ttft_ms, strict=True)):
        fake_job(sweep, job, ["workload=mooncake", f"{key}={value}"], summary(ttft))
    return collect.collect(sweep, METRICS)


def test_one_row_per_job_with_typed_overrides_status_and_metrics(tmp_path):
    """Jobs sort by number (10 after 2); overrides are typed (`8` an int, `null` None, a quoted
    `'8'` a string, `+key` and `group@package` by key); a failed job has its exit status and
    message, a job with nothing but overrides is incomplete; metrics are found by key, dotted
    path or under metadata.wall."""
    sweep = tmp_path / "sweep"
    base = ["workload=mooncake", "+output.note='8'", "llm@engine.llm=llama3_8b"]
    fake_job(sweep, 0, [*base, "engine.max_num_seqs=8", "router=kv"], summary(20.0))
    fake_job(sweep, 2, [*base, "engine.max_num_seqs=null", "router=kv"], summary(30.0))
    fake_job(
        sweep,
        1,
        [*base, "engine.max_num_seqs=0", "router=random"],
        error={"status": "failed", "exit_status": 2, "message": "invalid config:\n  bad   value"},
    )
    fake_job(sweep, 10, [*base, "engine.max_num_seqs=4", "router=random"])
    df = collect.collect(sweep, METRICS)

    assert list(df["job"]) == ["0", "1", "2", "10"]
    assert list(df["status"]) == ["completed", "failed", "completed", "incomplete"]
    assert list(df["engine.max_num_seqs"]) == [8, 0, None, 4]
    assert list(df["router"]) == ["kv", "random", "kv", "random"]
    assert list(df["output.note"]) == ["8"] * 4
    assert list(df["llm@engine.llm"]) == ["llama3_8b"] * 4
    assert list(df["completed_requests"].fillna(-1)) == [3, -1, 3, -1]
    assert list(df["mean_ttft_ms"].fillna(-1)) == [20.0, -1, 30.0, -1]
    assert list(df["wall_time_ms"].fillna(-1)) == [12.5, -1, 12.5, -1]
    assert list(df["metadata.num_gpu_blocks"].fillna(-1)) == [1000, -1, 1000, -1]
    assert list(df["exit_status"].fillna(-1)) == [-1, 2, -1, -1]
    assert df["error"][1] == "invalid config: bad value"
    assert df["error"][3] == "no summary.json, no error.json"
    assert collect.not_completed(df) == [
        "job 1: failed (exit status 2): invalid config: bad value",
        "job 10: incomplete: no summary.json, no error.json",
    ]
    assert collect.swept(df, METRICS) == ["engine.max_num_seqs", "router"]
    # a number column without nulls stays numeric
    assert pd.api.types.is_integer_dtype(sweep_of(tmp_path / "b", "x", ["1", "2"], [1, 2])["x"])


def test_no_job_directories_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no job directories"):
        collect.collect(tmp_path)
    assert collect.main([str(tmp_path)]) == 2


def test_markdown_rounds_per_column_and_marks_missing_values():
    df = pd.DataFrame(
        {
            "job": ["0", "1000"],
            "num_host_blocks": [0, 2000],
            "mean_ttft_ms": [12.345, np.nan],
            "hit_ratio": [0.5, 0.12345],
            "exit_status": pd.array([pd.NA, 2], dtype="Int64"),
        }
    )
    md = collect.markdown(df, lambda c: "ratio" in c)
    assert (
        md.splitlines()[0] == "| job | num_host_blocks | mean_ttft_ms | hit_ratio | exit_status |"
    )
    assert md.splitlines()[2:] == [
        "| 0 | 0 | 12.3 | 0.500 | - |",
        "| 1000 | 2,000 | - | 0.123 | 2 |",
    ]
    aligned = collect.markdown(df, lambda c: "ratio" in c, digits=2, aligned=True)
    lines = aligned.splitlines()
    assert len({len(line) for line in lines}) == 1  # every row padded to the columns' widths
    assert "| 1000  |" in lines[3] and "12.35" in lines[2]


def test_numeric_parameter_over_orders_of_magnitude_is_a_line_on_a_log_axis(tmp_path):
    df = sweep_of(tmp_path, "engine.num_gpu_blocks", ["1600", "16", "160000"], [20, 90, 10])
    fig = collect.plot(df, "mean_ttft_ms", "engine.num_gpu_blocks", METRICS)
    (ax,) = fig.axes
    (line,) = ax.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [16, 1600, 160000])
    np.testing.assert_array_equal(line.get_ydata(), [90, 20, 10])
    assert ax.get_xscale() == "log"
    assert ax.get_title().splitlines() == [
        "mean_ttft_ms against engine.num_gpu_blocks",
        "sweep of engine.num_gpu_blocks (3 values)",
    ]
    assert ax.get_xlabel() == "engine.num_gpu_blocks" and ax.get_ylabel() == "mean_ttft_ms"


def test_log_axis_only_when_the_values_span_two_orders(tmp_path):
    df = sweep_of(tmp_path, "topology.num_workers", ["1", "2", "4", "8"], [40, 30, 20, 10])
    ax = collect.plot(df, "mean_ttft_ms", "topology.num_workers", METRICS).axes[0]
    assert ax.get_xscale() == "linear"
    assert collect.log_scale(np.array([1.0, 99.0])) is None
    assert collect.log_scale(np.array([1.0, 100.0])) == {"value": "log"}
    # a 0 (such as a tier turned off) cannot sit on a log axis: linear up to the smallest value
    assert collect.log_scale(np.array([0.0, 10.0, 1000.0])) == {"value": "symlog", "linthresh": 10}
    assert collect.log_scale(np.array([0.0, 500.0, 2000.0])) is None


def test_string_parameter_gets_one_bar_per_value(tmp_path):
    """A categorical sweep (router=round_robin,random,kv) is one bar per router, in the order
    the jobs ran, as tall as the metric; a failed job's bar is empty, not missing."""
    df = sweep_of(tmp_path, "router", ["round_robin", "random", "kv"], [30, 25, 10])
    ax = collect.plot(df, "mean_ttft_ms", "router", METRICS).axes[0]
    (bars,) = ax.containers
    assert [b.get_height() for b in bars] == [30, 25, 10]
    assert [b.get_x() + b.get_width() / 2 for b in bars] == pytest.approx([0, 1, 2])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["round_robin", "random", "kv"]
    assert ax.get_title() == "mean_ttft_ms against router\nsweep of router (3 values)"
    assert ax.get_legend() is None


def test_other_swept_parameters_make_one_series_each(tmp_path):
    """router x num_workers: against router, side-by-side bars per worker count; against the
    worker count, one line per router; `null` and booleans are categories, as Hydra spells
    them."""
    sweep = tmp_path / "sweep"
    jobs = [(r, w) for r in ("round_robin", "kv", "null") for w in (1, 2)]
    for job, (router, workers) in enumerate(jobs):
        overrides = [f"router.kind={router}", f"topology.num_workers={workers}"]
        fake_job(sweep, job, overrides, summary(10.0 * job + 1))
    df = collect.collect(sweep, METRICS)
    ax = collect.plot(df, "mean_ttft_ms", "router.kind", METRICS).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["round_robin", "kv", "null"]
    one, two = ax.containers
    assert [b.get_height() for b in one] == [1, 21, 41]
    assert [b.get_height() for b in two] == [11, 31, 51]
    assert all(a.get_x() < b.get_x() for a, b in zip(one, two, strict=True))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["topology.num_workers=1", "topology.num_workers=2"]
    assert "sweep of router.kind (3 values), topology.num_workers (2 values)" in ax.get_title()

    ax = collect.plot(df, "mean_ttft_ms", "topology.num_workers", METRICS).axes[0]
    assert [line.get_label() for line in ax.get_lines()] == [
        "router.kind=round_robin",
        "router.kind=kv",
        "router.kind=null",
    ]
    assert [list(line.get_ydata()) for line in ax.get_lines()] == [[1, 11], [21, 31], [41, 51]]

    df = sweep_of(tmp_path / "b", "engine.fast_forward", ["true", "false"], [5, 6])
    ax = collect.plot(df, "mean_ttft_ms", "engine.fast_forward", METRICS).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["true", "false"]


def test_nothing_to_draw_exits_2_without_a_figure(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    fake_job(sweep, 0, ["router=kv"], error={"status": "failed", "exit_status": 2})
    fake_job(sweep, 1, ["router=random"])
    png = tmp_path / "p.png"
    args = [str(sweep), "--plot", "mean_ttft_ms", "--x", "router", "--plot-out", str(png)]
    assert collect.main(args) == 2
    assert "no job has a numeric mean_ttft_ms" in capsys.readouterr().err
    assert collect.main([*args[:3], "--x", "nope", "--plot-out", str(png)]) == 2
    assert "--x 'nope' is not a column" in capsys.readouterr().err
    assert not png.exists()


def test_a_real_multirun_becomes_a_table_and_a_plot(tmp_path):
    """`servesim --multirun` over two worker counts, then the script from the command line."""
    trace = write_jsonl(tmp_path / "tiny.jsonl", TINY_ROWS)
    out = run_servesim(
        "--multirun",
        "workload=mooncake",
        f"workload.path={trace}",
        "topology.num_workers=1,2",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "sweep", "--out", "sweep.csv"]
        + ["--plot", "mean_ttft_ms", "--x", "topology.num_workers"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert list(table["topology.num_workers"]) == [1, 2]
    assert table["completed_requests"].tolist() == [3, 3]
    assert out.stdout.splitlines()[0].startswith("| job ")
    assert out.stdout.splitlines()[-1] == "plot: sweep.png"
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
