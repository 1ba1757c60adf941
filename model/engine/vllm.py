"""vLLM v1-style continuous batching for one scheduler rank (the Dynamo mocker's `vllm` core).

Per pass, with a budget of `max_num_batched_tokens`:

1. Running requests first, in order: each takes what it still lacks (a decode token, or the next
   prefill chunk) up to the remaining budget. If its KV blocks cannot be allocated, a victim is
   preempted (the last running request under `lifo`, the first under `fifo`): it gives back all
   its KV, restarts from zero (recompute), and goes to the front of `waiting`.
2. Then, only if nothing was preempted and fewer than `max_num_seqs` run, the head of `waiting`
   (strict FIFO, head-of-line blocking): prefix lookup capped so the last prompt token is always
   recomputed, admission only if the blocks it lacks fit the free blocks, chunked to the budget.
   A P/D decode rank admits requests whose KV was delivered without a KV check; while a request
   waits to reserve KV there it admits only those (Dynamo's rule), and when nothing runs they
   may pass a blocked head.
3. Full blocks are registered at allocation time, so a later request in the same pass can hit.
4. At pass end every request that caught up emits one token (all stamped at the pass end);
   a request with its last token (or with zero output) completes and releases its blocks.

With KV tiers (`servesim.kv.tiers`), an admission whose prefix continues in G2 (or G3) leaves the
queue while those blocks are copied to G1 (taking G1 blocks for them), and once they land it is
admitted before anything in `waiting` when the rest of its blocks fit, with what G1 and the copy
hold as its cached prefix. A request whose blocks below G1 are still on their way (another's
load, a store in flight) is deferred: it leaves the queue, the requests behind it may go, and it
is retried ahead of the queue. A pass that reuses a G1 block a store to G2 still reads, or that
preempts a request whose store is in flight, computes once that store has landed (`fences`).
With tiers a spent budget stops all admission.

A request whose prompt can never fit (`>= max_model_len`, or more blocks than the pool) is
rejected with a reason rather than queued forever.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator
from heapq import merge
from itertools import islice, repeat
from typing import Any

from servesim.config.schema import VllmEngineConfig
from servesim.kv.block_pool import count_in, count_out
from servesim.kv.group_pool import Pool
from servesim.kv.tiers import RankTiers
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request, Status

OK = 0
BLOCKED = -1
SELF_PREEMPTED = -2
RELEASED = -3  # a landed request let go of its copy (`_admit_landed`)
# what a waiting request's blocks below G1 mean for its admission (`_lower_hit`)
NO_COPY = 0  # none to copy in: admitted as usual
LOADING = 1  # a copy into G1 starts: it waits for it set aside, among the deferred
DEFERRED = 2  # some are still on their way: it waits among the deferred


def choose_victim(running: list[Request], mode: str) -> Request:
    """The request a failed allocation preempts: the newest running (`lifo`) or the oldest
    (`fifo`); it may be the very request that needs the blocks."""
    return running[-1] if mode == "lifo" else running[0]


class Batch:
    """What one pass computes.

    `items` are (request, tokens scheduled, prompt tokens computed, prompt tokens before) in
    running order. Prefill work counts prompt positions only; decode items are requests that
    caught up and still owe output, except a request whose first token comes from this
    pass's prefill (it adds no decode time). `others` are the items that are not a running
    request's plain decode step (those `schedule` counts as it forms them).

    With KV tiers, `stores` are the copies to G2 of the prompt blocks this pass completes,
    prepared (room taken in G2) once it is formed and started at its end; `fences` are the
    landings of the stores to G2 this pass must wait for before it computes: those of the
    requests it preempted (vLLM flushes a preempted request's stores before reusing its
    blocks) and those still reading a cached block it evicted.
    """

    __slots__ = (
        "items",
        "others",
        "n_prefill",
        "sum_prefill_isl",
        "sum_prefix",
        "prefill_tokens",
        "n_decode",
        "sum_decode_context",
        "n_preempted",
        "active_blocks",
        "rejected",
        "fences",
        "stores",
    )

    def __init__(self) -> None:
        self.items: list[tuple[Request, int, int, int]] = []
        self.others: list[tuple[Request, int, int, int]] = []
        self.n_prefill = 0
        self.sum_prefill_isl = 0
        self.sum_prefix = 0
        self.prefill_tokens = 0
        self.n_decode = 0
        self.sum_decode_context = 0
        self.n_preempted = 0
        self.active_blocks = 0
        self.rejected: list[tuple[Request, str]] = []
        self.fences: list[Any] = []  # simpy events (the scheduler itself knows no SimPy)
        self.stores: list[Any] = []  # copies to G2 prepared as the pass was formed (KV tiers)


class Stretch:
    """Decode passes applied at once: their end times, the decoding sequences, the pool's
    active blocks before them; the pool levels after each pass that allocated, as (pass,
    active, cached); the pass of each KV event the stretch buffered, in order; the requests
    its last pass completed (delivered at its end)."""

    __slots__ = ("ends", "n_decode", "active_before", "levels", "event_passes", "done")

    def __init__(self, ends: array[float], n_decode: int, active_before: int) -> None:
        self.ends = ends
        self.n_decode = n_decode
        self.active_before = active_before
        self.levels: list[tuple[int, int, int]] = []
        self.event_passes: list[int] = []
        self.done: list[Request] = []


class VllmScheduler:
    """Waiting queue, running list and G1 pool of one rank; decisions per pass."""

    def __init__(
        self,
        cfg: VllmEngineConfig,
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

    # ------------------------------------------------------------------ queue

    def enqueue(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.deferred)

    def queued(self) -> list[Request]:
        """Every request here that is not running: waiting, or set aside."""
        return [*self.waiting, *self.deferred]

    # ------------------------------------------------------------------ blocks

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

    def _allocate(self, req: Request, batch: Batch, target: int) -> int:
        """Blocks so `req` covers `target` tokens, preempting victims while they do not fit.
        Returns OK, SELF_PREEMPTED (req was the victim) or BLOCKED (no victim left)."""
        pool = self.pool
        need = -(-target // self.block_size) - len(req.held_hashes) - req.held_private_blocks
        while not pool.allocate(req, need):
            if not self.running:
                return BLOCKED
            victim = choose_victim(self.running, self.cfg.preemption_mode)
            self._preempt(victim, batch)
            if victim is req:
                return SELF_PREEMPTED
        return OK

    def _register_full(self, req: Request) -> None:
        """Register every block that is now completely computed (visible to later requests)."""
        if self.pool.enable_caching:
            first = len(req.held_hashes)
            last = req.num_computed_tokens // self.block_size
            if last <= first:
                return
            prompt = req.prompt_hashes
            if last <= len(prompt):
                self.pool.register_many(req, prompt[first:last])
            else:
                self.pool.register_many(req, [self._block_hash(req, j) for j in range(first, last)])

    def _preempt(self, victim: Request, batch: Batch) -> None:
        """Recompute preemption: all KV back, computed to 0, front of waiting; work it was
        given this pass is undone."""
        self.pool.release(victim)
        self.running.remove(victim)
        items = batch.items
        for k in range(len(items)):
            if items[k][0] is victim:
                del items[k]
                break
        victim.num_computed_tokens = 0
        if victim.host_store is not None:  # its prompt is still being copied to G2
            batch.fences.append(victim.host_store)
        # a request's row counts its preemptions on either side of a P/D handoff
        (victim.parent or victim).n_preemptions += 1
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        self.n_preemptions += 1
        batch.n_preempted += 1

    def _schedule_tokens(self, req: Request, batch: Batch, budget: int, cached: int) -> int:
        """Give `req` up to `budget` tokens of work this pass. Returns the tokens scheduled,
        or BLOCKED / SELF_PREEMPTED (both negative) if it cannot run this pass."""
        prompt_len = req.input_length
        eff = req.num_computed_tokens + cached
        remaining = req.seq_len - eff
        if not self.cfg.enable_chunked_prefill and prompt_len - eff > budget:
            return BLOCKED
        want = min(remaining, budget)
        if want == 0 < remaining:
            return BLOCKED
        outcome = self._allocate(req, batch, eff + want)
        if outcome != OK:
            return outcome
        req.num_computed_tokens = eff + want
        self._register_full(req)
        before = min(eff, prompt_len)
        item = (req, want, min(eff + want, prompt_len) - before, before)
        batch.items.append(item)
        batch.others.append(item)
        return want

    # ------------------------------------------------------------------ one pass

    def decode_stretch(
        self, decode_ends: Callable[[int, int, int], array[float]]
    ) -> Stretch | None:
        """Fast-forward passes that only decode and change nothing but counters and blocks.

        When nothing waits (or the head of the queue waits for a completion: `_head_waits`)
        and every running request is one decode token short, the next
        passes are all alike until a request completes or an allocation fails: each computes
        one token per request and lasts the decode time of `n` sequences whose lengths sum to
        one more token each pass. `decode_ends(n, sum of sequence lengths, k)` gives the end
        times of up to `k` such passes, as many as end before the worker's horizon. This
        applies them exactly as pass-by-pass scheduling would: blocks a pass needs are
        allocated (evicting cached blocks as it would), blocks that become full are registered:
        pass by pass in running order when the pool records KV events, in bulk otherwise (the
        same end state and levels). The stretch ends with the first pass that completes a
        request, whose completions it applies as `finish` does (`Stretch.done`; with KV tiers,
        whose copies are stored at pass ends, that pass is left to `schedule`); the pass whose
        block allocation would fail (a preemption) is left to `schedule`. Returns None when no
        pass qualifies.
        """
        running = self.running
        n = len(running)
        if self.loaded or n == 0 or n > self.cfg.max_num_batched_tokens:
            return None
        if self.waiting and not self._head_waits():
            return None
        last = running[-1]
        if last.num_computed_tokens < last.input_length:
            return None  # the newest admission is still in prefill (checked first: often so)
        bs = self.block_size
        max_len = self.cfg.max_model_len
        k_max = 1 << 62
        sum_ctx = 0
        for r in running:
            c = r.num_computed_tokens
            p = r.input_length
            out = r.num_output_tokens
            seq = p + out
            if c < p or seq - c != 1:
                return None
            # passes up to the one that emits its last token (compared inline: this loop
            # runs for every running request at every pass the event loop plans)
            k = r.output_length - out
            if k < k_max:
                k_max = k
            if max_len is not None and max_len - seq < k_max:
                k_max = max_len - seq
            sum_ctx += seq
        completing = k_max  # the pass, counted from 1, that completes a request
        if self.tiers is not None:  # (that pass stores tier copies: `schedule` forms it)
            k_max -= 1
            completing = 0
        if k_max <= 0:
            return None
        pool = self.pool
        free = pool.free_blocks
        # the block allocations those passes make, as (pass, running order): a request needs
        # a fresh block when its next token starts one. Nothing frees a block during the
        # stretch: the allocation past the free blocks would fail, and its pass preempts
        if n * (k_max // bs + 1) <= 4 * (free + 1):
            allocs: list[tuple[int, int]] = []
            for order, r in enumerate(running):
                i = (len(r.held_hashes) + r.held_private_blocks) * bs - r.num_computed_tokens
                while i < k_max:
                    allocs.append((i, order))
                    i += bs
            if len(allocs) > free:
                allocs.sort()
        else:  # very long outputs: only the first free + 1 allocations matter (a pool's worth)
            allocs = list(
                islice(
                    merge(*[self._allocations(r, order, k_max) for order, r in enumerate(running)]),
                    free + 1,
                )
            )
        if len(allocs) > free:
            k_max = allocs[free][0]
            if k_max == 0:
                return None
        ends = decode_ends(n, sum_ctx, k_max)
        k = len(ends)
        if k == 0:
            return None
        stretch = Stretch(ends, n, pool.n_active)
        caching = pool.enable_caching
        allocs = [a for a in allocs if a[0] < k]
        # per request in running order, its computed tokens before the stretch and the blocks
        # that become full during it
        full: list[tuple[int, range]] = []
        for r in running:
            c0 = r.num_computed_tokens
            r.num_computed_tokens = c0 + k
            out0 = r.num_output_tokens
            r.num_output_tokens = out0 + k
            if out0 == 1:
                r.second_token_ms = ends[0]
            r.last_token_ms = ends[-1]
            times = r.token_times_ms
            if times is not None:
                times.extend(ends)
            full.append((c0, range(c0 // bs, (c0 + k) // bs) if caching else range(0)))
        if pool.record_events:
            self._stretch_pass_by_pass(stretch, allocs, full)
        else:
            self._stretch_in_bulk(stretch, allocs, full)
        if k == completing:
            stretch.done = self._complete_decoded()
        return stretch

    def _allocations(self, r: Request, order: int, k_max: int) -> Iterator[tuple[int, int]]:
        """The (pass, `order`) of each block allocation `r` makes in the next `k_max` decode
        passes, in pass order."""
        bs = self.block_size
        first = (len(r.held_hashes) + r.held_private_blocks) * bs - r.num_computed_tokens
        return zip(range(first, k_max, bs), repeat(order))

    def _head_waits(self) -> bool:
        """Whether the head of the waiting queue waits for a completion: while only running
        requests decode, `_admit` would neither admit it nor reject it, in any pass before
        the next completion. So it is when the running set is full, or when the blocks it
        needs beyond its active prefix exceed the free ones: decoding only takes free blocks
        (and may evict part of its cached prefix, which only adds to what it needs), and
        nothing frees one before a completion."""
        if self.pending_reservations or self.tiers is not None:
            return False
        if len(self.running) >= self.cfg.max_num_seqs:
            return True
        req = self.waiting[0]
        if req.materialized or (req.n_admissions == 0 and self._never_fits(req)):
            return False
        _hashes, _hit, hit_active = self._prefix_hit(req)
        blocks = -(-req.seq_len // self.block_size)
        pool = self.pool
        return blocks - hit_active > pool.free_blocks and blocks <= pool.capacity_blocks

    def _prefix_hit(self, req: Request) -> tuple[list[int], int, int]:
        """A waiting request's known block hashes and its resident prefix: blocks, and how
        many of them are active, both short of the last known token's block when it still
        owes output (that token is always recomputed to produce the next one)."""
        hashes = self._known_hashes(req)
        hit, hit_active = self.pool.match(hashes)
        if req.num_output_tokens < req.output_length:
            cap = (req.seq_len - 1) // self.block_size
            hit = min(hit, cap)
            hit_active = min(hit_active, cap)
        return hashes, hit, hit_active

    def _complete_decoded(self) -> list[Request]:
        """After a pass in which only running requests decoded: those that emitted their last
        token release their blocks, in running order, and leave (as in `finish`)."""
        max_len = self.cfg.max_model_len
        done = [
            r
            for r in self.running
            if r.num_output_tokens >= r.output_length
            or (max_len is not None and r.input_length + r.num_output_tokens >= max_len)
        ]
        self._leave(done)
        return done

    def _leave(self, done: list[Request]) -> None:
        """Completed requests release their blocks, in this order, and leave the running set."""
        if not done:
            return
        for req in done:
            if not req.hold_kv:  # a prefill copy keeps its KV until the handoff releases it
                self.pool.release(req)
            req.status = Status.DONE
        self.running = [r for r in self.running if r.status == Status.RUNNING]

    def _stretch_in_bulk(
        self, stretch: Stretch, allocs: list[tuple[int, int]], full: list[tuple[int, range]]
    ) -> None:
        """A stretch's blocks when the pool records no KV events: each request's allocations at
        once, then its full blocks registered at once. Nothing frees a block during a stretch,
        so the same blocks are evicted, in the same order, as pass by pass; the pool levels
        after each allocating pass follow from the counts (an allocation evicts one cached
        block once the empty ones are used up)."""
        pool = self.pool
        running = self.running
        if allocs:
            empty = pool.n_empty
            active, cached = pool.n_active, pool.n_cached
            counts = [0] * len(running)
            for _i, order in allocs:
                counts[order] += 1
            for order, c in enumerate(counts):
                if c:
                    pool.allocate(running[order], c)  # fits: counted against the free blocks
            allocs.sort()
            levels = stretch.levels
            for taken, (i, _order) in enumerate(allocs, start=1):
                if levels and levels[-1][0] == i:
                    levels.pop()
                levels.append((i, active + taken, cached - max(0, taken - empty)))
        for r, (_c0, js) in zip(running, full, strict=True):
            if js:
                pool.register_many(r, [self._block_hash(r, j) for j in js])

    def _stretch_pass_by_pass(
        self, stretch: Stretch, allocs: list[tuple[int, int]], full: list[tuple[int, range]]
    ) -> None:
        """A stretch's blocks allocated and registered pass by pass, in running order within a
        pass (allocations first), so the pool's KV events come in the stepped order."""
        pool = self.pool
        running = self.running
        bs = self.block_size
        ops = [(i, order, 0, 0) for i, order in allocs]
        for order, (c0, js) in enumerate(full):
            # block j is full once the pass computing its last token ends
            ops.extend([((j + 1) * bs - c0 - 1, order, 1, j) for j in js])
        if not ops:
            return
        ops.sort()
        events = pool.pending_events
        seen = len(events)
        levels = stretch.levels
        passes = stretch.event_passes
        for i, order, kind, j in ops:
            r = running[order]
            if kind == 0:
                pool.allocate(r, 1)  # fits: counted against the free blocks
                if levels and levels[-1][0] == i:
                    levels.pop()
                levels.append((i, pool.n_active, pool.n_cached))
            else:
                pool.register(r, self._block_hash(r, j))
            events = pool.pending_events
            if len(events) > seen:
                passes.extend([i] * (len(events) - seen))
                seen = len(events)

    def schedule(self, now_ms: float) -> Batch:
        """Form the batch of a pass starting at `now_ms` (allocating its KV blocks)."""
        batch = Batch()
        budget = self.cfg.max_num_batched_tokens
        running = self.running
        items = batch.items
        pool = self.pool
        if pool.fenced_blocks:
            # only this pass's grants from under a copy in flight keep a store back
            # (`RankTiers.prepare_stores`): the last pass's are done with, and those made
            # between passes (a P/D reservation) were waited for
            pool.fenced_blocks.clear()
        bs = self.block_size
        caching = pool.enable_caching
        n_steps = steps_ctx = 0  # plain decode steps, and the sum of their sequence lengths
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            prompt_len = req.input_length
            if computed >= prompt_len and req.num_output_tokens + prompt_len - computed == 1:
                # the common case, a decode step: one token, a new block only at a boundary
                target = computed + 1
                if target > (len(req.held_hashes) + req.held_private_blocks) * bs and (
                    not pool.allocate(req, 1)
                ):
                    n = self._schedule_tokens(req, batch, budget, 0)  # preempts as needed
                else:
                    req.num_computed_tokens = target
                    if caching and target % bs == 0:
                        pool.register(req, self._block_hash(req, target // bs - 1))
                    items.append((req, 1, 0, prompt_len))
                    n_steps += 1
                    steps_ctx += target
                    n = 1
            else:
                n = self._schedule_tokens(req, batch, budget, 0)
            if n == SELF_PREEMPTED:
                continue  # the next request now sits at i
            if n == BLOCKED:
                break
            budget -= n
            # a FIFO victim before i shifts the list without moving i: the request after
            # this one sits out the pass, exactly as in the mocker
            i += 1
        if batch.n_preempted == 0:
            self._admit(batch, budget, now_ms)
        if batch.n_preempted:
            # a victim's item left the batch, whichever it was: every item counted again
            self._summarise(batch, batch.items, 0, 0)
        else:
            self._summarise(batch, batch.others, n_steps, steps_ctx)
        tiers = self.tiers
        if tiers is not None:
            # the copies to G2 of the prompt blocks this pass completes take their room now
            tiers.prepare_stores(batch)
            if pool.fenced:  # blocks taken from under a copy to G2: it waits for them to land
                batch.fences.extend(tiers.landings(pool.take_fenced()))
        return batch

    def _admit(self, batch: Batch, budget: int, now_ms: float) -> None:
        """Admit waiting requests while seats, blocks and budget last: first those set aside
        (in the order they were: skipped because blocks they need were still on their way, or
        waiting for their own copy from a lower tier, skipped until it lands), then the queue,
        in order. A request that does not fit stops admission (head-of-line blocking); one
        whose blocks are still on their way, or that starts a copy, is set aside, ahead of the
        queue (vLLM's skipped waiting requests)."""
        cfg = self.cfg
        bs = self.block_size
        pool = self.pool
        waiting = self.waiting
        running = self.running
        if self.pending_reservations:
            # a request waits to reserve KV here: as in Dynamo, nothing that needs fresh KV
            # (a request preempted here, or one whose tier copy landed: its prompt is not
            # computed) is admitted before it; delivered requests still are
            self._admit_delivered(batch, now_ms, 0)
            return
        queue = self.deferred if self.deferred else waiting
        k = 0  # queue[:k]: set-aside requests that cannot go yet, skipped
        while len(running) < cfg.max_num_seqs:
            if k == len(queue):
                if queue is waiting:
                    break
                queue, k = waiting, 0
                continue
            req = queue[k]
            if budget == 0 and self.tiers is not None:
                # with KV tiers a spent budget stops admission, even of KV delivered by a
                # transfer (Dynamo's connector path admits nothing once the budget is gone)
                break
            if req.status == Status.LOADING:  # its copy from a lower tier is on its way
                k += 1
                continue
            if req.status == Status.LANDED:
                n = self._admit_landed(req, batch, budget, now_ms)
                if n == BLOCKED:
                    break  # the rest of its blocks do not fit yet: nothing behind it goes
                del queue[k]
                if n == RELEASED:
                    continue
                budget -= n
                if batch.n_preempted:
                    break
                continue
            if req.materialized:
                del queue[k]
                self._admit_materialized(req, batch, now_ms)
                continue
            if req.n_admissions == 0:
                reason = self._never_fits(req)
                if reason:
                    del queue[k]
                    batch.rejected.append((req, reason))
                    continue
            seq = req.seq_len
            hashes, hit, hit_active = self._prefix_hit(req)
            if budget == 0 and (seq > hit * bs or self.tiers is not None):
                # no room in this pass (and no lookup below G1); with KV tiers a spent budget
                # stops admission even for a prompt G1 holds whole (as Dynamo's mocker does)
                break
            lower, n_host = NO_COPY, 0
            if self.tiers is not None:
                if req.host_store is None:
                    # looking a request up refreshes its prompt's blocks in G2 (vLLM's
                    # connector touches them), whether it is admitted or not
                    self.tiers.g2.touch(req.prompt_hashes)
                lower, n_host = self._lower_hit(req, hashes, hit, seq)
                if lower == DEFERRED:
                    # blocks it needs are still on their way: set aside before its KV is even
                    # checked (Dynamo's connector lookup comes first)
                    k = self._set_aside(queue, k)
                    continue
            needed = -(-seq // bs) - hit_active
            if needed > pool.free_blocks:
                if -(-seq // bs) > pool.capacity_blocks:
                    # more blocks than the whole pool: it will never fit
                    del queue[k]
                    batch.rejected.append(
                        (
                            req,
                            f"sequence of {seq} tokens needs {-(-seq // bs)} KV blocks; "
                            f"the pool holds {pool.capacity_blocks}",
                        )
                    )
                    continue
                if not running and self.role == "decode":
                    # what holds the blocks it lacks is KV delivered to requests queued behind
                    # it, which need no new blocks: let them run (and free their blocks) rather
                    # than wait on each other forever
                    self._admit_delivered(batch, now_ms, k + 1 if queue is waiting else 0)
                break
            cached = hit * bs
            if (
                not cfg.enable_chunked_prefill
                and req.input_length - cached > cfg.max_num_batched_tokens
            ):
                del queue[k]
                batch.rejected.append(
                    (
                        req,
                        f"uncached prompt of {req.input_length - cached} tokens exceeds "
                        f"max_num_batched_tokens {cfg.max_num_batched_tokens} and chunked "
                        "prefill is disabled",
                    )
                )
                continue
            if lower == LOADING:
                if needed > pool.free_blocks - self._promised_blocks():
                    break  # the blocks promised to prompts under way come first (as in Dynamo)
                self._start_load(req, hashes, hit, n_host)
                k = self._set_aside(queue, k)  # it waits for its copy; the next one may go
                continue
            if not cfg.enable_chunked_prefill and req.input_length - cached > budget:
                break  # no room in this pass; checked before any block is pinned
            req.admit_host_tokens = req.admit_disk_tokens = 0
            if hit:
                pool.acquire(req, hashes[:hit])
            preempted = batch.n_preempted
            n = self._schedule_tokens(req, batch, budget, cached)
            if n < 0:  # pragma: no cover - the admission check guarantees the blocks
                raise RuntimeError(f"admitted {req} could not be scheduled")
            del queue[k]
            req.status = Status.RUNNING
            req.n_admissions += 1
            running.append(req)
            self.n_committed_prefill_tokens += seq - cached
            self.on_admit(req, cached, now_ms)
            budget -= n
            if batch.n_preempted != preempted or (n == 0 and budget == 0):
                break

    def _set_aside(self, queue: deque[Request], k: int) -> int:
        """`queue[k]` waits set aside: a waiting request joins the deferred ones, behind them
        (one already among them keeps its place). The index of the next request to look at."""
        if queue is self.waiting:
            req = queue[k]
            del queue[k]
            self.deferred.append(req)
            return k
        return k + 1

    def _lower_hit(self, req: Request, hashes: list[int], hit: int, seq: int) -> tuple[int, int]:
        """Whether the prompt after the G1 hit continues in G2: (LOADING, blocks in G2) when
        there are blocks to copy in; DEFERRED when a block of that run is still on its way (a
        load into this pool, or a copy into G2), or G3 blocks of it are being staged into G2
        (`RankTiers.stage`: looked up again once they land); NO_COPY otherwise."""
        tiers = self.tiers
        assert tiers is not None
        if req.host_store is not None:
            return DEFERRED, 0  # its own prompt is still being stored: looked up once landed
        bs = self.block_size
        stop = (seq - 1) // bs if req.num_output_tokens < req.output_length else seq // bs
        stop = min(stop, len(hashes))
        if stop <= hit:
            return NO_COPY, 0
        if tiers.g3 is not None and tiers.stage(req, hashes[hit:stop]):
            return DEFERRED, 0
        n_host, on_the_way = tiers.lookup(hashes, hit, stop)
        loading = self.loading_blocks
        if on_the_way or (loading and any(h in loading for h in hashes[hit : hit + n_host])):
            return DEFERRED, 0
        if n_host == 0:
            return NO_COPY, 0
        return LOADING, n_host

    def _promised_blocks(self) -> int:
        """Blocks promised but not yet taken: the rest of the prompt of each running request
        still in prefill, and of each request whose tier copy is under way or has landed
        (Dynamo keeps them back before it starts another copy, which cannot be preempted)."""
        bs = self.block_size
        n = 0
        for r in self.running:
            if r.num_computed_tokens < r.input_length:
                n += -(-r.seq_len // bs) - len(r.held_hashes) - r.held_private_blocks
        for r in (*self.loading.values(), *self.loaded):
            n += -(-r.seq_len // bs) - r.loaded_blocks
        return n

    def _start_load(self, req: Request, hashes: list[int], hit: int, n_host: int) -> None:
        """Start copying in the `n_host` G2 blocks after the G1 hit (G1 blocks taken for what
        the copy brings); the caller sets `req` aside and has checked that its blocks fit."""
        tiers = self.tiers
        assert tiers is not None
        keys = hashes[hit : hit + n_host]
        pool = self.pool
        if hit:
            pool.acquire(req, hashes[:hit])
        # G1 blocks for what the copy brings (the rest are taken when it is admitted); a block
        # a store to G2 is still reading delays the copy until that store lands
        tiers.reserve_load(keys)
        fenced_before = len(pool.fenced)  # (the pass's own, from its decode steps, stay its)
        if not pool.allocate(req, n_host):  # pragma: no cover - checked by caller
            raise RuntimeError(f"load check passed but allocation failed for {req}")
        fences = (
            tiers.landings(pool.take_fenced(fenced_before))
            if len(pool.fenced) > fenced_before
            else []
        )
        n_disk = tiers.staged_from_g3(req, keys)
        tiers.load(req, keys, self._landing(req, hit, keys, n_disk), fences)
        tiers.g1_changed()
        count_in(self.loading_blocks, keys)
        req.loaded_blocks = hit + n_host  # what it will hold once the copy lands
        req.status = Status.LOADING
        self.loading[req.idx] = req

    def _landing(self, req: Request, hit: int, keys: list[int], n_disk: int) -> Callable[[], None]:
        def landed() -> None:
            """The copy of `keys` is in G1 (now, between passes): register those blocks; `req`
            may be admitted when a pass reaches it among the requests set aside."""
            self.pool.register_many(req, keys)
            count_out(self.loading_blocks, keys)
            del self.loading[req.idx]
            req.status = Status.LANDED
            req.loaded_blocks = hit + len(keys)
            req.admit_host_tokens = (len(keys) - n_disk) * self.block_size
            req.admit_disk_tokens = n_disk * self.block_size  # (the part staged from G3)
            self.loaded.append(req)

        return landed

    def _admit_landed(self, req: Request, batch: Batch, budget: int, now_ms: float) -> int:
        """Admit `req`, whose tier copy landed, if the rest of its blocks fit (its copied prefix
        counts as cached): the tokens scheduled; BLOCKED if it must wait; RELEASED if nothing
        runs that could free blocks for it, so it lets go of what it holds (cached from now)
        and waits at the head of the queue for an ordinary admission."""
        bs = self.block_size
        pool = self.pool
        cached = req.loaded_blocks * bs
        seq = req.seq_len
        if -(-seq // bs) - req.loaded_blocks > pool.free_blocks:
            if self.running:
                return BLOCKED
            self.loaded.remove(req)
            pool.release(req)
            req.status = Status.WAITING
            self.waiting.appendleft(req)
            return RELEASED
        n = self._schedule_tokens(req, batch, budget, cached)
        if n == BLOCKED:  # (no chunked prefill) its rest needs a pass with more budget
            return BLOCKED
        if n < 0:  # pragma: no cover - its blocks were taken when the copy started
            raise RuntimeError(f"loaded {req} preempted itself")
        self.loaded.remove(req)
        req.status = Status.RUNNING
        req.n_admissions += 1
        self.running.append(req)
        self.n_committed_prefill_tokens += seq - cached
        self.on_admit(req, cached, now_ms)
        return n

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

    # ------------------------------------------------------------------ P/D destination

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
        others, each in running order."""
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
