"""servesim against recorded Dynamo mocker runs (tests/golden/mocker/*; no mocker needed).

Each case directory holds a small trace, `case.json` (servesim Hydra overrides and the mocker's
exact keyword arguments), and the mocker's `summary.json` and per-request `requests.jsonl`
(its report_jsonl_path records, trimmed to the fields read here plus a few for debugging;
regenerate them with tests/golden/mocker/make_fixtures.py, see the README there). Cases a-j
run aggregated workers, cases k-y prefill/decode disaggregation (P/D), cases z1-z2 a G2 host
tier under aggregated workers, cases zx1-zx9 the KV router (in front of P/D, with dp_size 2,
with a KV-event lag), G3 and a cluster-shared host pool, cases zy1-zy4 the host-tier rules of
deferred admission, preemption with a store in flight (aggregated and P/D) and eviction of a
block a store is still reading, cases zw1-zw2 an output-0 P/D delivery at an instant with
another delivery and a spent budget with a delivered request and G2, cases zt1-zt9 the TRT-LLM
engine (guaranteed_no_evict admission, no preemption, clamps, P/D reservations), cases zz1-zz5
agentic replay, cases zs1-zs9 speculative decoding (bursts, first token from the first decode
step, the prefix hit one block shorter, the burst's KV reservation with its preemptions and
evictions, max_model_len, P/D; acceptance rates of 0 and 1 only: cases_spec.py).

For every case servesim is composed from conf/ with Hydra's compose API and simulated, then:

* per request: servesim's records (as its requests.jsonl writer renders them: the mocker's
  field names, worker ids as scheduler ids) are joined with the mocker's on (arrival_time_ms,
  input_length, requested output length) -- the mocker writes no request id; equal keys are
  paired in sorted order -- and every field of TIME_FIELDS, COUNT_FIELDS and ID_FIELDS that
  the fixture keeps must agree: times (arrival, first token, terminal and, in P/D, the
  lifecycle: prefill admission, source held, destination reserved and activated, decode
  admission, source released) to 0.1 ns (1e-7 ms; float noise is below 1e-10 ms here), so a
  pass priced 1 ns differently shows; reused tokens (prefill side, and decode side in P/D),
  output lengths and worker ids exactly; the terminal status too, with one alias
  (STATUS_ALIASES: a prompt no decode rank can hold is `failed` in the mocker, `rejected` in
  servesim);
* summary: every number the mocker reports (latency distributions, mean ITL, throughputs,
  prefix reuse, duration, counts, prefill and decode worker-seconds, GPUs per worker, GPU
  hours, ...) must agree to 1e-6 relative; ITL and per-user throughput percentiles, which the
  mocker reads from a DDSketch (0.1 % relative error), to 0.2 %; `committed_prefill_tokens`
  exactly (its own test).

Cases with a known, described difference from the mocker are strict xfails (KNOWN_* below), so
fixing servesim turns them into failures that ask for the marker to go; a summary key with a
documented semantic difference is left out of one case's comparison (SUMMARY_KEYS_LEFT_OUT).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import compare_dynamo_module

from servesim import Result, compose, simulate
from servesim.config.derived import role_engines
from servesim.rundir import write_requests_jsonl

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "mocker"
CASES = sorted(p.parent.name for p in FIXTURES.glob("*/case.json"))

TIME_REL = 1e-12
TIME_ABS_MS = 1e-7  # a tenth of a nanosecond: the mocker keeps pass durations in whole ns
SUMMARY_REL = 1e-6
SKETCH_REL = 2e-3

# Per-request fields compared when the fixture's records have them (the P/D lifecycle, the
# prefill worker and decode-side reuse only in the P/D cases k-y).
TIME_FIELDS = (
    "arrival_time_ms",
    "first_token_ms",
    "terminal_time_ms",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
)
COUNT_FIELDS = ("reused_input_tokens", "output_length", "decode_reused_input_tokens")
ID_FIELDS = ("prefill_worker_idx", "decode_worker_idx")  # scheduler ids (worker x dp + rank)
# A prompt that fits the prefill pool but never a decode rank's: the mocker ends it `failed`
# at source_held (output 0, source cancelled, no decode worker); servesim ends it `rejected`
# then, with a reason naming the decode pool. Everything else of the record must agree.
STATUS_ALIASES = {("rejected", "failed")}

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
    "prefill_worker_seconds",
    "decode_worker_seconds",
    "prefill_gpus_per_worker",
    "decode_gpus_per_worker",
    "gpu_hours",
)
# Percentiles the mocker reads from a DDSketch (0.1 % relative error) instead of the samples.
SKETCH_SUMMARY_KEYS = frozenset(
    f"{stat}_{name}"
    for stat in ("median", "p75", "p90", "p95", "p99")
    for name in ("itl_ms", "output_token_throughput_per_user")
)
# Compared elsewhere (committed_prefill_tokens), or not a number of the run.
NOT_COMPARED = frozenset(
    {
        "committed_prefill_tokens",
        "kv_eviction_policy",
        "_mocker_version",
        # agentic cases: not numbers (play outcomes have their own test), or the mocker's own
        # lifecycle log (a digest of its internal events, and their count)
        "agentic_graph",
        "agentic_play_outcomes",
        "agentic_lifecycle_digest",
        "agentic_lifecycle_event_count",
        # KV tier cases: the mocker's own G3 and shared-G2 statistics (nested dicts of job
        # counts and bytes; servesim reports its tiers in its own keys)
        "g3_offload",
        "g2_domains",
    }
)

COMMITTED = (
    "servesim's committed_prefill_tokens sums, over admissions, the sequence minus its prefix "
    "hit (this matches the mocker without preemption and in case h); with many preemptions in "
    "one pass (tight pools) the mocker counts differently (c: 38,583 vs 38,108; d: 40,097 vs "
    "37,647) and its exact rule was not recovered. Not one of the compared metrics."
)
# Cases i and j pin the two details of pass pricing that only show on half-nanosecond ties:
# a part is kept as seconds rounded to the ns, and the decode polynomial is a*(u*u) + b*u + c.

# Cases s-y are the smallest reproducers of P/D same-instant rules the larger P/D cases (and a
# review's fuzzing) first disagreed on (README.md in tests/golden/mocker gives the timelines);
# servesim now follows the mocker in each, and only committed_prefill_tokens after decode-side
# preemptions differs.
PD_COMMITTED = (
    "committed_prefill_tokens after decode-side preemptions: servesim counts a decode "
    "readmission's sequence minus its prefix hit, the mocker counts something else (case t, "
    "whose records all match: B readmitted with 32 of its 60 tokens cached; servesim 108, "
    "mocker 80) -- the rule was not recovered, as for cases c and d. Not one of the compared "
    "metrics."
)


KNOWN_PER_REQUEST: dict[str, str] = {}
KNOWN_SUMMARY: dict[str, str] = dict(KNOWN_PER_REQUEST)
# summary keys left out of one case's comparison, each with the documented reason
# (docs/validation.md, "Known semantic differences")
WORKER_SECONDS = (
    "worker-seconds (and GPU hours) are duration_ms x workers in servesim; the mocker counts to "
    "its last event, here a copy to G2 landing 300 ms after the last completion"
)
SUMMARY_KEYS_LEFT_OUT: dict[str, tuple[frozenset[str], str]] = {
    "zy4_host_fence_evicted_pinned": (
        frozenset({"decode_worker_seconds", "gpu_hours"}),
        WORKER_SECONDS,
    ),
    "zy10_g3_instant_read_latency": (
        frozenset({"decode_worker_seconds", "gpu_hours"}),
        "worker-seconds: the mocker counts to its last event, here a copy to G3 landing 1.1 ms "
        "after the last completion",
    ),
}
KNOWN_COMMITTED = {
    "c_tight_kv_lifo": COMMITTED,
    "d_tight_kv_fifo": COMMITTED,
    "n_pd_tight_decode": PD_COMMITTED,
    "t_pd_retry_after_preemption": PD_COMMITTED,
    "zy1_host_deferred_behind_load": COMMITTED,
    "zs8_tight_kv_lifo": COMMITTED,
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
    return simulate(compose([*case["servesim_overrides"], f"workload.path={trace}"]))


def mocker_records(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name / "requests.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def servesim_records(result: Result) -> list[dict[str, Any]]:
    """servesim's ended requests as its requests.jsonl writer renders them: the mocker's field
    names, worker ids as scheduler ids (worker x dp_size + rank)."""
    engines = role_engines(result.config)
    decode = engines.get("decode", engines.get("aggregated"))
    assert decode is not None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "requests.jsonl"
        write_requests_jsonl(
            result.requests,
            path,
            prefill_dp=engines["prefill"].dp_size if "prefill" in engines else 1,
            decode_dp=decode.dp_size,
        )
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def same_status(ours: str, ref: str) -> bool:
    return ours == ref or (ours, ref) in STATUS_ALIASES


def first_use_ids(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with each ID_FIELDS id renumbered 0, 1, ... in order of first use (by
    arrival, then first token): the KV router breaks a tie between equivalent targets at random
    (the mocker unseeded), so only the pattern of ids is compared."""
    out = [dict(r) for r in records]
    order = sorted(out, key=_order)
    for f in ID_FIELDS:
        ids: dict[Any, int] = {}
        for rec in order:
            if rec.get(f) is not None:
                rec[f] = ids.setdefault(rec[f], len(ids))
    return out


