"""The speed layer's G1 block pool kept by trace block: `BlockPool`'s LRU, an entry per group.

When engine blocks tile trace blocks (Mooncake: 8 blocks of 64 tokens per 512-token trace
block), block r of trace block k has the chain id of k with r in the low bits
(`servesim.workload.hashing`). The blocks of one trace block (a *group*) are nearly always
registered, shared, released and evicted together, so this pool keeps one dict entry per group:
an int state while its blocks are resident and alike (holders >= 1, or the negated id of the
release that made them inactive), a list of per-block states (None: not resident) once they
diverge. Everything else is `BlockPool`'s: the same API on per-block keys, LRU order,
evictions, levels and KV events (tests/speed/test_group_pool.py runs both on the same
operations). Releases are runs of *spans* (group, low rank, high rank), evicted top rank first.
Content with no group (generated tokens, unshared prompts: negative ids) and duplicate copies
(`(hash, serial)`) are single entries. A run with KV tiers uses `BlockPool` (pool_choice.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from servesim.kv import block_pool
from servesim.kv.pool_base import REMOVED, STORED, Key
from servesim.speed.group_keys import SINGLES, GroupKeys, Span, run_start
from servesim.workload.request import Request

# runs of single keys (generated tokens) at least this long are registered, released and evicted
# by whole-list operations; shorter ones key by key
SINGLES_AT_ONCE = 16


class GroupPool(GroupKeys):
    """The grouped pool's levels, lookups, allocation, LRU and releases."""

    # ------------------------------------------------------------------ levels (CountedPool's)

    @property
    def refcount(self) -> dict[Key, int]:
        """Active cached blocks and their holders (a new dict: for inspection)."""
        return {key: c for key, c in self._states() if c > 0}

    @property
    def inactive(self) -> list[Key]:
        """Inactive blocks, oldest first (a new list: for inspection)."""
        return self._lru_order()

    # ------------------------------------------------------------------ prefix lookups

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """Leading blocks of `hashes` resident, and how many of them are active."""
        groups = self.groups
        mask = self.mask
        per = self.per
        n = n_active = 0
        i = 0
        end = len(hashes)
        while i < end:
            h = hashes[i]
            if h >= 0 and h & mask == 0 and i + per <= end and hashes[i + per - 1] == h + per - 1:
                v = groups.get(h)
                if v.__class__ is int and (
                    self._serial == 0 or hashes[i : i + per] == list(range(h, h + per))
                ):
                    # a whole group, resident and alike
                    n += per
                    if v > 0:
                        n_active += per
                    i += per
                    continue
            s = self._get(h)
            if s is None:
                keys = self.copies.get(h)
                if not keys:
                    break
                s = self._get(keys[0])
                assert s is not None
            n += 1
            if s > 0:
                n_active += 1
            i += 1
        return n, n_active

    def acquire(self, req: Request, hashes: list[int]) -> None:
        """Grant `req` the resident blocks `hashes` (a prefix hit): share or reactivate them."""
        groups = self.groups
        per = self.per
        held = req.held_hashes
        for key, lo, hi in self._spans(hashes):
            if lo >= 0:
                v = groups.get(key)
                if v.__class__ is int and hi - lo == per:
                    if v > 0:
                        groups[key] = v + 1
                    else:
                        run = self.runs[-v]
                        end = run[2] - 1
                        if end >= run[1] and run[0][end] == (key, 0, per):
                            run[2] = end
                        else:
                            run[3] = True
                        self.n_inactive -= per
                        groups[key] = 1
                    held.extend(range(key, key + per))
                    continue
                if v.__class__ is list:
                    for r in range(lo, hi):
                        if v[r] is None:
                            break
                    else:  # every block of the span is resident in the group
                        for r in range(lo, hi):
                            v[r] = self._took(v[r], key, r)
                        if v.count(v[0]) == per:
                            groups[key] = v[0]
                        held.extend(range(key + lo, key + hi))
                        continue
                hs = list(range(key + lo, key + hi))
            else:
                hs = [key]
            for h in hs:  # block by block: resident as part of a group, alone, or a copy
                k = self._oldest(h)
                assert k is not None, f"block {h} was not resident"
                s = self._get(k)
                assert s is not None
                self._set(k, self._took(s, *self._where(k)))
                held.append(k)

    # ------------------------------------------------------------------ allocation

    def _evict(self, n: int) -> None:
        """Evict the n least recently released blocks (there are n; this pool pins none)."""
        groups = self.groups
        runs = self.runs
        per = self.per
        events = self.pending_events if self.record_events else None
        victims: list[Key] | None = [] if (self.copies or events is not None) else None
        left = n
        run_id = self._front_run
        while left:
            run = runs.get(run_id)
            if run is None:  # pragma: no cover - the caller checked there are n to evict
                raise RuntimeError(f"{left} blocks left to evict and no inactive block")
            entries, pos, end, stale = run
            tag = -run_id
            while pos < end and left:
                key, lo, hi = entries[pos]
                if lo == SINGLES:  # single keys released together, in eviction order
                    keys: tuple[Any, ...] = key
                    taken: Sequence[Any]
                    if not stale:
                        m = len(keys) if len(keys) <= left else left
                        taken = keys[:m]
                        if m < SINGLES_AT_ONCE:
                            for k in taken:
                                del groups[k]
                        else:
                            deque(map(groups.__delitem__, taken), 0)  # (del groups[k] for each)
                    else:  # (those taken back since the release are skipped)
                        found: list[Any] = []
                        m = 0
                        for k in keys:
                            if len(found) == left:
                                break
                            m += 1
                            if groups.get(k) == tag:
                                del groups[k]
                                found.append(k)
                        taken = found
                    left -= len(taken)
                    if victims is not None:
                        victims.extend(taken)
                    if m < len(keys):
                        entries[pos] = (keys[m:], SINGLES, 0)
                        break
                    pos += 1
                    continue
                if lo < 0:
                    if not stale or groups.get(key) == tag:
                        del groups[key]
                        left -= 1
                        if victims is not None:
                            victims.append(key)
                    pos += 1
                    continue
                v: Any = groups.get(key)  # (None: a stale span's group may be gone)
                if not stale:
                    m = hi - lo if hi - lo <= left else left
                    if m == per:
                        del groups[key]
                    else:
                        if v.__class__ is int:
                            v = groups[key] = [v] * per
                        v[hi - m : hi] = [None] * m
                        if v[0] is None and v.count(None) == per:
                            del groups[key]
                    if victims is not None:
                        victims.extend(range(key + hi - 1, key + hi - m - 1, -1))
                    left -= m
                    if m < hi - lo:
                        entries[pos] = (key, lo, hi - m)
                        break
                    pos += 1
                    continue
                # stale: blocks of the span taken back since the release are skipped
                r = hi
                while r > lo and left:
                    r -= 1
                    s = v if v is None or v.__class__ is int else v[r]
                    if s != tag:
                        continue
                    self._set(key + r, None)
                    v = groups.get(key)
                    left -= 1
                    if victims is not None:
                        victims.append(key + r)
                if r > lo:
                    entries[pos] = (key, lo, r)
                    break
                pos += 1
            run[1] = pos
            if pos < end:
                break  # (left is 0)
            if run_id == self._front_run:
                del runs[run_id]
                self._run_entries -= len(entries)
                self._front_run = run_id + 1
            run_id += 1
        self.n_inactive -= n
        self.n_resident -= n
        self.n_evictions += n
        if victims is not None:
            if self.copies:
                for key in victims:
                    self._evicted(key, events)
            elif events is not None:
                events.extend([(REMOVED, key) for key in victims])

    def register(self, req: Request, h: int) -> None:
        """A private block of `req` became full with content `h`: make it a cacheable block."""
        self.n_private -= 1
        req.held_private_blocks -= 1
        existing = self._oldest(h)
        if existing is None:
            key: Key = h
            if self.record_events:
                self.pending_events.append((STORED, h))
        else:
            self._serial += 1
            key = (h, self._serial)
            keys = self.copies.get(h)
            if keys is None:
                self.copies[h] = [existing, key]
            else:
                keys.append(key)
        self._set(key, 1)
        self.n_resident += 1
        req.held_hashes.append(key)

    def register_many(self, req: Request, hashes: list[int]) -> None:
        """`register` for consecutive blocks of `req` that became full together."""
        done = self._register_new(req, hashes)
        for h in hashes[done:]:
            self.register(req, h)

    def _register_new(self, req: Request, hashes: list[int]) -> int:
        """Register the leading blocks of `hashes` up to the first whose content (or some
        block of whose group) is resident; returns how many it registered."""
        groups = self.groups
        per = self.per
        copies = self.copies
        mask = self.mask
        exact = self._serial == 0
        at_once = SINGLES_AT_ONCE
        n = len(hashes)
        done = 0  # blocks registered as fresh content, from the start: a span at a time
        while done < n:
            h = hashes[done]
            if h.__class__ is not int or h < 0:
                if n - done < at_once:  # a few: one by one
                    if h in groups or (copies and h in copies):
                        break
                    groups[h] = 1
                    done += 1
                    continue
                # content of no group (generated tokens): the run of it up to the next group
                run = hashes[done:] if done else hashes
                if max(run) < 0:  # (content hashes are ints)
                    j = n
                else:
                    j = done + 1
                    while j < n and (hashes[j].__class__ is not int or hashes[j] < 0):
                        j += 1
                    run = hashes[done:j]
                states = dict.fromkeys(run, 1)
                if (
                    len(states) == len(run)
                    and groups.keys().isdisjoint(run)
                    and not (copies and not copies.keys().isdisjoint(run))
                ):
                    groups.update(states)  # none of it resident: registered at once
                    done = j
                    continue
                for h in run:
                    if h in groups or (copies and h in copies):
                        break
                    groups[h] = 1
                    done += 1
                if done < j:
                    break
                continue
            r = h & mask
            key = h - r
            if r == 0 and exact and done + per <= n and hashes[done + per - 1] == h + per - 1:
                if key in groups or (copies and any(h + j in copies for j in range(per))):
                    break  # some of it is resident: block by block from here
                groups[key] = 1  # a whole group
                done += per
                continue
            size = per - r if per - r <= n - done else n - done
            if not (exact and hashes[done + size - 1] == h + size - 1):
                size = 1
                while r + size < per and done + size < n and hashes[done + size] == h + size:
                    size += 1
            hi = r + size
            if copies and any(key + j in copies for j in range(r, hi)):
                break
            v = groups.get(key)
            if v is None:
                v = groups[key] = [None] * per
            elif v.__class__ is int or v[r:hi].count(None) != size:
                break
            v[r:hi] = [1] * size
            if v.count(1) == per:
                groups[key] = 1
            done += size
        fresh = hashes if done == len(hashes) else hashes[:done]
        req.held_hashes.extend(fresh)
        if self.record_events:
            self.pending_events.extend([(STORED, h) for h in fresh])
        self.n_private -= done
        self.n_resident += done
        req.held_private_blocks -= done
        return done

    def release(self, req: Request) -> None:
        """`req` lets go of everything it holds; cached blocks join the LRU last block first."""
        held = req.held_hashes
        if held:
            groups = self.groups
            per = self.per
            run_id = self._next_run
            tag = -run_id
            entries: list[Span] = []
            n_freed = 0
            mask = self.mask
            last = per - 1
            exact = self._serial == 0  # no duplicate keys: packed ids run consecutively
            at_once = SINGLES_AT_ONCE
            i = len(held)  # walking back, a span (group, lo, hi) at a time
            while i:
                h = held[i - 1]
                if exact and h < 0:
                    # single keys (content of no group): the run of them ending here; a long
                    # one only this request held is freed together, as one entry
                    j = i - 1
                    while j and held[j - 1] < 0 and i - j < at_once:
                        j -= 1
                    if j and held[j - 1] < 0:
                        j = run_start(held, j)
                    if i - j >= at_once:
                        seg: list[Any] = held[j:i]
                        if list(map(groups.__getitem__, seg)).count(1) == len(seg):
                            groups.update(dict.fromkeys(seg, tag))
                            seg.reverse()
                            entries.append((tuple(seg), SINGLES, 0))
                            n_freed += len(seg)
                            i = j
                            continue
                    while i > j:  # key by key
                        i -= 1
                        h = held[i]
                        c = groups[h]
                        if c == 1:
                            groups[h] = tag
                            entries.append((h, -1, 0))
                            n_freed += 1
                        else:
                            groups[h] = c - 1
                    continue
                if h.__class__ is not int or h < 0:
                    c = groups[h]
                    if c == 1:
                        groups[h] = tag
                        entries.append((h, -1, 0))
                        n_freed += 1
                    else:
                        groups[h] = c - 1
                    i -= 1
                    continue
                r = h & mask
                key = h - r
                if r == last and exact and i >= per and held[i - per] == key:
                    v = groups[key]  # a whole group
                    if v == 1:
                        groups[key] = tag
                        entries.append((key, 0, per))
                        n_freed += per
                        i -= per
                        continue
                    if v.__class__ is int:
                        groups[key] = v - 1
                        i -= per
                        continue
                    lo = 0
                else:
                    size = r + 1 if r < i else i
                    if not (exact and held[i - size] == h - size + 1):
                        size = 1
                        while size <= r and size < i and held[i - 1 - size] == h - size:
                            size += 1
                    lo = r + 1 - size
                    v = groups[key]
                    if v.__class__ is int:
                        v = groups[key] = [v] * per
                hi = r + 1
                i -= hi - lo
                if v[lo:hi].count(1) == hi - lo:  # only this request held them: all freed
                    v[lo:hi] = [tag] * (hi - lo)
                    n_freed += hi - lo
                    entries.append((key, lo, hi))
                    if v.count(tag) == per:
                        groups[key] = tag
                    continue
                # block by block, top first: the freed ones as spans in eviction order
                top = -1
                for r in range(hi - 1, lo - 1, -1):
                    c = v[r]
                    if c == 1:
                        v[r] = tag
                        n_freed += 1
                        if top < 0:
                            top = r + 1
                    else:
                        v[r] = c - 1
                        if top >= 0:
                            entries.append((key, r + 1, top))
                            top = -1
                if top >= 0:
                    entries.append((key, lo, top))
                if v.count(v[0]) == per and v[0] is not None:
                    groups[key] = v[0]
            if n_freed:
                self._next_run = run_id + 1
                self.runs[run_id] = [entries, 0, len(entries), False]
                self._run_entries += len(entries)
                self.n_inactive += n_freed
                if self._run_entries > 2 * self.n_inactive + block_pool.COMPACT_SLACK:
                    self._compact()
            req.held_hashes = []
        self.n_private -= req.held_private_blocks
        req.held_private_blocks = 0
        self.generation += 1
