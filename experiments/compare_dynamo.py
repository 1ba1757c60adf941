"""Compare servesim with NVIDIA Dynamo's mocker (offline trace replay) on the same traces.

For every trace x cluster shape this runs

* servesim: `model.simulate` on a RunConfig composed from conf/ with Hydra's compose API
  (`experiment=dynamo_compat workload=mooncake workload.path=TRACE output.progress=off`, the
  shape -- `topology.num_workers=N`, or `topology=disagg topology.num_prefill_workers=P
  topology.num_decode_workers=D` -- and every `--override`), and
* the mocker: `dynamo._core.run_mocker_trace_replay([TRACE], ...)` with the settings
  translated from that same RunConfig (`mocker_kwargs`): the engine block (num_gpu_blocks,
  block_size, max_num_seqs, max_num_batched_tokens, prefix caching, chunked prefill,
  max_model_len, speed-up ratios, preemption mode) and the timing model (polynomial or fixed);
  the workload's trace_block_size, the load's arrival_speedup_ratio or concurrency and the
  stop time become keyword arguments.
  - Aggregated workers: `num_workers` and `extra_engine_args={"engine": {...},
    "tensor_parallel_size": tp}` (plus `dp_size` when it is not 1).
  - Prefill/decode disaggregation (`--pd PxD`, or `--override topology=disagg ...`):
    `num_prefill_workers`, `num_decode_workers`, and `prefill_engine_args` /
    `decode_engine_args` built from servesim's per-role engines
    (`servesim.config.derived.role_engines`: `engine` with `topology.prefill.*` /
    `topology.decode.*`), each `{"engine": {..., "worker_type": ROLE}, "dp_size": dp,
    "tensor_parallel_size": tp}`. The link goes on the prefill args, the only ones the mocker
    reads it from: `kv_transfer_bandwidth` (link.bandwidth_gbps, decimal GB/s; null = instant),
    `kv_bytes_per_token` (link.kv_bytes_per_token, or the llm geometry: 131072 for
    Llama-3.1-8B) and `kv_transfer_timing_mode` (link.timing_mode). No `extra_engine_args`.

  - router=kv: `router_mode="kv_router"`, `router_config` (a `KvRouterConfig` built from
    servesim's router.* knobs: overlap_score_credit, prefill_load_scale, host/disk hit
    weights, decode_active_request_weight, router_temperature, router_queue_threshold,
    router_queue_policy) and `kv_event_lag_ms`; round_robin: `router_mode="round_robin"`.

  - workload=agentic_mooncake (`--override workload=agentic_mooncake`): `trace_format=
    "agentic_mooncake"`, `agentic_lanes` and `execution_model` (llm.name); lanes must use
    `workload.agentic_lane_assignment=shared_queue`, the default (the mocker's lanes take the
    next unstarted play; stride is refused), and snapshots, warmup and profiles have no offline
    counterpart there.

  A setting the mocker cannot express stops the run (exit status 2): another timing model or
  polynomial coefficients, a random router, session affinity (router.affinity.mode), a
  workload other than mooncake / agentic_mooncake, a rate load; in P/D also
  link.latency_ms > 0 (e.g. link=infiniband), link.contention other than per_request,
  link.state_bytes > 0 and per-pair links (link.pairs).

and prints, per case, servesim's value, the mocker's value and their difference for: mean,
median and p90 of TTFT, ITL, TPOT and E2E latency; request, output and total throughput; prefix
cache reuse; duration; completed requests; prefill and decode worker-seconds and GPU hours.
Targets: latencies within 2 % (relative), throughputs, duration, completed requests,
worker-seconds and GPU hours within 1 % (relative), prefix reuse within 0.01 (absolute). The
mocker's ITL percentiles come from a DDSketch (0.1 % error); servesim's are exact. Each side's
wall time (the simulate / replay call alone) and their ratio are reported. With
`--per-request` every servesim request (as servesim's requests.jsonl writer renders it) is
also joined with the mocker's per-request records (`report_jsonl_path`) and the differences
are counted (informational): arrival, first-token and terminal times, and in P/D the
lifecycle (prefill_admit_ms, source_held_ms, destination_reserved_ms,
destination_activated_ms, decode_admit_ms, source_released_ms) to 1e-7 ms; reused tokens and
output lengths; prefill and decode worker ids (scheduler ids, worker x dp_size + rank); the
terminal status (servesim `rejected` = mocker `failed` for a prompt no decode rank can hold).

The mocker is imported if `dynamo._core` is importable here; otherwise it runs in its own
interpreter (`--mocker-python`, default $SERVESIM_MOCKER_PYTHON: a virtual environment with
`pip install ai-dynamo-runtime==1.6.1`) through experiments/_mocker_runner.py, with JSON in and
out.

    python experiments/compare_dynamo.py --trace conversation_trace.jsonl,synthetic_trace.jsonl \\
        --workers 1,2,4 --out results.json --markdown table.md
    python experiments/compare_dynamo.py --trace T --override engine.num_gpu_blocks=4096 \\
        --override timing=fixed --override timing.prefill_ms=10
    python experiments/compare_dynamo.py --trace T --pd 1x1,2x2 --override link.bandwidth_gbps=25 \\
        --override topology.decode.num_gpu_blocks=4096 --per-request
    python experiments/compare_dynamo.py --trace T --override topology=disagg \\
        --override topology.num_prefill_workers=2 --override topology.num_decode_workers=2

Exit status: 0 if every target is met, 1 if any is missed, 2 on a configuration or run error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, cast

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from servesim import Result, RunConfig, compose, simulate
from servesim.config import num_gpu_blocks
from servesim.config.derived import (
    cache_layout,
    kv_bytes_per_token,
    role_engines,
    transfer_bytes_per_token,
)
from servesim.config.schema import (
    AgenticMooncakeWorkload,
    ConcurrencyLoad,
    DisaggTopology,
    FixedTiming,
    KvRouter,
    MooncakeWorkload,
    PolynomialTiming,
    RoundRobinRouter,
    TraceLoad,
    VllmEngineConfig,
)
from servesim.rundir import write_requests_jsonl

REPO = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).resolve().with_name("_mocker_runner.py")
BASE_OVERRIDES = ("experiment=dynamo_compat", "workload=mooncake", "output.progress=off")

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


class UnsupportedConfig(ValueError):
    """A servesim setting that the mocker's trace replay cannot express."""


