"""The Dynamo request-trace reader: `dynamo.request.trace.v1` shards become plain Mooncake rows
(no agent_context) or one agentic graph of sessions (sequence / spawn / join edges, plays by
root session, not_before_ms from the earliest request); every contract it breaks is an error
naming shard:line (reference §1.6)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from servesim.workload.agentic import AgenticGraph
from servesim.workload.dynamo_trace import DynamoRows, read_dynamo_trace, trace_block_size_of
from servesim.workload.errors import TraceError, TraceRow

DATA = Path(__file__).parents[1] / "data" / "agentic"
SCHEMA = "dynamo.request.trace.v1"
B = 1_700_000_000_000  # unix ms


def req(
    rid: str,
    received: float,
    hashes: list[int] | None = None,
    *,
    total: float | None = 100,
    session: str | None = None,
    parent: str | None = None,
    tool_call: str | None = None,
    block_size: int = 4,
) -> dict:
    """A request_end record of 4 tokens per hash (agent_context only when `session` is set)."""
    hashes = [1] if hashes is None else hashes
    request: dict = {
        "request_id": rid,
        "model": "m",
        "output_tokens": 2,
        "request_received_ms": B + received,
        "replay": {
            "trace_block_size": block_size,
            "input_length": 4 * len(hashes),
            "input_sequence_hashes": hashes,
        },
    }
    if total is not None:
        request["total_time_ms"] = total
    record: dict = {"schema": SCHEMA, "event_type": "request_end", "request": request}
    if session is not None:
        ctx: dict = {"session_id": session}
        if parent is not None:
            ctx["parent_session_id"] = parent
        if tool_call is not None:
            ctx["tool_call_id"] = tool_call
        record["agent_context"] = ctx
    return record


def tool(session: str, call_id: str, at: float, kind: str = "tool_end") -> dict:
    return {
        "schema": SCHEMA,
        "event_type": kind,
        "event_time_unix_ms": B + at,
        "agent_context": {"session_id": session},
        "tool": {"tool_call_id": call_id, "status": "succeeded"},
    }


def write(tmp_path: Path, records: list[dict | str], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    text = "".join((json.dumps(r) if isinstance(r, dict) else r) + "\n" for r in records)
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def graph_of(*args, **kw) -> AgenticGraph:
    graph = read_dynamo_trace(*args, **kw)
    assert isinstance(graph, AgenticGraph)
    return graph


def edges(graph: AgenticGraph, rid: str) -> list[tuple]:
    return [(d.request_id, d.trigger, d.delay_ms, d.relation) for d in graph.node(rid).dependencies]


# --------------------------------------------------------------------------- plain


def test_plain_fixture_rows_in_received_order():
    """Without agent_context: Mooncake rows sorted by received time (ties by line), timestamps
    from the earliest, no sessions; wrapped records read, payload records skipped, tool records
    ignored; the rows carry the trace block size."""
    path = DATA / "dynamo_plain.jsonl"
    rows = read_dynamo_trace(path)
    assert isinstance(rows, DynamoRows) and trace_block_size_of(rows) == 16
    assert rows == [
        TraceRow(3, 0.0, 16, 1, [5], request_id="r-a"),
        TraceRow(2, 500.0, 20, 3, [5, 6], request_id="r-b"),
        TraceRow(5, 500.0, 1, 0, [7], request_id="r-c"),
    ]
    assert read_dynamo_trace([str(path)], trace_block_size=16) == rows


def test_plain_shards_merge_by_received_time(tmp_path):
    """A .gz shard and a plain shard are one trace; equal times keep shard order."""
    first = write(tmp_path, [req("b", 50), req("c", 100)], "a.jsonl.gz")
    second = write(tmp_path, [req("a", 0), req("d", 100)], "b.jsonl")
    rows = read_dynamo_trace([first, second])
    assert [(r.request_id, r.timestamp_ms, r.line) for r in rows] == [
        ("a", 0.0, 1),
        ("b", 50.0, 1),
        ("c", 100.0, 2),
        ("d", 100.0, 2),
    ]


def test_block_size_of_rows_not_from_a_trace():
    with pytest.raises(TraceError, match="carry no trace block size"):
        trace_block_size_of([TraceRow(1, 0.0, 4, 1, [1])])


# --------------------------------------------------------------------------- agentic


def test_agentic_fixture_sessions_plays_and_edges():
    """main: m0 (1000-1200 ms), m1 at 1700; child c1 (tool tc1) spawned at 1300 from m0,
    second call at 1450 after c0 ended at 1400; grandchild g spawned from c1's latest request
    (1450) at 1460; tc1's tool_end at 1600 makes c1 blocking, so m1 joins c1's last request
    (ended 1500); `other` is a second root, hence a second play."""
    path = DATA / "dynamo_agentic.jsonl"
    graph = graph_of(path)
    assert (graph.variant, graph.block_size, graph.hash_id_scope) == ("dynamo", 4, "global")
    assert graph.path == str(path) and graph.source_models == ("m",)
    assert graph.source is not None and graph.source["files"] == [str(path)]
    assert graph.source["format"] == "dynamo" and len(graph.source["digest"]) == 64
    assert [(p.play_id, p.ordinal) for p in graph.plays] == [("main", 0), ("other", 1)]
    main, other = graph.plays
    assert [n.request_id for n in main.nodes] == ["m0", "c0", "c1", "g0", "m1"]
    assert [n.session_id for n in main.nodes] == ["main", "c1", "c1", "g", "main"]
    assert [n.not_before_ms for n in main.nodes] == [0.0, 300.0, 450.0, 460.0, 700.0]
    assert [n.recorded_start_ms for n in main.nodes] == [0.0, 300.0, 450.0, 460.0, 700.0]
    assert [n.recorded_api_time_ms for n in main.nodes] == [200.0, 100.0, 50.0, 20.0, 100.0]
    assert [n.line for n in main.nodes] == [1, 3, 5, 6, 8]
    m0 = main.nodes[0]
    assert (m0.input_length, m0.output_length, m0.hash_ids, m0.model) == (8, 5, (11, 12), "m")
    assert edges(graph, "m0") == []
    assert edges(graph, "c0") == [("m0", "dispatch", 300.0, "spawn")]
    assert edges(graph, "c1") == [("c0", "completion", 50.0, "sequence")]
    assert edges(graph, "g0") == [("c1", "dispatch", 10.0, "spawn")]
    assert edges(graph, "m1") == [
        ("m0", "completion", 500.0, "sequence"),
        ("c1", "completion", 200.0, "join"),
    ]
    (o,) = other.nodes
    assert (o.request_id, o.play_id, o.not_before_ms, o.dependencies) == (
        "other0",
        "other",
        100.0,
        (),
    )


@pytest.mark.parametrize("kind", ["tool_end", "tool_error"])
def test_join_at_first_parent_request_after_tool_end(tmp_path, kind):
    """The consumer is the parent's first request received at or after the tool's end (the
    one at 150 is during the child); a missing total_time_ms makes a request end at its
    start; sequence delays floor at 0 (p1 arrived before p0 ended)."""
    records = [
        req("p0", 0, session="p", total=200),
        req("k0", 10, session="k", parent="p", tool_call="t1", total=None),
        req("p1", 150, session="p"),
        tool("p", "t1", 300, kind),
        req("p2", 300, session="p"),
    ]
    graph = graph_of(write(tmp_path, records))
    assert edges(graph, "k0") == [("p0", "dispatch", 10.0, "spawn")]
    assert edges(graph, "p1") == [("p0", "completion", 0.0, "sequence")]
    assert edges(graph, "p2") == [
        ("p1", "completion", 50.0, "sequence"),
        ("k0", "completion", 290.0, "join"),
    ]
    assert graph.node("k0").recorded_api_time_ms is None


@pytest.mark.parametrize(
    "records",
    [
        [tool("p", "t9", 300)],  # another tool call ended, not the child's
        [tool("k", "t1", 300)],  # the child's own session, not the parent's
        [],  # no tool record at all
    ],
)
def test_children_without_their_tool_record_run_in_background(tmp_path, records):
    base = [
        req("p0", 0, session="p"),
        req("k0", 10, session="k", parent="p", tool_call="t1"),
        req("p1", 400, session="p"),
    ]
    graph = graph_of(write(tmp_path, base + records))
    assert edges(graph, "p1") == [("p0", "completion", 300.0, "sequence")]


def test_no_join_when_parent_never_continues(tmp_path):
    records = [
        req("p0", 0, session="p"),
        req("k0", 10, session="k", parent="p", tool_call="t1"),
        tool("p", "t1", 300),
    ]
    graph = graph_of(write(tmp_path, records))
    assert [edges(graph, r) for r in ("p0", "k0")] == [[], [("p0", "dispatch", 10.0, "spawn")]]


def test_agentic_shards_and_wrapped_records(tmp_path):
    """A play may span shards; records wrapped in "event" count the same."""
    first = write(tmp_path, [{"event": req("p0", 0, session="p")}], "a.jsonl")
    second = write(tmp_path, [req("p1", 500, session="p")], "b.jsonl.gz")
    graph = graph_of([str(first), str(second)])
    assert graph.source["files"] == [str(first), str(second)]
    assert edges(graph, "p1") == [("p0", "completion", 400.0, "sequence")]


# --------------------------------------------------------------------------- errors


def fails(paths, match: str, **kw) -> None:
    with pytest.raises(TraceError, match=match):
        read_dynamo_trace(paths, **kw)


def test_mixes_agentic_and_plain(tmp_path):
    path = write(tmp_path, [req("a", 0, session="s"), req("b", 5)])
    fails(path, r"trace\.jsonl:2: Dynamo trace mixes agentic and plain records: .* at .*:1 ")


def test_unknown_event_type_and_schema(tmp_path):
    fails(
        write(tmp_path, [{"schema": SCHEMA, "event_type": "nap"}]), r":1: unknown event_type 'nap'"
    )
    bad = {**req("a", 0), "schema": "other.v2"}
    fails(write(tmp_path, [bad], "s.jsonl"), r"s\.jsonl:1: expected schema .*, got 'other.v2'")


def test_mixed_block_sizes_across_shards(tmp_path):
    first = write(tmp_path, [req("a", 0)], "a.jsonl")
    second = write(tmp_path, [req("b", 5, block_size=8)], "b.jsonl")
    fails([first, second], r"b\.jsonl:1: Dynamo trace mixes block sizes: trace_block_size 8 here")


def test_trace_block_size_must_match(tmp_path):
    path = write(tmp_path, [req("a", 0)])
    fails(path, "trace_block_size 16 does not match the trace's block size 4", trace_block_size=16)
    fails(path, "trace_block_size must be a positive integer", trace_block_size=-1)


def test_no_requests(tmp_path):
    fails([], "did not contain any requests")
    fails(write(tmp_path, ["", " "]), "did not contain any requests")
    only_tools = write(tmp_path, [tool("s", "t", 0)], "tools.jsonl")
    fails(only_tools, r"tools\.jsonl did not contain any requests")
    fails(tmp_path / "missing.jsonl", "failed to open trace file")


def test_unreadable_lines(tmp_path):
    fails(write(tmp_path, ["{nope"]), r":1: not valid JSON")
    fails(write(tmp_path, ["[1]"], "l.jsonl"), r"l\.jsonl:1: expected a JSON object, got list")
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    fails(tmp_path / "bad.jsonl.gz", r"bad\.jsonl\.gz: cannot read the gzip stream")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: r.pop("request"), "request_end record has no request object"),
        (lambda r: r["request"].pop("request_id"), "request_end record is missing request_id"),
        (lambda r: r["request"].pop("output_tokens"), "record is missing output_tokens"),
        (lambda r: r["request"].pop("request_received_ms"), "missing request_received_ms"),
        (lambda r: r["request"].pop("replay"), "request a has no replay object"),
        (lambda r: r["request"]["replay"].pop("input_length"), "replay record is missing input_l"),
        (
            lambda r: r["request"]["replay"].update(input_length=5),
            "input_length 5 exceeds hash_ids",
        ),
        (lambda r: r["request"]["replay"].update(input_sequence_hashes=[-1]), "non-negative"),
        (lambda r: r["request"]["replay"].update(input_sequence_hashes=[0, True]), "non-negat"),
        (lambda r: r["request"]["replay"].update(input_sequence_hashes=7), "non-negative"),
        (
            lambda r: r["request"]["replay"].update(trace_block_size=0),
            "trace_block_size must be >= 1",
        ),
        (lambda r: r["request"].update(total_time_ms=-3), "total_time_ms must be finite and >= 0"),
        (lambda r: r["request"].update(output_tokens=-1), "output_length must be >= 0"),
        (lambda r: r.update(agent_context={"parent_session_id": "x"}), "missing session_id"),
        (lambda r: r.update(agent_context="s"), "agent_context must be an object"),
    ],
)
def test_bad_request_records(tmp_path, change, expected):
    record = req("a", 0)
    change(record)
    fails(write(tmp_path, [record]), rf"trace\.jsonl:1: .*{expected}")


def test_duplicate_request_id_across_shards(tmp_path):
    first = write(tmp_path, [req("a", 0)], "a.jsonl")
    second = write(tmp_path, [req("a", 5)], "b.jsonl")
    fails([first, second], r"b\.jsonl:1: duplicate request_id a \(first at .*a\.jsonl:1\)")


def test_session_errors(tmp_path):
    records = [req("a", 0, session="s"), req("b", 5, session="s", parent="p")]
    fails(write(tmp_path, records), r":2: session s has agent_context .* but .*:1 gave it")
    records = [req("a", 0, session="s", parent="ghost")]
    fails(write(tmp_path, records, "o.jsonl"), r"o\.jsonl:1: session s names parent session ghost")
    records = [req("a", 0, session="x", parent="y"), req("b", 5, session="y", parent="x")]
    fails(write(tmp_path, records, "l.jsonl"), r"session parents form a loop \(x -> y -> x\)")
    records = [req("k", 0, session="k", parent="p"), req("p", 5, session="p")]
    fails(write(tmp_path, records, "e.jsonl"), r"e\.jsonl:1: child session k starts before any")


def test_tool_record_errors(tmp_path):
    base = [req("p0", 0, session="p"), req("k0", 10, session="k", parent="p", tool_call="t")]
    early = write(tmp_path, [*base, tool("p", "t", 100)])  # k0 ends at 110
    fails(early, r"trace\.jsonl:3: tool call t ends at .* before its child session k's last")
    twice = write(
        tmp_path, [*base, tool("p", "t", 200), tool("p", "t", 300, "tool_error")], "t.jsonl"
    )
    fails(twice, r"t\.jsonl:4: tool call t of session p already ended at .*:3")
    bare = {k: v for k, v in tool("p", "t", 200).items() if k != "agent_context"}
    fails(
        write(tmp_path, [*base, bare], "b.jsonl"), r":3: tool_end record is missing agent_context"
    )
    no_id = {**tool("p", "t", 200), "tool": {}}
    fails(
        write(tmp_path, [*base, no_id], "n.jsonl"), r":3: tool_end record is missing tool_call_id"
    )
