"""The fast worker: the textbook pass loop, plus chains of passes nothing can interrupt and
decode stretches applied at once (the speed layer's part of the engine; docs/speed.md).

A chain: while the cluster's horizon (the next time anything could reach this worker, or the
stop time) is later than a pass's end, and the pass completes or rejects nothing (so it wakes
nobody), the worker applies it at its end time and plans the next one at once, holding only for
the last pass of the chain. A decode stretch (servesim.speed.stretch) applies a run of
decode-only passes of the shipped vLLM or SGLang policy in one step. Nothing can observe the
difference: every timestamp equals the textbook loop's
(tests/speed/test_fast_forward_equivalence.py), with one SimPy event per chain instead of two
per pass.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Generator
from functools import partial
from itertools import groupby
from operator import itemgetter

import numpy as np
import simpy

from servesim.clock import PASS_START, PREFILL_NEXT_PASS, at_time
from servesim.engine.scheduler import Scheduler
from servesim.engine.worker import Worker
from servesim.kv.events import KvEventBus
from servesim.metrics.recorder import Recorder
from servesim.speed.stretch import DecodeEnds, Stretch, stretcher_for
from servesim.timing.base import StepTime, whole_ns_array
from servesim.workload.request import Request

# fast-forward prices stretches expected to run at least this many passes in bulk (numpy),
# in chunks of at least this size; shorter ones pass by pass
VECTOR_MIN_PASSES = 24


class FastWorker(Worker):
    """A worker that chains passes up to its `horizon` (a function: the earliest time anything
    can reach it) and lets decode stretches stand in for runs of the shipped policy's passes."""

    def __init__(
        self,
        env: simpy.Environment,
        idx: int,
        schedulers: list[Scheduler],
        step_time: StepTime,
        recorder: Recorder,
        on_complete: Callable[[Request], None],
        on_reject: Callable[[Request, str], None],
        num_workers: int = 1,
        name: str | None = None,
        role: str = "aggregated",
        order: int | None = None,
        kv_bus: KvEventBus | None = None,
        horizon: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            env, idx, schedulers, step_time, recorder, on_complete, on_reject,
            num_workers, name, role, order, kv_bus,
        )  # fmt: skip
        self.horizon = horizon if horizon is not None else env.peek
        # decode stretches stand in for passes of the shipped vLLM and SGLang policies only
        # (one rank)
        self.stretcher: Callable[[DecodeEnds], Stretch | None] | None = (
            stretcher_for(self.ranks[0].scheduler) if len(self.ranks) == 1 else None
        )

    def run(self) -> Generator[simpy.Event, None, None]:
        env = self.env
        ranks = self.ranks
        single = ranks[0].scheduler if len(ranks) == 1 else None
        stretcher = self.stretcher
        # a prefill worker with work left at its pass end starts the next pass at once, before
        # the arrivals of that instant (Dynamo's P/D replay); other workers let them join it
        next_pass_at_once = self.role == "prefill"
        pass_ended = False
        while True:
            if not self.has_work():
                pass_ended = False
                self._wake = env.event()
                yield self._wake
                self._wake = None
            if env.peek() <= env.now:
                # other events of this instant (arrivals, completions) go first; for a prefill
                # worker straight after its pass, only transfers and source releases
                phase = PREFILL_NEXT_PASS if pass_ended and next_pass_at_once else PASS_START
                yield at_time(env, env.now, phase)
            pass_ended = True  # every way out of the loop below ends a pass, or sleeps first
            t = env.now
            horizon = self.horizon()  # nothing can reach this worker before then
            while True:
                chain = not self._waiter_may_proceed()
                if stretcher is not None and chain:
                    stretch = stretcher(partial(self._decode_ends, t, horizon))
                    if stretch is not None:
                        self._record_stretch(t, stretch)
                        t = stretch.ends[-1]
                        if stretch.done:  # its last pass completed requests: deliver them
                            self._sample_kv(ranks[0], t)
                            yield from self._busy_until_pass_end(t)
                            self._end_pass(stretch.done, [])
                            break
                batches = self._form(t)
                if not any(b.items for b in batches):
                    if not any(b.rejected or b.n_preempted for b in batches):
                        # waiting work that cannot be admitted yet (its KV is held elsewhere
                        # until a transfer ends): sleep until something is delivered
                        if self.has_work():
                            pass_ended = False
                            self._wake = env.event()
                            yield self._wake
                            self._wake = None
                        break
                    # only rejections, or a request that preempted itself: a pass of no
                    # length that ends at once
                    if t > env.now:
                        yield from self._until_pass_end(t)
                    self._end_pass(self._finish(batches, t, t), batches)
                    # (the next one is planned once the victims' stores have landed)
                    yield from self._wait_for_fences(batches, busy=False)
                    break
                if any(b.fences for b in batches):
                    # a victim of this pass is still being copied to G2: it computes once the
                    # copies have landed, and nothing else happens on this worker meanwhile
                    if t > env.now:
                        yield from self._until_pass_end(t)
                    yield from self._wait_for_fences(batches, busy=True)
                    t = env.now
                    horizon = t  # (no chaining past it)
                for rank in ranks:
                    self._sample_kv(rank, t)
                # lock-step ranks: the pass ends when the slowest rank's work does
                end = (
                    self._end_of(batches[0], t)
                    if single is not None
                    else max(self._end_of(b, t) for b in batches)
                )
                # (planning this pass may itself have freed capacity, by preempting)
                chain = not self._waiter_may_proceed()
                if end >= horizon or not chain:
                    # something may happen before this pass ends (or the run may stop):
                    # apply it at its end, as it comes
                    yield from self._busy_until_pass_end(end)
                    self._end_pass(self._finish(batches, t, end), batches)
                    break
                # nothing can happen before the end: apply it now, deliver at its end
                done = self._finish(batches, t, end)
                if done or any(b.rejected for b in batches):
                    yield from self._busy_until_pass_end(end)
                    self._end_pass(done, batches)
                    break
                t = end  # chain the next pass

    def _decode_ends(
        self, start: float, horizon: float, n: int, sum_ctx: int, k_max: int
    ) -> array[float]:
        """End times of up to `k_max` back-to-back decode passes of `n` sequences from `start`
        (their lengths summing to `sum_ctx`, one token more each pass), as many as end before
        `horizon`. Each pass is priced and added as the pass-by-pass loop does; a timing model
        that prices many passes at once (`decode_ms_array`) gives the same floats in bulk."""
        ends = array("d")
        t = start
        price = self._decode_only_ms
        first = price(n, sum_ctx)
        # about how many passes end before the horizon (decode passes lengthen slowly)
        expected = k_max
        if horizon < math.inf and first > 0:
            expected = min(k_max, int((horizon - t) / first) + 1)
        table = self.decode_table
        if (table is None and self.decode_ms_array is None) or expected < VECTOR_MIN_PASSES:
            # a few passes: one by one (numpy's per-call cost would dominate)
            duration = first
            while True:
                end = t + duration
                if end >= horizon:
                    break
                ends.append(end)
                if len(ends) == k_max:
                    break
                t = end
                sum_ctx += n
                duration = price(n, sum_ctx)
            return ends
        # the first chunk: every pass up to k_max, or (with a horizon) a quarter more than
        # the first pass's length fits before it, so that one round of numpy usually does
        chunk = min(k_max, max(VECTOR_MIN_PASSES, int(expected * 1.25) + 2))
        decode_ms_array = self.decode_ms_array
        total = self.total_kv_tokens
        while len(ends) < k_max:
            m = min(chunk, k_max - len(ends))
            if table is not None:
                steps = table.prices(sum_ctx, n, m)
            else:
                assert decode_ms_array is not None  # (checked above)
                ctx = np.arange(sum_ctx, sum_ctx + n * m, n, dtype=np.int64)
                steps = whole_ns_array(decode_ms_array(n, ctx, total, ctx // n))
            # sequential sums, as `t = t + d` pass after pass
            steps[0] += t
            stamps = np.cumsum(steps, out=steps)
            if stamps[-1] < horizon:
                ends.frombytes(stamps.tobytes())
            else:
                keep = int(np.searchsorted(stamps, horizon, "left"))  # those ending before it
                ends.frombytes(stamps[:keep].tobytes())
                break
            t = ends[-1]
            sum_ctx += n * m
            chunk *= 4
        return ends

    def _record_stretch(self, start: float, stretch: Stretch) -> None:
        """Record fast-forwarded decode passes as the pass-by-pass loop would have: each pass,
        the pool level at the start of each pass that allocated, the KV events at their pass
        ends."""
        rank = self.ranks[0]
        ends = stretch.ends
        levels = stretch.levels
        if levels:
            active = array("q")
            level = stretch.active_before
            at = 0
            kv_rows: list[tuple[float, str, str, int, int, int, int]] = []
            kv_level = rank.kv_level
            name, idx = rank.name, self.idx
            for i, used, cached in levels:
                if i - at == 1:  # (with one-token blocks every pass allocates)
                    active.append(level)
                elif i > at:
                    active.extend(array("q", (level,)) * (i - at))
                level, at = used, i
                if used != kv_level[0] or cached != kv_level[1]:
                    kv_level = (used, cached)
                    t = ends[i - 1] if i else start
                    kv_rows.append((t, name, "device", used, cached, idx, 0))
            rank.kv_level = kv_level
            self.recorder.kv_levels(kv_rows)
            active.extend(array("q", (level,)) * (len(ends) - at))
        else:
            active = array("q", (stretch.active_before,)) * len(ends)
        self.recorder.pass_stretch(self.idx, start, ends, stretch.n_decode, active, self.role)
        if rank.pool.pending_events:
            # each pass's events together, at its end
            events = zip(stretch.event_passes, rank.pool.take_events(), strict=True)
            for i, of_pass in groupby(events, itemgetter(0)):
                self.kv_bus.publish(
                    ends[i], rank.name, self.idx, 0, [e for _, e in of_pass], "device", self.order
                )