# --------------------------------------------------------------------------- servesim


@dataclass(frozen=True)
class Shape:
    """A cluster shape: `workers` aggregated workers, or `prefill` x `decode` P/D pools; all
    None: the shape the overrides give (e.g. `--override topology=disagg ...`)."""

    workers: int | None = None
    prefill: int | None = None
    decode: int | None = None

    def overrides(self, user: Sequence[str]) -> list[str]:
        if self.workers is not None:
            return [f"topology.num_workers={self.workers}"]
        if self.prefill is None:
            return []
        out = [] if "topology=disagg" in user else ["topology=disagg"]
        return [
            *out,
            f"topology.num_prefill_workers={self.prefill}",
            f"topology.num_decode_workers={self.decode}",
        ]


def parse_pd(text: str) -> Shape:
    """`PxD` (e.g. 2x2, or 2P2D) as a P/D shape."""
    t = text.strip().lower().replace("p", "x").replace("d", "")
    parts = [x for x in t.split("x") if x]
    if len(parts) != 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
        raise ValueError(f"--pd takes PxD pool sizes such as 1x1,2x2; got {text!r}")
    return Shape(prefill=int(parts[0]), decode=int(parts[1]))


def shape_title(cfg: RunConfig) -> str:
    topo = cfg.topology
    if isinstance(topo, DisaggTopology):
        return f"{topo.num_prefill_workers}P{topo.num_decode_workers}D"
    n = topo.num_workers
    return f"{n} worker{'s' if n > 1 else ''}"


