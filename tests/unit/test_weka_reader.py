"""The Weka / AgentX reader: plays of recorded calls and sub-agent markers become one validated
agentic graph (streams by prefix continuation, spawn / join / anchor edges, corpus-wide
not_before_ms, per-play hash ids, nested timestamp basis); every contract it breaks is an error
naming file:line and the play / request (reference §1.4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servesim.workload.agentic import read_agentic_mooncake, write_agentic_v2
from servesim.workload.errors import TraceError
from servesim.workload.weka import read_weka

DATA = Path(__file__).parents[1] / "data" / "agentic"


def call(t: float, hash_ids: list[int], api_time: float | None = None, **kw) -> dict:
    """An "n" call of 4 tokens per hash id (block size 4: no extension)."""
    r = {"type": "n", "t": t, "in": 4 * len(hash_ids), "out": 2, "model": "m", "hash_ids": hash_ids}
    if api_time is not None:
        r["api_time"] = api_time
    return {**r, **kw}


def sub(t: float, agent_id: str, requests: list[dict], **kw) -> dict:
    return {"type": "subagent", "t": t, "agent_id": agent_id, "requests": requests, **kw}


def play(pid: str, requests: list[dict], **kw) -> dict:
    return {"id": pid, "block_size": 4, "hash_id_scope": "local", "requests": requests, **kw}


def write(tmp_path: Path, plays: list[dict | str], name: str = "corpus.jsonl") -> Path:
    """One play per line; a str is written verbatim."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join((json.dumps(p) if isinstance(p, dict) else p) + "\n" for p in plays)
    path.write_text(text)
    return path


def edges(graph, rid: str) -> list[tuple]:
    return [(d.request_id, d.trigger, d.delay_ms, d.relation) for d in graph.node(rid).dependencies]


# --------------------------------------------------------------------------- lowering


def test_reference_example():
    """The reference's single play: the sub-agent starts before its parent call ends (dispatch
    spawn, start-to-start 600 ms); the next call continues the stream (500 ms after the first
    call's end) and is the first call after the sub-agent's end 0.5 + 0.8 s, so it joins it
    (2.0 - 1.3 s = 700 ms)."""
    path = DATA / "weka_play.json"
    graph, basis = read_weka(path)
    assert basis == "absolute"
    assert (graph.variant, graph.block_size, graph.hash_id_scope) == ("weka", 64, "local")
    assert graph.path == str(path) and graph.source_models == ("m",)
    assert graph.source is not None
    assert graph.source["format"] == "weka" and graph.source["files"] == [str(path)]
    assert graph.source["nested_timestamp_basis"] == "absolute"
    assert len(graph.source["digest"]) == 64
    (p,) = graph.plays
    assert (p.play_id, p.ordinal) == ("play-A", 0)
    assert [n.request_id for n in p.nodes] == ["play-A:0", "play-A:sa1:0", "play-A:1"]
    first, child, nxt = p.nodes
    assert [n.session_id for n in p.nodes] == ["play-A:main", "play-A:sa1", "play-A:main"]
    assert [n.not_before_ms for n in p.nodes] == [0.0, 600.0, 2000.0]
    assert [n.recorded_start_ms for n in p.nodes] == [0.0, 600.0, 2000.0]
    assert [n.recorded_api_time_ms for n in p.nodes] == [1500.0, 400.0, 1000.0]
    assert (first.input_length, first.output_length, first.model, first.line) == (200, 30, "m", 1)
    # ids interned per play in first-appearance order; 260 tokens need ceil(260/64) = 5 ids
    assert first.hash_ids == (0, 1, 2, 3) and child.hash_ids == (4, 5)
    assert nxt.hash_ids == (0, 1, 2, 3, 6)
    assert edges(graph, "play-A:0") == []
    assert edges(graph, "play-A:sa1:0") == [("play-A:0", "dispatch", 600.0, "spawn")]
    assert edges(graph, "play-A:1") == [
        ("play-A:0", "completion", 500.0, "sequence"),
        ("play-A:sa1:0", "completion", 700.0, "join"),
    ]


