"""servesim against the mocker: summary metrics side by side, requests joined one by one."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servesim import Result
from servesim.config.derived import role_engines
from servesim.rundir import write_requests_jsonl

Kind = Literal["latency", "throughput", "reuse"]
TARGETS: dict[Kind, float] = {"latency": 0.02, "throughput": 0.01, "reuse": 0.01}


@dataclass(frozen=True)
class Metric:
    key: str
    kind: Kind


METRICS: tuple[Metric, ...] = (
    *(
        Metric(f"{stat}_{name}_ms", "latency")
        for name in ("ttft", "itl", "tpot", "e2e_latency")
        for stat in ("mean", "median", "p90")
    ),
    Metric("request_throughput_rps", "throughput"),
    Metric("output_throughput_tok_s", "throughput"),
    Metric("total_throughput_tok_s", "throughput"),
    Metric("prefix_cache_reused_ratio", "reuse"),
    Metric("duration_ms", "throughput"),
    Metric("completed_requests", "throughput"),
    # pool size x duration per pool (prefill is 0 for aggregated workers) and their GPU hours
    Metric("prefill_worker_seconds", "throughput"),
    Metric("decode_worker_seconds", "throughput"),
    Metric("gpu_hours", "throughput"),
    # agentic replay: a completed play's first arrival to last terminal (absent elsewhere)
    Metric("mean_trajectory_e2e_latency_ms", "latency"),
    Metric("completed_trajectories", "throughput"),
)


# --------------------------------------------------------------------------- comparison


@dataclass
class Row:
    metric: str
    kind: Kind
    servesim: float | None
    mocker: float | None
    diff: float | None  # relative (latency, throughput) or absolute (reuse); None: missing
    target: float
    ok: bool


def difference(kind: Kind, ours: float | None, ref: float | None) -> float | None:
    """servesim minus mocker: relative to the mocker's value, or absolute for reuse."""
    if ours is None or ref is None:
        return None
    if kind == "reuse":
        return ours - ref
    if ref == 0:
        return 0.0 if ours == 0 else math.inf
    return (ours - ref) / abs(ref)


def compare(servesim: dict[str, Any], mocker: dict[str, Any]) -> list[Row]:
    """One row per metric; a value missing on one side only misses its target."""
    rows = []
    for m in METRICS:
        ours, ref = servesim.get(m.key), mocker.get(m.key)
        diff = difference(m.kind, ours, ref)
        target = TARGETS[m.kind]
        ok = (ours is None and ref is None) if diff is None else abs(diff) <= target
        rows.append(Row(m.key, m.kind, ours, ref, diff, target, ok))
    return rows


# --------------------------------------------------------------------------- per request

TIME_ABS_MS = 1e-7  # a tenth of a nanosecond: the mocker keeps pass durations in whole ns
TIME_REL = 0.0  # float noise stays below 1e-9 ms even at 4.6e6 ms

TIME_FIELDS = ("arrival_time_ms", "first_token_ms", "terminal_time_ms")
# the P/D lifecycle (null on both sides for aggregated workers)
PD_TIME_FIELDS = (
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
)
COUNT_FIELDS = ("reused_input_tokens", "output_length")
# scheduler ids (worker x dp_size + rank), as the mocker writes them
ID_FIELDS = ("prefill_worker_idx", "decode_worker_idx")
# A prompt that fits the prefill pool but can never fit a decode rank's pool (or reaches the
# decode side's max_model_len): the mocker ends it `failed` at source_held (output 0, source
# cancelled); servesim ends it `rejected` then, with a reason. Same request, same times.
STATUS_ALIASES = {("rejected", "failed")}


@dataclass
class PerRequest:
    """servesim's requests joined with the mocker's report_jsonl_path records."""

    joined: int
    unmatched: int  # records of (input, output) groups whose sizes differ between the sides
    off_tolerance: int  # some time (arrival, first token, terminal, P/D lifecycle) > TIME_ABS_MS
    count_mismatches: int  # reused_input_tokens or output_length differ
    worst_abs_ms: float
    id_mismatches: int = 0  # prefill / decode scheduler id differ
    status_mismatches: int = 0  # terminal_status differs (other than STATUS_ALIASES)
    status_aliased: int = 0  # servesim `rejected` where the mocker says `failed`
    pd_fields: bool = False  # the P/D lifecycle fields were compared (non-null somewhere)
    off_by_field: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.unmatched
            or self.off_tolerance
            or self.count_mismatches
            or self.id_mismatches
            or self.status_mismatches
        )

    def line(self) -> str:
        times = "time (arrival, first token, terminal" + (
            ", P/D lifecycle)" if self.pd_fields else ")"
        )
        out = (
            f"per request: {self.joined:,} joined, {self.unmatched} unmatched; "
            f"{self.off_tolerance} with a {times} off by > {TIME_ABS_MS:g} ms "
            f"(worst {self.worst_abs_ms:.2e} ms); {self.count_mismatches} with "
            f"different reused tokens or output length; {self.id_mismatches} with different "
            f"worker ids; {self.status_mismatches} with a different terminal status"
        )
        if self.status_aliased:
            out += f" ({self.status_aliased} servesim `rejected` = mocker `failed`)"
        bad = {k: v for k, v in self.off_by_field.items() if v}
        if bad:
            out += " [off: " + ", ".join(f"{k} {v}" for k, v in bad.items()) + "]"
        return out


