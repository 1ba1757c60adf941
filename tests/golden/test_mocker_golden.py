"""servesim against recorded Dynamo mocker runs (tests/golden/mocker/*; no mocker needed).

Each case directory holds a small trace, `case.json` (servesim Hydra overrides and the mocker's
exact keyword arguments), and the mocker's `summary.json` and per-request `requests.jsonl`
(its report_jsonl_path records, trimmed to the fields read here plus a few for debugging;
regenerate them with tests/golden/mocker/make_fixtures.py, see the README there).

For every case servesim is composed from conf/ with Hydra's compose API and simulated, then:

* per request: records are joined on (arrival_time_ms, input_length, requested output
  length) -- the mocker writes no request id; equal keys are paired in sorted order -- and
  first_token_ms, terminal_time_ms, reused_input_tokens and output_length must agree to
  0.1 ns (1e-7 ms; float noise is below 1e-11 ms here), so a pass priced 1 ns differently
  shows;
* summary: every number the mocker reports (latency distributions, mean ITL, throughputs,
  prefix reuse, duration, counts, ...) must agree to 1e-6 relative; ITL and per-user
  throughput percentiles, which the mocker reads from a DDSketch (0.1 % relative error),
  to 0.2 %; `committed_prefill_tokens` exactly (its own test).

Cases with a known, described difference from the mocker are strict xfails (KNOWN_* below), so
fixing servesim turns them into failures that ask for the marker to go.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from model import Result, simulate, validate_config

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"
FIXTURES = Path(__file__).resolve().parent / "mocker"
CASES = sorted(p.parent.name for p in FIXTURES.glob("*/case.json"))

TIME_REL = 1e-12
TIME_ABS_MS = 1e-7  # a tenth of a nanosecond: the mocker keeps pass durations in whole ns
SUMMARY_REL = 1e-6
SKETCH_REL = 2e-3

# The keys the comparison is about; each must be present on both sides.
REQUIRED_SUMMARY_KEYS = (
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "p90_e2e_latency_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p90_itl_ms",
    "request_throughput_rps",
    "input_throughput_tok_s",
    "output_throughput_tok_s",
    "total_throughput_tok_s",
    "prefix_cache_reused_ratio",
    "duration_ms",
    "completed_requests",
)
# Percentiles the mocker reads from a DDSketch (0.1 % relative error) instead of the samples.
SKETCH_SUMMARY_KEYS = frozenset(
    f"{stat}_{name}"
    for stat in ("median", "p75", "p90", "p95", "p99")
    for name in ("itl_ms", "output_token_throughput_per_user")
)
# Compared elsewhere (committed_prefill_tokens), or not a number of the run.
NOT_COMPARED = frozenset({"committed_prefill_tokens", "kv_eviction_policy", "_mocker_version"})

COMMITTED = (
    "servesim's committed_prefill_tokens sums, over admissions, the sequence minus its prefix "
    "hit (this matches the mocker without preemption and in case h); with many preemptions in "
    "one pass (tight pools) the mocker counts differently (c: 38,583 vs 38,108; d: 40,097 vs "
    "37,647) and its exact rule was not recovered. Not one of the compared metrics."
)
# Cases i and j pin the two details of pass pricing that only show on half-nanosecond ties:
# a part is kept as seconds rounded to the ns, and the decode polynomial is a*(u*u) + b*u + c.
KNOWN_PER_REQUEST: dict[str, str] = {}
KNOWN_COMMITTED = {
    "c_tight_kv_lifo": COMMITTED,
    "d_tight_kv_fifo": COMMITTED,
}


def _params(known: dict[str, str]) -> list[Any]:
    """Every case; those with a known, described difference are strict xfails."""
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=known[name]))
        if name in known
        else name
        for name in CASES
    ]


def _case(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "case.json").read_text())


@cache
def servesim_run(name: str) -> Result:
    """servesim on a case, composed exactly as `servesim` would compose the overrides."""
    case = _case(name)
    trace = FIXTURES / name / case["trace"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*case["servesim_overrides"], f"workload.path={trace}"])
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return simulate(validate_config(cast(dict[str, Any], data)))


def mocker_records(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name / "requests.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def servesim_records(result: Result) -> list[dict[str, Any]]:
    df = result.requests
    df = df[df["terminal_status"] != "incomplete"]
    out = []
    for row in df.itertuples(index=False):
        out.append(
            {
                "request_id": row.request_id,
                "arrival_time_ms": row.arrival_ms,
                "input_length": int(row.input_length),
                "requested_output_length": int(row.requested_output_length),
                "output_length": int(row.output_length),
                "first_token_ms": None if pd.isna(row.first_token_ms) else row.first_token_ms,
                "terminal_time_ms": row.terminal_ms,
                "reused_input_tokens": int(row.reused_input_tokens),
                "terminal_status": row.terminal_status,
                "worker": row.decode_worker_idx,
            }
        )
    return out


def _order(rec: dict[str, Any]) -> tuple[float, float, float, int]:
    ft = rec["first_token_ms"]
    return (
        round(rec["arrival_time_ms"], 3),
        -1.0 if ft is None else ft,
        rec["terminal_time_ms"],
        rec["reused_input_tokens"],
    )


def join(
    servesim: list[dict[str, Any]], mocker: list[dict[str, Any]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[str]]:
    """Pair records on (arrival, input length, requested output). Arrival times of later
    session turns are computed by both simulators, so records are grouped on the two lengths
    and paired in arrival order (ties: by first token, terminal time); the arrivals are then
    compared like any other time."""
    groups: dict[tuple[int, int], list[list[dict[str, Any]]]] = defaultdict(lambda: [[], []])
    for side, recs in ((0, servesim), (1, mocker)):
        for rec in recs:
            groups[(rec["input_length"], rec["requested_output_length"])][side].append(rec)
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    problems: list[str] = []
    for key, (s, m) in sorted(groups.items()):
        if len(s) != len(m):
            problems.append(f"(input, output)={key}: servesim {len(s)} records, mocker {len(m)}")
            continue
        pairs.extend(zip(sorted(s, key=_order), sorted(m, key=_order), strict=True))
    return pairs, problems


def same_time(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=TIME_REL, abs_tol=TIME_ABS_MS)


def per_request_mismatches(name: str) -> list[str]:
    pairs, problems = join(servesim_records(servesim_run(name)), mocker_records(name))
    for s, m in pairs:
        diffs = []
        for f in ("arrival_time_ms", "first_token_ms", "terminal_time_ms"):
            if not same_time(s[f], m[f]):
                diffs.append(f"{f} servesim {s[f]} mocker {m[f]}")
        for f in ("reused_input_tokens", "output_length"):
            if s[f] != m[f]:
                diffs.append(f"{f} servesim {s[f]} mocker {m[f]}")
        if s["terminal_status"] != m["terminal_status"]:
            diffs.append(f"terminal_status {s['terminal_status']} / {m['terminal_status']}")
        if diffs:
            problems.append(
                f"request {s['request_id']} (arrival {m['arrival_time_ms']}, in "
                f"{m['input_length']}, out {m['requested_output_length']}, worker "
                f"{s['worker']}/{m['decode_worker_idx']}): " + "; ".join(diffs)
            )
    return problems


def summary_mismatches(name: str) -> list[str]:
    """Every number of the mocker's summary against servesim's (same key names)."""
    ours = servesim_run(name).summary
    ref = json.loads((FIXTURES / name / "summary.json").read_text())
    problems = [f"{k}: missing" for k in REQUIRED_SUMMARY_KEYS if k not in ours or k not in ref]
    policy = ours["metadata"]["kv_eviction_policy"]
    if policy != ref["kv_eviction_policy"]:
        problems.append(f"kv_eviction_policy: servesim {policy} mocker {ref['kv_eviction_policy']}")
    for key, b in ref.items():
        if key in NOT_COMPARED or (b is None and key not in ours):
            continue  # e.g. power_w: not modelled by servesim, null in the mocker
        a = ours.get(key)
        rel = SKETCH_REL if key in SKETCH_SUMMARY_KEYS else SUMMARY_REL
        if a is None or b is None:
            ok = a is None and b is None
        else:
            ok = math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
        if not ok:
            problems.append(f"{key}: servesim {a} mocker {b} (tolerance {rel:g} relative)")
    return problems


def _report(name: str, problems: list[str], limit: int = 15) -> str:
    head = "\n  ".join(problems[:limit])
    more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{name}: {len(problems)} mismatches\n  {head}{more}"


@pytest.mark.parametrize("name", _params(KNOWN_PER_REQUEST))
def test_per_request_matches_mocker(name: str) -> None:
    problems = per_request_mismatches(name)
    assert not problems, _report(name, problems)


@pytest.mark.parametrize("name", CASES)
def test_summary_matches_mocker(name: str) -> None:
    problems = summary_mismatches(name)
    assert not problems, _report(name, problems)


@pytest.mark.parametrize("name", _params(KNOWN_COMMITTED))
def test_committed_prefill_tokens_match_mocker(name: str) -> None:
    ours = servesim_run(name).summary["committed_prefill_tokens"]
    ref = json.loads((FIXTURES / name / "summary.json").read_text())["committed_prefill_tokens"]
    assert ours == ref


def test_fixtures_present() -> None:
    assert len(CASES) >= 8, f"expected the golden cases under {FIXTURES}, found {CASES}"
    for name in CASES:
        size = (FIXTURES / name / _case(name)["trace"]).stat().st_size
        assert size < 100_000, f"{name}: trace is {size} bytes; fixtures stay small"


@cache
def _compare_module() -> ModuleType:
    path = REPO / "experiments" / "compare_dynamo.py"
    spec = importlib.util.spec_from_file_location("compare_dynamo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", CASES)
def test_compare_cli_translates_engine_like_the_fixture(name: str) -> None:
    """experiments/compare_dynamo.py derives the mocker kwargs from servesim's config; for
    every golden case they must be exactly what the fixture's mocker run was given."""
    compare = _compare_module()
    case = _case(name)
    cfg = servesim_run(name).config
    assert compare.mocker_kwargs(cfg) == case["mocker_kwargs"]
