"""Fast-forward against stepping every pass, on the configurations users run (issue 8).

`engine.fast_forward=true` (pass chaining and decode stretches, docs/architecture.md) must give
the answer of `engine.fast_forward=false`, which steps every pass through the event loop. Each
scenario runs both modes and compares, strictly: the requests table (every `_ms` column to
1e-6 ms with no relative tolerance, every other column exactly, dtypes included), the passes,
kv, kv_events, transfers, routing and plays tables the same way, the per-token times, and the
summary exactly (NaN-aware; only the host-time keys and the `fast_forward` flag inside the
config echo are left out).

A scenario also checks that it exercises what its id says (preemptions, evictions, transfers,
a cut-off ...) and, where fast-forward is allowed to act, that it did cut SimPy events, so a
pass is never the vacuous one of two identical step-by-step runs.
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_TRACES, make_config, shared_trace, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import servesim.sim as sim
from servesim import simulate
from servesim.clock import Environment
from servesim.metrics.summary import without_wall
from servesim.sim import Result

TIME_ATOL_MS = 1e-6
TABLES = ("requests", "passes", "kv", "kv_events", "transfers", "routing", "plays")

CONVERSATION = SHARED_TRACES / "conversation_trace.jsonl"
SYNTHETIC_TRACE = SHARED_TRACES / "synthetic_trace.jsonl"

# --------------------------------------------------------------------------- comparison


def _same_cells(x: pd.Series, y: pd.Series, atol: float) -> np.ndarray:
    """Cell by cell: equal, or both missing, or (floats) within `atol`."""
    numpy_kind = x.dtype.kind if isinstance(x.dtype, np.dtype) else ""  # not Int64, strings
    if numpy_kind in ("i", "u", "b"):
        return x.to_numpy() == y.to_numpy()
    if numpy_kind == "f":
        u, v = x.to_numpy(), y.to_numpy()
        with np.errstate(invalid="ignore"):
            return (u == v) | (np.isnan(u) & np.isnan(v)) | (np.abs(u - v) <= atol)
    # strings, nullable integers, objects
    na_x, na_y = x.isna().to_numpy(), y.isna().to_numpy()
    out = na_x & na_y
    for i, (p, q) in enumerate(zip(x.to_numpy(object), y.to_numpy(object), strict=True)):
        if not (na_x[i] or na_y[i]):
            if atol and isinstance(p, float) and isinstance(q, float):
                out[i] = abs(p - q) <= atol
            else:
                out[i] = type(p) is type(q) and bool(np.all(p == q))
    return out


def table_differences(name: str, fast: pd.DataFrame, step: pd.DataFrame) -> list[str]:
    """How two tables differ, one line per differing column, earliest differing row first
    (an empty list when they agree)."""
    if list(fast.columns) != list(step.columns):
        return [f"{name}: columns {list(fast.columns)} != {list(step.columns)}"]
    if len(fast) != len(step):
        return [f"{name}: {len(fast)} rows with fast-forward, {len(step)} stepping"]
    found = []
    for col in fast.columns:
        x, y = fast[col], step[col]
        if x.dtype != y.dtype:
            found.append((-1, f"{name}.{col}: dtype {x.dtype} != {y.dtype}"))
            continue
        atol = TIME_ATOL_MS if col.endswith("_ms") else 0.0
        bad = np.flatnonzero(~_same_cells(x, y, atol))
        if len(bad):
            i = int(bad[0])
            key = f" (request {fast['request_id'].iloc[i]})" if "request_id" in fast else ""
            found.append(
                (
                    i,
                    f"{name}: row {i}{key} column {col}: fast-forward {x.iloc[i]!r}, "
                    f"stepping {y.iloc[i]!r} ({len(bad)} of {len(x)} rows differ)",
                )
            )
    return [msg for _, msg in sorted(found)]


def _drop_mode(summary: dict[str, Any], fast_forward: bool) -> dict[str, Any]:
    """The summary without host-time keys and without the one config key the modes differ in."""
    out = copy.deepcopy(without_wall(summary))
    speed = out["metadata"]["config"].pop("speed")
    assert speed.pop("processes") == 1
    assert speed == dict.fromkeys(("fast_forward", "grouped_pool", "gc_tuning"), fast_forward)
    return out


def value_differences(a: Any, b: Any, path: str = "summary") -> list[str]:
    """Exact structural comparison (types included); NaN equals NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{path}: keys differ: {sorted(set(a) ^ set(b)) or 'order'}"]
        return [d for k in a for d in value_differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return [f"{path}: {a!r} != {b!r}"]
        return [
            d
            for k, (p, q) in enumerate(zip(a, b, strict=True))
            for d in value_differences(p, q, f"{path}[{k}]")
        ]
    if type(a) is not type(b):
        return [f"{path}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"]
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return []
    if isinstance(a, np.ndarray):
        return [] if np.array_equal(a, b, equal_nan=True) else [f"{path}: arrays differ"]
    return [] if a == b else [f"{path}: fast-forward {a!r}, stepping {b!r}"]


def token_time_differences(fast: dict[str, np.ndarray], step: dict[str, np.ndarray]) -> list[str]:
    if list(fast) != list(step):
        return [f"token_times: request ids differ: {sorted(set(fast) ^ set(step)) or 'order'}"]
    out = []
    for rid, u in fast.items():
        v = step[rid]
        if len(u) != len(v):
            out.append(f"token_times[{rid}]: {len(u)} tokens != {len(v)}")
        elif not (np.abs(u - v) <= TIME_ATOL_MS).all():
            k = int(np.flatnonzero(np.abs(u - v) > TIME_ATOL_MS)[0])
            out.append(f"token_times[{rid}][{k}]: fast-forward {u[k]!r}, stepping {v[k]!r}")
    return out


def run_differences(fast: Result, step: Result) -> list[str]:
    """Every difference between a fast-forward run and a stepped run of one config."""
    found = []
    for name in TABLES:
        found += table_differences(name, getattr(fast, name), getattr(step, name))
    found += token_time_differences(fast.token_times, step.token_times)
    found += value_differences(_drop_mode(fast.summary, True), _drop_mode(step.summary, False))
    return found


def assert_same_run(fast: Result, step: Result) -> None:
    found = run_differences(fast, step)
    assert not found, "fast-forward changed the answer:\n" + "\n".join(found[:20])


# --------------------------------------------------------------------------- running


class CountingEnvironment(Environment):
    """The model's environment, remembered so a test can count the events it scheduled."""

    made: list[CountingEnvironment] = []

    def __init__(self) -> None:
        super().__init__()
        CountingEnvironment.made.append(self)

    def n_events(self) -> int:
        return next(self._eid)  # SimPy numbers every scheduled event from this counter


def with_mode(sections: dict[str, Any], fast_forward: bool) -> dict[str, Any]:
    """The sections with the whole speed layer on (`speed=fast`) or off (`speed=textbook`)."""
    out = copy.deepcopy(sections)
    out["speed"] = dict.fromkeys(("fast_forward", "grouped_pool", "gc_tuning"), fast_forward)
    return out


def run_both(sections: dict[str, Any]) -> tuple[Result, Result, int, int]:
    """One config in both modes: (fast-forward result, stepped result, and the SimPy events
    each scheduled)."""
    results: list[Result] = []
    events: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sim, "Environment", CountingEnvironment)
        for fast_forward in (True, False):
            cfg = make_config(**with_mode(sections, fast_forward))
            assert cfg.speed.fast_forward is fast_forward
            CountingEnvironment.made.clear()
            results.append(simulate(cfg))
            events.append(CountingEnvironment.made[-1].n_events())
    return results[0], results[1], events[0], events[1]


