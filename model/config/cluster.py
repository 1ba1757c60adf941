"""Config sections of the cluster: engines, topology, routers, KV transfer links, KV tiers."""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import Field, create_model

from servesim.config.base import NonNegFloat, PositiveFloat, Schema

# --------------------------------------------------------------------------- engine


Rate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class SpeculativeConfig(Schema):
    """Speculative decoding / multi-token prediction (MTP), as burst sampling: each decode step
    a request emits 1 + its leading accepted drafts (the mocker's `aic_nextn`)."""

    num_speculative_tokens: int | None = Field(
        None, ge=1, le=5, description="k draft tokens per decode step (1..5); null = off"
    )
    acceptance_rates: list[Rate] | None = Field(
        None,
        description="conditional acceptance rate of draft i given drafts 1..i-1 were accepted; "
        "padded with 0 or cut to k; null = the mocker's 0.85, 0.3, 0, 0, 0",
    )
    seed: int = Field(
        42, ge=0, description="acceptance draws; each rank seeds with seed + its scheduler id"
    )


# The engine kinds servesim ships, and the engine keys only one of them reads (rules.py
# refuses them, by config path, under any other engine).
SGLANG_KEYS = (
    "schedule_policy",
    "max_prefill_tokens",
    "chunked_prefill_size",
    "clip_max_new_tokens",
    "schedule_conservativeness",
    "prefill_decode_interval",
)
TRTLLM_KEYS = ("capacity_scheduler_policy",)


class EngineConfig(Schema):
    """One engine: the scheduler policy `kind` (vllm, sglang, trtllm, or a registered plug-in)
    and its limits. Keys of one engine only (SGLANG_KEYS, TRTLLM_KEYS) stay null elsewhere."""

    kind: str = Field(
        "vllm",
        description="the scheduler policy, by its name in the registry "
        "(servesim.engine.registry): vllm, sglang, trtllm or a plug-in",
    )
    block_size: int = Field(
        64, ge=1, description="tokens per KV block (SGLang: its page size); vllm/trtllm: >= 2"
    )
    num_gpu_blocks: int | None = Field(
        None,
        gt=0,
        description="KV blocks per worker; null derives it from HBM (the mocker's default is "
        "16384, set by experiment=dynamo_compat)",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    memory_fraction_of: Literal["total", "free"] = Field(
        "total",
        description="what gpu_memory_utilization is a fraction of when num_gpu_blocks is "
        "derived: total HBM, for weights and KV (vLLM, SGLang), or the memory free once the "
        "weights and activations are in (TensorRT-LLM's free_gpu_memory_fraction), all KV",
    )
    activation_reserve_gb: NonNegFloat = Field(
        2.0, description="HBM kept for activations and runtime when num_gpu_blocks is derived"
    )
    tp_size: int = Field(1, ge=1)
    dp_size: int = Field(
        1,
        ge=1,
        description="attention data-parallel ranks per worker, each with its own "
        "scheduler and num_gpu_blocks KV pool, run in lock-step",
    )
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0, description="vllm/trtllm pass token budget")
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_model_len: int | None = Field(None, gt=0)
    speedup_ratio: NonNegFloat = 1.0
    decode_speedup_ratio: NonNegFloat = 1.0
    preemption_mode: Literal["lifo", "fifo"] = Field("lifo", description="vllm's victim order")
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    # ---- SGLang only (conf/engine/sglang.yaml)
    schedule_policy: Literal["fifo", "lpm"] | None = Field(
        None, description="sglang: waiting order, fifo or lpm (longest cached prefix first)"
    )
    max_prefill_tokens: int | None = Field(
        None, gt=0, description="sglang: prompt tokens one prefill pass may take"
    )
    chunked_prefill_size: int | None = Field(
        None, gt=0, description="sglang: the largest chunk of one prompt (a multiple of pages)"
    )
    clip_max_new_tokens: int | None = Field(
        None, gt=0, description="sglang: the most future output reserved per running request"
    )
    schedule_conservativeness: NonNegFloat | None = Field(
        None, description="sglang: scales the output reserve (new_token_ratio = 0.7 x this)"
    )
    prefill_decode_interval: int | None = Field(
        None, ge=0, description="sglang: decode-only passes after each prefill pass (0 = none)"
    )
    # ---- TRT-LLM only (conf/engine/trtllm.yaml)
    capacity_scheduler_policy: Literal["guaranteed_no_evict"] | None = Field(
        None, description="trtllm: admit only what fits to completion; never preempt"
    )


