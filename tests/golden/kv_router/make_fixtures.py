"""Regenerate the golden KV-router fixtures in this directory (Dynamo mocker, kv_router).

Each case directory holds a small seeded Mooncake trace with shared prefixes (generated here,
never copied from a shared trace), `case.json` (servesim Hydra overrides and the exact keyword
arguments given to the mocker, `router_config` as the JSON of its `KvRouterConfig`),
`summary.json` (the first mocker run's summary) and `runs.json` (the compared metrics of
`--runs` mocker runs of the same case, and their mean, min and max). A case the mocker replays
the same way every run (`per_request`) also keeps `requests.jsonl`: the mocker's per-request
records (`report_jsonl_path`), trimmed as tests/golden/mocker trims them, with worker ids
renumbered in order of first use (a tie on an empty cluster, which the mocker breaks at random,
only relabels workers); the script stops if two runs differ in anything else.

    MOCKER_PYTHON tests/golden/kv_router/make_fixtures.py           # all
    MOCKER_PYTHON tests/golden/kv_router/make_fixtures.py --runs 20 a_families_2w
    python tests/golden/kv_router/make_fixtures.py --traces-only                    # no mocker

The mocker's kv_router (ai-dynamo-runtime 1.6.1) breaks cost ties with an unseeded random
choice, so two runs of one case can route differently; the test therefore compares summary
metrics with servesim's against the mean of the recorded runs, and `runs.json` shows how far
apart the mocker's own runs are. Standard library only, so this runs in the mocker's own
interpreter (MOCKER_PYTHON: a virtual environment with `pip install ai-dynamo-runtime==1.6.1`);
servesim is not needed here. The host-speed keys (`wall_time_ms`,
`processed_tokens_per_s`, `processed_output_tokens_per_s`) are dropped from `summary.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WALL_KEYS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")
MAX_TRACE_BYTES = 100_000
DEFAULT_RUNS = 20
# The summary metrics recorded per run (the test compares the first four; the rest are there
# to read the spread, and completed_requests must agree exactly).
RUN_KEYS = (
    "prefix_cache_reused_ratio",
    "mean_ttft_ms",
    "mean_itl_ms",
    "mean_e2e_latency_ms",
    "p90_ttft_ms",
    "mean_tpot_ms",
    "duration_ms",
    "completed_requests",
)

Row = dict[str, Any]


def _mocker_fixtures() -> Any:
    """tests/golden/mocker/make_fixtures.py (standard library only, like this script)."""
    spec = importlib.util.spec_from_file_location(
        "mocker_make_fixtures", HERE.parent / "mocker" / "make_fixtures.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


MOCKER_FIXTURES = _mocker_fixtures()
# The mocker's defaults (ai-dynamo-runtime 1.6.1, vLLM backend), as tests/golden/mocker writes
# them, so each case.json states exactly what the mocker was given.
DEFAULT_ENGINE: dict[str, Any] = dict(MOCKER_FIXTURES.DEFAULT_ENGINE)
# servesim's conf/router/kv.yaml in the mocker's field names (the mocker's defaults too)
DEFAULT_ROUTER: dict[str, Any] = dict(MOCKER_FIXTURES.ZX_ROUTER)
BASE_OVERRIDES = [
    "experiment=dynamo_compat",
    "workload=mooncake",
    "output.progress=off",
    "router=kv",
]


# --------------------------------------------------------------------------- traces


def families_trace(
    seed: int,
    n: int,
    n_families: int,
    mean_gap_ms: float,
    prefix_blocks: tuple[int, int] = (4, 24),
    suffix_blocks: tuple[int, int] = (1, 12),
    follow_up: float = 0.0,
) -> list[Row]:
    """`n` requests, each a family's system prompt (`prefix_blocks` trace blocks, shared by
    every request of the family) plus its own suffix; with probability `follow_up` a request
    instead extends an earlier one's prompt (a conversation's next turn, with its timestamp).
    Families are drawn with skewed weights, so some are hot. Trace block size 64 (one engine
    block), outputs 8 to 300 tokens, exponential gaps of mean `mean_gap_ms`."""
    rng = random.Random(seed)
    next_id = [0]

    def fresh(k: int) -> list[int]:
        out = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return out

    systems = [fresh(rng.randint(*prefix_blocks)) for _ in range(n_families)]
    weights = [1.0 / (i + 1) for i in range(n_families)]
    rows: list[Row] = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(1.0 / mean_gap_ms)
        if rows and rng.random() < follow_up:
            hashes = rows[rng.randrange(len(rows))]["hash_ids"] + fresh(rng.randint(1, 6))
        else:
            family = rng.choices(range(n_families), weights)[0]
            hashes = systems[family] + fresh(rng.randint(*suffix_blocks))
        cap = len(hashes) * 64
        rows.append(
            {
                "timestamp": int(t),
                "input_length": rng.randint(cap - 63, cap),
                "output_length": rng.randint(8, 300),
                "hash_ids": hashes,
            }
        )
    return rows


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    description: str
    trace: Callable[[], list[Row]]
    num_workers: int
    engine: dict[str, Any] = field(default_factory=dict)  # changes to DEFAULT_ENGINE
    router: dict[str, Any] = field(default_factory=dict)  # changes to DEFAULT_ROUTER
    kv_event_lag_ms: float = 0.0
    servesim_overrides: tuple[str, ...] = ()  # the same changes, as servesim overrides
    per_request: bool = False  # deterministic in the mocker: keep its records (requests.jsonl)
    dp_size: int = 1  # attention-DP ranks per worker (the router's targets: workers x ranks)
    routes: bool = False  # keep run 0's records with where each request went (routes.jsonl)

    def mocker_kwargs(self) -> dict[str, Any]:
        """`run_mocker_trace_replay`'s keyword arguments (trace list aside), exactly as
        experiments/compare_dynamo.py translates servesim's config (the test checks that)."""
        out: dict[str, Any] = {
            "num_workers": self.num_workers,
            "router_mode": "kv_router",
            "router_config": {**DEFAULT_ROUTER, **self.router},
            "trace_block_size": 64,
            "arrival_speedup_ratio": 1.0,
            "extra_engine_args": {
                "engine": {**DEFAULT_ENGINE, **self.engine},
                "tensor_parallel_size": 1,
            },
        }
        if self.dp_size != 1:
            out["extra_engine_args"]["dp_size"] = self.dp_size
        if self.kv_event_lag_ms > 0:
            out["kv_event_lag_ms"] = self.kv_event_lag_ms
        return out

    def overrides(self) -> list[str]:
        """servesim Hydra overrides (add `workload.path=<case dir>/trace.jsonl`)."""
        return [
            *BASE_OVERRIDES,
            f"topology.num_workers={self.num_workers}",
            "workload.trace_block_size=64",
            *((f"+engine.dp_size={self.dp_size}",) if self.dp_size != 1 else ()),
            *self.servesim_overrides,
        ]


