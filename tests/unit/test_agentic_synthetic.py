"""The synthetic agentic generator: seeded plays of a main agent over one growing context, tool
waits as sequence edges, sub-agents spawned off a turn and joined back when blocking, hash ids
that share the system prompt across plays and extend the previous turn's full blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.agentic.snapshot import graph_digest, recorded_starts, snapshot_plan
from servesim.config.schema import AgenticSyntheticWorkload
from servesim.workload.agentic import AgenticGraph, Node
from servesim.workload.agentic_synthetic import generate_agentic, nominal_call_ms


def const(x: float) -> dict:
    return {"dist": "constant", "mean": x}


def constant_cfg(**kw) -> AgenticSyntheticWorkload:
    """system 128, first user 64, tool output 32, output 16, block 64, T = 3, tool 250 ms."""
    base = {
        "num_plays": 2,
        "turns_per_play": const(3),
        "system_prompt_tokens": 128,
        "first_user_tokens": const(64),
        "tool_output_tokens": const(32),
        "output_tokens": const(16),
        "tool_time_ms": const(250),
        "subagent_probability": 0.0,
        "subagent_turns": 2,
        "play_interval_ms": 1000.0,
        "trace_block_size": 64,
    }
    return AgenticSyntheticWorkload.model_validate({**base, **kw})


def random_cfg(**kw) -> AgenticSyntheticWorkload:
    base = {
        "num_plays": 6,
        "turns_per_play": {"dist": "uniform", "mean": 4, "min": 1, "max": 7},
        "system_prompt_tokens": 1000,
        "first_user_tokens": {"dist": "lognormal", "mean": 300, "std": 200, "min": 1},
        "tool_output_tokens": {"dist": "exponential", "mean": 150, "min": 0},
        "output_tokens": {"dist": "uniform", "mean": 60, "min": 0, "max": 120},
        "tool_time_ms": {"dist": "exponential", "mean": 400, "min": 0},
        "subagent_probability": 0.4,
        "subagent_turns": 3,
        "subagent_blocking_probability": 0.5,
        "play_interval_ms": 500.0,
        "trace_block_size": 64,
    }
    return AgenticSyntheticWorkload.model_validate({**base, **kw})


def graph(cfg: AgenticSyntheticWorkload, seed: int = 0) -> AgenticGraph:
    return generate_agentic(cfg, np.random.default_rng(seed))


def sessions(g: AgenticGraph) -> dict[str, list[Node]]:
    out: dict[str, list[Node]] = {}
    for n in g.nodes:
        assert n.session_id is not None
        out.setdefault(n.session_id, []).append(n)
    return out


def edges(n: Node) -> list[tuple[str, str, float, str]]:
    return [(d.request_id, d.trigger, d.delay_ms, d.relation) for d in n.dependencies]


def test_same_seed_same_graph_other_seed_other_graph():
    """The graph is a function of (config, seed): identical nodes and digest for one seed,
    other lengths for another."""
    cfg = random_cfg()
    a, b = graph(cfg, seed=3), graph(cfg, seed=3)
    assert a.plays == b.plays
    assert graph_digest(a) == graph_digest(b)
    c = graph(cfg, seed=4)
    assert graph_digest(c) != graph_digest(a)
    assert [n.input_length for n in c.nodes] != [n.input_length for n in a.nodes]


def test_graph_metadata():
    """Variant, path, block size and a source that names the format and holds the config."""
    cfg = constant_cfg()
    g = graph(cfg)
    assert (g.variant, g.path, g.block_size, g.source_models) == (
        "synthetic",
        "synthetic agentic workload",
        64,
        (),
    )
    assert g.source == {"format": "agentic_synthetic", **cfg.model_dump(mode="json")}
    assert [n.line for n in g.nodes] == list(range(1, len(g.nodes) + 1))
    assert all(g.node(n.request_id) is n for n in g.nodes)


def test_constant_main_session_closed_form():
    """Inputs 128 + 64 = 192, then + 16 + 32 per turn: 192, 240, 288; ids per 64-token block:
    the system prompt's two blocks shared by both plays, turn k+1 starting with turn k's full
    blocks, a partial tail unique to its request."""
    g = graph(constant_cfg())
    assert [p.play_id for p in g.plays] == ["play0", "play1"]
    p0, p1 = (sessions(g)[f"play{p}:main"] for p in (0, 1))
    assert [n.request_id for n in p0] == ["play0:main:t0", "play0:main:t1", "play0:main:t2"]
    assert [n.input_length for n in p0] == [192, 240, 288]
    assert [n.output_length for n in p0] == [16, 16, 16]
    assert [n.hash_ids for n in p0] == [(0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 4, 5)]
    assert [n.hash_ids for n in p1] == [(0, 1, 6), (0, 1, 6, 7), (0, 1, 6, 8, 9)]
    for turns in (p0, p1):
        for prev, nxt in zip(turns, turns[1:], strict=False):
            full = prev.input_length // 64
            assert nxt.hash_ids[:full] == prev.hash_ids[:full]


def test_sequence_edges_carry_the_tool_time():
    """Turn k+1 waits for turn k's completion plus the (constant) tool time; the root alone is
    authored, at p x play_interval_ms."""
    g = graph(constant_cfg(num_plays=3))
    for p, play in enumerate(g.plays):
        t0, t1, t2 = play.nodes
        assert (t0.not_before_ms, t0.dependencies) == (p * 1000.0, ())
        assert edges(t1) == [(t0.request_id, "completion", 250.0, "sequence")]
        assert edges(t2) == [(t1.request_id, "completion", 250.0, "sequence")]
        assert (t1.not_before_ms, t2.not_before_ms) == (None, None)


def test_no_subagents_at_probability_zero():
    """subagent_probability 0: only main sessions."""
    g = graph(random_cfg(subagent_probability=0.0))
    assert all(n.session_id.endswith(":main") for n in g.nodes)


def test_one_blocking_subagent_per_turn_but_the_last():
    """subagent_probability 1 and blocking 1: after every main turn but the last a sub-agent
    session of subagent_turns calls, spawned at the turn's completion (delay 0), chained by
    sequence edges, its last call joined into the next main turn; it shares only the system
    prompt's blocks."""
    g = graph(constant_cfg(subagent_probability=1.0, subagent_blocking_probability=1.0))
    by_session = sessions(g)
    assert sorted(by_session) == [
        "play0:main",
        "play0:sub0",
        "play0:sub1",
        "play1:main",
        "play1:sub0",
        "play1:sub1",
    ]
    assert [n.request_id for n in g.plays[0].nodes] == [
        "play0:main:t0",
        "play0:sub0:t0",
        "play0:sub0:t1",
        "play0:main:t1",
        "play0:sub1:t0",
        "play0:sub1:t1",
        "play0:main:t2",
    ]
    main = by_session["play0:main"]
    for k in (0, 1):
        s0, s1 = by_session[f"play0:sub{k}"]
        assert [n.input_length for n in (s0, s1)] == [192, 240]
        assert s0.hash_ids[:2] == (0, 1) and not set(s0.hash_ids[2:]) & set(main[k].hash_ids)
        assert s1.hash_ids[:3] == s0.hash_ids
        assert edges(s0) == [(main[k].request_id, "completion", 0.0, "spawn")]
        assert edges(s1) == [(s0.request_id, "completion", 250.0, "sequence")]
        assert edges(main[k + 1]) == [
            (main[k].request_id, "completion", 250.0, "sequence"),
            (s1.request_id, "completion", 0.0, "join"),
        ]


