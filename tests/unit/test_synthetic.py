"""The synthetic generator: seeded lengths, shared prefixes by group, multi-turn sessions whose
prompts extend the previous turn (spec §1.7, loader cases 12-13)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.config.schema import LengthDistribution, SyntheticWorkload, TraceLoad
from servesim.sim import random_streams
from servesim.workload.build import build_workload
from servesim.workload.hashing import BlockHasher
from servesim.workload.synthetic import generate, sample_length


def synthetic(**kw) -> SyntheticWorkload:
    base = {
        "num_sessions": 4,
        "input_tokens": {"dist": "uniform", "mean": 200, "min": 50, "max": 350},
        "output_tokens": {"dist": "uniform", "mean": 20, "min": 1, "max": 40},
        "trace_block_size": 64,
    }
    return SyntheticWorkload.model_validate({**base, **kw})


def rows(cfg: SyntheticWorkload, seed: int = 0):
    s = random_streams(seed)
    return list(generate(cfg, s["lengths"], s["prefix_groups"]))


def test_deterministic_for_a_seed():
    """The same config and seed give identical rows; another seed gives other lengths."""
    cfg = synthetic(num_sessions=8, turns_per_session=2)
    assert rows(cfg, seed=1) == rows(cfg, seed=1)
    lengths = [(r.input_length, r.output_length) for r in rows(cfg, seed=1)]
    assert [(r.input_length, r.output_length) for r in rows(cfg, seed=2)] != lengths


def test_sessions_times_turns_rows():
    """num_sessions x turns_per_session rows, session by session, turn by turn, lines 1..N;
    only first turns carry a timestamp (0, restamped later) and later turns the configured
    delay."""
    cfg = synthetic(num_sessions=3, turns_per_session=2, inter_turn_delay_ms=7.5)
    out = rows(cfg)
    assert [(r.line, r.request_id, r.session_id) for r in out] == [
        (1, "s0t0", "s0"),
        (2, "s0t1", "s0"),
        (3, "s1t0", "s1"),
        (4, "s1t1", "s1"),
        (5, "s2t0", "s2"),
        (6, "s2t1", "s2"),
    ]
    assert [(r.timestamp_ms, r.delay_ms) for r in out[:2]] == [(0.0, None), (None, 7.5)]


def test_single_turn_rows_have_no_session():
    """With one turn per session, rows are independent requests (no session id, no delay)."""
    out = rows(synthetic(num_sessions=2))
    assert [(r.session_id, r.delay_ms, r.timestamp_ms) for r in out] == [(None, None, 0.0)] * 2


def test_prompt_ids_cover_prompt():
    """Every row has exactly ceil(input_length / trace_block_size) hash ids."""
    for r in rows(synthetic(num_sessions=10, turns_per_session=3)):
        assert len(r.hash_ids) == -(-r.input_length // 64)


def test_prefix_groups_share_prefixes_within_group():
    """2 prefix groups: the sessions' shared leading blocks take exactly 2 distinct values, and
    every id outside those prefixes is unique to its session (case 12). Constant 256-token
    prompts at 64 tokens/block with ratio 0.5 share 2 of 4 blocks."""
    cfg = synthetic(
        num_sessions=8,
        input_tokens={"dist": "constant", "mean": 256},
        num_prefix_groups=2,
        shared_prefix_ratio=0.5,
    )
    out = rows(cfg)
    prefixes = [tuple(r.hash_ids[:2]) for r in out]
    suffixes = [i for r in out for i in r.hash_ids[2:]]
    assert len(set(prefixes)) == 2
    assert len(set(suffixes)) == len(suffixes) == 16
    assert not set(suffixes) & {i for p in prefixes for i in p}


def test_prefix_groups_share_engine_blocks():
    """Through the hasher, two sessions of one group share exactly the engine blocks of the
    shared trace blocks (2 x 64 tokens = 4 engine blocks of 32)."""
    cfg = synthetic(
        num_sessions=8,
        input_tokens={"dist": "constant", "mean": 256},
        num_prefix_groups=2,
        shared_prefix_ratio=0.5,
    )
    h = BlockHasher(32)
    out = rows(cfg)
    hashes = [h.prompt_hashes(r.hash_ids, r.input_length, 64) for r in out]
    for a, ra in zip(hashes, out, strict=True):
        for b, rb in zip(hashes, out, strict=True):
            if ra is rb:
                continue
            same_group = ra.hash_ids[:2] == rb.hash_ids[:2]
            n_shared = next(j for j in range(len(a)) if a[j] != b[j])
            assert n_shared == (4 if same_group else 0)


def test_no_groups_means_no_sharing():
    """Without prefix groups, shared_prefix_ratio has no effect: all ids are distinct."""
    cfg = synthetic(num_sessions=5, shared_prefix_ratio=0.9)
    ids = [i for r in rows(cfg) for i in r.hash_ids]
    assert len(set(ids)) == len(ids)


def test_later_turn_extends_previous_turn():
    """Turn k+1's prompt = turn k's prompt + its answer + a new message; the full trace blocks of
    turn k's prompt keep their ids, everything after them is new. Constant input 100, output 30,
    block 64: lengths 100, 230, 360; kept blocks 1 then 3."""
    cfg = synthetic(
        num_sessions=2,
        turns_per_session=3,
        input_tokens={"dist": "constant", "mean": 100},
        output_tokens={"dist": "constant", "mean": 30},
    )
    out = rows(cfg)
    t0, t1, t2 = out[:3]
    assert [r.input_length for r in (t0, t1, t2)] == [100, 230, 360]
    assert [len(r.hash_ids) for r in (t0, t1, t2)] == [2, 4, 6]
    assert t1.hash_ids[:1] == t0.hash_ids[:1] and t1.hash_ids[1] != t0.hash_ids[1]
    assert t2.hash_ids[:3] == t1.hash_ids[:3] and t2.hash_ids[3] != t1.hash_ids[3]
    fresh = t1.hash_ids[1:] + t2.hash_ids[3:]
    assert len(set(fresh)) == len(fresh)
    # no id crosses sessions
    assert not {i for r in out[:3] for i in r.hash_ids} & {i for r in out[3:] for i in r.hash_ids}


def test_later_turn_length_with_random_lengths():
    """For any drawn lengths, turn k+1's input = turn k's input + turn k's output + new input
    (new input within its distribution's bounds)."""
    out = rows(synthetic(num_sessions=5, turns_per_session=4), seed=3)
    for prev, cur in zip(out, out[1:], strict=False):
        if cur.session_id != prev.session_id:
            continue
        new_input = cur.input_length - prev.input_length - prev.output_length
        assert 50 <= new_input <= 350
        keep = prev.input_length // 64
        assert cur.hash_ids[:keep] == prev.hash_ids[:keep]


KINDS = ["constant", "uniform", "normal", "lognormal", "exponential"]


@pytest.mark.parametrize("kind", KINDS)
def test_lengths_within_bounds(kind):
    """Every kind returns integers clipped to [min, max]."""
    dist = LengthDistribution(dist=kind, mean=100, std=80, min=40, max=150)
    rng = np.random.default_rng(0)
    got = [sample_length(dist, rng) for _ in range(2000)]
    assert all(isinstance(n, int) and 40 <= n <= 150 for n in got)
    if kind == "constant":
        assert set(got) == {100}
    else:  # wide enough that both clips are hit
        assert min(got) == 40 and max(got) == 150


@pytest.mark.parametrize("kind", ["uniform", "normal", "lognormal", "exponential"])
def test_unclipped_mean(kind):
    """Unclipped, the lengths have the configured mean (lognormal parameters are chosen for the
    lengths themselves; uniform without max spans [min, 2 x mean - min])."""
    dist = LengthDistribution(dist=kind, mean=300, std=60, min=0)
    rng = np.random.default_rng(1)
    got = np.array([sample_length(dist, rng) for _ in range(20000)])
    assert got.mean() == pytest.approx(300, rel=0.02)
    if kind == "uniform":
        assert got.max() <= 600


def test_constant_length_rounds_and_clips():
    """constant uses the mean, rounded, then clipped to max (and raised to min)."""
    rng = np.random.default_rng(0)
    assert sample_length(LengthDistribution(mean=100.4), rng) == 100
    assert sample_length(LengthDistribution(mean=100, max=64), rng) == 64
    assert sample_length(LengthDistribution(mean=3, min=8), rng) == 8


def test_arrival_process_changes_timestamps_only():
    """Switching the arrival process or rate changes first-turn arrival times and nothing else:
    lengths, prompt blocks and sessions stay the same (case 13)."""

    def build(**kw):
        cfg = synthetic(
            num_sessions=6, turns_per_session=2, num_prefix_groups=2, shared_prefix_ratio=0.5, **kw
        )
        wl = build_workload(cfg, TraceLoad(), BlockHasher(16), random_streams(5))
        content = [
            (
                r.request_id,
                r.session_id,
                r.input_length,
                r.output_length,
                r.prompt_hashes,
                r.delay_ms,
            )
            for s in wl.sessions
            for r in s
        ]
        return content, [s[0].planned_arrival_ms for s in wl.sessions]

    poisson, t_poisson = build(arrival_process="poisson", rate_rps=10)
    constant, t_constant = build(arrival_process="constant", rate_rps=10)
    faster, t_faster = build(arrival_process="constant", rate_rps=40)
    assert poisson == constant == faster
    assert t_constant == pytest.approx([0, 100, 200, 300, 400, 500])
    assert t_faster == pytest.approx([0, 25, 50, 75, 100, 125])
    assert t_poisson != t_constant and t_poisson[0] == 0.0
