"""Same-instant order of the simulation, and SimPy events that respect it.

Several things can happen at one simulated instant. The model fixes their order, as Dynamo's
replay does: pass completions, then transfer completions, then arrivals and admissions, then
telemetry, and only then do idle workers start their next pass, so a request that arrives at
the very instant a pass ends joins the next pass. (One exception, also Dynamo's: a prefill
worker of a disaggregated cluster that still has work at its pass end starts the next pass
before the arrivals of that instant.) SimPy orders events by (time, priority,
insertion); these helpers schedule an event in a given phase.
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.events import Event

PASS_END = -2
TRANSFER_END = -1
# a P/D prefill worker with work left at its pass end starts the next pass here: after the
# transfers (and source releases) of the instant, before its arrivals
PREFILL_NEXT_PASS = 0.5
# SimPy uses 0 (URGENT) to start processes and 1 (NORMAL) for timeouts and succeed():
# arrivals and everything they trigger happen in the NORMAL phase.
ARRIVAL = 1
# agentic replay dispatches the requests released at an instant together, in request-id order
# (as Dynamo's mocker does), after the instant's timers and completions have released them
AGENTIC_RELEASE = 1.5
# a P/D decode worker that was idle when requests with nothing to decode were delivered to it
# settles them here, once every transfer of the instant has landed (Dynamo's decode worker
# looks at its queue only then: a request delivered at the same instant makes it busy)
SETTLE_DELIVERED = 2.5
PASS_START = 3  # (2 is kept for telemetry)


class Environment(simpy.Environment):
    """SimPy's environment, plus events at an absolute time.

    `now + (t - now)` is not always `t` in floating point, and the model computes pass ends
    and arrivals as absolute times (as the mocker does); this lands them exactly.
    """

    def schedule_at(self, event: Event, priority: int | float, t_ms: float) -> None:
        if t_ms < self._now:
            raise ValueError(f"cannot schedule at {t_ms} ms, before now ({self._now} ms)")
        # the same heap entry SimPy's own schedule() makes, with the time given directly
        heappush(self._queue, (t_ms, priority, next(self._eid), event))  # type: ignore[misc]


def at_time(env: simpy.Environment, t_ms: float, phase: int | float) -> Event:
    """An event that fires at exactly `t_ms`, in `phase` among same-instant events."""
    ev = Event(env)
    ev._ok = True
    ev._value = None
    if isinstance(env, Environment):
        env.schedule_at(ev, phase, t_ms)
    else:
        env.schedule(ev, phase, t_ms - env.now)  # type: ignore[arg-type]  # phases may be floats
    return ev


def fire(env: simpy.Environment, event: Event, phase: int | float) -> None:
    """Trigger `event` now, processed in `phase` among this instant's events (succeed() would
    always use SimPy's NORMAL priority)."""
    event._ok = True
    event._value = None
    env.schedule(event, phase)  # type: ignore[arg-type]  # phases may be floats