# --------------------------------------------------------------------------- workloads


def dist(kind: str, mean: float, lo: int, hi: int, std: float = 0.0) -> dict[str, Any]:
    return {"dist": kind, "mean": mean, "std": std, "min": lo, "max": hi}


# multi-turn chat sessions with shared system prompts: a turn's completion dispatches the next
CHAT = {
    "kind": "synthetic",
    "num_sessions": 30,
    "turns_per_session": 3,
    "inter_turn_delay_ms": 400.0,
    "input_tokens": dist("lognormal", 600, 32, 4096, 300),
    "output_tokens": dist("lognormal", 100, 1, 400, 80),
    "shared_prefix_ratio": 0.3,
    "num_prefix_groups": 4,
    "rate_rps": 6.0,
}
# single-turn requests: only the driver's next arrival bounds a chain
SINGLE = dict(CHAT, num_sessions=60, turns_per_session=1, rate_rps=8.0)
# equal prompts, evenly spaced arrivals, long outputs: long decode stretches (and, on a small
# pool, preemptions in the middle of them)
WAVES = dict(
    CHAT,
    num_sessions=24,
    turns_per_session=1,
    input_tokens=dist("constant", 256, 1, 256),
    output_tokens=dist("uniform", 200, 50, 350),
    rate_rps=3.0,
    arrival_process="constant",
)
AGENTIC = {
    "kind": "agentic_synthetic",
    "num_plays": 6,
    "turns_per_play": dist("uniform", 3, 2, 4),
    "system_prompt_tokens": 256,
    "first_user_tokens": dist("uniform", 150, 32, 300),
    "tool_output_tokens": dist("uniform", 100, 16, 200),
    "output_tokens": dist("uniform", 30, 4, 60),
    "tool_time_ms": dist("uniform", 60, 10, 150),
    "subagent_probability": 0.5,
    "subagent_blocking_probability": 0.5,
    "play_interval_ms": 80.0,
    "agentic_lanes": None,
}


