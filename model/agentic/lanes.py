"""Agent lanes: the client side of an agentic replay. Each lane is a SimPy process that replays
one play at a time; warmup and the continuous profile are phases around them (reference §7).

* **No lanes** (`agentic_lanes: null`): every play starts at its authored time (the corpus's
  earliest start is 0), all at once.
* **Lanes** L: lane l replays plays one after the other, starting the next one the instant the
  current one settles, each rebased so its earliest authored start is the lane's start time.
  `shared_queue` (the default) gives a lane whose play settles the next unstarted play, in
  play order (what Dynamo 1.6.1's mocker does, observed); `stride` gives lane l the plays l,
  l + L, l + 2L, ... (no stealing). A snapshot fixes the slots in advance (lane l's k-th play
  is play k L + l, cut at its own (l, k)), whichever rule is set.
* **Snapshot**: every play instance is cut at its seeded t* (`servesim.agentic.snapshot`); play
  instances get fresh ids and their own hash-id space (lanes never share cache by accident).
* **Warmup**: per lane, one after the other with no idle time, each primer (the full input of a
  live conversation's last historical request, 1 output token), then 10 one-token requests
  cycling through the primer inputs (the earliest live request's when there are none); lanes
  prepare concurrently. The barrier opens when every preparation request completed with exactly
  one token and the cluster holds no request; the profile then starts every lane's first play at
  the barrier time. A failed preparation request aborts the run.
* **Profile**: lanes recycle (after its first, snapshot-cut play, a lane takes the next play of
  a shared wrapping cursor, uncut, with a fresh identity) until `duration_seconds` after the
  profile start; in-flight requests may finish during `response_grace_seconds`; what is left is
  then canceled (instantly offline, so the cancel drain never times out) and the run ends.
  A play idle (nothing in flight) with its next timer more than `tree_idle_cap_seconds` away has
  its timers pulled in to that cap; the whole workload idle with its next timer more than
  `global_idle_cap_seconds` away has every play's timers pulled in.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import simpy

from servesim.agentic.play import NodeRun, PlayRun
from servesim.agentic.snapshot import (
    PlayPlan,
    full_plan,
    graph_digest,
    play_origin,
    snapshot_plan,
    snapshot_record,
)
from servesim.clock import AGENTIC_RELEASE, at_time
from servesim.cluster.base import ClusterBase
from servesim.config.schema import AgenticOptions
from servesim.metrics.recorder import COMPLETED, INCOMPLETE, Recorder
from servesim.workload.agentic_graph import AgenticGraph, Node
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request

WARMUP_REQUESTS_PER_LANE = 10
PHASES_SCHEMA = "servesim.agentic.phases.v1"
BARRIER = "all_preparation_succeeded_and_server_quiescent"
REPLAY, PROFILE, PRIMER, WARMUP = "replay", "profile", "primer", "warmup"


class AgenticReplay:
    """Lanes, plays and phases over one validated graph, dispatching into a cluster."""

    def __init__(
        self,
        env: simpy.Environment,
        graph: AgenticGraph,
        options: AgenticOptions,
        hasher: BlockHasher,
        recorder: Recorder,
        cluster: ClusterBase,
        speedup: float = 1.0,
    ) -> None:
        self.env = env
        self.graph = graph
        self.options = options
        self.hasher = hasher
        self.recorder = recorder
        self.cluster = cluster
        self.speedup = speedup
        self.lane_assignment = options.agentic_lane_assignment
        self.lanes = options.agentic_lanes
        self.digest = graph_digest(graph)
        # the order lanes take plays in: the source's play ordinals, else play ids sorted
        # (what Dynamo 1.6.1's mocker does, checked on renamed and reordered plays)
        self.plays = (
            graph.plays
            if graph.ordered_by_source
            else tuple(sorted(graph.plays, key=lambda p: p.play_id))
        )
        self.runs: list[PlayRun] = []
        self.active: set[PlayRun] = set()
        self.client_in_flight = 0
        self.n_requests = 0
        self.request_rows: list[tuple[str, str, str, int | None, str]] = []
        self.snapshots: list[dict[str, Any]] = []
        self._turns = {
            n.request_id: k for play in graph.plays for k, n in _session_turns(play.nodes)
        }
        self._cursor = 0  # shared queue / profile corpus cursor (plays handed out)
        self._open = True
        self.finished: simpy.Event | None = None  # fires when a profile ends the run
        self.phase = REPLAY if options.agentic_profile is None else PROFILE
        self.profile_start_ms = 0.0
        self.prep_lanes: list[dict[str, Any]] = []
        self.prep_requests: list[dict[str, Any]] = []
        self.prep_failure: tuple[str, str] | None = None
        self.barrier_ms: float | None = None
        self.profile: dict[str, Any] | None = None
        self.idle_shifts: list[dict[str, Any]] = []
        self._drained: simpy.Event | None = None
        self._released: list[tuple[str, int, PlayRun, NodeRun]] = []
        self._flush_armed = False

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Schedule the whole replay (call once, before the environment runs)."""
        opts = self.options
        if opts.agentic_profile is not None:
            self.finished = self.env.event()
        if self.lanes is None:
            origin = min(play_origin(p) for p in self.plays)
            for play in self.plays:
                plan = full_plan(play, origin, self.speedup)
                self._start_run(plan, play.play_id, None, 0, None).start(0.0)
            return
        firsts = [self._plan(lane, 0) for lane in range(self.lanes)]
        if opts.agentic_warmup:
            self.env.process(self._prepare(firsts))
        else:
            self._open_phase(0.0, firsts)

    def _open_phase(self, t0_ms: float, firsts: list[tuple[PlayPlan, str, Any] | None]) -> None:
        self.profile_start_ms = t0_ms
        if self.options.agentic_profile is not None:
            self.env.process(self._profile_clock(t0_ms))
        for lane, first in enumerate(firsts):
            self.env.process(self._lane(lane, first))

    def _lane(
        self, lane: int, first: tuple[PlayPlan, str, Any] | None
    ) -> Generator[simpy.Event, Any, None]:
        ordinal = 0
        got = first
        while got is not None and self._open:
            plan, instance, salt = got
            run = self._start_run(plan, instance, lane, ordinal, salt)
            run.start(self.env.now)
            yield run.settled
            ordinal += 1
            got = self._plan(lane, ordinal) if self._open else None

    def _plan(self, lane: int, ordinal: int) -> tuple[PlayPlan, str, Any] | None:
        """The play lane `lane` replays as its `ordinal`-th, or None when it has no more."""
        plays = self.plays
        n = len(plays)
        opts = self.options
        assert self.lanes is not None
        if opts.agentic_profile is not None and ordinal > 0:
            play = plays[self._cursor % n]  # recycled: uncut, fresh identity
            self._cursor += 1
            instance = f"{play.play_id}@lane{lane}.{ordinal}"
            return full_plan(play, play_origin(play), self.speedup), instance, instance
        if opts.agentic_profile is not None:
            slot = lane  # the first play of every lane is cut, as in the reference
            self._cursor = max(self._cursor, self.lanes)
        elif self.lane_assignment == "shared_queue" and opts.agentic_snapshot is None:
            slot = self._cursor
            self._cursor += 1
        else:
            slot = ordinal * self.lanes + lane
        if slot >= n and opts.agentic_profile is None:
            return None
        play = plays[slot % n]
        snap = opts.agentic_snapshot
        if snap is None:
            return full_plan(play, play_origin(play), self.speedup), play.play_id, None
        instance = f"{play.play_id}@lane{lane}.{ordinal}"
        key = (snap.seed, self.digest, lane, ordinal)
        plan = snapshot_plan(play, *key, self.speedup, self.graph.path)
        self.snapshots.append(snapshot_record(plan, *key, instance))
        return plan, instance, instance

    def _start_run(
        self, plan: PlayPlan, instance: str, lane: int | None, ordinal: int, salt: Any
    ) -> PlayRun:
        run = PlayRun(self, plan, instance, lane, ordinal, salt, self.phase)
        self.runs.append(run)
        self.active.add(run)
        return run

    # ------------------------------------------------------------------ requests

    def admission_open(self) -> bool:
        return self._open

    def _request(
        self,
        node: Node,
        salt: Any,
        request_id: str,
        play: str,
        lane: int | None,
        phase: str,
        output_length: int | None = None,
    ) -> Request:
        ids = node.hash_ids if salt is None else [(salt, h) for h in node.hash_ids]
        prompt = self.hasher.prompt_hashes(ids, node.input_length, self.graph.block_size)
        session = node.session_id
        if salt is not None and session is not None:
            session = f"{salt}/{session}"
        req = Request(
            self.n_requests,
            request_id,
            node.input_length,
            node.output_length if output_length is None else output_length,
            prompt,
            session_id=session,
            turn_index=self._turns[node.request_id],
        )
        if self.hasher.keep_canonical_ids:
            req.canonical_ids = (self.hasher.canonical(ids), self.graph.block_size)
        self.n_requests += 1
        self.request_rows.append((request_id, play, node.request_id, lane, phase))
        return req

    def make_request(self, run: PlayRun, nr: NodeRun) -> Request:
        node = nr.live.node
        rid = node.request_id if run.salt is None else f"{run.instance_id}/{node.request_id}"
        return self._request(node, run.salt, rid, run.instance_id, run.lane, run.phase)

    def release(self, run: PlayRun, nr: NodeRun) -> None:
        """`nr` of `run` is due now: dispatch it with the instant's other releases."""
        node = nr.live.node
        key = node.request_id if run.salt is None else f"{run.instance_id}/{node.request_id}"
        self._released.append((key, len(self._released), run, nr))
        if not self._flush_armed:
            self._flush_armed = True
            at_time(self.env, self.env.now, AGENTIC_RELEASE).callbacks.append(self._flush)

    def _flush(self, _ev: Any) -> None:
        batch = sorted(self._released, key=lambda r: (r[0], r[1]))
        self._released = []
        self._flush_armed = False
        for _, _, run, nr in batch:
            run.dispatch(nr)

    def dispatch(self, req: Request) -> None:
        self.client_in_flight += 1
        self.cluster.dispatch(req)

    def client_ended(self, run: PlayRun) -> None:
        self.client_in_flight -= 1
        drained = self._drained
        if not self._open and not self.client_in_flight and drained and not drained.triggered:
            drained.succeed()
        if self.options.agentic_profile is not None and self._open and run.outstanding == 0:
            self._idle_guard(run)

    def play_settled(self, run: PlayRun) -> None:
        self.active.discard(run)

    # ------------------------------------------------------------------ warmup

    def _prepare(
        self, firsts: list[tuple[PlayPlan, str, Any] | None]
    ) -> Generator[simpy.Event, Any, None]:
        self.phase = PRIMER
        procs = [
            self.env.process(self._prepare_lane(lane, got))
            for lane, got in enumerate(firsts)
            if got is not None
        ]
        yield simpy.AllOf(self.env, procs)
        if self.prep_failure is not None:
            self.phase = "aborted"
            self._open = False
            if self.finished is not None:  # a profile's run waits for it
                self.finished.succeed()
            return
        assert not self.cluster.n_in_flight, "preparation ended, yet the cluster holds requests"
        self.barrier_ms = self.env.now
        self.phase = REPLAY if self.options.agentic_profile is None else PROFILE
        self._open_phase(self.env.now, firsts)

    def _prepare_lane(
        self, lane: int, got: tuple[PlayPlan, str, Any]
    ) -> Generator[simpy.Event, Any, None]:
        plan, instance, salt = got
        primers = list(plan.primers)
        sources = primers or [min(plan.live, key=lambda ln: (ln.base_ms, ln.node.line)).node]
        todo = [(PRIMER, p, f"{instance}/primer:{p.request_id}") for p in primers]
        todo += [
            (WARMUP, sources[j % len(sources)], f"{instance}/warmup:{j}")
            for j in range(WARMUP_REQUESTS_PER_LANE)
        ]
        rec: dict[str, Any] = {
            "lane_id": lane,
            "play_id": instance,
            "primers_expected": len(primers),
            "primers_completed": 0,
            "warmup_expected": WARMUP_REQUESTS_PER_LANE,
            "warmup_completed": 0,
            "requests_quiescent": False,
        }
        self.prep_lanes.append(rec)
        for phase, node, rid in todo:
            if self.prep_failure is not None:
                return  # the first failure aborts every lane
            req = self._request(node, salt, rid, instance, lane, phase, output_length=1)
            req.done = self.env.event()
            dispatched = self.env.now
            self.cluster.dispatch(req)
            yield req.done
            ok = req.terminal_status == COMPLETED and req.num_output_tokens == 1
            bs = self.hasher.block_size
            self.prep_requests.append(
                {
                    "uuid": rid,
                    "phase": phase,
                    "lane_id": lane,
                    "source_request_id": node.request_id,
                    "identity": instance,
                    "input_length": node.input_length,
                    "max_output_tokens": 1,
                    "expected_full_block_tokens": node.input_length // bs * bs,
                    "dispatched_at_ms": dispatched,
                    "terminal_status": req.terminal_status,
                    "causal_terminal_at_ms": req.terminal_ms,
                    "quiescent_at_ms": req.terminal_ms,
                    "first_admit_ms": req.first_admit_ms,
                    "first_admission_reused_input_tokens": req.first_admission_reused_tokens,
                    "observed_output_tokens": req.num_output_tokens,
                }
            )
            if not ok:
                self.prep_failure = (
                    rid,
                    req.reason or f"{req.terminal_status}, {req.num_output_tokens} output tokens",
                )
                return
            rec["primers_completed" if phase == PRIMER else "warmup_completed"] += 1
        rec["requests_quiescent"] = True

    # ------------------------------------------------------------------ profile

    def _profile_clock(self, t0_ms: float) -> Generator[simpy.Event, Any, None]:
        prof = self.options.agentic_profile
        assert prof is not None and self.finished is not None
        cutoff = t0_ms + prof.duration_seconds * 1000.0
        grace = cutoff + prof.response_grace_seconds * 1000.0
        drain = grace + prof.cancel_drain_seconds * 1000.0
        self.profile = {
            "options": prof.model_dump(),
            "profile_start_ms": t0_ms,
            "admission_cutoff_ms": cutoff,
            "response_grace_deadline_ms": grace,
            "cancel_drain_deadline_ms": drain,
        }
        yield self.env.timeout(cutoff - self.env.now)
        self._open = False
        for run in list(self.active):
            run._check_settled()  # nothing in flight: incomplete at the cutoff
        if self.client_in_flight:
            self._drained = self.env.event()
            yield simpy.AnyOf(self.env, [self.env.timeout(grace - self.env.now), self._drained])
        self.finished.succeed()

    def _idle_guard(self, run: PlayRun) -> None:
        prof = self.options.agentic_profile
        assert prof is not None
        now = self.env.now
        if run in self.active:
            wait = run.next_timer_ms() - now
            cap = prof.tree_idle_cap_seconds * 1000.0
            if math.isfinite(wait) and wait > cap:
                n = run.shift_timers(wait - cap)
                self.idle_shifts.append(
                    {
                        "at_ms": now,
                        "play_id": run.instance_id,
                        "shifted_by_ms": wait - cap,
                        "timer_count": n,
                    }
                )
        if self.client_in_flight or self.cluster.n_in_flight:
            return
        wait = min((r.next_timer_ms() for r in self.active), default=math.inf) - now
        cap = prof.global_idle_cap_seconds * 1000.0
        if math.isfinite(wait) and wait > cap:
            runs = sorted(self.active, key=lambda r: r.instance_id)
            n = sum(r.shift_timers(wait - cap) for r in runs)
            self.idle_shifts.append(
                {"at_ms": now, "play_id": None, "shifted_by_ms": wait - cap, "timer_count": n}
            )

    # ------------------------------------------------------------------ end

    def finalize(self, now_ms: float) -> None:
        """The run is over: unsettled plays become incomplete, and every live node that was
        never dispatched is recorded as an incomplete request naming why."""
        for run in list(self.active):
            run.stop()
        for run in self.runs:
            for nr in run.nodes:
                if nr.req is not None:
                    continue
                if run.failure is not None:
                    why = f"not dispatched: play {run.instance_id} failed at {run.failure[2]}"
                elif self.options.agentic_profile is not None:
                    why = "never issued: the agentic_profile admission window closed"
                else:
                    why = "never dispatched: the run ended before its dependencies resolved"
                req = self.make_request(run, nr)
                self.recorder.request_terminal(req, INCOMPLETE, now_ms, why)


def _session_turns(nodes: tuple[Node, ...]) -> list[tuple[int, Node]]:
    """Each node's position among its session's nodes (file order)."""
    seen: dict[str | None, int] = {}
    out = []
    for n in nodes:
        k = seen.get(n.session_id, 0)
        seen[n.session_id] = k + 1
        out.append((k, n))
    return out
