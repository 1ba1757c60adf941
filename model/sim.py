"""`simulate(RunConfig) -> Result`: build the world, run it, collect the tables.

Three fixed phases: build (workload, workers, router, drivers), run (SimPy until the last request
ends or the stop time), collect (tables and summary, built once). No Hydra here.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy

from servesim import progress, rundir
from servesim.agentic import report as agentic_report
from servesim.agentic.lanes import AgenticReplay
from servesim.agentic.qualification import agentic_violation
from servesim.clock import Environment
from servesim.cluster.aggregated import AggregatedCluster
from servesim.cluster.base import ClusterBase, total_workers
from servesim.cluster.disagg import DisaggCluster
from servesim.config.derived import num_gpu_blocks, role_engines, transfer_bytes_per_token
from servesim.config.errors import ConfigError
from servesim.config.schema import (
    AgenticOptions,
    ConcurrencyLoad,
    DisaggTopology,
    RunConfig,
    TraceLoad,
)
from servesim.metrics.recorder import INCOMPLETE, Recorder
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
from servesim.parallel import Part, part_of, plan_processes, rank_stats, rows_of, run_parts
from servesim.rundir import write_requests_jsonl
from servesim.workload.agentic import AgenticGraph
from servesim.workload.build import (
    StreamedWorkload,
    Workload,
    build_workload,
    read_source,
    stream_workload,
)
from servesim.workload.drivers import closed_loop, open_loop
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request

STREAMS = ("arrivals", "lengths", "prefix_groups", "router")


def random_streams(seed: int) -> dict[str, np.random.Generator]:
    """One independent generator per named stream, all spawned from the run's seed."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.default_rng(s) for name, s in zip(STREAMS, children, strict=True)}


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
            engines = role_engines(self.config)
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


def pool_sizes(cfg: RunConfig) -> dict[str, int]:
    """Workers and GPUs per worker (TP x DP) of each pool; aggregated workers are the decode
    pool, as in Dynamo's summary."""
    engines = role_engines(cfg)
    topo = cfg.topology
    if isinstance(topo, DisaggTopology):
        p, d = engines["prefill"], engines["decode"]
        return {
            "prefill_workers": topo.num_prefill_workers,
            "prefill_gpus_per_worker": p.tp_size * p.dp_size,
            "decode_workers": topo.num_decode_workers,
            "decode_gpus_per_worker": d.tp_size * d.dp_size,
        }
    e = engines["aggregated"]
    return {
        "prefill_workers": 0,
        "prefill_gpus_per_worker": 0,
        "decode_workers": topo.num_workers,
        "decode_gpus_per_worker": e.tp_size * e.dp_size,
    }


# young collections this many container allocations apart during the event loop (CPython's
# default is 700)
GC_YOUNG_THRESHOLD = 10_000


@contextlib.contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """Run the event loop with the cyclic garbage collector paced for it, and restore it after.

    The loop allocates many small containers (block lists, tuples, events) that live until
    their request ends and almost never form reference cycles (about one collectable object
    per request on the conversation trace). With CPython's defaults the collector rescans them
    every 700 allocations, about a tenth of a replay's time. Here everything made before the
    loop (the config, libraries, the trace's first rows) is frozen out of collection
    (`gc.freeze`), unless the caller froze objects itself, and young collections are
    `GC_YOUNG_THRESHOLD` allocations apart; the collector stays on."""
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()


def _run(
    env: simpy.Environment,
    cluster: ClusterBase,
    total: int | None,
    cfg: RunConfig,
    finished: simpy.Event | None = None,
    show_progress: bool = True,
) -> None:
    """Run to the end (or the stop time; or until `finished`, an agentic profile's end)."""
    with fewer_gc_passes():
        _run_loop(env, cluster, total, cfg, finished, show_progress)


def _run_loop(
    env: simpy.Environment,
    cluster: ClusterBase,
    total: int | None,
    cfg: RunConfig,
    finished: simpy.Event | None,
    show_progress: bool,
) -> None:
    until = cfg.stop.max_virtual_time_ms
    if finished is not None:
        env.run(until=finished)
        return
    if show_progress and progress.wanted(cfg.output.progress):
        span_ms = progress.trace_span_ms(cfg) if total is None else None
        progress.run_with_bar(
            env, until, total, span_ms, lambda: cluster.n_dispatched - cluster.n_in_flight
        )
    elif until is None:
        env.run()
    else:
        env.run(until=until)
        while env.peek() == until:  # the cut-off is soft: events at exactly it still happen
            env.step()


