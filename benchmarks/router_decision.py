"""What one routing decision of the KV-aware router (`servesim.router.kv.KvRouter`) costs in wall
time, as the number of targets and the length of the pending queue grow.

A benchmark, not a test: it measures and reports, and never treats a time as a pass or fail
limit. It checks only that the router did what each case needs (every decision dispatched, the
queue held at its size, one release per freed target); otherwise it exits with status 1, so a
speed number never hides a wrong setup.

The router runs in isolation, as in tests/unit/test_kv_router.py: a bare simpy Environment
(simulated time stays 0), a Recorder, a `send` callback that only notes the request, block size
64 and an 8,192-token batch budget (the mocker's defaults), aggregated role, DP 1. Every prompt
is 2,000-20,000 tokens (31-312 parent-chained block ids): one of 4 system prompts (8-32 blocks)
shared by every target's cache, then one of 64 documents (0-120 blocks, Zipf popularity,
document g under system g % 4), then blocks of its own. Each target's prefix cache is the
blocks of prompts it served before (4,096 distinct blocks per target; 256 with `--quick`),
fed to the prefix index as STORED events (`index.on_event`); caches stay fixed while
timing.

Cases:

* `workers` (8, 64, 256 targets): one decision = `submit` (scores every target and
  dispatches: prefix-index walk, active-block walk, cost loop, selection) + the `prefill_done`
  and `finished` bookkeeping it causes later. Steady state: 4 requests per target are
  in flight, one of them in prefill, so the decode term's walk over active blocks
  has work; each step submits one request, ends the prefill of the oldest prefilling one and
  ends the oldest decoding one. No queue threshold, no affinity.
* `queue` (10; 1,000; 100,000 waiting, 8 targets): `queue_threshold=1.0` (a target is busy
  above 8,192 prompt tokens not yet prefilled; every prompt here has >= 8,320 uncached tokens,
  so one prefilling request keeps a target busy), FCFS, session affinity
  (`affinity.mode=session`). 256 sessions are bound first (one request each, routed and ended
  while the router is idle); then every target gets one prefilling request and the queue is
  filled to N. 90 % of later requests continue a bound session (they wait in that target's
  bound queue), 10 % open a new one (they wait in the shared queue). Each step: one `submit`
  that waits (enqueue: queue N -> N+1), then one `prefill_done` on a target with something
  waiting for it, which releases exactly one request (release: N+1 -> N), after ending that
  target's oldest decoding request (`finished`, with nothing to release: target still busy).
  Each target thus has one prefilling and one decoding request. One decision = enqueue +
  release (`finished` is reported apart). The report compares 100,000 with 10 waiting against
  log2(100000) / log2(10) = 5: the queue's heaps promise O(log n) per request.

Each case runs `--repeat` rounds (default 5) of a number of timed steps after a warm-up, the
rounds of a group's sizes interleaved (round 1 of every size, then round 2, ...) so that load
drifting on a shared machine hits every size alike. Every router call is timed alone with
time.perf_counter; a row gives the best round (lowest mean per decision, as `timeit` advises)
and that round's mean per call in microseconds (`--json` keeps every round). The cyclic garbage
collector is off while timing (as in `timeit`; `--gc` keeps it on): with 100,000 waiting
requests alive a collection would walk them all and be charged to whichever call triggered it.

Run from the repository root:

    python benchmarks/router_decision.py              # full run, ~1 minute
    python benchmarks/router_decision.py --quick      # small sizes, seconds
    python benchmarks/router_decision.py --json router_decision.json

It prints a markdown table on stdout (progress on stderr); `--json OUT` also writes the rows,
the log-growth check, the settings and the machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from servesim.config.schema import KvRouter as KvRouterConfig
from servesim.kv.block_pool import STORED
from servesim.metrics.recorder import Recorder
from servesim.router.kv import KvRouter
from servesim.workload.request import Request

REPO = Path(__file__).resolve().parents[1]
BLOCK = 64  # tokens per block (vLLM / mocker default)
BUDGET = 8192  # max_num_batched_tokens (mocker default)
MIN_ISL, MAX_ISL = 2_000, 20_000
QUEUE_MIN_TAIL = 130  # queue case: uncached blocks per prompt, 130 x 64 = 8,320 > BUDGET
QUEUE_MIN_ISL = 10_240  # queue case: >= 160 blocks, so 30+ may be a cached prefix
QUEUE_THRESHOLD = 1.0
QUEUE_TARGETS = 8

FULL: dict[str, Any] = {
    "workers": (8, 64, 256),
    "queues": (10, 1_000, 100_000),
    "worker_steps": {8: 1000, 64: 500, 256: 200},  # per round
    "queue_steps": 1000,
    "queue_warm": 500,
    "cache_blocks": 4096,
    "repeat": 5,
}
QUICK: dict[str, Any] = {
    "workers": (8, 16),
    "queues": (10, 100),
    "worker_steps": {8: 40, 16: 40},
    "queue_steps": 40,
    "queue_warm": 20,
    "cache_blocks": 256,
    "repeat": 2,
}

COLUMNS = (
    ("case", "case"),
    ("targets", "targets"),
    ("queue", "queue"),
    ("us/decision", "us_decision"),
    ("submit us", "submit_us"),
    ("prefill_done us", "prefill_done_us"),
    ("finished us", "finished_us"),
    ("released/drain", "released_per_drain"),
    ("decisions", "decisions"),
)


class SetupError(RuntimeError):
    """The router did not behave as the case needs (the measurement would be meaningless)."""


# --------------------------------------------------------------------------- workload


class Prompts:
    """Chained block ids: a system prompt, a document under it, then the request's own blocks.

    A block id stands for its whole prefix (as `servesim.workload.hashing` makes them): documents'
    ids are unique to the document, and a document always follows the same system prompt, so
    two prompts share block j exactly when they share blocks 0..j."""

    def __init__(self, seed: int, n_systems: int = 4, n_docs: int = 64, max_doc: int = 120):
        self.rng = random.Random(seed)
        r = self.rng
        self.n_systems = n_systems
        self.systems = [[r.getrandbits(63) for _ in range(8 * (k + 1))] for k in range(n_systems)]
        self.docs = [
            [r.getrandbits(63) for _ in range(r.randint(0, max_doc))] for _ in range(n_docs)
        ]
        self.cum_weights = list(np.cumsum([1.0 / (g + 1) for g in range(n_docs)]))
        self.doc_ids = range(n_docs)

    def draw(self, min_isl: int = MIN_ISL, max_isl: int = MAX_ISL, min_tail: int = 0):
        """(input length, block ids) of one prompt, at least `min_tail` blocks its own."""
        r = self.rng
        isl = r.randint(min_isl, max_isl)
        n = isl // BLOCK
        g = r.choices(self.doc_ids, cum_weights=self.cum_weights)[0]
        prefix = self.systems[g % self.n_systems] + self.docs[g]
        prefix = prefix[: max(0, n - min_tail)]
        return isl, prefix + [r.getrandbits(63) for _ in range(n - len(prefix))]


def build_router(n_targets: int, seed: int = 0, **knobs: Any) -> tuple[KvRouter, list[Request]]:
    """A KvRouter on `n_targets` (worker, rank 0) targets whose `send` appends to a list."""
    router = KvRouter(
        simpy.Environment(),
        KvRouterConfig(**knobs),
        n_targets,
        1,
        np.random.default_rng(seed),
        BLOCK,
        BUDGET,
        "aggregated",
        Recorder(),
    )
    sent: list[Request] = []
    router.send = lambda req, worker, rank: sent.append(req)
    for t in range(n_targets):
        router.index.bind_device(f"w{t}", t)
    return router, sent


def populate_caches(router: KvRouter, prompts: Prompts, cache_blocks: int, **draw: int) -> int:
    """Each target's device cache: the distinct blocks of prompts it served before, about
    `cache_blocks` of them, as STORED events. Returns the number of events."""
    n_events = 0
    for t in range(router.n_targets):
        pool = f"w{t}"
        held: set[int] = set()
        while len(held) < cache_blocks:
            for h in prompts.draw(**draw)[1]:
                if h not in held:
                    held.add(h)
                    router.index.on_event(0.0, pool, STORED, h)
                    n_events += 1
    return n_events


class Requests:
    """Numbered requests (unique `idx`, increasing arrival for FCFS)."""

    def __init__(self) -> None:
        self.n = 0

    def make(self, isl: int, hashes: list[int], session: str | None = None) -> Request:
        i = self.n
        self.n += 1
        r = Request(i, f"q{i}", isl, 128, hashes, session_id=session)
        r.arrival_ms = float(i)
        return r


# --------------------------------------------------------------------------- measurement


@dataclass
class Row:
    case: str
    targets: int
    queue: int
    us_decision: float
    submit_us: float
    prefill_done_us: float
    finished_us: float
    released_per_drain: float | None
    decisions: int
    round_us: list[float] = field(default_factory=list)  # us/decision of every round


class Clock:
    """Per-call totals of one round."""

    def __init__(self) -> None:
        self.total = {"submit": 0.0, "prefill_done": 0.0, "finished": 0.0}
        self.calls = {"submit": 0, "prefill_done": 0, "finished": 0}
        self.drains = 0
        self.released = 0

    def add(self, what: str, seconds: float) -> None:
        self.total[what] += seconds
        self.calls[what] += 1

    def mean_us(self, what: str) -> float:
        n = self.calls[what]
        return 1e6 * self.total[what] / n if n else 0.0


class WorkersBench:
    """Case `workers`: `n_targets` targets, `inflight` requests in flight on each (one of them
    prefilling); a step is submit (dispatching) + prefill_done + finished."""

    def __init__(self, n_targets: int, cache_blocks: int = 4096, inflight: int = 4, seed: int = 0):
        self.case, self.n_targets, self.queue_len = "workers", n_targets, 0
        self.router, self.sent = build_router(n_targets, seed)
        self.prompts = Prompts(seed)
        populate_caches(self.router, self.prompts, cache_blocks)
        self.numbered = Requests()
        self.prefilling: deque[Request] = deque()
        self.decoding: deque[Request] = deque()
        self.max_decoding = n_targets * (inflight - 1)
        for _ in range(n_targets * inflight):
            self.step(None)

    def step(self, clock: Clock | None) -> None:
        pc = time.perf_counter
        router, sent = self.router, self.sent
        r = self.numbered.make(*self.prompts.draw())
        before = len(sent)
        t0 = pc()
        router.submit(r)
        t1 = pc()
        if len(sent) != before + 1 or sent[-1] is not r:
            raise SetupError(f"workers/{self.n_targets}: submit did not dispatch {r.request_id}")
        self.prefilling.append(r)
        prefilled = ended = None
        if len(self.prefilling) > self.n_targets:
            p = self.prefilling.popleft()
            t2 = pc()
            router.prefill_done(p)
            router.settle()
            prefilled = pc() - t2
            self.decoding.append(p)
            if len(self.decoding) > self.max_decoding:
                d = self.decoding.popleft()
                t4 = pc()
                router.finished(d)
                router.settle()
                ended = pc() - t4
        if clock is not None:
            clock.add("submit", t1 - t0)
            if prefilled is not None:
                clock.add("prefill_done", prefilled)
            if ended is not None:
                clock.add("finished", ended)

    def decision_us(self, clock: Clock) -> float:
        """One request's routing: its dispatch, its first token and its end."""
        return clock.mean_us("submit") + clock.mean_us("prefill_done") + clock.mean_us("finished")


