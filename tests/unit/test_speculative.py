"""Speculative decoding (engine.speculative): the burst sampler, bursts in closed-form runs,
the seeds, the config's refusals, the metadata, and what the hardware timing models charge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim import simulate
from servesim.config.errors import ConfigError
from servesim.engine.speculative import (
    BurstSampler,
    acceptance_rates,
    mean_burst_tokens,
    speculative_settings,
)
from servesim.timing import build_step_time

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def row(t: int, n_in: int, n_out: int, ids: list[int]) -> dict[str, int | list[int]]:
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def spec(k: int | None, rates: list[float] | None = None, seed: int = 42) -> dict[str, object]:
    return {"speculative": {"num_speculative_tokens": k, "acceptance_rates": rates, "seed": seed}}


def run(config, trace, rows, engine=None, timing=None, workers=1, tbs=512, **extra):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": tbs},
        engine={"num_gpu_blocks": 16384, **(engine or {})},
        timing=timing or FIXED,
        topology={"num_workers": workers},
        output={"progress": "off", "per_token": True},
        **extra,
    )
    return simulate(cfg)


# --------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([1.0, 1.0], [3] * 5),
        ([0.0, 1.0], [1] * 5),
        ([1.0, 0.0, 1.0], [2] * 5),  # acceptance stops at the first rejection
        ([1.0, 1.0, 1.0, 1.0, 1.0], [6] * 5),
    ],
)
def test_deterministic_rates_give_fixed_bursts(rates, expected):
    sampler = BurstSampler(rates, seed=1)
    assert [sampler.draw(100) for _ in expected] == expected


def test_a_burst_never_exceeds_what_is_left():
    sampler = BurstSampler([1.0, 1.0], seed=1)
    assert [sampler.draw(n) for n in (0, 1, 2, 3, 4)] == [0, 1, 2, 3, 3]


@pytest.mark.parametrize("rates", [[0.85, 0.3], [0.7, 0.5, 0.2], [0.9, 0.9, 0.9, 0.9, 0.9]])
def test_mean_burst_is_one_plus_the_products_of_the_rates(rates):
    """Over many draws the mean is 1 + r1 + r1 r2 + ..., within 5 standard errors."""
    closed = 1.0
    p = 1.0
    for r in rates:
        p *= r
        closed += p
    assert mean_burst_tokens(rates) == pytest.approx(closed)
    sampler = BurstSampler(rates, seed=7)
    draws = np.array([sampler.draw(10) for _ in range(200_000)])
    stderr = draws.std() / math.sqrt(len(draws))
    assert abs(draws.mean() - closed) < 5 * stderr


def test_equal_seeds_repeat_and_other_seeds_differ():
    rates = [0.8, 0.6, 0.4]
    a, b, c = BurstSampler(rates, 42), BurstSampler(rates, 42), BurstSampler(rates, 43)
    first = [a.draw(10) for _ in range(200)]
    assert first == [b.draw(10) for _ in range(200)]
    assert first != [c.draw(10) for _ in range(200)]


def test_rates_are_padded_with_zero_or_cut_to_k(config, trace):
    path = trace([row(0, 10, 1, [1])])

    def used(**s):
        return acceptance_rates(config(workload={"kind": "mooncake", "path": path}, **s).engine)

    assert used(engine=spec(3, [0.5])) == [0.5, 0.0, 0.0]
    assert used(engine=spec(1, [0.5, 0.9])) == [0.5]
    assert used(engine=spec(2)) == [0.85, 0.3], "the mocker's default rates, cut to k"
    assert used(engine=spec(None)) == []


def test_rates_without_k_are_refused_by_config_path(config, trace):
    with pytest.raises((ConfigError, ValueError), match=r"engine\.speculative\.acceptance_rates"):
        config(
            workload={"kind": "mooncake", "path": trace([row(0, 10, 1, [1])])},
            engine=spec(None, [0.5]),
        )


# --------------------------------------------------------------------------- closed-form runs


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("out", [1, 2, 3, 4, 7, 10])
def test_a_lone_request_decodes_in_bursts_of_k_plus_one(config, trace, k, out):
    """Fixed 10 / 2 ms, rates 1: the prefill pass also runs the first decode step (first token
    at 12, with k + 1 tokens); an output of n takes ceil(n / (k + 1)) decode steps, each
    burst's tokens stamped at its step's end."""
    r = run(config, trace, [row(0, 100, out, [1])], engine=spec(k, [1.0] * k))
    req = r.requests.iloc[0]
    steps = math.ceil(out / (k + 1))
    assert req.first_token_ms == 12.0
    assert req.last_token_ms == req.terminal_ms == 10.0 + 2.0 * steps
    assert req.output_length == out
    times = r.token_times[req.request_id].tolist()
    expected = [12.0 + 2.0 * (i // (k + 1)) for i in range(out)]
    assert times == expected
    assert len(r.passes) == steps


def test_output_seven_takes_three_steps(config, trace):
    """The brief's example: k = 2, rates [1, 1], an output of 7 takes ceil(7 / 3) = 3 decode
    steps: 3 + 3 + 1 tokens at 12, 14, 16."""
    r = run(config, trace, [row(0, 100, 7, [1])], engine=spec(2, [1.0, 1.0]))
    req = r.requests.iloc[0]
    assert r.token_times[req.request_id].tolist() == [12.0] * 3 + [14.0] * 3 + [16.0]
    assert req.tpot_ms == pytest.approx((16.0 - 12.0) / 6)
    assert r.summary["min_itl_ms"] == 0.0, "tokens of one burst are 0 ms apart"


def test_zero_output_ends_at_its_prefill(config, trace):
    """No token to emit: no decode step, as without speculation."""
    r = run(config, trace, [row(0, 100, 0, [1])], engine=spec(2, [1.0, 1.0]))
    assert r.requests.iloc[0].terminal_ms == 10.0


def test_without_speculation_the_first_token_comes_from_the_prefill(config, trace):
    r = run(config, trace, [row(0, 100, 7, [1])])
    req = r.requests.iloc[0]
    assert (req.first_token_ms, req.last_token_ms) == (10.0, 22.0)


def test_a_prefix_hit_is_one_block_shorter(config, trace):
    """vLLM's drafter recomputes the last block of a prefix hit: a repeat of a 1000-token
    prompt (15 full blocks of 64) reuses 14 blocks instead of 15; with no output to emit it
    reuses the whole hit."""
    rows = [row(0, 1000, 4, list(range(16))), row(100, 1000, 4, list(range(16)))]
    rows += [row(200, 1024, 0, list(range(16)))]
    on = run(config, trace, rows, engine=spec(2, [1.0, 1.0]), tbs=64).requests
    off = run(config, trace, rows, tbs=64).requests
    assert off.reused_input_tokens.tolist() == [0, 960, 960]
    assert on.reused_input_tokens.tolist() == [0, 896, 960]


def test_the_burst_reservation_preempts_the_newest(config, trace):
    """3 blocks of 16: A (30 tokens) and B (14) fill them in one pass; their bursts need one
    more block each, so B (the newest) is preempted as the pass is formed, and recomputed
    once A has ended: B's first token at 14 + 10 + 2."""
    rows = [row(0, 30, 6, [1, 2]), row(0, 14, 6, [3])]
    r = run(
        config, trace, rows, engine={"num_gpu_blocks": 3, "block_size": 16, **spec(2, [1.0, 1.0])}
    )
    req = r.requests.set_index("input_length")
    assert req.loc[30, "terminal_ms"] == 14.0
    assert (req.loc[14, "first_token_ms"], req.loc[14, "terminal_ms"]) == (26.0, 28.0)
    assert req.loc[14, "n_preemptions"] == 1


