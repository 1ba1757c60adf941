"""Snapshot sampling of an agentic play: where a lane cuts into a play, what is history, what is
replayed, and which historical requests prime the cache (reference section 7.2).

For lane l and play ordinal k, the cut is `t* = first + (0.25 + 0.5 u) (last - first)` where
first/last are the play's earliest/latest recorded request starts and `u` in [0, 1) is the top
53 bits of a digest of (schema, seed, graph digest, play id, lane, ordinal). The reference hashes
with BLAKE3; servesim uses BLAKE2b from the standard library, so its cut points are as
deterministic and as uniform but not bit-equal to AISimulate's. Requests that started before t*
are historical (not replayed); a live request keeps its authored gates:
`remaining = max(not_before - t*, over historical predecessors (trigger time + delay - t*))`,
floored at 0, and its live predecessors stay pending dependencies. A request without a recorded
start is placed by the graph: its latest gate, taking a predecessor's end as its start plus its
recorded API time (or its start when that is unknown).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from servesim.workload.agentic_graph import AgenticGraph, Dependency, Node, Play
from servesim.workload.errors import TraceError

SNAPSHOT_SCHEMA = "servesim.agentic.snapshot.v1"
CUT_LOW, CUT_SPAN = 0.25, 0.5


@dataclass(frozen=True, slots=True)
class LiveNode:
    """A node to replay: released `base_ms` after its play instance starts at the earliest,
    and once every dependency in `deps` has fired (times already divided by the speedup)."""

    node: Node
    base_ms: float
    deps: tuple[Dependency, ...]


@dataclass(frozen=True, slots=True)
class PlayPlan:
    """What one play instance replays: its live nodes, and (snapshots) its history and
    primers."""

    play: Play
    live: tuple[LiveNode, ...]
    historical: tuple[Node, ...] = ()
    primers: tuple[Node, ...] = ()
    t_star_ms: float | None = None
    starts: dict[str, float] | None = None  # recorded starts (snapshots), by request id


def graph_digest(graph: AgenticGraph) -> str:
    """SHA-256 of the graph's content (nodes and edges in play order), independent of paths."""
    h = hashlib.sha256()
    for play in graph.plays:
        for n in play.nodes:
            rec = [
                play.play_id,
                n.request_id,
                n.session_id,
                n.input_length,
                n.output_length,
                list(n.hash_ids),
                n.not_before_ms,
                [[d.request_id, d.trigger, d.delay_ms, d.relation] for d in n.dependencies],
            ]
            h.update(json.dumps(rec).encode())
    h.update(str(graph.block_size).encode())
    return h.hexdigest()


def cut_fraction(seed: int, digest: str, play_id: str, lane: int, ordinal: int) -> float:
    """u in [0, 1): the top 53 bits of BLAKE2b(schema, seed, graph digest, play, lane,
    ordinal) over 2^53."""
    key = json.dumps([SNAPSHOT_SCHEMA, seed, digest, play_id, lane, ordinal]).encode()
    top = int.from_bytes(hashlib.blake2b(key, digest_size=16).digest()[:8], "big") >> 11
    return top / float(1 << 53)


def recorded_starts(play: Play) -> dict[str, float]:
    """Each node's recorded start (ms): the source's, else derived from its gates."""
    by_id = {n.request_id: n for n in play.nodes}
    out: dict[str, float] = {}

    def start(n: Node) -> float:
        if n.request_id in out:
            return out[n.request_id]
        if n.recorded_start_ms is not None:
            t = n.recorded_start_ms
        else:
            t = n.not_before_ms or 0.0
            for d in n.dependencies:
                t = max(t, _trigger_time(by_id[d.request_id], d, start) + d.delay_ms)
        out[n.request_id] = t
        return t

    for n in play.nodes:  # the graph is acyclic (checked by the reader)
        start(n)
    return out


def _trigger_time(pred: Node, dep: Dependency, start: Any) -> float:
    t = float(start(pred))
    if dep.trigger == "completion" and pred.recorded_api_time_ms is not None:
        t += pred.recorded_api_time_ms
    return t


def full_plan(play: Play, origin_ms: float, speedup: float) -> PlayPlan:
    """Every node live, authored starts taken relative to `origin_ms`."""
    live = tuple(
        LiveNode(
            n,
            max(0.0, (n.not_before_ms - origin_ms) / speedup) if n.not_before_ms is not None else 0,
            tuple(_scaled(d, speedup) for d in n.dependencies),
        )
        for n in play.nodes
    )
    return PlayPlan(play, live)