def compose_run_config(trace: Path, shape: Shape | int, overrides: Sequence[str] = ()) -> RunConfig:
    """servesim's RunConfig for one case, composed from conf/ as the `servesim` CLI would
    (`shape` an int: that many aggregated workers)."""
    if isinstance(shape, int):
        shape = Shape(workers=shape)
    base = list(BASE_OVERRIDES)
    if any(o.startswith("workload=") for o in overrides):  # e.g. workload=agentic_mooncake
        base.remove("workload=mooncake")
    return compose([*base, f"workload.path={trace}", *shape.overrides(overrides), *overrides])


def run_servesim(cfg: RunConfig) -> tuple[Result, float]:
    """The run's result and the wall time of `simulate` in seconds."""
    start = time.perf_counter()
    result = simulate(cfg)
    return result, time.perf_counter() - start


# --------------------------------------------------------------------------- translation


def _timing_model(cfg: RunConfig, problems: list[str]) -> dict[str, Any]:
    timing = cfg.timing
    if isinstance(timing, PolynomialTiming):
        if timing != PolynomialTiming():
            problems.append(
                "timing: the mocker's polynomial has fixed coefficients; servesim's differ "
                f"({timing.model_dump(exclude={'kind'})})"
            )
        return {"type": "polynomial"}
    if isinstance(timing, FixedTiming):
        return {"type": "fixed", "prefill_ms": timing.prefill_ms, "decode_ms": timing.decode_ms}
    problems.append(f"timing={timing.kind}: the mocker takes only polynomial or fixed timing")
    return {}


def _engine_args(
    cfg: RunConfig, engine: VllmEngineConfig, timing_model: dict[str, Any]
) -> dict[str, Any]:
    """The mocker's `engine` block for one servesim engine (a role's, in P/D), with the KV
    tiers when they are on: `native_host_offload` (and `g3_offload`) take servesim's
    `kv_cache.host_offload` (and `kv_cache.disk`) field for field, and the host block size
    comes from `kv_cache_bytes_per_token`."""
    return {**_base_engine_args(cfg, engine, timing_model), **_tier_args(cfg)}


def _tier_args(cfg: RunConfig) -> dict[str, Any]:
    host = cfg.kv_cache.host_offload
    if host.num_host_blocks is None:
        return {}
    out: dict[str, Any] = {
        "kv_cache_bytes_per_token": kv_bytes_per_token(cfg.llm),
        "native_host_offload": host.model_dump(),
    }
    if host.scope == "cluster_shared":
        # the mocker names the layout a shared pool requires; servesim derives it
        block_size, per_gpu = cache_layout(cfg, cfg.engine)
        out["native_host_offload"]["kv_layout_id"] = f"block{block_size}x{per_gpu}B"
    if cfg.kv_cache.disk.num_g3_blocks is not None:
        out["g3_offload"] = cfg.kv_cache.disk.model_dump()
    return out


def _base_engine_args(
    cfg: RunConfig, engine: VllmEngineConfig, timing_model: dict[str, Any]
) -> dict[str, Any]:
    return {
        "backend": "vllm",
        "num_gpu_blocks": num_gpu_blocks(cfg, engine),
        "block_size": engine.block_size,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "enable_chunked_prefill": engine.enable_chunked_prefill,
        "max_model_len": engine.max_model_len,
        "speedup_ratio": engine.speedup_ratio,
        "decode_speedup_ratio": engine.decode_speedup_ratio,
        "preemption_mode": engine.preemption_mode,
        "timing_model": timing_model,
    }


