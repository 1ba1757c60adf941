"""Weka / AgentX agent corpora as a validated agentic graph: each play's recorded LLM calls and
sub-agent runs, lowered to plays of requests joined by typed dependencies (reference §1.4).

**Input.** A `.json` file (one play object), a `.jsonl` file (one play object per non-blank
line), or a directory searched recursively for both, in sorted name order at every level
(other files are ignored; a symlink anywhere below the directory is an error naming it). A play
has `id`, `block_size` (tokens per hash id, equal in every play of the corpus),
`hash_id_scope` (must be `"local"`) and a non-empty `requests` list; `models`, `tool_tokens`,
`system_tokens`, `totals` and unknown keys are ignored. Each entry of `requests` has a `type`:

* `"n"` / `"s"`: an LLM call with `t` (start, seconds), optional `api_time` (seconds; missing
  means unknown, not 0), `in` (input tokens, > 0), `out` (output tokens, >= 0), `model` and
  `hash_ids` (one id per `block_size` tokens, non-negative ints);
* `"subagent"`: a marker with `t`, `agent_id` (unique in its play), optional `duration_ms`,
  `status`, `subagent_type`, and its own `requests` (calls of type n/s only).

**Nested timestamps.** `nested_timestamp_basis="absolute"` reads a sub-agent's call times as
given, `"relative"` adds the marker's `t` to them, `"auto"` picks `"relative"` when any nested
call in the corpus starts before its marker and `"absolute"` otherwise (`"not_applicable"` when
the corpus has no nested calls). The resolved basis is returned beside the graph.

**Lowering** (all delays in ms, floored at 0; a call's end is `t + api_time`, or `t` when its
`api_time` is unknown):

* Top-level calls are split into streams by prefix continuation: a call continues the stream
  whose latest call's recorded `hash_ids` are a prefix of its own (the stream with the most
  recent such call when several qualify), else it starts a new stream. Consecutive calls of a
  stream get a *sequence* edge (completion trigger, delay = next.t - prev end).
* A stream other than the play's first is anchored to the play's first call by a dispatch edge
  with the start-to-start gap (relation *replay_barrier*), so a replayed play starts as a whole.
* A sub-agent's first call is spawned from the latest top-level call before its marker in the
  play's `requests`: dispatch trigger with the start-to-start gap when it started before that
  call ended, else completion trigger with the gap after that end (relation *spawn*). Its
  other calls chain by sequence edges, in order.
* A sub-agent is *blocking* when its `status` is `"completed"`, it has a `duration_ms`, and a
  later top-level call (after the marker in `requests`) starts at or after its end, marker
  `t + duration_ms`. The first such call gets a *join* edge from the sub-agent's last call
  (completion trigger, delay = that call's t - the sub-agent's end). A blocking sub-agent whose
  calls end after its end (its `duration_ms` understates them) is an error. Other sub-agents
  run in the background: nothing waits for them.

Every edge points from an earlier entry of the play to a later one, so plays are acyclic by
construction (and checked).

**Nodes.** Top-level calls are `{play}:{k}` (k counts the play's top-level calls from 0) in
sessions `{play}:main` (the first stream) and `{play}:stream{j}`; a sub-agent's calls are
`{play}:{agent_id}:{k}` in session `{play}:{agent_id}`. Every node keeps its recorded start as
`not_before_ms` and `recorded_start_ms`: `(t - earliest call t of the corpus) x 1000`;
`recorded_api_time_ms` is `api_time x 1000` when recorded. Times are rounded to the nanosecond
(6 decimals of a ms) so second-based sums do not carry float noise into the graph.

**Hash ids.** `"local"` scope means a hash id names content within its play only (a parent and
its sub-agents share one namespace; two plays do not), so ids are interned per play: the pair
(play, id) gets a dense int in order of first appearance over the corpus. A call whose list is
shorter than `ceil(in / block_size)` is extended with fresh ids that no other call has, so its
unrecorded tail blocks are distinct content; stream detection uses the recorded lists.

The whole corpus is read and checked before the graph is returned. Every problem is a
`TraceError` naming the file and line, and the play and request entry where that helps.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servesim.workload.agentic_graph import (
    AgenticGraph,
    Dependency,
    Node,
    Play,
    check_acyclic,
    index_nodes,
)
from servesim.workload.errors import TraceError, existing, read_utf8
from servesim.workload.json_lines import read_json_lines
from servesim.workload.mooncake import _int, _ms

__all__ = ["NESTED_TIMESTAMP_BASES", "read_weka"]

NESTED_TIMESTAMP_BASES = ("auto", "absolute", "relative")
CALL_TYPES = ("n", "s")
SUFFIXES = (".json", ".jsonl")
# tolerance when comparing second-based times that came through float sums
_EPS_S = 1e-9


@dataclass(frozen=True, slots=True)
class _Call:
    where: str
    t: float  # s
    api_time: float | None  # s; None: not recorded
    input_length: int
    output_length: int
    model: str
    hash_ids: tuple[int, ...]  # as recorded (play-local ids)

    @property
    def end(self) -> float:
        return self.t + (self.api_time or 0.0)


@dataclass(frozen=True, slots=True)
class _Subagent:
    where: str
    t: float  # s
    agent_id: str
    duration_ms: float | None
    status: str | None
    calls: tuple[_Call, ...]


@dataclass(frozen=True, slots=True)
class _Play:
    file: Path
    line: int
    where: str  # "file:line: play id"
    play_id: str
    block_size: int
    entries: tuple[_Call | _Subagent, ...]


# --------------------------------------------------------------------------- reader


def read_weka(
    path: str | Path, trace_block_size: int | None = None, nested_timestamp_basis: str = "auto"
) -> tuple[AgenticGraph, str]:
    """Read, lower and validate a Weka corpus (file or directory); returns the graph and the
    resolved nested timestamp basis ("absolute", "relative" or "not_applicable")."""
    if nested_timestamp_basis not in NESTED_TIMESTAMP_BASES:
        raise TraceError(
            f"nested_timestamp_basis must be one of {list(NESTED_TIMESTAMP_BASES)}, "
            f"got {nested_timestamp_basis!r}"
        )
    if trace_block_size is not None and (
        isinstance(trace_block_size, bool)
        or not isinstance(trace_block_size, int)
        or trace_block_size <= 0
    ):
        raise TraceError(f"trace_block_size must be a positive integer, got {trace_block_size!r}")
    root = Path(path)
    files = _corpus_files(root)
    plays = [_parse_play(file, line, obj) for file in files for line, obj in _play_objects(file)]
    if not plays:
        raise TraceError(f"trace file {root} did not contain any requests")
    block_size = _check_plays(plays)
    if trace_block_size is not None and trace_block_size != block_size:
        raise TraceError(
            f"trace_block_size {trace_block_size} does not match the Weka corpus block size "
            f"{block_size} ({plays[0].where})"
        )
    basis = _resolve_basis(plays, nested_timestamp_basis)
    if basis == "relative":
        plays = [_shift_nested(p) for p in plays]

    t0 = min(
        c.t
        for p in plays
        for e in p.entries
        for c in (e.calls if isinstance(e, _Subagent) else (e,))
    )
    interner = _Interner()
    lowered = [Play(p.play_id, i, _lower_play(p, i, t0, interner)) for i, p in enumerate(plays)]
    nodes = [n for p in lowered for n in p.nodes]
    by_id = index_nodes(root, nodes)
    for source, play in zip(plays, lowered, strict=True):
        check_acyclic(source.file, play.play_id, play.nodes, by_id)
    graph = AgenticGraph(
        plays=tuple(lowered),
        block_size=block_size,
        path=str(root),
        variant="weka",
        source={
            "format": "weka",
            "files": [str(f) for f in files],
            "digest": _digest(root, files),
            "nested_timestamp_basis": basis,
        },
        hash_id_scope="local",
        source_models=tuple(sorted({n.model for n in nodes if n.model is not None})),
        _by_id=by_id,
    )
    return graph, basis


def _corpus_files(root: Path) -> list[Path]:
    if not root.is_dir():
        return [existing(root)]
    files: list[Path] = []
    _walk(root, files)
    if not files:
        raise TraceError(f"Weka corpus {root} contains no .json or .jsonl files")
    return files


def _walk(folder: Path, out: list[Path]) -> None:
    # sorted by name at every level, depth first: the same corpus always reads in one order
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.is_symlink():
            raise TraceError(f"Weka corpus contains a symlink, which is not followed: {entry}")
        if entry.is_dir():
            _walk(entry, out)
        elif entry.is_file() and entry.suffix in SUFFIXES:
            out.append(existing(entry))  # one that cannot be read is named, with why


def _play_objects(file: Path) -> list[tuple[int, dict[str, Any]]]:
    if file.suffix == ".jsonl":
        return read_json_lines(file)
    text = read_utf8(file)
    if not text.strip():
        return []
    line = text[: len(text) - len(text.lstrip())].count("\n") + 1  # where the object starts
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{file}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{file}:{line}: expected a play object, got {type(obj).__name__}")
    return [(line, obj)]


def _digest(root: Path, files: list[Path]) -> str:
    """SHA-256 over each file's name (relative to a directory corpus) and bytes, in order."""
    h = hashlib.sha256()
    for f in files:
        name = f.relative_to(root).as_posix() if root.is_dir() else f.name
        h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- parsing


