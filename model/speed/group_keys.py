"""How the speed layer's grouped G1 pool keeps its blocks: one dict entry per group of engine
blocks a trace block tiles (an int state while the group's blocks are alike, a list once they
diverge), and the per-block view of them (servesim.speed.group_pool keeps the LRU over them)."""

from __future__ import annotations

from typing import Any, Final

from servesim.kv.pool_base import CountedPool, Key

# an entry of a release's run: (group id, low rank, high rank), (single key, -1, 0), or
# (single keys in eviction order, SINGLES, 0)
Span = tuple[Any, int, int]
SINGLES: Final = -2


class GroupKeys(CountedPool):
    """The resident blocks of a grouped pool, by group."""

    __slots__ = ("per", "mask", "groups")

    def __init__(
        self, capacity_blocks: int, group_blocks: int, record_events: bool = False
    ) -> None:
        if group_blocks < 2 or group_blocks & (group_blocks - 1):
            raise ValueError(f"a group is a power of two >= 2 of blocks, got {group_blocks}")
        super().__init__(capacity_blocks, True, record_events)
        self.per = group_blocks
        self.mask = group_blocks - 1
        # group id -> int state (all blocks resident, alike) or list of per-block states;
        # single key -> int state. State: holders (>= 1) or -(run id) when inactive. Runs
        # list spans (group id, low rank, high rank), (single key, -1, 0) or (keys, SINGLES, 0)
        self.groups: dict[Any, Any] = {}

    def _states(self) -> list[tuple[Key, int]]:
        out = []
        for key, v in self.groups.items():
            if key.__class__ is not int or key < 0:
                out.append((key, v))
            elif v.__class__ is int:
                out.extend([(key + r, v) for r in range(self.per)])
            else:
                out.extend([(key + r, s) for r, s in enumerate(v) if s is not None])
        return out

    # ------------------------------------------------------------------ per-key access

    def _get(self, key: Key) -> int | None:
        """The state of one block (None: not resident)."""
        if key.__class__ is int and key >= 0:
            r = key & self.mask
            v = self.groups.get(key - r)
            return v if v is None or v.__class__ is int else v[r]
        return self.groups.get(key)

    def _set(self, key: Key, state: int | None) -> None:
        """Set one block's state (None: evicted)."""
        groups = self.groups
        if key.__class__ is int and key >= 0:
            r = key & self.mask
            gid = key - r
            v = groups.get(gid)
            if v.__class__ is not list:
                if v is None and state is None:
                    return
                v = groups[gid] = [v] * self.per
            v[r] = state
            if state is None and v.count(None) == self.per:
                del groups[gid]
        elif state is None:
            groups.pop(key, None)
        else:
            groups[key] = state

    def _spans(self, keys: list[Key]) -> list[Span]:
        """`keys` as spans of consecutive blocks of one group, in order."""
        out: list[Span] = []
        n = len(keys)
        per = self.per
        mask = self.mask
        exact = self._serial == 0  # no duplicate keys: packed ids run consecutively
        i = 0
        while i < n:
            h = keys[i]
            if h.__class__ is not int or h < 0:
                out.append((h, -1, 0))
                i += 1
                continue
            r = h & mask
            top = per - r
            size = top if top <= n - i else n - i
            if size > 1 and not (
                keys[i + size - 1] == h + size - 1
                and (exact or keys[i : i + size] == list(range(h, h + size)))
            ):
                size = 1
                while size < top and i + size < n and keys[i + size] == h + size:
                    size += 1
            out.append((h - r, r, r + size))
            i += size
        return out

    def _oldest(self, h: int) -> Key | None:
        if self._get(h) is not None:
            return h
        keys = self.copies.get(h)
        return keys[0] if keys else None

    def _where(self, key: Key) -> tuple[Any, int]:
        """(group id, rank) of a block of a group, (key, -1) of a single block."""
        if key.__class__ is int and key >= 0:
            r = key & self.mask
            return key - r, r
        return key, -1

    def _took(self, state: int, key: Any, rank: int) -> int:
        """The state of a block (rank `rank` of group `key`, or the single key `key` with rank
        -1) after one more holder takes it: back to life from its release's run, whose range
        ends before it if it was the range's last block, else has a hole (stale)."""
        if state > 0:
            return state + 1
        run = self.runs[-state]
        end = run[2] - 1
        if end >= run[1]:
            entries = run[0]
            ek, elo, ehi = entries[end]
            if elo == rank and ek == key:
                if elo < 0 or ehi - elo == 1:
                    run[2] = end
                else:
                    entries[end] = (ek, elo + 1, ehi)
                self.n_inactive -= 1
                return 1
        run[3] = True
        self.n_inactive -= 1
        return 1

    def _lru_order(self) -> list[Key]:
        order: list[Key] = []
        for run_id in range(self._front_run, self._next_run):
            run = self.runs.get(run_id)
            if run is None:
                continue
            tag = -run_id
            for key, lo, hi in run[0][run[1] : run[2]]:
                if lo == SINGLES:
                    order.extend([k for k in key if self.groups.get(k) == tag])
                    continue
                if lo < 0:
                    if self.groups.get(key) == tag:
                        order.append(key)
                    continue
                order.extend(
                    [key + r for r in range(hi - 1, lo - 1, -1) if self._get(key + r) == tag]
                )
        return order

    def _compact(self) -> None:
        """One run of every inactive block, in LRU order, in place of runs of stale entries."""
        order = self._lru_order()
        run_id = self._next_run
        self._next_run = run_id + 1
        entries: list[Span] = []
        for key in order:
            self._set(key, -run_id)
            if key.__class__ is int and key >= 0:
                r = key & self.mask
                gid = key - r
                if entries and entries[-1][0] == gid and entries[-1][1] == r + 1:
                    entries[-1] = (gid, r, entries[-1][2])
                    continue
                entries.append((gid, r, r + 1))
            else:
                entries.append((key, -1, 0))
        self.runs = {run_id: [entries, 0, len(entries), False]}
        self._front_run = run_id
        self._run_entries = len(entries)


def run_start(keys: list[int], j: int) -> int:
    """Where the run of negative keys that includes `keys[j]` starts (int keys)."""
    step = 32  # (chunks of keys tested at once, doubled while they are all negative)
    grow = True
    while j and step:
        lo = j - step if j > step else 0
        if max(keys[lo:j]) < 0:
            j = lo
            if grow:
                step *= 2
        else:
            grow = False
            step //= 2
    return j
