"""Decode stretches: runs of passes that only decode, applied at once by a vLLM or an SGLang
scheduler rank.

Part of the speed layer (servesim.speed): with it off (`speed=off`), every pass goes through
`schedule` and `finish`; tests/speed/test_fast_forward_equivalence.py shows both give the
same tables.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from functools import partial
from itertools import accumulate

from servesim.engine.scheduler_base import SchedulerBase
from servesim.engine.sglang import SglangScheduler
from servesim.engine.vllm import VllmScheduler
from servesim.workload.request import Request

DecodeEnds = Callable[[int, int, int], "array[float]"]


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


def decode_stretch(sched: VllmScheduler, decode_ends: DecodeEnds) -> Stretch | None:
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
    n = len(sched.running)
    if sched.loaded or n == 0 or n > sched.cfg.max_num_batched_tokens:
        return None
    if sched.waiting and not _head_waits(sched):
        return None
    return _stretch(sched, decode_ends, 0)


def sglang_decode_stretch(sched: SglangScheduler, decode_ends: DecodeEnds) -> Stretch | None:
    """`decode_stretch` for SGLang's policy: while nothing waits, every pass is one decode
    step of every running request (`_decode_step`), alike until a request completes or the
    pages a pass needs are more than the free ones (it retracts). A step takes each request's
    page for the token it is about to produce, one token ahead of vLLM's; all of a pass's
    pages are taken before its full pages are registered. Each pass also counts down
    `decode_passes_owed` and lets `new_token_ratio` decay one step, as `schedule` does."""
    if sched.waiting or sched.loaded or sched.deferred or not sched.running:
        return None
    stretch = _stretch(sched, decode_ends, 1)
    if stretch is not None:
        k = len(stretch.ends)
        ratio = sched.new_token_ratio
        step, floor = sched.new_token_ratio_step, sched.min_new_token_ratio
        for _ in range(k):  # in floats, pass after pass, as `schedule` lowers it
            if ratio == floor:
                break
            ratio = max(ratio - step, floor)
        sched.new_token_ratio = ratio
        sched.decode_passes_owed = max(0, sched.decode_passes_owed - k)
    return stretch


def _stretch(sched: SchedulerBase, decode_ends: DecodeEnds, ahead: int) -> Stretch | None:
    """The stretch of `decode_stretch`, once the policy's own conditions hold: every running
    request one decode token short. A pass takes the blocks of the tokens it computes and
    `ahead` more (0: vLLM; 1: SGLang, which holds a page for the token a step produces);
    `ahead` also orders a pass's KV events: vLLM's request by request (its allocation, then
    its full blocks), SGLang's every allocation first."""
    running = sched.running
    n = len(running)
    last = running[-1]
    if last.num_computed_tokens < last.input_length:
        return None  # the newest admission is still in prefill (checked first: often so)
    bs = sched.block_size
    max_len = sched.cfg.max_model_len
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
    if sched.tiers is not None:  # (that pass stores tier copies: `schedule` forms it)
        k_max -= 1
        completing = 0
    if k_max <= 0:
        return None
    pool = sched.pool
    free = pool.free_blocks
    # the pass (from 0) of each request's first block allocation (the first whose tokens, and
    # `ahead` more, reach past the blocks it holds); it takes one more every `bs` passes.
    # Nothing frees a block during the stretch: the pass whose allocations reach past the
    # free blocks would fail (it preempts), so the stretch ends before it
    firsts = [
        (len(r.held_hashes) + r.held_private_blocks) * bs - r.num_computed_tokens - ahead
        for r in running
    ]
    if min(firsts) < 0:
        return None  # (one lacks more than one pass's block: not a plain decode step)
    if _taken(firsts, bs, k_max) > free:
        k_max = _first_short_pass(firsts, bs, free, k_max)
        if k_max == 0:
            return None
    ends = decode_ends(n, sum_ctx, k_max)
    k = len(ends)
    if k == 0:
        return None
    stretch = Stretch(ends, n, pool.n_active)
    caching = pool.enable_caching
    # per request in running order, its cached tokens before the stretch (computed, and
    # `ahead` more: SGLang caches the page of the token a step produces) and the blocks that
    # become full during it
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
        c0 += ahead
        full.append((c0, range(c0 // bs, (c0 + k) // bs) if caching else range(0)))
    if pool.record_events:
        allocs = [(i, order) for order, f in enumerate(firsts) for i in range(f, k, bs)]
        _stretch_pass_by_pass(sched, stretch, allocs, full, ahead == 1)
    else:
        _stretch_in_bulk(sched, stretch, firsts, k, full)
    if k == completing:
        stretch.done = _complete_decoded(sched)
    return stretch


def _taken(firsts: list[int], bs: int, k: int) -> int:
    """Blocks the first `k` decode passes allocate, requests first allocating in passes
    `firsts` and then every `bs` passes."""
    return sum((k - 1 - f) // bs + 1 for f in firsts if f < k)


def _first_short_pass(firsts: list[int], bs: int, free: int, k_max: int) -> int:
    """The first of `k_max` passes whose allocations, with those before it, take more than
    `free` blocks (there is one)."""
    lo, hi = 0, k_max - 1  # (passes lo..hi: the answer is among them)
    while lo < hi:
        mid = (lo + hi) // 2
        if _taken(firsts, bs, mid + 1) > free:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _block_hashes(sched: SchedulerBase, r: Request, js: range) -> list[int]:
    """`_block_hash` of `r`'s blocks `js`; past its prompt, made in one go."""
    if js.start >= len(r.prompt_hashes):
        return sched.hasher.unique_blocks(r.idx, js.start, js.stop)
    return [sched._block_hash(r, j) for j in js]


def _head_waits(sched: VllmScheduler) -> bool:
    """Whether the head of the waiting queue waits for a completion: while only running
    requests decode, `_admit` would neither admit it nor reject it, in any pass before
    the next completion. So it is when the running set is full, or when the blocks it
    needs beyond its active prefix exceed the free ones: decoding only takes free blocks
    (and may evict part of its cached prefix, which only adds to what it needs), and
    nothing frees one before a completion."""
    if sched.pending_reservations or sched.tiers is not None:
        return False
    if len(sched.running) >= sched.cfg.max_num_seqs:
        return True
    req = sched.waiting[0]
    if req.materialized or (req.n_admissions == 0 and sched._never_fits(req)):
        return False
    _hashes, _hit, hit_active = sched._prefix_hit(req)
    blocks = -(-req.seq_len // sched.block_size)
    pool = sched.pool
    return blocks - hit_active > pool.free_blocks and blocks <= pool.capacity_blocks


def _complete_decoded(sched: SchedulerBase) -> list[Request]:
    """After a pass in which only running requests decoded: those that emitted their last
    token release their blocks, in running order, and leave (as in `finish`)."""
    max_len = sched.cfg.max_model_len
    done = [
        r
        for r in sched.running
        if r.num_output_tokens >= r.output_length
        or (max_len is not None and r.input_length + r.num_output_tokens >= max_len)
    ]
    sched._leave(done)
    return done


def _stretch_in_bulk(
    sched: SchedulerBase,
    stretch: Stretch,
    firsts: list[int],
    k: int,
    full: list[tuple[int, range]],
) -> None:
    """A stretch's `k` passes' blocks when the pool records no KV events: each request's
    allocations at once (the first in pass `firsts[order]`, then every block size), then
    its full blocks registered at once. Nothing frees a block during a stretch, so the same
    blocks are evicted, in the same order, as pass by pass; the pool levels after each
    allocating pass follow from the counts (an allocation evicts one cached block once the
    empty ones are used up)."""
    pool = sched.pool
    running = sched.running
    bs = sched.block_size
    if any(f < k for f in firsts):
        empty = pool.n_empty
        active, cached = pool.n_active, pool.n_cached
        for order, f in enumerate(firsts):
            if f < k:  # (fits: counted against the free blocks)
                pool.allocate(running[order], (k - 1 - f) // bs + 1)
        # (pass, blocks taken up to and including it) of each pass that allocates
        taken: list[tuple[int, int]] = []
        if bs == 1:  # every request allocates in every pass from its first on
            starting = [0] * k
            for f in firsts:
                if f < k:
                    starting[f] += 1
            per_pass = list(accumulate(starting))  # blocks each pass allocates
            cumulative = list(accumulate(per_pass))
            taken = [(i, t) for i, (c, t) in enumerate(zip(per_pass, cumulative, strict=True)) if c]
        else:
            for t, i in enumerate(sorted([i for f in firsts for i in range(f, k, bs)]), 1):
                if taken and taken[-1][0] == i:
                    taken[-1] = (i, t)
                else:
                    taken.append((i, t))
        stretch.levels.extend(
            [(i, active + t, cached - (t - empty if t > empty else 0)) for i, t in taken]
        )
    # each request's full blocks in the order of the pass that fills its last one (running
    # order among equals), as pass by pass: a radix pool orders its leaves by that touch
    last_fill = sorted(
        (((js[-1] + 1) * bs - c0, order) for order, (c0, js) in enumerate(full) if js)
    )
    for _, order in last_fill:
        r = running[order]
        pool.register_many(r, _block_hashes(sched, r, full[order][1]))


def _stretch_pass_by_pass(
    sched: SchedulerBase,
    stretch: Stretch,
    allocs: list[tuple[int, int]],
    full: list[tuple[int, range]],
    allocations_first: bool = False,
) -> None:
    """A stretch's blocks allocated and registered pass by pass, so the pool's KV events come
    in the stepped order: within a pass, request by request in running order (each one's
    allocation first), or with `allocations_first` every allocation before any
    registration."""
    pool = sched.pool
    running = sched.running
    bs = sched.block_size
    # (pass, request, kind, block) or, allocations first, (pass, kind, request, block)
    ops = [(i, 0, order, 0) if allocations_first else (i, order, 0, 0) for i, order in allocs]
    for order, (c0, js) in enumerate(full):
        # block j is full once the pass computing its last token ends
        if allocations_first:
            ops.extend([((j + 1) * bs - c0 - 1, 1, order, j) for j in js])
        else:
            ops.extend([((j + 1) * bs - c0 - 1, order, 1, j) for j in js])
    if not ops:
        return
    ops.sort()
    events = pool.pending_events
    seen = len(events)
    levels = stretch.levels
    passes = stretch.event_passes
    for i, a, b, j in ops:
        order, kind = (b, a) if allocations_first else (a, b)
        r = running[order]
        if kind == 0:
            pool.allocate(r, 1)  # fits: counted against the free blocks
            if levels and levels[-1][0] == i:
                levels.pop()
            levels.append((i, pool.n_active, pool.n_cached))
        else:
            pool.register(r, sched._block_hash(r, j))
        events = pool.pending_events
        if len(events) > seen:
            passes.extend([i] * (len(events) - seen))
            seen = len(events)


def _methods(policy: type) -> dict[tuple[str, str], object]:
    return {
        (cls.__name__, name): value
        for cls in policy.__mro__[:-1]
        for name, value in vars(cls).items()
        if callable(value)
    }


# the methods of the shipped policies as they were imported: a stretch stands in for these
_SHIPPED = _methods(VllmScheduler)
_SHIPPED_SGLANG = _methods(SglangScheduler)


def replaced_methods(
    policy: type = VllmScheduler, shipped: dict[tuple[str, str], object] | None = None
) -> list[str]:
    """The shipped policy's methods replaced since import (a notebook's patch), as
    `Class.method` (vLLM's policy unless told another and its methods at import)."""
    if shipped is None:
        shipped = _SHIPPED
    return sorted(
        f"{cls}.{name}"
        for (cls, name), value in shipped.items()
        if vars(next(c for c in policy.__mro__ if c.__name__ == cls)).get(name) is not value
    )


def stretches_apply(sched: object) -> bool:
    """Whether decode stretches may stand in for `sched`'s passes: only for the shipped vLLM
    policy as shipped, without speculative decoding (a stretch emits one token per request
    per pass). Another policy (a subclass, or a patched method) decides each pass its own
    way, so each of its passes goes through `schedule`."""
    return type(sched) is VllmScheduler and sched.speculator is None and not replaced_methods()


def stretcher_for(sched: object) -> Callable[[DecodeEnds], Stretch | None] | None:
    """The decode stretch that may stand in for `sched`'s passes, or None: vLLM's or SGLang's
    shipped policy as shipped, without speculative decoding."""
    if stretches_apply(sched):
        assert isinstance(sched, VllmScheduler)
        return partial(decode_stretch, sched)
    if (
        type(sched) is SglangScheduler
        and sched.speculator is None
        and not replaced_methods(SglangScheduler, _SHIPPED_SGLANG)
    ):
        return partial(sglang_decode_stretch, sched)
    return None
