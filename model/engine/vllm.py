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
   With speculative decoding (`engine.speculative`) it emits a burst of up to k + 1 tokens
   instead, its KV reserved once the pass is formed (`_reserve_bursts`).

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

from collections import deque
from collections.abc import Callable
from typing import ClassVar

from mypy_extensions import mypyc_attr

from servesim.engine.batch import Batch
from servesim.engine.scheduler_base import SchedulerBase
from servesim.kv.pool_base import count_in, count_out
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


# (a policy of one's own subclasses it, also in the native build: docs/schedulers.md)
@mypyc_attr(allow_interpreted_subclasses=True)
class VllmScheduler(SchedulerBase):
    """vLLM v1's policy for one rank: running requests first, then FIFO admission."""

    draws_bursts: ClassVar[bool] = True
    drafter_recomputes_a_block: ClassVar[bool] = True

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
        if self.speculator is not None:
            self._reserve_bursts(batch)
        tiers = self.tiers
        if tiers is not None:
            # the copies to G2 of the prompt blocks this pass completes take their room now
            tiers.prepare_stores(batch)
            if pool.fenced:  # blocks taken from under a copy to G2: it waits for them to land
                batch.fences.extend(tiers.landings(pool.take_fenced()))
        return batch

    def _reserve_bursts(self, batch: Batch) -> None:
        """Speculative decoding, once the pass is formed (Dynamo's mocker): every running
        request that caught up verifies its drafts in the pass's decode step, a request whose
        prefill ends in this pass included (its first token comes from that step). KV for
        each one's widest burst is reserved at once; while it does not fit, a victim is
        preempted as for a failed allocation (the prefill work it had in this pass stays
        priced); requests that end without output have let go of theirs first. Then the
        bursts are drawn (`_draw_bursts`); `finish` emits them."""
        self._end_without_output()
        ready = self._caught_up()
        pool = self.pool
        while sum(self._burst_blocks(r, widest) for r, widest in ready) > pool.free_blocks:
            self._preempt(choose_victim(self.running, self.cfg.preemption_mode), batch)
            ready = self._caught_up()
        self._draw_bursts(batch, ready)

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
            if not self._admission_fits(req, needed):
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

    def _admission_fits(self, req: Request, needed: int) -> bool:
        """Whether waiting `req` has the KV to be admitted now, `needed` being the blocks its
        known sequence lacks beyond its active prefix: vLLM asks only that they fit the free
        blocks (a policy that reserves ahead, servesim.engine.trtllm, asks more)."""
        return needed <= self.pool.free_blocks

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