def _disagg_args(
    cfg: RunConfig, timing_model: dict[str, Any], problems: list[str]
) -> dict[str, Any]:
    """`prefill_engine_args` / `decode_engine_args` and the pool sizes of a P/D run. The
    transfer settings (bandwidth, bytes per token, timing mode) go on the prefill args, the
    only ones the mocker reads them from; dp_size and tensor_parallel_size are launch fields
    at the top of each args dict."""
    topo = cfg.topology
    assert isinstance(topo, DisaggTopology)
    link = cfg.link
    if link.latency_ms > 0:
        problems.append(
            f"link.latency_ms={link.latency_ms}: the mocker's transfer is bytes / bandwidth, "
            "with no latency (use link.latency_ms=0)"
        )
    if link.contention != "per_request":
        problems.append(
            f"link.contention={link.contention}: the mocker runs every transfer at the full "
            "line rate (per_request)"
        )
    if link.state_bytes > 0:
        problems.append(
            f"link.state_bytes={link.state_bytes}: the mocker moves KV bytes per token only"
        )
    if link.pairs:
        problems.append("link.pairs: the mocker has one bandwidth for every prefill/decode pair")
    engines = role_engines(cfg)
    bytes_per_token = transfer_bytes_per_token(cfg)
    out: dict[str, Any] = {
        "num_prefill_workers": topo.num_prefill_workers,
        "num_decode_workers": topo.num_decode_workers,
    }
    for role in ("prefill", "decode"):
        engine = engines[role]
        block = {**_engine_args(cfg, engine, timing_model), "worker_type": role}
        if role == "prefill":
            block |= {
                "kv_transfer_bandwidth": link.bandwidth_gbps,
                "kv_bytes_per_token": bytes_per_token,
                "kv_transfer_timing_mode": link.timing_mode,
            }
        out[f"{role}_engine_args"] = {
            "engine": block,
            "dp_size": engine.dp_size,
            "tensor_parallel_size": engine.tp_size,
        }
    return out


def _router_args(cfg: RunConfig, problems: list[str]) -> dict[str, Any]:
    """`router_mode` and, for router=kv, `router_config` (the fields of the mocker's
    KvRouterConfig, as JSON; the runner builds the object) and `kv_event_lag_ms`."""
    router = cfg.router
    if isinstance(router, RoundRobinRouter):
        return {"router_mode": "round_robin"}
    if not isinstance(router, KvRouter):
        problems.append(f"router={router.kind}: the mocker replays with round_robin or kv only")
        return {}
    if router.affinity.mode != "off":
        problems.append(
            "router.affinity.mode: the mocker's offline replay (1.6.1) has no session affinity"
        )
    out: dict[str, Any] = {
        "router_mode": "kv_router",
        "router_config": {
            "overlap_score_credit": router.overlap_score_credit,
            "prefill_load_scale": router.prefill_load_scale,
            "host_cache_hit_weight": router.host_cache_hit_weight,
            "disk_cache_hit_weight": router.disk_cache_hit_weight,
            "decode_active_request_weight": router.decode_active_request_weight,
            "router_temperature": router.temperature,
            "router_queue_threshold": router.queue_threshold,
            "router_queue_policy": router.queue_policy,
        },
    }
    if router.kv_event_lag_ms > 0:
        out["kv_event_lag_ms"] = router.kv_event_lag_ms
    return out


def _agentic_args(
    cfg: RunConfig, workload: AgenticMooncakeWorkload, problems: list[str]
) -> dict[str, Any]:
    """An agentic Mooncake file: `trace_format="agentic_mooncake"`, `agentic_lanes`, and the
    configured model as `execution_model` (the mocker projects every node onto it)."""
    out: dict[str, Any] = {
        "trace_format": "agentic_mooncake",
        "trace_block_size": workload.trace_block_size,
        "execution_model": cfg.llm.name,
    }
    if workload.agentic_lanes is not None:
        out["agentic_lanes"] = workload.agentic_lanes
        if workload.agentic_lane_assignment != "shared_queue":
            problems.append(
                "workload.agentic_lane_assignment=stride: the mocker's lanes take the next "
                "unstarted play (workload.agentic_lane_assignment=shared_queue, the default)"
            )
    for key in ("agentic_snapshot", "agentic_profile"):
        if getattr(workload, key) is not None:
            problems.append(f"workload.{key}: the mocker's offline replay has no {key}")
    if workload.agentic_warmup:
        problems.append("workload.agentic_warmup: the mocker's offline replay has no warmup")
    return out


