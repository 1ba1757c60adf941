"""Speculative decoding (MTP / EAGLE drafts) as burst sampling: how many tokens one decode step
of one request emits.

Each decode step a request verifies k draft tokens. Draft i is accepted with probability r_i
given drafts 1..i-1 were (conditional acceptance rates); the step emits the target model's
token plus the leading accepted drafts, 1 + (number of leading accepts) tokens, capped by what
the request may still emit. The mean burst is 1 + r_1 + r_1 r_2 + ... + r_1 ... r_k. This is
the Dynamo mocker's model (`aic_nextn`, `aic_nextn_accept_rates`, `aic_mtp_seed`): its default
rates are 0.85, 0.3, 0, 0, 0, padded with 0 or cut to k.

Each scheduler rank draws from its own generator, seeded with `seed + scheduler id` (worker
index x dp_size + dp rank, within its pool), as the mocker offsets its seed per worker. The
draws are servesim's own (Python's Mersenne Twister, not the mocker's Rust generator): with
rates of 0 and 1 both give the same bursts; with rates strictly between, only their
distributions agree.
"""

from __future__ import annotations

import random
from typing import Any

from servesim.config.schema import EngineConfig

# the mocker's conditional acceptance rates when none are given (for up to 5 drafts)
DEFAULT_ACCEPTANCE_RATES = (0.85, 0.3, 0.0, 0.0, 0.0)


def acceptance_rates(engine: EngineConfig) -> list[float]:
    """The conditional acceptance rate of each of the k drafts, as used: the configured rates
    (or the mocker's default), padded with 0 or cut to k. Empty when speculation is off."""
    spec = engine.speculative
    k = spec.num_speculative_tokens
    if k is None:
        return []
    given = spec.acceptance_rates
    rates = list(DEFAULT_ACCEPTANCE_RATES if given is None else given)
    return (rates + [0.0] * k)[:k]


def mean_burst_tokens(rates: list[float]) -> float:
    """Expected tokens per decode step before any cap: 1 + r1 + r1 r2 + ... (closed form)."""
    mean, p = 1.0, 1.0
    for r in rates:
        p *= r
        mean += p
    return mean


class BurstSampler:
    """One scheduler rank's draws: the burst of each decode step of each of its requests."""

    def __init__(self, rates: list[float], seed: int) -> None:
        self.rates = rates
        self.max_tokens = len(rates) + 1  # the target model's token plus every draft
        self.rng = random.Random(seed)

    def draw(self, max_tokens: int) -> int:
        """Tokens one decode step emits: 1 + the drafts accepted before the first rejection,
        at most `max_tokens` (what the request may still emit; 0 emits nothing)."""
        if max_tokens <= 0:
            return 0
        tokens = 1
        for rate in self.rates:
            if self.rng.random() >= rate:  # draft rejected: the rest are discarded
                break
            tokens += 1
        return min(tokens, max_tokens)


def burst_sampler(engine: EngineConfig, scheduler_id: int) -> BurstSampler | None:
    """The sampler of the rank with this scheduler id (worker index x dp_size + dp rank), or
    None when `engine.speculative` is off."""
    if engine.speculative.num_speculative_tokens is None:
        return None
    return BurstSampler(acceptance_rates(engine), engine.speculative.seed + scheduler_id)


def speculative_settings(engine: EngineConfig) -> dict[str, Any] | None:
    """The speculation a run used, for its metadata: k, the rates after padding, the seed,
    and the expected tokens per decode step; None when it is off."""
    k = engine.speculative.num_speculative_tokens
    if k is None:
        return None
    rates = acceptance_rates(engine)
    return {
        "num_speculative_tokens": k,
        "acceptance_rates": rates,
        "seed": engine.speculative.seed,
        "mean_tokens_per_decode_step": mean_burst_tokens(rates),
    }
