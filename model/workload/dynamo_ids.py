"""Dynamo's block sequence hashes, used only to order blocks that land in G2 together as the
mocker does.

servesim's own block ids (model/workload/hashing.py) decide which prompts share blocks; their
values mean nothing else. Dynamo's mocker keys its host tier (G2) by its own ids, the
sequence hashes, and its G2 LRU breaks ties between blocks of equal recency (the blocks of one
landed store, of one finished load) by them, smallest evicted first. To evict the same block
servesim needs those values, computed as the mocker does from the same synthesised tokens:
the prompt's tokens are the canonical id of trace block k (ids renumbered by first appearance,
`BlockHasher.canonical`) repeated `trace_block_size` times; a full engine block's content hash
is XXH3-64 (seed 1337) of its tokens as little-endian u32; the first block's sequence hash is
its content hash, each later one XXH3-64 (seed 1337) of the little-endian u64 pair (parent
sequence hash, content hash).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

DYNAMO_SEED = 1337  # the mocker's XXH3 seed for content and sequence hashes


def dynamo_sequence_hashes(
    canonical_ids: Sequence[int], n_blocks: int, trace_block_size: int, block_size: int
) -> list[int]:
    """Dynamo's sequence hashes of the first `n_blocks` full engine blocks of a prompt whose
    trace blocks have the canonical ids `canonical_ids`."""
    xxh = xxhash.xxh3_64_intdigest
    content: dict[tuple[tuple[int, int], ...], int] = {}  # a block's token runs -> its hash
    out: list[int] = []
    parent: int | None = None
    for j in range(n_blocks):
        # the block's tokens as runs (canonical id, count): at most a few trace blocks
        runs: list[tuple[int, int]] = []
        t, end = j * block_size, (j + 1) * block_size
        while t < end:
            k = t // trace_block_size
            stop = min(end, (k + 1) * trace_block_size)
            runs.append((canonical_ids[k], stop - t))
            t = stop
        key = tuple(runs)
        h = content.get(key)
        if h is None:
            data = b"".join(struct.pack("<I", tok) * count for tok, count in key)
            h = content[key] = xxh(data, seed=DYNAMO_SEED)
        parent = h if parent is None else xxh(struct.pack("<QQ", parent, h), seed=DYNAMO_SEED)
        out.append(parent)
    return out
