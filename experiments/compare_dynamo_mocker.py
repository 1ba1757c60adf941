"""The mocker's side: its replay arguments from servesim's config, and the replay run."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from servesim import RunConfig
from servesim.config import num_gpu_blocks
from servesim.config.cluster import SGLANG_KEYS
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
    EngineConfig,
    FixedTiming,
    KvRouter,
    MooncakeWorkload,
    PolynomialTiming,
    RoundRobinRouter,
    TraceLoad,
)

RUNNER = Path(__file__).resolve().with_name("_mocker_runner.py")


class UnsupportedConfig(ValueError):
    """A servesim setting that the mocker's trace replay cannot express."""


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
    cfg: RunConfig, engine: EngineConfig, timing_model: dict[str, Any]
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
    cfg: RunConfig, engine: EngineConfig, timing_model: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "backend": engine.kind,
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
    return {**out, **_engine_only_args(engine)}


def _engine_only_args(engine: EngineConfig) -> dict[str, Any]:
    """The mocker's keys of one backend (its `sglang` / `trtllm` blocks) and speculation."""
    out: dict[str, Any] = {}
    if engine.kind == "sglang":
        out["sglang"] = {
            k: getattr(engine, k)
            for k in SGLANG_KEYS
            if k != "prefill_decode_interval" and getattr(engine, k) is not None
        }
        if engine.prefill_decode_interval is not None:
            out["prefill_decode_interval"] = engine.prefill_decode_interval
    if engine.kind == "trtllm" and engine.capacity_scheduler_policy is not None:
        out["trtllm"] = {"capacity_scheduler_policy": engine.capacity_scheduler_policy}
    spec = engine.speculative
    if spec.num_speculative_tokens is not None:
        out["aic_nextn"] = spec.num_speculative_tokens
        if spec.acceptance_rates is not None:
            out["aic_nextn_accept_rates"] = ",".join(repr(r) for r in spec.acceptance_rates)
        out["aic_mtp_seed"] = spec.seed
    return out


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
    if cfg.engine.kind not in ("vllm", "sglang", "trtllm"):
        problems.append(
            f"engine.kind={cfg.engine.kind}: the mocker's backends are vllm, sglang, trtllm"
        )
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
    # a subprocess run's limits (None: none): a mocker that hangs on a case is stopped
    timeout_s: float | None = None
    memory_bytes: int | None = None

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
            try:
                proc = subprocess.run(
                    [str(self.python), str(RUNNER), str(request), str(result)],
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    preexec_fn=self._limit_memory if self.memory_bytes else None,
                )
            except subprocess.TimeoutExpired:
                raise RuntimeError(
                    f"mocker run stopped after {self.timeout_s:g} s for {trace}"
                ) from None
            if proc.returncode != 0:
                tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
                raise RuntimeError(
                    f"mocker run failed (exit {proc.returncode}) for {trace}:\n{tail}"
                )
            return json.loads(result.read_text())

    def _limit_memory(self) -> None:
        limit = self.memory_bytes
        assert limit is not None
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


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
