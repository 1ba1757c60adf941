"""What an agentic replay reports: the `plays` table, trajectory statistics, and the metadata
sections (`agentic_graph`, `agentic_projection`, `agentic_snapshots`, `agentic_phases`,
`agentic_profile`, `agentic_qualification`) placed at the top level of summary metadata."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from servesim.agentic.lanes import BARRIER, PHASES_SCHEMA, PRIMER, WARMUP, AgenticReplay
from servesim.metrics.recorder import COMPLETED
from servesim.metrics.summary import distribution

# agentic replay checks lifecycle semantics, not accuracy (the rules: config/rules.py)
QUALIFICATION = "functional_only"
PREPARATION = (PRIMER, WARMUP)
REQUEST_AGENTIC_COLUMNS = ["request_id", "play_id", "source_request_id", "lane", "phase"]


def plays_table(replay: AgenticReplay) -> pd.DataFrame:
    """One row per play instance, in the order the plays started."""
    df = pd.DataFrame.from_records([run.record() for run in replay.runs])
    return df.astype({"lane": "Int64"}) if len(df) else df


def request_columns(replay: AgenticReplay) -> pd.DataFrame:
    """Per request: its play instance, source node, lane and phase (to join on request_id)."""
    df = pd.DataFrame.from_records(replay.request_rows, columns=REQUEST_AGENTIC_COLUMNS)
    return df.astype({"lane": "Int64"})


def trajectory_summary(plays: pd.DataFrame) -> dict[str, Any]:
    """Dynamo's trajectory keys: counts by outcome and the spread of a completed play's
    first arrival to last terminal."""
    status = plays["status"] if len(plays) else pd.Series([], dtype=object)
    done = int((status == "completed").sum())
    out: dict[str, Any] = {
        "total_trajectories": int(len(status)),
        "completed_trajectories": done,
        # Dynamo's meaning: every play that did not complete (failed ones included)
        "incomplete_trajectories": int(len(status)) - done,
        "failed_trajectories": int((status == "failed").sum()),
    }
    e2e = plays.loc[status == "completed", "trajectory_e2e_ms"] if len(plays) else []
    out.update(distribution(np.asarray(e2e, dtype=float), "trajectory_e2e_latency"))
    out["p50_trajectory_e2e_latency_ms"] = out["median_trajectory_e2e_latency_ms"]
    return out


def metadata(replay: AgenticReplay, target_model: str, requests: pd.DataFrame) -> dict[str, Any]:
    """The agentic metadata sections, each a top-level key of summary metadata."""
    graph = replay.graph
    opts = replay.options
    return {
        "agentic_graph": {
            "variant": graph.variant,
            "path": graph.path,
            "source": graph.source,
            "graph_digest": replay.digest,
            "block_size": graph.block_size,
            "hash_id_scope": graph.hash_id_scope,
            "node_count": len(graph.nodes),
            "play_count": len(graph.plays),
            "source_models": list(graph.source_models),
        },
        "agentic_projection": {
            "policy": "project_to_configured_target",
            "source_models": list(graph.source_models),
            "target_model": target_model,
        },
        "agentic_lanes": opts.agentic_lanes,
        "agentic_lane_assignment": opts.agentic_lane_assignment,
        "agentic_snapshots": replay.snapshots,
        "agentic_phases": _phases(replay),
        "agentic_profile": _profile(replay, requests),
        "agentic_play_outcomes": [
            {
                "play_id": run.instance_id,
                "status": run.status,
                "causal_terminal_ms": _num(run.causal_terminal_ms),
                "settled_at_ms": _num(run.settled_at_ms),
                "failure_request_id": run.failure[2] if run.failure else None,
                "failure_status": run.failure_status,
            }
            for run in replay.runs
        ],
        "agentic_qualification": QUALIFICATION,
        **(
            {"weka_nested_timestamp_basis": graph.source["nested_timestamp_basis"]}
            if graph.source and "nested_timestamp_basis" in graph.source
            else {}
        ),
    }


def _num(x: float) -> float | None:
    return None if x is None or x != x else float(x)


def _phases(replay: AgenticReplay) -> dict[str, Any]:
    warm = replay.options.agentic_warmup
    return {
        "schema": PHASES_SCHEMA,
        "warmup": warm,
        "phase": replay.phase if warm else "profile" if replay.profile else "replay",
        "barrier_condition": BARRIER if warm else None,
        "profile_start_ms": replay.profile_start_ms if replay.phase != "aborted" else None,
        "finished_at_ms": replay.env.now,
        "failure_request_id": replay.prep_failure[0] if replay.prep_failure else None,
        "failure_reason": replay.prep_failure[1] if replay.prep_failure else None,
        "lanes": sorted(replay.prep_lanes, key=lambda r: r["lane_id"]),
        "requests": replay.prep_requests,
    }


def _profile(replay: AgenticReplay, requests: pd.DataFrame) -> dict[str, Any] | None:
    """The profile's deadlines and counts (None when no profile was configured)."""
    if replay.options.agentic_profile is None:
        return None
    prof = dict(replay.profile or {"options": replay.options.agentic_profile.model_dump()})
    measured = requests[~requests["phase"].isin(PREPARATION)]
    ok = measured[measured["terminal_status"] == COMPLETED]
    issued = measured[measured["arrival_ms"].notna()]
    canceled = measured["reason"].str.startswith("canceled").sum()
    never = measured["reason"].str.startswith("never issued").sum()
    runs = [r for r in replay.runs if r.phase != "aborted"]
    first = float(ok["arrival_ms"].min()) if len(ok) else None
    last = float(ok["last_token_ms"].max()) if len(ok) else None
    span = (last - first) if first is not None and last is not None else None
    prof.update(
        {
            "admission_closed": not replay.admission_open(),
            "finished_at_ms": replay.env.now,
            "cancel_drain_timed_out": False,  # offline cancellations are acknowledged at once
            "unsettled_server_requests": int(replay.cluster.n_in_flight),
            "plays_started": len(runs),
            "client_completed_plays": sum(r.status == "completed" for r in runs),
            "retired_plays": sum(r.settled.triggered for r in runs),
            "issued_requests": int(len(issued)),
            "successful_requests": int(len(ok)),
            "canceled_requests": int(canceled),
            "never_issued_requests": int(never),
            "client_in_flight": int(replay.client_in_flight),
            "first_request_ms": float(issued["arrival_ms"].min()) if len(issued) else None,
            "last_successful_response_ms": last,
            "observation_duration_ms": span,
            "successful_request_throughput": (len(ok) / (span / 1000.0)) if span else None,
            "corpus_cursor": replay._cursor,
            "idle_shifts": replay.idle_shifts,
        }
    )
    return prof
