"""An engine worker: the SimPy process that runs one forward pass after another.

The worker sleeps on a wake-up event while it has nothing to do. With work, it lets every event
of the current instant land first (arrivals join the pass that starts now), asks its scheduler
for a batch, prices the pass with the timing model (prefill part + decode part), holds for that
long, then applies the pass: tokens stamped at the pass end, requests completed, blocks released,
KV events published.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import simpy

from model.clock import PASS_END, PASS_START, at
from model.engine.vllm import Batch, VllmScheduler
from model.kv.block_pool import BlockPool
from model.metrics.recorder import Recorder
from model.timing.base import StepTime
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
        self._wake: simpy.Event | None = None
        self._kv_level = (-1, -1)
        self.n_passes = 0
        self.busy_ms = 0.0
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
                yield at(env, 0.0, PASS_START)
            start = env.now
            batch = sched.schedule()
            if batch.items:
                self._sample_kv(start)
                yield at(env, self._price(batch), PASS_END)
                self._apply(batch, start)
            elif batch.rejected or batch.n_preempted:
                # a pass with nothing to compute (only rejections or a request preempting
                # itself) ends at once
                self._reject(batch)
                self._sample_kv(start)
            elif sched.has_work():
                raise RuntimeError(f"{self.name} stalled at {start} ms with queued work")

    def _price(self, batch: Batch) -> float:
        st = self.step_time
        ms = 0.0
        if batch.n_prefill:
            n = batch.n_prefill
            ms += st.prefill_ms(n, batch.sum_prefill_isl // n, batch.sum_prefix // n)
        if batch.n_decode:
            n = batch.n_decode
            # the mocker's decode load is the decoding sequences' token count (shared prefixes
            # counted once per sequence), not the pool's active blocks
            ms += st.decode_ms(
                n, batch.sum_decode_context, self.total_kv_tokens, batch.sum_decode_context // n
            )
        # the mocker keeps durations in whole nanoseconds
        return round(ms, 6)

    def _apply(self, batch: Batch, start: float) -> None:
        now = self.env.now
        done, emitted = self.scheduler.finish(batch)
        for req in emitted:
            k = req.num_output_tokens
            if k == 1:
                req.first_token_ms = now
            elif k == 2:
                req.second_token_ms = now
            req.last_token_ms = now
            times = req.token_times_ms
            if times is not None:
                times.append(now)
        self.n_passes += 1
        self.busy_ms += now - start
        self.recorder.pass_done(
            self.idx,
            0,
            start,
            now,
            batch.prefill_tokens,
            batch.n_prefill,
            batch.n_decode,
            batch.active_blocks,
            batch.n_preempted,
        )
        if self.pool.pending_events:
            for kind, h in self.pool.take_events():
                self.recorder.kv_event(now, self.idx, 0, kind, "device", h)
        self._reject(batch)
        for req in done:
            self.on_complete(req)
        self._sample_kv(now)

    def _reject(self, batch: Batch) -> None:
        for req, reason in batch.rejected:
            self.on_reject(req, reason)

    def _sample_kv(self, t: float) -> None:
        level = (self.pool.n_active, self.pool.n_cached)
        if level != self._kv_level:
            self._kv_level = level
            self.recorder.kv_level(t, self.name, "device", level[0], level[1])
