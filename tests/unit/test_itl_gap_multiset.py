"""The ITL gaps kept as a multiset (distinct values and counts, issue 8) give the summary the
same floats as the statistics of every gap in one sorted array.

The reference is the summary's formula before the multiset, written with numpy on the expanded
array: mean, min, max, nearest-rank percentiles and std of the sorted gaps, and the same of
1000 / gap over the gaps > 0 (ascending, as the reversed view of the rates of the sorted gaps).
Gaps come from a few shared pass end times, so they repeat, and include zeros. Negative gaps
never reach the recorder (a request's token times are pass end times, non-decreasing), so they
are not generated. Small fold thresholds and summation chunks make the tests cross many folds
and the chunked sums.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import servesim.metrics.recorder as recorder_module
from servesim import simulate
from servesim.metrics.gaps import Multiset
from servesim.metrics.summary import PERCENTILES, counted_distribution, summarize

ITL = "itl"
RATE = "output_token_throughput_per_user"
FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}


def numpy_stats(x: np.ndarray, name: str, unit: str) -> dict[str, Any]:
    """The distribution's keys for `x`, already in ascending order, computed by numpy on x."""
    if len(x) == 0:
        keys = ("mean", "min", "max", *PERCENTILES, "std")
        return {f"{s}_{name}{unit}": None for s in keys}
    n = len(x)
    out = {
        f"mean_{name}{unit}": float(x.mean()),
        f"min_{name}{unit}": float(x[0]),
        f"max_{name}{unit}": float(x[-1]),
    }
    for key, p in PERCENTILES.items():
        out[f"{key}_{name}{unit}"] = float(x[min(math.floor((n - 1) * p / 100 + 0.5), n - 1)])
    out[f"std_{name}{unit}"] = float(x.std())
    return out


def reference(gaps: np.ndarray) -> dict[str, Any]:
    """The ITL and per-user throughput statistics of every gap, as one sorted array."""
    x = np.sort(np.asarray(gaps, dtype=float))
    out = numpy_stats(x, ITL, "_ms")
    out["max_itl_ms"] = float(x[-1]) if len(x) else None
    positive = x[np.searchsorted(x, 0.0, "right") :]
    out.update(numpy_stats(np.divide(1000.0, positive)[::-1], RATE, ""))
    return out


def from_multiset(gaps: Multiset, chunk: int) -> dict[str, Any]:
    """The same statistics from the multiset (as `summarize` computes them)."""
    values, counts = gaps.distinct()
    out = counted_distribution(values, counts, ITL, chunk=chunk)
    out["max_itl_ms"] = float(values[-1]) if len(values) else None
    positive = int(np.searchsorted(values, 0.0, "right"))
    rates = np.divide(1000.0, values[positive:])[::-1]
    out.update(counted_distribution(rates, counts[positive:][::-1], RATE, "", chunk=chunk))
    return out


def shared_gaps(rng: np.random.Generator, n: int, n_ends: int, zeros: float) -> np.ndarray:
    """n gaps between pass end times drawn from `n_ends` shared ones, a share `zeros` of
    them 0 (two tokens stamped at one pass end)."""
    ends = np.cumsum(rng.exponential(7.0, size=n_ends + 1))
    lo = rng.integers(0, n_ends, size=n)
    hi = np.minimum(lo + rng.integers(1, 4, size=n), n_ends)
    gaps = ends[hi] - ends[lo]
    gaps[rng.random(n) < zeros] = 0.0
    return gaps


