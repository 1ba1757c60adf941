"""Weka / AgentX agent corpora lowered to a validated agentic graph: each play's recorded LLM
calls and sub-agent runs become plays of requests joined by typed dependencies (reference §1.4).

The corpus format (files, play objects, calls, sub-agent markers) and the nested timestamp
basis are read and checked by `servesim.workload.weka_corpus`; what follows is the lowering.

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

from pathlib import Path

from servesim.workload.agentic_graph import (
    AgenticGraph,
    Dependency,
    Node,
    Play,
    check_acyclic,
    index_nodes,
)
from servesim.workload.errors import TraceError
from servesim.workload.weka_corpus import (
    NESTED_TIMESTAMP_BASES,
    Call,
    RecordedPlay,
    Subagent,
    apply_basis,
    corpus_digest,
    read_plays,
)

__all__ = ["NESTED_TIMESTAMP_BASES", "read_weka"]

# tolerance when comparing second-based times that came through float sums
_EPS_S = 1e-9


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
    files, plays, block_size = read_plays(root)
    if trace_block_size is not None and trace_block_size != block_size:
        raise TraceError(
            f"trace_block_size {trace_block_size} does not match the Weka corpus block size "
            f"{block_size} ({plays[0].where})"
        )
    plays, basis = apply_basis(plays, nested_timestamp_basis)

    t0 = min(
        c.t
        for p in plays
        for e in p.entries
        for c in (e.calls if isinstance(e, Subagent) else (e,))
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
            "digest": corpus_digest(root, files),
            "nested_timestamp_basis": basis,
        },
        hash_id_scope="local",
        source_models=tuple(sorted({n.model for n in nodes if n.model is not None})),
        _by_id=by_id,
    )
    return graph, basis


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


def _lower_play(
    play: RecordedPlay, ordinal: int, t0: float, interner: _Interner
) -> tuple[Node, ...]:
    pid = play.play_id
    first_call = next((e for e in play.entries if isinstance(e, Call)), None)
    if first_call is None:
        raise TraceError(f"{play.where}: play has no parent requests (only sub-agent markers)")

    def node(rid: str, session: str, call: Call, deps: list[Dependency]) -> Node:
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
    streams: list[tuple[str, Call, int]] = []
    parent: tuple[str, Call] | None = None  # the latest top-level call so far
    # sub-agents that may join back: (marker, id of its last call, its end in s)
    waiting: list[tuple[Subagent, str, float]] = []
    k = 0
    for entry in play.entries:
        if isinstance(entry, Call):
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


def _check_duration(sub: Subagent, end: float) -> None:
    """A joined sub-agent's calls must end by its recorded end, or the join would release
    the parent before the work it waited for."""
    for j, call in enumerate(sub.calls):
        if call.end > end + _EPS_S:
            raise TraceError(
                f"{sub.where}: blocking sub-agent's duration_ms {sub.duration_ms:g} understates "
                f"its requests: requests[{j}] ends {_ms_between(call.end, sub.t):g} ms after "
                f"the marker"
            )
