"""Partitioned replay: workers that never interact, replayed in separate OS processes.

In an aggregated cluster behind round-robin routing, replaying an open-loop trace of single
requests, nothing one worker does reaches another: the worker that takes a request is fixed by
its place in the trace (request j goes to worker j mod N), its arrival by its timestamp, and
the workers share nothing else. Such a run splits into parts. Part k of P reads the whole trace
but dispatches only the requests of workers k, k + P, k + 2P, ... (every other row still takes
its index, its request id and its trace ids' canonical numbers, so every block id and every
error is the one-process run's; the round robin skips the other parts' turns), and records
only what its workers do. The parts run in separate processes (part 0 in the calling one) and
their recorders are merged (`Recorder.absorb`). Every table sorts its rows by time and worker,
keeping recording order only among one worker's rows, so the merged tables, and the summary
built from them, are the one-process run's (tests/speed/test_parallel_equivalence.py).

Anything that couples workers rules it out, and `plan_processes` says which: a router that
looks at the workers (KV-aware) or draws at random, P/D disaggregation (transfers), KV tiers
(pools a cluster may share), multi-turn sessions or a closed loop (a completion dispatches the
next request), a frontend latency (requests wait before routing), a workload that is not a
streamed trace (synthetic, agentic).
"""

from __future__ import annotations

import multiprocessing
import pickle
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesim.config.schema import AggregatedTopology, RoundRobinRouter, RunConfig
from servesim.metrics.recorder import Recorder
from servesim.timing import frontend_latency_ms
from servesim.workload.build import streams_rows
from servesim.workload.mooncake import SkipCounter
from servesim.workload.request import Request

if TYPE_CHECKING:
    from servesim.cluster.base import ClusterBase


@dataclass
class RankStats:
    """What the summary reads of one scheduler rank besides the recorder."""

    name: str
    committed_prefill_tokens: int
    evictions: int
    capacity_blocks: int
    retractions: int  # SGLang's; 0 for an engine that does not retract


@dataclass
class Part:
    """A run, or one part of a partitioned run, after its event loop: its records, when it
    stopped, its requests still in flight (not yet recorded), its ranks, its KV tier pools,
    the trace rows it skipped (None: counted by another part)."""

    recorder: Recorder
    stopped_at: float
    in_flight: list[Request]
    ranks: list[RankStats]
    tier_pools: list[Any] = field(default_factory=list)
    skipped: SkipCounter | None = None


def rank_stats(cluster: ClusterBase) -> list[RankStats]:
    """The ranks of the workers `cluster` replays."""
    replays = cluster.replays_worker
    return [
        RankStats(
            r.name,
            r.scheduler.n_committed_prefill_tokens,
            r.pool.n_evictions,
            r.pool.capacity_blocks,
            getattr(r.scheduler, "n_retractions", 0),
        )
        for w in cluster.workers
        if replays is None or replays(w.idx)
        for r in w.ranks
    ]


def why_not_partitioned(cfg: RunConfig) -> str:
    """Why the workers of this run may interact ('' if they never do)."""
    topo = cfg.topology
    if not isinstance(topo, AggregatedTopology):
        return "P/D disaggregation couples prefill and decode workers (KV transfers)"
    if topo.num_workers < 2:
        return "one worker"
    if not isinstance(cfg.router, RoundRobinRouter):
        return f"router={cfg.router.kind} does not place a request by its place in the trace"
    if cfg.kv_cache.host_offload.num_host_blocks is not None:
        return "KV tiers (kv_cache.host_offload) can share pools between workers"
    if not streams_rows(cfg.workload, cfg.load):
        return (
            "only an open-loop trace replay of single requests (workload=mooncake or azure, "
            "load=trace, no session_id) is partitioned"
        )
    if frontend_latency_ms(cfg) > 0:
        return "the timing model's frontend latency holds requests before they are routed"
    return ""


def plan_processes(cfg: RunConfig) -> tuple[int, str]:
    """How many processes replay this run, and why one if more were asked for ('' else)."""
    asked = cfg.speed.processes
    if asked == 1:
        return 1, ""
    why = why_not_partitioned(cfg)
    if not why and multiprocessing.current_process().daemon:
        why = "simulate() runs in a daemonic process (a multiprocessing.Pool worker), which "
        why += "cannot start processes"
    if why:
        return 1, f"speed.processes={asked} not applied: {why}"
    assert isinstance(cfg.topology, AggregatedTopology)
    return min(asked, cfg.topology.num_workers), ""


