"""experiments/host_pool_sweep.py: the host pool list and its 0 -> null mapping, the multirun
arguments, the table built from a fake multirun directory (no simulation), bad arguments
exiting 2, and one tiny end-to-end sweep where a host pool recovers reuse G1 has evicted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "host_pool_sweep.py"
_spec = importlib.util.spec_from_file_location("host_pool_sweep", SCRIPT)
assert _spec is not None and _spec.loader is not None
host_pool_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_pool_sweep)

KEY = "kv_cache.host_offload.num_host_blocks"
BLOCK_BYTES = 64 * 131_072


def test_host_blocks_parse_sorted_distinct_and_zero_is_off():
    assert host_pool_sweep.parse_host_blocks("6430, 0,3215,6430") == [0, 3215, 6430]
    for bad in ("", ",", "1,-5", "1,x", "2.5"):
        with pytest.raises(ValueError):
            host_pool_sweep.parse_host_blocks(bad)
    assert host_pool_sweep.host_value(0) == "null"
    assert host_pool_sweep.host_value(3215) == "3215"
    # the default: off, then 0.5 ... 32 times experiment=host_pool's 6,430-block G1 pool
    assert host_pool_sweep.DEFAULT_HOST_BLOCKS == (
        0,
        3215,
        6430,
        12860,
        25720,
        51440,
        102880,
        205760,
    )


def test_multirun_args_sweep_one_key_with_null_for_off():
    args = host_pool_sweep.multirun_args(
        [0, 100, 200], Path("/t.jsonl"), Path("/o/runs"), max_requests=5, extra=["seed=1"]
    )
    assert args == [
        "--multirun",
        "experiment=host_pool",
        "workload.path=/t.jsonl",
        f"{KEY}=null,100,200",
        "workload.max_requests=5",
        "seed=1",
        "hydra.sweep.dir=/o/runs",
    ]
    joblib = host_pool_sweep.multirun_args([0], Path("/t.jsonl"), Path("/o"), jobs=2)
    assert "hydra/launcher=joblib" in joblib and "hydra.launcher.n_jobs=2" in joblib


def fake_job(sweep: Path, job: int, host: str, **summary: object) -> None:
    """One job directory as servesim writes it: overrides.yaml and summary.json."""
    d = sweep / str(job)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(f"- {KEY}={host}\n- workload.path=/t.jsonl\n")
    # the host-time keys sit under metadata.wall (collect finds them there by name)
    wall = {k: summary.pop(k) for k in ("wall_time_ms",) if k in summary}
    meta = {
        "wall": wall,
        "num_workers": 4,
        "num_gpu_blocks": 1000,
        "kv_bytes_per_token": 131_072,
        "config": {"engine": {"block_size": 64}},
    }
    (d / "summary.json").write_text(json.dumps({**summary, "metadata": meta}))


def test_table_from_a_fake_multirun_orders_by_pool_and_derives_columns(tmp_path):
    sweep = tmp_path / "runs"
    # job numbers out of pool order: the table sorts by pool size, as numbers
    fake_job(
        sweep,
        0,
        "2000",
        median_ttft_ms=90.0,
        d2h_bytes=3e12,
        h2d_bytes=1e12,
        mean_host_used_ratio=0.9,
        host_reused_ratio=0.1,
        wall_time_ms=2500.0,
    )
    fake_job(
        sweep,
        1,
        "null",
        median_ttft_ms=100.0,
        d2h_bytes=0,
        h2d_bytes=0,
        mean_host_used_ratio=None,
        host_reused_ratio=0.0,
        wall_time_ms=1000.0,
    )
    fake_job(
        sweep,
        2,
        "500",
        median_ttft_ms=95.0,
        d2h_bytes=2e12,
        h2d_bytes=5e11,
        mean_host_used_ratio=1.0,
        host_reused_ratio=0.05,
        wall_time_ms=2000.0,
    )
    table = host_pool_sweep.sweep_table(sweep)
    assert list(table["num_host_blocks"]) == [0, 500, 2000]
    assert list(table["host_to_g1_ratio"]) == [0.0, 0.5, 2.0]
    assert list(table["host_gb"]) == [0.0, 500 * BLOCK_BYTES / 1e9, 2000 * BLOCK_BYTES / 1e9]
    assert list(table["median_ttft_ms"]) == [100.0, 95.0, 90.0]
    assert list(table["d2h_gb"]) == [0.0, 2000.0, 3000.0]
    assert list(table["h2d_gb"]) == [0.0, 500.0, 1000.0]
    assert list(table["wall_s"]) == [1.0, 2.0, 2.5]
    assert list(table["run_dir"]) == ["runs/1", "runs/2", "runs/0"]
    assert pd.isna(table["mean_host_used_ratio"].iloc[0])
    assert list(table.columns[:4]) == [
        "num_host_blocks",
        "host_to_g1_ratio",
        "host_gb",
        "num_gpu_blocks",
    ]
    # metrics missing from a summary are empty cells, not errors
    assert table["p90_ttft_ms"].isna().all()

    md = host_pool_sweep.markdown(
        table[["num_host_blocks", "host_to_g1_ratio", "host_reused_ratio"]]
    )
    assert md.splitlines()[0] == "| num_host_blocks | host_to_g1_ratio | host_reused_ratio |"
    assert md.splitlines()[2] == "| 0 | 0.0 | 0.000 |"
    assert md.splitlines()[4] == "| 2,000 | 2.0 | 0.100 |"

    table["p90_ttft_ms"] = [200.0, 190.0, 180.0]
    table["mean_ttft_ms"] = [120.0, 110.0, 100.0]
    table["g1_reused_ratio"] = [0.05, 0.05, 0.05]
    png = host_pool_sweep.plot(table, tmp_path / "p.png", title="fake")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_exit_2(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    main = host_pool_sweep.main
    assert main(["--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["--trace", str(trace), "--host-blocks", "0,-1"]) == 2
    assert main(["--trace", str(trace), "--max-requests", "0"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "cannot be negative" in err and "must be positive" in err


def write_conversations(path: Path, n_conv: int = 6, turns: int = 4) -> Path:
    """`n_conv` conversations of `turns` turns, each turn's prompt its predecessor's blocks
    plus one new 512-token trace block; turns 200 ms apart, conversations interleaved."""
    rows = []
    next_id = 0
    history: list[list[int]] = [[] for _ in range(n_conv)]
    for t in range(turns):
        for c in range(n_conv):
            history[c] = history[c] + [next_id]
            next_id += 1
            rows.append(
                {
                    "timestamp": 200 * (t * n_conv + c),
                    "input_length": 512 * len(history[c]),
                    "output_length": 4,
                    "hash_ids": list(history[c]),
                }
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tiny_sweep_host_pool_recovers_evicted_prefixes(tmp_path):
    """One worker with a 40-block G1 pool (2,560 tokens, less than the 6 conversations'
    history) evicts the earlier turns' blocks; a 1,000-block host pool serves them again."""
    trace = write_conversations(tmp_path / "conv.jsonl")
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--trace",
            str(trace),
            "--host-blocks",
            "0,1000",
            "--out",
            str(out),
            "topology.num_workers=1",
            "engine.num_gpu_blocks=40",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| 1,000 | 25.0 |" in proc.stdout and "sweep wall time" in proc.stdout

    df = pd.read_csv(out / "host_pool.csv")
    assert list(df["num_host_blocks"]) == [0, 1000]
    assert list(df["num_gpu_blocks"]) == [40, 40]
    assert (df["completed_requests"] == 24).all()
    off, on = df.iloc[0], df.iloc[1]
    assert off["host_reused_ratio"] == 0 and off["d2h_bytes"] == 0 and off["h2d_bytes"] == 0
    assert on["host_reused_ratio"] > 0 and on["h2d_bytes"] > 0 and on["d2h_bytes"] > 0
    assert on["prefix_cache_reused_ratio"] > off["prefix_cache_reused_ratio"]

    # the off run really had no host tier, the other a 1,000-block pool
    for run_dir, blocks in zip(df["run_dir"], (None, 1000), strict=True):
        cfg = json.loads((out / run_dir / "summary.json").read_text())["metadata"]["config"]
        assert cfg["kv_cache"]["host_offload"]["num_host_blocks"] == blocks
    meta = json.loads((out / "meta.json").read_text())
    assert meta["host_blocks"] == [0, 1000] and f"{KEY}=null,1000" in meta["command"]
    png = out / "host_pool.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
