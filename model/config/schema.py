"""The validated run configuration: one frozen pydantic tree per Hydra group.

Hydra composes YAML; `RunConfig.model_validate(...)` validates it once. Every model is frozen
and rejects unknown keys, so a typo in an override fails with the config path that holds it.
Derived sizes (KV bytes per token, GPU blocks from HBM) live in `servesim.config.derived` and are
never written back here.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Schema(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- llm / hardware


class LlmConfig(Schema):
    """Model geometry: enough to size weights, KV per token and FLOPs per token."""

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    num_params_b: PositiveFloat = Field(description="parameter count in billions")
    dtype: Literal["bfloat16", "float16", "float32", "fp8", "int8", "fp4"] = Field(
        "bfloat16", description="weights (fp4: NVFP4, 4.5 bits with its block scales)"
    )
    kv_dtype: Literal["auto", "bfloat16", "float16", "float32", "fp8", "int8"] = Field(
        "auto", description="auto: the weights' dtype (bfloat16 for fp4 weights)"
    )

    # mixture of experts: every MoE layer routes each token to `experts_per_token` of
    # `num_experts` experts, so a token's GEMMs use `active_params_b` of the parameters
    num_experts: int | None = Field(None, gt=1, description="MoE: experts per layer")
    experts_per_token: int | None = Field(None, gt=0, description="MoE: experts a token uses")
    active_params_b: PositiveFloat | None = Field(
        None, description="MoE: parameters one token's forward pass uses, in billions"
    )

    @model_validator(mode="after")
    def _moe_complete(self) -> LlmConfig:
        moe = (self.num_experts, self.experts_per_token, self.active_params_b)
        if any(v is not None for v in moe) and any(v is None for v in moe):
            raise ValueError(
                "a mixture-of-experts llm needs num_experts, experts_per_token and "
                "active_params_b together"
            )
        if self.num_experts is not None:
            assert self.experts_per_token is not None and self.active_params_b is not None
            if self.experts_per_token > self.num_experts:
                raise ValueError(
                    f"experts_per_token ({self.experts_per_token}) must be <= num_experts "
                    f"({self.num_experts})"
                )
            if self.active_params_b >= self.num_params_b:
                raise ValueError(
                    f"active_params_b ({self.active_params_b}) must be below num_params_b "
                    f"({self.num_params_b})"
                )
        return self

    @model_validator(mode="after")
    def _heads_divide(self) -> LlmConfig:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        return self


class HardwareConfig(Schema):
    """One GPU: memory size and bandwidth, dense tensor throughput, links."""

    name: str
    hbm_gb: PositiveFloat
    hbm_bandwidth_tbps: PositiveFloat
    bf16_tflops: PositiveFloat = Field(description="dense (no sparsity) BF16 tensor TFLOP/s")
    fp8_tflops: PositiveFloat = Field(description="dense (no sparsity) FP8 tensor TFLOP/s")
    fp4_tflops: PositiveFloat | None = Field(
        None, description="dense FP4 tensor TFLOP/s (null: no FP4 tensor cores)"
    )
    nvlink_gbps: PositiveFloat = Field(description="per-GPU NVLink bandwidth, GB/s")
    host_link_gbps: PositiveFloat = Field(description="GPU <-> host (PCIe) bandwidth, GB/s")
    family: str | None = Field(
        None, description="GPU generation (hopper, blackwell) for fitted factors; null: by name"
    )


# --------------------------------------------------------------------------- engine


class VllmEngineConfig(Schema):
    """vLLM v1-style continuous batching (the Dynamo mocker's `vllm` backend)."""

    kind: Literal["vllm"] = "vllm"
    block_size: int = Field(64, ge=2)
    num_gpu_blocks: int | None = Field(
        None,
        gt=0,
        description="KV blocks per worker; null derives it from HBM (the mocker's default is "
        "16384, set by experiment=dynamo_compat)",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
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
    max_num_batched_tokens: int = Field(8192, gt=0)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_model_len: int | None = Field(None, gt=0)
    speedup_ratio: NonNegFloat = 1.0
    decode_speedup_ratio: NonNegFloat = 1.0
    preemption_mode: Literal["lifo", "fifo"] = "lifo"
    fast_forward: bool = Field(
        True,
        description="compute runs of passes that change nothing but counters at once, with "
        "the same results as stepping each pass through the event loop (false: step)",
    )


EngineConfig = VllmEngineConfig


# --------------------------------------------------------------------------- timing


class PolynomialTiming(Schema):
    """Dynamo mocker default: prefill quadratic in new tokens, decode quadratic in KV use."""

    kind: Literal["polynomial"] = "polynomial"
    prefill_a: float = 4.209989e-7
    prefill_b: float = 1.518344e-2
    prefill_c: float = 16.50142
    decode_a: float = -25.74
    decode_b: float = 54.01
    decode_c: float = 5.74
    decode_floor_ms: NonNegFloat = 1.0


class FixedTiming(Schema):
    """A constant cost for any pass with prefill work and for any pass with decode work."""

    kind: Literal["fixed"] = "fixed"
    prefill_ms: NonNegFloat = 50.0
    decode_ms: NonNegFloat = 10.0


class InterpolatedTiming(Schema):
    """Measured points: prefill ms vs new tokens (1-D), decode ms vs (active KV, context) (2-D).

    Points come inline or from `path` (a .json or .npz holding the mocker's array names:
    prefill_isl, prefill_ttft_ms, decode_active_kv_tokens, decode_context_length, decode_itl).
    """

    kind: Literal["interpolated"] = "interpolated"
    path: str | None = None
    prefill_isl: list[float] | None = None
    prefill_ttft_ms: list[float] | None = None
    decode_active_kv_tokens: list[float] | None = None
    decode_context_length: list[float] | None = None
    decode_itl: list[float] | None = Field(
        None, description="decode ms at each (active_kv_tokens, context_length) point"
    )

    @model_validator(mode="after")
    def _one_source(self) -> InterpolatedTiming:
        inline = [
            self.prefill_isl,
            self.prefill_ttft_ms,
            self.decode_active_kv_tokens,
            self.decode_context_length,
            self.decode_itl,
        ]
        if self.path is None and any(v is None for v in inline):
            raise ValueError("interpolated timing needs `path` or all five inline point arrays")
        if self.path is not None and any(v is not None for v in inline):
            raise ValueError("interpolated timing takes `path` or inline arrays, not both")
        return self


class RooflineTiming(Schema):
    """Prefill compute-bound, decode memory-bound, from llm x hardware (see docs/timing.md)."""

    kind: Literal["roofline"] = "roofline"
    compute_efficiency: float = Field(0.6, gt=0, le=1, description="achieved / peak FLOP/s")
    memory_efficiency: float = Field(0.8, gt=0, le=1, description="achieved / peak HBM B/s")
    prefill_overhead_ms: NonNegFloat = 3.0
    decode_overhead_ms: NonNegFloat = 2.0


class CalibratedRooflineTiming(Schema):
    """Roofline per op class with efficiency factors fitted on measured benchmarks, per GPU
    family and weight dtype (docs/timing.md#calibrated_roofline)."""

    kind: Literal["calibrated_roofline"] = "calibrated_roofline"
    factors_path: str | None = Field(
        None, description="a factors JSON (null: the one fitted on silicon_dev.csv)"
    )


class AiconfiguratorTiming(Schema):
    """NVIDIA AIConfigurator's measured per-operation tables (the optional `aic` extra:
    `pip install -e '.[aic]'`); docs/timing.md#aiconfigurator."""

    kind: Literal["aiconfigurator"] = "aiconfigurator"
    model_id: str | None = Field(
        None, description="Hugging Face id; null: from llm.name (llama3_8b, llama3_70b, qwen3_32b)"
    )
    system: str | None = Field(None, description="AIC system; null: from hardware.name")
    backend: Literal["vllm", "trtllm", "sglang"] = "vllm"
    backend_version: str | None = Field(None, description="null: the library's current one")
    ep_size: int = Field(1, gt=0, description="expert parallelism (MoE models only)")
    bucket_rel_error: float = Field(
        0.02, ge=0, lt=1, description="memo buckets: each shape argument within this fraction"
    )


TimingConfig = Annotated[
    PolynomialTiming
    | FixedTiming
    | InterpolatedTiming
    | RooflineTiming
    | CalibratedRooflineTiming
    | AiconfiguratorTiming,
    Field(discriminator="kind"),
]


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
        fields[field_name] = (f.annotation | None, g)  # type: ignore[operator]
    return create_model(name, __base__=Schema, **fields)


# Engine settings one role overrides; what it leaves unset (null) comes from `engine`.
EngineOverrides = _optional_copy(VllmEngineConfig, "EngineOverrides")


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


# --------------------------------------------------------------------------- workload and load


class TraceLoad(Schema):
    """Arrivals at trace timestamps, normalised to the first arrival, sped up by a ratio."""

    kind: Literal["trace"] = "trace"
    arrival_speedup_ratio: PositiveFloat = 1.0


class ConcurrencyLoad(Schema):
    """Closed loop: at most `concurrency` requests (or sessions) in flight; arrival = dispatch."""

    kind: Literal["concurrency"] = "concurrency"
    concurrency: int = Field(gt=0)


class RateLoad(Schema):
    """First turns re-stamped by a Poisson or constant process at `rate_rps` requests/s."""

    kind: Literal["rate"] = "rate"
    rate_rps: PositiveFloat
    process: Literal["poisson", "constant"] = "poisson"


LoadConfig = Annotated[TraceLoad | ConcurrencyLoad | RateLoad, Field(discriminator="kind")]


class MooncakeWorkload(Schema):
    """Mooncake JSONL: timestamp ms, input/output lengths, hash_ids per trace block."""

    kind: Literal["mooncake"] = "mooncake"
    path: str
    trace_block_size: int = Field(512, gt=0)
    skip_malformed: bool = False
    max_requests: int | None = Field(None, gt=0, description="read only the first N rows")


class AzureWorkload(Schema):
    """Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens); no prefix data."""

    kind: Literal["azure"] = "azure"
    path: str
    skip_malformed: bool = False
    max_requests: int | None = Field(None, gt=0, description="read only the first N rows")


class LengthDistribution(Schema):
    """Token-length distribution: a draw (the mean itself for `constant`; `uniform` spans
    [min, max]), rounded, then clipped to [min, max]."""

    dist: Literal["constant", "uniform", "normal", "lognormal", "exponential"] = "constant"
    mean: PositiveFloat
    std: NonNegFloat = 0.0
    min: int = Field(1, ge=0)
    max: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> LengthDistribution:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class SyntheticWorkload(Schema):
    """Generated requests: sessions of turns, shared prefixes by group, seeded lengths.

    First turns arrive by a Poisson or constant process at `rate_rps`; with the default trace
    load those are the arrival times (load=rate or load=concurrency replace them).
    """

    kind: Literal["synthetic"] = "synthetic"
    num_sessions: int = Field(gt=0)
    turns_per_session: int = Field(1, gt=0)
    inter_turn_delay_ms: NonNegFloat = 0.0
    input_tokens: LengthDistribution
    output_tokens: LengthDistribution
    shared_prefix_ratio: float = Field(0.0, ge=0, le=1)
    num_prefix_groups: int = Field(0, ge=0)
    trace_block_size: int = Field(64, gt=0)
    rate_rps: PositiveFloat = 10.0
    arrival_process: Literal["poisson", "constant"] = "poisson"


class AgenticSnapshot(Schema):
    """Snapshot sampling: each lane's first plays start at a seeded cut, 25-75 % into the play's
    span of recorded request starts; earlier requests are history (not replayed)."""

    seed: int


class AgenticProfile(Schema):
    """Continuous profile: lanes recycle plays until the admission window closes, then a
    response grace, then whatever is left is canceled (reference section 7.4)."""

    duration_seconds: PositiveFloat = Field(3600.0, description="admission window")
    response_grace_seconds: NonNegFloat = Field(
        30.0, description="after the window: in-flight requests may still finish"
    )
    cancel_drain_seconds: NonNegFloat = Field(
        10.0, description="after the grace: cancellations acknowledged (instant offline)"
    )
    tree_idle_cap_seconds: PositiveFloat = Field(
        300.0, description="a play idle longer than this has its timers pulled in"
    )
    global_idle_cap_seconds: PositiveFloat = Field(
        10.0, description="the whole workload idle longer than this: every timer pulled in"
    )


class AgenticOptions(Schema):
    """How an agentic graph is replayed: lanes, snapshot, warmup, profile (reference §7)."""

    agentic_lanes: int | None = Field(
        None, gt=0, description="plays replayed at once; null = every play at its own start"
    )
    agentic_snapshot: AgenticSnapshot | None = None
    agentic_warmup: bool = Field(
        False, description="primers + 10 one-token requests per lane, then a barrier"
    )
    agentic_profile: AgenticProfile | None = None
    agentic_lane_assignment: Literal["shared_queue", "stride"] = Field(
        "shared_queue",
        description="shared_queue: a lane whose play settles takes the next unstarted play "
        "(Dynamo 1.6.1's mocker, a pool of agent workers); stride: lane l takes plays l, l+L, ...",
    )

    @model_validator(mode="after")
    def _phases_need_their_base(self) -> AgenticOptions:
        if self.agentic_snapshot is not None and self.agentic_lanes is None:
            raise ValueError(
                "agentic_snapshot requires positive agentic_lanes (set workload.agentic_lanes)"
            )
        if self.agentic_warmup and self.agentic_snapshot is None:
            raise ValueError("agentic_warmup requires agentic_snapshot (workload.agentic_snapshot)")
        if self.agentic_profile is not None and self.agentic_snapshot is None:
            raise ValueError(
                "agentic_profile requires agentic_snapshot (workload.agentic_snapshot)"
            )
        return self


class AgenticMooncakeWorkload(AgenticOptions):
    """Agentic Mooncake JSONL (v2 with a header, or legacy rows with wait_for)."""

    kind: Literal["agentic_mooncake"] = "agentic_mooncake"
    path: str
    trace_block_size: int = Field(512, gt=0, description="the v2 header's block_size wins")


class WekaWorkload(AgenticOptions):
    """Weka / AgentX corpus: a JSON or JSONL file, or a directory of them, of plays."""

    kind: Literal["weka"] = "weka"
    path: str
    trace_block_size: int | None = Field(
        None, gt=0, description="must equal the corpus block_size when set"
    )
    nested_timestamp_basis: Literal["auto", "absolute", "relative"] = "auto"


class DynamoTraceWorkload(AgenticOptions):
    """Dynamo request traces (`dynamo.request.trace.v1` JSONL, optionally .gz, one or more
    shards): agentic when its records carry `agent_context`, plain Mooncake otherwise."""

    kind: Literal["dynamo_trace"] = "dynamo_trace"
    path: str | list[str]
    trace_block_size: int | None = Field(
        None, gt=0, description="must equal the trace's block size when set"
    )


class AgenticSyntheticWorkload(AgenticOptions):
    """Generated agent plays: a main agent's turns over one growing context, tool waits between
    turns, optional sub-agents spawned off a turn (blocking ones joined back)."""

    kind: Literal["agentic_synthetic"] = "agentic_synthetic"
    num_plays: int = Field(gt=0)
    turns_per_play: LengthDistribution = Field(description="LLM calls of the main agent")
    system_prompt_tokens: int = Field(1024, ge=0, description="shared by every play")
    first_user_tokens: LengthDistribution = Field(description="the first turn's own prompt")
    tool_output_tokens: LengthDistribution = Field(description="appended after each tool call")
    output_tokens: LengthDistribution
    tool_time_ms: LengthDistribution = Field(description="tool wait before the next turn")
    subagent_probability: float = Field(0.0, ge=0, le=1, description="per main-agent turn")
    subagent_turns: int = Field(2, gt=0)
    subagent_blocking_probability: float = Field(
        1.0, ge=0, le=1, description="share of sub-agents the next main turn waits for"
    )
    play_interval_ms: NonNegFloat = Field(1000.0, description="between the plays' starts")
    trace_block_size: int = Field(64, gt=0)


AGENTIC_KINDS = ("agentic_mooncake", "weka", "dynamo_trace", "agentic_synthetic")

WorkloadConfig = Annotated[
    MooncakeWorkload
    | AzureWorkload
    | SyntheticWorkload
    | AgenticMooncakeWorkload
    | WekaWorkload
    | DynamoTraceWorkload
    | AgenticSyntheticWorkload,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- run


class SloConfig(Schema):
    """Service-level bounds for goodput: a completed request is good if it meets every bound
    set (TTFT, mean ITL = (E2E - TTFT) / (tokens - 1), E2E)."""

    ttft_ms: PositiveFloat | None = None
    itl_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None


class StopConfig(Schema):
    max_virtual_time_ms: PositiveFloat | None = Field(
        None, description="soft cut-off: requests still in flight end `incomplete`"
    )


class ParallelConfig(Schema):
    """Worker partitions replayed in separate OS processes (see model/parallel.py)."""

    processes: int = Field(
        1,
        ge=1,
        description="processes to replay the workers in (each owns every P-th worker); only "
        "where workers never interact (aggregated, round-robin, streamed open-loop trace, no "
        "frontend latency, no KV tiers), else one process (summary metadata says why)",
    )


class OutputConfig(Schema):
    tables: bool = Field(True, description="write requests/passes/kv tables to the run dir")
    format: Literal["parquet", "csv"] = "parquet"
    per_request_jsonl: bool = Field(
        False, description="also write requests.jsonl with the mocker's per-request field names"
    )
    per_token: bool = Field(False, description="keep every token's time per request")
    pass_table: bool = Field(
        True,
        description="keep one row per engine pass (the passes table); false for very long "
        "replays: passes are then only counted",
    )
    kv_events: bool = Field(False, description="record KV events (stored/removed) as a table")
    progress: Literal["auto", "on", "off"] = Field(
        "auto", description="progress bar over requests; auto = only on a terminal"
    )

    @field_validator("progress", mode="before")
    @classmethod
    def _yaml_booleans(cls, v: object) -> object:
        # YAML 1.1 reads a bare on/off as a boolean
        if isinstance(v, bool):
            return "on" if v else "off"
        return v


class RunConfig(Schema):
    seed: int = 0
    llm: LlmConfig
    hardware: HardwareConfig
    engine: EngineConfig
    timing: TimingConfig = PolynomialTiming()
    topology: TopologyConfig = AggregatedTopology()
    router: RouterConfig = RoundRobinRouter()
    workload: WorkloadConfig
    load: LoadConfig = TraceLoad()
    link: LinkConfig = LinkConfig()
    kv_cache: KvCacheConfig = KvCacheConfig()
    slo: SloConfig = SloConfig()
    stop: StopConfig = StopConfig()
    output: OutputConfig = OutputConfig()
    parallel: ParallelConfig = ParallelConfig()

    @model_validator(mode="after")
    def _roles_agree(self) -> RunConfig:
        from servesim.config.derived import role_engines  # derived sizes live there

        role_engines(self)  # raises on a combination the roles cannot share
        return self

    @model_validator(mode="after")
    def _cluster_size_bounded(self) -> RunConfig:
        from servesim.config.derived import check_cluster_size

        check_cluster_size(self)
        return self

    @model_validator(mode="after")
    def _tiers_supported(self) -> RunConfig:
        from servesim.config.derived import check_kv_tiers  # the rules live with the geometry

        check_kv_tiers(self)
        return self

    @model_validator(mode="after")
    def _kv_router_applies(self) -> RunConfig:
        router = self.router
        if not isinstance(router, KvRouter):
            return self
        topo = self.topology
        if isinstance(topo, AggregatedTopology):
            targets = topo.num_workers * self.engine.dp_size
            if targets < 2:
                raise ValueError(
                    "router=kv requires more than one routable worker (topology.num_workers x "
                    f"engine.dp_size = {targets}); use router=round_robin for one"
                )
        if router.affinity.mode == "sibling_group":
            w = self.workload
            if not (isinstance(w, SyntheticWorkload) and w.num_prefix_groups > 0):
                raise ValueError(
                    "router.affinity.mode=sibling_group requires conversation lineage (a "
                    "family per session); workload="
                    f"{w.kind} has none here (synthetic workloads with num_prefix_groups > 0 "
                    "do); use router.affinity.mode=session"
                )
        return self

    @model_validator(mode="after")
    def _agentic_qualified(self) -> RunConfig:
        from servesim.agentic.qualification import agentic_violation

        w = self.workload
        if not isinstance(w, AgenticOptions):
            return self
        plain_dynamo = (
            isinstance(w, DynamoTraceWorkload)
            and w.agentic_lanes is None
            and w.agentic_snapshot is None
        )
        if not plain_dynamo:  # a plain Dynamo trace is checked once it is read
            problem = agentic_violation(self, f"workload={w.kind}")
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _link_pairs_in_range(self) -> RunConfig:
        topo = self.topology
        if not isinstance(topo, DisaggTopology):
            return self
        pools = (("prefill", topo.num_prefill_workers), ("decode", topo.num_decode_workers))
        for k, pair in enumerate(self.link.pairs):
            for side, n in pools:
                bad = [i for i in getattr(pair, f"{side}_workers") or [] if not 0 <= i < n]
                if bad:
                    raise ValueError(
                        f"link.pairs[{k}].{side}_workers: {bad} out of range; the {side} pool "
                        f"has workers 0..{n - 1}"
                    )
        return self
