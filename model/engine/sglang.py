"""SGLang's scheduling for one rank (the Dynamo mocker's `sglang` backend, SGLang v0.5 semantics).

Where vLLM mixes prefill chunks and decode steps in one pass, SGLang runs one or the other:

1. **Prefill first.** If any waiting request can be admitted, the pass is a prefill (extend)
   pass: it computes the admitted requests' prompt chunks and nothing else. Running requests do
   not decode that pass. A request whose last chunk is in the pass gets its first token at the
   pass end; a chunk continuation goes back to the head of the queue.
2. **Otherwise one decode step** for every running request.

Admission walks the queue in order (`fifo`, or `lpm`: longest cached prefix first) and stops at
the first request that does not fit (head-of-line blocking). A request fits if its chunk, rounded
up to whole pages, fits the prefill budget (`max_prefill_tokens`) and the chunk budget
(`chunked_prefill_size`), and the chunk plus the request's own future output (at most
`clip_max_new_tokens`) fits in the free pages *less a reserve kept back for the requests already
running*: each one's remaining output (clipped) times `new_token_ratio`. The ratio starts at
0.7 x `schedule_conservativeness` and falls linearly with each decode pass to 0.14 of that over
600 of them; a retraction re-estimates it from the requests left running (what they decoded plus
20 steps each, over their whole outputs), a failed allocation puts it back to its start. So
SGLang admits only what it expects to be able to finish, and a request that does not fit waits:
nothing is admitted only to be preempted a pass later.

When a decode step needs more pages than are free (the reserve was a guess), the running request
with the fewest decoded tokens is **retracted**: its pages go back to the prefix cache (so its
prompt, and what it has decoded, are cached if it comes back soon), and it goes to the back of
the queue, to be admitted again (a readmission) with whatever of it is still cached.

Pages are the engine's blocks (`engine.block_size`, 1 token by default): the prefix (radix)
cache matches whole pages, at most the sequence less its last token, and evicts the least
recently touched branch first (servesim.kv.radix_pool). A decode step caches the page of the
token it produces with the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import ClassVar

from servesim.config.schema import EngineConfig
from servesim.engine.batch import Batch
from servesim.engine.scheduler_base import SchedulerBase
from servesim.kv.pool_base import Pool
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request, Status

# SGLang's defaults for the keys engine=sglang leaves null (conf/engine/sglang.yaml sets them)
DEFAULT_MAX_PREFILL_TOKENS = 16384
DEFAULT_CHUNKED_PREFILL_SIZE = 8192
DEFAULT_CLIP_MAX_NEW_TOKENS = 4096
# new_token_ratio: starts at 0.7 x schedule_conservativeness, falls to 0.14 of that in 600
# decode passes
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_PASSES = 600
# lpm: ordered only while at most this many wait; a short match whose first 32 tokens repeat
# another waiting request's goes behind (they would share it once the first is computed)
# after a retraction new_token_ratio is re-estimated with this many steps' room per survivor
RETRACT_DECODE_STEPS = 20
LPM_MAX_WAITING = 128
LPM_SHORT_MATCH_TOKENS = 32


class SglangScheduler(SchedulerBase):
    """SGLang's policy for one rank: prefill-only or decode-only passes, reserve-then-wait
    admission, retraction of the least-decoded request under decode memory pressure."""

    draws_bursts: ClassVar[bool] = True
    radix_cache: ClassVar[bool] = True  # its rank's pool is a radix tree (RadixPool)

    def __init__(
        self,
        cfg: EngineConfig,
        pool: Pool,
        hasher: BlockHasher,
        on_admit: Callable[[Request, int, float], None],
        role: str = "aggregated",
    ) -> None:
        super().__init__(cfg, pool, hasher, on_admit, role)
        self.max_prefill_tokens = cfg.max_prefill_tokens or DEFAULT_MAX_PREFILL_TOKENS
        self.chunked_prefill_size = cfg.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL_SIZE
        self.clip_max_new_tokens = cfg.clip_max_new_tokens or DEFAULT_CLIP_MAX_NEW_TOKENS
        self.schedule_policy = cfg.schedule_policy or "fifo"
        self.prefill_decode_interval = cfg.prefill_decode_interval or 0
        conservativeness = cfg.schedule_conservativeness
        self.init_new_token_ratio = INIT_NEW_TOKEN_RATIO * (
            1.0 if conservativeness is None else conservativeness
        )
        min_ratio = self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.min_new_token_ratio = min_ratio
        self.new_token_ratio_step = (
            self.init_new_token_ratio - min_ratio
        ) / NEW_TOKEN_RATIO_DECAY_PASSES
        self.new_token_ratio = self.init_new_token_ratio
        self.ratio_after_retraction = self.init_new_token_ratio
        self.decode_passes_owed = 0  # decode-only passes still due (prefill_decode_interval)
        self.n_retractions = 0

    # ------------------------------------------------------------------ the pass

    def schedule(self, now_ms: float) -> Batch:
        """A prefill pass if anything waiting can be admitted, else one decode step."""
        batch = Batch()
        if self.schedule_policy == "lpm":
            self._order_longest_prefix_first()
        memory_short = False
        if self._promote_delivered(batch, now_ms):
            pass  # a pass that takes in delivered KV admits nothing else: it decodes
        elif self.pending_reservations:
            pass  # a request waits to reserve KV here: nothing needing fresh KV goes first
        elif self.waiting and not (self.decode_passes_owed and self.running):
            memory_short = self._admit(batch, now_ms)
        if batch.items:
            self.decode_passes_owed = self.prefill_decode_interval
        else:
            if self.decode_passes_owed:
                self.decode_passes_owed -= 1
            self._decode_step(batch)
        if batch.n_preempted:
            self.new_token_ratio = self.ratio_after_retraction
        elif memory_short:
            self.new_token_ratio = self.init_new_token_ratio
        elif not batch.items or batch.n_decode:
            self.new_token_ratio = max(
                self.new_token_ratio - self.new_token_ratio_step, self.min_new_token_ratio
            )
        batch.active_blocks = self.pool.n_active
        return batch

    # ------------------------------------------------------------------ prefill

    def _promote_delivered(self, batch: Batch, now_ms: float) -> bool:
        """P/D decode rank: requests whose KV was delivered (activated) join the running set
        first, in delivery order, without a KV check; whether any did."""
        delivered = [r for r in self.waiting if r.materialized]
        for req in delivered:
            if len(self.running) >= self.cfg.max_num_seqs:
                break
            self.waiting.remove(req)
            req.materialized = False
            req.status = Status.RUNNING
            req.n_admissions += 1
            self.running.append(req)
            self.on_admit(req, 0, now_ms)
        return bool(delivered)

    def activate(self, req: Request) -> None:
        """A delivered request joins the waiting queue in delivery (landing) order: SGLang
        takes prebuilt requests into its running set in the order their KV arrived."""
        self.materialize(req)
        req.materialized = True
        req.status = Status.WAITING
        self.waiting.append(req)

    def _admit(self, batch: Batch, now_ms: float) -> bool:
        """Admit waiting requests, in order, into a prefill pass while they fit (see the module
        docstring); returns whether one stopped admission because its pages could not be
        allocated (SGLang then resets new_token_ratio)."""
        page = self.block_size
        pool = self.pool
        running = self.running
        waiting = self.waiting
        clip = self.clip_max_new_tokens
        reserved = (
            sum(min(r.output_length - r.num_output_tokens, clip) for r in running)
            * self.new_token_ratio
        )
        rem_total = pool.free_blocks * page - reserved
        rem_input = self.max_prefill_tokens
        rem_chunk = self.chunked_prefill_size
        seats = self.cfg.max_num_seqs - len(running)
        finished: list[Request] = []  # prompts complete this pass, in admission order
        partial: Request | None = None  # the chunk continuation, back to the head
        oom = False
        while waiting and len(finished) + (partial is not None) < seats:
            req = waiting[0]
            fresh = req.num_computed_tokens == 0
            if fresh and req.n_admissions == 0:
                reason = self._never_fits(req)
                if reason:
                    waiting.popleft()
                    batch.rejected.append((req, reason))
                    continue
            seq = req.seq_len
            if fresh:
                hashes, hit, _ = self._prefix_hit(req)
                prefix = hit * page
            else:  # a chunk continuation: what it computed is its prefix
                hashes, hit, prefix = [], 0, req.num_computed_tokens
            extend = seq - prefix
            if extend <= rem_chunk:
                chunk = extend
            else:  # a chunk of what is left of the chunk budget, in whole pages
                chunk = min(rem_chunk // page * page, extend)
                if chunk == 0:
                    break
            charged = -(-chunk // page) * page
            last_chunk = chunk == extend
            reserve = min(req.output_length - req.num_output_tokens, clip) if last_chunk else 0
            if charged + reserve >= rem_total:
                if running or batch.items or self._pages_held_by_others(req):
                    break  # it waits for them to finish (or a P/D reservation to run)
                # nothing else holds pages: it will never fit
                waiting.popleft()
                self.pool.release(req)
                batch.rejected.append(
                    (
                        req,
                        f"sequence of {seq} tokens and its output reserve of {reserve} tokens "
                        f"need more than the pool's {self.pool.capacity_blocks * page} tokens "
                        "(SGLang admits a request only if it can finish)",
                    )
                )
                continue
            if charged > rem_input or charged > rem_chunk:
                break
            if hit:
                pool.acquire(req, hashes[:hit])
            end = prefix + chunk
            if not pool.allocate(
                req, -(-end // page) - len(req.held_hashes) - req.held_private_blocks
            ):
                if hit:
                    pool.release(req)
                oom = True
                break
            waiting.popleft()
            req.num_computed_tokens = end
            if fresh:
                self._admitted(req, prefix, now_ms)
            batch.items.append((req, chunk, chunk, prefix))
            rem_total -= charged + reserve
            rem_input -= charged
            rem_chunk -= charged
            if last_chunk:
                finished.append(req)
            else:
                partial = req
            if rem_chunk <= 0:
                break
        if partial is not None:
            waiting.appendleft(partial)
        running.extend(finished)
        # the first token's KV is taken in the prefill pass that produces it, unless it is the
        # request's last (it ends with the pass: no slot)
        continuing = [r for r in finished if r.output_length - r.num_output_tokens > 1]
        if continuing:
            self._grow(continuing, batch)
        if self.role != "prefill":  # (a prefill worker's prompts join it on release)
            for req, *_ in batch.items:
                # what the pass computes joins the prefix cache after admission (a prompt
                # admitted behind another in the same pass does not reuse its pages, unlike
                # vLLM), with the slot of the first token when one follows
                left = req.output_length - req.num_output_tokens
                first_slot = req.status == Status.RUNNING and req is not partial and left > 1
                self._register_full(req, req.num_computed_tokens + first_slot)
        self._summarise_prefill(batch)
        return oom

    def _admitted(self, req: Request, cached_tokens: int, now_ms: float) -> None:
        req.status = Status.RUNNING
        req.n_admissions += 1
        self.n_committed_prefill_tokens += req.seq_len - cached_tokens
        self.on_admit(req, cached_tokens, now_ms)

    def _summarise_prefill(self, batch: Batch) -> None:
        """A prefill pass is priced by its chunks alone: no decode part. A decode worker
        prices none (a retracted request's recompute there is free, as in the mocker)."""
        if self.role == "decode":
            return
        n = len(batch.items)
        batch.n_prefill = n
        batch.sum_prefill_isl = sum(before + tokens for _, _, tokens, before in batch.items)
        batch.sum_prefix = sum(before for _, _, _, before in batch.items)
        batch.prefill_tokens = sum(tokens for _, _, tokens, _ in batch.items)

    def _order_longest_prefix_first(self) -> None:
        """lpm: waiting requests by cached prefix, longest first (stable); a short match whose
        first 32 tokens repeat an earlier waiting request's goes behind. Skipped while more
        than 128 wait."""
        waiting = self.waiting
        if len(waiting) > LPM_MAX_WAITING or not self.pool.enable_caching:
            return
        page = self.block_size
        probe_blocks = -(-LPM_SHORT_MATCH_TOKENS // page)  # the first 32 tokens, in pages
        seen: set[int] = set()
        scored = []
        for k, req in enumerate(waiting):
            hashes = self._known_hashes(req)
            prefix_tokens = self.pool.match(hashes)[0] * page
            behind = False
            if prefix_tokens <= LPM_SHORT_MATCH_TOKENS and len(hashes) >= probe_blocks:
                key = hashes[probe_blocks - 1]  # a block id stands for its whole prefix
                behind = key in seen
                seen.add(key)
            scored.append((behind, -prefix_tokens, k, req))
        scored.sort()
        self.waiting = deque(req for _, _, _, req in scored)

    # ------------------------------------------------------------------ decode

    def _decode_step(self, batch: Batch) -> None:
        """One decode step for every running request, after retracting what does not fit. With
        speculative decoding each request's widest burst is made room for first, then its
        burst is drawn (`_draw_decode_bursts`)."""
        running = self._grow(self.running, batch, self._burst_width)
        items = batch.items
        sum_ctx = 0
        ended = []  # delivered with nothing to decode (P/D, no output): done at the pass end
        for req in running:
            if req.num_output_tokens >= req.output_length:
                ended.append(req)
                continue
            sum_ctx += req.seq_len
            req.num_computed_tokens = req.seq_len
            if self.speculator is None:
                # the token this step emits has its slot: cached with the rest
                self._register_full(req, req.seq_len + 1)
            items.append((req, 1, 0, req.input_length))
        batch.n_decode = len(items)
        batch.sum_decode_context = sum_ctx
        if self.speculator is not None:
            self._draw_decode_bursts(batch)
            for req, burst in batch.bursts or []:
                self._register_full(req, req.seq_len + burst)
            self._leave(ended)
            self.ending = ended
        else:
            items.extend((req, 0, 0, req.input_length) for req in ended)

    def _burst_width(self, req: Request) -> int:
        """Tokens one decode step may add to `req`: one, or with speculative decoding its
        widest burst (k + 1; one on a prefill worker), never more than it may still emit."""
        left = req.output_length - req.num_output_tokens
        if self.speculator is None or self.role == "prefill":
            return min(1, left)
        return min(self.speculator.max_tokens, left)

    def _draw_decode_bursts(self, batch: Batch) -> None:
        """Speculative decoding: each request of the step draws its burst (priced as the one
        token of a plain step: the step's length is that of the sequences before it) and
        keeps the pages its burst fills, every token's included; the rest of its widest
        burst's pages go back empty. `finish` emits the bursts."""
        speculator = self.speculator
        assert speculator is not None
        page = self.block_size
        bursts = []
        for req, *_ in batch.items:
            left = req.output_length - req.num_output_tokens
            burst = 1 if self.role == "prefill" else speculator.draw(left)
            held = len(req.held_hashes) + req.held_private_blocks
            unused = held - -(-(req.seq_len + burst) // page)
            if unused > 0:
                self.pool.n_private -= unused
                req.held_private_blocks -= unused
            bursts.append((req, burst))
        batch.bursts = bursts

    def _grow(
        self,
        group: list[Request],
        batch: Batch,
        width: Callable[[Request], int] = lambda req: 1,
    ) -> list[Request]:
        """Pages for the next tokens of every request of `group` (all running; `width(req)` of
        them, one by default): while they do not fit and more than one is left, retract the
        one with the fewest decoded tokens (the earliest on ties). Returns the requests that
        got their pages."""
        pool = self.pool
        page = self.block_size
        retracted: list[Request] = []
        while True:
            need = 0
            for req in group:
                if req.num_output_tokens < req.output_length:
                    held = len(req.held_hashes) + req.held_private_blocks
                    need += max(0, -(-(req.seq_len + width(req)) // page) - held)
            if need <= pool.free_blocks or len(group) <= 1:
                break
            victim = min(group, key=lambda r: r.num_output_tokens)
            group = [r for r in group if r is not victim]
            self._retract(victim, batch)
            retracted.append(victim)
        # to the back of the queue (SGLang re-queues them), the first retracted first
        self.waiting.extend(retracted)
        if retracted:
            # SGLang re-estimates new_token_ratio from the survivors: what they decoded plus
            # 20 steps each, over their whole outputs
            decoded = sum(r.num_output_tokens for r in group)
            outputs = sum(r.output_length for r in group)
            self.ratio_after_retraction = min(
                1.0, (decoded + RETRACT_DECODE_STEPS * len(group)) / (outputs + 1)
            )
        for req in group:
            if req.num_output_tokens >= req.output_length:
                continue
            held = len(req.held_hashes) + req.held_private_blocks
            tokens = req.seq_len + width(req)
            grow = -(-tokens // page) - held
            if grow > 0 and not pool.allocate(req, grow):
                # alone in `group`: pages held elsewhere (a chunked prompt waiting to go on, a
                # P/D reservation) leave it no room; it waits in the queue for them
                self._retract(req, batch)
                group = [r for r in group if r is not req]
                pages = -(-tokens // page)
                if pages <= pool.capacity_blocks:
                    self.waiting.append(req)
                else:  # longer than the whole pool can hold
                    batch.rejected.append(
                        (
                            req,
                            f"sequence of {tokens} tokens needs {pages} KV blocks; "
                            f"the pool holds {pool.capacity_blocks}",
                        )
                    )
        return group

    def _pages_held_by_others(self, req: Request) -> bool:
        """Whether requests other than `req` hold pages here (waiting chunked prompts, P/D
        reservations): a request that does not fit yet may once they let go."""
        own = len(req.held_hashes) + req.held_private_blocks
        return self.pool.capacity_blocks - self.pool.free_blocks > own

    def release_held(self, req: Request) -> None:
        """A prefill worker's prompt joins its prefix cache only when the transfer has taken
        its KV (SGLang caches a disaggregated prefill once it is sent)."""
        self._register_full(req)
        self.pool.release(req)

    def _retract(self, req: Request, batch: Batch) -> None:
        """Retraction: `req` gives its pages back (what it computed stays in the prefix cache);
        the caller puts it back at the head of the queue, to be admitted again."""
        self.pool.release(req)
        if req in self.running:
            self.running.remove(req)
        req.num_computed_tokens = 0
        (req.parent or req).n_preemptions += 1
        self.n_preemptions += 1
        self.n_retractions += 1
        batch.n_preempted += 1
        req.status = Status.WAITING