def _row(t: int, n_in: int, n_out: int, ids: list[int]) -> Row:
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def same_instant_release_trace() -> list[Row]:
    """Five requests on 2 workers (fixed timing 10 / 1.5 ms, queue threshold 0.05: a target
    is busy above 409.6 uncached prompt tokens in flight) where one pass end on worker X gives
    R2 its first token and R1 its last token while Q waits in the router's queue: Q's cost on
    X at that instant depends on whether R1's blocks still count (README.md)."""
    p = list(range(6))
    return [
        _row(0, 384, 1, p),  # R0: caches P (6 blocks) on X
        _row(11, 256, 5, [0, 10, 11, 12]),  # R1: 4 blocks on X (1 shared); last token at 37.0
        # R2: P + 7 blocks on X, 448 tokens uncached (X busy); first token at 37.0
        _row(25, 832, 20, [*p, *range(20, 27)]),
        _row(32, 448, 20, list(range(30, 37))),  # R3: 7 fresh blocks on Y, prefilling 32-42
        # Q: 2 fresh blocks; both targets busy at 34, so it waits until X frees at 37
        _row(34, 128, 5, [40, 41]),
    ]


def first_tokens_one_at_a_time_trace() -> list[Row]:
    """Five requests on 2 workers (as in case d) where one pass end on worker X gives A and B
    their first tokens while Q waits: A's signal alone frees X (B's 384 tokens are not above
    409.6), so Q is routed with B's prefill still on X (README.md)."""
    p = list(range(20))  # P: 20 blocks, cached on X by R0
    return [
        _row(0, 1280, 1, p),  # R0: caches P on X (first and last token at 10)
        # A: P + 7 blocks, 448 tokens uncached (X busy); first token at 30
        _row(20, 1728, 20, [*p, *range(100, 107)]),
        # B: P + 6 blocks, 384 tokens uncached, on X by its overlap; same pass as A, after it
        _row(20, 1664, 20, [*p, *range(200, 206)]),
        # R: 18 fresh blocks (1,152 tokens) on Y, prefilling 22-32 (Y busy at 30)
        _row(22, 1152, 20, list(range(300, 318))),
        # Q: 2 fresh blocks; both targets busy at 25, so it waits until X's pass ends at 30
        _row(25, 128, 5, [400, 401]),
    ]


