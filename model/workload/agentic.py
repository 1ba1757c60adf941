"""Agentic Mooncake trace files: read into the validated agentic graph, and written from one.

Two file variants (reference §1.3), told apart by the first non-blank line:

* **v2** starts with a header `{"schema": "dynamo.agentic_mooncake", "version": 2,
  "block_size": B, "hash_id_scope": ..., "source": {...}}`; its `block_size` overrides
  `trace_block_size`. Each row names its `request_id` (globally unique), `play_id`,
  `session_id`, `model`, `input_length`, `output_length`, `hash_ids`, `not_before_ms` (>= 0),
  optional `source_play_ordinal` and `dependencies`: a list of `{request_id, trigger:
  "dispatch"|"completion", delay_ms >= 0, relation: "sequence"|"spawn"|"join"|"replay_barrier"}`.
* **legacy** headerless Mooncake rows with a required `request_id`, `wait_for` (ids that must
  complete first), `delay`/`delay_ms` and `tool_wait_ms`. Lowering: every `wait_for` id becomes a
  completion edge with delay `delay + tool_wait_ms`, relation `join` when there is more than one
  predecessor else `sequence`. Roots start at their `timestamp` (required); dependent rows get no
  authored start. Plays are the connected components of the dependency graph, each labelled by
  its earliest root (smallest timestamp, then file line).

The whole file is read and checked before the graph is returned (this is not a streaming
reader): every problem is a `TraceError` naming the file and line, and the play / request where
that helps. The graph (plays, nodes, typed dependencies) and its checks are
`servesim.workload.agentic_graph`; `servesim.agentic` replays it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from servesim.workload.agentic_graph import (
    RELATIONS,
    TRIGGERS,
    AgenticGraph,
    Dependency,
    Node,
    Play,
    Relation,
    check_acyclic,
    index_nodes,
)
from servesim.workload.errors import TraceError, existing
from servesim.workload.json_lines import read_json_lines
from servesim.workload.mooncake import _ms, parse_row

# the graph's types are named here too, where the reader and writer that use them live
__all__ = [
    "AgenticGraph",
    "Dependency",
    "Node",
    "Play",
    "read_agentic_mooncake",
    "write_agentic_v2",
]

SCHEMA = "dynamo.agentic_mooncake"
SUPPORTED_VERSIONS = (2,)
DEPENDENCY_KEYS = frozenset({"request_id", "trigger", "delay_ms", "relation"})


# --------------------------------------------------------------------------- field helpers


def _text(obj: dict[str, Any], key: str, where: str, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise TraceError(f"{where}: row is missing {key}")
        return None
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        raise TraceError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return str(value)


def _optional_ms(obj: dict[str, Any], key: str, where: str) -> float | None:
    value = obj.get(key)
    return None if value is None else _ms(value, key, where)


# --------------------------------------------------------------------------- reader


def read_agentic_mooncake(path: str | Path, trace_block_size: int = 512) -> AgenticGraph:
    """Read, lower and validate an agentic Mooncake file (v2 with a header, or legacy rows)."""
    if isinstance(trace_block_size, bool) or not isinstance(trace_block_size, int):
        raise TraceError(f"trace_block_size must be an integer, got {trace_block_size!r}")
    if trace_block_size <= 0:
        raise TraceError("trace_block_size must be greater than 0")
    path = existing(path)
    lines = read_json_lines(path)
    if not lines:
        raise TraceError(f"trace file {path} did not contain any requests")
    first_line, first = lines[0]
    if first.get("schema") == SCHEMA:
        return _read_v2(path, first_line, first, lines[1:])
    if "schema" in first:
        raise TraceError(
            f"{path}:{first_line}: unknown schema {first['schema']!r} (expected {SCHEMA!r})"
        )
    return _read_legacy(path, lines, trace_block_size)


def _check_no_header(path: Path, rows: list[tuple[int, dict[str, Any]]]) -> None:
    for line_no, obj in rows:
        if "schema" in obj:
            raise TraceError(
                f"{path}:{line_no}: a v2 header must be the first non-blank line of the file"
            )


def _read_v2(
    path: Path, header_line: int, header: dict[str, Any], rows: list[tuple[int, dict[str, Any]]]
) -> AgenticGraph:
    where = f"{path}:{header_line}"
    version = header.get("version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise TraceError(f"{where}: unknown agentic_mooncake v2 header version {version!r}")
    block_size = header.get("block_size")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise TraceError(f"{where}: v2 header block_size must be a positive integer")
    source = header.get("source")
    if source is not None and not isinstance(source, dict):
        raise TraceError(f"{where}: v2 header source must be an object")
    scope = header.get("hash_id_scope")
    if scope is not None and not isinstance(scope, str):
        raise TraceError(f"{where}: v2 header hash_id_scope must be a string")
    if not rows:
        raise TraceError(
            f"{where}: agentic Mooncake rows did not contain any requests "
            f"(trace file {path} did not contain any requests)"
        )
    _check_no_header(path, rows)

    nodes: list[Node] = []
    ordinals: dict[str, tuple[int | None, int]] = {}  # play -> (source_play_ordinal, line)
    for line_no, obj in rows:
        w = f"{path}:{line_no}"
        rid = _text(obj, "request_id", w)
        play_id = _text(obj, "play_id", w)
        session_id = _text(obj, "session_id", w)
        model = _text(obj, "model", w)
        for key in ("input_length", "output_length", "not_before_ms"):
            if obj.get(key) is None:
                raise TraceError(f"{w}: request {rid} is missing {key}")
        base = parse_row(obj, w, line_no, block_size)
        not_before = obj["not_before_ms"]
        if (
            not isinstance(not_before, bool)
            and isinstance(not_before, int | float)
            and not_before < 0
        ):
            raise TraceError(f"{w}: request {rid} has negative not_before_ms {not_before}")
        not_before_ms = _ms(not_before, "not_before_ms", w)
        ordinal = obj.get("source_play_ordinal")
        if ordinal is not None and (
            isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0
        ):
            raise TraceError(f"{w}: source_play_ordinal must be a non-negative integer")
        assert play_id is not None and rid is not None
        if play_id in ordinals:
            if ordinals[play_id][0] != ordinal:
                raise TraceError(
                    f"{w}: play {play_id} source_play_ordinal {ordinal!r} differs from "
                    f"{ordinals[play_id][0]!r} set at line {ordinals[play_id][1]}"
                )
        else:
            ordinals[play_id] = (ordinal, line_no)
        deps = _v2_dependencies(obj.get("dependencies"), w, rid)
        nodes.append(
            Node(
                request_id=rid,
                session_id=session_id,
                model=model,
                input_length=base.input_length,
                output_length=base.output_length,
                hash_ids=tuple(base.hash_ids),
                not_before_ms=not_before_ms,
                dependencies=deps,
                play_id=play_id,
                line=line_no,
                recorded_start_ms=not_before_ms,
                recorded_api_time_ms=_optional_ms(obj, "recorded_api_time_ms", w),
            )
        )

    by_id = index_nodes(path, nodes)
    for n in nodes:
        for d in n.dependencies:
            pred = by_id[d.request_id]
            if pred.play_id != n.play_id:
                raise TraceError(
                    f"{path}:{n.line}: cross-play dependency: request {n.request_id} in play "
                    f"{n.play_id} depends on {d.request_id} in play {pred.play_id}"
                )

    order = _v2_play_order(path, ordinals)
    members: dict[str, list[Node]] = {pid: [] for pid in order}
    for n in nodes:
        members[n.play_id].append(n)
    plays = tuple(Play(pid, i, tuple(members[pid])) for i, pid in enumerate(order))
    for p in plays:
        check_acyclic(path, p.play_id, p.nodes, by_id)
    return AgenticGraph(
        plays=plays,
        block_size=block_size,
        path=str(path),
        variant="v2",
        version=version,
        source=dict(source) if source is not None else None,
        hash_id_scope=scope,
        source_models=tuple(sorted({n.model for n in nodes if n.model is not None})),
        ordered_by_source=any(v[0] is not None for v in ordinals.values()),
        _by_id=by_id,
    )


def _v2_dependencies(raw: Any, where: str, rid: str) -> tuple[Dependency, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TraceError(f"{where}: request {rid} dependencies must be a list")
    deps: list[Dependency] = []
    seen: set[str] = set()
    for i, dep in enumerate(raw):
        w = f"{where}: request {rid} dependency {i}"
        if not isinstance(dep, dict):
            raise TraceError(f"{w} must be an object")
        unknown = sorted(set(dep) - DEPENDENCY_KEYS)
        if unknown:
            raise TraceError(f"{w} has unknown keys {unknown}")
        pred = _text(dep, "request_id", w)
        assert pred is not None
        trigger = dep.get("trigger")
        if trigger not in TRIGGERS:
            raise TraceError(f"{w} has trigger {trigger!r}, expected one of {list(TRIGGERS)}")
        relation = dep.get("relation")
        if relation not in RELATIONS:
            raise TraceError(f"{w} has relation {relation!r}, expected one of {list(RELATIONS)}")
        if relation == "join" and trigger == "dispatch":
            raise TraceError(f"{w}: invalid Join dependency with Dispatch trigger")
        delay = dep.get("delay_ms", 0)
        if not isinstance(delay, bool) and isinstance(delay, int | float) and delay < 0:
            raise TraceError(f"{w} has negative delay_ms {delay}")
        if pred in seen:
            raise TraceError(f"{w} lists predecessor {pred} twice")
        seen.add(pred)
        deps.append(Dependency(pred, trigger, _ms(delay, "delay_ms", w), relation))
    return tuple(deps)


def _v2_play_order(path: Path, ordinals: dict[str, tuple[int | None, int]]) -> list[str]:
    """Plays in `source_play_ordinal` order when the file sets it (on every play, unique and
    contiguous), else in order of first appearance."""
    used = {pid: v for pid, v in ordinals.items() if v[0] is not None}
    if not used:
        return list(ordinals)
    for pid, (ordinal, line) in ordinals.items():
        if ordinal is None:
            raise TraceError(
                f"{path}:{line}: play {pid} has no source_play_ordinal but other plays do; "
                "set it on every play or none"
            )
    by_ordinal: dict[int, str] = {}
    for pid, (ordinal, line) in ordinals.items():
        assert ordinal is not None
        if ordinal in by_ordinal:
            raise TraceError(
                f"{path}:{line}: play {pid} repeats source_play_ordinal {ordinal} "
                f"of play {by_ordinal[ordinal]}"
            )
        by_ordinal[ordinal] = pid
    low = min(by_ordinal)
    expected = set(range(low, low + len(by_ordinal)))
    if set(by_ordinal) != expected:
        missing = min(expected - set(by_ordinal))
        line = max(line for _, line in ordinals.values())
        raise TraceError(
            f"{path}:{line}: source_play_ordinal values are not contiguous (missing {missing})"
        )
    return [by_ordinal[k] for k in sorted(by_ordinal)]


# --------------------------------------------------------------------------- legacy rows


def _read_legacy(
    path: Path, rows: list[tuple[int, dict[str, Any]]], trace_block_size: int
) -> AgenticGraph:
    _check_no_header(path, rows)
    nodes: list[Node] = []
    for line_no, obj in rows:
        w = f"{path}:{line_no}"
        for key in ("play_id", "dependencies"):
            if key in obj:
                raise TraceError(
                    f"{w}: row sets {key}, which needs a v2 header "
                    f'({{"schema": "{SCHEMA}", "version": 2, ...}}) on the first line'
                )
        rid = _text(obj, "request_id", w)
        assert rid is not None
        base = parse_row(obj, w, line_no, trace_block_size)  # also rejects delay + delay_ms
        wait_for = obj.get("wait_for")
        if wait_for is None:
            wait_for = []
        if not isinstance(wait_for, list) or not all(
            isinstance(x, str | int) and not isinstance(x, bool) and str(x) for x in wait_for
        ):
            raise TraceError(f"{w}: request {rid} wait_for must be a list of request ids")
        preds = [str(x) for x in wait_for]
        if len(set(preds)) != len(preds):
            raise TraceError(f"{w}: request {rid} wait_for lists a request id twice")
        tool = obj.get("tool_wait_ms")
        tool_ms = 0.0 if tool is None else _ms(tool, "tool_wait_ms", w)
        delay = (base.delay_ms or 0.0) + tool_ms
        relation: Relation = "join" if len(preds) > 1 else "sequence"
        deps = tuple(Dependency(p, "completion", delay, relation) for p in preds)
        if not deps and base.timestamp_ms is None:
            raise TraceError(f"{w}: request {rid} has no wait_for and needs a timestamp (ms)")
        nodes.append(
            Node(
                request_id=rid,
                session_id=base.session_id,
                model=_text(obj, "model", w, required=False),
                input_length=base.input_length,
                output_length=base.output_length,
                hash_ids=tuple(base.hash_ids),
                not_before_ms=None if deps else base.timestamp_ms,
                dependencies=deps,
                play_id="",  # assigned below
                line=line_no,
                recorded_start_ms=base.timestamp_ms,
            )
        )

    # plays are connected components (union-find), labelled by their earliest root
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index_nodes(path, nodes)  # duplicate ids and unknown predecessors (plays are not known yet)
    index = {n.request_id: i for i, n in enumerate(nodes)}
    for n in nodes:
        for d in n.dependencies:
            a, b = find(index[n.request_id]), find(index[d.request_id])
            if a != b:
                parent[max(a, b)] = min(a, b)
    components: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        components.setdefault(find(i), []).append(i)

    labelled: list[tuple[tuple[float, int], str, list[Node]]] = []
    for members in components.values():
        roots = [nodes[i] for i in members if not nodes[i].dependencies]
        if roots:
            label_node = min(roots, key=lambda r: (r.not_before_ms or 0.0, r.line))
            start = (label_node.not_before_ms or 0.0, label_node.line)
        else:  # only a cycle has no root; named by its first row for the error below
            label_node = nodes[members[0]]
            start = (math.inf, label_node.line)
        play_nodes = [replace(nodes[i], play_id=label_node.request_id) for i in members]
        labelled.append((start, label_node.request_id, play_nodes))
    labelled.sort(key=lambda t: t[0])
    plays = tuple(Play(pid, i, tuple(ns)) for i, (_, pid, ns) in enumerate(labelled))
    by_id = {n.request_id: n for p in plays for n in p.nodes}
    for p in plays:
        check_acyclic(path, p.play_id, p.nodes, by_id)
    return AgenticGraph(
        plays=plays,
        block_size=trace_block_size,
        path=str(path),
        variant="legacy",
        source_models=tuple(sorted({n.model for n in by_id.values() if n.model is not None})),
        _by_id=by_id,
    )


# --------------------------------------------------------------------------- writer


def write_agentic_v2(graph: AgenticGraph, path: str | Path, model: str = "unspecified") -> Path:
    """Write `graph` as an agentic Mooncake v2 file (header + one row per node, plays in
    order), e.g. a synthetic workload for a peer simulator. A node without an authored start
    gets its play's earliest one, which constrains nothing (its edges gate it later). The
    header's `source` is `{format, digest}` (Dynamo requires both): the graph's own when it was
    read from a v2 file that had them, else the variant and a SHA-256 of the rows."""
    lines = []
    for play in graph.plays:
        starts = [n.not_before_ms for n in play.nodes if n.not_before_ms is not None]
        origin = min(starts) if starts else 0.0
        for n in play.nodes:
            row: dict[str, Any] = {
                "request_id": n.request_id,
                "play_id": play.play_id,
                "session_id": n.session_id or f"{play.play_id}:main",
                "model": n.model or model,
                "input_length": n.input_length,
                "output_length": n.output_length,
                "hash_ids": list(n.hash_ids),
                "not_before_ms": n.not_before_ms if n.not_before_ms is not None else origin,
            }
            if graph.ordered_by_source:  # keep the play order a replay takes
                row["source_play_ordinal"] = play.ordinal
            if n.dependencies:
                row["dependencies"] = [
                    {
                        "request_id": d.request_id,
                        "trigger": d.trigger,
                        "delay_ms": d.delay_ms,
                        "relation": d.relation,
                    }
                    for d in n.dependencies
                ]
            lines.append(json.dumps(row) + "\n")
    source = graph.source
    if not (source and "format" in source and "digest" in source):
        digest = hashlib.sha256("".join(lines).encode()).hexdigest()
        source = {"format": graph.variant, "digest": digest}
    header = {
        "schema": SCHEMA,
        "version": 2,
        "block_size": graph.block_size,
        "hash_id_scope": graph.hash_id_scope or "local",
        "source": source,
    }
    out = Path(path)
    out.write_text(json.dumps(header) + "\n" + "".join(lines), encoding="utf-8")
    return out
