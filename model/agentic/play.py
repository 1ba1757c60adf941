"""One play instance being replayed: its nodes' release gates, dispatches and terminals, and the
one outcome it settles to (completed, failed or incomplete).

A node is released at `max(instance start + base, over its edges (T_e + delay_e))`, where T_e is
the predecessor's dispatch time (dispatch trigger) or its client-visible terminal (completion
trigger; in P/D the decode terminal). A rejected predecessor fails the play: nothing more of it
is dispatched, and the play settles once every request it did dispatch has ended. A play
settles `completed` when all its live nodes completed, `failed` on a failure (cause: the
earliest failing terminal, then node order), `incomplete` when the replay stopped before it
could finish (undispatched nodes skipped).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Protocol

import simpy

from servesim.agentic.snapshot import LiveNode, PlayPlan
from servesim.clock import ARRIVAL, at_time
from servesim.metrics.recorder import COMPLETED
from servesim.workload.request import Request

RUNNING, COMPLETED_PLAY, FAILED, INCOMPLETE_PLAY = "running", "completed", "failed", "incomplete"


class PlayHost(Protocol):
    """What a play instance asks of the replay that runs it (`lanes.AgenticReplay`): declared
    here so this module needs nothing of the lanes, which create the plays."""

    env: simpy.Environment

    def release(self, run: PlayRun, nr: NodeRun) -> None:
        """`nr` is due now: dispatch it (via `run.dispatch`) with the instant's other releases."""

    def admission_open(self) -> bool:
        """Whether new requests may still be dispatched."""

    def make_request(self, run: PlayRun, nr: NodeRun) -> Request:
        """The request that replays `nr` in `run`."""

    def dispatch(self, req: Request) -> None:
        """Send `req` to the cluster (one more client request in flight)."""

    def client_ended(self, run: PlayRun) -> None:
        """A request of `run` reached its client-visible terminal."""

    def play_settled(self, run: PlayRun) -> None:
        """`run` settled to its outcome."""


class NodeRun:
    """A live node's state in one play instance."""

    __slots__ = (
        "live",
        "ordinal",
        "pending",
        "gate_ms",
        "timer",
        "timer_ms",
        "req",
        "children",
        "state",
    )

    def __init__(self, live: LiveNode, ordinal: int) -> None:
        self.live = live
        self.ordinal = ordinal
        self.pending = len(live.deps)
        self.gate_ms = -math.inf  # the latest edge gate seen so far (absolute sim ms)
        self.timer: Any = None  # the armed release event, if any
        self.timer_ms = math.inf  # when it fires
        self.req: Request | None = None
        self.children: list[tuple[NodeRun, float, str]] = []  # (child, delay ms, trigger)
        self.state = "waiting"  # waiting | timer | ready | dispatched | done | skipped


