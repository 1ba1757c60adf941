"""The run summary with Dynamo's key names and definitions (see docs/metrics.md).

* TTFT = first token - arrival; TTST = second - first token; TPOT (one sample per request with
  >= 2 tokens) = (last - first token) / (tokens - 1); ITL = every inter-token gap of every
  completed request, pooled; E2E = last token - arrival. Only completed requests count.
* Percentiles are nearest-rank with rounding: sorted[round((n - 1) p / 100)]; std is the
  population std.
* duration_ms = the latest completion time; throughputs divide completed work by it.
* prefix_cache_reused_ratio = sum of reused input tokens / sum of input tokens (completed
  requests; per request the largest reuse over its admissions).
* The host-dependent keys (wall time, tokens per wall second) are kept apart, under
  `metadata.wall` (`wall_summary`): the rest is the same for the same config and seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from servesim.config.schema import SloConfig
from servesim.metrics.gaps import Multiset
from servesim.metrics.records import COMPLETED, INCOMPLETE, REJECTED
from servesim.metrics.tables import time_weighted_mean

STAT_KEYS = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")
PERCENTILES = {"median": 50, "p75": 75, "p90": 90, "p95": 95, "p99": 99}


def nearest_rank(sorted_values: np.ndarray, p: float) -> float:
    """Value at rank round((n - 1) p / 100), rounding halves up (Dynamo's percentile)."""
    return float(sorted_values[_rank(len(sorted_values), p)])


def _rank(n: int, p: float) -> int:
    """The index of the nearest-rank p-th percentile of n sorted values."""
    return min(math.floor((n - 1) * p / 100 + 0.5), n - 1)


# arrays longer than this get their std in pieces of at most this many values (see _std)
STD_CHUNK = 1 << 22


def _pairwise_sum(part: Callable[[int, int], np.ndarray], lo: int, hi: int, chunk: int) -> float:
    """numpy's sum of a float64 array, `part(lo, hi)` being its values [lo, hi): numpy adds a
    contiguous array pairwise, splitting n values at n // 2 rounded down to a multiple of 8;
    splitting the same way down to pieces of at most `chunk` values gives the same float, as
    long as no piece is cut below numpy's leaf of 128 values (summed 8-way unrolled)."""
    n = hi - lo
    if n <= chunk:
        return float(np.add.reduce(part(lo, hi), initial=0.0))
    half = n // 2
    half -= half % 8
    return _pairwise_sum(part, lo, lo + half, chunk) + _pairwise_sum(part, lo + half, hi, chunk)


def _std(x: np.ndarray, chunk: int = STD_CHUNK) -> float:
    """`x.std()` to the last bit, without its temporary copy of `x` when `x` is long (a
    million requests' ITL gaps are a gigabyte)."""
    return _mean_std(lambda lo, hi: x[lo:hi], len(x), chunk)[1]


def _mean_std(part: Callable[[int, int], np.ndarray], n: int, chunk: int) -> tuple[float, float]:
    """`x.mean()` and `x.std()` of the n > 0 values x that `part(lo, hi)` gives as x[lo:hi],
    to the last bit, asking for at most `chunk` values at a time when n > chunk."""
    if chunk < 128:
        raise ValueError(f"chunk must be >= 128 (numpy's pairwise leaf), got {chunk}")
    if n <= chunk:
        x = part(0, n)
        return float(x.mean()), float(x.std())
    mean = _pairwise_sum(part, 0, n, chunk) / n

    def squares(lo: int, hi: int) -> np.ndarray:
        d = part(lo, hi) - mean
        return np.multiply(d, d, out=d)

    return mean, float(np.sqrt(_pairwise_sum(squares, 0, n, chunk) / n))


def distribution(
    values: Sequence[float] | np.ndarray, name: str, unit: str = "_ms", is_sorted: bool = False
) -> dict:
    """mean/min/max/median/p75/p90/p95/p99/std of `values` as `{stat}_{name}{unit}` keys
    (`is_sorted`: `values` are already in ascending order)."""
    x = np.asarray(values, dtype=float) if is_sorted else np.sort(np.asarray(values, dtype=float))
    if len(x) == 0:
        return {f"{s}_{name}{unit}": None for s in STAT_KEYS}
    out = {
        f"mean_{name}{unit}": float(x.mean()),
        f"min_{name}{unit}": float(x[0]),
        f"max_{name}{unit}": float(x[-1]),
    }
    for key, p in PERCENTILES.items():
        out[f"{key}_{name}{unit}"] = nearest_rank(x, p)
    out[f"std_{name}{unit}"] = _std(x)
    return out


def counted_distribution(
    values: np.ndarray,
    counts: np.ndarray,
    name: str,
    unit: str = "_ms",
    chunk: int | None = None,
) -> dict:
    """`distribution` of the values `np.repeat(values, counts)` (`values` in non-decreasing
    order, `counts` > 0), the same floats, without making that array: its mean and std are
    summed `chunk` (default STD_CHUNK) values at a time in numpy's pairwise order."""
    ends = np.cumsum(counts)
    n = int(ends[-1]) if len(ends) else 0
    if n == 0:
        return {f"{s}_{name}{unit}": None for s in STAT_KEYS}

    def part(lo: int, hi: int) -> np.ndarray:
        first = int(np.searchsorted(ends, lo, "right"))
        last = int(np.searchsorted(ends, hi - 1, "right"))
        reps = counts[first : last + 1].copy()
        reps[0] -= lo - (ends[first] - counts[first])
        reps[-1] -= ends[last] - hi
        return np.repeat(values[first : last + 1], reps)

    mean, std = _mean_std(part, n, STD_CHUNK if chunk is None else chunk)
    out = {
        f"mean_{name}{unit}": mean,
        f"min_{name}{unit}": float(values[0]),
        f"max_{name}{unit}": float(values[-1]),
    }
    for key, p in PERCENTILES.items():
        at = int(np.searchsorted(ends, _rank(n, p), "right"))
        out[f"{key}_{name}{unit}"] = float(values[at])
    out[f"std_{name}{unit}"] = std
    return out


def rows_where(df: pd.DataFrame, mask: pd.Series) -> pd.DataFrame:
    """`df[mask]`, or `df` itself when the mask keeps every row (no copy of a long table)."""
    return df if bool(mask.all()) else df[mask]


def summarize(
    requests: pd.DataFrame,
    itl_gaps_ms: Multiset | np.ndarray,
    *,
    decode_workers: int,
    decode_gpus_per_worker: int,
    prefill_workers: int = 0,
    prefill_gpus_per_worker: int = 0,
    slo: SloConfig | None = None,
) -> dict[str, Any]:
    """The summary of one run. Aggregated workers count as the decode pool (as in Dynamo).

    `itl_gaps_ms`: every inter-token gap of every completed request, in any order (an array
    is left as it is)."""
    arrived = rows_where(requests, requests["arrival_ms"].notna())
    done = rows_where(requests, requests["terminal_status"] == COMPLETED)
    duration_ms = float(done["terminal_ms"].max()) if len(done) else 0.0
    duration_s = max(duration_ms / 1000.0, 1e-9)
    total_in = int(done["input_length"].sum())
    total_out = int(done["output_length"].sum())
    # the most reuse any admission of the request saw, prefill or decode side
    reused = int(np.maximum(done["reused_input_tokens"], done["decode_reused_input_tokens"]).sum())
    # by tier, of the admission that reused the most on the request's first side (the
    # prefill side in P/D): the columns' sums
    g1_reused = int(done["g1_reused_input_tokens"].sum())
    host_reused = int(done["host_reused_input_tokens"].sum())
    disk_reused = int(done["disk_reused_input_tokens"].sum())
    first_reused = int(done["first_admission_reused_input_tokens"].sum())
    prefill_seconds = prefill_workers * duration_s
    decode_seconds = decode_workers * duration_s
    counts = arrived["terminal_status"].value_counts()

    ttft = done["ttft_ms"].dropna().to_numpy()
    ttst = done["ttst_ms"].dropna().to_numpy()
    tpot = done["tpot_ms"].dropna().to_numpy()
    e2e = done["e2e_latency_ms"].dropna().to_numpy()
    gaps = itl_gaps_ms if isinstance(itl_gaps_ms, Multiset) else Multiset.of(itl_gaps_ms)
    gap_values, gap_counts = gaps.distinct()

    summary: dict[str, Any] = {
        "num_requests": int(len(arrived)),
        "completed_requests": int(len(done)),
        "rejected_requests": int(counts.get(REJECTED, 0)),
        "incomplete_requests": int(counts.get(INCOMPLETE, 0)),
        "not_arrived_requests": int(len(requests) - len(arrived)),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration_ms": duration_ms,
        "request_throughput_rps": len(done) / duration_s,
        "input_throughput_tok_s": total_in / duration_s,
        "output_throughput_tok_s": total_out / duration_s,
        "total_throughput_tok_s": (total_in + total_out) / duration_s,
        "prefill_worker_seconds": prefill_seconds,
        "decode_worker_seconds": decode_seconds,
        "prefill_gpus_per_worker": prefill_gpus_per_worker,
        "decode_gpus_per_worker": decode_gpus_per_worker,
        "gpu_hours": (
            prefill_seconds * prefill_gpus_per_worker + decode_seconds * decode_gpus_per_worker
        )
        / 3600.0,
        "processed_tokens": total_in + total_out,
        "prefix_cache_reused_ratio": reused / total_in if total_in else 0.0,
        "first_admission_prefix_cache_reused_ratio": first_reused / total_in if total_in else 0.0,
        "g1_reused_input_tokens": g1_reused,
        "host_reused_input_tokens": host_reused,
        "disk_reused_input_tokens": disk_reused,
        "g1_reused_ratio": g1_reused / total_in if total_in else 0.0,
        "host_reused_ratio": host_reused / total_in if total_in else 0.0,
        "disk_reused_ratio": disk_reused / total_in if total_in else 0.0,
        "num_ttft_samples": int(len(ttft)),
        "num_tpot_samples": int(len(tpot)),
        "num_e2e_latency_samples": int(len(e2e)),
    }
    for name, values in (("ttft", ttft), ("ttst", ttst), ("tpot", tpot)):
        summary.update(distribution(values, name))
    summary.update(counted_distribution(gap_values, gap_counts, "itl"))
    summary.update(distribution(e2e, "e2e_latency"))
    summary["max_itl_ms"] = float(gap_values[-1]) if len(gap_values) else None
    # 1000 / x reverses the order of the positive gaps: the rates ascending, each as often as
    # its gap (two gaps may give one rate: non-decreasing is enough)
    positive = int(np.searchsorted(gap_values, 0.0, "right"))
    rates = np.divide(1000.0, gap_values[positive:])[::-1]
    summary.update(
        counted_distribution(
            rates, gap_counts[positive:][::-1], "output_token_throughput_per_user", ""
        )
    )
    if slo is not None and (slo.ttft_ms or slo.itl_ms or slo.e2e_ms):
        good = goodput_mask(done, slo)
        n_good = int(good.sum())
        summary["goodput_completed_requests"] = n_good
        summary["goodput_request_throughput_rps"] = n_good / duration_s
        summary["goodput_output_throughput_tok_s"] = (
            int(done["output_length"][good].sum()) / duration_s
        )
    return summary


def wall_summary(summary: dict[str, Any], wall_time_ms: float) -> dict[str, float]:
    """What depends on the host, not on the model: the host time of the run and the
    simulator's speed in tokens per wall second (summary `metadata.wall`; two runs of one
    config and seed differ only here)."""
    wall_s = max(wall_time_ms / 1000.0, 1e-9)
    return {
        "wall_time_ms": wall_time_ms,
        "processed_tokens_per_s": summary["processed_tokens"] / wall_s,
        "processed_output_tokens_per_s": summary["total_output_tokens"] / wall_s,
    }


def without_wall(summary: dict[str, Any]) -> dict[str, Any]:
    """A copy of a run's summary without `metadata.wall`: what the same config and seed
    always give (to compare two runs)."""
    out = dict(summary)
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "wall"}
    return out