def simulate(cfg: RunConfig) -> Result:
    """Run one configuration and return its tables. Deterministic for a given config and seed.

    With `parallel.processes` > 1, a run whose workers never interact is replayed in that many
    processes (model/parallel.py), with the same tables and summary."""
    wall_start = time.perf_counter()
    processes, why_one = plan_processes(cfg)
    if processes > 1:
        merged = run_parts(cfg, processes, replay_part)
        _end_in_flight(cfg, merged.recorder, merged.stopped_at, merged.in_flight)
        return _collect(cfg, merged, None, wall_start, processes, why_one)
    run = _replay(cfg)
    stopped_at = run.env.now
    in_flight = run.cluster.in_flight()
    _end_in_flight(cfg, run.recorder, stopped_at, in_flight, run.replay)
    _end_not_arrived(cfg, run.recorder, stopped_at, run.replay, run.workload)
    part = Part(
        run.recorder,
        stopped_at,
        in_flight,
        rank_stats(run.cluster),
        run.cluster.tiers.pools,
        run.workload.skipped if run.workload is not None else None,
    )
    return _collect(cfg, part, run.replay, wall_start, 1, why_one)


@dataclass
class Replay:
    """A run's world after its event loop."""

    env: simpy.Environment
    cluster: ClusterBase
    recorder: Recorder
    replay: AgenticReplay | None
    workload: Workload | StreamedWorkload | None


def _replay(cfg: RunConfig, part: tuple[int, int] | None = None) -> Replay:
    """Build the world and run its event loop; in part k of n of a partitioned run, only the
    requests of workers k, k + n, ... are replayed (model/parallel.py)."""
    streams = random_streams(cfg.seed)
    # every role shares one block size (checked by role_engines); it may differ from `engine`'s
    hasher = BlockHasher(
        next(iter(role_engines(cfg).values())).block_size,
        keep_canonical_ids=cfg.kv_cache.host_offload.num_host_blocks is not None,
    )
    source = read_source(cfg.workload, streams)
    graph = source if isinstance(source, AgenticGraph) else None
    if graph is not None:
        problem = agentic_violation(cfg, f"workload={cfg.workload.kind}")
        if problem:  # a Dynamo trace turned out agentic: the same guards apply
            raise ConfigError(f"{cfg.workload.kind} carries agent_context: {problem}")
    elif isinstance(cfg.workload, AgenticOptions) and (
        cfg.workload.agentic_lanes is not None or cfg.workload.agentic_snapshot is not None
    ):
        raise ConfigError(
            "workload.agentic_lanes requires an agentic Dynamo trace (records with "
            f"agent_context); {cfg.workload.path} has none"  # type: ignore[union-attr]
        )

    env = Environment()
    recorder = Recorder(
        per_token=cfg.output.per_token,
        keep_kv_events=cfg.output.kv_events,
        pass_table=cfg.output.pass_table,
    )
    cluster_type = DisaggCluster if cfg.topology.kind == "disagg" else AggregatedCluster
    cluster = cluster_type(env, cfg, hasher, recorder, streams["router"])
    if part is not None:
        cluster.replays_worker = part_of(*part)
    load = cfg.load
    replay: AgenticReplay | None = None
    workload: Workload | StreamedWorkload | None = None
    if graph is not None:
        assert isinstance(cfg.workload, AgenticOptions) and isinstance(load, TraceLoad)
        replay = AgenticReplay(
            env, graph, cfg.workload, hasher, recorder, cluster, load.arrival_speedup_ratio
        )
        replay.start()
        _run(env, cluster, len(graph.nodes), cfg, replay.finished)
    else:
        rows = source if isinstance(source, list) else None
        streamed = (
            None if rows is not None else stream_workload(cfg.workload, load, hasher, streams)
        )
        if streamed is not None:  # single requests read as their arrivals come
            workload = streamed
            if part is not None:
                streamed.replays_row = rows_of(cfg, *part)
            total = None  # not known until the file has been read
            cluster.sessions_dispatch = False
            env.process(
                open_loop(env, streamed.sessions, cluster.dispatch, cluster.announce_arrival)
            )
        else:
            workload = build_workload(cfg.workload, cfg.load, hasher, streams, rows)
            total = workload.num_requests
            if isinstance(load, ConcurrencyLoad):
                closed_loop(env, workload.sessions, cluster.dispatch, load.concurrency)
            else:
                cluster.sessions_dispatch = any(len(s) > 1 for s in workload.sessions)
                env.process(
                    open_loop(env, workload.sessions, cluster.dispatch, cluster.announce_arrival)
                )
        _run(env, cluster, total, cfg, show_progress=part is None or part[0] == 0)
    return Replay(env, cluster, recorder, replay, workload)