def test_background_subagents_have_no_join():
    """Blocking probability 0: sub-agents are spawned but the next main turn waits only for its
    predecessor and tool."""
    g = graph(constant_cfg(subagent_probability=1.0, subagent_blocking_probability=0.0))
    assert sum(n.session_id.endswith(":sub0") for n in g.nodes) == 2 * 2
    relations = [d.relation for n in g.nodes for d in n.dependencies]
    assert "join" not in relations
    assert relations.count("spawn") == 2 * 2


def test_recorded_starts_closed_form():
    """Start estimates: root at p x interval; a completion edge adds the nominal call time
    (100 + 20 x 16 = 420 ms) and its delay; a spawn starts at its parent's end; a join waits for the
    sub-agent's estimated end. recorded_api_time_ms stays None."""
    g = graph(constant_cfg(subagent_probability=1.0, num_plays=2))
    call = nominal_call_ms(16)
    assert call == 420.0
    p1 = {n.request_id: n.recorded_start_ms for n in g.plays[1].nodes}
    t1 = 1000.0 + 3 * call + 250.0  # main:t1 joins sub0:t1, which ends 3 calls + a tool in
    assert p1 == {
        "play1:main:t0": 1000.0,
        "play1:sub0:t0": 1000.0 + call,
        "play1:sub0:t1": 1000.0 + 2 * call + 250.0,
        "play1:main:t1": t1,
        "play1:sub1:t0": t1 + call,
        "play1:sub1:t1": t1 + 2 * call + 250.0,
        "play1:main:t2": t1 + 3 * call + 250.0,
    }
    assert all(n.recorded_api_time_ms is None for n in g.nodes)


@pytest.mark.parametrize("seed", range(5))
def test_random_graph_invariants(seed):
    """Any seed: each node's ids cover its input exactly (ceil(input / block)); a session's
    turns extend the previous turn's full-block ids; every session starts with the shared
    system prompt blocks; plays start at p x interval; start estimates never precede a
    predecessor's; a snapshot cut of every play is valid."""
    cfg = random_cfg()
    g = graph(cfg, seed)
    system = tuple(range(1000 // 64))
    for n in g.nodes:
        assert len(n.hash_ids) == math.ceil(n.input_length / 64)
        assert n.input_length > 0
    for turns in sessions(g).values():
        assert turns[0].hash_ids[: len(system)] == system
        for prev, nxt in zip(turns, turns[1:], strict=False):
            full = prev.input_length // 64
            assert nxt.hash_ids[:full] == prev.hash_ids[:full]
            assert nxt.input_length >= prev.input_length + prev.output_length
    for p, play in enumerate(g.plays):
        roots = [n for n in play.nodes if not n.dependencies]
        assert [(r.request_id, r.not_before_ms) for r in roots] == [(f"play{p}:main:t0", p * 500.0)]
        starts = recorded_starts(play)
        for n in play.nodes:
            assert n.recorded_start_ms == starts[n.request_id]
            assert all(starts[d.request_id] <= starts[n.request_id] for d in n.dependencies)
        snapshot_plan(play, seed, graph_digest(g), 0, p, 1.0, g.path)
