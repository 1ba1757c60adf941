"""A run's outcome: its tables and summary, built once from the recorder after the event loop,
and the run directory they are written to."""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim import rundir
from servesim.agentic import report as agentic_report
from servesim.agentic.lanes import AgenticReplay
from servesim.cluster.base import total_workers
from servesim.config.derived import role_engines
from servesim.config.plan import Plan, make_plan
from servesim.config.schema import RunConfig
from servesim.engine.speculative import speculative_settings
from servesim.metrics.summary import routing_summary, summarize, tier_summary, wall_summary
from servesim.metrics.tables import (
    kv_events_table,
    kv_table,
    passes_table,
    requests_table,
    routing_table,
    time_weighted_mean,
    transfers_table,
)
from servesim.rundir import write_requests_jsonl
from servesim.speed.parallel import Part


class BuiltOnFirstRead:
    """A dataclass field holding a DataFrame, or a function that builds it: the first read
    calls the function and keeps what it returns. The value sits in the instance's
    `__dict__` under the field's own name, so `vars()` and `dataclasses.replace` carry an
    unbuilt table along without building it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name]
        if callable(value):
            value = obj.__dict__[self.name] = value()
        return value

    def __set__(self, obj: Any, value: pd.DataFrame | Callable[[], pd.DataFrame]) -> None:
        obj.__dict__[self.name] = value


@dataclass
class Result:
    """Tables and summary of one run. The passes table (a row per engine pass, millions in a
    long run) is built when it is first read, so a run read only through its summary and
    requests does not pay for it."""

    config: RunConfig
    summary: dict[str, Any]
    requests: pd.DataFrame
    passes: pd.DataFrame  # built on first read: see BuiltOnFirstRead, installed below
    kv: pd.DataFrame
    kv_events: pd.DataFrame
    transfers: pd.DataFrame
    routing: pd.DataFrame = field(default_factory=pd.DataFrame)
    token_times: dict[str, np.ndarray] = field(default_factory=dict)
    plays: pd.DataFrame = field(default_factory=pd.DataFrame)  # agentic replay: per play
    plan: Plan | None = None  # what the run derived from `config`

    def write(self, out_dir: str | Path) -> Path:
        """Write the tables (Parquet, or CSV if configured), then summary.json, to `out_dir`,
        after removing what an earlier run left there (model/rundir.py: each file is renamed
        into place once whole; the summary comes last, so its presence means a whole run)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        rundir.clear(out)
        output = self.config.output
        if output.tables:
            tables = {"requests": self.requests, "passes": self.passes, "kv": self.kv}
            if len(self.kv_events):
                tables["kv_events"] = self.kv_events
            if len(self.transfers):
                tables["transfers"] = self.transfers
            if len(self.routing):
                tables["routing"] = self.routing
            if len(self.plays):
                tables["plays"] = self.plays
            for name, df in tables.items():
                rundir.write_table(df, out / f"{name}.{output.format}")
        if output.per_request_jsonl:
            engines = (self.plan or make_plan(self.config)).engines
            write_requests_jsonl(
                self.requests,
                out / rundir.REQUESTS_JSONL,
                prefill_dp=engines["prefill"].dp_size if "prefill" in engines else 1,
                decode_dp=engines.get("decode", engines.get("aggregated")).dp_size,  # type: ignore[union-attr]
            )
        rundir.write_json(out / rundir.SUMMARY, self.summary)
        return out


# installed after the dataclass is made, so that `passes` stays a plain required field of the
# generated __init__ (which then stores through the descriptor)
setattr(Result, "passes", BuiltOnFirstRead("passes"))  # noqa: B010


