"""vLLM v1-style continuous batching for one scheduler rank (the Dynamo mocker's `vllm` core).

Per pass, with a budget of `max_num_batched_tokens`:

1. Running requests first, in order: each takes what it still lacks (a decode token, or the next
   prefill chunk) up to the remaining budget. If its KV blocks cannot be allocated, a victim is
   preempted (the last running request under `lifo`, the first under `fifo`): it gives back all
   its KV, restarts from zero (recompute), and goes to the front of `waiting`.
2. Then, only if nothing was preempted and fewer than `max_num_seqs` run, the head of `waiting`
   (strict FIFO, head-of-line blocking): prefix lookup capped so the last prompt token is always
   recomputed, admission only if the blocks it lacks fit the free blocks, chunked to the budget.
3. Full blocks are registered at allocation time, so a later request in the same pass can hit.
4. At pass end every request that caught up emits one token (all stamped at the pass end);
   a request with its last token (or with zero output) completes and releases its blocks.

A request whose prompt can never fit (`>= max_model_len`, or more blocks than the pool) is
rejected with a reason rather than queued forever.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from model.config.schema import VllmEngineConfig
from model.kv.block_pool import BlockPool
from model.workload.hashing import BlockHasher
from model.workload.request import Request, Status


def choose_victim(running: list[Request], mode: str) -> Request:
    """The request a failed allocation preempts: newest (`lifo`) or oldest (`fifo`)."""
    return running[-1] if mode == "lifo" else running[0]


def prefix_cap_blocks(req: Request, block_size: int) -> int:
    """Most blocks a prefix hit may cover: the last known token is recomputed unless the
    request has nothing left to generate (a zero-output request may be served from cache)."""
    seq = req.seq_len
    if req.num_output_tokens < req.output_length:
        return (seq - 1) // block_size
    return seq // block_size


class Batch:
    """What one pass computes: (request, tokens, prefix before the chunk, was prefill) items."""

    __slots__ = ("items", "n_prefill", "sum_prefill_isl", "sum_prefix", "prefill_tokens",
                 "n_decode", "sum_decode_context", "n_preempted", "active_blocks")

    def __init__(self) -> None:
        self.items: list[tuple[Request, int, int, bool]] = []
        self.n_prefill = 0
        self.sum_prefill_isl = 0
        self.sum_prefix = 0
        self.prefill_tokens = 0
        self.n_decode = 0
        self.sum_decode_context = 0
        self.n_preempted = 0
        self.active_blocks = 0


class VllmScheduler:
    """Waiting queue, running list and G1 pool of one rank; decisions per pass."""

    def __init__(
        self,
        cfg: VllmEngineConfig,
        pool: BlockPool,
        hasher: BlockHasher,
        on_admit: Callable[[Request, int], None],
        on_reject: Callable[[Request, str], None],
    ) -> None:
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.pool = pool
        self.hasher = hasher
        self.on_admit = on_admit
        self.on_reject = on_reject
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.n_preemptions = 0
        self.n_rejections = 0

    # ------------------------------------------------------------------ queue

    def enqueue(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ blocks

    def _block_hash(self, req: Request, j: int) -> int:
        prompt = req.prompt_hashes
        if j < len(prompt):
            return prompt[j]
        k = j - len(prompt)
        out = req.output_hashes
        if k >= len(out):
            out.extend(self.hasher.unique_blocks(k + 1 - len(out)))
        return out[k]

    def _grow(self, req: Request, tokens: int) -> bool:
        """Give `req` KV for `tokens` more computed tokens; register blocks that became full."""
        bs = self.block_size
        target = req.num_computed_tokens + tokens
        need = -(-target // bs) - len(req.held_hashes) - req.held_private_blocks
        if need > 0 and not self.pool.allocate(req, need):
            return False
        if self.pool.enable_caching:
            for j in range(len(req.held_hashes), target // bs):
                self.pool.register(req, self._block_hash(req, j))
        return True

    def _preempt(self, victim: Request, batch: Batch) -> int:
        """Recompute preemption; returns the budget the victim had taken this pass."""
        self.pool.release(victim)
        self.running.remove(victim)
        returned = 0
        for k, item in enumerate(batch.items):
            if item[0] is victim:
                returned = item[1]
                del batch.items[k]
                break
        victim.num_computed_tokens = 0
        victim.prefilling = True
        victim.n_preemptions += 1
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        self.n_preemptions += 1
        batch.n_preempted += 1
        return returned

    # ------------------------------------------------------------------ one pass

    def schedule(self) -> Batch:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        batch = Batch()
        items = batch.items
        running = self.running
        lifo = cfg.preemption_mode == "lifo"

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            want = min(req.seq_len - req.num_computed_tokens, budget)
            dropped = False
            while not self._grow(req, want):
                victim = running[-1] if lifo else running[0]
                victim_pos = i if victim is req else (len(running) - 1 if lifo else 0)
                budget += self._preempt(victim, batch)
                if victim is req:
                    dropped = True
                    break
                if victim_pos < i:
                    i -= 1
            if dropped:
                continue
            items.append((req, want, req.num_computed_tokens, req.prefilling))
            req.num_computed_tokens += want
            budget -= want
            i += 1

        if batch.n_preempted == 0:
            self._admit(batch, budget)

        for req, n, prefix, prefilling in items:
            if prefilling:
                batch.n_prefill += 1
                batch.sum_prefill_isl += prefix + n
                batch.sum_prefix += prefix
                batch.prefill_tokens += n
            else:
                batch.n_decode += 1
                batch.sum_decode_context += req.seq_len
        batch.active_blocks = self.pool.n_active
        return batch

    def _admit(self, batch: Batch, budget: int) -> None:
        cfg = self.cfg
        bs = self.block_size
        pool = self.pool
        waiting = self.waiting
        running = self.running
        while budget > 0 and waiting and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            if req.n_admissions == 0:
                reason = self._never_fits(req)
                if reason:
                    self._reject(req, reason)
                    continue
            seq = req.seq_len
            if req.output_hashes or seq > req.input_length:
                hashes = req.prompt_hashes + [
                    self._block_hash(req, j)
                    for j in range(len(req.prompt_hashes), seq // bs)
                ]
            else:
                hashes = req.prompt_hashes
            hit, hit_active = pool.match(hashes, prefix_cap_blocks(req, bs))
            needed = -(-seq // bs) - hit_active
            if needed > pool.free_blocks:
                if not running and not batch.items:
                    # nothing holds blocks that could ever be freed: it cannot fit, ever
                    self._reject(
                        req,
                        f"sequence of {seq} tokens needs {-(-seq // bs)} KV blocks; "
                        f"the pool holds {pool.capacity_blocks}",
                    )
                    continue
                break
            cached = hit * bs
            if not cfg.enable_chunked_prefill and seq - cached > budget:
                if seq - cached > cfg.max_num_batched_tokens:
                    # without chunking a prefill must fit one pass's budget
                    self._reject(
                        req,
                        f"uncached prompt of {seq - cached} tokens exceeds "
                        f"max_num_batched_tokens {cfg.max_num_batched_tokens} "
                        "and chunked prefill is disabled",
                    )
                    continue
                break
            waiting.popleft()
            if hit:
                pool.acquire(req, hashes[:hit])
            req.num_computed_tokens = cached
            want = min(seq - cached, budget)
            if not self._grow(req, want):  # pragma: no cover - guarded by the check above
                raise RuntimeError(f"admission check passed but allocation failed for {req}")
            req.status = Status.RUNNING
            req.prefilling = True
            req.n_admissions += 1
            self.on_admit(req, min(cached, req.input_length))
            running.append(req)
            batch.items.append((req, want, cached, True))
            req.num_computed_tokens += want
            budget -= want

    def _reject(self, req: Request, reason: str) -> None:
        self.waiting.popleft()
        self.n_rejections += 1
        self.on_reject(req, reason)

    def _never_fits(self, req: Request) -> str:
        cfg = self.cfg
        if cfg.max_model_len is not None and req.input_length >= cfg.max_model_len:
            return (
                f"prompt of {req.input_length} tokens reaches max_model_len {cfg.max_model_len}"
            )
        blocks = -(-req.input_length // self.block_size)
        if blocks > self.pool.capacity_blocks:
            return (
                f"prompt of {req.input_length} tokens needs {blocks} KV blocks; "
                f"the pool holds {self.pool.capacity_blocks}"
            )
        return ""

    def finish(self, batch: Batch, now_ms: float) -> list[Request]:
        """Apply a pass that ended at `now_ms`: emit tokens, complete requests. Returns the
        requests that completed."""
        done: list[Request] = []
        max_len = self.cfg.max_model_len
        for req, _n, _prefix, _prefilling in batch.items:
            if req.num_computed_tokens != req.seq_len or req.status != Status.RUNNING:
                continue  # mid-prefill chunk
            req.prefilling = False
            if req.output_length == 0:
                done.append(req)
                continue
            k = req.num_output_tokens = req.num_output_tokens + 1
            if k == 1:
                req.first_token_ms = now_ms
            elif k == 2:
                req.second_token_ms = now_ms
            times = req.token_times_ms
            if times is not None:
                times.append(now_ms)
            req.last_token_ms = now_ms
            if k >= req.output_length or (max_len is not None and req.seq_len >= max_len):
                done.append(req)
        if done:
            for req in done:
                self.pool.release(req)
                req.status = Status.DONE
            self.running = [r for r in self.running if r.status == Status.RUNNING]
        return done
