"""Every agentic source replays end to end (config -> reader -> lanes -> tables), and the
Dynamo trace takes the agentic path and its guards exactly when it carries agent_context."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import simulate
from servesim.config.load import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "agentic"
FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
G3 = {"host_offload": {"num_host_blocks": 1000}, "disk": {"num_g3_blocks": 1000}}


def run(config, workload, **sections):
    sections.setdefault("timing", FIXED)
    return simulate(config(workload=workload, engine={"block_size": 4}, **sections))


def test_weka_play_replays_with_its_subagent_and_basis(config):
    res = run(config, {"kind": "weka", "path": str(DATA / "weka_play.json"), "agentic_lanes": 1})
    assert set(res.plays.status) == {"completed"}
    assert len(res.requests) == 3 and set(res.requests.terminal_status) == {"completed"}
    meta = res.summary["metadata"]
    assert meta["agentic_graph"]["variant"] == "weka"
    assert meta["weka_nested_timestamp_basis"] == "absolute"
    assert meta["agentic_projection"]["source_models"] == ["m"]
    sub = res.requests[res.requests.session_id.str.contains("sa1")]
    assert len(sub) == 1


def test_weka_corpus_file_replays_on_lanes(config):
    res = run(config, {"kind": "weka", "path": str(DATA / "weka_corpus.jsonl"), "agentic_lanes": 2})
    assert len(res.plays) >= 2
    assert set(res.plays.status) == {"completed"}


def test_agentic_dynamo_trace_takes_the_agentic_path(config):
    res = run(config, {"kind": "dynamo_trace", "path": str(DATA / "dynamo_agentic.jsonl")})
    assert res.summary["metadata"]["agentic_graph"]["variant"] == "dynamo"
    assert res.summary["total_trajectories"] == len(res.plays) >= 1
    assert set(res.plays.status) == {"completed"}


def test_agentic_dynamo_trace_gets_the_guards_without_lanes(config):
    with pytest.raises(ConfigError, match="dynamo_trace carries agent_context.*rejects G3"):
        run(
            config,
            {"kind": "dynamo_trace", "path": str(DATA / "dynamo_agentic.jsonl")},
            kv_cache=G3,
        )


def test_plain_dynamo_trace_keeps_every_topology(config):
    workload = {"kind": "dynamo_trace", "path": str(DATA / "dynamo_plain.jsonl")}
    res = run(config, workload, kv_cache=G3, topology={"kind": "aggregated", "num_workers": 4})
    assert "agentic_graph" not in res.summary["metadata"]
    assert len(res.plays) == 0
    assert set(res.requests.terminal_status) == {"completed"}
    with pytest.raises(ConfigError, match="agentic_lanes requires an agentic Dynamo trace"):
        run(config, {**workload, "agentic_lanes": 2})


def test_agentic_synthetic_default_shape_runs(config):
    workload = {
        "kind": "agentic_synthetic",
        "num_plays": 3,
        "turns_per_play": {"dist": "constant", "mean": 3},
        "first_user_tokens": {"dist": "constant", "mean": 40},
        "tool_output_tokens": {"dist": "constant", "mean": 20},
        "output_tokens": {"dist": "constant", "mean": 4},
        "tool_time_ms": {"dist": "constant", "mean": 50},
        "system_prompt_tokens": 64,
        "agentic_lanes": 2,
    }
    res = run(config, workload)
    assert len(res.requests) == 9 and set(res.plays.status) == {"completed"}
    # turn k+1 follows turn k's terminal by the 50 ms tool time
    main = res.requests[res.requests.play_id == "play0"].sort_values("turn_index")
    gaps = main.arrival_ms.to_numpy()[1:] - main.terminal_ms.to_numpy()[:-1]
    assert list(gaps) == pytest.approx([50.0, 50.0])