def per_request_mismatches(name: str) -> list[str]:
    """Every field of the fixture's records that servesim also reports (TIME_FIELDS,
    COUNT_FIELDS, ID_FIELDS; the P/D ones only where the fixture keeps them) and the status.
    Cases with `"worker_ids": "first_use"` (the KV router's) compare ids renumbered in order of
    first use on both sides."""
    ours, ref = servesim_records(servesim_run(name)), mocker_records(name)
    if _case(name).get("worker_ids") == "first_use":
        ours, ref = first_use_ids(ours), first_use_ids(ref)
    pairs, problems = join(ours, ref)
    for s, m in pairs:
        diffs = []
        for f in TIME_FIELDS:
            if f in m and not same_time(s[f], m[f]):
                diffs.append(f"{f} servesim {s[f]} mocker {m[f]}")
        for f in (*COUNT_FIELDS, *ID_FIELDS):
            if f in m and s[f] != m[f]:
                diffs.append(f"{f} servesim {s[f]} mocker {m[f]}")
        if not same_status(s["terminal_status"], m["terminal_status"]):
            diffs.append(f"terminal_status {s['terminal_status']} / {m['terminal_status']}")
        if diffs:
            problems.append(
                f"request {s['request_id']} (arrival {m['arrival_time_ms']}, in "
                f"{m['input_length']}, out {m['requested_output_length']}, worker "
                f"{s['prefill_worker_idx']}->{s['decode_worker_idx']} / "
                f"{m.get('prefill_worker_idx')}->{m['decode_worker_idx']}): " + "; ".join(diffs)
            )
    return problems