class PlayRun:
    """Replays one `PlayPlan` from `start_ms` on a lane; `settled` fires with the outcome."""

    def __init__(
        self,
        replay: PlayHost,
        plan: PlayPlan,
        instance_id: str,
        lane: int | None,
        lane_ordinal: int,
        salt: Any,
        phase: str,
    ) -> None:
        self.replay = replay
        self.env: simpy.Environment = replay.env
        self.plan = plan
        self.instance_id = instance_id
        self.lane = lane
        self.lane_ordinal = lane_ordinal
        self.salt = salt
        self.phase = phase
        self.start_ms = math.nan
        self.nodes = [NodeRun(ln, k) for k, ln in enumerate(plan.live)]
        by_id = {nr.live.node.request_id: nr for nr in self.nodes}
        for nr in self.nodes:
            for d in nr.live.deps:
                by_id[d.request_id].children.append((nr, d.delay_ms, d.trigger))
        self.outstanding = 0  # dispatched, not yet terminal
        self.n_done = 0
        self.status = RUNNING
        self.failure: tuple[float, int, str, str] | None = None  # (t, ordinal, request, reason)
        self.failure_status: str | None = None  # the failing request's terminal status
        self.settled_at_ms = math.nan
        self.first_arrival_ms = math.inf
        self.last_terminal_ms = -math.inf
        self.settled: simpy.Event = self.env.event()

    # ------------------------------------------------------------------ release

    def start(self, start_ms: float) -> None:
        self.start_ms = start_ms
        for nr in self.nodes:
            if nr.pending == 0:
                self._arm(nr)
        self._check_settled()

    def _arm(self, nr: NodeRun) -> None:
        t = max(self.env.now, self.start_ms + nr.live.base_ms, nr.gate_ms)
        nr.state = "timer"
        self._set_timer(nr, t)

    def _set_timer(self, nr: NodeRun, t_ms: float) -> None:
        ev = at_time(self.env, t_ms, ARRIVAL)
        nr.timer = ev
        nr.timer_ms = t_ms
        ev.callbacks.append(partial(self._fire, nr))

    def _fire(self, nr: NodeRun, ev: Any) -> None:
        if nr.timer is not ev or nr.state != "timer":
            return  # re-armed earlier (idle shift) or skipped
        nr.timer = None
        nr.state = "ready"
        self.replay.release(self, nr)  # dispatched with the instant's other releases

    def dispatch(self, nr: NodeRun) -> None:
        """Send a released node now, unless the play failed or admission closed meanwhile."""
        if self.status != RUNNING or not self.replay.admission_open():
            nr.state = "skipped"
            self._check_settled()
            return
        req = self.replay.make_request(self, nr)
        nr.req = req
        nr.state = "dispatched"
        self.outstanding += 1
        self.first_arrival_ms = min(self.first_arrival_ms, self.env.now)
        done = self.env.event()
        done.callbacks.append(partial(self._ended, nr))
        req.done = done
        self.replay.dispatch(req)
        for child, delay, trigger in nr.children:
            if trigger == "dispatch":
                self._resolve(child, self.env.now + delay)

    def _resolve(self, child: NodeRun, gate_ms: float) -> None:
        child.gate_ms = max(child.gate_ms, gate_ms)
        child.pending -= 1
        if child.pending == 0 and self.status == RUNNING:
            self._arm(child)

    def _ended(self, nr: NodeRun, _ev: Any = None) -> None:
        req = nr.req
        assert req is not None
        nr.state = "done"
        self.outstanding -= 1
        self.n_done += 1
        now = self.env.now
        self.last_terminal_ms = max(self.last_terminal_ms, now)
        if req.terminal_status != COMPLETED:
            cause = (now, nr.ordinal, req.request_id, req.reason or req.terminal_status)
            if self.failure is None or cause[:2] < self.failure[:2]:
                self.failure = cause
                self.failure_status = req.terminal_status
            if self.status == RUNNING:
                self.status = FAILED
        else:
            for child, delay, trigger in nr.children:
                if trigger == "completion":
                    self._resolve(child, now + delay)
        self._check_settled()
        self.replay.client_ended(self)

    # ------------------------------------------------------------------ settlement

    def _check_settled(self) -> None:
        if self.settled.triggered or self.outstanding:
            return
        if self.status == FAILED:
            self._settle(FAILED)
        elif self.n_done == len(self.nodes):
            self._settle(COMPLETED_PLAY)
        elif not self.replay.admission_open():
            self._settle(INCOMPLETE_PLAY)  # admission closed before the rest was released

    def _settle(self, status: str) -> None:
        self.status = status
        self.settled_at_ms = self.env.now
        for nr in self.nodes:
            if nr.state in ("waiting", "timer", "ready"):
                nr.state = "skipped"
                nr.timer = None
        self.settled.succeed(status)
        self.replay.play_settled(self)

    def stop(self) -> None:
        """The replay ended (now) with this play unsettled: it is incomplete."""
        if not self.settled.triggered:
            self._settle(INCOMPLETE_PLAY)

    # ------------------------------------------------------------------ idle shifts

    def pending_timers(self) -> list[NodeRun]:
        return [nr for nr in self.nodes if nr.state == "timer" and nr.timer is not None]

    def next_timer_ms(self) -> float:
        timers = self.pending_timers()
        return min((nr.timer_ms for nr in timers), default=math.inf)

    def shift_timers(self, by_ms: float) -> int:
        """Pull every armed timer (and the play's own clock) `by_ms` earlier."""
        self.start_ms -= by_ms
        timers = self.pending_timers()
        for nr in timers:
            nr.gate_ms -= by_ms
            self._set_timer(nr, max(self.env.now, nr.timer_ms - by_ms))
        return len(timers)

    # ------------------------------------------------------------------ record

    @property
    def causal_terminal_ms(self) -> float:
        """The failing terminal of a failed play, else its last terminal (NaN: none)."""
        if self.failure is not None:
            return self.failure[0]
        return self.last_terminal_ms if math.isfinite(self.last_terminal_ms) else math.nan

    def record(self) -> dict[str, Any]:
        states = [nr.state for nr in self.nodes]
        reqs = [nr.req for nr in self.nodes if nr.req is not None]
        f = self.failure
        return {
            "play_id": self.instance_id,
            "source_play_id": self.plan.play.play_id,
            "lane": self.lane,
            "lane_ordinal": self.lane_ordinal,
            "phase": self.phase,
            "status": self.status,
            "started_ms": self.start_ms,
            "first_arrival_ms": self.first_arrival_ms if reqs else math.nan,
            "last_terminal_ms": self.last_terminal_ms if reqs else math.nan,
            "settled_at_ms": self.settled_at_ms,
            "trajectory_e2e_ms": (self.last_terminal_ms - self.first_arrival_ms)
            if reqs
            else math.nan,
            "n_nodes": len(self.plan.play.nodes),
            "n_historical": len(self.plan.historical),
            "n_live": len(self.nodes),
            "n_dispatched": len(reqs),
            "n_completed": sum(r.terminal_status == COMPLETED for r in reqs),
            "n_skipped": states.count("skipped"),
            "input_tokens": sum(r.input_length for r in reqs),
            "reused_input_tokens": sum(r.reused_input_tokens for r in reqs),
            "failure_request_id": f[2] if f else None,
            "failure_reason": f[3] if f else None,
            "causal_terminal_ms": self.causal_terminal_ms,
        }
