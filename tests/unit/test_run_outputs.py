"""The run directory and exit-status contract (docs/running.md), through the `servesim` console
script: tables renamed into place and summary.json last; a rerun clears the previous run's
files; exit 2 with a did-you-mean for a mistyped key or option, 3 when no request completed,
130 / 143 when interrupted (no summary.json); summaries of one seed equal apart from
metadata.wall; a multirun whose job fails records the failure, runs the other jobs and exits
non-zero; experiments/collect.py lists failed and incomplete jobs."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import SERVESIM, TINY_ROWS, make_config, run_servesim, write_jsonl

from servesim import rundir
from servesim.sim import simulate

REPO = Path(__file__).resolve().parents[2]


def servesim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_servesim(*args, cwd=cwd, env={**os.environ, "SERVESIM_NATIVE": "0"})


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "tiny.jsonl", TINY_ROWS)


def replay(trace: Path, *more: str) -> tuple[str, ...]:
    return ("workload=mooncake", f"workload.path={trace}", *more)


# --------------------------------------------------------------------------- writing


def test_tables_are_renamed_into_place_and_the_summary_comes_last(tmp_path, trace, monkeypatch):
    """Every file appears under its name only once whole (os.replace from a .partial name),
    summary.json last; a write cut short (an interrupt inside the second table) leaves no
    summary.json and no temporary file, and the tables already renamed are whole."""
    result = simulate(make_config(workload={"kind": "mooncake", "path": str(trace)}))
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace

    def recording_replace(src, dst):
        replaced.append((Path(src).name, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    out = result.write(tmp_path / "run")
    assert replaced[-1] == (".summary.json.partial", "summary.json")
    assert all(src == f".{dst}.partial" for src, dst in replaced)
    assert {dst for _, dst in replaced} == {p.name for p in out.iterdir()}

    real_to_parquet = pd.DataFrame.to_parquet
    written = []

    def interrupted_to_parquet(df, path, *args, **kwargs):
        if written:  # the second table: half of it written, then Ctrl-C
            Path(path).write_bytes(b"PAR1 half a table")
            raise KeyboardInterrupt
        written.append(path)
        return real_to_parquet(df, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", interrupted_to_parquet)
    with pytest.raises(KeyboardInterrupt):
        result.write(tmp_path / "cut")
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["requests.parquet"]
    assert len(pd.read_parquet(tmp_path / "cut" / "requests.parquet")) == 3


def test_a_rerun_leaves_none_of_the_previous_runs_files(tmp_path, trace):
    """A P/D run with the KV router writes transfers and routing tables; an aggregated run
    into the same directory must not leave them beside its own, and a failing run there
    leaves no summary.json of the earlier run. Other files and Hydra's .hydra/ stay."""
    out = tmp_path / "run"
    pd_run = servesim(
        *replay(trace, "topology=disagg", "router=kv", "output.per_request_jsonl=true"),
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    assert pd_run.returncode == 0, pd_run.stderr
    assert {"transfers.parquet", "routing.parquet", "requests.jsonl"} <= {
        p.name for p in out.iterdir()
    }
    (out / "notes.txt").write_text("mine\n")
    agg = servesim(*replay(trace, "output.format=csv"), "hydra.run.dir=run", cwd=tmp_path)
    assert agg.returncode == 0, agg.stderr
    names = {p.name for p in out.iterdir()}
    assert names == {".hydra", "cli.log", "notes.txt", "summary.json"} | {
        f"{t}.csv" for t in ("requests", "passes", "kv")
    }
    bad = servesim(*replay(trace, "engine.max_num_seqs=0"), "hydra.run.dir=run", cwd=tmp_path)
    assert bad.returncode == 2
    assert {p.name for p in out.iterdir()} == {".hydra", "cli.log", "notes.txt", "error.json"}
    assert rundir.run_status(out) == (
        "failed",
        2,
        json.loads((out / "error.json").read_text())["message"],
    )


# --------------------------------------------------------------------------- exit statuses


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "engine.max_num_seq=3",
            "unknown key engine.max_num_seq (did you mean engine.max_num_seqs?)",
        ),
        ("timng=fixed", "unknown key timng (did you mean timing?)"),
        (
            "+engine.max_num_seq=3",
            "engine.max_num_seq: unknown field (not in the schema; did you mean "
            "engine.max_num_seqs?)",
        ),
        ("timing=polynomal", "unknown option timing=polynomal (did you mean timing=polynomial?)"),
        # a schema key the option file leaves out: Hydra's advice to add `+` is right here
        (
            "engine.dp_size=2",
            "engine.dp_size is a config key the chosen option files do not set: add it with "
            "+engine.dp_size=2",
        ),
    ],
)
def test_a_mistyped_key_or_option_exits_2_with_the_closest_name(tmp_path, override, message):
    out = servesim(override, "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr and "To append" not in out.stderr


def test_a_run_that_completes_no_request_exits_3_and_says_why(tmp_path, trace):
    """Every prompt is longer than max_model_len: all rejected. The run itself is whole (its
    summary is written) but it fails: exit 3, the reason on stderr and in error.json."""
    out = servesim(*replay(trace, "engine.max_model_len=16"), "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    assert "no request completed (3 rejected; e.g." in out.stderr
    assert "reaches max_model_len 16" in out.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_requests"] == 0 and summary["rejected_requests"] == 3
    status, code, message = rundir.run_status(tmp_path / "run")
    assert (status, code) == ("failed", 3) and "no request completed" in message


def test_two_runs_of_one_seed_have_the_same_summary_apart_from_metadata_wall(tmp_path, trace):
    summaries = []
    for run in ("a", "b"):
        out = servesim(*replay(trace), f"hydra.run.dir={run}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        summaries.append(json.loads((tmp_path / run / "summary.json").read_text()))
    walls = [s["metadata"].pop("wall") for s in summaries]
    assert summaries[0] == summaries[1]
    for wall in walls:
        assert set(wall) == {
            "wall_time_ms",
            "processed_tokens_per_s",
            "processed_output_tokens_per_s",
        }
        assert wall["wall_time_ms"] > 0
        assert wall["processed_tokens_per_s"] == pytest.approx(
            summaries[0]["processed_tokens"] / (wall["wall_time_ms"] / 1000)
        )
    assert not {"wall_time_ms", "processed_tokens_per_s"} & set(summaries[0])


# --------------------------------------------------------------------------- interrupts


def _wait_for(proc: subprocess.Popen[bytes], marker: bytes, deadline_s: float) -> bytes:
    """The process's stderr until `marker` appears in it (or it ends, or the deadline)."""
    assert proc.stderr is not None
    seen = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    end = time.monotonic() + deadline_s
    while marker not in seen and time.monotonic() < end:
        if sel.select(timeout=1.0):
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_exits_128_plus_the_signal_without_a_summary(tmp_path, signum, status):
    """The signal is sent once the run's progress bar shows that the event loop runs; the
    workload (15,000 requests, many seconds of replay) is far longer than that wait."""
    proc = subprocess.Popen(
        [str(SERVESIM), "workload.num_sessions=5000", "output.progress=on", "hydra.run.dir=run"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "SERVESIM_NATIVE": "0"},
    )
    try:
        seen = _wait_for(proc, b"req/s", deadline_s=240)
        assert b"req/s" in seen, seen.decode(errors="replace")
        proc.send_signal(signum)
        _, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    stderr = (seen + rest).decode(errors="replace")
    name = signal.Signals(signum).name
    assert proc.returncode == status, stderr
    assert f"servesim: interrupted by {name}" in stderr and "Traceback" not in stderr
    run = tmp_path / "run"
    assert not (run / "summary.json").exists()
    assert not list(run.glob(".*.partial"))
    assert rundir.run_status(run) == ("incomplete", status, f"interrupted by {name}")


# --------------------------------------------------------------------------- sweeps


def _sweep(tmp_path: Path, trace: Path, *launcher: str) -> subprocess.CompletedProcess[str]:
    # job 1 is a bad combination: max_num_seqs must be > 0
    return servesim(
        "--multirun",
        *replay(trace),
        "engine.max_num_seqs=8,0,4",
        *launcher,
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_failing_job_does_not_stop_the_sweep(tmp_path, trace, launcher):
    """Jobs 0 and 2 run to the end and keep their outputs; job 1 records its error; the
    multirun exits with job 1's status (2) and lists it; collect.py lists it as failed."""
    if launcher == "joblib":
        sys.path.insert(0, str(REPO / "experiments"))
        from collect import joblib_available

        if not joblib_available():
            pytest.skip("hydra-joblib-launcher not installed (pip install -e .[sweep])")
        out = _sweep(tmp_path, trace, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    else:
        out = _sweep(tmp_path, trace)
    assert out.returncode == 2, out.stderr
    assert "servesim: 1 of 3 jobs did not complete" in out.stderr
    sweep = tmp_path / "sweep"
    assert rundir.run_status(sweep / "1")[:2] == ("failed", 2)
    for job in ("0", "2"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["completed_requests"] == 3
    # a job that left nothing but Hydra's files (killed): incomplete
    (sweep / "3" / ".hydra").mkdir(parents=True)
    (sweep / "3" / ".hydra" / "overrides.yaml").write_text("- engine.max_num_seqs=2\n")
    listed = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "collect.py"), "sweep", "--out", "t.csv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0, listed.stderr
    table = pd.read_csv(tmp_path / "t.csv")
    assert list(table["status"]) == ["completed", "failed", "completed", "incomplete"]
    assert list(table["completed_requests"].fillna(-1)) == [3, -1, 3, -1]
    assert table["wall_time_ms"].notna().tolist() == [True, False, True, False]
    assert "engine.max_num_seqs: Input should be greater than 0" in table["error"][1]
    assert "job 1: failed (exit status 2)" in listed.stderr
    assert "job 3: incomplete: no summary.json, no error.json" in listed.stderr


def test_a_sweep_where_every_job_completes_exits_0(tmp_path, trace):
    out = servesim(
        "--multirun", *replay(trace), "engine.max_num_seqs=8,4", "hydra.sweep.dir=s", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "did not complete" not in out.stderr