def real(path: Path, rows: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "mooncake", "path": path, "max_requests": rows, **extra}


def session_rows() -> list[dict[str, Any]]:
    """A Mooncake trace of 12 four-turn sessions (`session_id`, `delay`), each turn's prompt
    the previous one's plus a few blocks, so later turns hit the prefix cache."""
    rng = np.random.default_rng(8)
    rows = []
    for s in range(12):
        ids: list[int] = []
        for k in range(4):
            ids = ids + [s * 1000 + len(ids) + j for j in range(int(rng.integers(1, 5)))]
            row = {
                "session_id": f"s{s}",
                "input_length": 64 * len(ids) - int(rng.integers(0, 64)),
                "output_length": int(rng.integers(1, 120)),
                "hash_ids": ids,
            }
            if k == 0:
                row["timestamp"] = 120 * s
            else:
                row["delay"] = int(rng.integers(0, 400))
            rows.append(row)
    return rows


GENERATED = {"<sessions>": session_rows}

# --------------------------------------------------------------------------- scenarios

POLY = {"kind": "polynomial"}
# speculative decoding with acceptance rates strictly between 0 and 1 (random bursts)
SPEC = {"num_speculative_tokens": 2, "acceptance_rates": [0.8, 0.5], "seed": 7}
SGLANG = {"kind": "sglang", "block_size": 1}  # engine=sglang's 1-token pages
TIERS_G1 = 24  # G1 blocks per rank under a host tier: small, so the tier is used
HOST = {"num_host_blocks": 400, "d2h_bandwidth_gbps": 16.0, "h2d_bandwidth_gbps": 16.0}
DISK = {"num_g3_blocks": 2000, "read_bandwidth_gbps": 4.0, "write_bandwidth_gbps": 4.0}


def pd_topology(p: int, d: int, **roles: Any) -> dict[str, Any]:
    return {"kind": "disagg", "num_prefill_workers": p, "num_decode_workers": d, **roles}


def truncated_output(r: Result) -> bool:
    done = r.requests[r.requests.terminal_status == "completed"]
    return bool((done.output_length < done.requested_output_length).any())


def cut_while_decoding(r: Result) -> bool:
    req = r.requests
    return bool(((req.terminal_status == "incomplete") & (req.output_length > 0)).any())


def queued_for_kv_never_preempted(r: Result) -> bool:
    """Some request waited in the queue for longer than a few passes take; none preempted."""
    wait_ms = r.requests.first_admit_ms - r.requests.arrival_ms
    return bool(wait_ms.max() > 200.0) and r.summary["n_preemptions"] == 0


def queued_in_router(r: Result) -> bool:
    return bool(len(r.routing)) and bool((r.routing.outcome == "queued").any())


def case(
    case_id: str,
    workload: dict[str, Any],
    expect: tuple[str | Callable[[Result], bool], ...] = (),
    shortcut: bool | None = True,
    marks: Any = (),
    **sections: Any,
) -> Any:
    """One scenario. `expect`: summary keys that must be positive, table names that must have
    rows, or predicates. `shortcut`: fast-forward must schedule fewer SimPy events than
    stepping (True), or this is not checked (None: a worker with KV tiers steps every pass)."""
    output = {"progress": "off", "kv_events": True, **sections.pop("output", {})}
    engine = {"num_gpu_blocks": 16384, **sections.pop("engine", {})}
    sections = {"workload": workload, "engine": engine, "output": output, **sections}
    sections.setdefault("timing", POLY)
    return pytest.param(sections, expect, shortcut, id=case_id, marks=marks)