# --------------------------------------------------------------------------- topology / router


class AggregatedTopology(Schema):
    """N identical workers, each prefilling and decoding its own requests."""

    kind: Literal["aggregated"] = "aggregated"
    num_workers: int = Field(2, gt=0)


def _optional_copy(model: type[Schema], name: str) -> type[Schema]:
    """A model with `model`'s fields, every one optional (None = not set), same checks."""
    fields: dict[str, Any] = {}
    for field_name, f in model.model_fields.items():
        if field_name == "kind":
            continue
        g = copy.copy(f)
        g.default = None
        g.default_factory = None
        fields[field_name] = (f.annotation | None, g)  # type: ignore[operator]
    return create_model(name, __base__=Schema, **fields)


# Engine settings one role overrides; what it leaves unset (null) comes from `engine`.
EngineOverrides = _optional_copy(EngineConfig, "EngineOverrides")


class DisaggTopology(Schema):
    """Prefill/decode disaggregation: a pool of prefill workers, a pool of decode workers, and
    KV transfers between them (see `link`). Each role runs `engine` with its overrides."""

    kind: Literal["disagg"] = "disagg"
    num_prefill_workers: int = Field(1, gt=0)
    num_decode_workers: int = Field(1, gt=0)
    prefill: EngineOverrides = Field(default_factory=EngineOverrides)  # type: ignore[valid-type]
    decode: EngineOverrides = Field(default_factory=EngineOverrides)  # type: ignore[valid-type]


TopologyConfig = Annotated[AggregatedTopology | DisaggTopology, Field(discriminator="kind")]


class LinkPair(Schema):
    """Link settings for some prefill -> decode worker pairs (null lists mean every worker)."""

    prefill_workers: list[int] | None = None
    decode_workers: list[int] | None = None
    bandwidth_gbps: PositiveFloat | None = None
    latency_ms: NonNegFloat | None = None


class LinkConfig(Schema):
    """How KV moves from a prefill worker to a decode worker."""

    bandwidth_gbps: PositiveFloat | None = Field(
        None, description="decimal GB/s; null moves KV instantly (the mocker's default)"
    )
    latency_ms: NonNegFloat = 0.0
    contention: Literal["per_request", "fifo_lanes", "shared"] = "per_request"
    lanes: int = Field(1, gt=0, description="concurrent transfers per link (fifo_lanes)")
    timing_mode: Literal["full_prompt", "destination_missing"] = "full_prompt"
    kv_bytes_per_token: int | None = Field(
        None, gt=0, description="null derives it from the llm geometry"
    )
    state_bytes: int = Field(0, ge=0, description="bytes moved once per request on top of KV")
    pairs: list[LinkPair] = Field(
        default_factory=list, description="per-pair settings; the first matching entry wins"
    )


class RoundRobinRouter(Schema):
    kind: Literal["round_robin"] = "round_robin"


class RandomRouter(Schema):
    kind: Literal["random"] = "random"


class AffinityConfig(Schema):
    """Session affinity of the KV router: requests of one key go to the (worker, rank) the
    key's first request was routed to, while the binding lives."""

    mode: Literal["off", "session", "sibling_group"] = Field(
        "off",
        description="off; session: key = session id; sibling_group: key = the session's "
        "parent conversation (sessions of one group share a binding)",
    )
    ttl_seconds: float = Field(
        3600.0,
        ge=1.0,
        le=31_536_000.0,
        allow_inf_nan=False,
        description="a binding with no request in flight expires after this idle time",
    )


