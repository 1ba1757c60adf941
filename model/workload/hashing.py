"""Prompt content as engine-block hashes, synthesised from trace hash ids.

A trace describes a prompt as one hash id per *trace block* (Mooncake: 512 tokens). The engine
caches *engine blocks* (vLLM: 64 tokens). As in Dynamo's replay, the prompt's tokens are the
canonical id of trace block k repeated `trace_block_size` times (truncated to the prompt length);
engine blocks are then hashed positionally and parent-chained, so two prompts share engine block j
exactly when their synthesised tokens agree on everything up to the end of block j. Only full
engine blocks get a hash. Chained hashes are interned to small consecutive ints: equal prefixes
get equal ids, and a block id stands for its whole prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT = -1


class BlockHasher:
    """Interns trace hash ids and chained engine-block hashes for one run."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._canonical: dict[int, int] = {}  # trace hash id -> id by first appearance
        self._chain: dict[tuple[int, object], int] = {}  # (parent, block content) -> block id
        self._next_unique = -2  # unshared content gets negative ids; ROOT is -1

    def canonical(self, trace_ids: Sequence[int]) -> list[int]:
        """Trace hash ids renumbered by order of first appearance across the run."""
        table = self._canonical
        out = []
        for h in trace_ids:
            c = table.get(h)
            if c is None:
                c = table[h] = len(table)
            out.append(c)
        return out

    def prompt_hashes(
        self, trace_ids: Sequence[int], input_length: int, trace_block_size: int
    ) -> list[int]:
        """Chained ids of the prompt's full engine blocks."""
        ids = self.canonical(trace_ids)
        bs = self.block_size
        n_full = input_length // bs
        chain = self._chain
        out: list[int] = []
        parent = ROOT
        aligned = trace_block_size % bs == 0
        for j in range(n_full):
            start = j * bs
            if aligned:
                # the whole engine block lies inside one trace block: its content is that id
                content: object = ids[start // trace_block_size]
            else:
                content = _runs(ids, start, start + bs, trace_block_size)
            key = (parent, content)
            h = chain.get(key)
            if h is None:
                h = chain[key] = len(chain)
            out.append(h)
            parent = h
        return out

    def unique_blocks(self, n: int) -> list[int]:
        """Fresh ids for content nothing else shares (generated tokens, prompts without ids)."""
        first = self._next_unique
        self._next_unique -= n
        return list(range(first, first - n, -1))


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
