"""Dynamo's KV-aware router: cost per (worker, DP rank) from the router's own load view and a
prefix index fed by KV events, min-cost or softmax selection, a pending queue, session affinity.

Cost of target w for a request of `isl` prompt tokens (`bs`-token blocks, `n` full blocks):

    prefill_w = prefill_load_scale * max(0, (A_w + isl) / bs - credit_w)
    credit_w  = overlap_score_credit * device_w + host_cache_hit_weight * host_w
                + disk_cache_hit_weight * disk_w               (overlaps in blocks)
    decode_w  = unique prompt blocks of w's active requests + (n - blocks of this prompt's
                prefix already among them)
    cost_w    = prefill_w + decode_w + decode_active_request_weight * active_requests_w

`A_w` is the prompt tokens the router sent to w that were not cached there (isl minus the
chosen target's device overlap, at routing) and whose first token has not come yet. The router
adds a request to w's load when it dispatches it, takes its prompt tokens off at its first token
(`prefill_done`) and the rest at its end (`finished`); preemptions are invisible to it, as in
Dynamo. In P/D the prefill pool's router has no decode term and the decode pool's router no
prefill term and no overlap credit (its decode term counts every request's blocks, no sharing).

Temperature 0 takes the minimum (ties: reservoir sampling over targets in (worker, rank) order,
seeded from the run's `router` stream); temperature T > 0 draws from
p_w ~ exp(-(cost_w - min) / ((max - min) * T)) (uniform when all costs are equal).

Pending queue (`queue_threshold` set): a target is busy while A_w > queue_threshold x
max_num_batched_tokens. A request waits when every target it may go to is busy, or when others
already wait for them; waiting requests keep the overlaps seen at arrival and are ordered
`fcfs` (arrival), `lcfs` (latest arrival first) or `wspt` (fewest uncached prompt tokens first),
ties by queue entry. They are re-examined only when a target's load drops, and, as in Dynamo,
one signal at a time: while requests wait, a pass end's first tokens and ends are held until
`settle`, then applied one by one in the pass's batch order (its worker's running order, that
is the order of the requests' latest admissions, which the cluster reports to `admitted`), the
queue re-examined after each; a request released by one first token still sees the prefill
tokens of those the pass has not applied yet. A re-examination looks at the requests bound to
that target, and the shared queue if a target is free, by heads, in O(log n) per request
released. While nothing waits a signal is applied at once: no re-examination could release
anything, and nothing is routed before the pass end's signals are in.

Session affinity (`affinity.mode`): the key's first request initialises a binding (the key's
later requests wait until it is dispatched), the binding is then set to where it went; later
requests of the key go there (hard affinity) while it lives. Each dispatched request holds a
lease until it ends; a binding with no lease expires once idle for `ttl_seconds`; an expired
binding, or one whose target can no longer take requests, is re-selected by the next request.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from servesim.config.schema import KvRouter as KvRouterConfig
from servesim.metrics.recorder import Recorder
from servesim.router.base import Router
from servesim.router.prefix_index import Holders, PrefixIndex
from servesim.workload.request import Request

# a flight never admitted (a rejection) signals after the pass's admitted requests
NOT_ADMITTED = 1 << 62
IMMEDIATE = "immediate"
QUEUED = "queued"
POOL_NAMES = {"aggregated": "agg", "prefill": "prefill", "decode": "decode"}

Overlaps = tuple[list[int], list[int], list[int]]


@dataclass(slots=True)
class _Flight:
    """A request the router counts on a target until it ends."""

    target: int
    prefill_tokens: int  # charged to A_w until the first token
    blocks: list[int]  # prompt blocks charged to the decode term (sharing counted once)
    n_private: int  # decode pool: blocks charged with no sharing
    key: str | None
    order: int = NOT_ADMITTED  # its latest admission's rank among the router's admissions


@dataclass(slots=True)
class Binding:
    """Where one affinity key's requests go."""

    target: int = -1  # -1 while the key's first request is being routed
    leases: int = 0  # dispatched requests of the key not yet ended
    idle_since_ms: float = 0.0
    waiters: deque[Request] | None = None  # the key's requests waiting for its first


@dataclass(slots=True)
class _Waiting:
    req: Request
    overlaps: Overlaps
    pinned: int  # target it is bound to, or -1
    entered_ms: float