def goodput_mask(done: pd.DataFrame, slo: SloConfig) -> pd.Series:
    """Completed requests that meet every bound set: TTFT, mean ITL (E2E - TTFT) / (tokens -
    1) (not checked with fewer than 2 tokens), E2E. A request without tokens has no TTFT."""
    good = pd.Series(True, index=done.index)
    if slo.ttft_ms is not None:
        good &= done["ttft_ms"] <= slo.ttft_ms
    if slo.e2e_ms is not None:
        good &= done["e2e_latency_ms"] <= slo.e2e_ms
    if slo.itl_ms is not None:
        n = done["output_length"]
        itl = (done["e2e_latency_ms"] - done["ttft_ms"]) / (n - 1).where(n > 1)
        good &= (n <= 1) | (itl <= slo.itl_ms)
    return good


TIER_COPIES = ("d2h", "h2d", "g2_to_g3", "g3_to_g2")


def tier_summary(
    pools: Sequence[Any], kv: pd.DataFrame, transfers: pd.DataFrame, end_ms: float
) -> dict[str, Any]:
    """Bytes moved per tier direction, and per tier (host, disk) the time-weighted mean of
    occupied / capacity over the pools and [0, end_ms], evictions and blocks dropped."""
    out: dict[str, Any] = {}
    kinds = transfers.groupby("kind")["bytes"].sum() if len(transfers) else pd.Series(dtype=int)
    for kind in TIER_COPIES:
        out[f"{kind}_bytes"] = int(kinds.get(kind, 0))
    for tier in ("host", "disk"):
        mine = [p for p in pools if p.tier == tier]
        if not mine:
            out[f"mean_{tier}_used_ratio"] = None
            out[f"{tier}_evicted_blocks"] = 0
            out[f"{tier}_dropped_blocks"] = 0
            continue
        used = time_weighted_mean(kv, "used_blocks", end_ms, tier) if len(kv) else pd.Series()
        out[f"mean_{tier}_used_ratio"] = float(
            np.mean([used.get(p.name, 0.0) / p.capacity_blocks for p in mine])
        )
        out[f"{tier}_evicted_blocks"] = sum(p.n_evicted for p in mine)
        out[f"{tier}_dropped_blocks"] = sum(p.n_dropped for p in mine)
    return out


def routing_summary(routing: pd.DataFrame) -> dict[str, Any]:
    """What the KV router did (empty for the other routers): decisions by outcome, the mean
    and p90 wait of queued ones, and the mean overlap regret, per pool."""
    out: dict[str, Any] = {}
    for pool, rows in routing.groupby("pool", sort=True):
        queued = rows[rows["outcome"] == "queued"]
        out[f"router_{pool}_decisions"] = int(len(rows))
        out[f"router_{pool}_queued"] = int(len(queued))
        waits = queued["queue_wait_ms"]
        out[f"router_{pool}_mean_queue_wait_ms"] = float(waits.mean()) if len(waits) else 0.0
        out[f"router_{pool}_p90_queue_wait_ms"] = float(waits.quantile(0.9)) if len(waits) else 0.0
        out[f"router_{pool}_mean_overlap_regret_blocks"] = float(
            rows["overlap_regret_blocks"].mean()
        )
    return out
