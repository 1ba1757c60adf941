"""Sizes derived from the config's sections (KV bytes, pool sizes, each role's engine), never
written back: `servesim.config.plan` computes them once per run."""

from __future__ import annotations

import math

from servesim.config.cluster import EngineConfig
from servesim.config.errors import ConfigError
from servesim.config.hardware import LlmConfig
from servesim.config.sections import Sections

# NVFP4: 4-bit values plus one FP8 scale per 16 (4.5 bits)
DTYPE_BYTES: dict[str, float] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "fp8": 1,
    "int8": 1,
    "fp4": 0.5625,
    "int4": 0.5625,  # weight-only INT4, a 16-bit scale per 32 values
}


def kv_dtype_bytes(llm: LlmConfig) -> int:
    """Bytes per KV element: `kv_dtype`, or with `auto` the weights' dtype (bfloat16 for 4-bit
    weights: no engine keeps KV in 4 bits)."""
    if llm.kv_dtype != "auto":
        return int(DTYPE_BYTES[llm.kv_dtype])
    return 2 if llm.dtype in ("fp4", "int4") else int(DTYPE_BYTES[llm.dtype])


def full_attention_layers(llm: LlmConfig) -> int:
    """Layers that keep the KV of every token of a sequence."""
    return llm.num_layers - llm.num_sliding_window_layers - llm.num_linear_attention_layers