# a queue entry: (policy key, entry sequence, the waiting request); tuples compare in C
Entry = tuple[float, int, _Waiting]
# a held lifecycle signal: (target, running order, arrival in the pass end, the request's
# flight, whether it is a first token, whether it is an end); tuples compare in C and the
# third field is unique
Signal = tuple[int, int, int, _Flight, bool, bool]


class KvRouter(Router):
    def __init__(
        self,
        env: simpy.Environment,
        cfg: KvRouterConfig,
        num_workers: int,
        dp_size: int,
        rng: np.random.Generator,
        block_size: int,
        max_num_batched_tokens: int,
        role: str,
        recorder: Recorder,
    ) -> None:
        super().__init__()
        self.env = env
        self.cfg = cfg
        self.dp_size = dp_size
        self.n_targets = num_workers * dp_size
        self.rand = random.Random(int(rng.integers(1 << 63)))
        self.block_size = block_size
        self.pool_name = POOL_NAMES[role]
        self.recorder = recorder
        # which terms this pool's router scores (Dynamo's derived P/D router configs)
        self.track_prefill = role != "decode"
        self.track_active = role != "prefill"
        self.share_blocks = role == "aggregated"
        self.credit = cfg.overlap_score_credit if role != "decode" else 0.0
        self.index = PrefixIndex(self.n_targets, cfg.kv_event_lag_ms)
        # the router's load view, per target
        self.prefill_tokens = [0] * self.n_targets
        self.active_requests = [0] * self.n_targets
        self.active_blocks = Holders()
        self.n_active_blocks = [0] * self.n_targets  # unique blocks (or private counts)
        self.flights: dict[int, _Flight] = {}
        # pending queue
        self.busy_tokens = (
            None if cfg.queue_threshold is None else cfg.queue_threshold * max_num_batched_tokens
        )
        self.shared_queue: list[Entry] = []
        self.bound_queue: dict[int, list[Entry]] = {}
        self.n_waiting = 0
        self._seq = 0
        self._n_admitted = 0  # admissions counted (`admitted`), for the running order
        # signals held while requests wait, by request index, until `settle` applies them
        self._held: dict[int, Signal] = {}
        # affinity
        self.affinity = cfg.affinity.mode
        self.ttl_ms = cfg.affinity.ttl_seconds * 1000.0
        self.bindings: dict[str, Binding] = {}
        # (expiry ms, key, idle since): bindings that may expire, so they can be dropped
        self._expiries: list[tuple[float, str, float]] = []
        self.routable = [True] * self.n_targets

    # ------------------------------------------------------------------ the router protocol

    @property
    def has_waiting(self) -> bool:
        return self.n_waiting > 0

    def waiting(self) -> list[Request]:
        out = [e[2].req for e in sorted(self.shared_queue)]
        for queue in self.bound_queue.values():
            out.extend(e[2].req for e in sorted(queue))
        for b in self.bindings.values():
            if b.waiters:
                out.extend(b.waiters)
        return out

    def submit(self, req: Request) -> None:
        now = self.env.now
        key = self._key(req)
        pinned = -1
        if key is not None:
            self._forget_expired(now)
            b = self.bindings.get(key)
            if b is not None and b.target < 0:
                if b.waiters is None:
                    b.waiters = deque()
                b.waiters.append(req)  # the key's first request is still being routed
                self.n_waiting += 1
                req.router_entered_ms = now
                return
            if b is not None and not self._binding_valid(b, now):
                b = None
            if b is None:
                self.bindings[key] = Binding()
            else:
                pinned = b.target
        self._place(req, self._overlaps(req), pinned, now, IMMEDIATE)

    def admitted(self, req: Request) -> None:
        """A worker admitted `req` (again, after a preemption): it goes to the end of its
        target's running order, the order a pass's signals come in."""
        f = self.flights.get(req.idx)
        if f is not None:
            self._n_admitted += 1
            f.order = self._n_admitted

    def prefill_done(self, req: Request) -> None:
        f = self.flights.get(req.idx)
        if f is None or not f.prefill_tokens:
            return
        if self.n_waiting:
            self._hold(req.idx, f, first_token=True)
            return
        self._prefill_off(f)

    def finished(self, req: Request) -> None:
        f = self.flights.pop(req.idx, None)
        if f is None:
            return
        if self.n_waiting:
            self._hold(req.idx, f, first_token=False)
            return
        self._end(f)

    def settle(self) -> None:
        """A pass end's signals are all in: apply the held ones in the pass's batch order (a
        request's first token and end together), re-examining the queue after each one that
        lowered a target's prefill load (Dynamo's replay drains after every signal; only
        those can release anything)."""
        if not self._held:
            return
        held = sorted(self._held.values())
        self._held.clear()
        for t, _order, _k, f, first_token, end in held:
            before = self.prefill_tokens[t]
            if first_token:
                self._prefill_off(f)
            if end:
                self._end(f)
            if self.prefill_tokens[t] < before:
                self._drain(t)

    def _hold(self, idx: int, f: _Flight, first_token: bool) -> None:
        held = self._held.get(idx)
        if held is None:
            self._held[idx] = (f.target, f.order, len(self._held), f, first_token, not first_token)
        else:  # its first token and its end in one pass: one signal (Dynamo's free does both)
            self._held[idx] = (held[0], held[1], held[2], f, held[4], True)

    def _prefill_off(self, f: _Flight) -> None:
        self.prefill_tokens[f.target] -= f.prefill_tokens
        f.prefill_tokens = 0

    def _end(self, f: _Flight) -> None:
        t = f.target
        self.prefill_tokens[t] -= f.prefill_tokens
        self.active_requests[t] -= 1
        if self.share_blocks:
            self.n_active_blocks[t] -= self.active_blocks.remove(t, f.blocks)
        else:
            self.n_active_blocks[t] -= f.n_private
        if f.key is not None:
            b = self.bindings.get(f.key)
            if b is not None and b.target == t:
                b.leases -= 1
                if b.leases == 0:
                    now = self.env.now
                    b.idle_since_ms = now
                    heapq.heappush(self._expiries, (now + self.ttl_ms, f.key, now))

    def close_target(self, target: int) -> None:
        """`target` takes no more requests: bindings to it re-select at their next request."""
        self.routable[target] = False

    # ------------------------------------------------------------------ scoring

    def _key(self, req: Request) -> str | None:
        if self.affinity == "session":
            return req.session_id
        if self.affinity == "sibling_group":
            return req.affinity_group
        return None

    def _forget_expired(self, now: float) -> None:
        """Drop the bindings that expired by `now` (so the table holds live keys only)."""
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, key, idle_since = heapq.heappop(expiries)
            b = self.bindings.get(key)
            if b is not None and b.leases == 0 and b.idle_since_ms == idle_since:
                del self.bindings[key]

    def _binding_valid(self, b: Binding, now: float) -> bool:
        if not self.routable[b.target]:
            return False
        return b.leases > 0 or now - b.idle_since_ms < self.ttl_ms

    def _overlaps(self, req: Request) -> Overlaps:
        if self.credit == 0.0 and not self.index.has_tiers:
            zeros = [0] * self.n_targets
            return zeros, zeros, zeros
        self.index.advance(self.env.now)
        return self.index.overlaps(req.prompt_hashes)

    def costs(self, req: Request, overlaps: Overlaps) -> list[float]:
        """The cost of every target for `req`, in target order."""
        cfg = self.cfg
        bs = self.block_size
        n_blocks = len(req.prompt_hashes)
        isl = req.input_length
        device, host, disk = overlaps
        if self.track_active and self.share_blocks:
            in_flight = self.active_blocks.depths(req.prompt_hashes, self.n_targets)
        else:
            in_flight = None
        out = []
        for t in range(self.n_targets):
            cost = 0.0
            if self.track_prefill:
                raw = (self.prefill_tokens[t] + isl) / bs
                credit = (
                    self.credit * device[t]
                    + cfg.host_cache_hit_weight * host[t]
                    + cfg.disk_cache_hit_weight * disk[t]
                )
                cost = cfg.prefill_load_scale * max(0.0, raw - credit)
            if self.track_active:
                new = n_blocks - (in_flight[t] if in_flight is not None else 0)
                cost += self.n_active_blocks[t] + new
            cost += cfg.decode_active_request_weight * self.active_requests[t]
            out.append(cost)
        return out

    def select(self, costs: list[float], allowed: Callable[[int], bool] | None = None) -> int:
        """The chosen target: minimum cost with a uniform tie-break, or a softmax draw."""
        rows = [t for t in range(len(costs)) if allowed is None or allowed(t)]
        if self.cfg.temperature > 0.0:
            return rows[softmax_pick([costs[t] for t in rows], self.cfg.temperature, self.rand)]
        best = rows[0]
        best_cost = math.inf
        ties = 0
        for t in rows:
            c = costs[t]
            if c < best_cost:
                best, best_cost, ties = t, c, 1
            elif c == best_cost:
                ties += 1
                if self.rand.randrange(ties) == 0:
                    best = t
        return best

    # ------------------------------------------------------------------ placing and waiting

    def _busy(self, t: int) -> bool:
        assert self.busy_tokens is not None
        return self.prefill_tokens[t] > self.busy_tokens

    def _place(
        self, req: Request, overlaps: Overlaps, pinned: int, entered_ms: float, outcome: str
    ) -> None:
        if self.busy_tokens is not None:
            if pinned >= 0:
                blocked = bool(self.bound_queue.get(pinned)) or self._busy(pinned)
            else:
                blocked = bool(self.shared_queue) or all(
                    self._busy(t) for t in range(self.n_targets) if self.routable[t]
                )
            if blocked:
                self._enqueue(req, overlaps, pinned, entered_ms)
                return
        self._dispatch(req, overlaps, pinned, entered_ms, outcome)

    def _enqueue(self, req: Request, overlaps: Overlaps, pinned: int, entered_ms: float) -> None:
        policy = self.cfg.queue_policy
        arrival = req.arrival_ms
        key: int | float  # (an integer wspt key stays one)
        if policy == "fcfs":
            key = arrival
        elif policy == "lcfs":
            key = -arrival
        else:  # wspt: the least uncached prefill work first
            key = max(1, req.input_length - max(overlaps[0]) * self.block_size)
        self._seq += 1
        queue = self.bound_queue.setdefault(pinned, []) if pinned >= 0 else self.shared_queue
        heapq.heappush(queue, (key, self._seq, _Waiting(req, overlaps, pinned, entered_ms)))
        self.n_waiting += 1

    def _drain(self, t: int) -> None:
        """Target `t`'s load dropped: release what waits for it, best first, while it can."""
        if self.busy_tokens is None or not self.n_waiting:
            return
        bound = self.bound_queue.get(t)
        while True:
            heads = []
            if bound and not self._busy(t):
                heads.append(bound)
            if self.shared_queue and any(
                not self._busy(k) for k in range(self.n_targets) if self.routable[k]
            ):
                heads.append(self.shared_queue)
            if not heads:
                return
            queue = min(heads, key=lambda q: q[0][:2])
            w = heapq.heappop(queue)[2]
            self.n_waiting -= 1
            self._dispatch(w.req, w.overlaps, w.pinned, w.entered_ms, QUEUED)

    def _dispatch(
        self, req: Request, overlaps: Overlaps, pinned: int, entered_ms: float, outcome: str
    ) -> None:
        if pinned >= 0:
            t = pinned
        else:
            t = self.select(self.costs(req, overlaps), lambda k: self.routable[k])
        device = overlaps[0]
        isl = req.input_length
        new_tokens = isl - min(device[t] * self.block_size, isl) if self.track_prefill else 0
        self.prefill_tokens[t] += new_tokens
        self.active_requests[t] += 1
        n_private = 0
        if self.track_active:
            if self.share_blocks:
                self.n_active_blocks[t] += self.active_blocks.add(t, req.prompt_hashes)
            else:
                n_private = len(req.prompt_hashes)
                self.n_active_blocks[t] += n_private
        key = self._key(req)
        self.flights[req.idx] = _Flight(t, new_tokens, req.prompt_hashes, n_private, key)
        now = self.env.now
        best = max(device)
        worker, rank = divmod(t, self.dp_size)
        self.recorder.routed(
            req.request_id,
            self.pool_name,
            outcome,
            entered_ms,
            now,
            worker,
            rank,
            t,
            device[t],
            best,
        )
        self.send(req, worker, rank)
        if key is not None:
            b = self.bindings[key]
            first = b.target < 0
            b.target = t
            b.leases += 1
            if first:
                while b.waiters:  # the key's later requests, in arrival order
                    w = b.waiters.popleft()
                    self.n_waiting -= 1
                    self._place(w, self._overlaps(w), t, w.router_entered_ms, QUEUED)


def softmax_pick(costs: list[float], temperature: float, rand: random.Random) -> int:
    """Row drawn with p ~ exp(-(c - min) / ((max - min) * temperature)); uniform if all equal."""
    lo, hi = min(costs), max(costs)
    if lo == hi:
        weights = [1.0] * len(costs)
    else:
        scale = (hi - lo) * temperature
        weights = [math.exp(-(c - lo) / scale) for c in costs]
    total = sum(weights)
    u = rand.random()
    acc = 0.0
    for row, w in enumerate(weights):
        acc += w / total
        if u <= acc:
            return row
    return len(costs) - 1
