"""Synthetic workloads: sessions of turns with seeded lengths and shared prefixes.

Each session draws its prompt and output lengths from the configured distributions (stream
`lengths`). Prompt content is expressed as trace hash ids at `trace_block_size`, exactly like a
Mooncake row, so it goes through the same engine-block hashing:

* first turn: `round(blocks x shared_prefix_ratio)` leading blocks come from the session's
  prefix group (drawn from stream `prefix_groups` when `num_prefix_groups > 0`), the rest are new;
* turn k+1: the previous prompt, the previous answer and a new user message. The previous
  prompt's full blocks keep their ids (so a worker that still holds them gets a prefix hit);
  everything after them is new content.

Later turns follow their predecessor's completion after `inter_turn_delay_ms`. Arrival times of
first turns are left at 0 here; the load (rate or concurrency) decides them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from servesim.config.schema import LengthDistribution, SyntheticWorkload
from servesim.workload.mooncake import TraceRow


def sample_length(dist: LengthDistribution, rng: np.random.Generator) -> int:
    """One token length from `dist`, rounded and clipped to [min, max]."""
    if dist.dist == "constant":
        x = dist.mean
    elif dist.dist == "uniform":
        hi = dist.max if dist.max is not None else 2 * dist.mean - dist.min
        x = rng.uniform(dist.min, hi)
    elif dist.dist == "normal":
        x = rng.normal(dist.mean, dist.std)
    elif dist.dist == "lognormal":
        # parameters chosen so the lengths themselves have the configured mean and std
        var = np.log1p((dist.std / dist.mean) ** 2)
        x = rng.lognormal(np.log(dist.mean) - var / 2, np.sqrt(var))
    else:  # exponential
        x = rng.exponential(dist.mean)
    n = max(int(round(x)), dist.min)
    if dist.max is not None:
        n = min(n, dist.max)
    return n


def generate(
    cfg: SyntheticWorkload, rng_lengths: np.random.Generator, rng_groups: np.random.Generator
) -> Iterator[TraceRow]:
    """Rows of every session, turn by turn, session after session."""
    tbs = cfg.trace_block_size
    next_id = 0
    group_prefix: dict[int, list[int]] = {}

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    def group_ids(g: int, n: int) -> list[int]:
        ids = group_prefix.setdefault(g, [])
        if len(ids) < n:
            ids.extend(fresh(n - len(ids)))
        return ids[:n]

    line = 0
    for s in range(cfg.num_sessions):
        sid = f"s{s}"
        group = (
            int(rng_groups.integers(cfg.num_prefix_groups)) if cfg.num_prefix_groups > 0 else None
        )
        prev_ids: list[int] = []
        prev_len = 0
        context_len = 0
        for t in range(cfg.turns_per_session):
            new_in = max(1, sample_length(cfg.input_tokens, rng_lengths))
            out = sample_length(cfg.output_tokens, rng_lengths)
            length = context_len + new_in
            n_blocks = -(-length // tbs)
            if t == 0:
                shared = round(n_blocks * cfg.shared_prefix_ratio) if group is not None else 0
                ids = (group_ids(group, shared) if group is not None else []) + fresh(
                    n_blocks - shared
                )
            else:
                keep = prev_len // tbs
                ids = prev_ids[:keep] + fresh(n_blocks - keep)
            line += 1
            yield TraceRow(
                line=line,
                timestamp_ms=0.0 if t == 0 else None,
                input_length=length,
                output_length=out,
                hash_ids=ids,
                session_id=sid if cfg.turns_per_session > 1 else None,
                delay_ms=cfg.inter_turn_delay_ms if t > 0 else None,
                request_id=f"{sid}t{t}",
                # sessions of one prefix group are one family (sibling_group affinity)
                group_id=f"g{group}" if group is not None else None,
            )
            prev_ids, prev_len = ids, length
            context_len = length + out