def servesim_records(result: Result) -> list[dict[str, Any]]:
    """servesim's ended requests as its requests.jsonl writer renders them (the mocker's field
    names; worker ids are scheduler ids, worker x dp_size + rank)."""
    engines = role_engines(result.config)
    decode = engines.get("decode", engines.get("aggregated"))
    assert decode is not None
    with tempfile.TemporaryDirectory(prefix="compare_dynamo_") as tmp:
        path = Path(tmp) / "requests.jsonl"
        write_requests_jsonl(
            result.requests,
            path,
            prefill_dp=engines["prefill"].dp_size if "prefill" in engines else 1,
            decode_dp=decode.dp_size,
        )
        with path.open() as fh:
            return [json.loads(line) for line in fh if line.strip()]


def _join_order(rec: dict[str, Any]) -> tuple[float, float, float]:
    first = rec["first_token_ms"]
    return (
        round(rec["arrival_time_ms"], 3),
        -1.0 if first is None else first,
        rec["terminal_time_ms"],
    )


def join_records(
    ours: list[dict[str, Any]], ref: list[dict[str, Any]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
    """Pairs of (servesim, mocker) records and the number of records left unpaired. The
    mocker writes no request id: records are grouped on (input length, requested output) and
    paired in (arrival, first token, terminal) order, so equal keys pair in sorted order and
    computed arrivals (session turns) may differ by float rounding."""
    groups: dict[tuple[int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for side, records in enumerate((ours, ref)):
        for rec in records:
            key = (rec["input_length"], rec["requested_output_length"])
            groups.setdefault(key, ([], []))[side].append(rec)
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    unmatched = 0
    for a, b in groups.values():
        if len(a) != len(b):
            unmatched += len(a) + len(b)
            continue
        pairs.extend(zip(sorted(a, key=_join_order), sorted(b, key=_join_order), strict=True))
    return pairs, unmatched


def same_status(ours: str, ref: str) -> bool:
    return ours == ref or (ours, ref) in STATUS_ALIASES


def per_request(result: Result, mocker_jsonl: Path) -> PerRequest:
    """Join servesim's requests with the mocker's records (`join_records`), then compare the
    times (arrival, first token, terminal and the P/D lifecycle) to TIME_ABS_MS, reused
    tokens, output lengths, worker (scheduler) ids and terminal status."""
    with mocker_jsonl.open() as fh:
        mocker = [json.loads(line) for line in fh if line.strip()]
    pairs, unmatched = join_records(servesim_records(result), mocker)
    out = PerRequest(0, unmatched, 0, 0, 0.0)
    out.off_by_field = dict.fromkeys((*TIME_FIELDS, *PD_TIME_FIELDS), 0)
    for a, b in pairs:
        out.joined += 1
        bad = False
        for f in (*TIME_FIELDS, *PD_TIME_FIELDS):
            x, y = a.get(f), b.get(f)
            if x is None or y is None:
                if (x is None) != (y is None):
                    bad = True
                    out.off_by_field[f] += 1
                continue
            out.pd_fields |= f in PD_TIME_FIELDS
            out.worst_abs_ms = max(out.worst_abs_ms, abs(x - y))
            if not math.isclose(x, y, rel_tol=TIME_REL, abs_tol=TIME_ABS_MS):
                bad = True
                out.off_by_field[f] += 1
        out.off_tolerance += bad
        out.count_mismatches += any(a[f] != b[f] for f in COUNT_FIELDS)
        out.id_mismatches += any(a.get(f) != b.get(f) for f in ID_FIELDS)
        if a["terminal_status"] != b["terminal_status"]:
            if same_status(a["terminal_status"], b["terminal_status"]):
                out.status_aliased += 1
            else:
                out.status_mismatches += 1
    return out