def _scaled(d: Dependency, speedup: float) -> Dependency:
    if speedup == 1.0:
        return d
    return Dependency(d.request_id, d.trigger, d.delay_ms / speedup, d.relation)


def play_origin(play: Play) -> float:
    """The earliest authored start of a play (0 when none is authored)."""
    starts = [n.not_before_ms for n in play.nodes if n.not_before_ms is not None]
    return min(starts) if starts else 0.0


def snapshot_plan(
    play: Play, seed: int, digest: str, lane: int, ordinal: int, speedup: float, where: str
) -> PlayPlan:
    """The play cut at its seeded t*: history, live nodes with remaining delays, primers."""
    starts = recorded_starts(play)
    first, last = min(starts.values()), max(starts.values())
    u = cut_fraction(seed, digest, play.play_id, lane, ordinal)
    t_star = first + (CUT_LOW + CUT_SPAN * u) * (last - first)
    historical = {rid for rid, t in starts.items() if t < t_star}
    by_id = {n.request_id: n for n in play.nodes}
    live: list[LiveNode] = []
    for n in play.nodes:
        if n.request_id in historical:
            for d in n.dependencies:
                if d.request_id not in historical:
                    raise TraceError(
                        f"{where}:{n.line}: snapshot boundary crosses a historical request's "
                        f"unresolved dependency: play {play.play_id} request {n.request_id} "
                        f"(before t* = {t_star:.3f} ms) depends on live {d.request_id}"
                    )
            continue
        remaining = (n.not_before_ms - t_star) if n.not_before_ms is not None else 0.0
        deps = []
        for d in n.dependencies:
            if d.request_id in historical:
                trig = _trigger_time(by_id[d.request_id], d, lambda p: starts[p.request_id])
                remaining = max(remaining, trig + d.delay_ms - t_star)
            else:
                deps.append(_scaled(d, speedup))
        live.append(LiveNode(n, max(0.0, remaining) / speedup, tuple(deps)))
    primers = []
    live_sessions = {ln.node.session_id for ln in live}
    for sid in sorted(s for s in live_sessions if s is not None):
        past = [by_id[r] for r in historical if by_id[r].session_id == sid]
        if past:
            primers.append(max(past, key=lambda n: (starts[n.request_id], n.line)))
    hist_nodes = tuple(n for n in play.nodes if n.request_id in historical)
    return PlayPlan(play, tuple(live), hist_nodes, tuple(primers), t_star, starts)


def snapshot_record(
    plan: PlayPlan, seed: int, digest: str, lane: int, ordinal: int, instance_id: str
) -> dict[str, Any]:
    """The `agentic_snapshots` entry of one cut play instance."""
    play = plan.play
    starts = plan.starts if plan.starts is not None else recorded_starts(play)
    live = {ln.node.request_id: ln for ln in plan.live}
    requests = []
    for n in play.nodes:
        ln = live.get(n.request_id)
        end = starts[n.request_id] + (n.recorded_api_time_ms or 0.0)
        requests.append(
            {
                "source_request_id": n.request_id,
                "identity": f"{instance_id}/{n.request_id}",
                "recorded_start_ms": starts[n.request_id],
                "recorded_end_ms": end if n.recorded_api_time_ms is not None else None,
                "historical": ln is None,
                "remaining_delay_ms": None if ln is None else ln.base_ms,
                "pending_dependencies": [] if ln is None else [d.request_id for d in ln.deps],
            }
        )
    return {
        "schema": SNAPSHOT_SCHEMA,
        "graph_digest": digest,
        "seed": seed,
        "lane_id": lane,
        "play_ordinal": ordinal,
        "source_play_id": play.play_id,
        "play_id": instance_id,
        "cache_id": instance_id,
        "t_star_ms": plan.t_star_ms,
        "recorded_start_ms": min(starts.values()),
        "recorded_last_start_ms": max(starts.values()),
        "requests": requests,
        "primers": [
            {
                "source_request_id": p.request_id,
                "request_id": f"{instance_id}/primer:{p.request_id}",
                "conversation_id": p.session_id,
                "input_length": p.input_length,
            }
            for p in plan.primers
        ],
    }