def fed(gaps: np.ndarray, fold_at: int, rng: np.random.Generator) -> Multiset:
    """A multiset given `gaps` a request at a time (1 to 40 gaps each)."""
    out = Multiset(fold_at=fold_at)
    at = 0
    while at < len(gaps):
        k = int(rng.integers(1, 41))
        out.extend(gaps[at : at + k])
        at += k
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 7, 127, 128, 129, 1000, 4097, 30_001])
@pytest.mark.parametrize("fold_at", [1, 16, 1000, 1 << 22])
@pytest.mark.parametrize("chunk", [128, 1000])
def test_statistics_of_the_multiset_are_those_of_the_sorted_gaps(n, fold_at, chunk):
    rng = np.random.default_rng(n * 7 + fold_at)
    gaps = shared_gaps(rng, n, n_ends=max(1, n // 20), zeros=0.05)
    multiset = fed(gaps, fold_at, rng)
    if fold_at <= 16 and n > 1000:
        assert multiset.n_folds > 10  # folded many times, not once at the end
    assert len(multiset) == n
    assert np.array_equal(multiset.sorted(), np.sort(gaps))
    assert from_multiset(multiset, chunk) == reference(gaps)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    lengths=st.lists(st.integers(0, 60), max_size=80),
    raw=st.integers(0, 50),
    fold_at=st.integers(1, 400),
)
def test_token_time_series_add_their_consecutive_differences(seed, lengths, raw, fold_at):
    """`add_gaps_of(times)` adds the gaps within one request's token times and none across
    two requests (series of 0 or 1 times add nothing), mixed with gaps added as values."""
    rng = np.random.default_rng(seed)
    multiset = Multiset(fold_at=fold_at)
    expected = []
    for n in lengths:
        times = np.cumsum(np.round(rng.exponential(5.0, size=n), 3)) + rng.uniform(0, 1e4)
        multiset.add_gaps_of(array("d", times))
        expected.append(np.diff(times))
        if rng.random() < 0.3:
            values = shared_gaps(rng, raw, n_ends=5, zeros=0.1)
            multiset.extend(values)
            expected.append(values)
    expected_gaps = np.concatenate(expected) if expected else np.empty(0)
    assert len(multiset) == len(expected_gaps)
    assert np.array_equal(multiset.sorted(), np.sort(expected_gaps))


@pytest.mark.parametrize(
    "gaps",
    [
        [0.0],
        [0.0, 0.0, 0.0],
        [3.0, 0.0, 3.0, 0.0],
        [5.0] * 300,
        [1e-9, 1e9, 1e-9],
        [2.5, 4.0, 1.0, 1.0, 0.0, 2.5],
    ],
)
def test_zeros_count_in_the_itl_but_not_in_the_rates(gaps):
    """Only gaps > 0 have a rate; a run of nothing but zero gaps has no rate statistics."""
    x = np.array(gaps)
    assert from_multiset(Multiset.of(x, fold_at=2), chunk=128) == reference(x)
    if not (x > 0).any():
        assert from_multiset(Multiset.of(x), chunk=128)[f"mean_{RATE}"] is None


def test_two_gaps_with_one_rate_are_counted_twice():
    """Distinct gaps whose rates round to the same float: the rates need not be distinct."""
    a = 1.4140707035351767
    b = np.nextafter(a, 2.0)
    assert 1000.0 / a == 1000.0 / b
    x = np.array([a, b, b, 7.0, 0.5] * 60)
    assert from_multiset(Multiset.of(x), chunk=128) == reference(x)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 3000),
    n_ends=st.integers(1, 400),
    zeros=st.sampled_from([0.0, 0.01, 0.5]),
    fold_at=st.integers(1, 500),
    chunk=st.integers(128, 1200),
)
def test_any_gaps_any_folds_any_chunks(seed, n, n_ends, zeros, fold_at, chunk):
    rng = np.random.default_rng(seed)
    gaps = shared_gaps(rng, n, n_ends, zeros)
    multiset = fed(gaps, fold_at, rng)
    assert from_multiset(multiset, chunk) == reference(gaps)


def test_summarize_takes_the_multiset_or_the_array():
    """`summarize` of a multiset and of the same gaps as an array (left unchanged) agree."""
    import pandas as pd

    rng = np.random.default_rng(3)
    gaps = shared_gaps(rng, 5000, 300, 0.02)
    kept = gaps.copy()
    requests = pd.DataFrame(
        {
            "arrival_ms": [0.0],
            "terminal_status": ["completed"],
            "terminal_ms": [10.0],
            "input_length": [10],
            "output_length": [5001],
            "reused_input_tokens": [0],
            "decode_reused_input_tokens": [0],
            "g1_reused_input_tokens": [0],
            "host_reused_input_tokens": [0],
            "disk_reused_input_tokens": [0],
            "first_admission_reused_input_tokens": [0],
            "ttft_ms": [1.0],
            "ttst_ms": [1.0],
            "tpot_ms": [1.0],
            "e2e_latency_ms": [10.0],
        }
    )
    sizes = {"decode_workers": 1, "decode_gpus_per_worker": 1}
    by_array = summarize(requests, gaps, **sizes)
    by_multiset = summarize(requests, fed(gaps, 64, rng), **sizes)
    assert by_array == by_multiset
    assert np.array_equal(gaps, kept)
    expected = reference(gaps)
    assert {k: by_array[k] for k in expected} == expected


def test_a_run_summarizes_the_gaps_of_its_token_times(config, trace, monkeypatch):
    """A run whose recorder folds every few gaps: the summary's ITL and per-user throughput
    are the statistics of the gaps between the kept token times of its completed requests."""
    monkeypatch.setattr(recorder_module, "Multiset", lambda: Multiset(fold_at=5))
    rows = []
    for k in range(60):
        n_blocks = 4 + k % 5
        rows.append(
            {
                "timestamp": 3 * k,
                "input_length": 64 * n_blocks - 10,
                "output_length": 1 + (k * 7) % 40,
                # a prefix shared by a third of the requests, then their own blocks
                "hash_ids": [k % 3, *range(100 * k, 100 * k + n_blocks - 1)],
            }
        )
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        topology={"kind": "aggregated", "num_workers": 2},
        output={"per_token": True},
    )
    result = simulate(cfg)
    done = result.requests[result.requests.terminal_status == "completed"].request_id
    gaps = np.concatenate([np.diff(result.token_times[r]) for r in done])
    assert len(gaps) > 500 and len(np.unique(gaps)) < len(gaps)
    expected = reference(gaps)
    assert {k: result.summary[k] for k in expected} == expected
