"""The agentic Mooncake reader: v2 files with a header and legacy headerless rows become one
validated graph of plays, nodes and typed dependencies; every contract it breaks is an error
naming file:line (reference §1.3, §7, loader cases 6-8)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servesim.workload.agentic import read_agentic_mooncake, write_agentic_v2
from servesim.workload.agentic_graph import Dependency
from servesim.workload.errors import TraceError

HEADER = {
    "schema": "dynamo.agentic_mooncake",
    "version": 2,
    "block_size": 64,
    "hash_id_scope": "local",
    "source": {"format": "hand", "digest": "demo-1"},
}
ROOT = {
    "request_id": "p1:root",
    "play_id": "p1",
    "session_id": "p1:main",
    "model": "m",
    "input_length": 192,
    "output_length": 20,
    "hash_ids": [1, 2, 3],
    "not_before_ms": 0,
}
SUB = {
    **ROOT,
    "request_id": "p1:sub",
    "session_id": "p1:child",
    "input_length": 128,
    "output_length": 5,
    "hash_ids": [1, 2],
    "dependencies": [
        {"request_id": "p1:root", "trigger": "dispatch", "delay_ms": 15, "relation": "spawn"}
    ],
}
NEXT = {
    **ROOT,
    "request_id": "p1:next",
    "input_length": 256,
    "hash_ids": [1, 2, 3, 4],
    "dependencies": [
        {"request_id": "p1:root", "trigger": "completion", "delay_ms": 300, "relation": "sequence"},
        {"request_id": "p1:sub", "trigger": "completion", "delay_ms": 0, "relation": "join"},
    ],
}


def write(tmp_path: Path, lines: list[str | dict], name: str = "agentic.jsonl") -> Path:
    """Each dict becomes one JSON line; each str is written verbatim as one line."""
    path = tmp_path / name
    text = "".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines)
    path.write_text(text)
    return path


def fails(path: Path, line: int, *fragments: str, block_size: int = 4) -> None:
    with pytest.raises(TraceError) as e:
        read_agentic_mooncake(path, trace_block_size=block_size)
    message = str(e.value)
    assert message.startswith(f"{path}:{line}: "), message
    for fragment in fragments:
        assert fragment in message, message


def dep(rid: str, trigger: str = "completion", delay: float = 0, relation: str = "sequence"):
    return {"request_id": rid, "trigger": trigger, "delay_ms": delay, "relation": relation}


def row(rid: str, play: str = "p1", *deps: dict, **kw) -> dict:
    return {**ROOT, "request_id": rid, "play_id": play, "dependencies": list(deps), **kw}


# --------------------------------------------------------------------------- v2


def test_v2_reference_example(tmp_path):
    """The reference's example: one play, three nodes in file order, typed edges, header kept."""
    path = write(tmp_path, [HEADER, ROOT, SUB, NEXT])
    graph = read_agentic_mooncake(path, trace_block_size=4)
    assert graph.variant == "v2" and graph.version == 2
    assert graph.block_size == 64  # the header overrides trace_block_size
    assert graph.source == {"format": "hand", "digest": "demo-1"}
    assert graph.hash_id_scope == "local" and graph.source_models == ("m",)
    assert graph.path == str(path)
    (play,) = graph.plays
    assert (play.play_id, play.ordinal) == ("p1", 0)
    assert [n.request_id for n in play.nodes] == ["p1:root", "p1:sub", "p1:next"]
    root, sub, nxt = play.nodes
    assert (root.session_id, root.model, root.input_length, root.output_length) == (
        "p1:main",
        "m",
        192,
        20,
    )
    assert root.hash_ids == (1, 2, 3) and root.not_before_ms == 0.0 and root.dependencies == ()
    assert (root.line, sub.line, nxt.line) == (2, 3, 4)
    assert sub.dependencies == (Dependency("p1:root", "dispatch", 15.0, "spawn"),)
    assert nxt.dependencies == (
        Dependency("p1:root", "completion", 300.0, "sequence"),
        Dependency("p1:sub", "completion", 0.0, "join"),
    )
    assert graph.node("p1:next") is nxt and graph.nodes == play.nodes