def replay_part(cfg: RunConfig, k: int, n: int) -> Part:
    """Part k of n of a partitioned run: its records, and its requests still in flight for
    the caller to end at the latest stop of all parts. Its rows never reached are recorded
    here as not arrived (only a stop time leaves rows unread, and every part stops at it)."""
    run = _replay(cfg, (k, n))
    assert isinstance(run.workload, StreamedWorkload)  # (plan_processes checked)
    _end_not_arrived(cfg, run.recorder, run.env.now, None, run.workload)
    return Part(
        run.recorder,
        run.env.now,
        run.cluster.in_flight(),
        rank_stats(run.cluster),
        [],
        run.workload.skipped if k == 0 else None,
    )


def _end_in_flight(
    cfg: RunConfig,
    recorder: Recorder,
    stopped_at: float,
    in_flight: list[Request],
    replay: AgenticReplay | None = None,
) -> None:
    """Record the requests still in flight when the run stopped."""
    if replay is not None and replay.profile is not None:
        cut = "canceled at the agentic_profile response grace deadline"
    elif cfg.stop.max_virtual_time_ms is not None:
        cut = "in flight at max_virtual_time_ms"
    else:
        cut = "still in flight when nothing more could happen (the run stalled)"
    for req in in_flight:
        recorder.request_terminal(req, INCOMPLETE, stopped_at, cut)


def _end_not_arrived(
    cfg: RunConfig,
    recorder: Recorder,
    stopped_at: float,
    replay: AgenticReplay | None,
    workload: Workload | StreamedWorkload | None,
) -> None:
    """Record the requests that never arrived by the time the run stopped (an agentic
    replay ends its plays instead)."""
    if replay is not None:
        replay.finalize(stopped_at)
    else:
        assert workload is not None
        not_arrived = (
            "not arrived by max_virtual_time_ms"
            if cfg.stop.max_virtual_time_ms is not None
            else "never dispatched: the run stalled before its turn"
        )
        if isinstance(workload, StreamedWorkload):
            for req in workload.not_arrived():
                recorder.request_terminal(req, INCOMPLETE, stopped_at, not_arrived)
        else:
            for session in workload.sessions:
                for req in session:
                    if req.terminal_status == "":
                        recorder.request_terminal(req, INCOMPLETE, stopped_at, not_arrived)


def _collect(
    cfg: RunConfig,
    part: Part,
    replay: AgenticReplay | None,
    wall_start: float,
    processes: int,
    why_one: str,
) -> Result:
    """The tables and summary of a run that has ended (`part`: all of it, or its parts
    merged), its unfinished requests recorded."""
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
        **pool_sizes(cfg),
        slo=cfg.slo,
    )
    ranks = part.ranks
    summary["committed_prefill_tokens"] = sum(r.committed_prefill_tokens for r in ranks)
    summary["n_preemptions"] = int(requests["n_preemptions"].sum())
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
        "timing": cfg.timing.kind,
        "topology": cfg.topology.kind,
        "num_workers": total_workers(cfg),
        **pool_sizes(cfg),
        "router": cfg.router.kind,
        "workload": cfg.workload.kind,
        "load": cfg.load.kind,
        # OS processes the workers were replayed in (parallel.processes), and why one if more
        # were asked for
        "processes": processes,
        **({"processes_note": why_one} if why_one else {}),
        # per rank: aggregated workers, or the decode pool (prefill_num_gpu_blocks for P/D)
        **{
            ("prefill_num_gpu_blocks" if role == "prefill" else "num_gpu_blocks"): num_gpu_blocks(
                cfg, engine, role
            )
            for role, engine in role_engines(cfg).items()
        },
        # what a KV transfer charges per token (the llm geometry unless link overrides it)
        "kv_bytes_per_token": transfer_bytes_per_token(cfg),
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
    )
