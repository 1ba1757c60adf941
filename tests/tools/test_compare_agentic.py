"""compare_dynamo's translation of an agentic replay into the mocker's keyword arguments."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import compare_dynamo_module

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def trace(one_request_agentic_file):
    return one_request_agentic_file


def test_lanes_and_execution_model_reach_the_mocker(trace):
    """The default lane rule (shared_queue) is the mocker's: nothing to refuse."""
    cd = compare_dynamo_module()
    over = ["workload=agentic_mooncake", "workload.agentic_lanes=8"]
    cfg = cd.compose_run_config(trace, 2, over)
    kwargs = cd.mocker_kwargs(cfg)
    assert kwargs["trace_format"] == "agentic_mooncake"
    assert kwargs["agentic_lanes"] == 8
    assert kwargs["execution_model"] == cfg.llm.name
    assert kwargs["num_workers"] == 2


def test_what_the_mocker_cannot_replay_is_named(trace):
    cd = compare_dynamo_module()
    over = [
        "workload=agentic_mooncake",
        "workload.agentic_lanes=2",
        "workload.agentic_lane_assignment=stride",
        "+workload.agentic_snapshot.seed=1",
    ]
    cfg = cd.compose_run_config(trace, 1, over)
    with pytest.raises(cd.UnsupportedConfig) as e:
        cd.mocker_kwargs(cfg)
    assert "agentic_lane_assignment=stride" in str(e.value)
    assert "workload.agentic_snapshot" in str(e.value)


def _compose(overrides):
    from servesim import compose

    return compose(list(overrides))


def test_agentic_trace_script_writes_the_graph_simulate_replays(tmp_path):
    """experiments/agentic_trace.py: its v2 file replays exactly as the synthetic workload."""
    from servesim import simulate

    spec = importlib.util.spec_from_file_location(
        "agentic_trace", REPO / "experiments" / "agentic_trace.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "plays.jsonl"
    common = ["output.progress=off", "topology.num_workers=1"]
    assert script.main(["--out", str(out), "workload.num_plays=3", *common]) == 0
    synthetic = _compose(["workload=agentic_synthetic", "workload.num_plays=3", *common])
    replayed = _compose(
        [
            "workload=agentic_mooncake",
            f"workload.path={out}",
            "workload.agentic_lanes=4",  # the synthetic default's lanes
            *common,
        ]
    )
    a, b = simulate(synthetic), simulate(replayed)
    assert len(a.requests) == len(b.requests) > 3
    assert list(a.requests.request_id) == list(b.requests.request_id)
    assert list(a.requests.terminal_ms) == list(b.requests.terminal_ms)