class QueueBench:
    """Case `queue`: 8 busy targets, `queue_len` waiting requests, session affinity."""

    def __init__(
        self,
        queue_len: int,
        n_targets: int = QUEUE_TARGETS,
        cache_blocks: int = 4096,
        sessions: int = 256,
        p_new: float = 0.1,
        decoding_per_target: int = 1,
        policy: str = "fcfs",
        warm: int = 500,
        seed: int = 0,
    ) -> None:
        self.case, self.queue_len, self.n_targets = "queue", queue_len, n_targets
        self.p_new = p_new
        self.decoding_per_target = decoding_per_target
        self.rng = random.Random(seed + 1)
        self.router, self.sent = build_router(
            n_targets,
            seed,
            queue_threshold=QUEUE_THRESHOLD,
            queue_policy=policy,
            affinity={"mode": "session"},
        )
        router = self.router
        shape = {"min_isl": QUEUE_MIN_ISL, "min_tail": QUEUE_MIN_TAIL}
        prompts = Prompts(seed)
        populate_caches(router, prompts, cache_blocks, **shape)
        self.pool = [prompts.draw(**shape) for _ in range(2048)]
        self.numbered = Requests()
        self.sessions = [f"s{k}" for k in range(sessions)]
        self.n_new = 0
        self.prefilling: list[deque[Request]] = [deque() for _ in range(n_targets)]
        self.decoding: list[deque[Request]] = [deque() for _ in range(n_targets)]
        self.next_target = 0
        # bind every session while the router is idle: routed, prefilled and ended at once
        for s in self.sessions:
            r = self._request(s)
            self._expect_dispatch(r)
            router.prefill_done(r)
            router.settle()
            router.finished(r)
            router.settle()
        # one prefilling request per target makes every target busy
        while not all(router._busy(t) for t in range(n_targets)):
            r = self._request(None)
            self._expect_dispatch(r)
            self.prefilling[router.flights[r.idx].target].append(r)
        if any(len(q) != 1 for q in self.prefilling):
            raise SetupError(f"queue/{queue_len}: saturation put 2 requests on one target")
        n_sent = len(self.sent)
        while router.n_waiting < queue_len:
            router.submit(self._request(self._session()))
        if len(self.sent) != n_sent:
            raise SetupError(f"queue/{queue_len}: a request was dispatched while filling")
        for _ in range(warm):
            self.step(None)

    def _request(self, session: str | None) -> Request:
        isl, hashes = self.pool[self.rng.randrange(len(self.pool))]
        return self.numbered.make(isl, hashes, session)

    def _session(self) -> str:
        if self.rng.random() < self.p_new:
            self.n_new += 1
            return f"new{self.n_new}"
        return self.sessions[self.rng.randrange(len(self.sessions))]

    def _expect_dispatch(self, r: Request) -> None:
        before = len(self.sent)
        self.router.submit(r)
        if len(self.sent) != before + 1:
            raise SetupError(f"queue/{self.queue_len}: {r.request_id} was not dispatched")

    def _pick_target(self) -> int:
        """The next target (round robin) that something waits for."""
        router = self.router
        for k in range(self.n_targets):
            t = (self.next_target + k) % self.n_targets
            if router.shared_queue or router.bound_queue.get(t):
                self.next_target = t + 1
                return t
        raise SetupError(f"queue/{self.queue_len}: nothing waits for any target")

    def step(self, clock: Clock | None) -> None:
        pc = time.perf_counter
        router, sent = self.router, self.sent
        # enqueue: N -> N + 1
        r = self._request(self._session())
        before = len(sent)
        t0 = pc()
        router.submit(r)
        t1 = pc()
        if len(sent) != before:
            raise SetupError(f"queue/{self.queue_len}: {r.request_id} did not wait")
        t = self._pick_target()
        # end the target's oldest decoding request: t stays busy, nothing is released
        ended = None
        if len(self.decoding[t]) >= self.decoding_per_target:
            d = self.decoding[t].popleft()
            t2 = pc()
            router.finished(d)
            router.settle()
            ended = pc() - t2
            if len(sent) != before:
                raise SetupError(f"queue/{self.queue_len}: finished released on a busy target")
        # release: t's prefill ends, it takes what waits for it until busy again
        if len(self.prefilling[t]) != 1:
            raise SetupError(f"queue/{self.queue_len}: target {t} has {len(self.prefilling[t])}")
        p = self.prefilling[t].popleft()
        t4 = pc()
        router.prefill_done(p)
        router.settle()
        t5 = pc()
        self.decoding[t].append(p)
        released = sent[before:]
        for q in released:
            self.prefilling[router.flights[q.idx].target].append(q)
        if len(released) != 1:
            where = [router.flights[q.idx].target for q in released]
            raise SetupError(
                f"queue/{self.queue_len}: freeing target {t} released {len(released)} "
                f"requests (to targets {where}), not 1"
            )
        if router.n_waiting != self.queue_len:
            raise SetupError(f"queue/{self.queue_len}: {router.n_waiting} waiting")
        if clock is not None:
            clock.add("submit", t1 - t0)
            if ended is not None:
                clock.add("finished", ended)
            clock.add("prefill_done", t5 - t4)
            clock.drains += 1
            clock.released += len(released)

    def decision_us(self, clock: Clock) -> float:
        """One queued request's routing: its enqueue and its release."""
        return clock.mean_us("submit") + clock.mean_us("prefill_done")


