"""Prompt content as engine-block hashes, synthesised from trace hash ids.

A trace describes a prompt as one hash id per *trace block* (Mooncake: 512 tokens). The engine
caches *engine blocks* (vLLM: 64 tokens). As in Dynamo's replay, the prompt's tokens are the
canonical id of trace block k repeated `trace_block_size` times (truncated to the prompt length);
engine blocks are then hashed positionally and parent-chained, so two prompts share engine block j
exactly when their synthesised tokens agree on everything up to the end of block j. Only full
engine blocks get a hash. A block's id is a 63-bit hash of (parent id, block content), so a block
id stands for its whole prefix. When engine blocks tile trace blocks (trace block size a multiple
of the block size, as in every Mooncake replay), the chain runs over trace blocks instead and the
id of engine block r inside trace block k is (chain id of k, r) packed into 63 bits: the same
sharing, one hash per trace block rather than per engine block. Ids are compared within one run
(one block size, one trace block size). Content nothing else shares (generated tokens, prompts
without hash ids) gets negative ids, a separate space. Two different prefixes share an id only by a
64-bit hash collision (about 1e-7 for a million distinct blocks), and nothing is stored per
block, so memory does not grow with the number of distinct prefixes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import cast

import numpy as np

ROOT = 0x5EED  # the parent of a prompt's first block
MASK63 = (1 << 63) - 1
UNSHARED = 0xD15C0  # salt of unshared-content ids
# prompts of at least this many full engine blocks get their ids in bulk (numpy): fewer, and
# numpy's per-call cost is more than a loop's
NUMPY_MIN_BLOCKS = 48


class BlockHasher:
    """Canonical trace ids and chained engine-block ids for one run."""

    def __init__(self, block_size: int, keep_canonical_ids: bool = False) -> None:
        self.block_size = block_size
        # whether requests keep their prompts' canonical ids: only a host tier needs them (for
        # Dynamo's sequence hashes, model/workload/dynamo_ids.py)
        self.keep_canonical_ids = keep_canonical_ids
        # trace hash id -> id by first appearance: ids below `_identity` map to themselves,
        # the others through the table
        self._identity = 0
        self._canonical: dict[Hashable, int] = {}

    def canonical(self, trace_ids: Sequence[Hashable]) -> list[int]:
        """Trace hash ids renumbered by order of first appearance across the run (an agentic
        play instance salts its ids, `(salt, id)`, to keep a cache space of its own).

        Traces usually number their ids that way already (Mooncake's do): while every new id
        is the count of ids seen so far, ids map to themselves and nothing is stored; ids
        after the first that breaks the pattern go through a table."""
        table = self._canonical
        ident = self._identity
        if not table and trace_ids and set(map(type, trace_ids)) == {int}:
            # the common case, checked in C: ids seen before, then the next new ones in order
            n_new = _new_in_order(cast(Sequence[int], trace_ids), ident)
            if n_new is not None:
                self._identity = ident + n_new
                return list(cast(Sequence[int], trace_ids))
        out = []
        for h in trace_ids:
            if isinstance(h, int) and 0 <= h < ident:
                out.append(h)  # seen while the trace's numbering was its first appearances
                continue
            if not table and h == ident and isinstance(h, int):
                ident += 1
                out.append(h)
                continue
            c = table.get(h)
            if c is None:
                c = table[h] = ident + len(table)
            out.append(c)
        self._identity = ident
        return out

    def prompt_hashes(
        self, trace_ids: Sequence[Hashable], input_length: int, trace_block_size: int
    ) -> list[int]:
        """Chained ids of the prompt's full engine blocks."""
        ids = self.canonical(trace_ids)
        bs = self.block_size
        n_full = input_length // bs
        out: list[int] = []
        parent = ROOT
        if trace_block_size % bs == 0:
            # every engine block lies inside one trace block, whose content is its id: the
            # trace blocks are chained, and engine block r of trace block k is the chain id of
            # k shifted left with r in the low bits (consecutive ids)
            per = trace_block_size // bs
            shift = (per - 1).bit_length()
            chain_mask = MASK63 >> shift
            firsts = []  # the id of engine block 0 of each trace block the prompt reaches
            for k in range(-(-n_full // per)):
                parent = hash((parent, ids[k])) & chain_mask
                firsts.append(parent << shift)
            if n_full < NUMPY_MIN_BLOCKS:
                for k, first in enumerate(firsts):
                    out.extend(range(first, first + min(per, n_full - k * per)))
                return out
            # a long prompt: its engine-block ids made in bulk
            ranks = np.arange(per, dtype=np.int64)
            return (np.array(firsts, dtype=np.int64)[:, None] | ranks).ravel()[:n_full].tolist()
        for j in range(n_full):
            start = j * bs
            parent = hash((parent, _runs(ids, start, start + bs, trace_block_size))) & MASK63
            out.append(parent)
        return out

    @staticmethod
    def unique_block(owner: int, j: int) -> int:
        """The id of block `j` of request `owner` when its content is shared with nothing
        (generated tokens, prompts without hash ids): negative, so never a chained prompt id,
        and the same whenever it is asked for."""
        return -1 - (hash((UNSHARED, owner, j)) & MASK63)

    @staticmethod
    def unique_blocks(owner: int, start: int, stop: int) -> list[int]:
        """`unique_block(owner, j)` for j in [start, stop)."""
        return [-1 - (hash((UNSHARED, owner, j)) & MASK63) for j in range(start, stop)]


def _new_in_order(ids: Sequence[int], ident: int) -> int | None:
    """How many of `ids` are new, when they are non-negative ids below `ident` followed by
    `ident`, `ident + 1`, ... in order (None otherwise)."""
    top = max(ids)
    n_new = top - ident + 1 if top >= ident else 0
    n_old = len(ids) - n_new
    if n_old < 0 or list(ids[n_old:]) != list(range(ident, top + 1)):
        return None
    if n_old and (min(ids) < 0 or max(ids[:n_old]) >= ident):
        return None
    return n_new


def _runs(ids: Sequence[int], start: int, end: int, tbs: int) -> tuple[tuple[int, int], ...]:
    """Content of tokens [start, end) as (canonical id, run length) pairs."""
    runs = []
    t = start
    while t < end:
        k = t // tbs
        stop = min(end, (k + 1) * tbs)
        runs.append((ids[k], stop - t))
        t = stop
    return tuple(runs)