def test_rates_between_zero_and_one_give_the_expected_tokens_per_step(config, trace):
    """One long request: its decode steps emit 1 + r1 + r1 r2 tokens on average."""
    rates = [0.85, 0.3]
    out = 6000
    r = run(config, trace, [row(0, 100, out, [1])], engine=spec(2, rates, seed=3))
    steps = len(r.passes)
    mean = mean_burst_tokens(rates)
    # the steps' count is a renewal count: about out / mean, give or take a few percent
    assert out / steps == pytest.approx(mean, rel=0.03)


def test_the_seed_changes_the_run_and_repeats_it(config, trace):
    rows = [row(10 * i, 200, 50, [i]) for i in range(20)]

    def ends(seed):
        r = run(config, trace, rows, engine=spec(3, [0.6, 0.5, 0.4], seed=seed))
        return r.requests.terminal_ms.tolist()

    assert ends(5) == ends(5)
    assert ends(5) != ends(6)


def test_ranks_draw_from_streams_seeded_by_their_scheduler_id(config, trace):
    """Two workers with the same requests at the same times: worker 1's rank draws from
    seed + 1, so their bursts (and ends) differ; with rates 1 they are the same."""
    rows = [row(0, 200, 60, [1]), row(0, 200, 60, [2])]
    rand = run(config, trace, rows, engine=spec(2, [0.5, 0.5]), workers=2).requests
    assert rand.terminal_ms.iloc[0] != rand.terminal_ms.iloc[1]
    same = run(config, trace, rows, engine=spec(2, [1.0, 1.0]), workers=2).requests
    assert same.terminal_ms.iloc[0] == same.terminal_ms.iloc[1]