def measure(benches: Sequence[Any], steps: Sequence[int], repeat: int, keep_gc: bool) -> list[Row]:
    """`repeat` rounds of `steps[i]` timed steps of every bench, interleaved (round 1 of each,
    round 2 of each, ...) so that load drifting on a shared machine hits every size alike. A row
    gives the best round (lowest mean per decision, as `timeit` advises), its columns that
    round's means."""
    rounds: list[list[Clock]] = [[] for _ in benches]
    for _ in range(repeat):
        for bench, n, out in zip(benches, steps, rounds, strict=True):
            clock = Clock()
            gc.collect()
            if not keep_gc:
                gc.disable()
            try:
                for _ in range(n):
                    bench.step(clock)
            finally:
                gc.enable()
            out.append(clock)
    rows = []
    for bench, n, clocks in zip(benches, steps, rounds, strict=True):
        best = min(clocks, key=bench.decision_us)
        drains = sum(c.drains for c in clocks)
        rows.append(
            Row(
                bench.case,
                bench.n_targets,
                bench.queue_len,
                bench.decision_us(best),
                best.mean_us("submit"),
                best.mean_us("prefill_done"),
                best.mean_us("finished"),
                sum(c.released for c in clocks) / drains if drains else None,
                repeat * n,
                [bench.decision_us(c) for c in clocks],
            )
        )
    return rows


