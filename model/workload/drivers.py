"""Arrival drivers: the SimPy processes that hand requests to the cluster.

* open loop (trace timestamps or a rate process): first turns at their planned times, in trace
  order (equal times keep line order); a multi-turn session's later turns follow the completion
  of the previous turn plus its delay;
* closed loop (`concurrency` C): C slots, each replaying one session at a time, turn by turn;
  a request's arrival is stamped when it is dispatched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable, Iterator

import simpy

from servesim.clock import ARRIVAL, at_time
from servesim.workload.build import Session
from servesim.workload.request import Request

Dispatch = Callable[[Request], None]


def _follow_ups(
    env: simpy.Environment, session: Session, dispatch: Dispatch
) -> Generator[simpy.Event, None, None]:
    for prev, req in zip(session, session[1:], strict=False):
        assert prev.done is not None
        yield prev.done
        if req.delay_ms > 0:
            yield env.timeout(req.delay_ms)
        req.done = env.event() if req is not session[-1] else None
        dispatch(req)


def open_loop(
    env: simpy.Environment,
    sessions: Iterable[Session],
    dispatch: Dispatch,
    announce: Callable[[float], None] | None = None,
) -> Generator[simpy.Event, None, None]:
    """First turns at their planned times; `announce(t)` is told each next arrival time (and
    inf after the last) so workers know how far ahead nothing can reach them."""
    for session in sessions:
        first = session[0]
        planned: float = first.planned_arrival_ms  # type: ignore[assignment]
        if announce is not None:
            announce(planned)
        if planned > env.now:
            yield at_time(env, planned, ARRIVAL)
        if len(session) > 1:
            first.done = env.event()
            dispatch(first)
            env.process(_follow_ups(env, session, dispatch))
        else:
            dispatch(first)
    if announce is not None:
        announce(math.inf)


def _slot(
    env: simpy.Environment, queue: Iterator[Session], dispatch: Dispatch
) -> Generator[simpy.Event, None, None]:
    for session in queue:
        for k, req in enumerate(session):
            if k and req.delay_ms > 0:
                yield env.timeout(req.delay_ms)
            req.done = env.event()
            dispatch(req)
            yield req.done


def closed_loop(
    env: simpy.Environment, sessions: list[Session], dispatch: Dispatch, concurrency: int
) -> None:
    queue = iter(sessions)
    for _ in range(min(concurrency, len(sessions))):
        env.process(_slot(env, queue, dispatch))
