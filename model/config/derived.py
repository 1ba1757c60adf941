"""Sizes derived from the validated config, computed in one place and never written back."""

from __future__ import annotations

import math

from model.config.errors import ConfigError
from model.config.schema import LlmConfig, RunConfig, VllmEngineConfig

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "int8": 1}


def kv_dtype_bytes(llm: LlmConfig) -> int:
    return DTYPE_BYTES[llm.dtype if llm.kv_dtype == "auto" else llm.kv_dtype]


def kv_bytes_per_token(llm: LlmConfig) -> int:
    """Bytes of K and V for one token across all layers (whole model, before TP sharding)."""
    return llm.num_layers * 2 * llm.num_kv_heads * llm.head_dim * kv_dtype_bytes(llm)


def weight_bytes(llm: LlmConfig) -> float:
    return llm.num_params_b * 1e9 * DTYPE_BYTES[llm.dtype]


def derived_num_gpu_blocks(cfg: RunConfig) -> int:
    """KV blocks that fit on one worker: TP GPUs' HBM x utilisation, minus weights and reserve."""
    engine: VllmEngineConfig = cfg.engine
    tp = engine.tp_size
    usable_bytes = cfg.hardware.hbm_gb * 1e9 * engine.gpu_memory_utilization * tp
    kv_bytes = usable_bytes - weight_bytes(cfg.llm) - engine.activation_reserve_gb * 1e9 * tp
    block_bytes = engine.block_size * kv_bytes_per_token(cfg.llm)
    blocks = math.floor(kv_bytes / block_bytes)
    if blocks <= 0:
        raise ConfigError(
            f"engine.num_gpu_blocks: {cfg.llm.name} ({weight_bytes(cfg.llm) / 1e9:.1f} GB of "
            f"weights) leaves no room for KV on {tp} x {cfg.hardware.name} "
            f"({cfg.hardware.hbm_gb} GB, gpu_memory_utilization {engine.gpu_memory_utilization})"
        )
    return blocks


def num_gpu_blocks(cfg: RunConfig) -> int:
    """Configured blocks per worker, or the HBM-derived count when `num_gpu_blocks` is null."""
    if cfg.engine.num_gpu_blocks is not None:
        return cfg.engine.num_gpu_blocks
    return derived_num_gpu_blocks(cfg)