def test_jsonl_corpus_short_hash_lists_and_per_play_ids():
    """Two plays: not_before_ms counts from the corpus's earliest call (play-1 starts at 4 s);
    1200 tokens with 3 ids (block 64) get 16 fresh ids to cover ceil(1200/64) = 19 blocks; the
    same recorded id in two plays is two graph ids ("local" scope); a sub-agent starting after
    its parent ended is spawned on completion (8.5 - 2.0 s); with no later parent call it is
    not joined; a missing api_time stays unknown; unused play aggregates are accepted."""
    graph, basis = read_weka(DATA / "weka_corpus.jsonl")
    assert basis == "absolute"
    assert [(p.play_id, p.ordinal) for p in graph.plays] == [("play-0", 0), ("play-1", 1)]
    assert graph.source_models == ("h", "m")
    root, child = graph.plays[0].nodes
    assert root.hash_ids == tuple(range(19)) and child.hash_ids == tuple(range(19, 30))
    assert child.request_id == "play-0:sub1:0" and child.not_before_ms == 8500.0
    assert edges(graph, "play-0:sub1:0") == [("play-0:0", "completion", 6500.0, "spawn")]
    a, b = graph.plays[1].nodes
    assert (a.request_id, a.not_before_ms, a.hash_ids, a.line) == ("play-1:0", 4000.0, (30,), 3)
    assert (b.not_before_ms, b.hash_ids, b.recorded_api_time_ms) == (5000.0, (30, 31), None)
    assert a.output_length == 0  # a prefill-only call is kept
    assert edges(graph, "play-1:1") == [("play-1:0", "completion", 500.0, "sequence")]


def test_streams_split_by_prefix_continuation(tmp_path):
    """A call continues the stream whose latest call's ids prefix its own (the most recent such
    stream when several do), else starts a stream anchored to the play's first call by the
    start-to-start gap; sequence delays run from the previous call's end (its start when
    api_time is unknown)."""
    requests = [
        call(0.0, [1, 2], 1.0),  # A  stream 0
        call(0.5, [7], 0.2),  # B  new stream 1
        call(2.0, [1, 2, 3], 1.0),  # C  continues A
        call(2.5, [7, 8]),  # D  continues B
        call(3.5, [1, 2, 3, 4]),  # E  continues C
        call(3.6, [1, 2]),  # F  no tail prefixes [1, 2] any more: stream 2
        call(4.0, [1, 2, 3, 4, 5]),  # G  E and F both prefix it; F is later
    ]
    graph, basis = read_weka(write(tmp_path, [play("p", requests)]))
    assert basis == "not_applicable"
    nodes = graph.plays[0].nodes
    assert [n.session_id for n in nodes] == [
        "p:main",
        "p:stream1",
        "p:main",
        "p:stream1",
        "p:main",
        "p:stream2",
        "p:stream2",
    ]
    assert [edges(graph, n.request_id) for n in nodes] == [
        [],
        [("p:0", "dispatch", 500.0, "replay_barrier")],
        [("p:0", "completion", 1000.0, "sequence")],
        [("p:1", "completion", 1800.0, "sequence")],
        [("p:2", "completion", 500.0, "sequence")],
        [("p:0", "dispatch", 3600.0, "replay_barrier")],
        [("p:5", "completion", 400.0, "sequence")],
    ]


def test_delays_floor_at_zero(tmp_path):
    """A call that started before its predecessor ended gets delay 0, as does a sub-agent call
    timed before its parent call (it is still spawned by it, on dispatch)."""
    requests = [call(1.0, [1], 1.0), sub(1.0, "a", [call(0.9, [5])]), call(1.5, [1, 2])]
    graph, _ = read_weka(write(tmp_path, [play("p", requests)]), nested_timestamp_basis="absolute")
    assert edges(graph, "p:a:0") == [("p:0", "dispatch", 0.0, "spawn")]
    assert edges(graph, "p:1") == [("p:0", "completion", 0.0, "sequence")]
    assert graph.node("p:a:0").not_before_ms == 0.0  # the corpus's earliest call, at 0.9 s