def test_v2_plays_in_file_order_or_by_source_play_ordinal(tmp_path):
    """Plays keep first-appearance order unless source_play_ordinal orders them; blank lines
    before the header are allowed."""
    rows = [row("a", "pa"), row("b", "pb"), row("a2", "pa", dep("a"))]
    graph = read_agentic_mooncake(write(tmp_path, ["", HEADER, *rows]), 4)
    assert [(p.play_id, p.ordinal, len(p.nodes)) for p in graph.plays] == [
        ("pa", 0, 2),
        ("pb", 1, 1),
    ]
    rows = [row("a", "pa", source_play_ordinal=3), row("b", "pb", source_play_ordinal=2)]
    graph = read_agentic_mooncake(write(tmp_path, [HEADER, *rows], "o.jsonl"), 4)
    assert [p.play_id for p in graph.plays] == ["pb", "pa"]


# --------------------------------------------------------------------------- legacy


def legacy(rid: str, ts: float | None = None, wait_for: list[str] | None = None, **kw) -> dict:
    r: dict = {"request_id": rid, "output_length": 2, "hash_ids": [1, 2], **kw}
    if ts is not None:
        r["timestamp"] = ts
    if wait_for is not None:
        r["wait_for"] = wait_for
    return r


def test_legacy_lowering_delay_and_independent_plays(tmp_path):
    """wait_for becomes a completion edge with delay + tool_wait_ms (10 + 6 = 16); 3 nodes in
    2 plays (loader case 6); dependent rows get no authored start."""
    path = write(
        tmp_path,
        [
            legacy("a", 0, session_id="s1", model="x"),
            legacy("b", 3),
            legacy("a2", wait_for=["a"], delay=10, tool_wait_ms=6, session_id="s1"),
        ],
    )
    graph = read_agentic_mooncake(path, trace_block_size=4)
    assert graph.variant == "legacy" and graph.block_size == 4 and graph.source is None
    assert graph.source_models == ("x",)
    assert [(p.play_id, p.ordinal) for p in graph.plays] == [("a", 0), ("b", 1)]
    assert [n.request_id for n in graph.plays[0].nodes] == ["a", "a2"]
    a, a2 = graph.plays[0].nodes
    assert a.not_before_ms == 0.0 and a.input_length == 8 and a.play_id == "a"
    assert a2.not_before_ms is None and a2.play_id == "a"
    assert a2.dependencies == (Dependency("a", "completion", 16.0, "sequence"),)


def test_legacy_multi_root_join_is_one_play_labelled_by_earliest_root(tmp_path):
    """Two roots (released at 5 and 0) joined by one row form one play named by the earlier
    root; the join row's edges are relation join (loader case 7); plays sort by label start."""
    path = write(
        tmp_path,
        [
            legacy("solo", 1),
            legacy("late", 5),
            legacy("early", 0),
            legacy("j", wait_for=["late", "early"], delay_ms=4),
        ],
    )
    graph = read_agentic_mooncake(path, trace_block_size=4)
    assert [(p.play_id, p.ordinal) for p in graph.plays] == [("early", 0), ("solo", 1)]
    assert [n.request_id for n in graph.plays[0].nodes] == ["late", "early", "j"]
    assert {n.not_before_ms for n in graph.plays[0].nodes} == {5.0, 0.0, None}
    assert graph.node("j").dependencies == (
        Dependency("late", "completion", 4.0, "join"),
        Dependency("early", "completion", 4.0, "join"),
    )


# --------------------------------------------------------------------------- errors: v2


def test_v2_unknown_version(tmp_path):
    fails(write(tmp_path, [{**HEADER, "version": 3}, ROOT]), 1, "unknown", "version 3")


def test_v2_header_only(tmp_path):
    fails(write(tmp_path, [HEADER, ""]), 1, "did not contain any requests")


def test_empty_file(tmp_path):
    with pytest.raises(TraceError, match="did not contain any requests"):
        read_agentic_mooncake(write(tmp_path, ["", "  "]), 4)