SCENARIOS = [
    # aggregated, routers and worker counts
    case("agg1-rr", CHAT, topology={"num_workers": 1}),
    case("agg2-rr", CHAT, topology={"num_workers": 2}),
    case("agg4-rr", CHAT, topology={"num_workers": 4}, output={"per_token": True}),
    case("agg2-random", CHAT, topology={"num_workers": 2}, router={"kind": "random"}),
    # (one worker needs dp_size 2 for the KV router: it refuses a single target)
    case(
        "agg1-dp2-kv",
        CHAT,
        ("routing",),
        engine={"dp_size": 2},
        topology={"num_workers": 1},
        router={"kind": "kv"},
    ),
    case("agg2-kv", CHAT, ("routing",), topology={"num_workers": 2}, router={"kind": "kv"}),
    case("agg4-kv", CHAT, ("routing",), topology={"num_workers": 4}, router={"kind": "kv"}),
    case(
        "agg2-kv-queue-lag-temperature",
        dict(SINGLE, num_sessions=40, rate_rps=60.0),
        (queued_in_router,),
        topology={"num_workers": 2},
        router={
            "kind": "kv",
            "queue_threshold": 0.0,
            "queue_policy": "wspt",
            "temperature": 0.5,
            "kv_event_lag_ms": 20.0,
            "decode_active_request_weight": 2.0,
        },
    ),
    case(
        "agg2-kv-session-affinity",
        CHAT,
        ("routing",),
        topology={"num_workers": 2},
        router={"kind": "kv", "affinity": {"mode": "session"}},
    ),
    case("agg1-single-turn", SINGLE, topology={"num_workers": 1}),
    case(
        "agg2-concurrency",
        CHAT,
        topology={"num_workers": 2},
        load={"kind": "concurrency", "concurrency": 6},
    ),
    case(
        "agg1-mooncake-sessions",
        {"kind": "mooncake", "path": "<sessions>", "trace_block_size": 64},
        ("g1_reused_input_tokens",),
        topology={"num_workers": 1},
    ),
    # engine settings
    case(
        "agg1-no-prefix-cache",
        CHAT,
        engine={"enable_prefix_caching": False},
        topology={"num_workers": 1},
    ),
    case(
        "agg1-no-chunked-prefill",
        CHAT,
        engine={"enable_chunked_prefill": False},
        topology={"num_workers": 1},
    ),
    case(
        "agg1-chunked-prefill-256",
        CHAT,
        engine={"max_num_batched_tokens": 256},
        topology={"num_workers": 1},
    ),
    case(
        "agg1-small-kv-preempt-lifo",
        WAVES,
        ("n_preemptions",),
        engine={"num_gpu_blocks": 48, "preemption_mode": "lifo"},
        topology={"num_workers": 1},
    ),
    case(
        "agg1-small-kv-preempt-fifo",
        WAVES,
        ("n_preemptions",),
        engine={"num_gpu_blocks": 48, "preemption_mode": "fifo"},
        topology={"num_workers": 1},
    ),
    case(
        "agg2-small-kv-evict",
        CHAT,
        ("n_kv_evictions", "g1_reused_input_tokens"),
        engine={"num_gpu_blocks": 120},
        topology={"num_workers": 2},
    ),
    # without KV events a decode stretch allocates (evicting) and registers in bulk
    case(
        "agg2-small-kv-evict-no-events",
        CHAT,
        ("n_kv_evictions", "g1_reused_input_tokens"),
        engine={"num_gpu_blocks": 120},
        topology={"num_workers": 2},
        output={"kv_events": False},
    ),
    case(
        "agg1-small-kv-preempt-no-events",
        WAVES,
        ("n_preemptions", "n_kv_evictions"),
        engine={"num_gpu_blocks": 48, "preemption_mode": "lifo"},
        topology={"num_workers": 1},
        output={"kv_events": False},
    ),
    # TRT-LLM (no decode stretches): a pool where vLLM preempts makes it queue instead
    case(
        "agg1-trtllm-small-kv",
        WAVES,
        (queued_for_kv_never_preempted,),
        engine={"kind": "trtllm", "block_size": 32, "num_gpu_blocks": 48},
        topology={"num_workers": 1},
    ),
    # SGLang: decode stretches of its decode-only passes, its pool kept by trace block with
    # duplicates shared (1-token pages by default; the synthetic trace blocks are 64 tokens)
    case("agg2-sglang", CHAT, topology={"num_workers": 2}, engine=SGLANG),
    case(
        "agg2-sglang-lpm-interval",
        CHAT,
        topology={"num_workers": 2},
        engine=dict(SGLANG, schedule_policy="lpm", prefill_decode_interval=2),
    ),
    case(
        "agg1-sglang-small-kv-retract-no-events",
        WAVES,
        ("n_preemptions", "n_kv_evictions"),
        engine={"kind": "sglang", "block_size": 16, "num_gpu_blocks": 60},
        topology={"num_workers": 1},
        output={"kv_events": False},
    ),
    case(
        "agg1-sglang-small-kv-retract",
        WAVES,
        ("n_preemptions", "n_kv_evictions"),
        engine=dict(SGLANG, num_gpu_blocks=800),
        topology={"num_workers": 1},
    ),
    case(
        "agg1-max-model-len",
        CHAT,
        ("rejected_requests", truncated_output),
        engine={"max_model_len": 700},
        topology={"num_workers": 1},
    ),
    case("agg2-max-num-seqs-2", CHAT, engine={"max_num_seqs": 2}, topology={"num_workers": 2}),
    case(
        "agg1-dp2",
        CHAT,
        engine={"dp_size": 2},
        topology={"num_workers": 1},
        output={"per_token": True},
    ),
    case(
        "agg2-dp2-kv",
        CHAT,
        ("routing",),
        engine={"dp_size": 2},
        topology={"num_workers": 2},
        router={"kind": "kv"},
    ),
    case(
        "agg1-dp2-small-kv-preempt",
        WAVES,
        ("n_preemptions",),
        engine={"dp_size": 2, "num_gpu_blocks": 24},
        topology={"num_workers": 1},
    ),
    case(
        "agg1-speedup-ratios",
        CHAT,
        engine={"speedup_ratio": 1.5, "decode_speedup_ratio": 2.0},
        topology={"num_workers": 1},
    ),
    case(
        "agg1-waves-per-token",
        WAVES,
        ("token_times",),
        topology={"num_workers": 1},
        output={"per_token": True},
    ),
    case(
        "agg1-user-default-output", CHAT, topology={"num_workers": 1}, output={"kv_events": False}
    ),
    # a stop time that cuts the run (in the middle of decode stretches)
    case(
        "agg2-stop",
        CHAT,
        (cut_while_decoding,),
        topology={"num_workers": 2},
        stop={"max_virtual_time_ms": 6000.0},
    ),
    # every request has arrived before 1 s: the stop itself is the horizon of the last stretch
    case(
        "agg1-stop-mid-stretch",
        dict(WAVES, rate_rps=30.0),
        (cut_while_decoding,),
        topology={"num_workers": 1},
        stop={"max_virtual_time_ms": 2345.5},
        output={"per_token": True},
    ),
    case(
        "agg4-kv-stop",
        CHAT,
        ("incomplete_requests",),
        topology={"num_workers": 4},
        router={"kind": "kv"},
        stop={"max_virtual_time_ms": 5000.0},
    ),
    # timing models
    case(
        "timing-fixed",
        CHAT,
        timing={"kind": "fixed", "prefill_ms": 12.0, "decode_ms": 3.0},
        topology={"num_workers": 2},
    ),
    case("timing-roofline", CHAT, timing={"kind": "roofline"}, topology={"num_workers": 2}),
    case(
        "timing-roofline-tp2",
        CHAT,
        timing={"kind": "roofline"},
        engine={"tp_size": 2},
        topology={"num_workers": 1},
    ),
    case(
        "timing-calibrated-roofline",
        CHAT,
        timing={"kind": "calibrated_roofline"},
        topology={"num_workers": 2},
    ),
    case(
        "timing-calibrated-roofline-dp2",
        CHAT,
        timing={"kind": "calibrated_roofline"},
        engine={"dp_size": 2},
        topology={"num_workers": 1},
    ),
    case(
        "timing-interpolated",
        CHAT,
        timing={
            "kind": "interpolated",
            "prefill_isl": [128, 1024, 4096, 8192],
            "prefill_ttft_ms": [12.0, 40.0, 150.0, 320.0],
            "decode_active_kv_tokens": [1024, 65536, 524288],
            "decode_context_length": [512, 4096, 32768],
            "decode_itl": [6.0, 6.5, 8.0, 7.0, 8.0, 10.0, 12.0, 14.0, 18.0],
        },
        topology={"num_workers": 2},
    ),
    # P/D disaggregation
    case("pd-1p1d-instant", CHAT, ("transfers",), topology=pd_topology(1, 1)),
    case(
        "pd-1p1d-bandwidth",
        CHAT,
        ("transfers",),
        topology=pd_topology(1, 1),
        link={"bandwidth_gbps": 5.0, "latency_ms": 0.2},
        output={"per_token": True},
    ),
    case("pd-2p2d-instant", CHAT, ("transfers",), topology=pd_topology(2, 2)),
    case(
        "pd-2p2d-bandwidth",
        CHAT,
        ("transfers",),
        topology=pd_topology(2, 2),
        link={"bandwidth_gbps": 2.0, "latency_ms": 0.5},
    ),
    case(
        "pd-2p2d-shared-link",
        CHAT,
        ("transfers",),
        topology=pd_topology(2, 2),
        link={"bandwidth_gbps": 4.0, "contention": "shared"},
    ),
    case(
        "pd-2p2d-fifo-lanes-destination-missing",
        CHAT,
        ("transfers",),
        topology=pd_topology(2, 2),
        link={
            "bandwidth_gbps": 4.0,
            "contention": "fifo_lanes",
            "lanes": 2,
            "timing_mode": "destination_missing",
        },
    ),
    case(
        "pd-1p1d-dp2",
        CHAT,
        ("transfers",),
        topology=pd_topology(1, 1, prefill={"dp_size": 2}, decode={"dp_size": 2}),
        link={"bandwidth_gbps": 10.0},
    ),
    case(
        "pd-1p2d-tight-decode",
        WAVES,
        ("transfers", "n_preemptions"),
        topology=pd_topology(1, 2, decode={"num_gpu_blocks": 40, "max_num_seqs": 8}),
        link={"bandwidth_gbps": 10.0},
    ),
    case(
        "pd-2p2d-kv-router",
        CHAT,
        ("transfers", "routing"),
        topology=pd_topology(2, 2),
        router={"kind": "kv"},
        link={"bandwidth_gbps": 10.0},
    ),
    case(
        "pd-2p2d-stop",
        CHAT,
        ("transfers", "incomplete_requests"),
        topology=pd_topology(2, 2),
        link={"bandwidth_gbps": 5.0},
        stop={"max_virtual_time_ms": 5000.0},
    ),
    # speculative decoding: bursts of up to k + 1 tokens a step (no decode stretches: those
    # emit one token a pass; chains still apply), rates strictly between 0 and 1
    case(
        "spec-agg2-k2",
        CHAT,
        ("token_times",),
        engine={"speculative": SPEC},
        topology={"num_workers": 2},
        output={"per_token": True},
    ),
    case(
        "spec-agg1-small-kv-preempt",
        WAVES,
        ("n_preemptions", "n_kv_evictions"),
        engine={"num_gpu_blocks": 48, "speculative": dict(SPEC, num_speculative_tokens=3)},
        topology={"num_workers": 1},
    ),
    case(
        "spec-agg1-dp2-kv-max-model-len",
        CHAT,
        ("routing", truncated_output),
        engine={"dp_size": 2, "max_model_len": 700, "speculative": SPEC},
        topology={"num_workers": 1},
        router={"kind": "kv"},
    ),
    case(
        "spec-pd-1p2d-tight-decode",
        WAVES,
        ("transfers", "n_preemptions"),
        engine={"speculative": SPEC},
        topology=pd_topology(1, 2, decode={"num_gpu_blocks": 16, "max_num_seqs": 8}),
        link={"bandwidth_gbps": 10.0},
    ),
    case(
        "spec-agg2-stop-calibrated",
        CHAT,
        (cut_while_decoding,),
        engine={"speculative": SPEC},
        timing={"kind": "calibrated_roofline"},
        topology={"num_workers": 2},
        stop={"max_virtual_time_ms": 6000.0},
    ),
    # KV tiers below HBM (a worker with tiers steps every pass, so no event count is checked)
    case(
        "tiers-host",
        CHAT,
        ("host_reused_input_tokens", "d2h_bytes"),
        shortcut=None,
        engine={"num_gpu_blocks": TIERS_G1 * 4},
        topology={"num_workers": 1},
        kv_cache={"host_offload": HOST},
    ),
    case(
        "tiers-host-disk",
        CHAT,
        ("disk_reused_input_tokens", "g2_to_g3_bytes"),
        shortcut=None,
        engine={"num_gpu_blocks": TIERS_G1 * 4},
        topology={"num_workers": 1},
        kv_cache={"host_offload": dict(HOST, num_host_blocks=60), "disk": DISK},
    ),
    case(
        "tiers-host-cluster-shared-kv-router",
        CHAT,
        ("host_reused_input_tokens",),
        shortcut=None,
        engine={"num_gpu_blocks": TIERS_G1 * 4},
        topology={"num_workers": 2},
        router={"kind": "kv"},
        kv_cache={"host_offload": dict(HOST, scope="cluster_shared")},
    ),
    case(
        "tiers-host-pd-1p1d",
        CHAT,
        ("transfers", "d2h_bytes"),
        shortcut=None,
        topology=pd_topology(1, 1, decode={"num_gpu_blocks": TIERS_G1 * 8}),
        kv_cache={"host_offload": HOST},
    ),
    # agent lanes
    case("agentic-no-lanes", AGENTIC, ("plays",), topology={"num_workers": 2}),
    case(
        "agentic-stride-lanes",
        dict(AGENTIC, agentic_lanes=2, agentic_lane_assignment="stride"),
        ("plays",),
        topology={"num_workers": 2},
        output={"per_token": True},
    ),
    case(
        "agentic-shared-queue-lanes-small-kv",
        dict(AGENTIC, agentic_lanes=3),  # the default lane rule
        ("plays", "n_preemptions"),
        engine={"num_gpu_blocks": 16},
        topology={"num_workers": 1},
    ),
    # slices of the real traces
    case(
        "conversation-300-agg2-rr",
        real(CONVERSATION, 300),
        output={"per_token": True},
        topology={"num_workers": 2},
    ),
    case(
        "conversation-300-agg4-kv",
        real(CONVERSATION, 300),
        ("routing",),
        topology={"num_workers": 4},
        router={"kind": "kv"},
    ),
    case(
        "conversation-200-agg1-tight-kv",
        real(CONVERSATION, 200),
        ("n_preemptions", "n_kv_evictions"),
        engine={"num_gpu_blocks": 1000},
        topology={"num_workers": 1},
    ),
    case(
        "conversation-200-pd-2p2d-bandwidth",
        real(CONVERSATION, 200),
        ("transfers",),
        topology=pd_topology(2, 2),
        link={"bandwidth_gbps": 20.0, "latency_ms": 0.01},
    ),
    # (1-token pages make an event per token: the events table of a real trace is large, so
    # these record none; the synthetic SGLang cases above and the KV router's do)
    case(
        "conversation-300-agg2-sglang",
        real(CONVERSATION, 300),
        topology={"num_workers": 2},
        engine=dict(SGLANG, num_gpu_blocks=1_000_000),
        output={"per_token": True, "kv_events": False},
    ),
    case(
        "conversation-200-agg1-sglang-tight-kv",
        real(CONVERSATION, 200),
        ("n_preemptions", "n_kv_evictions"),
        engine=dict(SGLANG, num_gpu_blocks=60_000),
        topology={"num_workers": 1},
        output={"kv_events": False},
    ),
    case(
        "conversation-200-agg4-sglang-kv",
        real(CONVERSATION, 200),
        ("routing",),
        topology={"num_workers": 4},
        router={"kind": "kv"},
        engine={"kind": "sglang", "block_size": 16, "num_gpu_blocks": 20_000},
    ),
    case(
        "conversation-200-pd-1p2d-sglang",
        real(CONVERSATION, 200),
        ("transfers",),
        topology=pd_topology(1, 2),
        engine=dict(SGLANG, num_gpu_blocks=400_000),
        output={"kv_events": False},
    ),
    case(
        "synthetic-trace-200-agg2-rr",
        real(SYNTHETIC_TRACE, 200),
        topology={"num_workers": 2},
    ),
    case(
        "synthetic-trace-200-agg1-dp2-stop",
        real(SYNTHETIC_TRACE, 200),
        ("incomplete_requests",),
        engine={"dp_size": 2},
        topology={"num_workers": 1},
        stop={"max_virtual_time_ms": 60000.0},
    ),
]