def test_spawn_from_latest_parent_and_subagent_chain(tmp_path):
    """The spawn comes from the latest top-level call before the marker; a parent without
    api_time ends at its start, so a child after it is spawned on completion. A sub-agent's
    calls chain by sequence edges in one session."""
    requests = [
        call(0.0, [1], 0.5),
        call(1.0, [1, 2]),
        sub(1.5, "w", [call(1.2, [9], 0.3), call(2.0, [9, 8], 0.5)]),
        call(3.0, [1, 2, 3]),
    ]
    graph, basis = read_weka(write(tmp_path, [play("p", requests)]))
    assert basis == "relative"  # 1.2 < 1.5: the child times are offsets from the marker
    assert [n.not_before_ms for n in graph.plays[0].nodes] == [0.0, 1000.0, 2700.0, 3500.0, 3000.0]
    assert edges(graph, "p:w:0") == [("p:1", "completion", 1700.0, "spawn")]
    assert edges(graph, "p:w:1") == [("p:w:0", "completion", 500.0, "sequence")]
    assert graph.node("p:w:1").session_id == "p:w"
    assert edges(graph, "p:2") == [("p:1", "completion", 2000.0, "sequence")]  # no duration


def test_join_goes_to_first_parent_call_after_subagent_end(tmp_path):
    """A completed sub-agent with a duration joins the first later parent call starting at or
    after marker t + duration_ms (here 1 + 1 = 2 s); calls during the sub-agent do not wait."""
    requests = [
        call(0.0, [1], 0.5),
        sub(1.0, "a", [call(1.2, [5], 0.5)], duration_ms=1000, status="completed"),
        call(1.5, [1, 2], 0.1),
        call(2.5, [1, 2, 3]),
        call(3.0, [1, 2, 3, 4]),
    ]
    graph, _ = read_weka(write(tmp_path, [play("p", requests)]))
    assert edges(graph, "p:a:0") == [("p:0", "completion", 700.0, "spawn")]
    assert edges(graph, "p:1") == [("p:0", "completion", 1000.0, "sequence")]
    assert edges(graph, "p:2") == [
        ("p:1", "completion", 900.0, "sequence"),
        ("p:a:0", "completion", 500.0, "join"),
    ]
    assert edges(graph, "p:3") == [("p:2", "completion", 500.0, "sequence")]


@pytest.mark.parametrize(
    "marker",
    [
        {"status": "failed", "duration_ms": 100},
        {"status": "completed"},  # no duration: no end to join at
        {"duration_ms": 100},  # no status
        {"status": "completed", "duration_ms": 5000},  # ends after the last parent call
    ],
)
def test_background_subagents_are_not_joined(tmp_path, marker):
    requests = [call(0.0, [1], 0.1), sub(0.2, "a", [call(0.2, [5], 0.05)], **marker)]
    requests.append(call(1.0, [1, 2]))
    graph, _ = read_weka(write(tmp_path, [play("p", requests)]))
    assert edges(graph, "p:1") == [("p:0", "completion", 900.0, "sequence")]


def test_empty_subagent_adds_nothing(tmp_path):
    """A marker without nested calls has nothing to replay, even before any parent call."""
    requests = [sub(0.0, "a", []), call(1.0, [1])]
    graph, basis = read_weka(write(tmp_path, [play("p", requests)]))
    assert basis == "not_applicable"
    assert [n.request_id for n in graph.nodes] == ["p:0"]


NESTED = [
    play("early", [call(0.0, [1]), sub(1.0, "a", [call(0.5, [2])])]),
    play("late", [call(10.0, [1]), sub(11.0, "b", [call(12.0, [2])])]),
]


@pytest.mark.parametrize(
    ("requested", "resolved", "a_ms", "b_ms"),
    [
        ("auto", "relative", 1500.0, 23000.0),  # any child before its marker: the whole corpus
        ("relative", "relative", 1500.0, 23000.0),
        ("absolute", "absolute", 500.0, 12000.0),
    ],
)
def test_nested_timestamp_basis(tmp_path, requested, resolved, a_ms, b_ms):
    graph, basis = read_weka(write(tmp_path, NESTED), nested_timestamp_basis=requested)
    assert basis == resolved and graph.source["nested_timestamp_basis"] == resolved
    assert (graph.node("early:a:0").not_before_ms, graph.node("late:b:0").not_before_ms) == (
        a_ms,
        b_ms,
    )


def test_explicit_basis_is_reported_without_nested_calls(tmp_path):
    path = write(tmp_path, [play("p", [call(0.0, [1])])])
    assert read_weka(path, nested_timestamp_basis="auto")[1] == "not_applicable"
    assert read_weka(path, nested_timestamp_basis="relative")[1] == "relative"