def summary_mismatches(name: str) -> list[str]:
    """Every number of the mocker's summary against servesim's (same key names)."""
    ours = servesim_run(name).summary
    ref = json.loads((FIXTURES / name / "summary.json").read_text())
    problems = [f"{k}: missing" for k in REQUIRED_SUMMARY_KEYS if k not in ours or k not in ref]
    left_out = SUMMARY_KEYS_LEFT_OUT.get(name, (frozenset(), ""))[0]
    policy = ours["metadata"]["kv_eviction_policy"]
    if policy != ref["kv_eviction_policy"]:
        problems.append(f"kv_eviction_policy: servesim {policy} mocker {ref['kv_eviction_policy']}")
    for key, b in ref.items():
        if key in NOT_COMPARED or key in left_out or (b is None and key not in ours):
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


@pytest.mark.parametrize("name", _params(KNOWN_SUMMARY))
def test_summary_matches_mocker(name: str) -> None:
    problems = summary_mismatches(name)
    assert not problems, _report(name, problems)


@pytest.mark.parametrize("name", _params(KNOWN_COMMITTED))
def test_committed_prefill_tokens_match_mocker(name: str) -> None:
    ours = servesim_run(name).summary["committed_prefill_tokens"]
    ref = json.loads((FIXTURES / name / "summary.json").read_text())["committed_prefill_tokens"]
    assert ours == ref


