"""experiments/pd_sweep.py end to end on a tiny generated Mooncake trace: 3 GPUs give 1P2D,
2P1D and 3 aggregated workers, one CSV row each, and a PNG."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "pd_sweep.py"
_spec = importlib.util.spec_from_file_location("pd_sweep", SCRIPT)
assert _spec is not None and _spec.loader is not None
pd_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pd_sweep)


def write_trace(path: Path, n: int = 40, seed: int = 0) -> Path:
    """`n` Mooncake rows, 50 ms apart, 1-4 trace blocks of prompt sharing a first block."""
    rng = random.Random(seed)
    next_id = 1
    lines = []
    for i in range(n):
        blocks = rng.randint(1, 4)
        hash_ids = [0] + list(range(next_id, next_id + blocks - 1))
        next_id += blocks - 1
        row = {
            "timestamp": 50 * i,
            "input_length": 512 * (blocks - 1) + rng.randint(64, 512),
            "output_length": rng.randint(2, 40),
            "hash_ids": hash_ids,
        }
        lines.append(json.dumps(row) + "\n")
    path.write_text("".join(lines))
    return path


def test_splits_cover_the_budget():
    assert pd_sweep.splits(3) == [(1, 2), (2, 1)]
    assert pd_sweep.splits(8)[0] == (1, 7) and pd_sweep.splits(8)[-1] == (7, 1)
    args = pd_sweep.multirun_args("disagg", 3, Path("/t.jsonl"), Path("/o"), max_requests=5)
    assert (
        "topology={num_prefill_workers:1,num_decode_workers:2},"
        "{num_prefill_workers:2,num_decode_workers:1}" in args
    )
    assert "workload.max_requests=5" in args and args[-1] == "hydra.sweep.dir=/o"
    agg = pd_sweep.multirun_args("aggregated", 3, Path("/t.jsonl"), Path("/o"), bandwidth_gbps=25.0)
    assert "topology=aggregated" in agg and "topology.num_workers=3" in agg
    assert "link.bandwidth_gbps=25.0" in agg


def test_sweep_writes_one_row_per_split_and_a_plot(tmp_path):
    trace = write_trace(tmp_path / "tiny.jsonl")
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--trace",
            str(trace),
            "--gpus",
            "3",
            "--out",
            str(out),
            "--max-requests",
            "30",
            "--bandwidth-gbps",
            "25",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| 1P2D |" in proc.stdout and "sweep wall time" in proc.stdout

    df = pd.read_csv(out / "pd_sweep.csv")
    assert list(df["split"]) == ["1P2D", "2P1D", "3 agg"]
    assert list(df["mode"]) == ["disagg", "disagg", "aggregated"]
    assert list(df["prefill_workers"]) == [1, 2, 0]
    assert list(df["decode_workers"]) == [2, 1, 0]
    assert list(df["aggregated_workers"]) == [0, 0, 3]
    assert (df["gpus"] == 3).all()
    for col in (
        "p90_ttft_ms",
        "p90_itl_ms",
        "p90_tpot_ms",
        "goodput_request_throughput_rps",
        "goodput_completed_requests",
        "good_fraction",
    ):
        assert col in df and df[col].notna().all(), col
    assert (df["num_requests"] == 30).all() and (df["completed_requests"] == 30).all()
    assert (df["goodput_completed_requests"] <= df["completed_requests"]).all()

    png = out / "pd_sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    # every run used the sweep's settings: the pd_ratio experiment, its SLO, the link override
    for run_dir in df["run_dir"]:
        summary = json.loads((out / run_dir / "summary.json").read_text())
        cfg = summary["metadata"]["config"]
        assert cfg["slo"]["ttft_ms"] == 2000 and cfg["slo"]["itl_ms"] == 25
        assert cfg["link"]["bandwidth_gbps"] == 25.0
        assert cfg["llm"]["name"] == "llama3_8b"