def mocker_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments of `run_mocker_trace_replay` equivalent to servesim's `cfg` (the
    trace list and report path aside). Raises UnsupportedConfig naming every setting the
    mocker cannot express.

    Aggregated: `num_workers` and `extra_engine_args`. P/D (`topology=disagg`):
    `num_prefill_workers`, `num_decode_workers`, `prefill_engine_args` and
    `decode_engine_args` from servesim's per-role engines (no `extra_engine_args`)."""
    problems: list[str] = []
    timing_model = _timing_model(cfg, problems)
    kwargs: dict[str, Any] = {}
    if isinstance(cfg.topology, DisaggTopology):
        kwargs |= _disagg_args(cfg, timing_model, problems)
    else:
        kwargs["num_workers"] = cfg.topology.num_workers
    kwargs |= _router_args(cfg, problems)
    workload = cfg.workload
    if isinstance(workload, MooncakeWorkload):
        kwargs["trace_block_size"] = workload.trace_block_size
        if workload.max_requests is not None:
            problems.append("workload.max_requests: the mocker replays whole files")
    elif isinstance(workload, AgenticMooncakeWorkload):
        kwargs |= _agentic_args(cfg, workload, problems)
    else:
        problems.append(f"workload={workload.kind}: the comparison replays Mooncake traces")
    load = cfg.load
    if isinstance(load, TraceLoad):
        kwargs["arrival_speedup_ratio"] = load.arrival_speedup_ratio
    elif isinstance(load, ConcurrencyLoad):
        kwargs["replay_concurrency"] = load.concurrency
    else:
        problems.append(f"load={load.kind}: the mocker's trace replay has no rate load")
    if cfg.stop.max_virtual_time_ms is not None:
        kwargs["max_sim_time_ms"] = cfg.stop.max_virtual_time_ms
    if not isinstance(cfg.topology, DisaggTopology):
        engine = cfg.engine
        extra: dict[str, Any] = {
            "engine": _engine_args(cfg, engine, timing_model),
            "tensor_parallel_size": engine.tp_size,
        }
        if engine.dp_size != 1:
            extra["dp_size"] = engine.dp_size
        kwargs["extra_engine_args"] = extra
    if problems:
        raise UnsupportedConfig("cannot run on the mocker:\n  " + "\n  ".join(problems))
    return kwargs


# --------------------------------------------------------------------------- mocker