class KvRouter(Schema):
    """Dynamo's KV-aware router: per (worker, rank) cost = prefill_load_scale x max(0,
    prefill blocks - overlap credit) + decode blocks + decode_active_request_weight x active
    requests; the minimum wins (seeded random tie-break), or a softmax draw when
    temperature > 0. Defaults are the mocker's (ai-dynamo-runtime 1.6.1)."""

    kind: Literal["kv"] = "kv"
    overlap_score_credit: float = Field(
        1.0, ge=0.0, le=1.0, allow_inf_nan=False, description="credit per device-cached block"
    )
    prefill_load_scale: NonNegFloat = 1.0
    host_cache_hit_weight: NonNegFloat = Field(0.75, description="credit per host-cached block")
    disk_cache_hit_weight: NonNegFloat = Field(0.25, description="credit per disk-cached block")
    decode_active_request_weight: NonNegFloat = 0.0
    temperature: NonNegFloat = Field(0.0, description="0: minimum cost; > 0: softmax sampling")
    queue_threshold: NonNegFloat | None = Field(
        None,
        description="requests wait in the router while every candidate has more than "
        "queue_threshold x max_num_batched_tokens prompt tokens not yet prefilled; null = never",
    )
    queue_policy: Literal["fcfs", "lcfs", "wspt"] = "fcfs"
    kv_event_lag_ms: NonNegFloat = Field(
        0.0, description="KV events reach the router's prefix index this much later"
    )
    affinity: AffinityConfig = Field(default_factory=AffinityConfig)


RouterConfig = Annotated[RoundRobinRouter | RandomRouter | KvRouter, Field(discriminator="kind")]


# --------------------------------------------------------------------------- KV tiers


class HostOffloadConfig(Schema):
    """G2: a host-memory KV pool under each rank's HBM pool (vLLM's OffloadingConnector)."""

    num_host_blocks: int | None = Field(
        None, gt=0, description="host blocks per pool (of the engine's block size); null = off"
    )
    scope: Literal["dp_rank_local", "cluster_shared"] = Field(
        "dp_rank_local", description="one pool per scheduler rank, or one for the cluster"
    )
    d2h_bandwidth_gbps: NonNegFloat = Field(
        32.0, description="GPU -> host, decimal GB/s; 0 = instant"
    )
    h2d_bandwidth_gbps: NonNegFloat = Field(
        32.0, description="host -> GPU, decimal GB/s; 0 = instant"
    )
    latency_to_first_byte_ms: NonNegFloat = 0.0
    shared_d2h_bandwidth_gbps: NonNegFloat = Field(
        80.0, description="cluster_shared: the pool's total GPU -> host bandwidth; 0 = unlimited"
    )
    shared_h2d_bandwidth_gbps: NonNegFloat = Field(
        80.0, description="cluster_shared: the pool's total host -> GPU bandwidth; 0 = unlimited"
    )


class DiskConfig(Schema):
    """G3: a disk (or network storage) KV pool under G2, restored through G2."""

    num_g3_blocks: int | None = Field(None, gt=0, description="disk blocks per pool; null = off")
    scope: Literal["worker_local", "cluster_shared"] = "worker_local"
    latency_to_first_byte_ms: NonNegFloat = 0.1
    read_bandwidth_gbps: NonNegFloat = Field(10.0, description="per worker; 0 = no limit")
    write_bandwidth_gbps: NonNegFloat = Field(10.0, description="per worker; 0 = no limit")
    shared_read_bandwidth_gbps: NonNegFloat = Field(
        80.0, description="cluster_shared: total read bandwidth; 0 = unlimited"
    )
    shared_write_bandwidth_gbps: NonNegFloat = Field(
        80.0, description="cluster_shared: total write bandwidth; 0 = unlimited"
    )


class KvCacheConfig(Schema):
    """KV tiers below each rank's HBM pool (G1): host (G2) and disk (G3)."""

    host_offload: HostOffloadConfig = HostOffloadConfig()
    disk: DiskConfig = DiskConfig()
