"""experiments/router_compare.py: the multirun arguments and variant names, then one quick run
end to end (synthetic sessions, and the first requests of the shared conversation trace when
it is on this machine): one CSV row per trace x router variant, a PNG, and the KV router
reusing at least as much prefix as round robin on the multi-turn sessions."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHARED_TRACES, shared_trace

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "router_compare.py"
_spec = importlib.util.spec_from_file_location("router_compare", SCRIPT)
assert _spec is not None and _spec.loader is not None
router_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(router_compare)

CONVERSATION = SHARED_TRACES / "conversation_trace.jsonl"
VARIANTS = ["round_robin", "random", "kv", "kv+session"]


def test_multirun_args_and_variant_names():
    args = router_compare.multirun_args(
        "mooncake", "routers", Path("/o/m/r"), trace_path=Path("/t.jsonl"), max_requests=5
    )
    assert args == [
        "--multirun",
        "experiment=router_compare",
        "workload.path=/t.jsonl",
        "workload.max_requests=5",
        "router=round_robin,random,kv",
        "hydra.sweep.dir=/o/m/r",
    ]
    syn = router_compare.multirun_args("synthetic", "affinity", Path("/o"), num_sessions=7)
    assert "workload=synthetic" in syn and "workload.num_sessions=7" in syn
    assert syn[-3:] == ["router=kv", "router.affinity.mode=session", "hydra.sweep.dir=/o"]
    with pytest.raises(ValueError):
        router_compare.multirun_args("mooncake", "routers", Path("/o"))  # no trace path
    name = router_compare.variant_name
    assert name({"kind": "round_robin"}) == "round_robin"
    assert name({"kind": "kv", "affinity": {"mode": "off"}}) == "kv"
    assert name({"kind": "kv", "affinity": {"mode": "session"}}) == "kv+session"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, pd.DataFrame, str]:
    out = tmp_path_factory.mktemp("router_compare")
    trace_args = ["--trace", str(CONVERSATION)] if CONVERSATION.is_file() else ["--no-trace"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out / "run"), *trace_args],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "run", pd.read_csv(out / "run" / "router_compare.csv"), proc.stdout


def test_quick_synthetic_rows_and_reuse(quick_run):
    out, df, stdout = quick_run
    assert "| synthetic | kv+session |" in stdout and "sweep wall time" in stdout
    syn = df[df["workload"] == "synthetic"].set_index("router")
    assert list(syn.index) == VARIANTS
    assert (syn["num_requests"] == 40 * 4).all() and (syn["completed_requests"] == 160).all()
    for col in ("prefix_cache_reused_ratio", "mean_ttft_ms", "p90_ttft_ms", "mean_e2e_latency_ms"):
        assert syn[col].notna().all(), col
    # multi-turn sessions: the KV router finds the previous turn's blocks round robin misses
    reuse = syn["prefix_cache_reused_ratio"]
    assert reuse["kv"] >= reuse["round_robin"]
    assert reuse["kv+session"] >= reuse["round_robin"]
    # only the KV router reports its decisions
    assert (syn.loc[["kv", "kv+session"], "router_agg_decisions"] == 160).all()
    assert syn.loc[["round_robin", "random"], "router_agg_decisions"].isna().all()
    # every run had the experiment's cluster, and the affinity run its mode
    for variant, run_dir in syn["run_dir"].items():
        cfg = json.loads((out / run_dir / "summary.json").read_text())["metadata"]["config"]
        assert cfg["topology"]["num_workers"] == 4 and cfg["engine"]["num_gpu_blocks"] == 16384
        assert cfg["workload"]["turns_per_session"] == 4
        if variant == "kv+session":
            assert cfg["router"]["affinity"]["mode"] == "session"
    png = out / "router_compare.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_quick_conversation_rows(quick_run):
    shared_trace(CONVERSATION.name)  # (fails under CI when missing)
    _, df, _ = quick_run
    assert len(df) == 8
    assert list(df["workload"]) == ["mooncake"] * 4 + ["synthetic"] * 4
    conv = df[df["workload"] == "mooncake"].set_index("router")
    assert list(conv.index) == VARIANTS
    assert (conv["trace"] == "conversation_trace").all()
    assert (conv["completed_requests"] == router_compare.QUICK_MAX_REQUESTS).all()
    assert conv["prefix_cache_reused_ratio"].notna().all()