def _resolve_workload(sections: dict[str, Any], trace: Callable[[list], str]) -> dict[str, Any]:
    sections = copy.deepcopy(sections)
    workload = sections["workload"]
    path = workload.get("path")
    if isinstance(path, Path):
        workload["path"] = str(shared_trace(path.name))
    elif path in GENERATED:
        workload["path"] = trace(GENERATED[path]())
    return sections


@pytest.mark.parametrize("sections,expect,shortcut", SCENARIOS)
def test_fast_forward_gives_the_stepped_answer(sections, expect, shortcut, trace):
    """Both modes, one config: every table, token time and summary value the same."""
    fast, step, n_fast, n_step = run_both(_resolve_workload(sections, trace))
    assert_same_run(fast, step)
    for what in expect:
        if callable(what):
            assert what(fast), what.__name__
        elif what in TABLES or what == "token_times":
            assert len(getattr(fast, what)), f"no {what}"
        else:
            assert fast.summary[what] > 0, what
    if shortcut:
        assert n_fast < n_step, f"fast-forward saved no events ({n_fast} vs {n_step})"


# --------------------------------------------------------------------------- heavier replays

HEAVY = [
    case(
        "conversation-2000-agg2-dynamo-compat",
        real(CONVERSATION, 2000),
        topology={"num_workers": 2},
        marks=pytest.mark.slow,
    ),
    case(
        "conversation-1000-agg4-kv-tight-kv",
        real(CONVERSATION, 1000),
        ("routing", "n_kv_evictions"),
        engine={"num_gpu_blocks": 3000},
        topology={"num_workers": 4},
        router={"kind": "kv"},
        output={"per_token": True},
        marks=pytest.mark.slow,
    ),
    case(
        "conversation-1000-pd-2p2d-infiniband",
        real(CONVERSATION, 1000),
        ("transfers",),
        topology=pd_topology(2, 2, decode={"dp_size": 2}),
        link={"bandwidth_gbps": 50.0, "latency_ms": 0.005},
        marks=pytest.mark.slow,
    ),
    case(
        "synthetic-trace-1000-agg2-roofline",
        real(SYNTHETIC_TRACE, 1000),
        timing={"kind": "roofline"},
        topology={"num_workers": 2},
        marks=pytest.mark.slow,
    ),
    case(
        "default-synthetic-agg1",
        dict(
            CHAT,
            num_sessions=150,
            inter_turn_delay_ms=2000.0,
            input_tokens=dist("lognormal", 800, 32, 8192, 400),
            output_tokens=dist("lognormal", 200, 1, 1024, 100),
            rate_rps=4.0,
        ),
        topology={"num_workers": 1},
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize("sections,expect,shortcut", HEAVY)
def test_fast_forward_gives_the_stepped_answer_on_long_replays(sections, expect, shortcut, trace):
    test_fast_forward_gives_the_stepped_answer(sections, expect, shortcut, trace)


# --------------------------------------------------------------------------- random sessions

# test_invariants.py already compares the modes on random single-turn traces (aggregated,
# KV router, P/D) with pandas' default tolerance. This adds what those leave out: multi-turn
# sessions and closed loops (a completion can dispatch, so chains end at the next event),
# every timing model (each its own decode pricing, vectorised or not), stop times in an
# aggregated cluster, token times, and the strict comparison above, summary included.
session_strategy = st.lists(
    st.tuples(
        st.integers(0, 300),  # gap to the previous session's first turn, ms
        st.lists(
            st.tuples(
                st.integers(1, 6),  # trace blocks this turn adds to the context
                st.sampled_from([0, 1, 2, 5, 17, 40, 90]),  # output length
                st.integers(0, 200),  # delay after the previous turn ends, ms
            ),
            min_size=1,
            max_size=3,
        ),
        st.integers(0, 2),  # system-prompt family
    ),
    min_size=1,
    max_size=10,
)
property_engine_strategy = st.fixed_dictionaries(
    {
        "num_gpu_blocks": st.sampled_from([12, 40, 400]),
        "block_size": st.sampled_from([4, 16]),
        "max_num_batched_tokens": st.sampled_from([32, 256, 8192]),
        "max_num_seqs": st.sampled_from([1, 3, 256]),
        "enable_prefix_caching": st.booleans(),
        "enable_chunked_prefill": st.booleans(),
        "preemption_mode": st.sampled_from(["lifo", "fifo"]),
        "dp_size": st.sampled_from([1, 1, 2]),
        "max_model_len": st.sampled_from([None, None, 120]),
    }
)
TIMINGS = [
    {"kind": "fixed", "prefill_ms": 7.0, "decode_ms": 3.0},
    {"kind": "polynomial"},
    {"kind": "roofline"},
    {"kind": "calibrated_roofline"},
    {
        "kind": "interpolated",
        "prefill_isl": [16, 256, 2048],
        "prefill_ttft_ms": [5.0, 12.0, 60.0],
        "decode_active_kv_tokens": [16, 4096],
        "decode_context_length": [16, 1024],
        "decode_itl": [3.0, 3.5, 4.0, 6.0],
    },
]
LOADS = [
    {"kind": "trace"},
    {"kind": "trace", "arrival_speedup_ratio": 3.0},
    {"kind": "concurrency", "concurrency": 2},
    {"kind": "concurrency", "concurrency": 6},
]


def write_sessions(sessions, directory: str) -> str:
    rows = []
    t = 0
    for s, (gap, turns, family) in enumerate(sessions):
        t += gap
        ids = [family * 1000 + k for k in range(2)]  # a shared system prompt
        for k, (n_new, n_out, delay) in enumerate(turns):
            ids = ids + [10_000 + s * 100 + len(ids) + j for j in range(n_new)]
            row = {
                "session_id": f"s{s}",
                "input_length": 16 * len(ids) - s % 16,
                "output_length": n_out,
                "hash_ids": ids,
            }
            row.update({"timestamp": t} if k == 0 else {"delay": delay})
            rows.append(row)
    return str(write_jsonl(Path(directory) / "sessions.jsonl", rows))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions=session_strategy,
    engine=property_engine_strategy,
    workers=st.integers(1, 3),
    timing=st.sampled_from(TIMINGS),
    load=st.sampled_from(LOADS),
    router=st.sampled_from(["round_robin", "random"]),
    stop_ms=st.sampled_from([None, None, 250.0, 1200.0]),
    # without KV events a decode stretch takes its blocks in bulk, with them pass by pass
    kv_events=st.booleans(),
)
def test_fast_forward_gives_the_stepped_answer_on_random_sessions(
    sessions, engine, workers, timing, load, router, stop_ms, kv_events
):
    with tempfile.TemporaryDirectory() as directory:
        sections = {
            "workload": {
                "kind": "mooncake",
                "path": write_sessions(sessions, directory),
                "trace_block_size": 16,
            },
            "engine": engine,
            "timing": timing,
            "load": load,
            "topology": {"num_workers": workers},
            "router": {"kind": router},
            "stop": {"max_virtual_time_ms": stop_ms},
            "output": {"progress": "off", "kv_events": kv_events, "per_token": True},
        }
        fast, step, _, _ = run_both(sections)
    assert_same_run(fast, step)
