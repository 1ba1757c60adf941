"""An engine worker: the SimPy process that runs one forward pass after another.

The worker sleeps on a wake-up event while it has nothing to do. With work, it lets every event
of the current instant land first (arrivals join the pass that starts now; a P/D prefill
worker with work left at its pass end lets only the instant's transfers and releases land
before its next pass, as Dynamo does), asks each of its
scheduler ranks for a batch, prices the pass with the timing model (prefill part + decode
part), holds for that long, then applies the pass: tokens stamped at the pass end, requests
completed, blocks released, KV events published.

With attention data parallelism (`dp_size` > 1) the worker has one scheduler and one KV pool per
rank. The ranks run in lock-step: every rank with work forms its own batch, and the pass lasts
as long as the slowest rank's (the others, idle ones included, wait for it).

Passes that end before anything can reach this worker are chained: while the cluster's
horizon (the next time a request could be dispatched, or the stop time) is later than a pass's
end, and the pass completes or rejects nothing (so it wakes nobody), the worker applies it at its
end time and plans the next one at once, holding only for the last pass of the chain. Nothing
can observe the difference (no request can join or leave in between), so every timestamp
equals the pass-by-pass loop's, with one SimPy event per chain instead of two per pass.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Generator
from functools import partial
from itertools import groupby
from operator import itemgetter
from typing import Any, Final, Protocol

import numpy as np
import simpy

from servesim.clock import PASS_END, PASS_START, PREFILL_NEXT_PASS, TRANSFER_END, at_time, fire
from servesim.engine.batch import Batch
from servesim.engine.scheduler import Scheduler
from servesim.engine.vllm import VllmScheduler
from servesim.kv.group_pool import Pool
from servesim.metrics.recorder import Recorder
from servesim.speed.stretch import Stretch, decode_stretch, stretches_apply
from servesim.timing.base import StepTime, whole_ns, whole_ns_array
from servesim.workload.request import Request

# fast-forward prices stretches expected to run at least this many passes in bulk (numpy),
# in chunks of at least this size; shorter ones pass by pass
VECTOR_MIN_PASSES = 24


def decode_price(step_time: StepTime, total_kv_tokens: int) -> Callable[[int, int], float]:
    """The decode part of a pass of `n` sequences holding `sum_ctx` tokens, as a function of
    (n, sum_ctx): `whole_ns(decode_ms(n, sum_ctx, total_kv_tokens, sum_ctx // n))`, in one
    call (a stretch priced pass by pass calls it once per pass)."""
    decode_ms = step_time.decode_ms

    def price(n: int, sum_ctx: int) -> float:
        return whole_ns(decode_ms(n, sum_ctx, total_kv_tokens, sum_ctx // n))

    return price


class DecodeTable:
    """The decode part of a pass, in whole nanoseconds, by the decoding sequences' KV tokens,
    for a timing model whose decode time depends on nothing else (the mocker's polynomial):
    each value computed once, in bulk, the first time a pass needs it.

    Loads past the pool's tokens cost what a full pool does (utilisation is capped at 1), so
    the table has one slot per token of the pool. Its memory is zeroed by the OS on first
    touch: a run pays only for the loads it reaches. The computed slots are one range,
    `lo..hi`, widened (gap included) to take in a load outside it."""

    CHUNK: Final = 4096  # slots computed together when the range widens

    def __init__(self, by_kv: Callable[[np.ndarray], np.ndarray], total_kv_tokens: int) -> None:
        self.by_kv = by_kv
        self.top = max(total_kv_tokens, 1)
        self.values = np.zeros(self.top + 1)
        self.lo, self.hi = 1, 0  # nothing computed yet
        # read as Python floats, without numpy scalars
        self._slots: Any = memoryview(self.values)  # type: ignore[arg-type]

    def _cover(self, a: int, b: int) -> None:
        """Widen the computed range to take in slots a..b (a <= b <= top)."""
        lo, hi = self.lo, self.hi
        if lo > hi:  # the first fill: a chunk's worth from a
            lo, hi = a, min(self.top, max(b, a + self.CHUNK - 1))
            self._fill(lo, hi)
        if a < lo:
            a = max(0, min(a, lo - self.CHUNK))
            self._fill(a, lo - 1)
            lo = a
        if b > hi:
            b = min(self.top, max(b, hi + self.CHUNK))
            self._fill(hi + 1, b)
            hi = b
        self.lo, self.hi = lo, hi

    def _fill(self, lo: int, hi: int) -> None:
        self.values[lo : hi + 1] = whole_ns_array(self.by_kv(np.arange(lo, hi + 1)))

    def price(self, n: int, sum_ctx: int) -> float:
        """The decode part of one pass of `n` >= 1 sequences holding `sum_ctx` tokens."""
        s = sum_ctx if sum_ctx < self.top else self.top
        if not self.lo <= s <= self.hi:
            self._cover(s, s)
        return self._slots[s]

    def prices(self, sum_ctx: int, n: int, m: int) -> np.ndarray:
        """The decode parts of `m` passes of `n` >= 1 sequences, the first holding `sum_ctx`
        tokens and each later one `n` more (a new array)."""
        top = self.top
        first = sum_ctx if sum_ctx < top else top
        last = sum_ctx + n * (m - 1)
        if last > top:
            last = top
        if first < self.lo or last > self.hi:
            self._cover(first, last)
        at = np.arange(sum_ctx, sum_ctx + n * m, n)
        np.minimum(at, top, out=at)
        return self.values[at]


class KvWaiter(Protocol):
    """Requests waiting for KV on a worker's rank, tried between its passes (a P/D decode
    rank's reservations: servesim.cluster.reservation.Reservations)."""

    def may_proceed(self) -> bool:
        """Whether a try at the next pass end may succeed (then that pass end must happen in
        the event loop, at its time: no looking past it)."""
        ...

    def pass_ended(self) -> None:
        """The worker's pass ended (now): one try."""
        ...

    def blocks_freed(self, at_pass_end: bool) -> None:
        """A copy out of G1 gave blocks back between passes (now): one try."""
        ...


class Rank:
    """One attention-DP rank of a worker: its scheduler, its KV pool, its name. It is what the
    rank's KV tiers act on (servesim.kv.tiers.TierOwner): through its worker, between passes."""

    __slots__ = ("dp_rank", "scheduler", "pool", "name", "kv_level", "worker")

    def __init__(self, dp_rank: int, scheduler: Scheduler, name: str, worker: Worker) -> None:
        self.dp_rank = dp_rank
        self.scheduler = scheduler
        self.pool: Pool = scheduler.pool
        self.name = name
        self.kv_level = (-1, -1)
        self.worker = worker

    @property
    def order(self) -> int:
        return self.worker.order

    def apply(self, command: Callable[[], None]) -> None:
        self.worker.apply(command)

    def copy_landed(self, command: Callable[[], None]) -> None:
        self.worker.copy_landed(command)

    def sample_kv(self) -> None:
        self.worker.sample_kv()

    def wake(self) -> None:
        self.worker.wake()

    def has_deferred(self) -> bool:
        return bool(self.scheduler.deferred)


class Worker:
    """Worker `idx` of its pool (dotted name `cluster.w{idx}`, or `cluster.p{idx}` /
    `cluster.d{idx}` in a disaggregated cluster; ranks `<name>.r{k}` when dp > 1)."""

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
        horizon: Callable[[], float] | None = None,
        fast_forward: bool = True,
        name: str | None = None,
        role: str = "aggregated",
        order: int | None = None,
    ) -> None:
        self.env = env
        self.idx = idx
        self.name = name or f"cluster.w{idx}"
        multi = len(schedulers) > 1
        self.ranks = [
            Rank(k, s, f"{self.name}.r{k}" if multi else self.name, self)
            for k, s in enumerate(schedulers)
        ]
        self.step_time = step_time
        # a timing model that prices a mixed pass as one (weights read once) offers mixed_ms
        self.mixed_ms = getattr(step_time, "mixed_ms", None)
        # a timing model that prices many decode passes at once offers decode_ms_array
        self.decode_ms_array = getattr(step_time, "decode_ms_array", None)
        self.recorder = recorder
        self.on_complete = on_complete
        self.on_reject = on_reject
        first = schedulers[0]
        self.block_size = first.block_size
        self.total_kv_tokens = first.pool.capacity_blocks * self.block_size
        # a timing model whose decode time depends on the KV tokens alone is tabulated
        by_kv_of = getattr(step_time, "decode_ms_by_kv", None)
        by_kv = by_kv_of(self.total_kv_tokens) if by_kv_of is not None else None
        self.decode_table = DecodeTable(by_kv, self.total_kv_tokens) if by_kv else None
        self._decode_only_ms = (
            self.decode_table.price
            if self.decode_table is not None
            else decode_price(step_time, self.total_kv_tokens)
        )
        # passes ending at one instant complete in worker order
        # (prefill workers before decode workers: `order` counts across pools)
        self.role = role
        self.order = idx if order is None else order
        self.end_phase = PASS_END + self.order / (num_workers + 1)
        self.horizon = horizon if horizon is not None else env.peek
        self.fast_forward = fast_forward
        # decode stretches stand in for passes of the shipped vLLM policy only (one rank)
        self.stretch_scheduler = (
            first
            if len(schedulers) == 1 and isinstance(first, VllmScheduler) and stretches_apply(first)
            else None
        )
        # what waits for KV on its ranks, tried at each pass end (P/D decode reservations)
        self.kv_waiters: list[KvWaiter] = []
        # mid-pass, the engine's state is the pass's: commands from outside (a KV transfer
        # landing, a source to release) wait for the pass end
        self.busy = False
        self._deferred: list[Callable[[], None]] = []
        # copies out of G1 that landed mid-pass: applied first at the pass end
        self._landed: list[Callable[[], None]] = []
        self.last_end_ms = -1.0  # when its last pass ended
        # called at a request's first token (a KV router's load view), and once a pass end's
        # first tokens, completions and rejections have all been delivered
        self.on_first_token: Callable[[Request], None] | None = None
        self.on_signals_done: Callable[[], None] | None = None
        self._wake: simpy.Event | None = None
        self.pending_end_ms: float | None = None  # the pass end it waits for, if it does
        self.process = env.process(self.run())

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler of rank 0 (the only one without attention DP)."""
        return self.ranks[0].scheduler

    @property
    def pool(self) -> Pool:
        return self.ranks[0].pool

    def submit(self, req: Request, dp_rank: int = 0) -> None:
        req.worker_idx = self.idx
        req.dp_rank = dp_rank
        self.ranks[dp_rank].scheduler.enqueue(req)
        self.wake()

    def wake(self) -> None:
        """Something arrived: a sleeping worker plans a pass at this instant."""
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def apply(self, command: Callable[[], None]) -> None:
        """Run `command` on this worker's engine now, or at the end of the pass in flight."""
        if self.busy:
            self._deferred.append(command)
        else:
            command()

    def between_passes(self, command: Callable[[], None]) -> simpy.Event:
        """`apply(command)`; the event fires once it has run (in the transfers' phase)."""
        done = self.env.event()

        def run() -> None:
            command()
            fire(self.env, done, TRANSFER_END)

        self.apply(run)
        return done

    def sample_kv(self) -> None:
        """Record KV levels and publish KV events now, after a change made between passes (a
        reservation, a transfer landing, a released source)."""
        now = self.env.now
        for rank in self.ranks:
            pool = rank.pool
            if pool.pending_events:
                self.recorder.kv_event_batch(
                    now, rank.name, self.idx, rank.dp_rank, pool.take_events(), "device", self.order
                )
            self._sample_kv(rank, now)

    def copy_landed(self, command: Callable[[], None]) -> None:
        """A copy out of this worker's G1 (a store to G2) landed: `command` gives its blocks
        back. Between passes it runs now and what waits for blocks tries again at once (a
        P/D decode worker's reservation); mid-pass it runs first thing at the pass end, and
        the pass end's own attempt is the only one (as Dynamo settles a worker's tier copies
        at its pass boundary)."""
        if self.busy:
            self._landed.append(command)
            return
        command()
        self.sample_kv()
        at_pass_end = self.last_end_ms == self.env.now
        for waiter in self.kv_waiters:
            waiter.blocks_freed(at_pass_end)
        self.wake()

    def next_end_bound(self) -> float:
        """The earliest time this worker can next end a pass: the end it waits for; never
        while it sleeps until something wakes it; else now (it is about to plan one)."""
        if self._wake is not None and not self._wake.triggered:
            return math.inf
        return self.pending_end_ms if self.pending_end_ms is not None else self.env.now

    def has_work(self) -> bool:
        return any(r.scheduler.has_work() for r in self.ranks)

    def run(self) -> Generator[simpy.Event, None, None]:
        env = self.env
        ranks = self.ranks
        single = ranks[0].scheduler if len(ranks) == 1 else None
        stretcher = self.stretch_scheduler if self.fast_forward else None
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
                chain = self.fast_forward and not self._waiter_may_proceed()
                if stretcher is not None and chain:
                    stretch = decode_stretch(stretcher, partial(self._decode_ends, t, horizon))
                    if stretch is not None:
                        self._record_stretch(t, stretch)
                        t = stretch.ends[-1]
                        if stretch.done:  # its last pass completed requests: deliver them
                            self._sample_kv(ranks[0], t)
                            yield from self._busy_until_pass_end(t)
                            self._end_pass(stretch.done, [])
                            break
                batches = [r.scheduler.schedule(t) for r in ranks]
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
                chain = self.fast_forward and not self._waiter_may_proceed()
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

    def _waiter_may_proceed(self) -> bool:
        waiters = self.kv_waiters
        return bool(waiters) and any(w.may_proceed() for w in waiters)

    def _wait_for_fences(
        self, batches: list[Batch], busy: bool
    ) -> Generator[simpy.Event, None, None]:
        """Wait until every store to G2 that the batches wait for has landed; `busy` while a
        formed pass waits to compute (commands from outside wait for its end)."""
        fences = [f for b in batches for f in b.fences if not f.processed]
        if fences:
            self.busy = busy
            yield self.env.all_of(fences)
            self.busy = False

    def _busy_until_pass_end(self, end: float) -> Generator[simpy.Event, None, None]:
        """Wait out a pass the worker is computing: commands from outside wait for its end."""
        self.busy = True
        yield from self._until_pass_end(end)
        self.busy = False

    def _until_pass_end(self, end: float) -> Generator[simpy.Event, None, None]:
        """Wait for a pass end, known meanwhile as `pending_end_ms` (see next_end_bound)."""
        self.pending_end_ms = end
        yield at_time(self.env, end, self.end_phase)
        self.pending_end_ms = None

    def _end_of(self, batch: Batch, start: float) -> float:
        """When one rank's work starting at `start` ends: start + prefill part + decode part,
        each part kept in whole nanoseconds (as the mocker does); a pass with both parts is
        priced as one by a timing model that offers `mixed_ms` (calibrated_roofline)."""
        st = self.step_time
        end = start
        if batch.n_prefill and batch.n_decode and self.mixed_ms is not None:
            n, b = batch.n_prefill, batch.n_decode
            ctx = batch.sum_decode_context
            return end + whole_ns(
                self.mixed_ms(n, batch.sum_prefill_isl // n, batch.sum_prefix // n, b, ctx // b)
            )
        if batch.n_prefill:
            n = batch.n_prefill
            end += whole_ns(st.prefill_ms(n, batch.sum_prefill_isl // n, batch.sum_prefix // n))
        if batch.n_decode:
            n = batch.n_decode
            # the mocker's decode load is the decoding sequences' token count (shared prefixes
            # counted once per sequence), not the pool's active blocks
            end += self._decode_only_ms(n, batch.sum_decode_context)
        return end

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
            for i, used, cached in levels:
                active.extend(array("q", (level,)) * (i - at))
                level, at = used, i
                if (used, cached) != rank.kv_level:
                    rank.kv_level = (used, cached)
                    self.recorder.kv_level(
                        ends[i - 1] if i else start, rank.name, "device", used, cached, self.idx, 0
                    )
            active.extend(array("q", (level,)) * (len(ends) - at))
        else:
            active = array("q", (stretch.active_before,)) * len(ends)
        self.recorder.pass_stretch(self.idx, start, ends, stretch.n_decode, active, self.role)
        if rank.pool.pending_events:
            # each pass's events together, at its end
            events = zip(stretch.event_passes, rank.pool.take_events(), strict=True)
            for i, of_pass in groupby(events, itemgetter(0)):
                self.recorder.kv_event_batch(
                    ends[i], rank.name, self.idx, 0, [e for _, e in of_pass], "device", self.order
                )

    def _finish(self, batches: list[Batch], start: float, end: float) -> list[Request]:
        """Apply a pass at its end time: stamp tokens, release finished requests' blocks,
        record each rank's part. Returns the completed requests (delivered by `_deliver`)."""
        done: list[Request] = []
        for rank, batch in zip(self.ranks, batches, strict=True):
            if not (batch.items or batch.rejected or batch.n_preempted):
                continue  # an idle rank waits out the pass; it records nothing
            tiers = rank.scheduler.tiers
            if tiers is not None:  # before finished requests let go of their blocks
                tiers.store_pass(batch)
            done.extend(rank.scheduler.finish(batch, end, self.on_first_token))
            self.recorder.pass_done(
                self.idx,
                rank.dp_rank,
                start,
                end,
                batch.prefill_tokens,
                batch.n_prefill,
                batch.n_decode,
                batch.active_blocks,
                batch.n_preempted,
                self.role,
            )
            pool = rank.pool
            if pool.pending_events:
                self.recorder.kv_event_batch(
                    end, rank.name, self.idx, rank.dp_rank, pool.take_events(), "device", self.order
                )
            self._sample_kv(rank, end)
        return done

    def _end_pass(self, done: list[Request], batches: list[Batch]) -> None:
        """At a pass end, now: the pass's outcomes (which may wake drivers and routers), the
        worker's own end-of-pass hook, then the commands that waited for the pass end.

        The order is Dynamo's: a decode worker retries its pending reservation (the hook)
        before it applies the transfers that landed during the pass, so a reservation made
        here cannot pin the blocks those activations are about to register. Stores to G2
        that landed during the pass give their blocks back before all of these."""
        self.last_end_ms = self.env.now
        if self._landed:
            while self._landed:
                landed, self._landed = self._landed, []
                for command in landed:
                    command()
            self.sample_kv()
        for batch in batches:
            for req, reason in batch.rejected:
                self.on_reject(req, reason)
        for req in done:
            self.on_complete(req)
        if self.on_signals_done is not None:
            self.on_signals_done()
        for waiter in self.kv_waiters:
            waiter.pass_ended()
        while self._deferred:
            self._deferred.pop(0)()

    def _sample_kv(self, rank: Rank, t: float) -> None:
        pool = rank.pool
        level = (pool.n_active, pool.n_cached)
        if level != rank.kv_level:
            rank.kv_level = level
            self.recorder.kv_level(
                t, rank.name, "device", level[0], level[1], self.idx, rank.dp_rank
            )