def test_directory_corpus_sorted_recursive_and_digest(tmp_path):
    """Files are read depth first in sorted name order at each level ("a/" before "b.jsonl");
    other suffixes are ignored; the digest depends on relative names and bytes only."""
    corpus = tmp_path / "corpus"
    write(corpus, [play("from-b", [call(5.0, [1])])], "b.jsonl")
    (corpus / "a").mkdir()
    (corpus / "a" / "z.json").write_text("\n\n" + json.dumps(play("from-z", [call(2.0, [1])])))
    (corpus / "notes.txt").write_text("not a play")
    graph, _ = read_weka(corpus, trace_block_size=4)
    assert [p.play_id for p in graph.plays] == ["from-z", "from-b"]
    assert graph.source["files"] == [str(corpus / "a" / "z.json"), str(corpus / "b.jsonl")]
    assert graph.node("from-z:0").line == 3  # where the JSON object starts
    assert [n.not_before_ms for n in graph.nodes] == [0.0, 3000.0]
    assert graph.node("from-z:0").hash_ids != graph.node("from-b:0").hash_ids
    copy = shutil.copytree(corpus, tmp_path / "elsewhere")
    assert read_weka(copy)[0].source["digest"] == graph.source["digest"]


def test_graph_round_trips_through_v2(tmp_path):
    """The lowered graph is a valid agentic Mooncake v2 graph (capacity, edges, plays)."""
    graph, _ = read_weka(DATA / "weka_corpus.jsonl")
    back = read_agentic_mooncake(write_agentic_v2(graph, tmp_path / "v2.jsonl"))
    assert back.source == graph.source and back.block_size == 64
    for old, new in zip(graph.nodes, back.nodes, strict=True):
        assert (new.request_id, new.hash_ids, new.dependencies, new.not_before_ms) == (
            old.request_id,
            old.hash_ids,
            old.dependencies,
            old.not_before_ms,
        )


# --------------------------------------------------------------------------- errors


def fails(path: Path, match: str, **kw) -> None:
    with pytest.raises(TraceError, match=match):
        read_weka(path, **kw)


def test_mixed_block_sizes(tmp_path):
    path = write(tmp_path, [play("a", [call(0, [1])]), play("b", [call(0, [1])], block_size=8)])
    fails(path, r"corpus\.jsonl:2: play b: Weka corpus mixes block sizes: block_size 8 here, 4")


def test_trace_block_size_must_match(tmp_path):
    path = write(tmp_path, [play("a", [call(0, [1])])])
    fails(
        path, "trace_block_size 64 does not match the Weka corpus block size 4", trace_block_size=64
    )
    fails(path, "trace_block_size must be a positive integer", trace_block_size=0)
    assert read_weka(path, trace_block_size=4)[0].block_size == 4


def test_no_parent_requests(tmp_path):
    path = write(tmp_path, [play("a", [sub(0.0, "x", [call(0.0, [1])])])])
    fails(path, r":1: play a: play has no parent requests")


def test_subagent_without_preceding_parent(tmp_path):
    path = write(tmp_path, [play("a", [sub(0.0, "x", [call(0.0, [1])]), call(1.0, [1])])])
    fails(path, r":1: play a requests\[0\] \(sub-agent x\): sub-agent has no preceding parent")


def test_blocking_duration_understates_children(tmp_path):
    """Ends at 1.0 + 0.3 s, but its call runs to 1.2 + 0.5 s; the call at 2.0 s joins it."""
    requests = [
        call(0.0, [1], 0.1),
        sub(1.0, "x", [call(1.2, [5], 0.5)], duration_ms=300, status="completed"),
        call(2.0, [1, 2]),
    ]
    path = write(tmp_path, [play("a", requests)])
    fails(
        path,
        r"sub-agent x\): blocking sub-agent's duration_ms 300 understates its requests: "
        r"requests\[0\] ends 700 ms after the marker",
    )


@pytest.mark.parametrize("key", ["id", "block_size", "hash_id_scope", "requests"])
def test_missing_play_fields(tmp_path, key):
    p = {k: v for k, v in play("a", [call(0, [1])]).items() if k != key}
    fails(write(tmp_path, [p]), rf"corpus\.jsonl:1: play.*: missing {key}")


@pytest.mark.parametrize("key", ["t", "in", "out", "model", "hash_ids"])
def test_missing_request_fields(tmp_path, key):
    r = {k: v for k, v in call(0, [1]).items() if k != key}
    fails(write(tmp_path, [play("a", [r])]), rf":1: play a requests\[0\]: missing {key}")


