"""An engine worker: the SimPy process that runs one forward pass after another.

The worker sleeps on a wake-up event while it has nothing to do. With work, it lets every event
of the current instant land first (arrivals join the pass that starts now; a P/D prefill
worker with work left at its pass end lets only the instant's transfers and releases land
before its next pass, as Dynamo does), asks each of its scheduler ranks for its part of the
pass, prices the pass with the timing model (prefill part + decode part), holds for that long,
then applies the pass: tokens stamped at the pass end, requests completed, blocks released, KV
events published. `Worker.run` is that loop and nothing else.

With attention data parallelism (`dp_size` > 1) the worker has one scheduler and one KV pool per
rank. The ranks run in lock-step: every rank with work forms its own batch, and the pass lasts
as long as the slowest rank's (the others, idle ones included, wait for it).

The speed layer's FastWorker (servesim.speed.fast_worker) runs the same passes faster, with the
same answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Protocol

import simpy

from servesim.clock import PASS_END, PASS_START, PREFILL_NEXT_PASS, TRANSFER_END, at_time, fire
from servesim.engine.batch import Batch
from servesim.engine.scheduler import Scheduler
from servesim.kv.events import KvEventBus
from servesim.kv.pool_base import Pool
from servesim.metrics.recorder import Recorder
from servesim.timing.base import StepTime, whole_ns
from servesim.timing.tabulated import DecodeTable, decode_price
from servesim.workload.request import Request


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
        name: str | None = None,
        role: str = "aggregated",
        order: int | None = None,
        kv_bus: KvEventBus | None = None,
    ) -> None:
        self.env = env
        # where its pools' KV events are published (a bus of its own, unheard, if none)
        self.kv_bus = kv_bus if kv_bus is not None else KvEventBus()
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
        # what waits for KV on its ranks, tried at each pass end (P/D decode reservations)
        self.kv_waiters: list[KvWaiter] = []
        # mid-pass, the engine's state is the pass's: commands from outside (a KV transfer
        # landing, a source to release) wait for the pass end
        self.busy = False
        self._deferred: list[Callable[[], None]] = []
        # copies out of G1 that landed mid-pass: applied first at the pass end
        self._landed: list[Callable[[], None]] = []
        self.last_end_ms = -1.0  # when its last pass ended
        # requests the pass being computed rejects: out of their scheduler's queues since the
        # pass was formed, in flight until its end delivers them
        self.rejecting: list[Request] = []
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
                self.kv_bus.publish(
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
        """Pass after pass: form it, price it, compute it, apply it at its end."""
        env = self.env
        ranks = self.ranks
        # a prefill worker with work left at its pass end starts the next pass at once, before
        # the arrivals of that instant (Dynamo's P/D replay); other workers let them join it
        next_pass_at_once = self.role == "prefill"
        pass_ended = False
        while True:
            if not self.has_work():
                pass_ended = False
                yield from self._sleep()
            if env.peek() <= env.now:
                # other events of this instant (arrivals, completions) go first; for a prefill
                # worker straight after its pass, only transfers and source releases
                phase = PREFILL_NEXT_PASS if pass_ended and next_pass_at_once else PASS_START
                yield at_time(env, env.now, phase)
            pass_ended = True
            t = env.now
            # 1. each rank forms its part of the pass (lock-step ranks: one pass)
            batches = self._form(t)
            if not any(b.items for b in batches):
                if any(b.rejected or b.n_preempted for b in batches):
                    # only rejections, or a request that preempted itself: a pass of no
                    # length that ends at once (the next one is planned once the victims'
                    # stores have landed)
                    self._end_pass(self._finish(batches, t, t), batches)
                    yield from self._wait_for_fences(batches, busy=False)
                elif self.has_work():
                    # waiting work that cannot be admitted yet (its KV is held elsewhere
                    # until a transfer ends): sleep until something is delivered
                    pass_ended = False
                    yield from self._sleep()
                continue
            if any(b.fences for b in batches):
                # a victim of this pass is still being copied to G2: it computes once the
                # copies have landed, and nothing else happens on this worker meanwhile
                yield from self._wait_for_fences(batches, busy=True)
                t = env.now
            for rank in ranks:
                self._sample_kv(rank, t)
            # 2. price it: the pass ends when the slowest rank's work does
            end = max(self._end_of(b, t) for b in batches)
            # 3. compute it: commands from outside wait for its end
            yield from self._busy_until_pass_end(end)
            # 4. apply it at its end: tokens, completions, released blocks, KV events
            self._end_pass(self._finish(batches, t, end), batches)

    def _form(self, t: float) -> list[Batch]:
        """Each rank forms its part of a pass starting at `t`; the requests it rejects stay
        visible (`rejecting`) until the pass end delivers them."""
        batches = [r.scheduler.schedule(t) for r in self.ranks]
        self.rejecting = [req for b in batches for req, _ in b.rejected]
        return batches

    def _sleep(self) -> Generator[simpy.Event, None, None]:
        """Sleep until something wakes the worker (an arrival, a delivery, freed blocks)."""
        self._wake = self.env.event()
        yield self._wake
        self._wake = None

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
                self.kv_bus.publish(
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
        self.rejecting = []
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