def test_v2_duplicate_request_id(tmp_path):
    fails(write(tmp_path, [HEADER, ROOT, SUB, ROOT]), 4, "duplicate request_id p1:root", "line 2")


def test_v2_unknown_predecessor(tmp_path):
    path = write(tmp_path, [HEADER, ROOT, row("x", "p1", dep("ghost"))])
    fails(path, 3, "unknown request_id ghost", "play p1", "request x")


def test_v2_cycle(tmp_path):
    rows = [ROOT, row("a", "p1", dep("b")), row("b", "p1", dep("a")), row("c", "p1", dep("b"))]
    with pytest.raises(TraceError) as e:
        read_agentic_mooncake(write(tmp_path, [HEADER, *rows]), 4)
    message = str(e.value)
    assert "cycle detected in play p1" in message
    m = re.search(r":(\d+): .* at request (\w+) ", message)
    assert m and (m[1], m[2]) in {("3", "a"), ("4", "b")}, message


def test_v2_self_dependency_is_a_cycle(tmp_path):
    fails(write(tmp_path, [HEADER, row("a", "p1", dep("a"))]), 2, "cycle detected", "request a")


def test_v2_cross_play_dependency(tmp_path):
    path = write(tmp_path, [HEADER, ROOT, row("q", "p2", dep("p1:root"))])
    fails(path, 3, "cross-play dependency", "play p2", "p1:root in play p1")


def test_v2_negative_not_before_ms(tmp_path):
    path = write(tmp_path, [HEADER, {**ROOT, "not_before_ms": -1}])
    fails(path, 2, "negative not_before_ms -1")


def test_v2_negative_delay(tmp_path):
    path = write(tmp_path, [HEADER, ROOT, row("x", "p1", dep("p1:root", delay=-5))])
    fails(path, 3, "negative delay_ms -5")


def test_v2_join_with_dispatch_trigger(tmp_path):
    path = write(tmp_path, [HEADER, ROOT, row("x", "p1", dep("p1:root", "dispatch", 0, "join"))])
    fails(path, 3, "invalid Join dependency with Dispatch trigger", "request x")


def test_v2_input_length_above_hash_capacity(tmp_path):
    """Capacity uses the header's block size: 3 ids x 64 = 192 < 193."""
    path = write(tmp_path, [HEADER, {**ROOT, "input_length": 193}])
    fails(path, 2, "input_length 193 exceeds hash_ids capacity 192")


def test_v2_unknown_dependency_key(tmp_path):
    path = write(tmp_path, [HEADER, ROOT, row("x", "p1", {**dep("p1:root"), "wait": 1})])
    fails(path, 3, "unknown keys ['wait']")


@pytest.mark.parametrize(
    ("edge", "expected"),
    [
        ({"request_id": "p1:root", "trigger": "later", "relation": "sequence"}, "trigger 'later'"),
        ({"request_id": "p1:root", "trigger": "completion", "relation": "x"}, "relation 'x'"),
        ({"trigger": "completion", "relation": "sequence"}, "missing request_id"),
    ],
)
def test_v2_bad_dependency_fields(tmp_path, edge, expected):
    fails(write(tmp_path, [HEADER, ROOT, row("x", "p1", edge)]), 3, expected)


@pytest.mark.parametrize("key", ["play_id", "session_id", "model", "input_length"])
def test_v2_required_row_fields(tmp_path, key):
    r = {k: v for k, v in ROOT.items() if k != key}
    fails(write(tmp_path, [HEADER, r]), 2, f"missing {key}")


def test_v2_header_not_first(tmp_path):
    fails(write(tmp_path, [legacy("a", 0), HEADER]), 2, "v2 header must be the first")


def test_v2_rows_without_header(tmp_path):
    fails(write(tmp_path, [ROOT]), 1, "needs a v2 header")