AGENTIC_CASES = [name for name in CASES if "agentic" in name]


@pytest.mark.parametrize("name", AGENTIC_CASES)
def test_play_outcomes_match_mocker(name: str) -> None:
    """Agentic cases: every play settles with the mocker's status, settle time, causal
    terminal and failing request."""
    ours = {
        o["play_id"]: o for o in servesim_run(name).summary["metadata"]["agentic_play_outcomes"]
    }
    ref = json.loads((FIXTURES / name / "summary.json").read_text())["agentic_play_outcomes"]
    assert sorted(ours) == sorted(o["play_id"] for o in ref)
    for o in ref:
        mine = ours[o["play_id"]]
        assert mine["status"] == o["status"], o["play_id"]
        for key in ("settled_at_ms", "causal_terminal_ms"):
            assert same_time(mine[key], o[key]), (o["play_id"], key, mine[key], o[key])
        assert mine["failure_request_id"] == o.get("failure_request_id"), o["play_id"]
        assert mine["failure_status"] == o.get("failure_status"), o["play_id"]


def test_fixtures_present() -> None:
    assert len(CASES) >= 8, f"expected the golden cases under {FIXTURES}, found {CASES}"
    for name in CASES:
        size = (FIXTURES / name / _case(name)["trace"]).stat().st_size
        assert size < 100_000, f"{name}: trace is {size} bytes; fixtures stay small"


@pytest.mark.parametrize("name", CASES)
def test_compare_cli_translates_engine_like_the_fixture(name: str) -> None:
    """experiments/compare_dynamo.py derives the mocker kwargs from servesim's config; for
    every golden case they must be exactly what the fixture's mocker run was given."""
    compare = compare_dynamo_module()
    case = _case(name)
    cfg = servesim_run(name).config
    assert compare.mocker_kwargs(cfg) == case["mocker_kwargs"]


def test_decode_pool_overflow_is_rejected_where_the_mocker_fails() -> None:
    """Case q: the prompts that fit the prefill pool but no decode rank are exactly the
    mocker's `failed` records; servesim ends them `rejected` at source_held with a reason."""
    name = "q_pd_decode_pool_too_small"
    df = servesim_run(name).requests
    ours = df[df["terminal_status"] == "rejected"]
    failed = [m for m in mocker_records(name) if m["terminal_status"] == "failed"]
    assert len(failed) == 6
    assert sorted(zip(ours["input_length"], ours["requested_output_length"], strict=True)) == (
        sorted((m["input_length"], m["requested_output_length"]) for m in failed)
    )
    assert all("decode worker's pool" in reason for reason in ours["reason"])
    assert (ours["terminal_ms"] == ours["source_held_ms"]).all()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("link=infiniband", "link.latency_ms"),
        ("link.contention=fifo_lanes", "link.contention"),
        ("link.state_bytes=4096", "link.state_bytes"),
        ("link.pairs=[{decode_workers:[0],bandwidth_gbps:5}]", "link.pairs"),
        ("router=random", "router=random"),
    ],
)
def test_compare_cli_refuses_what_the_mocker_cannot_express(override: str, needle: str) -> None:
    compare = compare_dynamo_module()
    trace = FIXTURES / "k_pd_1p1d_instant" / "trace.jsonl"
    shape = compare.Shape(prefill=1, decode=1)
    cfg = compare.compose_run_config(trace, shape, [override])
    with pytest.raises(compare.UnsupportedConfig, match=needle.replace("[", r"\[")):
        compare.mocker_kwargs(cfg)


def test_compare_cli_pd_shapes() -> None:
    compare = compare_dynamo_module()
    assert compare.case_shapes(None, "1x1,2P2D", []) == [
        compare.Shape(prefill=1, decode=1),
        compare.Shape(prefill=2, decode=2),
    ]
    assert compare.case_shapes(None, None, ["topology=disagg"]) == [compare.Shape()]
    assert compare.case_shapes("1,2", None, []) == [compare.Shape(workers=1), compare.Shape(2)]
    with pytest.raises(ValueError, match="--pd"):
        compare.case_shapes("2", None, ["topology=disagg"])
