"""KV reservations on a decode rank: the requests waiting for KV there, each waiting on an event
the rank fires when it has taken blocks for the request's prompt (Dynamo's P/D replay rules).

A request waits in acceptance order (FIFO). An attempt looks at the head only and reserves at
most one, and only when the rank is between passes: when a request for it arrives, when one of
its passes ends, when a transfer lands on it, or when a store to G2 gives blocks back. A head
that does not fit (blocks, or `max_num_seqs` running) blocks the queue until the rank frees
capacity (its pool's `generation` moves). With a G2 tier, a reservation may evict cached blocks
a store to G2 is still reading: it holds its blocks and is reserved at the first attempt after
those stores land.
"""

from __future__ import annotations

from collections import deque

import simpy

from servesim.clock import TRANSFER_END, fire
from servesim.engine.worker import Rank, Worker
from servesim.workload.request import Request


class Reservations:
    """The requests waiting for KV on one decode rank (a `KvWaiter` of its worker)."""

    __slots__ = (
        "env",
        "worker",
        "rank",
        "pending",
        "failed_generation",
        "held",
        "block_size",
        "only_missing",
        "awaiting_link",
    )

    def __init__(
        self,
        env: simpy.Environment,
        worker: Worker,
        rank: Rank,
        only_missing: bool,
        awaiting_link: set[int],
    ) -> None:
        self.env = env
        self.worker = worker
        self.rank = rank
        # shared with the rank's scheduler: while a request waits here it admits only
        # delivered requests (Dynamo's rule)
        self.pending: deque[Request] = rank.scheduler.pending_reservations
        self.failed_generation = -1  # the rank's pool generation when its head last failed
        # the head's blocks, taken while stores to G2 still read some of them: its prefix
        # hit in blocks and those stores' landings
        self.held: tuple[int, list[simpy.Event]] | None = None
        self.block_size = rank.scheduler.block_size
        # link.timing_mode=destination_missing: only the blocks the rank lacked move
        self.only_missing = only_missing
        # requests reserved (on any rank) whose transfer is not on its link yet: shared with
        # the cluster, which may not look ahead past them (they start within the instant)
        self.awaiting_link = awaiting_link

    def request(self, req: Request) -> simpy.Event:
        """Queue `req` for KV here; the event fires once blocks are taken for its prompt (its
        `transfer_tokens` then say how many tokens the link must move)."""
        req.reserved = self.env.event()
        self.pending.append(req)
        return req.reserved

    def attempt(self) -> None:
        """One attempt: the queue's head, if it fits now."""
        if not self.pending:
            return
        pool = self.rank.pool
        req = self.pending[0]
        held = self.held
        if held is not None:
            reused_blocks, landings = held
            if not all(e.processed for e in landings):
                return
            self.held = None
        else:
            if pool.generation == self.failed_generation:
                return  # nothing freed since the head last failed
            taken = self.rank.scheduler.reserve(req)
            if taken is None:
                self.failed_generation = pool.generation
                return
            reused_blocks, landings = taken
            self.worker.sample_kv()
            if landings:
                self.held = (reused_blocks, landings)
                self.failed_generation = pool.generation  # (a landing tries it again)
                return
        self.pending.popleft()
        self.failed_generation = -1
        req.destination_reserved_ms = self.env.now
        bs = self.block_size
        if self.only_missing:
            req.transfer_tokens = (-(-req.input_length // bs) - reused_blocks) * bs
        else:
            req.transfer_tokens = req.input_length
        assert req.reserved is not None
        self.awaiting_link.add(req.idx)  # until the handoff puts its transfer on the link
        fire(self.env, req.reserved, TRANSFER_END)

    # --------------------------------------------------------------- as a KvWaiter of the worker

    def may_proceed(self) -> bool:
        """Whether an attempt at the worker's next pass end may succeed (a head not yet tried
        since the rank last freed capacity)."""
        return bool(self.pending) and self.rank.pool.generation != self.failed_generation

    def pass_ended(self) -> None:
        self.attempt()

    def blocks_freed(self, at_pass_end: bool) -> None:
        """A store to G2 landed between passes and gave G1 blocks back. At the instant a pass
        ended, Dynamo settles the landing before the pass end's attempt: a rank whose attempt
        then reserved is not tried again."""
        if at_pass_end and self.failed_generation == -1:
            return
        self.attempt()