def test_v2_source_play_ordinal_rules(tmp_path):
    """Set on every play or none, unique, contiguous."""
    rows = [row("a", "pa", source_play_ordinal=0), row("b", "pb")]
    fails(write(tmp_path, [HEADER, *rows]), 3, "play pb has no source_play_ordinal")
    rows = [row("a", "pa", source_play_ordinal=0), row("b", "pb", source_play_ordinal=0)]
    fails(write(tmp_path, [HEADER, *rows], "u.jsonl"), 3, "repeats source_play_ordinal 0")
    rows = [row("a", "pa", source_play_ordinal=0), row("b", "pb", source_play_ordinal=2)]
    fails(write(tmp_path, [HEADER, *rows], "c.jsonl"), 3, "not contiguous (missing 1)")


# --------------------------------------------------------------------------- errors: legacy


def test_legacy_delay_and_delay_ms_both_set(tmp_path):
    path = write(tmp_path, [legacy("a", 0), legacy("b", wait_for=["a"], delay=1, delay_ms=1)])
    fails(path, 2, "sets both delay and delay_ms")


def test_legacy_unknown_predecessor(tmp_path):
    fails(write(tmp_path, [legacy("a", 0, wait_for=["zz"])]), 1, "unknown request_id zz")


def test_legacy_duplicate_request_id(tmp_path):
    fails(write(tmp_path, [legacy("a", 0), legacy("a", 1)]), 2, "duplicate request_id a")


def test_legacy_cycle(tmp_path):
    path = write(
        tmp_path, [legacy("r", 0), legacy("a", wait_for=["b"]), legacy("b", wait_for=["a"])]
    )
    with pytest.raises(TraceError, match=r":[23]: cycle detected in play a at request [ab] "):
        read_agentic_mooncake(path, 4)


def test_legacy_negative_delays(tmp_path):
    rows = [legacy("a", 0), legacy("b", wait_for=["a"], tool_wait_ms=-1)]
    fails(write(tmp_path, rows), 2, "tool_wait_ms must be finite and >= 0")
    rows = [legacy("a", 0), legacy("b", wait_for=["a"], delay=-2)]
    fails(write(tmp_path, rows, "d.jsonl"), 2, "delay must be finite and >= 0")


def test_legacy_row_fields(tmp_path):
    """request_id is required; a root needs a timestamp; capacity uses trace_block_size."""
    fails(write(tmp_path, [{"timestamp": 0, "output_length": 1, "hash_ids": [1]}]), 1, "missing")
    fails(write(tmp_path, [legacy("a")], "t.jsonl"), 1, "needs a timestamp")
    fails(write(tmp_path, [legacy("a", 0, input_length=9)], "c.jsonl"), 1, "capacity 8")


def test_missing_file_and_bad_block_size(tmp_path):
    with pytest.raises(TraceError, match="failed to open trace file"):
        read_agentic_mooncake(tmp_path / "nope.jsonl", 4)
    with pytest.raises(TraceError, match="trace_block_size must be greater than 0"):
        read_agentic_mooncake(write(tmp_path, [legacy("a", 0)]), 0)


def test_v2_writer_round_trips_plays_nodes_and_edges(tmp_path):
    """A legacy file written as v2 reads back as the same plays, nodes and typed edges (a
    dependent node gets its play's earliest start, which its edges override)."""
    rows = [
        legacy("a0", ts=100.0),
        legacy("a1", wait_for=["a0"], delay=10, tool_wait_ms=6),
        legacy("b0", ts=50.0),
    ]
    graph = read_agentic_mooncake(write(tmp_path, rows), trace_block_size=4)
    back = read_agentic_mooncake(write_agentic_v2(graph, tmp_path / "v2.jsonl", model="m"))
    assert back.variant == "v2" and back.block_size == 4
    assert [p.play_id for p in back.plays] == [p.play_id for p in graph.plays]
    for old, new in zip(graph.nodes, back.nodes, strict=True):
        assert (new.request_id, new.input_length, new.output_length, new.hash_ids) == (
            old.request_id,
            old.input_length,
            old.output_length,
            old.hash_ids,
        )
        assert new.dependencies == old.dependencies
    assert back.node("a1").not_before_ms == 100.0