def log_check(rows: Sequence[Row]) -> dict[str, Any] | None:
    """The largest queue's per-decision cost over the smallest's, next to the ratio of their
    logarithms (what O(log n) per decision would allow at most)."""
    queue = sorted((r for r in rows if r.case == "queue"), key=lambda r: r.queue)
    if len(queue) < 2 or queue[0].queue < 2:
        return None
    lo, hi = queue[0], queue[-1]
    bound = math.log2(hi.queue) / math.log2(lo.queue)
    out: dict[str, Any] = {"small": lo.queue, "large": hi.queue, "log_ratio": bound}
    for key in ("us_decision", "submit_us", "prefill_done_us"):
        a, b = getattr(lo, key), getattr(hi, key)
        out[key] = b / a if a else math.nan
    out["within_log"] = out["us_decision"] <= bound
    return out


# --------------------------------------------------------------------------- report


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 100 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown(rows: Sequence[Row], check: dict[str, Any] | None = None) -> str:
    lines = [
        "| " + " | ".join(name for name, _ in COLUMNS) + " |",
        "|" + "|".join("---" if key == "case" else "---:" for _, key in COLUMNS) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(getattr(row, key)) for _, key in COLUMNS) + " |")
    if check is not None:
        lines.append("")
        lines.append(
            f"Log-growth check: per-decision cost at {check['large']:,} waiting / at "
            f"{check['small']:,} = {check['us_decision']:.2f} (enqueue {check['submit_us']:.2f}, "
            f"release {check['prefill_done_us']:.2f}); log2({check['large']}) / "
            f"log2({check['small']}) = {check['log_ratio']:.2f}: "
            + ("no faster than logarithmic." if check["within_log"] else "FASTER than log.")
        )
    return "\n".join(lines) + "\n"


