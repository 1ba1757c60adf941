"""Config sections of what a pass costs: the model's geometry, the GPU, the timing model."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from servesim.config.base import NonNegFloat, PositiveFloat, Schema

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
    dtype: Literal["bfloat16", "float16", "float32", "fp8", "int8", "fp4", "int4"] = Field(
        "bfloat16",
        description="weights (fp4: NVFP4, 4.5 bits with its block scales; int4: weight-only, "
        "4.5 bits with a scale per 32, computed in bfloat16)",
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
    num_dense_layers: int = Field(
        0, ge=0, description="MoE: layers with a dense MLP instead of experts (DeepSeek's first 3)"
    )

    # attention as the engines keep it: grouped-query (K and V of `num_kv_heads` heads per
    # layer) or multi-head latent (MLA: one compressed latent of `kv_lora_rank` plus a shared
    # rotary key of `qk_rope_head_dim` per layer, what vLLM and SGLang cache)
    attention: Literal["gqa", "mla"] = Field("gqa", description="gqa or mla")
    kv_lora_rank: int | None = Field(None, gt=0, description="mla: latent KV width")
    qk_rope_head_dim: int | None = Field(None, gt=0, description="mla: rotary key width")
    # layers that do not keep every token's KV: sliding-window layers keep the last
    # `sliding_window` tokens; linear-attention layers (gated DeltaNet, Mamba) keep a state of
    # fixed size per sequence instead (not counted as KV)
    sliding_window: int | None = Field(None, gt=0, description="tokens a window layer keeps")
    num_sliding_window_layers: int = Field(0, ge=0, description="layers with that window")
    num_linear_attention_layers: int = Field(
        0, ge=0, description="layers with a fixed-size state and no per-token KV"
    )
    # the state a linear-attention layer keeps per sequence, which each pass reads and writes
    # back for every sequence it runs (gated DeltaNet: value heads x key dim x value dim)
    linear_state_elements_per_layer: int = Field(
        0, ge=0, description="elements of one sequence's state in one linear-attention layer"
    )
    linear_state_dtype: Literal["bfloat16", "float32"] = Field(
        "float32", description="the state's dtype (SGLang's --mamba-ssm-dtype default)"
    )

    @model_validator(mode="after")
    def _attention_complete(self) -> LlmConfig:
        mla = (self.kv_lora_rank, self.qk_rope_head_dim)
        if self.attention == "mla" and None in mla:
            raise ValueError("attention: mla needs kv_lora_rank and qk_rope_head_dim")
        if self.attention == "gqa" and mla != (None, None):
            raise ValueError("kv_lora_rank and qk_rope_head_dim are for attention: mla only")
        if (self.sliding_window is None) != (self.num_sliding_window_layers == 0):
            raise ValueError("sliding_window and num_sliding_window_layers go together")
        if self.linear_state_elements_per_layer and not self.num_linear_attention_layers:
            raise ValueError("linear_state_elements_per_layer needs num_linear_attention_layers")
        if self.num_sliding_window_layers + self.num_linear_attention_layers >= self.num_layers:
            raise ValueError(
                "num_sliding_window_layers + num_linear_attention_layers must leave at least "
                f"one full-attention layer of the {self.num_layers}"
            )
        return self

    @model_validator(mode="after")
    def _moe_complete(self) -> LlmConfig:
        moe = (self.num_experts, self.experts_per_token, self.active_params_b)
        if any(v is not None for v in moe) and any(v is None for v in moe):
            raise ValueError(
                "a mixture-of-experts llm needs num_experts, experts_per_token and "
                "active_params_b together"
            )
        if self.num_experts is None and self.num_dense_layers:
            raise ValueError("num_dense_layers is for a mixture-of-experts llm (num_experts)")
        if self.num_dense_layers >= self.num_layers:
            raise ValueError(
                f"num_dense_layers ({self.num_dense_layers}) must leave at least one MoE layer "
                f"of the {self.num_layers}"
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
