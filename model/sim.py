"""`simulate(RunConfig) -> Result`: build the world, run it, collect the tables.

Three fixed phases: build (the plan, workload, workers, router, drivers), run (SimPy until the
last request ends or the stop time), collect (tables and summary, built once: servesim.outcome).
No Hydra here.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import simpy

from servesim import progress
from servesim.agentic.lanes import AgenticReplay
from servesim.clock import Environment
from servesim.cluster.aggregated import AggregatedCluster
from servesim.cluster.base import ClusterBase
from servesim.cluster.disagg import DisaggCluster
from servesim.config.errors import ConfigError
from servesim.config.plan import Plan, make_plan
from servesim.config.rules import agentic_violation
from servesim.config.schema import (
    AgenticOptions,
    ConcurrencyLoad,
    RunConfig,
    TraceLoad,
)
from servesim.metrics.recorder import INCOMPLETE, Recorder
from servesim.outcome import Result, collect
from servesim.speed.gc import fewer_gc_passes
from servesim.speed.parallel import Part, part_of, plan_processes, rank_stats, rows_of, run_parts
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


def _run(
    env: simpy.Environment,
    cluster: ClusterBase,
    total: int | None,
    cfg: RunConfig,
    finished: simpy.Event | None = None,
    show_progress: bool = True,
) -> None:
    """Run to the end (or the stop time; or until `finished`, an agentic profile's end)."""
    with fewer_gc_passes() if cfg.speed.gc_tuning else contextlib.nullcontext():
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

    With `speed.processes` > 1, a run whose workers never interact is replayed in that many
    processes (model/speed/parallel.py), with the same tables and summary."""
    wall_start = time.perf_counter()
    plan = make_plan(cfg)
    processes, why_one = plan_processes(cfg)
    if processes > 1:
        merged = run_parts(cfg, processes, replay_part)
        _end_in_flight(cfg, merged.recorder, merged.stopped_at, merged.in_flight)
        return collect(plan, merged, None, wall_start, processes, why_one)
    run = _replay(plan)
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
    return collect(plan, part, run.replay, wall_start, 1, why_one)


@dataclass
class Replay:
    """A run's world after its event loop."""

    env: simpy.Environment
    cluster: ClusterBase
    recorder: Recorder
    replay: AgenticReplay | None
    workload: Workload | StreamedWorkload | None


def _replay(plan: Plan, part: tuple[int, int] | None = None) -> Replay:
    """Build the world and run its event loop; in part k of n of a partitioned run, only the
    requests of workers k, k + n, ... are replayed (model/speed/parallel.py)."""
    cfg = plan.cfg
    streams = random_streams(cfg.seed)
    hasher = BlockHasher(
        plan.block_size,
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
        engines={role: engine.kind for role, engine in plan.engines.items()},
    )
    cluster_type = DisaggCluster if cfg.topology.kind == "disagg" else AggregatedCluster
    cluster = cluster_type(env, plan, hasher, recorder, streams["router"])
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
    run = _replay(make_plan(cfg), (k, n))
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
