"""An engine worker: the SimPy process that runs one forward pass after another.

The worker sleeps on a wake-up event while it has nothing to do. With work, it lets every event
of the current instant land first (arrivals join the pass that starts now), asks its scheduler
for a batch, prices the pass with the timing model (prefill part + decode part), holds for that
long, then applies the pass: tokens stamped at the pass end, requests completed, blocks released,
KV events published.

Passes that end before anything can reach this worker are chained: while the cluster's
horizon (the next time a request could be dispatched, or the stop time) is later than a pass's
end, and the pass completes or rejects nothing (so it wakes nobody), the worker applies it at its
end time and plans the next one at once, holding only for the last pass of the chain. Nothing
can observe the difference (no request can join or leave in between), so every timestamp
equals the pass-by-pass loop's, with one SimPy event per chain instead of two per pass.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import simpy

from model.clock import PASS_END, PASS_START, at_time
from model.engine.vllm import Batch, VllmScheduler
from model.kv.block_pool import BlockPool
from model.metrics.recorder import Recorder
from model.timing.base import StepTime, whole_ns
from model.workload.request import Request


class Worker:
    """Worker `idx` (dotted name `cluster.w{idx}`) with one scheduler rank."""

    def __init__(
        self,
        env: simpy.Environment,
        idx: int,
        scheduler: VllmScheduler,
        step_time: StepTime,
        recorder: Recorder,
        on_complete: Callable[[Request], None],
        on_reject: Callable[[Request, str], None],
        num_workers: int = 1,
        horizon: Callable[[], float] | None = None,
        fast_forward: bool = True,
    ) -> None:
        self.env = env
        self.idx = idx
        self.name = f"cluster.w{idx}"
        self.scheduler = scheduler
        self.pool: BlockPool = scheduler.pool
        self.step_time = step_time
        self.recorder = recorder
        self.on_complete = on_complete
        self.on_reject = on_reject
        self.block_size = scheduler.block_size
        self.total_kv_tokens = self.pool.capacity_blocks * self.block_size
        # passes ending at one instant complete in worker order
        self.end_phase = PASS_END + idx / (num_workers + 1)
        self.horizon = horizon if horizon is not None else env.peek
        self.fast_forward = fast_forward
        self._wake: simpy.Event | None = None
        self._kv_level = (-1, -1)
        self.process = env.process(self.run())

    def submit(self, req: Request) -> None:
        req.worker_idx = self.idx
        self.scheduler.enqueue(req)
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def run(self) -> Generator[simpy.Event, None, None]:
        env = self.env
        sched = self.scheduler
        while True:
            if not sched.has_work():
                self._wake = env.event()
                yield self._wake
                self._wake = None
            if env.peek() <= env.now:
                # other events of this instant (arrivals, completions) go first
                yield at_time(env, env.now, PASS_START)
            t = env.now
            horizon = self.horizon()  # nothing can reach this worker before then
            while True:
                if self.fast_forward:
                    ends, registered = sched.decode_stretch(t, horizon, self._decode_only_ms)
                    if ends:
                        self._record_stretch(t, ends, registered)
                        t = ends[-1]
                batch = sched.schedule(t)
                if not batch.items:
                    if not (batch.rejected or batch.n_preempted):
                        if sched.has_work():
                            raise RuntimeError(f"{self.name} stalled at {t} ms with work")
                        break
                    # only rejections, or a request that preempted itself: a pass of no
                    # length that ends at once
                    if t > env.now:
                        yield at_time(env, t, self.end_phase)
                    self._deliver(self._finish(batch, t, t), batch)
                    break
                self._sample_kv(t)
                end = self._end_of(batch, t)
                if end >= horizon or not self.fast_forward:
                    # something may happen before this pass ends (or the run may stop):
                    # apply it at its end, as it comes
                    yield at_time(env, end, self.end_phase)
                    self._deliver(self._finish(batch, t, end), batch)
                    break
                # nothing can happen before the end: apply it now, deliver at its end
                done = self._finish(batch, t, end)
                if done or batch.rejected:
                    yield at_time(env, end, self.end_phase)
                    self._deliver(done, batch)
                    break
                t = end  # chain the next pass

    def _end_of(self, batch: Batch, start: float) -> float:
        """When a pass starting at `start` ends: start + prefill part + decode part, each
        part kept in whole nanoseconds (as the mocker does)."""
        st = self.step_time
        end = start
        if batch.n_prefill:
            n = batch.n_prefill
            end += whole_ns(st.prefill_ms(n, batch.sum_prefill_isl // n, batch.sum_prefix // n))
        if batch.n_decode:
            n = batch.n_decode
            # the mocker's decode load is the decoding sequences' token count (shared prefixes
            # counted once per sequence), not the pool's active blocks
            end += self._decode_only_ms(n, batch.sum_decode_context)
        return end

    def _decode_only_ms(self, n: int, sum_ctx: int) -> float:
        """The decode part of a pass of `n` sequences holding `sum_ctx` tokens."""
        return whole_ns(self.step_time.decode_ms(n, sum_ctx, self.total_kv_tokens, sum_ctx // n))

    def _record_stretch(
        self, start: float, ends: list[float], registered: list[tuple[int, int]]
    ) -> None:
        """Record fast-forwarded decode passes as the pass-by-pass loop would have."""
        n = len(self.scheduler.running)
        active = len(self.pool.refcount) + self.pool.n_private
        pass_done = self.recorder.pass_done
        t = start
        for end in ends:
            pass_done(self.idx, 0, t, end, 0, 0, n, active, 0)
            t = end
        if self.pool.pending_events:
            events = self.pool.take_events()
            for (i, h), (kind, h2) in zip(registered, events, strict=True):
                assert h == h2
                self.recorder.kv_event(ends[i], self.idx, 0, kind, "device", h)

    def _finish(self, batch: Batch, start: float, end: float) -> list[Request]:
        """Apply a pass at its end time: stamp tokens, release finished requests' blocks,
        record the pass. Returns the completed requests (delivered by `_deliver`)."""
        done, emitted = self.scheduler.finish(batch)
        for req in emitted:
            k = req.num_output_tokens
            if k == 1:
                req.first_token_ms = end
            elif k == 2:
                req.second_token_ms = end
            req.last_token_ms = end
            times = req.token_times_ms
            if times is not None:
                times.append(end)
        self.recorder.pass_done(
            self.idx,
            0,
            start,
            end,
            batch.prefill_tokens,
            batch.n_prefill,
            batch.n_decode,
            batch.active_blocks,
            batch.n_preempted,
        )
        if self.pool.pending_events:
            for kind, h in self.pool.take_events():
                self.recorder.kv_event(end, self.idx, 0, kind, "device", h)
        self._sample_kv(end)
        return done

    def _deliver(self, done: list[Request], batch: Batch) -> None:
        """End rejected and completed requests now (this may wake drivers and routers)."""
        for req, reason in batch.rejected:
            self.on_reject(req, reason)
        for req in done:
            self.on_complete(req)

    def _sample_kv(self, t: float) -> None:
        pool = self.pool
        level = (len(pool.refcount) + pool.n_private, len(pool.inactive))
        if level != self._kv_level:
            self._kv_level = level
            self.recorder.kv_level(t, self.name, "device", level[0], level[1])
