"""The `servesim` console script: the shipped default, a trace replay writing its run
directory, a multirun sweep, and bad input exiting with a message that names the culprit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_ROWS, run_servesim, write_jsonl

from servesim.cli import format_summary
from servesim.speed import native


def servesim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_servesim(*args, cwd=cwd)


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "tiny.jsonl", TINY_ROWS)


def test_default_run_prints_a_summary_and_writes_tables(tmp_path):
    out = servesim("hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "TTFT" in out.stdout and "completed" in out.stdout
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed_requests"] == summary["num_requests"] > 0
    for table in ("requests", "passes", "kv"):
        assert len(pd.read_parquet(run / f"{table}.parquet")) > 0


def test_a_timing_model_blind_to_the_model_says_so_once(tmp_path, tiny_trace):
    """The mocker's formula with another model and TP: one line on stderr before the run; the
    default timing (calibrated_roofline) prices them and says nothing."""
    args = ("workload=mooncake", f"workload.path={tiny_trace}", "hydra.run.dir=out")
    big = ("llm=llama3_70b", "engine.tp_size=4")
    out = servesim(*args, *big, "timing=polynomial", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("servesim: note:")]
    assert len(notes) == 1 and "timing=polynomial ignores" in notes[0]
    assert "servesim: note:" not in servesim(*args, "timing=polynomial", cwd=tmp_path).stderr
    assert "servesim: note:" not in servesim(*args, *big, cwd=tmp_path).stderr


def test_the_summary_says_which_code_ran(tmp_path, tiny_trace, monkeypatch):
    """`code` names the native build the run used, or the Python source."""
    args = ("workload=mooncake", f"workload.path={tiny_trace}", "hydra.run.dir=out")
    monkeypatch.setenv("SERVESIM_NATIVE", "0")
    out = servesim(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "code         Python source"
    if native.built() is None:
        return  # (the CI's second run, on the native build, checks the other line)
    monkeypatch.setenv("SERVESIM_NATIVE", "1")
    out = servesim(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == f"code         native build {native.built().name}"


def test_trace_replay_writes_the_run_directory(tmp_path, tiny_trace):
    out = servesim(
        "experiment=dynamo_compat",
        "workload=mooncake",
        f"workload.path={tiny_trace}",
        "topology.num_workers=2",
        "output.per_request_jsonl=true",
        "hydra.run.dir=out",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    run = tmp_path / "out"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_requests"] == 3
    assert summary["metadata"]["num_workers"] == 2
    assert summary["metadata"]["config"]["engine"]["num_gpu_blocks"] == 16384
    records = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert [r["input_length"] for r in records] == [1000, 700, 300]
    assert {"arrival_time_ms", "ttft_ms", "itl_ms", "reused_input_tokens"} <= set(records[0])
    req = pd.read_parquet(run / "requests.parquet")
    assert list(req.decode_worker_idx) == [0, 1, 0]


def test_multirun_sweeps_each_value(tmp_path, tiny_trace):
    out = servesim(
        "--multirun",
        "workload=mooncake",
        f"workload.path={tiny_trace}",
        "topology.num_workers=1,2",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    summaries = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(summaries) == 2
    workers = sorted(json.loads(p.read_text())["metadata"]["num_workers"] for p in summaries)
    assert workers == [1, 2]
    # (tests/tools/test_collect.py turns such a sweep into a table and a plot)


def test_bad_config_value_exits_2_naming_the_path(tmp_path):
    out = servesim("engine.max_num_seqs=0", "hydra.run.dir=x", cwd=tmp_path)
    assert out.returncode == 2
    assert "engine.max_num_seqs" in out.stderr


def test_malformed_trace_exits_2_naming_file_and_line(tmp_path, tiny_trace):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(tiny_trace.read_text() + '{"timestamp": 30, "output_length": 2}\n')
    out = servesim("workload=mooncake", f"workload.path={bad}", "hydra.run.dir=x", cwd=tmp_path)
    assert out.returncode == 2
    assert f"{bad}:4" in out.stderr and "missing hash_ids" in out.stderr
    # the trace is streamed (the bad row is met mid-run): a run cut short reports nothing
    assert not (tmp_path / "x" / "summary.json").exists()
    assert not (tmp_path / "x" / "requests.parquet").exists()


def test_empty_trace_says_so(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = servesim("workload=mooncake", f"workload.path={empty}", "hydra.run.dir=x", cwd=tmp_path)
    assert out.returncode == 2 and "did not contain any requests" in out.stderr


def test_format_summary_lists_counts_and_latencies():
    text = format_summary(
        {
            "num_requests": 3,
            "terminal_status_counts": {"completed": 2, "incomplete": 2, "rejected": 1},
            "not_arrived_requests": 1,
            "duration_ms": 1500.0,
            "metadata": {"wall": {"wall_time_ms": 20.0}},
            "request_throughput_rps": 1.3,
            "output_throughput_tok_s": 10.0,
            "total_throughput_tok_s": 100.0,
            "prefix_cache_reused_ratio": 0.25,
            "mean_ttft_ms": 12.5,
            "median_ttft_ms": None,
        }
    )
    assert "requests     5: 2 completed, 2 incomplete, 1 rejected (1 of them never" in text
    assert "12.50" in text and "0.2500" in text
    assert "duration     1.5 s simulated in 0.02 s wall" in text


def test_a_run_with_the_progress_bar_ends_and_gives_the_same_answers(tmp_path, tiny_trace):
    """output.progress=on steps SimPy a simulated second at a time; SimPy leaves its stopping
    event queued, which once kept the loop going forever after the last request."""
    from servesim.sim import simulate
    from tests.conftest import make_config

    def run(progress: str):
        cfg = make_config(
            workload={"kind": "mooncake", "path": str(tiny_trace)},
            load={"kind": "trace", "arrival_speedup_ratio": 0.01},  # 2.5 s of arrivals
            output={"progress": progress},
        )
        return simulate(cfg)

    # first in a child with a deadline (a hang fails here rather than stalling the suite)
    out = run_servesim("output.progress=on", "hydra.run.dir=x", cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and "completed" in out.stdout
    shown, hidden = run("on"), run("off")
    pd.testing.assert_frame_equal(shown.requests, hidden.requests, check_exact=True)
    assert shown.summary["completed_requests"] == 3