@functools.cache
def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("servesim", "simpy", "numpy", "pandas", "pydantic", "hydra-core"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def collect(
    plan: Plan,
    part: Part,
    replay: AgenticReplay | None,
    wall_start: float,
    processes: int,
    why_one: str,
) -> Result:
    """The tables and summary of a run that has ended (`part`: all of it, or its parts
    merged), its unfinished requests recorded."""
    cfg = plan.cfg
    recorder = part.recorder
    # levels hold until the last thing happened: the stop, if it cut requests off
    activity_end = part.stopped_at if part.in_flight else recorder.last_event_ms
    # each table's rows go as soon as it is built: the end of a long run holds the tables,
    # not the tables and every row they came from
    requests = requests_table(recorder)
    recorder.table_built("requests")
    plays = pd.DataFrame()
    measured = requests
    if replay is not None:
        columns = agentic_report.request_columns(replay)
        requests = requests.merge(columns, on="request_id", how="left")
        plays = agentic_report.plays_table(replay)
        # preparation (primer, warmup) requests are recorded but never measured
        measured = requests[~requests["phase"].isin(agentic_report.PREPARATION)]
    transfers = transfers_table(recorder)
    recorder.table_built("transfers")

    @functools.cache  # once, whichever copy of the result reads it first
    def passes() -> pd.DataFrame:
        table = passes_table(recorder)
        recorder.table_built("passes")
        return table

    kv = kv_table(recorder)
    recorder.table_built("kv")
    wall_ms = (time.perf_counter() - wall_start) * 1000.0
    summary = summarize(
        measured,
        recorder.itl_gaps_ms,
        **plan.pool_sizes(),
        slo=cfg.slo,
    )
    ranks = part.ranks
    summary["committed_prefill_tokens"] = sum(r.committed_prefill_tokens for r in ranks)
    summary["n_preemptions"] = int(requests["n_preemptions"].sum())
    summary["n_retractions"] = sum(r.retractions for r in ranks)
    summary["n_readmissions"] = int(requests["n_readmissions"].sum())
    summary["n_kv_evictions"] = sum(r.evictions for r in ranks)
    summary["n_passes"] = recorder.n_passes
    skipped = part.skipped
    summary["skipped_trace_rows"] = skipped.count if skipped is not None else 0
    if skipped is not None and skipped.count:
        summary["skipped_trace_row_examples"] = skipped.examples
    used = time_weighted_mean(kv, "used_blocks", activity_end, "device") if len(kv) else None
    if used is not None and len(used):
        capacity = {r.name: r.capacity_blocks for r in ranks}
        ratios = [u / capacity[name] for name, u in used.items()]
        summary["mean_kv_used_ratio"] = float(np.mean(ratios))
    summary.update(tier_summary(part.tier_pools, kv, transfers, activity_end))
    routing = routing_table(recorder)
    recorder.table_built("routing")
    summary.update(routing_summary(routing))
    summary["terminal_status_counts"] = {
        k: int(v) for k, v in measured["terminal_status"].value_counts().sort_index().items()
    }
    if replay is not None:
        summary.update(agentic_report.trajectory_summary(plays))
    summary["metadata"] = {
        # host time and simulator speed: the only keys that differ between two runs of one
        # config and seed
        "wall": wall_summary(summary, wall_ms),
        "seed": cfg.seed,
        "llm": cfg.llm.name,
        "hardware": cfg.hardware.name,
        "engine": cfg.engine.kind,
        # speculative decoding as used: k, the rates after padding, the seed (None: off)
        "speculative": _speculative(cfg),
        "timing": cfg.timing.kind,
        "topology": cfg.topology.kind,
        "num_workers": total_workers(cfg),
        **plan.pool_sizes(),
        "router": cfg.router.kind,
        "workload": cfg.workload.kind,
        "load": cfg.load.kind,
        # OS processes the workers were replayed in (speed.processes), and why one if more
        # were asked for
        "processes": processes,
        **({"processes_note": why_one} if why_one else {}),
        # per rank: aggregated workers, or the decode pool (prefill_num_gpu_blocks for P/D)
        **{
            ("prefill_num_gpu_blocks" if role == "prefill" else "num_gpu_blocks"): blocks
            for role, blocks in plan.gpu_blocks.items()
        },
        # what a KV transfer charges per token (the llm geometry unless link overrides it)
        "kv_bytes_per_token": plan.transfer_bytes_per_token,
        "kv_eviction_policy": "lru",
        "versions": _versions(),
        "config": cfg.model_dump(mode="json"),
    }
    if replay is not None:
        summary["metadata"].update(agentic_report.metadata(replay, cfg.llm.name, requests))
    kv_events = kv_events_table(recorder)
    recorder.table_built("kv_events")
    token_times = {k: np.frombuffer(v, dtype=float) for k, v in recorder.token_times.items()}
    return Result(
        cfg,
        summary,
        requests,
        passes,
        kv,
        kv_events,
        transfers,
        routing,
        token_times,
        plays,
        plan,
    )


def _speculative(cfg: RunConfig) -> dict[str, Any] | None:
    """The speculative decoding settings of the run's engine (per role in P/D), or None when
    no engine speculates."""
    engines = role_engines(cfg)
    if cfg.topology.kind != "disagg":
        return speculative_settings(engines["aggregated"])
    used = {role: speculative_settings(e) for role, e in engines.items()}
    return None if all(v is None for v in used.values()) else used