def part_of(k: int, n: int) -> Callable[[int], bool]:
    """Whether part k of n replays worker w."""
    return lambda w: w % n == k


def rows_of(cfg: RunConfig, k: int, n: int) -> Callable[[int], bool]:
    """Whether part k of n replays the request of trace row j (round robin: worker j mod N)."""
    assert isinstance(cfg.topology, AggregatedTopology)
    workers = cfg.topology.num_workers
    replays = part_of(k, n)
    return lambda j: replays(j % workers)


def run_parts(cfg: RunConfig, n: int, replay_part: Callable[[RunConfig, int, int], Part]) -> Part:
    """Replay parts 1..n-1 in child processes and part 0 here; their merged records. An error
    in any part (a bad trace row: every part reads every row) is raised here, a child's with a
    note naming its part; on any error or interrupt the children are ended before it is.

    A child leaves its part in a file rather than sending it back: a result sent through the
    pool would be received (whole, then unpickled) while this process still replays its own
    part, so its peak memory would hold its own world and the other parts' records at once.
    Read from the files after this part's replay, one part at a time, each merged record
    column is freed as soon as it is absorbed. A child that cannot write its file (a full
    disk) sends its part back instead."""
    with tempfile.TemporaryDirectory(prefix="servesim-parts-") as tmp:
        paths = [Path(tmp) / f"part-{k}.pickle" for k in range(1, n)]
        pool = ProcessPoolExecutor(max_workers=n - 1, mp_context=_start_method())
        try:
            pending = [
                pool.submit(_replay_to_file, replay_part, cfg, k, n, path)
                for k, path in enumerate(paths, start=1)
            ]
            merged = replay_part(cfg, 0, n)
            sent = [_result(f, k, n) for k, f in enumerate(pending, start=1)]
        except BaseException:  # an interrupt too: no child may go on replaying, or outlive us
            _end_children(pool)
            raise
        pool.shutdown()
        for path, part in zip(paths, sent, strict=True):
            if part is None:
                with path.open("rb") as fh:
                    part = pickle.load(fh)
                path.unlink()
            merged.recorder.absorb(part.recorder)
            merged.in_flight.extend(part.in_flight)
            merged.ranks.extend(part.ranks)
            merged.stopped_at = max(merged.stopped_at, part.stopped_at)
    return merged


def _start_method() -> BaseContext:
    """Fork where the platform has it. A forked child starts at once with the parent's
    modules already imported (a spawned one would import servesim, numpy, pandas and simpy
    again before its replay, and re-run the caller's main module), and with the parent's
    state as it is (a module patched at run time, as the full-disk test does, is patched in
    the child too). The children are forked when the first part is submitted, before this
    process builds its own part, so they do not copy it; each part reads the trace itself.
    Without fork (Windows), spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _result(future: Future[Part | None], k: int, n: int) -> Part | None:
    """A child's outcome; its error (raised in the child, with the child's traceback as its
    cause) says which part it came from."""
    try:
        return future.result()
    except Exception as e:
        e.add_note(f"(raised by part {k} of {n} of a partitioned replay, in a child process)")
        raise


def _end_children(pool: ProcessPoolExecutor) -> None:
    """Cancel the parts not started and end the children now, however far they are."""
    # ProcessPoolExecutor has no public way to stop busy workers before Python 3.14
    # (terminate_workers); its map of worker processes is the handle it keeps on them, and it
    # drops the map on shutdown, so it is read first
    children = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for child in children:
        child.terminate()
    for child in children:
        child.join()


def _replay_to_file(
    replay_part: Callable[[RunConfig, int, int], Part], cfg: RunConfig, k: int, n: int, path: Path
) -> Part | None:
    """In a child process: replay part k of n and pickle it to `path` (None), or return it
    if the file cannot be written."""
    part = replay_part(cfg, k, n)
    try:
        with path.open("wb") as fh:
            pickle.dump(part, fh, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        path.unlink(missing_ok=True)
        return part
    return None