# cases d and e: 2 workers, fixed timing 10 / 1.5 ms, a target busy above 0.05 x 8192 tokens
SMALL_QUEUE: dict[str, Any] = {
    "num_workers": 2,
    "engine": {"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.5}},
    "router": {"router_queue_threshold": 0.05},
    "servesim_overrides": (
        "timing=fixed",
        "timing.prefill_ms=10.0",
        "timing.decode_ms=1.5",
        "router.queue_threshold=0.05",
    ),
}


CASES = [
    Case(
        "a_families_2w",
        "300 requests from 24 prompt families (system prompts of 4-24 blocks), 2 workers of "
        "700 KV blocks (too few to keep every family on both)",
        lambda: families_trace(seed=11, n=300, n_families=24, mean_gap_ms=60.0),
        num_workers=2,
        engine={"num_gpu_blocks": 700},
        servesim_overrides=("engine.num_gpu_blocks=700",),
    ),
    Case(
        "b_families_4w",
        "350 requests from 8 prompt families, a fifth of them follow-ups extending an earlier "
        "prompt, 4 workers",
        lambda: families_trace(seed=12, n=350, n_families=8, mean_gap_ms=25.0, follow_up=0.2),
        num_workers=4,
    ),
    Case(
        "c_queue_tight_4w",
        "300 requests from 16 families, 4 workers of 600 KV blocks (evictions: removal events "
        "reach the router's index), pending queue at 0.1 x the token budget",
        lambda: families_trace(seed=13, n=300, n_families=16, mean_gap_ms=10.0),
        num_workers=4,
        engine={"num_gpu_blocks": 600},
        router={"router_queue_threshold": 0.1},
        servesim_overrides=("engine.num_gpu_blocks=600", "router.queue_threshold=0.1"),
    ),
    Case(
        "d_same_instant_release",
        "5 requests, 2 workers, fixed timing 10 / 1.5 ms, queue threshold 0.05: a queued "
        "request released at a pass end that also ends another request (a difference "
        "servesim had, fixed)",
        same_instant_release_trace,
        **SMALL_QUEUE,
    ),
    Case(
        "e_first_tokens_one_at_a_time",
        "5 requests, 2 workers, fixed timing 10 / 1.5 ms, queue threshold 0.05: one pass end "
        "gives two requests their first tokens while a request waits; the first one's signal "
        "releases it, before the second's is applied",
        first_tokens_one_at_a_time_trace,
        per_request=True,
        **SMALL_QUEUE,
    ),
    Case(
        "f_families_dp2",
        "400 requests from 24 prompt families, a fifth of them follow-ups, 2 workers with "
        "dp_size 2 (4 targets) of 300 KV blocks per rank (evictions); routes.jsonl keeps run "
        "0's records and targets",
        lambda: families_trace(seed=35, n=400, n_families=24, mean_gap_ms=30.0, follow_up=0.2),
        num_workers=2,
        engine={"num_gpu_blocks": 300},
        servesim_overrides=("engine.num_gpu_blocks=300",),
        dp_size=2,
        routes=True,
    ),
]


# --------------------------------------------------------------------------- writing


def write_trace(rows: list[Row], path: Path) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    size = len(text.encode())
    if size >= MAX_TRACE_BYTES:
        raise SystemExit(f"{path}: {size} bytes; fixtures must stay under {MAX_TRACE_BYTES}")
    path.write_text(text)


def relabel_workers(records: list[Row]) -> list[Row]:
    """`records` in the golden order (tests/golden/mocker's sort key), with decode worker ids
    renumbered 0, 1, ... in order of first use."""
    out = sorted(records, key=MOCKER_FIXTURES._sort_key)
    labels: dict[int, int] = {}
    for rec in out:
        w = rec["decode_worker_idx"]
        if w is not None:
            rec["decode_worker_idx"] = labels.setdefault(w, len(labels))
    return out


# what routes.jsonl keeps of a record: the request, what the test compares, and of its routing
# decision the target (scheduler id: worker x dp_size + rank) and the overlaps the router saw
ROUTE_RECORD_FIELDS = (
    "arrival_time_ms",
    "input_length",
    "requested_output_length",
    "first_token_ms",
    "terminal_time_ms",
    "output_length",
    "reused_input_tokens",
    "terminal_status",
)
ROUTE_FIELDS = ("scheduler_id", "selected_overlap_blocks", "best_available_overlap_blocks")


def write_routes(records: list[Row], case_dir: Path) -> None:
    """`routes.jsonl`: one mocker run's records (ROUTE_RECORD_FIELDS) with where the router
    sent each request (ROUTE_FIELDS of its one routing decision), so a test can send servesim's
    requests to the same targets. Stops if two requests share (arrival, input length,
    requested output), the key the test finds a request's route by."""
    rows = []
    for rec in records:
        (decision,) = rec["routing_history"]
        row = {f: rec[f] for f in ROUTE_RECORD_FIELDS}
        row.update({f: decision[f] for f in ROUTE_FIELDS})
        rows.append(row)
    keys = {(r["arrival_time_ms"], r["input_length"], r["requested_output_length"]) for r in rows}
    if len(keys) != len(rows):
        raise SystemExit(f"{case_dir.name}: requests share (arrival, input, output); no routes")
    rows.sort(key=MOCKER_FIXTURES._sort_key)
    (case_dir / "routes.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    )


def run_mocker(case: Case, case_dir: Path, runs: int) -> None:
    import dynamo._core as core  # only in the mocker's environment

    kwargs = case.mocker_kwargs()
    records = []
    first: dict[str, Any] = {}
    first_requests: list[Row] = []
    wall = 0.0
    raw = case_dir / "requests.raw.jsonl"
    for i in range(runs):
        # a fresh KvRouterConfig per run (the replay takes it by value)
        cfg = core.KvRouterConfig.from_json(json.dumps(kwargs["router_config"]))
        keep = case.per_request or (case.routes and i == 0)
        report = {"report_jsonl_path": str(raw)} if keep else {}
        t0 = time.perf_counter()
        result = core.run_mocker_trace_replay(
            [str(case_dir / "trace.jsonl")], **{**kwargs, "router_config": cfg, **report}
        )
        wall += time.perf_counter() - t0
        summary = dict(result.summary)
        if i == 0:
            first = {k: v for k, v in summary.items() if k not in WALL_KEYS}
        records.append({k: summary[k] for k in RUN_KEYS})
        if case.routes and i == 0:
            write_routes([json.loads(x) for x in raw.read_text().splitlines() if x], case_dir)
            if not case.per_request:
                raw.unlink()
        if case.per_request:
            fields = MOCKER_FIXTURES.REQUEST_FIELDS
            lines = raw.read_text().splitlines()
            raw.unlink()
            recs = relabel_workers([{f: json.loads(x)[f] for f in fields} for x in lines if x])
            if i == 0:
                first_requests = recs
            elif recs != first_requests:
                raise SystemExit(f"{case.name}: mocker run {i} differs from run 0 per request")
    if case.per_request:
        (case_dir / "requests.jsonl").write_text(
            "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in first_requests)
        )
    version = f"ai-dynamo-runtime {metadata.version('ai-dynamo-runtime')}"
    first["_mocker_version"] = version
    (case_dir / "summary.json").write_text(json.dumps(first, indent=1) + "\n")
    stats = {
        stat: {k: fn([r[k] for r in records]) for k in RUN_KEYS}
        for stat, fn in (("mean", lambda v: sum(v) / len(v)), ("min", min), ("max", max))
    }
    out = {"_mocker_version": version, "runs": records, **stats}
    (case_dir / "runs.json").write_text(json.dumps(out, indent=1) + "\n")
    lo, hi, mean = stats["min"], stats["max"], stats["mean"]
    spread = ", ".join(
        f"{k} {mean[k]:.4f} [{lo[k]:.4f}, {hi[k]:.4f}]"
        for k in ("prefix_cache_reused_ratio", "mean_ttft_ms", "mean_itl_ms", "mean_e2e_latency_ms")
    )
    print(f"{case.name}: {runs} runs, {wall:.2f} s; {spread}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces-only", action="store_true", help="write traces and case.json only")
    ap.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="mocker runs per case")
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    args = ap.parse_args(argv)
    chosen = [c for c in CASES if not args.cases or c.name in args.cases]
    for case in chosen:
        case_dir = HERE / case.name
        case_dir.mkdir(exist_ok=True)
        write_trace(case.trace(), case_dir / "trace.jsonl")
        spec = {
            "name": case.name,
            "description": case.description,
            "trace": "trace.jsonl",
            "servesim_overrides": case.overrides(),
            "mocker_kwargs": case.mocker_kwargs(),
        }
        (case_dir / "case.json").write_text(json.dumps(spec, indent=1) + "\n")
        if not args.traces_only:
            run_mocker(case, case_dir, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