def kv_layer_bytes(llm: LlmConfig, tp_size: int = 1) -> int:
    """KV bytes of one token in one attention layer on one GPU of a `tp_size` group: K and V of
    the layer's KV heads (split over the group; a head is never split, so a group larger than
    the head count holds copies), or MLA's latent and rotary key (on every GPU of the group)."""
    if llm.attention == "mla":
        assert llm.kv_lora_rank is not None and llm.qk_rope_head_dim is not None
        return (llm.kv_lora_rank + llm.qk_rope_head_dim) * kv_dtype_bytes(llm)
    heads = -(-llm.num_kv_heads // tp_size)
    return 2 * heads * llm.head_dim * kv_dtype_bytes(llm)


def kv_bytes_per_token(llm: LlmConfig) -> int:
    """Bytes of KV one more token of a sequence takes, all layers that keep every token (whole
    model, before TP sharding); sliding-window and linear-attention layers take none."""
    return full_attention_layers(llm) * kv_layer_bytes(llm)


def kv_bytes_per_token_per_gpu(llm: LlmConfig, tp_size: int) -> int:
    """`kv_bytes_per_token` on one GPU of a `tp_size` group (what sizes its KV pool)."""
    return full_attention_layers(llm) * kv_layer_bytes(llm, tp_size)


def linear_state_bytes(llm: LlmConfig) -> float:
    """Bytes of one sequence's linear-attention state, all such layers (whole model, before TP
    sharding): what a pass reads and writes back for each sequence it runs."""
    per_layer = llm.linear_state_elements_per_layer * DTYPE_BYTES[llm.linear_state_dtype]
    return llm.num_linear_attention_layers * per_layer


def kv_bytes_read_per_token(llm: LlmConfig, tp_size: int) -> int:
    """KV bytes a `tp_size` group reads for one cached token when its attention reads the
    token: each GPU reads what it holds, so KV that every GPU holds (MLA's latent; KV heads
    fewer than the GPUs) is read once per GPU: tp_size x `kv_bytes_per_token_per_gpu`
    (= `kv_bytes_per_token` when the KV heads split evenly over the group)."""
    return tp_size * kv_bytes_per_token_per_gpu(llm, tp_size)


def window_kv_bytes(llm: LlmConfig, context: float) -> float:
    """KV bytes the sliding-window layers hold (and attention reads) for one sequence of
    `context` tokens (whole model): the last `sliding_window` tokens of each such layer."""
    if llm.sliding_window is None:
        return 0.0
    return llm.num_sliding_window_layers * kv_layer_bytes(llm) * min(context, llm.sliding_window)


def _attention_flops_per_layer_pair(llm: LlmConfig, decode: bool) -> float:
    if llm.attention == "mla" and decode:
        assert llm.kv_lora_rank is not None and llm.qk_rope_head_dim is not None
        return 2.0 * llm.num_attention_heads * (2 * llm.kv_lora_rank + llm.qk_rope_head_dim)
    return 4.0 * llm.num_attention_heads * llm.head_dim


def attn_flops_per_pair(llm: LlmConfig, decode: bool = False) -> float:
    """Attention flops (QK^T and PV, 2 per multiply-add) of one query token against one earlier
    token, over the full-attention layers: 4 H d per layer; MLA decodes in its compressed form
    (queries absorbed into the latent: QK^T over kv_lora_rank + qk_rope_head_dim, PV over
    kv_lora_rank), 2 H (2 r + rope) per layer, and prefills over full heads."""
    return full_attention_layers(llm) * _attention_flops_per_layer_pair(llm, decode)


def window_attention_flops(llm: LlmConfig, tokens: float, context: float, decode: bool) -> float:
    """Attention flops of `tokens` query tokens in the sliding-window layers, each attending
    over `context` earlier tokens, at most the window (linear-attention layers: not counted)."""
    if llm.sliding_window is None:
        return 0.0
    per_pair = _attention_flops_per_layer_pair(llm, decode) * llm.num_sliding_window_layers
    return per_pair * tokens * min(context, llm.sliding_window)


def transfer_bytes_per_token(cfg: Sections) -> int:
    """What a KV transfer charges per token: `link.kv_bytes_per_token`, else the geometry's."""
    return cfg.link.kv_bytes_per_token or kv_bytes_per_token(cfg.llm)


def weight_bytes(llm: LlmConfig) -> float:
    return llm.num_params_b * 1e9 * DTYPE_BYTES[llm.dtype]


def active_params(llm: LlmConfig) -> float:
    """Parameters one token's forward pass uses (all of them for a dense model)."""
    return (llm.active_params_b or llm.num_params_b) * 1e9


def moe_layers(llm: LlmConfig) -> int:
    """Layers whose MLP is a mixture of experts (0 for a dense model)."""
    return 0 if llm.num_experts is None else llm.num_layers - llm.num_dense_layers


def _dense_and_expert_params_b(llm: LlmConfig) -> tuple[float, float]:
    """(parameters outside the routed experts, parameters of one routed expert), in billions;
    (all, 0) for a dense model."""
    if llm.num_experts is None:
        return llm.num_params_b, 0.0
    e, k = llm.num_experts, llm.experts_per_token
    assert k is not None
    expert = (llm.num_params_b - active_params(llm) / 1e9) / (e - k)
    return llm.num_params_b - e * expert, expert


def rank_weight_bytes(llm: LlmConfig, dp_size: int = 1) -> float:
    """Weight bytes on one attention-DP rank's GPUs: its own copy of everything outside the
    routed experts and a 1/dp_size share of the experts (expert parallelism over the worker's
    ranks). All of them when dp_size is 1 or the model is dense."""
    dense, expert = _dense_and_expert_params_b(llm)
    experts = (llm.num_experts or 0) * expert / dp_size
    return (dense + experts) * 1e9 * DTYPE_BYTES[llm.dtype]


def weight_bytes_read(llm: LlmConfig, tokens: float, dp_size: int = 1) -> float:
    """Weight bytes a pass over `tokens` tokens reads on one rank's GPUs: all of a dense
    model's; of a MoE model the dense part plus the experts at least one token routes to, in
    expectation (each expert is untouched by a token with probability 1 - k/E, independently).
    With dp_size attention-DP ranks in lock-step, each running `tokens`, the experts see the
    tokens of every rank and each rank holds (and reads) 1/dp_size of them."""
    if llm.num_experts is None:
        return weight_bytes(llm)
    dense, expert = _dense_and_expert_params_b(llm)
    e, k = llm.num_experts, llm.experts_per_token or 0
    touched = e * (1.0 - (1.0 - k / e) ** max(tokens * dp_size, 0.0))
    return (dense + touched * expert / dp_size) * 1e9 * DTYPE_BYTES[llm.dtype]


def all_to_all_bytes_per_token(llm: LlmConfig, tp_size: int, dp_size: int) -> float:
    """Bytes one token sends over NVLink for expert parallelism across attention-DP ranks:
    per layer, its hidden state to each of its k experts and the results back (dispatch and
    combine, bfloat16), the share (G - 1) / G of them that leaves its GPU for the worker's
    G = tp_size x dp_size GPUs. 0 for a dense model or one rank (experts under TP only need
    the all-reduce)."""
    if llm.num_experts is None or dp_size == 1:
        return 0.0
    gpus = tp_size * dp_size
    k = llm.experts_per_token or 0
    per_layer = 2 * k * llm.hidden_size * DTYPE_BYTES["bfloat16"] * (gpus - 1) / gpus
    return llm.num_layers * per_layer


def derived_num_gpu_blocks(
    cfg: Sections, engine: EngineConfig | None = None, where: str = "engine"
) -> int:
    """KV blocks that fit on one worker rank: its TP GPUs' HBM x utilisation, minus the rank's
    weights (`rank_weight_bytes`: with attention DP each rank holds a share of the experts)
    and reserve (`engine` defaults to cfg.engine; `where` is its config path, for errors)."""
    engine = engine or cfg.engine
    tp = engine.tp_size
    weights = rank_weight_bytes(cfg.llm, engine.dp_size)
    hbm_bytes = cfg.hardware.hbm_gb * 1e9 * tp
    reserve_bytes = engine.activation_reserve_gb * 1e9 * tp
    if engine.memory_fraction_of == "free":  # of what the weights and activations leave
        free_bytes = hbm_bytes - weights - reserve_bytes
        kv_bytes = engine.gpu_memory_utilization * free_bytes
    else:  # of all HBM, the weights and activations inside it
        usable_bytes = hbm_bytes * engine.gpu_memory_utilization
        kv_bytes = usable_bytes - weights - reserve_bytes
    block_bytes = engine.block_size * kv_bytes_per_token_per_gpu(cfg.llm, tp) * tp
    blocks = math.floor(kv_bytes / block_bytes)
    if blocks <= 0:
        raise ConfigError(
            f"{where}.num_gpu_blocks: {cfg.llm.name} ({weights / 1e9:.1f} GB of "
            f"weights per rank) leaves no room for KV on {tp} x {cfg.hardware.name} "
            f"({cfg.hardware.hbm_gb} GB, gpu_memory_utilization {engine.gpu_memory_utilization})"
        )
    return blocks


def num_gpu_blocks(
    cfg: Sections, engine: EngineConfig | None = None, role: str = "aggregated"
) -> int:
    """Configured blocks per worker rank, or the HBM-derived count when `num_gpu_blocks` is
    null (`engine` defaults to cfg.engine; pass a role and its engine in a disagg topology)."""
    engine = engine or cfg.engine
    if engine.num_gpu_blocks is not None:
        return engine.num_gpu_blocks
    return derived_num_gpu_blocks(
        cfg, engine, "engine" if role == "aggregated" else f"topology.{role}"
    )


def role_engine(cfg: Sections, role: str) -> EngineConfig:
    """The engine of one role: `engine`, with the role's overrides in a disagg topology
    (`role` is "aggregated", "prefill" or "decode")."""
    topo = cfg.topology
    if role == "aggregated" or topo.kind != "disagg":
        return cfg.engine
    overrides = getattr(topo, role)
    # null means "as `engine`" (so a role cannot set num_gpu_blocks or max_model_len to null
    # when `engine` sets them)
    update = {
        k: getattr(overrides, k)
        for k in overrides.model_fields_set
        if getattr(overrides, k) is not None
    }
    try:
        return EngineConfig.model_validate({**cfg.engine.model_dump(), **update})
    except ValueError as e:
        raise ConfigError(f"topology.{role}: {e}") from None


def role_engines(cfg: Sections) -> dict[str, EngineConfig]:
    """Each role's engine: {"aggregated": engine}, or the prefill and decode engines."""
    if cfg.topology.kind != "disagg":
        return {"aggregated": cfg.engine}
    return {role: role_engine(cfg, role) for role in ("prefill", "decode")}


def cache_layout(cfg: Sections, engine: EngineConfig) -> tuple[int, int]:
    """A worker's physical KV layout: (block size, KV bytes per token on one GPU of its TP
    group). Workers may share a host or disk pool only when this is identical; it is the
    model's geometry, whatever a P/D link charges per token."""
    return engine.block_size, kv_bytes_per_token_per_gpu(cfg.llm, engine.tp_size)


def kv_events_on(cfg: Sections) -> bool:
    """Whether KV pools publish stored/removed events: for the kv_events table, or for a KV
    router's prefix index."""
    return cfg.output.kv_events or cfg.router.kind == "kv"
