"""Dynamo request traces (`dynamo.request.trace.v1`, as `DYN_REQUEST_TRACE` writes them) as
replay input: plain Mooncake rows, or an agentic graph of sessions when the requests carry
`agent_context` (reference §1.6).

**Files.** One or more JSONL shards, each optionally gzip-compressed (`.gz`); blank lines are
ignored. A record is `{"schema": "dynamo.request.trace.v1", "event_type": ..., ...}`, or the
same object wrapped as `{"event": {...}}`. By `event_type`:

* `request_end`: one served request. `request` holds `request_id` (unique over all shards),
  optional `model`, `output_tokens` (>= 0), `request_received_ms` (unix ms), optional
  `total_time_ms`, and `replay` = `{trace_block_size, input_length, input_sequence_hashes}`
  (one hash per `trace_block_size` tokens; they must cover `input_length`). Every record, in
  every shard, must have the same `trace_block_size`.
* `tool_end` / `tool_error`: a harness tool call finished (or failed) at `event_time_unix_ms`;
  `agent_context.session_id` is the session that called it and `tool.tool_call_id` names it.
  Used only by agentic traces (below) and ignored by plain ones.
* `request_payload`, `tool_start`: skipped. Any other event type is an error.

**Plain traces.** When no `request_end` record has `agent_context`, the result is a list of
Mooncake `TraceRow`s in received order (ties: shard, then line), `timestamp_ms` = received -
earliest received, no session, `hash_ids` = the input sequence hashes. The list is a
`DynamoRows`, which also carries the trace block size (`trace_block_size_of`).

**Agentic traces.** When every `request_end` record has `agent_context` (a mix is an error),
it is read as `{"session_id": str, "parent_session_id": str (optional), "tool_call_id": str
(optional)}`, at the record's top level beside `request`. A session with a parent is a child
session (a sub-agent); `tool_call_id` on a child names the parent session's tool call that ran
it. All records of a session must agree on these fields, and a named parent must itself have
requests in the trace. Lowering (delays in ms, floored at 0; a request's end is received +
`total_time_ms`, or received when that is missing):

* the requests of one session, in received order, chain by *sequence* edges (completion
  trigger, delay = next received - previous end);
* a child session's first request is *spawned* from its parent session's latest request
  received at or before it (dispatch trigger, delay = the start-to-start gap);
* a child session whose `tool_call_id` has a `tool_end`/`tool_error` record in the parent
  session is *blocking*: the parent's first request received at or after that record's time
  gets a *join* edge from the child's last request (completion trigger, delay = that request's
  received - the child's last end). A child without such a record runs in the background. A
  tool record that ends before its child session's last request ends is an error.

A play is a root session (no parent) with all its descendant sessions; its id is the root's
session id, and plays are in order of their first request. Node ids are the recorded request
ids; every node keeps its received time minus the earliest as `not_before_ms` and
`recorded_start_ms`, and `total_time_ms` as `recorded_api_time_ms`. The hash ids are Dynamo's
sequence hashes, which mean the same content across sessions (`hash_id_scope` "global").

Every problem is a `TraceError` naming the shard and line.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from servesim.workload.agentic_graph import (
    AgenticGraph,
    Dependency,
    Node,
    Play,
    check_acyclic,
    index_nodes,
)
from servesim.workload.errors import TraceError, TraceRow, existing, open_text
from servesim.workload.json_lines import read_json_lines
from servesim.workload.mooncake import _int, _ms, non_negative_ints, parse_row

__all__ = ["SCHEMA", "DynamoRows", "read_dynamo_trace", "trace_block_size_of"]

SCHEMA = "dynamo.request.trace.v1"
TOOL_EVENTS = ("tool_end", "tool_error")
SKIPPED_EVENTS = ("request_payload", "tool_start")


class DynamoRows(list[TraceRow]):
    """The plain rows of a Dynamo trace, with the trace block size their hash ids are in."""

    def __init__(self, rows: Iterable[TraceRow], block_size: int) -> None:
        super().__init__(rows)
        self.block_size = block_size


def trace_block_size_of(rows: list[TraceRow]) -> int:
    """The trace block size of rows `read_dynamo_trace` returned."""
    if not isinstance(rows, DynamoRows):
        raise TraceError("these rows carry no trace block size (they were not read from a trace)")
    return rows.block_size


@dataclass(frozen=True, slots=True)
class _Context:
    session_id: str
    parent_session_id: str | None
    tool_call_id: str | None


@dataclass(frozen=True, slots=True)
class _Request:
    file: Path
    where: str
    order: tuple[float, int, int]  # (received, shard, line): the replay order
    line: int
    request_id: str
    model: str | None
    received_ms: float
    total_time_ms: float | None
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    block_size: int
    context: _Context | None

    @property
    def end_ms(self) -> float:
        return self.received_ms + (self.total_time_ms or 0.0)


@dataclass(frozen=True, slots=True)
class _Tool:
    where: str
    session_id: str
    tool_call_id: str
    end_ms: float


# --------------------------------------------------------------------------- reader


def read_dynamo_trace(
    paths: str | Path | list[str] | list[Path], trace_block_size: int | None = None
) -> AgenticGraph | DynamoRows:
    """Read one or more Dynamo trace shards: an agentic graph when the requests carry
    `agent_context`, else plain Mooncake rows (with their block size)."""
    if trace_block_size is not None and (
        isinstance(trace_block_size, bool)
        or not isinstance(trace_block_size, int)
        or trace_block_size <= 0
    ):
        raise TraceError(f"trace_block_size must be a positive integer, got {trace_block_size!r}")
    given: list[str | Path] = [paths] if isinstance(paths, str | Path) else list(paths)
    if not given:
        raise TraceError("Dynamo trace did not contain any requests (no trace files given)")
    files = [existing(p) for p in given]
    requests: list[_Request] = []
    tools: list[tuple[str, dict[str, Any], dict[str, Any]]] = []  # (where, record, outer)
    for shard, file in enumerate(files):
        for line, outer in _records(file):
            where = f"{file}:{line}"
            record = outer["event"] if isinstance(outer.get("event"), dict) else outer
            schema = record.get("schema", outer.get("schema"))
            if schema != SCHEMA:
                raise TraceError(f"{where}: expected schema {SCHEMA!r}, got {schema!r}")
            kind = record.get("event_type")
            if kind == "request_end":
                requests.append(_parse_request(record, outer, file, shard, line))
            elif kind in TOOL_EVENTS:
                tools.append((where, record, outer))
            elif kind not in SKIPPED_EVENTS:
                raise TraceError(f"{where}: unknown event_type {kind!r}")
    names = ", ".join(str(f) for f in files)
    if not requests:
        raise TraceError(f"trace file {names} did not contain any requests")

    first = requests[0]
    seen: dict[str, str] = {}
    for r in requests:
        if r.block_size != first.block_size:
            raise TraceError(
                f"{r.where}: Dynamo trace mixes block sizes: trace_block_size {r.block_size} "
                f"here, {first.block_size} at {first.where}"
            )
        if r.request_id in seen:
            raise TraceError(
                f"{r.where}: duplicate request_id {r.request_id} (first at {seen[r.request_id]})"
            )
        seen[r.request_id] = r.where
    if trace_block_size is not None and trace_block_size != first.block_size:
        raise TraceError(
            f"trace_block_size {trace_block_size} does not match the trace's block size "
            f"{first.block_size} ({names})"
        )
    agentic = [r for r in requests if r.context is not None]
    plain = [r for r in requests if r.context is None]
    if agentic and plain:
        raise TraceError(
            f"{plain[0].where}: Dynamo trace mixes agentic and plain records: this request has "
            f"no agent_context, the request at {agentic[0].where} has one"
        )

    requests.sort(key=lambda r: r.order)
    t0 = requests[0].received_ms
    if plain:
        rows = (
            TraceRow(
                line=r.line,
                timestamp_ms=round(r.received_ms - t0, 6),
                input_length=r.input_length,
                output_length=r.output_length,
                hash_ids=list(r.hash_ids),
                request_id=r.request_id,
            )
            for r in requests
        )
        return DynamoRows(rows, first.block_size)
    graph_tools = [_parse_tool(record, outer, where) for where, record, outer in tools]
    return _lower(requests, graph_tools, t0, files, names)


def _open(file: Path) -> TextIO:
    """A shard as text, bytes that are not UTF-8 escaped for `read_json_lines` to report by line."""
    if file.suffix == ".gz":
        return gzip.open(file, "rt", encoding="utf-8", errors="surrogateescape")
    return open_text(file)


def _records(file: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        return read_json_lines(file, _open)
    except (OSError, EOFError, zlib.error) as e:  # a truncated or non-gzip .gz shard
        raise TraceError(f"{file}: cannot read the gzip stream ({e})") from None


# --------------------------------------------------------------------------- parsing


def _text(value: Any, key: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        raise TraceError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return str(value)


def _required(obj: dict[str, Any], key: str, where: str, prefix: str) -> Any:
    value = obj.get(key)
    if value is None:
        raise TraceError(f"{where}: {prefix} record is missing {key}")
    return value


def _parse_request(
    record: dict[str, Any], outer: dict[str, Any], file: Path, shard: int, line: int
) -> _Request:
    where = f"{file}:{line}"
    request = record.get("request")
    if not isinstance(request, dict):
        raise TraceError(f"{where}: request_end record has no request object")
    rid = _text(_required(request, "request_id", where, "request_end"), "request_id", where)
    model = request.get("model")
    if model is not None:
        model = _text(model, "model", where)
    received = _ms(
        _required(request, "request_received_ms", where, "request_end"),
        "request_received_ms",
        where,
    )
    total = request.get("total_time_ms")
    total_ms = None if total is None else _ms(total, "total_time_ms", where)
    output = _required(request, "output_tokens", where, "request_end")
    replay = request.get("replay")
    if not isinstance(replay, dict):
        raise TraceError(
            f"{where}: request {rid} has no replay object (trace_block_size, input_length, "
            "input_sequence_hashes)"
        )
    for key in ("trace_block_size", "input_length", "input_sequence_hashes"):
        _required(replay, key, where, f"request {rid} replay")
    block_size = _int(replay["trace_block_size"], "trace_block_size", where, 1)
    hashes = replay["input_sequence_hashes"]
    if not non_negative_ints(hashes):
        raise TraceError(f"{where}: input_sequence_hashes must be a list of non-negative integers")
    row = parse_row(
        {"hash_ids": hashes, "input_length": replay["input_length"], "output_length": output},
        where,
        line,
        block_size,
    )
    return _Request(
        file=file,
        where=where,
        order=(received, shard, line),
        line=line,
        request_id=rid,
        model=model,
        received_ms=received,
        total_time_ms=total_ms,
        input_length=row.input_length,
        output_length=row.output_length,
        hash_ids=tuple(hashes),
        block_size=block_size,
        context=_parse_context(record, outer, where),
    )


def _parse_context(record: dict[str, Any], outer: dict[str, Any], where: str) -> _Context | None:
    ctx = record.get("agent_context", outer.get("agent_context"))
    if ctx is None:
        return None
    if not isinstance(ctx, dict):
        raise TraceError(f"{where}: agent_context must be an object")
    sid = _text(_required(ctx, "session_id", where, "agent_context of the"), "session_id", where)
    optional = {}
    for key in ("parent_session_id", "tool_call_id"):
        value = ctx.get(key)
        optional[key] = None if value is None else _text(value, key, where)
    return _Context(sid, optional["parent_session_id"], optional["tool_call_id"])


def _parse_tool(record: dict[str, Any], outer: dict[str, Any], where: str) -> _Tool:
    kind = record["event_type"]
    ctx = _parse_context(record, outer, where)
    if ctx is None:
        raise TraceError(f"{where}: {kind} record is missing agent_context")
    tool = record.get("tool")
    if not isinstance(tool, dict):
        raise TraceError(f"{where}: {kind} record has no tool object")
    call_id = _text(_required(tool, "tool_call_id", where, kind), "tool_call_id", where)
    end = _ms(_required(record, "event_time_unix_ms", where, kind), "event_time_unix_ms", where)
    return _Tool(where, ctx.session_id, call_id, end)


# --------------------------------------------------------------------------- agentic lowering


def _lower(
    requests: list[_Request], tools: list[_Tool], t0: float, files: list[Path], names: str
) -> AgenticGraph:
    sessions: dict[str, list[_Request]] = {}  # in received order; first-seen session order
    for r in requests:
        assert r.context is not None
        sessions.setdefault(r.context.session_id, []).append(r)
    context: dict[str, _Context] = {}
    for sid, members in sessions.items():
        head = members[0]
        assert head.context is not None
        for r in members[1:]:
            if r.context != head.context:
                raise TraceError(
                    f"{r.where}: session {sid} has agent_context {_shown(r.context)}, but "
                    f"{head.where} gave it {_shown(head.context)}"
                )
        parent = head.context.parent_session_id
        if parent is not None and parent not in sessions:
            raise TraceError(
                f"{head.where}: session {sid} names parent session {parent}, which has no "
                "requests in the trace"
            )
        context[sid] = head.context
    roots = {sid: _root(sid, context, sessions) for sid in sessions}

    by_tool: dict[tuple[str, str], _Tool] = {}
    for tool in tools:
        key = (tool.session_id, tool.tool_call_id)
        if key in by_tool:
            raise TraceError(
                f"{tool.where}: tool call {tool.tool_call_id} of session {tool.session_id} "
                f"already ended at {by_tool[key].where}"
            )
        by_tool[key] = tool

    deps: dict[str, list[Dependency]] = {r.request_id: [] for r in requests}
    for sid, members in sessions.items():
        for prev, r in zip(members, members[1:], strict=False):
            delay = _gap(r.received_ms, prev.end_ms)
            deps[r.request_id].append(Dependency(prev.request_id, "completion", delay, "sequence"))
        ctx = context[sid]
        if ctx.parent_session_id is None:
            continue
        first, last = members[0], members[-1]
        parents = sessions[ctx.parent_session_id]
        before = [p for p in parents if p.received_ms <= first.received_ms]
        if not before:
            raise TraceError(
                f"{first.where}: child session {sid} starts before any request of its parent "
                f"session {ctx.parent_session_id}"
            )
        spawner = before[-1]
        delay = _gap(first.received_ms, spawner.received_ms)
        deps[first.request_id].append(Dependency(spawner.request_id, "dispatch", delay, "spawn"))
        ran: _Tool | None = None
        if ctx.tool_call_id is not None:
            ran = by_tool.get((ctx.parent_session_id, ctx.tool_call_id))
        if ran is None:
            continue  # a background child: nothing waits for it
        if last.end_ms > ran.end_ms:
            raise TraceError(
                f"{ran.where}: tool call {ran.tool_call_id} ends at {ran.end_ms} ms, before "
                f"its child session {sid}'s last request ends at {last.end_ms} ms "
                f"({last.where})"
            )
        consumer = next((p for p in parents if p.received_ms >= ran.end_ms), None)
        if consumer is not None:
            delay = _gap(consumer.received_ms, last.end_ms)
            deps[consumer.request_id].append(
                Dependency(last.request_id, "completion", delay, "join")
            )

    members_of: dict[str, list[Node]] = {}
    for r in requests:
        assert r.context is not None
        start_ms = _gap(r.received_ms, t0)
        play_id = roots[r.context.session_id]
        members_of.setdefault(play_id, []).append(
            Node(
                request_id=r.request_id,
                session_id=r.context.session_id,
                model=r.model,
                input_length=r.input_length,
                output_length=r.output_length,
                hash_ids=r.hash_ids,
                not_before_ms=start_ms,
                dependencies=tuple(deps[r.request_id]),
                play_id=play_id,
                line=r.line,
                recorded_start_ms=start_ms,
                recorded_api_time_ms=r.total_time_ms,
            )
        )
    plays = tuple(Play(pid, i, tuple(ns)) for i, (pid, ns) in enumerate(members_of.items()))
    nodes = [n for p in plays for n in p.nodes]
    # ids are unique and every edge names a request of the trace (checked above, with shard
    # and line), so index_nodes cannot fail here
    by_id = index_nodes(files[0], nodes)
    file_of = {r.request_id: r.file for r in requests}
    for p in plays:  # a cycle is reported in the shard of the play's first request
        check_acyclic(file_of[p.nodes[0].request_id], p.play_id, p.nodes, by_id)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return AgenticGraph(
        plays=plays,
        block_size=requests[0].block_size,
        path=names,
        variant="dynamo",
        source={"format": "dynamo", "files": [str(f) for f in files], "digest": digest.hexdigest()},
        hash_id_scope="global",
        source_models=tuple(sorted({n.model for n in nodes if n.model is not None})),
        _by_id=by_id,
    )


def _gap(later_ms: float, earlier_ms: float) -> float:
    """A recorded gap in ms, floored at 0 (an edge never releases before its trigger)."""
    return round(max(0.0, later_ms - earlier_ms), 6)


def _shown(ctx: _Context | None) -> str:
    assert ctx is not None
    fields = {"session_id": ctx.session_id}
    if ctx.parent_session_id is not None:
        fields["parent_session_id"] = ctx.parent_session_id
    if ctx.tool_call_id is not None:
        fields["tool_call_id"] = ctx.tool_call_id
    return json.dumps(fields)


def _root(sid: str, context: dict[str, _Context], sessions: dict[str, list[_Request]]) -> str:
    """The root session above `sid`; a loop of parents is an error."""
    chain = [sid]
    while (parent := context[chain[-1]].parent_session_id) is not None:
        if parent in chain:
            loop = " -> ".join([*chain[chain.index(parent) :], parent])
            raise TraceError(f"{sessions[sid][0].where}: session parents form a loop ({loop})")
        chain.append(parent)
    return chain[-1]