def run(
    quick: bool = False, repeat: int | None = None, keep_gc: bool = False, seed: int = 0
) -> tuple[list[Row], dict[str, Any] | None, dict[str, Any]]:
    """Every case of the full (or quick) run: (rows, log check, settings)."""
    sizes: dict[str, Any] = dict(QUICK if quick else FULL)
    if repeat is not None:
        sizes["repeat"] = repeat
    cache = sizes["cache_blocks"]
    rows = []
    # one group at a time (its benches alive together, for interleaved rounds), then freed
    groups = (
        (
            "workers",
            sizes["workers"],
            lambda n: WorkersBench(n, cache, seed=seed),
            lambda n: sizes["worker_steps"][n],
        ),
        (
            "queue",
            sizes["queues"],
            lambda n: QueueBench(n, cache_blocks=cache, warm=sizes["queue_warm"], seed=seed),
            lambda n: sizes["queue_steps"],
        ),
    )
    for name, ns, build, steps in groups:
        t0 = time.perf_counter()
        benches = []
        for n in ns:
            benches.append(build(n))
            _progress(f"{name} {n} ready at {time.perf_counter() - t0:.1f} s")
        rows.extend(measure(benches, [steps(n) for n in ns], sizes["repeat"], keep_gc))
        _progress(f"{name}: {time.perf_counter() - t0:.1f} s")
        del benches
    settings = {
        "quick": quick,
        "seed": seed,
        "gc_while_timing": keep_gc,
        "block_size": BLOCK,
        "max_num_batched_tokens": BUDGET,
        "queue_threshold": QUEUE_THRESHOLD,
        "queue_targets": QUEUE_TARGETS,
        **{
            k: {str(a): b for a, b in v.items()} if isinstance(v, dict) else v
            for k, v in sizes.items()
        },
    }
    return rows, log_check(rows), settings


def _progress(msg: str) -> None:
    print(f"router_decision: {msg}", file=sys.stderr, flush=True)


def environment() -> dict[str, Any]:
    try:
        git = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        git = None
    return {
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "servesim_git": git,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    p.add_argument("--repeat", type=int, help="timed rounds per case (default 3; quick 1)")
    p.add_argument("--gc", action="store_true", help="keep the garbage collector on while timing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT", help="also write rows, check and settings as JSON")
    args = p.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env_info = environment()
    try:
        rows, check, settings = run(args.quick, args.repeat, args.gc, args.seed)
    except SetupError as e:
        print(f"router_decision: {e}", file=sys.stderr)
        return 1
    report = markdown(rows, check)
    if args.quick:
        report += "\n(--quick: too few steps for the times to mean anything; a smoke run.)\n"
    sys.stdout.write(report)
    if args.json:
        payload = {
            "rows": [asdict(r) for r in rows],
            "log_check": check,
            "settings": settings,
            "environment": env_info,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