def _required(obj: dict[str, Any], key: str, where: str) -> Any:
    value = obj.get(key)
    if value is None:
        raise TraceError(f"{where}: missing {key}")
    return value


def _name(value: Any, key: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        raise TraceError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return str(value)


def _seconds(value: Any, key: str, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise TraceError(f"{where}: {key} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _parse_play(file: Path, line: int, obj: dict[str, Any]) -> _Play:
    at = f"{file}:{line}"
    play_id = _name(_required(obj, "id", f"{at}: play"), "id", f"{at}: play")
    where = f"{at}: play {play_id}"
    block_size = _required(obj, "block_size", where)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise TraceError(f"{where}: block_size must be a positive integer, got {block_size!r}")
    scope = _required(obj, "hash_id_scope", where)
    if scope != "local":
        raise TraceError(f"{where}: hash_id_scope must be 'local', got {scope!r}")
    requests = _required(obj, "requests", where)
    if not isinstance(requests, list):
        raise TraceError(f"{where}: requests must be a list")
    if not requests:
        raise TraceError(f"{where}: requests is empty")
    entries = tuple(
        _parse_entry(e, f"{where} requests[{i}]", False) for i, e in enumerate(requests)
    )
    agents: dict[str, str] = {}
    for e in entries:
        if isinstance(e, _Subagent):
            if e.agent_id in agents:
                raise TraceError(
                    f"{e.where}: duplicate agent_id {e.agent_id} (first at {agents[e.agent_id]})"
                )
            agents[e.agent_id] = e.where
    return _Play(file, line, where, play_id, block_size, entries)


def _parse_entry(obj: Any, where: str, nested: bool) -> _Call | _Subagent:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a request object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind in CALL_TYPES:
        return _parse_call(obj, where)
    if kind == "subagent" and not nested:
        return _parse_subagent(obj, where)
    expected = "'n' or 's' (a sub-agent's requests)" if nested else "'n', 's' or 'subagent'"
    raise TraceError(f"{where}: unknown request type {kind!r} (expected {expected})")


def _parse_call(obj: dict[str, Any], where: str) -> _Call:
    t = _seconds(_required(obj, "t", where), "t", where)
    api = obj.get("api_time")
    api_time = None if api is None else _seconds(api, "api_time", where)
    input_length = _int(_required(obj, "in", where), "in", where, 1)
    output_length = _int(_required(obj, "out", where), "out", where, 0)
    model = _name(_required(obj, "model", where), "model", where)
    hash_ids = _required(obj, "hash_ids", where)
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hash_ids
    ):
        raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
    return _Call(where, t, api_time, input_length, output_length, model, tuple(hash_ids))


def _parse_subagent(obj: dict[str, Any], where: str) -> _Subagent:
    t = _seconds(_required(obj, "t", where), "t", where)
    agent_id = _name(_required(obj, "agent_id", where), "agent_id", where)
    where = f"{where} (sub-agent {agent_id})"
    duration = obj.get("duration_ms")
    duration_ms = None if duration is None else _ms(duration, "duration_ms", where)
    status = obj.get("status")
    if status is not None and not isinstance(status, str):
        raise TraceError(f"{where}: status must be a string, got {status!r}")
    kind = obj.get("subagent_type")
    if kind is not None and not isinstance(kind, str):
        raise TraceError(f"{where}: subagent_type must be a string, got {kind!r}")
    requests = _required(obj, "requests", where)
    if not isinstance(requests, list):
        raise TraceError(f"{where}: requests must be a list")
    calls = []
    for j, e in enumerate(requests):
        call = _parse_entry(e, f"{where} requests[{j}]", True)
        assert isinstance(call, _Call)
        calls.append(call)
    return _Subagent(where, t, agent_id, duration_ms, status, tuple(calls))


def _check_plays(plays: list[_Play]) -> int:
    """The corpus block size; plays must agree on it and have distinct ids."""
    first = plays[0]
    seen: dict[str, str] = {}
    for p in plays:
        if p.block_size != first.block_size:
            raise TraceError(
                f"{p.where}: Weka corpus mixes block sizes: block_size {p.block_size} here, "
                f"{first.block_size} in {first.where}"
            )
        if p.play_id in seen:
            raise TraceError(
                f"{p.where}: duplicate play id {p.play_id} (first at {seen[p.play_id]})"
            )
        seen[p.play_id] = p.where
    return first.block_size


def _resolve_basis(plays: list[_Play], basis: str) -> str:
    if basis != "auto":
        return basis
    nested = [(s, c) for p in plays for s in p.entries if isinstance(s, _Subagent) for c in s.calls]
    if not nested:
        return "not_applicable"
    return "relative" if any(c.t < s.t for s, c in nested) else "absolute"


def _shift_nested(play: _Play) -> _Play:
    entries = tuple(
        replace(e, calls=tuple(replace(c, t=c.t + e.t) for c in e.calls))
        if isinstance(e, _Subagent)
        else e
        for e in play.entries
    )
    return replace(play, entries=entries)


# --------------------------------------------------------------------------- lowering


class _Interner:
    """Dense graph hash ids: (play, recorded id) pairs in order of first appearance, and fresh
    ids for blocks a call's list did not cover, from one counter so they never collide."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, int], int] = {}
        self._next = 0

    def local(self, play: int, hash_id: int) -> int:
        key = (play, hash_id)
        if key not in self._ids:
            self._ids[key] = self.fresh()
        return self._ids[key]

    def fresh(self) -> int:
        self._next += 1
        return self._next - 1


def _ms_between(later_s: float, earlier_s: float) -> float:
    """A recorded gap in ms, floored at 0 (an edge never releases before its trigger)."""
    return round(max(0.0, later_s - earlier_s) * 1000.0, 6)


def _lower_play(play: _Play, ordinal: int, t0: float, interner: _Interner) -> tuple[Node, ...]:
    pid = play.play_id
    first_call = next((e for e in play.entries if isinstance(e, _Call)), None)
    if first_call is None:
        raise TraceError(f"{play.where}: play has no parent requests (only sub-agent markers)")

    def node(rid: str, session: str, call: _Call, deps: list[Dependency]) -> Node:
        ids = [interner.local(ordinal, h) for h in call.hash_ids]
        needed = -(-call.input_length // play.block_size)
        ids.extend(interner.fresh() for _ in range(len(ids), needed))
        start_ms = _ms_between(call.t, t0)
        return Node(
            request_id=rid,
            session_id=session,
            model=call.model,
            input_length=call.input_length,
            output_length=call.output_length,
            hash_ids=tuple(ids),
            not_before_ms=start_ms,
            dependencies=tuple(deps),
            play_id=pid,
            line=play.line,
            recorded_start_ms=start_ms,
            recorded_api_time_ms=None if call.api_time is None else round(call.api_time * 1e3, 6),
        )

    nodes: list[Node] = []
    # each stream's latest call: (request id, call, its top-level index k)
    streams: list[tuple[str, _Call, int]] = []
    parent: tuple[str, _Call] | None = None  # the latest top-level call so far
    # sub-agents that may join back: (marker, id of its last call, its end in s)
    waiting: list[tuple[_Subagent, str, float]] = []
    k = 0
    for entry in play.entries:
        if isinstance(entry, _Call):
            rid = f"{pid}:{k}"
            deps: list[Dependency] = []
            continued = [
                j
                for j, (_, tail, _) in enumerate(streams)
                if entry.hash_ids[: len(tail.hash_ids)] == tail.hash_ids
            ]
            if continued:
                j = max(continued, key=lambda j: streams[j][2])
                prev_rid, prev, _ = streams[j]
                deps.append(
                    Dependency(prev_rid, "completion", _ms_between(entry.t, prev.end), "sequence")
                )
                streams[j] = (rid, entry, k)
            else:
                if streams:  # anchored to the play's first call, `{pid}:0`
                    gap = _ms_between(entry.t, first_call.t)
                    deps.append(Dependency(f"{pid}:0", "dispatch", gap, "replay_barrier"))
                j = len(streams)
                streams.append((rid, entry, k))
            for item in list(waiting):
                sub, last_rid, end = item
                if entry.t >= end - _EPS_S:
                    _check_duration(sub, end)
                    deps.append(
                        Dependency(last_rid, "completion", _ms_between(entry.t, end), "join")
                    )
                    waiting.remove(item)
            session = f"{pid}:main" if j == 0 else f"{pid}:stream{j}"
            nodes.append(node(rid, session, entry, deps))
            parent = (rid, entry)
            k += 1
            continue
        if not entry.calls:
            continue  # nothing of it to replay
        if parent is None:
            raise TraceError(
                f"{entry.where}: sub-agent has no preceding parent request to spawn it"
            )
        session = f"{pid}:{entry.agent_id}"
        parent_rid, parent_call = parent
        child = entry.calls[0]
        if child.t < parent_call.end:
            spawn = Dependency(parent_rid, "dispatch", _ms_between(child.t, parent_call.t), "spawn")
        else:
            spawn = Dependency(
                parent_rid, "completion", _ms_between(child.t, parent_call.end), "spawn"
            )
        prev_rid = ""
        for m, call in enumerate(entry.calls):
            rid = f"{pid}:{entry.agent_id}:{m}"
            if m == 0:
                deps = [spawn]
            else:
                gap = _ms_between(call.t, entry.calls[m - 1].end)
                deps = [Dependency(prev_rid, "completion", gap, "sequence")]
            nodes.append(node(rid, session, call, deps))
            prev_rid = rid
        if entry.status == "completed" and entry.duration_ms is not None:
            waiting.append((entry, prev_rid, entry.t + entry.duration_ms / 1000.0))
    return tuple(nodes)


def _check_duration(sub: _Subagent, end: float) -> None:
    """A joined sub-agent's calls must end by its recorded end, or the join would release
    the parent before the work it waited for."""
    for j, call in enumerate(sub.calls):
        if call.end > end + _EPS_S:
            raise TraceError(
                f"{sub.where}: blocking sub-agent's duration_ms {sub.duration_ms:g} understates "
                f"its requests: requests[{j}] ends {_ms_between(call.end, sub.t):g} ms after "
                f"the marker"
            )
