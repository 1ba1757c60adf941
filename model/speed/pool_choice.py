"""Which G1 block pool a rank gets: SGLang's radix tree (RadixPool) for an engine that keeps
one; else the speed layer's pool by trace block (GroupPool) where engine blocks tile trace blocks
and caching is on, else the per-block BlockPool."""

from __future__ import annotations

from servesim.kv.block_pool import BlockPool
from servesim.kv.pool_base import Pool
from servesim.kv.radix_pool import RadixPool
from servesim.speed.group_pool import GroupPool


def choose_pool(
    capacity_blocks: int,
    enable_caching: bool,
    record_events: bool,
    group_blocks: int,
    radix: bool = False,
) -> Pool:
    """The pool for one rank: a radix tree when the engine keeps one (`radix`, SGLang); by
    group when ids are packed by `group_blocks` engine blocks (a power of two > 1, so a group's
    ids are all its id values) and caching is on; else per block."""
    if radix:
        return RadixPool(capacity_blocks, enable_caching, record_events)
    if group_blocks > 1 and group_blocks & (group_blocks - 1) == 0 and enable_caching:
        return GroupPool(capacity_blocks, group_blocks, record_events)
    return BlockPool(capacity_blocks, enable_caching, record_events)