@dataclass(frozen=True)
class MockerRunner:
    """How the mocker runs: in this interpreter, or in `python` through the runner script."""

    python: Path | None  # None: in-process

    def describe(self) -> str:
        return "in-process" if self.python is None else f"subprocess: {self.python}"

    def run(self, trace: Path, kwargs: dict[str, Any]) -> tuple[dict[str, Any], float, float]:
        """The mocker's summary, the wall time of the replay call and of the whole run (s).
        With `report_jsonl_path` in `kwargs` the mocker also writes its per-request records."""
        start = time.perf_counter()
        if self.python is None:
            out = _runner_module().run([str(trace)], kwargs)
        else:
            out = self._subprocess(trace, kwargs)
        return out["summary"], float(out["call_wall_s"]), time.perf_counter() - start

    def _subprocess(self, trace: Path, kwargs: dict[str, Any]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="compare_dynamo_") as tmp:
            request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
            request.write_text(json.dumps({"trace_files": [str(trace)], "kwargs": kwargs}))
            proc = subprocess.run(
                [str(self.python), str(RUNNER), str(request), str(result)],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
                raise RuntimeError(
                    f"mocker run failed (exit {proc.returncode}) for {trace}:\n{tail}"
                )
            return json.loads(result.read_text())


def _runner_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_mocker_runner", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _mocker_importable() -> bool:
    try:
        return importlib.util.find_spec("dynamo._core") is not None
    except ModuleNotFoundError:
        return False


def choose_runner(mocker_python: str | None) -> MockerRunner:
    """In-process if `dynamo._core` imports here, else the interpreter given by
    `--mocker-python` or $SERVESIM_MOCKER_PYTHON."""
    if _mocker_importable():
        return MockerRunner(None)
    candidate = mocker_python or os.environ.get("SERVESIM_MOCKER_PYTHON")
    if not candidate:
        raise RuntimeError(
            "dynamo._core is not importable here and no mocker interpreter is given: set "
            "SERVESIM_MOCKER_PYTHON (or pass --mocker-python) to the python of a virtual "
            "environment with `pip install ai-dynamo-runtime==1.6.1`"
        )
    if not Path(candidate).exists():
        raise RuntimeError(f"mocker interpreter {candidate} does not exist")
    return MockerRunner(Path(candidate))


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


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    trace: str
    shape: str  # "N worker(s)" (aggregated) or "PxD" pools ("1P1D", "2P2D")
    overrides: list[str]
    mocker_kwargs: dict[str, Any]
    servesim_wall_s: float
    mocker_wall_s: float
    mocker_process_wall_s: float
    rows: list[Row]
    servesim_summary: dict[str, Any] = field(repr=False)
    mocker_summary: dict[str, Any] = field(repr=False)
    label: str = ""  # the trace's name in tables: its file name unless that is ambiguous
    per_request: PerRequest | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def wall_ratio(self) -> float:
        return self.servesim_wall_s / self.mocker_wall_s if self.mocker_wall_s > 0 else math.inf

    @property
    def title(self) -> str:
        return f"{self.label or self.trace}, {self.shape}"

    def worst(self, kind: Kind) -> float:
        diffs = [abs(r.diff) for r in self.rows if r.kind == kind and r.diff is not None]
        return max(diffs, default=math.nan)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ok=self.ok, wall_ratio=self.wall_ratio)
        return out


def run_case(
    trace: Path,
    shape: Shape | int,
    overrides: Sequence[str],
    runner: MockerRunner,
    label: str = "",
    check_requests: bool = False,
) -> Case:
    cfg = compose_run_config(trace, shape, overrides)
    kwargs = mocker_kwargs(cfg)
    result, servesim_wall = run_servesim(cfg)
    servesim = result.summary
    joined = None
    if check_requests:
        with tempfile.TemporaryDirectory(prefix="compare_dynamo_") as tmp:
            report = Path(tmp) / "requests.jsonl"
            mocker, mocker_wall, mocker_process_wall = runner.run(
                trace, {**kwargs, "report_jsonl_path": str(report)}
            )
            joined = per_request(result, report)
    else:
        mocker, mocker_wall, mocker_process_wall = runner.run(trace, kwargs)
    return Case(
        trace=str(trace),
        shape=shape_title(cfg),
        overrides=list(overrides),
        mocker_kwargs=kwargs,
        servesim_wall_s=servesim_wall,
        mocker_wall_s=mocker_wall,
        mocker_process_wall_s=mocker_process_wall,
        rows=compare(servesim, mocker),
        servesim_summary=servesim,
        mocker_summary=mocker,
        label=label or trace.name,
        per_request=joined,
    )


# --------------------------------------------------------------------------- formatting


