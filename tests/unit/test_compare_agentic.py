"""compare_dynamo's translation of an agentic replay into the mocker's keyword arguments."""

from __future__ import annotations

import json

import pytest
from conftest import compare_dynamo_module

HEADER = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64}
ROW = {
    "request_id": "r0",
    "play_id": "p",
    "session_id": "s",
    "model": "m",
    "input_length": 64,
    "output_length": 2,
    "hash_ids": [1],
    "not_before_ms": 0,
}


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "agentic.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(ROW) + "\n")
    return path


def test_lanes_and_execution_model_reach_the_mocker(trace):
    cd = compare_dynamo_module()
    over = [
        "workload=agentic_mooncake",
        "workload.agentic_lanes=8",
        "workload.agentic_lane_assignment=shared_queue",
    ]
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
        "+workload.agentic_snapshot.seed=1",
    ]
    cfg = cd.compose_run_config(trace, 1, over)
    with pytest.raises(cd.UnsupportedConfig) as e:
        cd.mocker_kwargs(cfg)
    assert "agentic_lane_assignment=stride" in str(e.value)
    assert "workload.agentic_snapshot" in str(e.value)
