"""Invariants of agentic replay over random generated plays, lanes and engines: every play
settles exactly once, every node ends exactly once, no request starts before its gates, a lane
runs one play at a time and only after the previous one settled, and the same config gives the
same answer."""

from __future__ import annotations

import math

from conftest import make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim import simulate

FIXED = {"kind": "fixed", "prefill_ms": 7.0, "decode_ms": 1.0}


def dist(mean: float, lo: int, hi: int) -> dict:
    return {"dist": "uniform", "mean": mean, "min": lo, "max": hi}


case = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "num_plays": st.integers(1, 6),
        "turns": st.integers(1, 5),
        "sub_p": st.sampled_from([0.0, 0.5, 1.0]),
        "block_p": st.sampled_from([0.0, 1.0]),
        "lanes": st.sampled_from([None, 1, 2, 3]),
        "assignment": st.sampled_from(["stride", "shared_queue"]),
        "workers": st.integers(1, 3),
        # small pools and max_model_len make preemptions and rejected (failing) nodes
        "num_gpu_blocks": st.sampled_from([40, 200, 16384]),
        "max_model_len": st.sampled_from([None, 700, 2000]),
        "snapshot": st.booleans(),
    }
)


def config(c: dict):
    workload = {
        "kind": "agentic_synthetic",
        "num_plays": c["num_plays"],
        "turns_per_play": dist(c["turns"], 1, c["turns"]),
        "system_prompt_tokens": 128,
        "first_user_tokens": dist(100, 16, 300),
        "tool_output_tokens": dist(80, 8, 200),
        "output_tokens": dist(8, 1, 20),
        "tool_time_ms": dist(40, 0, 200),
        "subagent_probability": c["sub_p"],
        "subagent_blocking_probability": c["block_p"],
        "play_interval_ms": 30.0,
        "agentic_lanes": c["lanes"],
        "agentic_lane_assignment": c["assignment"],
    }
    if c["snapshot"] and c["lanes"] is not None:
        workload["agentic_snapshot"] = {"seed": c["seed"]}
    return make_config(
        seed=c["seed"],
        workload=workload,
        timing=FIXED,
        topology={"kind": "aggregated", "num_workers": c["workers"]},
        engine={
            "block_size": 16,
            "num_gpu_blocks": c["num_gpu_blocks"],
            "max_model_len": c["max_model_len"],
        },
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case)
def test_agentic_replay_invariants(c):
    cfg = config(c)
    res = simulate(cfg)
    plays, req = res.plays, res.requests
    # every play settles exactly once, with one of the three outcomes, at a real time
    assert plays.play_id.is_unique
    assert set(plays.status) <= {"completed", "failed", "incomplete"}
    assert plays.settled_at_ms.notna().all()
    # every live node of a started play ends exactly once; the counts add up
    assert req.request_id.is_unique
    assert len(req) == int(plays.n_live.sum())
    assert set(req.terminal_status) <= {"completed", "rejected", "incomplete"}
    by_play = req.groupby("play_id")
    for row in plays.itertuples():
        mine = by_play.get_group(row.play_id) if row.play_id in by_play.groups else req.iloc[:0]
        statuses = set(mine.terminal_status)
        if row.status == "completed":
            assert statuses == {"completed"}
        elif row.status == "failed":
            assert "rejected" in statuses
            assert row.failure_request_id in set(mine.request_id)
        dispatched = mine[mine.arrival_ms.notna()]
        if len(dispatched):
            assert row.settled_at_ms >= dispatched.terminal_ms.max() - 1e-9
            assert dispatched.arrival_ms.min() >= row.started_ms - 1e-9
    # a lane runs one play at a time: the next starts at or after the previous settled
    if c["lanes"] is not None:
        assert plays.lane.notna().all()
        for _, lane in plays.sort_values(["lane", "lane_ordinal"]).groupby("lane"):
            starts = lane.started_ms.to_numpy()
            settles = lane.settled_at_ms.to_numpy()
            assert all(starts[k + 1] >= settles[k] - 1e-9 for k in range(len(lane) - 1))
            assert list(lane.lane_ordinal) == list(range(len(lane)))
    # no request arrives before its predecessors fired (completion edges: after their terminal)
    graph_edges = _edges(cfg)
    at = dict(zip(req.source_request_id + "@" + req.play_id, req.arrival_ms, strict=True))
    end = dict(zip(req.source_request_id + "@" + req.play_id, req.terminal_ms, strict=True))
    for play in plays.itertuples():
        for child, pred, trigger, delay in graph_edges.get(play.source_play_id, []):
            t = at.get(f"{child}@{play.play_id}", math.nan)
            if math.isnan(t) or f"{pred}@{play.play_id}" not in at:
                continue
            gate = (
                end[f"{pred}@{play.play_id}"]
                if trigger == "completion"
                else at[f"{pred}@{play.play_id}"]
            )
            assert t >= gate + delay - 1e-6
    # same config, same answer
    again = simulate(cfg)
    assert again.requests.equals(req)


def _edges(cfg) -> dict[str, list[tuple[str, str, str, float]]]:
    from servesim.sim import random_streams
    from servesim.workload.agentic_synthetic import generate_agentic

    graph = generate_agentic(cfg.workload, random_streams(cfg.seed)["lengths"])
    return {
        p.play_id: [
            (n.request_id, d.request_id, d.trigger, d.delay_ms)
            for n in p.nodes
            for d in n.dependencies
        ]
        for p in graph.plays
    }