def fmt_value(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or (float(x).is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.1f}"
    if abs(x) >= 1:
        return f"{x:,.3f}"
    return f"{x:.5f}"


def _signed(x: float, decimals: int) -> str:
    """Fixed point, or scientific when fixed point would round a non-zero value to zero."""
    if x == 0:
        return "0"
    if abs(x) < 0.5 * 10**-decimals:
        return f"{x:+.1e}"
    return f"{x:+.{decimals}f}"


def fmt_diff(kind: Kind, diff: float | None) -> str:
    if diff is None:
        return "missing"
    if kind == "reuse":
        return _signed(diff, 5)
    return _signed(diff * 100, 4) + " %"


def fmt_target(kind: Kind) -> str:
    return f"±{TARGETS[kind]:.2f}" if kind == "reuse" else f"±{TARGETS[kind] * 100:g} %"


def _cells(row: Row) -> list[str]:
    return [
        row.metric,
        fmt_value(row.servesim),
        fmt_value(row.mocker),
        fmt_diff(row.kind, row.diff),
        fmt_target(row.kind),
        "ok" if row.ok else "MISS",
    ]


HEADER = ["metric", "servesim", "mocker", "diff", "target", ""]


def wall_line(case: Case) -> str:
    return (
        f"wall time: servesim {case.servesim_wall_s:.2f} s, mocker {case.mocker_wall_s:.2f} s "
        f"(replay call; {case.mocker_process_wall_s:.2f} s with process start-up), "
        f"servesim / mocker = {case.wall_ratio:.1f}x"
    )


def text_table(case: Case) -> str:
    lines = [[*HEADER], *(_cells(r) for r in case.rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    out = [f"== {case.title}" + (f"  ({' '.join(case.overrides)})" if case.overrides else "")]
    for k, line in enumerate(lines):
        out.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append(wall_line(case))
    if case.per_request is not None:
        out.append(case.per_request.line())
    out.append(
        "all targets met"
        if case.ok
        else "TARGETS MISSED: " + ", ".join(r.metric for r in case.rows if not r.ok)
    )
    return "\n".join(out)


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def worst_per_metric(cases: Sequence[Case]) -> list[tuple[Metric, float | None, str]]:
    """Per metric, the difference of largest magnitude over the cases and the case it is in
    ("all" when every case has the same difference, e.g. 0; None: missing in some case)."""
    out: list[tuple[Metric, float | None, str]] = []
    for i, m in enumerate(METRICS):
        diffs = [(c.rows[i].diff, c.title) for c in cases]
        if any(d is None for d, _ in diffs):
            out.append((m, None, next(t for d, t in diffs if d is None)))
            continue
        worst, title = max(diffs, key=lambda dt: abs(cast(float, dt[0])))
        if len(cases) > 1 and all(d == worst for d, _ in diffs):
            title = "all"
        out.append((m, worst, title))
    return out


def markdown(cases: Sequence[Case], overrides: Sequence[str]) -> str:
    """An overview table, the worst difference per metric and one side-by-side table per
    case."""
    extra = f" with overrides `{' '.join(overrides)}`" if overrides else ""
    out = [
        f"Overview (servesim vs mocker{extra}; diff = servesim / mocker - 1, prefix reuse as an "
        "absolute difference; wall = the simulate / replay call alone):",
        "",
        _md_row(
            [
                "trace",
                "cluster",
                "worst latency diff",
                "worst throughput diff",
                "prefix reuse diff",
                "servesim wall s",
                "mocker wall s",
                "servesim / mocker",
                "targets",
            ]
        ),
        _md_row(["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---"]),
    ]
    for c in cases:
        reuse = next(r for r in c.rows if r.kind == "reuse")
        out.append(
            _md_row(
                [
                    c.label,
                    c.shape,
                    _signed(c.worst("latency") * 100, 4).lstrip("+") + " %",
                    _signed(c.worst("throughput") * 100, 4).lstrip("+") + " %",
                    fmt_diff("reuse", reuse.diff),
                    f"{c.servesim_wall_s:.2f}",
                    f"{c.mocker_wall_s:.2f}",
                    f"{c.wall_ratio:.1f}x",
                    "met" if c.ok else "**missed**",
                ]
            )
        )
    out += [
        "",
        "Worst difference per metric over these cases:",
        "",
        _md_row(["metric", "worst diff", "case"]),
        _md_row(["---", "---:", "---"]),
    ]
    for m, diff, title in worst_per_metric(cases):
        out.append(_md_row([m.key, fmt_diff(m.kind, diff), title]))
    for c in cases:
        out += ["", f"### {c.title}", "", _md_row(HEADER), _md_row(["---", *["---:"] * 5])]
        out += [_md_row(_cells(r)) for r in c.rows]
        out += ["", wall_line(c) + "."]
        if c.per_request is not None:
            line = c.per_request.line()
            out += ["", line[0].upper() + line[1:] + "."]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- CLI


def _split(values: Sequence[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--trace", action="append", required=True, help="Mooncake JSONL (repeatable, or a,b,c)"
    )
    ap.add_argument(
        "--workers",
        help="aggregated worker counts, e.g. 1,2,4 (default 1 unless --pd or "
        "--override topology=disagg is given)",
    )
    ap.add_argument(
        "--pd",
        help="prefill/decode disaggregation cases as PxD pool sizes, e.g. 1x1,2x2 (adds "
        "topology=disagg; the link and per-role engines come from the overrides, e.g. "
        "--override link.bandwidth_gbps=25 --override topology.decode.num_gpu_blocks=4096)",
    )
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override for servesim (repeatable); translated for the mocker too",
    )
    ap.add_argument("--out", type=Path, help="write every case (rows, summaries) as JSON")
    ap.add_argument("--markdown", type=Path, help="write the tables as Markdown")
    ap.add_argument(
        "--per-request",
        action="store_true",
        help="also join every request with the mocker's report_jsonl_path records and count "
        "differences (informational; the mocker's wall time then includes writing them)",
    )
    ap.add_argument(
        "--mocker-python",
        help="interpreter with dynamo._core when it is not importable here "
        "(default: $SERVESIM_MOCKER_PYTHON)",
    )
    return ap.parse_args(argv)


def case_shapes(workers: str | None, pd: str | None, overrides: Sequence[str]) -> list[Shape]:
    """The cluster shapes to run: `--workers` aggregated counts, then `--pd` P/D pools; with
    neither, 1 worker, or the P/D pools of `--override topology=disagg ...`."""
    disagg = "topology=disagg" in overrides
    shapes: list[Shape] = []
    if workers is not None:
        if disagg:
            raise ValueError(
                "--workers runs aggregated workers; with --override topology=disagg give the "
                "pools as --pd PxD (or topology.num_prefill_workers / num_decode_workers)"
            )
        try:
            shapes += [Shape(workers=int(w)) for w in _split([workers])]
        except ValueError:
            raise ValueError(f"--workers must be integers, got {workers!r}") from None
    if pd is not None:
        shapes += [parse_pd(x) for x in _split([pd])]
    if not shapes:
        shapes = [Shape()] if disagg else [Shape(workers=1)]
    return shapes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    given = _split(args.trace)
    traces = [Path(t).resolve() for t in given]
    names = [t.name for t in traces]
    labels = [n if names.count(n) == 1 else g for n, g in zip(names, given, strict=True)]
    try:
        shapes = case_shapes(args.workers, args.pd, args.override)
    except ValueError as e:
        print(f"compare_dynamo: {e}", file=sys.stderr)
        return 2
    try:
        runner = choose_runner(args.mocker_python)
        cases = []
        for trace, label in zip(traces, labels, strict=True):
            if not trace.is_file():
                raise FileNotFoundError(f"trace {trace} does not exist")
            for shape in shapes:
                case = run_case(trace, shape, args.override, runner, label, args.per_request)
                print(text_table(case) + "\n", flush=True)
                cases.append(case)
    except (RuntimeError, OSError, ValueError, HydraException, OmegaConfBaseException) as e:
        # ValueError covers UnsupportedConfig, servesim's ConfigError and TraceError
        print(f"compare_dynamo: {e}", file=sys.stderr)
        return 2
    ok = all(c.ok for c in cases)
    print(
        f"{sum(c.ok for c in cases)}/{len(cases)} cases met every target; mocker ran "
        f"{runner.describe()}"
    )
    if args.out:
        command = [Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]
        args.out.write_text(
            json.dumps(
                {
                    "command": command,
                    "mocker": runner.describe(),
                    "targets": TARGETS,
                    "all_targets_met": ok,
                    "cases": [c.to_json() for c in cases],
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    if args.markdown:
        args.markdown.write_text(markdown(cases, args.override))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
