"""The agentic workload graph: plays of requests joined by typed dependencies, and its checks.

Every agentic source (agentic Mooncake files, Weka corpora, Dynamo request traces, the
synthetic generator) lowers to this one shape, and `servesim.agentic` replays it. A node is
one authored request; an edge into it says it may be released `delay_ms` after its predecessor
was dispatched ("dispatch" trigger) or reached its client-visible terminal ("completion"). A
play is a connected set of nodes replayed together. The checks here are the ones every source
shares: request ids are unique, every predecessor exists, and no play has a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servesim.workload.errors import TraceError

__all__ = [
    "RELATIONS",
    "TRIGGERS",
    "AgenticGraph",
    "Dependency",
    "Node",
    "Play",
    "Relation",
    "Trigger",
    "check_acyclic",
    "index_nodes",
]

TRIGGERS = ("dispatch", "completion")
RELATIONS = ("sequence", "spawn", "join", "replay_barrier")

Trigger = Literal["dispatch", "completion"]
Relation = Literal["sequence", "spawn", "join", "replay_barrier"]


@dataclass(frozen=True, slots=True)
class Dependency:
    """One edge into a node: it may be released `delay_ms` after the predecessor `request_id`
    was dispatched (trigger "dispatch") or reached its client-visible terminal ("completion")."""

    request_id: str
    trigger: Trigger
    delay_ms: float
    relation: Relation


@dataclass(frozen=True, slots=True)
class Node:
    """One authored request of a play (times in ms, lengths in tokens)."""

    request_id: str
    session_id: str | None
    model: str | None
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    not_before_ms: float | None  # authored earliest start; None: released by dependencies only
    dependencies: tuple[Dependency, ...]
    play_id: str
    line: int  # the file line it came from
    # when the source recorded this request start / how long its call took (ms), if it did;
    # snapshot cuts are placed on these (missing starts are derived from the graph)
    recorded_start_ms: float | None = None
    recorded_api_time_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Play:
    """A connected set of nodes replayed together; `ordinal` is its position in the graph."""

    play_id: str
    ordinal: int
    nodes: tuple[Node, ...]  # in file order


@dataclass(frozen=True, slots=True)
class AgenticGraph:
    """Every play of one agentic trace file, validated, with where it came from."""

    plays: tuple[Play, ...]
    block_size: int  # tokens per hash id (the v2 header's, else trace_block_size)
    path: str
    variant: Literal["v2", "legacy", "weka", "dynamo", "synthetic"]
    version: int | None = None  # the header's version (v2 only)
    source: dict[str, Any] | None = None  # the header's `source` object (v2 only)
    hash_id_scope: str | None = None
    source_models: tuple[str, ...] = ()  # distinct model names seen in rows, sorted
    # v2 files that set source_play_ordinal: `plays` is in that order, which replay keeps
    # (otherwise replay sorts plays by id, as Dynamo does)
    ordered_by_source: bool = False
    _by_id: dict[str, Node] = field(default_factory=dict, repr=False, compare=False)

    def node(self, request_id: str) -> Node:
        return self._by_id[request_id]

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(n for p in self.plays for n in p.nodes)


def index_nodes(path: Path, nodes: list[Node]) -> dict[str, Node]:
    """Nodes by request_id; duplicate ids and unknown predecessors are errors."""
    by_id: dict[str, Node] = {}
    for n in nodes:
        if n.request_id in by_id:
            raise TraceError(
                f"{path}:{n.line}: duplicate request_id {n.request_id} "
                f"(first at line {by_id[n.request_id].line})"
            )
        by_id[n.request_id] = n
    for n in nodes:
        for d in n.dependencies:
            if d.request_id not in by_id:
                play = f" in play {n.play_id}" if n.play_id else ""
                raise TraceError(
                    f"{path}:{n.line}: request {n.request_id}{play} depends on "
                    f"unknown request_id {d.request_id}"
                )
    return by_id


def check_acyclic(
    path: Path, play_id: str, nodes: tuple[Node, ...], by_id: dict[str, Node]
) -> None:
    """Kahn's algorithm; on a cycle, walk predecessors among the leftovers to a node on it."""
    indegree = {n.request_id: len(n.dependencies) for n in nodes}
    children: dict[str, list[str]] = {n.request_id: [] for n in nodes}
    for n in nodes:
        for d in n.dependencies:
            children[d.request_id].append(n.request_id)
    ready = [rid for rid, k in indegree.items() if k == 0]
    while ready:
        rid = ready.pop()
        for child in children[rid]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    left = [n for n in nodes if indegree[n.request_id] > 0]
    if not left:
        return
    walk: list[str] = []
    rid = left[0].request_id
    while rid not in walk:
        walk.append(rid)
        rid = next(d.request_id for d in by_id[rid].dependencies if indegree[d.request_id] > 0)
    cycle = walk[walk.index(rid) :]
    cycle.reverse()  # predecessor -> successor order
    on_cycle = by_id[cycle[0]]
    shown = " -> ".join([*cycle, cycle[0]])
    raise TraceError(
        f"{path}:{on_cycle.line}: cycle detected in play {play_id} at request "
        f"{on_cycle.request_id} ({shown})"
    )
