"""KV tiers below HBM: the G2 host pool and the G3 disk pool, and the copies between tiers.

Modelled on vLLM's OffloadingConnector (as Dynamo's native host offload and AISimulate describe
it):

* **Store (G1 -> G2).** When a pass is formed (after its admissions), the prompt blocks it
  completes for each request since its last store (a cursor kept across preemptions) get room in
  G2 for the blocks G2 lacks, evicting its least recently used unpinned blocks, all or nothing:
  when they cannot all have room nothing is taken and a later pass tries again. Their G1 blocks
  stay pinned until the copy, started at the pass end, lands (a pass that would evict a G1 block
  still being read waits for that copy first, and the block that took its place is not copied
  in that pass: its request's store waits for a later pass). With G3, blocks that land in G2
  are written behind to G3 the same way (G2 source pinned until the write lands).
* **Recency of blocks freed together.** Dynamo's G2 LRU is ordered by (epoch, block key): the
  blocks of a landed store get one epoch, and so do a load's blocks when its copy to G1 lands
  (`RankTiers.cohort`). Among them the one with the smallest Dynamo sequence hash
  (model/workload/dynamo_ids.py) is the oldest, so servesim lands and refreshes them in that
  order. Lookup touches are per block (the first block the most recent).
* **Load (G2 -> G1).** At admission, after the G1 prefix lookup, the consecutive blocks after the
  G1 prefix found in G2 (then in G3) are a hit: if all the request's blocks fit beside those
  promised to prompts under way, the scheduler takes G1 blocks for the hits, the request is
  set aside (ahead of the waiting queue) and the hits are copied G2 -> G1 (with G3, the lookup
  first stages the G3 hits into G2, G3 -> G2, and sets the request aside until they land:
  copies into G1 come from G2 only); when it lands the blocks are registered in G1 and the
  request is admitted when a pass reaches it among those set aside, once the rest of its
  blocks fit.
  Looking a request up refreshes its prompt's G2 blocks. A request that needs blocks still
  being loaded for another (or whose own store is in flight) is set aside the same way, fit or
  not, without holding up the queue behind it.
* **Timing.** Copies use `servesim.kv.link.Link`: a private G2 has one FIFO lane per direction
  (a copy starts when the one before it ends); a cluster-shared G2, and every G3, share bandwidth
  by processor sharing, a copy's rate being min(pool bandwidth / copies in flight, worker
  bandwidth / that worker's copies in flight). Reads and writes use separate links.

Every G2/G3 change is recorded at once: `kv` levels (tier `host` / `disk`; `used_blocks` counts
resident and incoming blocks, `cached_blocks` the evictable ones) and `stored` / `removed` KV
events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import simpy

from servesim.kv.link import Link
from servesim.kv.pool_base import Pool
from servesim.kv.tier_pool import TierPool
from servesim.workload.dynamo_ids import dynamo_sequence_hashes
from servesim.workload.request import Request


class TierOwner(Protocol):
    """The engine side of a rank's tiers (servesim.engine.worker.Rank is one): its worker runs
    every change to the engine, now between passes or at the end of the pass in flight."""

    @property
    def order(self) -> int:
        """The worker's place in the cluster (links count copies by worker)."""
        ...

    def apply(self, command: Callable[[], None]) -> None: ...
    def copy_landed(self, command: Callable[[], None]) -> None: ...
    def sample_kv(self) -> None: ...
    def wake(self) -> None: ...
    def has_deferred(self) -> bool:
        """Whether requests wait set aside for blocks on their way."""
        ...


class FormedPass(Protocol):
    """What the tiers read of a pass the scheduler formed (servesim.engine.vllm.Batch)."""

    items: list[tuple[Request, int, int, int]]
    stores: list[tuple[Request, list[int], list[Any]]]


HOST = "host"
DISK = "disk"
RESTAGE_LIMIT = 64  # G3 blocks a request may stage again after losing them, before checking room


