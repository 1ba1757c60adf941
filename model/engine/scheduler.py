"""What a scheduler policy is: one rank's queue and running set, and its decision each pass.

The worker drives a scheduler through four calls, pass after pass:

    enqueue(req)            a request reaches this rank
    has_work()              whether anything waits or runs here
    schedule(now_ms)        form the pass that starts now (a Batch: who computes what)
    finish(batch, end_ms)   apply the pass at its end (tokens, completions); returns the
                            completed requests

A P/D pool adds the handoff's four (a decode rank reserves KV for a transfer and activates the
request when it lands; a prefill rank releases what its finished copy held). Policies are
chosen by `engine.kind` from the registry (servesim.engine.registry); `VllmScheduler` is the
shipped one, and the way to write another is to subclass it (docs/schedulers.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from servesim.engine.batch import Batch
from servesim.kv.pool_base import Pool
from servesim.kv.tiers import RankTiers
from servesim.workload.request import Request


class Scheduler(Protocol):
    """One rank's scheduling policy (VllmScheduler is the shipped one)."""

    pool: Pool  # the rank's G1 KV pool
    block_size: int
    tiers: RankTiers | None  # G2 / G3 below the pool, if configured
    deferred: deque[Request]  # requests set aside waiting for blocks on their way
    pending_reservations: deque[Request]  # a decode rank's requests waiting for KV
    running: list[Request]
    n_preemptions: int
    n_committed_prefill_tokens: int

    # ------------------------------------------------------------ every pass
    def enqueue(self, req: Request) -> None: ...
    def has_work(self) -> bool: ...
    def schedule(self, now_ms: float) -> Batch: ...
    def finish(
        self,
        batch: Batch,
        end_ms: float,
        on_first_token: Callable[[Request], None] | None = None,
    ) -> list[Request]: ...
    def queued(self) -> list[Request]:
        """Every request here that is not running (for the run's end: what was in flight)."""
        ...

    # ------------------------------------------------------------ the P/D handoff
    def reserve(self, req: Request) -> tuple[int, list[Any]] | None: ...
    def materialize(self, req: Request) -> None: ...
    def activate(self, req: Request) -> None: ...
    def release_held(self, req: Request) -> None: ...
