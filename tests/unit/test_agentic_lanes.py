"""Agentic replay in whole runs, with fixed timing (10 ms per pass with prefill work, 1 ms per
decode pass): a request of n output tokens that runs alone ends 10 + (n - 1) ms after it
arrives. Release rules, lanes, settlement, failures, snapshots, warmup, profile, metadata."""

from __future__ import annotations

import json

import pytest

from servesim import simulate
from servesim.agentic.snapshot import CUT_LOW, CUT_SPAN, cut_fraction
from servesim.config.load import ConfigError

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
HEADER = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64}


def node(rid, play, t=0.0, deps=(), n_in=64, n_out=3, ids=None, session=None):
    return {
        "request_id": rid,
        "play_id": play,
        "session_id": session or f"{play}:main",
        "model": "src-model",
        "input_length": n_in,
        "output_length": n_out,
        "hash_ids": ids if ids is not None else [hash((play, rid)) % 10**6],
        "not_before_ms": t,
        "dependencies": [
            {"request_id": p, "trigger": trig, "delay_ms": d, "relation": rel}
            for p, trig, d, rel in deps
        ],
    }


def seq(pred, delay=0.0):
    return (pred, "completion", delay, "sequence")


def write(tmp_path, rows, name="agentic.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in [HEADER, *rows]))
    return str(path)


def run(config, path, workers=1, **workload):
    cfg = config(
        workload={"kind": "agentic_mooncake", "path": path, **workload},
        timing=FIXED,
        topology={"kind": "aggregated", "num_workers": workers},
        engine={"block_size": 64},
    )
    return simulate(cfg)


def times(result, column="arrival_ms"):
    return dict(zip(result.requests.request_id, result.requests[column], strict=True))


# --------------------------------------------------------------------------- release rules


def test_completion_edge_waits_for_the_terminal_plus_delay(config, tmp_path):
    """r0 ends at 12 ms (3 tokens); r1 follows 750 ms later; the join c waits for the later of
    a (ends 12) and b (5 tokens, ends 14) plus 100 ms."""
    rows = [
        node("r0", "p"),
        node("r1", "p", 0, [seq("r0", 750)]),
        node("a", "q", 0),
        node("b", "q", 0, n_out=5),
        node("c", "q", 0, [("a", "completion", 100, "join"), ("b", "completion", 100, "join")]),
    ]
    res = run(config, write(tmp_path, rows), workers=3)
    t = times(res)
    end = times(res, "terminal_ms")
    assert end["r0"] == pytest.approx(12.0)
    assert t["r1"] == pytest.approx(762.0)
    assert end["b"] == pytest.approx(14.0)
    assert t["c"] == pytest.approx(114.0)
    assert set(res.plays.status) == {"completed"}


def test_dispatch_edge_releases_with_the_parent_and_not_before_holds(config, tmp_path):
    """A spawned child 15 ms after its parent's dispatch runs while the parent does; an edge
    cannot release a node before its not_before."""
    rows = [
        node("root", "p", 0, n_out=50),
        node("sub", "p", 0, [("root", "dispatch", 15, "spawn")]),
        node("late", "p", 500, [("root", "dispatch", 0, "spawn")]),
    ]
    res = run(config, write(tmp_path, rows), workers=2)
    t = times(res)
    assert t["sub"] == pytest.approx(15.0)
    assert t["late"] == pytest.approx(500.0)
    assert times(res, "terminal_ms")["sub"] < times(res, "terminal_ms")["root"]


# --------------------------------------------------------------------------- lanes


def three_plays():
    # play a takes 3 turns (ends late), b and c one turn each
    return [
        node("a0", "a", 0),
        node("a1", "a", 0, [seq("a0", 100)]),
        node("a2", "a", 0, [seq("a1", 100)]),
        node("b0", "b", 50),
        node("c0", "c", 90),
    ]


def test_without_lanes_every_play_starts_at_its_authored_time(config, tmp_path):
    res = run(config, write(tmp_path, three_plays()), workers=2)
    t = times(res)
    assert (t["a0"], t["b0"], t["c0"]) == (0.0, 50.0, 90.0)
    assert res.requests.lane.isna().all()


def test_stride_lanes_wait_for_their_own_play_to_settle(config, tmp_path):
    """2 lanes: lane 0 replays a then c (c waits for a to settle even though lane 1 is free
    after b); each play is rebased to its lane's start."""
    res = run(
        config,
        write(tmp_path, three_plays()),
        workers=2,
        agentic_lanes=2,
        agentic_lane_assignment="stride",
    )
    t, end = times(res), times(res, "terminal_ms")
    assert t["a0"] == 0.0 and t["b0"] == 0.0
    assert end["a2"] == pytest.approx(12 + 100 + 12 + 100 + 12)
    assert t["c0"] == pytest.approx(end["a2"])  # the instant a settles
    lanes = dict(zip(res.plays.play_id, res.plays.lane, strict=True))
    assert lanes == {"a": 0, "b": 1, "c": 0}
    settled = dict(zip(res.plays.play_id, res.plays.settled_at_ms, strict=True))
    assert settled["a"] == pytest.approx(end["a2"])


def test_shared_queue_lanes_take_the_next_unstarted_play(config, tmp_path):
    """The default (Dynamo 1.6.1's mocker): lane 1 settles b first and takes c at once, while
    lane 0 still works through a."""
    res = run(config, write(tmp_path, three_plays()), workers=2, agentic_lanes=2)
    assert res.config.workload.agentic_lane_assignment == "shared_queue"
    assert res.summary["metadata"]["agentic_lane_assignment"] == "shared_queue"
    t, end = times(res), times(res, "terminal_ms")
    assert t["c0"] < end["a2"]
    assert t["c0"] == pytest.approx(end["b0"])
    assert dict(zip(res.plays.play_id, res.plays.lane, strict=True)) == {"a": 0, "b": 1, "c": 1}


def test_a_play_settles_after_its_background_child(config, tmp_path):
    """The spawned child outlives the main turn: the lane's next play waits for it."""
    rows = [
        node("m", "p", 0, n_out=3),
        node("bg", "p", 0, [("m", "dispatch", 0, "spawn")], n_out=40),
        node("next", "q", 0),
    ]
    res = run(config, write(tmp_path, rows), workers=2, agentic_lanes=1)
    end = times(res, "terminal_ms")
    assert end["bg"] > end["m"]
    assert times(res)["next"] == pytest.approx(end["bg"])


def test_a_rejected_node_fails_its_play_without_stalling_the_lane(config, tmp_path):
    """r1 cannot fit (input >= max_model_len): play p fails at r1, r2 is never dispatched and
    ends incomplete naming the failure; the lane goes on to play q."""
    rows = [
        node("r0", "p", 0),
        node("r1", "p", 0, [seq("r0")], n_in=4096, ids=list(range(64))),
        node("r2", "p", 0, [seq("r1")]),
        node("q0", "q", 0),
    ]
    cfg = config(
        workload={"kind": "agentic_mooncake", "path": write(tmp_path, rows), "agentic_lanes": 1},
        timing=FIXED,
        engine={"block_size": 64, "max_model_len": 1024},
    )
    res = simulate(cfg)
    status = dict(zip(res.requests.request_id, res.requests.terminal_status, strict=True))
    assert status == {"r0": "completed", "r1": "rejected", "r2": "incomplete", "q0": "completed"}
    reason = dict(zip(res.requests.request_id, res.requests.reason, strict=True))
    assert "play p failed at r1" in reason["r2"]
    plays = res.plays.set_index("play_id")
    assert plays.loc["p", "status"] == "failed"
    assert plays.loc["p", "failure_request_id"] == "r1"
    assert plays.loc["q", "status"] == "completed"
    assert times(res)["q0"] == pytest.approx(plays.loc["p", "settled_at_ms"])
    counts = res.summary["terminal_status_counts"]
    assert sum(counts.values()) == 4
    assert res.summary["failed_trajectories"] == 1
    assert res.summary["completed_trajectories"] == 1
    assert res.summary["incomplete_trajectories"] == 1  # Dynamo's: not completed
    (outcome,) = [
        o for o in res.summary["metadata"]["agentic_play_outcomes"] if o["play_id"] == "p"
    ]
    assert outcome["status"] == "failed" and outcome["failure_status"] == "rejected"


# --------------------------------------------------------------------------- snapshot


def long_plays(n_plays=2, turns=8, gap=1000.0):
    rows = []
    for p in range(n_plays):
        play = f"p{p}"
        for k in range(turns):
            deps = [seq(f"{play}:{k - 1}", gap)] if k else []
            ids = list(range(p * 100, p * 100 + k + 1))
            rows.append(node(f"{play}:{k}", play, k * (gap + 12), deps, n_in=64 * (k + 1), ids=ids))
    return rows


def test_snapshot_cuts_are_seeded_and_within_a_quarter_of_the_span(config, tmp_path):
    path = write(tmp_path, long_plays())
    a = run(config, path, agentic_lanes=2, agentic_snapshot={"seed": 7})
    b = run(config, path, agentic_lanes=2, agentic_snapshot={"seed": 7})
    c = run(config, path, agentic_lanes=2, agentic_snapshot={"seed": 8})
    snaps_a = a.summary["metadata"]["agentic_snapshots"]
    cuts = [s["t_star_ms"] for s in snaps_a]
    assert cuts == [s["t_star_ms"] for s in b.summary["metadata"]["agentic_snapshots"]]
    assert cuts != [s["t_star_ms"] for s in c.summary["metadata"]["agentic_snapshots"]]
    digest = a.summary["metadata"]["agentic_graph"]["graph_digest"]
    for s in snaps_a:
        first, last = s["recorded_start_ms"], s["recorded_last_start_ms"]
        u = cut_fraction(7, digest, s["source_play_id"], s["lane_id"], s["play_ordinal"])
        assert s["t_star_ms"] == pytest.approx(first + (CUT_LOW + CUT_SPAN * u) * (last - first))
        assert first + 0.25 * (last - first) <= s["t_star_ms"] <= first + 0.75 * (last - first)
        hist = {r["source_request_id"] for r in s["requests"] if r["historical"]}
        assert hist == {
            r["source_request_id"] for r in s["requests"] if r["recorded_start_ms"] < s["t_star_ms"]
        }
        replayed = set(a.requests[a.requests.play_id == s["play_id"]].source_request_id)
        assert replayed.isdisjoint(hist) and replayed
        # the primer is the main conversation's latest historical request
        assert [p["source_request_id"] for p in s["primers"]] == [max(hist, key=_turn)]
    assert list(a.requests.arrival_ms) == list(b.requests.arrival_ms)


def _turn(rid):
    return int(rid.rsplit(":", 1)[1])


def test_snapshot_live_request_keeps_its_remaining_gate(config, tmp_path):
    """The first live turn waits what is left of its gate after t*: its historical
    predecessor's recorded start + delay - t*."""
    res = run(config, write(tmp_path, long_plays(1)), agentic_lanes=1, agentic_snapshot={"seed": 1})
    snap = res.summary["metadata"]["agentic_snapshots"][0]
    live = [r for r in snap["requests"] if not r["historical"]]
    first = live[0]
    k = _turn(first["source_request_id"])
    pred_start = (k - 1) * 1012.0
    expected = max(k * 1012.0 - snap["t_star_ms"], pred_start + 1000.0 - snap["t_star_ms"])
    assert first["remaining_delay_ms"] == pytest.approx(max(0.0, expected))
    assert first["pending_dependencies"] == []
    assert times(res)[f"{snap['play_id']}/{first['source_request_id']}"] == pytest.approx(
        first["remaining_delay_ms"]
    )


# --------------------------------------------------------------------------- warmup


def test_warmup_primes_each_lane_then_opens_the_barrier(config, tmp_path):
    res = run(
        config,
        write(tmp_path, long_plays()),
        agentic_lanes=2,
        agentic_snapshot={"seed": 3},
        agentic_warmup=True,
    )
    phases = res.summary["metadata"]["agentic_phases"]
    assert phases["barrier_condition"] == "all_preparation_succeeded_and_server_quiescent"
    prep = phases["requests"]
    assert {r["phase"] for r in prep} == {"primer", "warmup"}
    for lane in phases["lanes"]:
        assert lane["primers_completed"] == lane["primers_expected"] == 1
        assert lane["warmup_completed"] == lane["warmup_expected"] == 10
        assert lane["requests_quiescent"]
    assert all(r["observed_output_tokens"] == 1 for r in prep)
    barrier = max(r["causal_terminal_at_ms"] for r in prep)
    assert phases["profile_start_ms"] == pytest.approx(barrier)
    measured = res.requests[~res.requests.phase.isin(["primer", "warmup"])]
    assert measured.arrival_ms.min() >= barrier
    # preparation is recorded but not measured, and the primed prefix is reused
    assert res.summary["num_requests"] == len(measured)
    assert (measured.groupby("play_id").reused_input_tokens.first() > 0).all()
    # the saved frontier shifts by the barrier: the cold snapshot's arrivals + barrier
    cold = run(config, write(tmp_path, long_plays()), agentic_lanes=2, agentic_snapshot={"seed": 3})
    first_cold = cold.requests.groupby("play_id").arrival_ms.min()
    first_warm = measured.groupby("play_id").arrival_ms.min()
    assert list(first_warm) == pytest.approx(list(first_cold + barrier))


# --------------------------------------------------------------------------- profile


def test_profile_recycles_plays_until_the_window_closes(config, tmp_path):
    rows = [
        node("t0", "a", 0, n_out=20),
        node("t1", "a", 0, [seq("t0", 30)], n_out=20),
        node("u0", "b", 0, n_out=20),
        node("u1", "b", 0, [seq("u0", 30)], n_out=20),
    ]
    profile = {"duration_seconds": 1.0, "response_grace_seconds": 0.01}
    res = run(
        config,
        write(tmp_path, rows),
        workers=2,
        agentic_lanes=2,
        agentic_snapshot={"seed": 0},
        agentic_profile=profile,
    )
    prof = res.summary["metadata"]["agentic_profile"]
    assert prof["admission_cutoff_ms"] == pytest.approx(1000.0)
    assert prof["plays_started"] > 2  # lanes recycled the corpus
    assert res.requests.arrival_ms.max() < 1000.0  # nothing issued after the cutoff
    assert set(res.plays.status) <= {"completed", "failed", "incomplete"}
    assert res.plays.settled_at_ms.notna().all()
    assert prof["successful_requests"] == int((res.requests.terminal_status == "completed").sum())
    statuses = res.requests.terminal_status.value_counts().to_dict()
    assert sum(statuses.values()) == len(res.requests)
    assert prof["finished_at_ms"] <= prof["response_grace_deadline_ms"]


def test_profile_idle_cap_pulls_long_tool_waits_in(config, tmp_path):
    """A 60 s tool wait with nothing else in flight is cut to the 10 s global idle cap."""
    rows = [node("x0", "a", 0), node("x1", "a", 0, [seq("x0", 60_000)])]
    res = run(
        config,
        write(tmp_path, rows),
        agentic_lanes=1,
        agentic_snapshot={"seed": 0},
        agentic_profile={"duration_seconds": 100.0, "response_grace_seconds": 0},
    )
    t, end = times(res), times(res, "terminal_ms")
    prof = res.summary["metadata"]["agentic_profile"]
    first, second = "a@lane0.0/x0", "a@lane0.0/x1"
    assert t[second] - end[first] == pytest.approx(10_000.0)
    assert t["a@lane0.1/x0"] == pytest.approx(end[second])  # the lane recycles the play
    assert prof["idle_shifts"][0]["play_id"] is None
    assert prof["idle_shifts"][0]["shifted_by_ms"] == pytest.approx(50_000.0)


# --------------------------------------------------------------------------- report


def test_metadata_sections_are_at_the_top_level(config, tmp_path):
    res = run(
        config,
        write(tmp_path, long_plays()),
        agentic_lanes=2,
        agentic_snapshot={"seed": 1},
        agentic_warmup=True,
    )
    out = res.write(tmp_path / "out")
    meta = json.loads((out / "summary.json").read_text())["metadata"]
    for key in (
        "agentic_graph",
        "agentic_projection",
        "agentic_snapshots",
        "agentic_phases",
        "agentic_profile",
    ):
        assert key in meta
    assert meta["agentic_qualification"] == "functional_only"
    assert isinstance(meta["agentic_snapshots"], list) and len(meta["agentic_snapshots"]) == 2
    assert meta["agentic_projection"] == {
        "policy": "project_to_configured_target",
        "source_models": ["src-model"],
        "target_model": "llama3_8b",
    }
    assert meta["agentic_graph"]["play_count"] == 2
    assert (out / "plays.parquet").exists()


def test_agentic_options_errors_name_the_config_path(config, tmp_path):
    path = write(tmp_path, three_plays())
    base = {"kind": "agentic_mooncake", "path": path}
    cases = [
        ({"agentic_snapshot": {"seed": 1}}, "agentic_snapshot requires positive agentic_lanes"),
        ({"agentic_lanes": 1, "agentic_warmup": True}, "agentic_warmup requires agentic_snapshot"),
        ({"agentic_lanes": 1, "agentic_profile": {}}, "agentic_profile requires agentic_snapshot"),
        ({"agentic_lanes": 0}, "workload.agentic_lanes: Input should be greater than 0"),
        (
            {"agentic_lanes": 1, "agentic_snapshot": {"seed": 1, "sed": 2}},
            r"agentic_snapshot.sed: unknown field",
        ),
        (
            {"agentic_lanes": 1, "agentic_snapshot": {"seed": 1}, "agentic_profile": {"x": 1}},
            r"agentic_profile.x: unknown field",
        ),
        (
            {
                "agentic_lanes": 1,
                "agentic_snapshot": {"seed": 1},
                "agentic_profile": {"duration_seconds": 0},
            },
            "duration_seconds",
        ),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            config(workload={**base, **extra})


def test_pd_completion_means_the_decode_terminal(config, tmp_path):
    """1P1D: the child follows the decode side's last token (not the prefill end), and the
    lane's next play starts once the first play settled."""
    rows = [node("r0", "p", 0, n_out=20), node("r1", "p", 0, [seq("r0", 5)]), node("q0", "q", 0)]
    cfg = config(
        workload={"kind": "agentic_mooncake", "path": write(tmp_path, rows), "agentic_lanes": 1},
        timing=FIXED,
        engine={"block_size": 64},
        topology={"kind": "disagg", "num_prefill_workers": 1, "num_decode_workers": 1},
    )
    res = simulate(cfg)
    req = res.requests.set_index("request_id")
    assert req.loc["r0", "source_held_ms"] < req.loc["r0", "terminal_ms"]
    assert req.loc["r1", "arrival_ms"] == pytest.approx(req.loc["r0", "terminal_ms"] + 5)
    assert req.loc["q0", "arrival_ms"] >= req.loc["r1", "terminal_ms"]
    assert set(res.plays.status) == {"completed"}


def test_profile_tree_idle_cap_while_another_play_keeps_the_cluster_busy(config, tmp_path):
    """Play a idles on a 5 s tool wait while play b's 3,000-token answer keeps the cluster
    busy: the global cap does not apply, a's own 1 s tree cap pulls its timer in."""
    rows = [
        node("x0", "a", 0),
        node("x1", "a", 0, [seq("x0", 5000)]),
        node("b0", "b", 0, n_out=3000),
    ]
    res = run(
        config,
        write(tmp_path, rows),
        workers=2,
        agentic_lanes=2,
        agentic_snapshot={"seed": 0},
        agentic_profile={"duration_seconds": 100.0, "tree_idle_cap_seconds": 1.0},
    )
    t, end = times(res), times(res, "terminal_ms")
    assert t["a@lane0.0/x1"] - end["a@lane0.0/x0"] == pytest.approx(1000.0)
    shift = res.summary["metadata"]["agentic_profile"]["idle_shifts"][0]
    assert shift["play_id"] == "a@lane0.0"
    assert shift["shifted_by_ms"] == pytest.approx(4000.0)
    assert shift["timer_count"] == 1


def test_profile_cancels_what_is_left_at_the_grace_deadline(config, tmp_path):
    """A 3,000-token answer (about 3 s) outlives a 1 s window plus 0.5 s grace: it is canceled
    (incomplete) at 1,500 ms, its play is incomplete, and the run ends there."""
    rows = [node("long", "a", 0, n_out=3000), node("after", "a", 0, [seq("long")])]
    res = run(
        config,
        write(tmp_path, rows),
        agentic_lanes=1,
        agentic_snapshot={"seed": 0},
        agentic_profile={"duration_seconds": 1.0, "response_grace_seconds": 0.5},
    )
    req = res.requests.set_index("source_request_id")
    assert req.loc["long", "terminal_status"] == "incomplete"
    assert req.loc["long", "reason"] == "canceled at the agentic_profile response grace deadline"
    assert req.loc["long", "terminal_ms"] == pytest.approx(1500.0)
    assert req.loc["after", "terminal_status"] == "incomplete"
    assert req.loc["after", "reason"].startswith("never issued")
    assert list(res.plays.status) == ["incomplete"]
    prof = res.summary["metadata"]["agentic_profile"]
    assert prof["finished_at_ms"] == pytest.approx(1500.0)
    assert (prof["canceled_requests"], prof["never_issued_requests"]) == (1, 1)
    assert prof["admission_closed"] and not prof["cancel_drain_timed_out"]