@pytest.mark.parametrize("key", ["t", "agent_id", "requests"])
def test_missing_subagent_fields(tmp_path, key):
    s = {k: v for k, v in sub(1.0, "x", [call(1, [2])]).items() if k != key}
    fails(write(tmp_path, [play("a", [call(0, [1]), s])]), rf"requests\[1\].*: missing {key}")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"in": 0}, "in must be >= 1, got 0"),
        ({"in": 2.5}, "in must be an integer"),
        ({"out": -1}, "out must be >= 0, got -1"),
        ({"t": "soon"}, "t must be a finite number of seconds >= 0"),
        ({"t": -1}, "t must be a finite number of seconds >= 0"),
        ({"api_time": -0.5}, "api_time must be a finite number of seconds >= 0"),
        ({"hash_ids": [1, -2]}, "hash_ids must be a list of non-negative integers"),
        ({"hash_ids": [True]}, "hash_ids must be a list of non-negative integers"),
        ({"model": ""}, "model must be a non-empty string"),
    ],
)
def test_bad_request_fields(tmp_path, change, expected):
    fails(write(tmp_path, [play("a", [{**call(0, [1]), **change}])]), expected)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"duration_ms": -1}, "duration_ms must be finite and >= 0"),
        ({"status": 1}, "status must be a string"),
        ({"subagent_type": ["x"]}, "subagent_type must be a string"),
        ({"requests": {}}, r"sub-agent x\): requests must be a list"),
    ],
)
def test_bad_subagent_fields(tmp_path, change, expected):
    s = {**sub(1.0, "x", [call(1, [2])]), **change}
    fails(write(tmp_path, [play("a", [call(0, [1]), s])]), expected)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"block_size": 0}, "play a: block_size must be a positive integer, got 0"),
        ({"hash_id_scope": "global"}, "play a: hash_id_scope must be 'local', got 'global'"),
        ({"requests": []}, "play a: requests is empty"),
        ({"requests": "x"}, "play a: requests must be a list"),
        ({"id": ""}, "id must be a non-empty string"),
    ],
)
def test_bad_play_fields(tmp_path, change, expected):
    fails(write(tmp_path, [{**play("a", [call(0, [1])]), **change}]), expected)


def test_unknown_request_types(tmp_path):
    path = write(tmp_path, [play("a", [{**call(0, [1]), "type": "x"}])])
    fails(path, r"requests\[0\]: unknown request type 'x' \(expected 'n', 's' or 'subagent'\)")
    nested = sub(1.0, "x", [sub(1.0, "y", [])])
    path = write(tmp_path, [play("a", [call(0, [1]), nested])], "n.jsonl")
    fails(path, r"requests\[1\] \(sub-agent x\) requests\[0\]: unknown request type 'subagent'")


def test_duplicate_ids(tmp_path):
    path = write(tmp_path, [play("a", [call(0, [1])]), play("a", [call(1, [1])])])
    fails(path, r"corpus\.jsonl:2: play a: duplicate play id a \(first at .*corpus\.jsonl:1")
    requests = [call(0, [1]), sub(1, "x", [call(1, [2])]), sub(2, "x", [call(2, [2])])]
    fails(write(tmp_path, [play("a", requests)], "d.jsonl"), r"duplicate agent_id x \(first at")


def test_directory_errors(tmp_path):
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    (tmp_path / "empty" / "readme.md").write_text("x")
    fails(tmp_path / "empty", "Weka corpus .*empty contains no .json or .jsonl files")
    corpus = tmp_path / "corpus"
    target = write(tmp_path, [play("a", [call(0, [1])])], "target.jsonl")
    corpus.mkdir()
    (corpus / "link.jsonl").symlink_to(target)
    fails(corpus, r"Weka corpus contains a symlink, which is not followed: .*link\.jsonl")


def test_file_errors(tmp_path):
    fails(tmp_path / "nope.jsonl", "failed to open trace file")
    fails(write(tmp_path, ["", " "]), "did not contain any requests")
    fails(write(tmp_path, ["{oops"], "bad.jsonl"), r"bad\.jsonl:1: not valid JSON")
    (tmp_path / "list.json").write_text("[]")
    fails(tmp_path / "list.json", r"list\.json:1: expected a play object, got list")
    path = write(tmp_path, [play("a", [call(0, [1])])])
    fails(path, r"nested_timestamp_basis must be one of", nested_timestamp_basis="marker")
