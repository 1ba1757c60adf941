"""TensorRT-LLM's capacity scheduler `guaranteed_no_evict` on vLLM's passes, for one scheduler
rank (the Dynamo mocker's `trtllm` backend).

The passes are vLLM's (servesim.engine.vllm): running requests first, then FIFO admission, one
token budget (`max_num_batched_tokens`), chunked prefill, `max_num_seqs`. What differs:

1. A sequence never outgrows the pool: a request's output is clamped so that prompt + output
   fits `min(max_model_len, pool tokens)`, and a prompt that reaches that limit is rejected
   when it reaches the head of the queue.
2. Admission reserves to completion. The head of the queue is admitted only when its whole
   footprint, ceil((prompt + output) / block_size) blocks less its active cached prefix, fits
   in the free blocks left once every running request has its remaining to-completion blocks
   set aside (on a P/D decode rank, also the completion tails of the requests reserved there
   that do not run yet). vLLM asks only that the blocks of the known sequence fit.
3. So nothing is ever preempted: every running request is sure of its blocks.
4. A prefix hit may cover the whole prompt (vLLM always recomputes the last prompt token): the
   first token then costs a decode step, not a prefill.

In P/D, a decode rank reserves a request's KV fresh (no resident prefix is reused) and only
when its whole to-completion footprint fits beside the running requests' and the promised
tails; a prefill worker prices no decode (a prompt it holds whole costs it nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servesim.config.schema import EngineConfig
from servesim.engine.batch import Batch
from servesim.engine.vllm import VllmScheduler
from servesim.kv.pool_base import Pool
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request


class TrtllmScheduler(VllmScheduler):
    """vLLM's passes with admission by to-completion reservation and no preemption."""

    def __init__(
        self,
        cfg: EngineConfig,
        pool: Pool,
        hasher: BlockHasher,
        on_admit: Callable[[Request, int, float], None],
        role: str = "aggregated",
    ) -> None:
        # the longest sequence: what the model allows and the whole pool holds. Generation
        # stops there as at a model length, which is the mocker's clamp of the output
        pool_tokens = pool.capacity_blocks * cfg.block_size
        limit = min(cfg.max_model_len or pool_tokens, pool_tokens)
        capped = cfg.model_copy(update={"max_model_len": limit})
        super().__init__(capped, pool, hasher, on_admit, role)
        self.max_seq_tokens = limit
        # a P/D decode rank's requests with KV reserved here that do not run yet (in transfer,
        # or delivered and waiting), by index: the rest of their footprint is promised to them
        self.promised: dict[int, Request] = {}

    # ------------------------------------------------------------ 1. the sequence limit

    def _never_fits(self, req: Request) -> str:
        """Why a fresh request at the head of the queue is rejected: its prompt leaves no
        room for a token."""
        if req.input_length >= self.max_seq_tokens:
            return (
                f"prompt of {req.input_length} tokens leaves no room for output: a sequence "
                f"holds at most {self.max_seq_tokens} tokens (max_model_len, or the KV pool: "
                "TRT-LLM guaranteed_no_evict)"
            )
        return ""

    # ------------------------------------------------------------ 2. admission to completion

    def to_completion_blocks(self, req: Request) -> int:
        """The blocks `req` holds once its last output token is computed (clamped output)."""
        tokens = min(req.input_length + req.output_length, self.max_seq_tokens)
        return -(-tokens // self.block_size)

    def _lacks(self, req: Request) -> int:
        """The blocks `req` will still take before it completes."""
        return self.to_completion_blocks(req) - len(req.held_hashes) - req.held_private_blocks

    def _reserved_blocks(self) -> int:
        """Blocks set aside for what running (and promised) requests lack to complete."""
        lacks = self._lacks
        n = sum(lacks(r) for r in self.running)
        if self.promised:
            n += sum(lacks(r) for r in self.promised.values())
        return n

    def _admission_fits(self, req: Request, needed: int) -> bool:
        # `needed` covers the known sequence; the rest of the footprint is still to come
        known = -(-req.seq_len // self.block_size)
        footprint = needed + self.to_completion_blocks(req) - known
        free = self.pool.free_blocks
        # (the first test spares summing the reservations when the free blocks already fall short)
        return footprint <= free and footprint <= free - self._reserved_blocks()

    # ------------------------------------------------------------ P/D: a decode rank's side

    def reserve(self, req: Request) -> tuple[int, list[Any]] | None:
        """KV for `req`'s prompt before its transfer, all of it fresh (a resident prefix is
        not reused), taken only if its whole to-completion footprint fits beside what running
        and promised requests lack; None (nothing taken) otherwise."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return None
        if self.to_completion_blocks(req) > self.pool.free_blocks - self._reserved_blocks():
            return None
        if not self.pool.allocate(req, -(-req.input_length // self.block_size)):
            raise RuntimeError(f"reservation check passed but allocation failed for {req}")
        if self._lacks(req):
            self.promised[req.idx] = req
        return 0, []

    def _admit_materialized(self, req: Request, batch: Batch, now_ms: float) -> None:
        self.promised.pop(req.idx, None)  # it runs: what it lacks is a running request's now
        super()._admit_materialized(req, batch, now_ms)

    # ------------------------------------------------------------ 3. no preemption

    def _preempt(self, victim: Request, batch: Batch) -> None:
        raise RuntimeError(
            f"guaranteed_no_evict would preempt {victim}: the reservations under-counted"
        )

    # ------------------------------------------------------------ 4. whole-prompt hits

    def _prefix_hit(self, req: Request) -> tuple[list[int], int, int]:
        hashes = self._known_hashes(req)
        hit, hit_active = self.pool.match(hashes)
        return hashes, hit, hit_active

    def _summarise(
        self, batch: Batch, items: list[tuple[Request, int, int, int]], n_steps: int, steps_ctx: int
    ) -> None:
        super()._summarise(batch, items, n_steps, steps_ctx)
        if self.role == "prefill":
            # a prefill worker prices no decode: a prompt it holds whole yields the prefill
            # copy's one token at no cost (as decode workers price no prefill)
            batch.n_decode = batch.sum_decode_context = 0
