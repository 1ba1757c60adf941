"""A KV transfer link: moves a request's KV cache from one pool to another.

A transfer of `b` bytes over a link of `bandwidth_gbps` (decimal GB/s) takes
`latency_ms + b / (bandwidth_gbps x 1e6)` ms at full line rate. How concurrent transfers share
the link is the link's contention model:

* `per_request`: every transfer runs at full line rate, whatever else is in flight (Dynamo's
  mocker models P/D transfers this way);
* `fifo_lanes`: `lanes` transfers at a time, each at full line rate; the others queue in
  submission order (a Store served by one SimPy process per lane);
* `shared`: processor sharing: after its latency, each of the n transfers in flight moves at
  bandwidth / n (one SimPy process re-plans the next completion whenever n changes). With a
  `group_bandwidth_gbps` (a shared KV tier: one link for the cluster, a cap per worker) a
  transfer of group g moves at min(bandwidth / n, group_bandwidth / n_g).

A link with no bandwidth (`None`) moves KV instantly. Completions fire in the transfer phase of
the instant (after pass completions, before arrivals), and each transfer is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass, field
from heapq import heappop, heappush

import simpy

from servesim.clock import TRANSFER_END, at_time, fire
from servesim.metrics.recorder import Recorder


@dataclass(slots=True)
class Transfer:
    request_id: str
    n_bytes: int
    n_tokens: int
    kind: str
    submitted_ms: float
    done: simpy.Event
    group: int = 0
    started_ms: float = math.nan
    remaining_bytes: float = 0.0
    ends: list[float] = field(default_factory=list)


class Link:
    """One link (`name`, e.g. `link.p0-d1`) with its contention model."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        bandwidth_gbps: float | None,
        latency_ms: float,
        contention: str,
        recorder: Recorder,
        lanes: int = 1,
        group_bandwidth_gbps: float | None = None,
    ) -> None:
        self.env = env
        self.name = name
        self.bandwidth_gbps = bandwidth_gbps
        self.bytes_per_ms = None if bandwidth_gbps is None else bandwidth_gbps * 1e6
        self.latency_ms = latency_ms
        self.contention = contention
        self.recorder = recorder
        self.group_bytes_per_ms = (
            None if group_bandwidth_gbps is None else group_bandwidth_gbps * 1e6
        )
        self.n_in_flight = 0
        self.timers: list[float] = []  # times of its pending timers (a heap; see _at)
        if contention == "fifo_lanes" and self.bytes_per_ms is not None:
            self.queue: simpy.Store = simpy.Store(env)
            for _ in range(lanes):
                env.process(self._lane())
        elif contention == "shared" and self.bytes_per_ms is not None:
            self.sharing: list[Transfer] = []
            self._last_ms = env.now
            self._changed = env.event()
            self._timer: simpy.Event | None = None
            env.process(self._share())

    def _at(self, t_ms: float) -> simpy.Event:
        """A timer of this link at `t_ms` (in the transfer phase), remembered until its time
        has passed for `next_event_ms`."""
        heappush(self.timers, t_ms)
        return at_time(self.env, t_ms, TRANSFER_END)

    def next_event_ms(self) -> float:
        """The earliest time a timer of this link can still fire (now if one is due now;
        inf with none): no transfer on it ends, and none starts moving, before then."""
        timers = self.timers
        now = self.env.now
        while timers and timers[0] < now:
            heappop(timers)
        return timers[0] if timers else math.inf

    def duration_ms(self, n_bytes: int) -> float:
        """A transfer's time alone on the link: latency + bytes at line rate (evaluated as the
        mocker does, bytes / (GB/s x 1e9) x 1000, and not rounded)."""
        if self.bandwidth_gbps is None:
            return 0.0
        return self.latency_ms + n_bytes / (self.bandwidth_gbps * 1e9) * 1000

    def submit(
        self, request_id: str, n_bytes: int, n_tokens: int, kind: str, group: int = 0
    ) -> simpy.Event:
        """Start moving `n_bytes` (for `group`, e.g. a worker, on a shared tier link); the
        returned event fires when they have arrived."""
        env = self.env
        job = Transfer(request_id, n_bytes, n_tokens, kind, env.now, env.event(), group=group)
        self.n_in_flight += 1
        if self.bytes_per_ms is None or self.contention == "per_request":
            job.started_ms = env.now
            end = env.now + self.duration_ms(n_bytes)
            self._finish_at(job, end)
        else:
            # its lane (or the sharing process) sets its timer later in this instant: until
            # then, now stands for it in next_event_ms
            heappush(self.timers, env.now)
            if self.contention == "fifo_lanes":
                self.queue.put(job)
            else:
                env.process(self._join_after_latency(job))
        return job.done

    def _finish_at(self, job: Transfer, end: float) -> None:
        def finished(_: simpy.Event) -> None:
            self._record(job, end)

        ev = self._at(end)
        ev.callbacks.append(finished)

    def _record(self, job: Transfer, end: float) -> None:
        self.n_in_flight -= 1
        self.recorder.transfer(
            job.request_id,
            self.name,
            job.kind,
            job.submitted_ms,
            job.started_ms,
            end,
            job.n_bytes,
            job.n_tokens,
        )
        fire(self.env, job.done, TRANSFER_END)

    # ------------------------------------------------------------------ fifo_lanes

    def _lane(self) -> Generator[simpy.Event, Transfer, None]:
        env = self.env
        while True:
            with self.queue.get() as get:
                job = yield get
            job.started_ms = env.now
            end = env.now + self.duration_ms(job.n_bytes)
            yield self._at(end)
            self._record(job, end)

    # ------------------------------------------------------------------ shared

    def _join_after_latency(self, job: Transfer) -> Generator[simpy.Event, None, None]:
        env = self.env
        if self.latency_ms > 0:
            yield self._at(env.now + self.latency_ms)
        job.started_ms = env.now
        job.remaining_bytes = float(job.n_bytes)
        self._advance()
        self.sharing.append(job)
        self._wake_sharing()

    def _rates(self) -> list[float]:
        """Bytes per ms of each sharing transfer: an equal share of the link, capped by an
        equal share of its group's bandwidth when the link has one."""
        sharing = self.sharing
        share = self.bytes_per_ms / len(sharing)  # type: ignore[operator]
        group_bpm = self.group_bytes_per_ms
        if group_bpm is None:
            return [share] * len(sharing)
        counts: dict[int, int] = {}
        for job in sharing:
            counts[job.group] = counts.get(job.group, 0) + 1
        return [min(share, group_bpm / counts[job.group]) for job in sharing]

    def _advance(self) -> None:
        """Move every sharing transfer forward to now at its share of the bandwidth."""
        now = self.env.now
        if self.sharing:
            dt = now - self._last_ms
            for job, rate in zip(self.sharing, self._rates(), strict=True):
                job.remaining_bytes -= dt * rate
        self._last_ms = now

    def _wake_sharing(self) -> None:
        """Wake the sharing process in the transfer phase of this instant (a join, or the
        planned next completion)."""
        if not self._changed.triggered:
            fire(self.env, self._changed, TRANSFER_END)

    def _share(self) -> Generator[simpy.Event, None, None]:
        env = self.env
        while True:
            if not self.sharing:
                yield self._changed
                self._changed = env.event()
                continue
            rates = self._rates()
            left, k = min(
                (max(0.0, j.remaining_bytes) / r, k)
                for k, (j, r) in enumerate(zip(self.sharing, rates, strict=True))
            )
            first = self.sharing[k]
            end = env.now + left
            # one wake-up event for both causes, so the process resumes in the transfer phase
            # (a condition `timer | changed` would resume in SimPy's normal phase, after a
            # prefill worker's next pass has started); a superseded timer wakes nobody
            timer = self._at(end)
            timer.callbacks.append(lambda ev: self._wake_sharing() if ev is self._timer else None)
            self._timer = timer
            yield self._changed
            self._changed = env.event()
            self._advance()
            # complete everything that has (numerically) arrived, in submission order
            done = [j for j in self.sharing if j.remaining_bytes <= 1e-6]
            if timer.processed and not done:
                done = [first]
            for job in done:
                self.sharing.remove(job)
                self._record(job, env.now)