def test_metadata_names_the_settings_as_used(config, trace):
    r = run(config, trace, [row(0, 100, 3, [1])], engine=spec(3, [0.5], seed=9))
    assert r.summary["metadata"]["speculative"] == {
        "num_speculative_tokens": 3,
        "acceptance_rates": [0.5, 0.0, 0.0],
        "seed": 9,
        "mean_tokens_per_decode_step": 1.5,
    }
    off = run(config, trace, [row(0, 100, 3, [1])])
    assert off.summary["metadata"]["speculative"] is None


def test_settings_are_none_when_off(config, trace):
    cfg = config(workload={"kind": "mooncake", "path": trace([row(0, 10, 1, [1])])})
    assert speculative_settings(cfg.engine) is None


# --------------------------------------------------------------------------- timing models


def _decode_ms(config, trace, timing, k, batch, ctx):
    cfg = config(
        workload={"kind": "mooncake", "path": trace([row(0, 10, 1, [1])])},
        engine=spec(k),
        timing=timing,
    )
    return build_step_time(cfg).decode_ms(batch, batch * ctx, 16384 * 64, ctx)


@pytest.mark.parametrize("timing", [{"kind": "roofline"}, {"kind": "calibrated_roofline"}])
def test_hardware_models_price_the_verified_tokens(config, trace, timing):
    """Verifying k drafts computes k + 1 tokens per sequence: at batch 1 (weights read once,
    memory bound) it costs about a plain step; at a batch where the GEMMs are compute bound it
    costs more, and never less than a plain step."""
    plain_small = _decode_ms(config, trace, timing, None, 1, 1000)
    verify_small = _decode_ms(config, trace, timing, 3, 1, 1000)
    assert plain_small <= verify_small < 1.1 * plain_small
    plain_big = _decode_ms(config, trace, timing, None, 256, 100)
    verify_big = _decode_ms(config, trace, timing, 3, 256, 100)
    assert verify_big > 1.5 * plain_big


@pytest.mark.parametrize("timing", [{"kind": "polynomial"}, FIXED])
def test_mocker_models_charge_a_plain_decode_step(config, trace, timing):
    assert _decode_ms(config, trace, timing, 3, 64, 1000) == _decode_ms(
        config, trace, timing, None, 64, 1000
    )