class RankTiers:
    """What one scheduler rank offloads to: its G2 pool (own or shared), G3 if configured, and
    the links between them. The rank's worker runs every change to its engine (`owner.apply`)."""

    def __init__(
        self,
        env: simpy.Environment,
        block_bytes: int,
        block_size: int,
        g2: TierPool,
        d2h: Link,
        h2d: Link,
        g3: TierPool | None = None,
        g2_to_g3: Link | None = None,
        g3_to_g2: Link | None = None,
    ) -> None:
        self.env = env
        self.block_bytes = block_bytes
        self.block_size = block_size
        self.g2 = g2
        self.d2h = d2h
        self.h2d = h2d
        self.g3 = g3
        self.g2_to_g3 = g2_to_g3
        self.g3_to_g2 = g3_to_g2
        self.owner: TierOwner | None = None  # set by the builder, with the rank's G1 pool
        self.g1: Pool | None = None
        # G1 blocks a store to G2 is reading -> the landing of the latest such store
        self.store_of: dict[Any, simpy.Event] = {}
        # G3 blocks staged into G2 by a request's lookup (by request index), until it loads,
        # and how many it staged again after they were evicted
        self.staged: dict[int, set[int]] = {}
        self.restaged: dict[int, int] = {}

    def blocks_arrived(self) -> None:
        """Blocks landed in G2: a request deferred until they did may be admitted now."""
        assert self.owner is not None
        if self.owner.has_deferred():
            self.owner.wake()

    # ------------------------------------------------------------------ G1 -> G2 (-> G3)

    def prepare_stores(self, batch: FormedPass) -> None:
        """Once a pass is formed: the prompt blocks it completes for each request (since its
        last store; the cursor is kept across preemptions) get room in G2 for what G2 lacks of
        them, their G1 blocks pinned, and the copy joins the pass's `stores` (started at its
        end). When G2 has no room for them all, or one of them was taken this pass from under
        a copy still in flight, nothing is copied and a later pass tries again."""
        bs = self.block_size
        assert self.g1 is not None
        fenced = self.g1.fenced_blocks
        for req, _n, _p, _b in batch.items:  # one item per request
            n_full = min(req.num_computed_tokens, req.input_length) // bs
            if n_full > req.host_cursor:
                if fenced and req in fenced and self._still_read(req, fenced[req], n_full):
                    continue  # not copied this pass; its next pass tries again
                store = self._prepare_store(req, n_full)
                if store is not None:
                    batch.stores.append(store)

    def _copy(self, link: Link, request_id: str, n_blocks: int, kind: str) -> simpy.Event:
        """Start a copy of `n_blocks` blocks on `link` (one row of the transfers table); the
        event fires when they have arrived."""
        assert self.owner is not None
        return link.submit(
            request_id,
            n_blocks * self.block_bytes,
            n_blocks * self.block_size,
            kind,
            self.owner.order,
        )

    def _still_read(self, req: Request, positions: list[int], n_full: int) -> bool:
        """Whether a block `req` would copy to G2 now (one G2 lacks) sits where a copy still in
        flight reads: Dynamo copies none of the request's blocks this pass then."""
        g2 = self.g2
        start = req.host_cursor
        keys = req.prompt_hashes
        return any(
            start <= j < n_full and keys[j] not in g2.resident and keys[j] not in g2.incoming
            for j in positions
        )

    def store_delivered(self, req: Request) -> None:
        """A P/D request delivered with nothing to decode and no pass to join ends at its
        activation; its prompt is stored like a computed one (the copy starts now, its G1
        blocks pinned), as Dynamo's decode worker settles it as a pass of its own."""
        n_full = req.input_length // self.block_size
        if n_full > req.host_cursor:
            store = self._prepare_store(req, n_full)
            if store is not None:
                self._store(*store)

    def _prepare_store(
        self, req: Request, n_full: int
    ) -> tuple[Request, list[int], list[Any]] | None:
        """Room in G2 for what it lacks of `req`'s prompt blocks up to `n_full`, their G1
        blocks pinned: the copy to start, or None (nothing to copy, or no room for it all)."""
        start = req.host_cursor
        keys = req.prompt_hashes[start:n_full]
        # a refused store is tried again at the request's later passes: its blocks count once
        admitted = self.g2.reserve(keys, counted=req.host_refused - start)
        if admitted is None:
            req.host_refused = max(req.host_refused, n_full)
            return None
        req.host_cursor = n_full
        if not admitted:
            return None
        self.g2.touch(req.prompt_hashes)  # a store refreshes the whole prompt's blocks
        wanted = set(admitted)
        g1_keys = [req.held_hashes[j] for j in range(start, n_full) if keys[j - start] in wanted]
        assert self.g1 is not None
        self.g1.pin(g1_keys)
        return req, admitted, g1_keys

    def store_pass(self, batch: FormedPass) -> None:
        """At a pass end (before finished requests let go of their blocks): start the copies
        to G2 the pass prepared."""
        for req, admitted, g1_keys in batch.stores:
            self._store(req, admitted, g1_keys)

    def _store(self, req: Request, admitted: list[int], g1_keys: list[Any]) -> None:
        """Copy `req`'s prompt blocks `admitted` (G1 blocks `g1_keys`, pinned) to G2."""
        assert self.g1 is not None and self.owner is not None
        pool = self.g1
        worker = self.owner
        store_of = self.store_of
        done = self._copy(self.d2h, req.request_id, len(admitted), "d2h")

        g2 = self.g2
        shared = len(g2.readers) > 1

        cohort = self.cohort(req, admitted)

        def apply() -> None:
            if not shared:
                g2.land(cohort)
            pool.unpin(g1_keys)
            self._write_behind(req.request_id, admitted)

        if self.d2h.bandwidth_gbps is None:
            # an instant copy lands as it starts (Dynamo settles zero-latency copies at the
            # boundary that submits them, before anything else there looks at the pool)
            if shared:
                g2.land(cohort)
            apply()
            return

        def landed(_: simpy.Event) -> None:
            if req.host_store is done:
                req.host_store = None
            for k in g1_keys:
                if store_of.get(k) is done:
                    del store_of[k]
            if shared:  # other workers read these blocks now, whatever this one is doing
                g2.land(cohort)
            worker.copy_landed(apply)

        done.callbacks.append(landed)
        req.host_store = done
        for k in g1_keys:
            store_of[k] = done

    def cohort(self, req: Request, keys: list[int]) -> list[int]:
        """`req`'s prompt blocks `keys` in the order Dynamo's G2 LRU gives blocks that become
        evictable together (a landed store, a finished load): they share one recency, ties
        broken by Dynamo's sequence hash (ascending: the smallest is evicted first; see
        model/workload/dynamo_ids.py). Without trace hash ids, the given order."""
        if req.canonical_ids is None or len(keys) < 2:
            return keys
        dynamo = req.dynamo_hashes
        if dynamo is None:  # computed once per request, the first time a tier needs them
            ids, tbs = req.canonical_ids
            hashes = req.prompt_hashes
            seq = dynamo_sequence_hashes(ids, len(hashes), tbs, self.block_size)
            dynamo = req.dynamo_hashes = dict(zip(hashes, seq, strict=True))
        return sorted(keys, key=dynamo.__getitem__)

    def landings(self, keys: list[Any]) -> list[simpy.Event]:
        """The landings of the stores reading the G1 blocks `keys` (those still in flight)."""
        return list(dict.fromkeys(e for e in map(self.store_of.get, keys) if e is not None))

    def _write_behind(self, request_id: str, keys: list[int]) -> None:
        g3 = self.g3
        if g3 is None or self.g2_to_g3 is None:
            return
        g3.touch(keys)
        admitted = g3.reserve(keys)
        if not admitted:
            return
        self.g2.pin(admitted)
        done = self._copy(self.g2_to_g3, request_id, len(admitted), "g2_to_g3")

        def landed(_: simpy.Event) -> None:
            g3.land(admitted)
            g2 = self.g2
            g2.unpin(admitted)
            # written through, they are the most recently used of G2
            g2.refresh([k for k in admitted if k in g2.resident])

        done.callbacks.append(landed)

    # ------------------------------------------------------------------ G2 (G3) -> G1

    def lookup(self, hashes: list[int], start: int, stop: int) -> tuple[int, bool]:
        """Blocks after the G1 prefix (`hashes[start:stop]`) found in G2; and whether G2 is
        still receiving one of those it counts (a copy in flight: counted, not readable)."""
        keys = hashes[start:stop]
        g2 = self.g2
        n_host = g2.lookup(keys)
        incoming = g2.incoming
        on_the_way = False
        if incoming:
            while n_host < len(keys) and keys[n_host] in incoming:
                on_the_way = True
                n_host += g2.lookup(keys[n_host + 1 :]) + 1
        return n_host, on_the_way

    def stage(self, req: Request, keys: list[int]) -> bool:
        """Looking `req` up with G3 (its prompt's `keys` after the G1 prefix): the blocks G2
        lacks and G3 holds, up to the first block neither holds, are staged into G2 in one
        `g3_to_g2` copy (G2 room taken block by block while it fits). True when some are, or
        a block of that run is still on its way into G2 or G3: the request is set aside and
        looked up again once they land (as Dynamo does: it loads into G1 from G2 only)."""
        g2 = self.g2
        g3 = self.g3
        assert g3 is not None
        staged: list[int] = []
        on_the_way = False
        before = self.staged.get(req.idx)
        run: set[int] | None = None
        for k in keys:
            if k in g2.resident:
                continue
            if k in g2.incoming:
                on_the_way = True
            elif k in g3.resident:
                if before is not None and k in before:
                    # staged for this request before and evicted since: as in Dynamo, staged
                    # again, but after RESTAGE_LIMIT times only if its whole run fits, or a run
                    # longer than G2 would evict itself forever (it goes on with what it has)
                    n = self.restaged[req.idx] = self.restaged.get(req.idx, 0) + 1
                    if n > RESTAGE_LIMIT:
                        if run is None:
                            run = self._run(keys)
                        if not g2.can_hold(run):
                            break
                if not g2.reserve([k], counted=1):
                    break  # G2 has no room left for it
                staged.append(k)
            elif k in g3.incoming:
                on_the_way = True
            else:
                break
        if not staged:
            return on_the_way
        g3.pin(staged)
        self.staged.setdefault(req.idx, set()).update(staged)
        self.env.process(self._stage(req, staged))
        return True

    def _run(self, keys: list[int]) -> set[int]:
        """The leading `keys` found in G2 or G3 (resident or on their way)."""
        g2, g3 = self.g2, self.g3
        assert g3 is not None
        run: set[int] = set()
        for k in keys:
            if not (k in g2.resident or k in g2.incoming or k in g3.resident or k in g3.incoming):
                break
            run.add(k)
        return run

    def _stage(self, req: Request, keys: list[int]):  # type: ignore[no-untyped-def]
        assert self.owner is not None and self.g3 is not None and self.g3_to_g2 is not None
        worker = self.owner
        yield self._copy(self.g3_to_g2, req.request_id, len(keys), "g3_to_g2")
        g2 = self.g2
        g3 = self.g3
        cohort = self.cohort(req, keys)

        def landed() -> None:
            g2.land(cohort)
            g3.unpin(keys)
            g3.touch(keys)

        if len(g2.readers) > 1:  # a shared G2: readable by every worker at once
            landed()
        else:  # at this worker's pass boundary, as a store's
            worker.apply(landed)

    def staged_from_g3(self, req: Request, keys: list[int]) -> int:
        """How many of `keys` (loaded now for `req`) this request staged from G3."""
        staged = self.staged.pop(req.idx, None)
        self.restaged.pop(req.idx, None)
        return sum(1 for k in keys if k in staged) if staged else 0

    def reserve_load(self, keys: list[int]) -> None:
        """Hold the G2 blocks a load into G1 reads (pinned until it lands)."""
        self.g2.pin(keys)

    def load(
        self,
        req: Request,
        keys: list[int],
        landed: Callable[[], None],
        fences: list[simpy.Event],
    ) -> None:
        """Bring `keys` (in G2, pinned by `reserve_load`) to G1 for `req`, once the `fences`
        (stores still reading the G1 blocks taken for them) have landed. `landed()` runs on the
        rank's worker when the blocks are in G1."""
        self.env.process(self._load(req, keys, landed, fences))

    def g1_changed(self) -> None:
        """The rank's G1 pool changed outside a pass (blocks taken for a load): record it."""
        assert self.owner is not None
        self.owner.sample_kv()

    def _load(
        self,
        req: Request,
        keys: list[int],
        landed: Callable[[], None],
        fences: list[simpy.Event],
    ):  # type: ignore[no-untyped-def]
        assert self.owner is not None
        worker = self.owner
        fences = [f for f in fences if not f.processed]
        if fences:
            yield self.env.all_of(fences)
        yield self._copy(self.h2d, req.request_id, len(keys), "h2d")
        g2 = self.g2
        g2.unpin(keys)
        # read, they rejoin the LRU together: the most recent, one cohort
        g2.refresh(self.cohort(req, [k for k in keys if k in g2.resident]))
        worker.apply(landed)
        worker.wake()
