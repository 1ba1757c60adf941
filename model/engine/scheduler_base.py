"""The mechanics every vLLM-style scheduler rank shares: its queues and running set, its requests'
blocks, a pass's pricing summary, applying a finished pass, and a P/D rank's side of the handoff.
The policy (which requests a pass takes, admission, preemption) is servesim.engine.vllm.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from servesim.config.schema import EngineConfig
from servesim.engine.batch import Batch
from servesim.engine.speculative import BurstSampler
from servesim.kv.pool_base import Pool
from servesim.kv.tiers import RankTiers
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request, Status


@mypyc_attr(allow_interpreted_subclasses=True)
class SchedulerBase:
    """Waiting queue, running list and G1 pool of one rank; what a pass does to them once the
    policy (a subclass's `schedule`) has decided."""

    # whether the policy draws speculative bursts (`speculator`) when engine.speculative is on
    draws_bursts: ClassVar[bool] = False
    # whether, with speculation, a prefix hit is one block shorter (vLLM's drafter recomputes it)
    drafter_recomputes_a_block: ClassVar[bool] = False

    def __init__(
        self,
        cfg: EngineConfig,
        pool: Pool,
        hasher: BlockHasher,
        on_admit: Callable[[Request, int, float], None],
        role: str = "aggregated",
    ) -> None:
        self.cfg = cfg
        self.role = role  # aggregated | prefill | decode
        self.block_size = cfg.block_size
        self.pool = pool
        self.hasher = hasher
        self.on_admit = on_admit
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # a decode rank's requests waiting to reserve KV for a transfer, in acceptance order
        self.pending_reservations: deque[Request] = deque()
        # KV tiers below this rank's pool (None: HBM only); requests whose prefix is being
        # copied in from them (by index), and those whose copy landed, in landing order
        self.tiers: RankTiers | None = None
        self.loading: dict[int, Request] = {}
        self.loaded: deque[Request] = deque()
        # requests set aside, in the order they were (vLLM's skipped waiting requests, tried
        # ahead of the queue): those whose blocks were still on their way, and those whose
        # own copy from a lower tier is under way or has landed (loading, loaded)
        self.deferred: deque[Request] = deque()
        # blocks on their way into this pool by a load (content hash -> loads bringing it)
        self.loading_blocks: dict[int, int] = {}
        self.n_preemptions = 0
        # tokens each admission set out to compute (its sequence minus its prefix hit)
        self.n_committed_prefill_tokens = 0
        # speculative decoding's burst draws (servesim.engine.speculative; None: off), set by
        # the cluster that builds the rank (it knows the rank's scheduler id)
        self.speculator: BurstSampler | None = None
        # with it, requests that end without output in the pass in flight: they let go of
        # their blocks as the pass is formed, and are delivered at its end
        self.ending: list[Request] = []

    def enqueue(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.deferred)

    def queued(self) -> list[Request]:
        """Every request here that is not running: waiting, or set aside (or, with speculative
        decoding, ending without output in the pass in flight)."""
        return [*self.waiting, *self.deferred, *self.ending]

    def _block_hash(self, req: Request, j: int) -> int:
        prompt = req.prompt_hashes
        if j < len(prompt):
            return prompt[j]
        # a block holding generated tokens (or the prompt's tail with them): content nothing
        # else shares, as with the mocker's pseudo-random output tokens
        return self.hasher.unique_block(req.idx, j)

    def _known_hashes(self, req: Request) -> list[int]:
        """Hashes of every full block of the known sequence (prompt, then generated)."""
        n_full = req.seq_len // self.block_size
        prompt = req.prompt_hashes
        if n_full <= len(prompt):
            return prompt
        return prompt + [self._block_hash(req, j) for j in range(len(prompt), n_full)]

    def _register_full(self, req: Request, tokens: int = -1) -> None:
        """Register every block that is now completely computed (visible to later requests):
        of `req`'s first `tokens` tokens (default: those computed), those not registered yet."""
        if self.pool.enable_caching:
            first = len(req.held_hashes)
            last = (req.num_computed_tokens if tokens < 0 else tokens) // self.block_size
            if last <= first:
                return
            prompt = req.prompt_hashes
            if last <= len(prompt):
                self.pool.register_many(req, prompt[first:last])
            else:
                self.pool.register_many(req, [self._block_hash(req, j) for j in range(first, last)])

    def _prefix_hit(self, req: Request) -> tuple[list[int], int, int]:
        """A waiting request's known block hashes and its resident prefix: blocks, and how
        many of them are active, both short of the last known token's block when it still
        owes output (that token is always recomputed to produce the next one), and with
        speculative decoding on vLLM one block shorter still (a hit of one block or more)."""
        hashes = self._known_hashes(req)
        hit, hit_active = self.pool.match(hashes)
        if req.num_output_tokens < req.output_length:
            cap = (req.seq_len - 1) // self.block_size
            if self.speculator is not None and self.drafter_recomputes_a_block and hit and cap:
                # vLLM with a drafter (MTP, EAGLE) recomputes one more block of any prefix hit:
                # the drafter needs the hidden states of the last matched block
                cap = min(cap, hit) - 1
            hit = min(hit, cap)
            hit_active = min(hit_active, cap)
        return hashes, hit, hit_active

    def _leave(self, done: list[Request]) -> None:
        """Completed requests release their blocks, in this order, and leave the running set."""
        if not done:
            return
        for req in done:
            if not req.hold_kv:  # a prefill copy keeps its KV until the handoff releases it
                self.pool.release(req)
            req.status = Status.DONE
        self.running = [r for r in self.running if r.status == Status.RUNNING]

    def _admit_materialized(self, req: Request, batch: Batch, now_ms: float) -> None:
        """KV delivered by a transfer: straight to running, no KV check, no budget; it decodes
        its first token this pass."""
        req.materialized = False
        req.status = Status.RUNNING
        req.n_admissions += 1
        self.running.append(req)
        self.on_admit(req, 0, now_ms)
        item = (req, 0, 0, req.input_length)
        batch.items.append(item)
        batch.others.append(item)

    def _admit_delivered(self, batch: Batch, now_ms: float, start: int) -> None:
        """Admit the delivered requests among waiting[start:], in queue order, past the
        others."""
        for queue in (self.deferred, self.waiting):
            for req in [
                r for r in list(queue)[start if queue is self.waiting else 0 :] if r.materialized
            ]:
                if len(self.running) >= self.cfg.max_num_seqs:
                    return
                queue.remove(req)
                self._admit_materialized(req, batch, now_ms)

    def _summarise(
        self, batch: Batch, items: list[tuple[Request, int, int, int]], n_steps: int, steps_ctx: int
    ) -> None:
        """The batch's pricing summary from `items` and `n_steps` plain decode steps (one
        token each, of sequences summing to `steps_ctx` tokens), counted as they were formed."""
        n_prefill = sum_isl = sum_prefix = prefill_tokens = 0
        n_decode, sum_ctx = n_steps, steps_ctx
        decode_role = self.role == "decode"
        for req, _n, prompt_tokens, before in items:
            out = req.num_output_tokens
            if prompt_tokens > 0 and not decode_role:  # decode workers never price prefill
                n_prefill += 1
                sum_isl += before + prompt_tokens
                sum_prefix += before
                prefill_tokens += prompt_tokens
                if out == 0:
                    continue  # its first token comes from this prefill, at no decode cost
            seq = req.input_length + out
            if req.num_computed_tokens == seq and out < req.output_length:
                n_decode += 1
                sum_ctx += seq
        batch.n_prefill = n_prefill
        batch.sum_prefill_isl = sum_isl
        batch.sum_prefix = sum_prefix
        batch.prefill_tokens = prefill_tokens
        batch.n_decode = n_decode
        batch.sum_decode_context = sum_ctx
        batch.active_blocks = self.pool.n_active

    # ------------------------------------------------------------ speculative decoding

    def _tokens_left(self, req: Request) -> int:
        """Tokens `req` may still emit: its output, or up to max_model_len if that is nearer."""
        left = req.output_length - req.num_output_tokens
        max_len = self.cfg.max_model_len
        if max_len is not None and max_len - req.seq_len < left:
            left = max_len - req.seq_len
        return left

    def _end_without_output(self) -> None:
        """Requests with no output whose prompt this pass completes end with it: they let go
        of their blocks now, before the bursts are reserved (Dynamo completes them first),
        and `finish` delivers them at the pass end (`ending`)."""
        ended = [
            req
            for req in self.running
            if req.output_length == 0 and req.num_computed_tokens == req.input_length
        ]
        self._leave(ended)
        self.ending = ended

    def _caught_up(self) -> list[tuple[Request, int]]:
        """The running requests that caught up this pass and may still emit, in running order,
        each with its widest burst: k + 1 tokens (one on a prefill worker, whose copy emits
        only the first token), never more than it may still emit."""
        assert self.speculator is not None
        widest = 1 if self.role == "prefill" else self.speculator.max_tokens
        ready = []
        for req in self.running:
            if req.num_computed_tokens == req.seq_len:
                left = self._tokens_left(req)
                if left > 0:
                    ready.append((req, min(widest, left)))
        return ready

    def _burst_blocks(self, req: Request, tokens: int) -> int:
        """Blocks `req` lacks to hold `tokens` more tokens than its sequence."""
        held = len(req.held_hashes) + req.held_private_blocks
        return -(-(req.seq_len + tokens) // self.block_size) - held

    def _draw_bursts(self, batch: Batch, ready: list[tuple[Request, int]]) -> None:
        """The bursts of the requests that caught up (`ready`, whose widest bursts' blocks fit
        the free blocks): each takes the blocks of its widest burst (evicting cached blocks as
        any allocation does), then its burst is drawn; it keeps the blocks of the tokens the
        burst adds (not the last one's if that completes it) and gives the rest back empty, as
        Dynamo reserves for the widest bursts and releases what they left unused. The pass's
        decode part is these requests at their lengths before the burst (none on a prefill
        worker: its one token comes with the prefill)."""
        speculator = self.speculator
        assert speculator is not None
        pool = self.pool
        for req, widest in ready:
            pool.allocate(req, self._burst_blocks(req, widest))
        prefill_role = self.role == "prefill"
        bursts = []
        sum_ctx = 0
        for req, widest in ready:
            burst = widest if prefill_role else speculator.draw(widest)
            kept = burst - 1 if burst == self._tokens_left(req) else burst
            unused = -self._burst_blocks(req, kept)
            if unused > 0:
                pool.n_private -= unused
                req.held_private_blocks -= unused
            bursts.append((req, burst))
            sum_ctx += req.seq_len
        batch.bursts = bursts
        batch.n_decode = 0 if prefill_role else len(bursts)
        batch.sum_decode_context = 0 if prefill_role else sum_ctx
        batch.active_blocks = pool.n_active

    def reserve(self, req: Request) -> tuple[int, list[Any]] | None:
        """Take KV blocks for `req`'s prompt before its transfer: pin what is resident (as a
        prefix), allocate the rest, evicting cached blocks in LRU order. Returns the pinned
        prefix in blocks and the landings of the stores to G2 still reading blocks it evicted
        (the transfer waits for them), or None (nothing taken) if the running set is full or
        the blocks do not fit."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return None
        pool = self.pool
        hashes = req.prompt_hashes
        hit, hit_active = pool.match(hashes)
        need = -(-req.input_length // self.block_size) - hit
        if need > pool.free_blocks - (hit - hit_active):
            return None
        if hit:
            pool.acquire(req, hashes[:hit])
        if not pool.allocate(req, need):  # pragma: no cover - checked above
            raise RuntimeError(f"reservation check passed but allocation failed for {req}")
        fenced = pool.take_fenced() if pool.fenced else []
        tiers = self.tiers
        return hit, (tiers.landings(fenced) if tiers is not None and fenced else [])

    def materialize(self, req: Request) -> None:
        """The transfer landed: the prompt's KV is computed here, and its full blocks become
        cacheable (visible to later prefix matches, kept in the cache once released)."""
        req.num_computed_tokens = req.input_length
        self._register_full(req)

    def activate(self, req: Request) -> None:
        """A delivered request joins the waiting queue (in acceptance order among delivered
        requests) for a pass."""
        self.materialize(req)
        req.materialized = True
        req.status = Status.WAITING
        # with KV tiers its KV arrived through the connector: it waits among the deferred
        # requests, ahead of the queue (it passes a head that does not fit)
        waiting = self.deferred if self.tiers is not None else self.waiting
        k = len(waiting)
        while k > 0 and waiting[k - 1].materialized and waiting[k - 1].accept_seq > req.accept_seq:
            k -= 1
        waiting.insert(k, req)

    def release_held(self, req: Request) -> None:
        """A finished request that held its KV (a prefill source) lets go of it."""
        self.pool.release(req)

    def _never_fits(self, req: Request) -> str:
        cfg = self.cfg
        if cfg.max_model_len is not None and req.input_length >= cfg.max_model_len:
            return f"prompt of {req.input_length} tokens reaches max_model_len {cfg.max_model_len}"
        blocks = -(-req.input_length // self.block_size)
        if blocks > self.pool.capacity_blocks:
            return (
                f"prompt of {req.input_length} tokens needs {blocks} KV blocks; "
                f"the pool holds {self.pool.capacity_blocks}"
            )
        return ""

    def finish(
        self,
        batch: Batch,
        end_ms: float,
        on_first_token: Callable[[Request], None] | None = None,
    ) -> list[Request]:
        """Apply a pass at its end, `end_ms`: every request that caught up emits a token,
        stamped then (`on_first_token` is told of each first token); returns the requests that
        completed. Completed requests release their blocks: zero-output ones first, then the
        others, each in running order. With speculative decoding a request emits its burst
        (`finish_bursts`)."""
        if batch.bursts is not None:
            return self.finish_bursts(batch, end_ms, on_first_token)
        max_len = self.cfg.max_model_len
        zero_out: list[Request] = []
        last_token: list[Request] = []
        for req, _n, _p, _b in batch.items:
            out = req.num_output_tokens
            if req.num_computed_tokens != req.input_length + out:
                continue  # mid-prefill chunk
            if req.output_length == 0:
                zero_out.append(req)
                continue
            out += 1
            req.num_output_tokens = out
            if out == 1:
                req.first_token_ms = end_ms
                if on_first_token is not None:
                    on_first_token(req)
            elif out == 2:
                req.second_token_ms = end_ms
            req.last_token_ms = end_ms
            times = req.token_times_ms
            if times is not None:
                times.append(end_ms)
            if out >= req.output_length or (
                max_len is not None and req.input_length + out >= max_len
            ):
                last_token.append(req)
        done = zero_out + last_token
        self._leave(done)
        return done

    def finish_bursts(
        self,
        batch: Batch,
        end_ms: float,
        on_first_token: Callable[[Request], None] | None = None,
    ) -> list[Request]:
        """`finish` with speculative decoding: each request of `batch.bursts` (those that
        caught up this pass, in running order, with the tokens drawn for them when the pass
        was formed) emits its whole burst, every token stamped at the pass end. Its last
        token is left to compute next pass (as a plain decode step leaves its one token);
        the blocks the burst filled before it become cacheable."""
        max_len = self.cfg.max_model_len
        zero_out, self.ending = self.ending, []  # (they let go of their blocks already)
        last_token: list[Request] = []
        assert batch.bursts is not None
        for req, burst in batch.bursts:
            before = req.num_output_tokens
            out = before + burst
            req.num_output_tokens = out
            if before == 0:
                req.first_token_ms = end_ms
                if on_first_token is not None:
                    on_first_token(req)
            if before < 2 <= out:
                req.second_token_ms = end_ms
            req.last_token_ms = end_ms
            times = req.token_times_ms
            if times is not None:
                times.extend([end_ms] * burst)
            req.num_computed_tokens = req.input_length + out - 1
            self._register_full(req)
            if out >= req.output_length or (
                max_len is not None and req.input_length + out >= max_len
            ):
                last_token.append(req)
        self._leave(last_token)
        return zero_out + last_token
