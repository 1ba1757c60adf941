"""Sizes derived from the validated config, computed in one place and never written back."""

from __future__ import annotations

import math

from servesim.config.errors import ConfigError
from servesim.config.schema import DisaggTopology, LlmConfig, RunConfig, VllmEngineConfig

# NVFP4: 4-bit values plus one FP8 scale per 16 (4.5 bits)
DTYPE_BYTES: dict[str, float] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "fp8": 1,
    "int8": 1,
    "fp4": 0.5625,
}


def kv_dtype_bytes(llm: LlmConfig) -> int:
    """Bytes per KV element: `kv_dtype`, or with `auto` the weights' dtype (bfloat16 for fp4
    weights: no engine keeps KV in FP4)."""
    if llm.kv_dtype != "auto":
        return int(DTYPE_BYTES[llm.kv_dtype])
    return 2 if llm.dtype == "fp4" else int(DTYPE_BYTES[llm.dtype])


def kv_bytes_per_token(llm: LlmConfig) -> int:
    """Bytes of K and V for one token across all layers (whole model, before TP sharding)."""
    return llm.num_layers * 2 * llm.num_kv_heads * llm.head_dim * kv_dtype_bytes(llm)


def transfer_bytes_per_token(cfg: RunConfig) -> int:
    """What a KV transfer charges per token: `link.kv_bytes_per_token`, else the geometry's."""
    return cfg.link.kv_bytes_per_token or kv_bytes_per_token(cfg.llm)


def weight_bytes(llm: LlmConfig) -> float:
    return llm.num_params_b * 1e9 * DTYPE_BYTES[llm.dtype]


def active_params(llm: LlmConfig) -> float:
    """Parameters one token's forward pass uses (all of them for a dense model)."""
    return (llm.active_params_b or llm.num_params_b) * 1e9


def weight_bytes_read(llm: LlmConfig, tokens: float) -> float:
    """Weight bytes a pass over `tokens` tokens reads: all of a dense model's; of a MoE model
    the dense part plus the experts at least one token routes to, in expectation
    (each expert is untouched by a token with probability 1 - k/E, independently)."""
    if llm.num_experts is None:
        return weight_bytes(llm)
    e, k = llm.num_experts, llm.experts_per_token
    assert k is not None
    expert = (llm.num_params_b - active_params(llm) / 1e9) / (e - k)  # billions per expert
    dense = llm.num_params_b - e * expert
    touched = e * (1.0 - (1.0 - k / e) ** max(tokens, 0.0))
    return (dense + touched * expert) * 1e9 * DTYPE_BYTES[llm.dtype]


def derived_num_gpu_blocks(
    cfg: RunConfig, engine: VllmEngineConfig | None = None, where: str = "engine"
) -> int:
    """KV blocks that fit on one worker rank: its TP GPUs' HBM x utilisation, minus weights and
    reserve (`engine` defaults to cfg.engine; `where` is its config path, for errors)."""
    engine = engine or cfg.engine
    tp = engine.tp_size
    usable_bytes = cfg.hardware.hbm_gb * 1e9 * engine.gpu_memory_utilization * tp
    kv_bytes = usable_bytes - weight_bytes(cfg.llm) - engine.activation_reserve_gb * 1e9 * tp
    block_bytes = engine.block_size * kv_bytes_per_token(cfg.llm)
    blocks = math.floor(kv_bytes / block_bytes)
    if blocks <= 0:
        raise ConfigError(
            f"{where}.num_gpu_blocks: {cfg.llm.name} ({weight_bytes(cfg.llm) / 1e9:.1f} GB of "
            f"weights) leaves no room for KV on {tp} x {cfg.hardware.name} "
            f"({cfg.hardware.hbm_gb} GB, gpu_memory_utilization {engine.gpu_memory_utilization})"
        )
    return blocks


def num_gpu_blocks(
    cfg: RunConfig, engine: VllmEngineConfig | None = None, role: str = "aggregated"
) -> int:
    """Configured blocks per worker rank, or the HBM-derived count when `num_gpu_blocks` is
    null (`engine` defaults to cfg.engine; pass a role and its engine in a disagg topology)."""
    engine = engine or cfg.engine
    if engine.num_gpu_blocks is not None:
        return engine.num_gpu_blocks
    return derived_num_gpu_blocks(
        cfg, engine, "engine" if role == "aggregated" else f"topology.{role}"
    )


def role_engine(cfg: RunConfig, role: str) -> VllmEngineConfig:
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
        return VllmEngineConfig.model_validate({**cfg.engine.model_dump(), **update})
    except ValueError as e:
        raise ConfigError(f"topology.{role}: {e}") from None


def role_engines(cfg: RunConfig) -> dict[str, VllmEngineConfig]:
    """Each role's engine, checked for what the roles must share."""
    if cfg.topology.kind != "disagg":
        return {"aggregated": cfg.engine}
    engines = {role: role_engine(cfg, role) for role in ("prefill", "decode")}
    p, d = engines["prefill"], engines["decode"]
    if p.block_size != d.block_size:
        raise ValueError(
            f"topology.prefill.block_size ({p.block_size}) and topology.decode.block_size "
            f"({d.block_size}) must match: KV moves between the pools block by block"
        )
    if cfg.link.timing_mode == "destination_missing" and not d.enable_prefix_caching:
        raise ValueError(
            "link.timing_mode=destination_missing needs prefix caching on the decode side "
            "(topology.decode.enable_prefix_caching / engine.enable_prefix_caching): without "
            "it nothing is resident, so say full_prompt"
        )
    return engines


# The most engine ranks (one scheduler and KV pool each) one run simulates. Every worker and
# rank is built in full at the start whether or not requests reach it, each worker with its
# own decode-price table (one slot per KV token of its pool, in separately mapped memory):
# 100,000 workers took 5.7 GB and, under experiment=dynamo_compat, failed an allocation at
# about 32,000 (each table took two of the kernel's 65,530 memory maps a process may hold).
# Ranks cost time too: a worker's pass visits each of its ranks, and one request on one worker
# of dp_size 100,000 took 237 s. 10,000 workers build in about 4 s in 250 MB.
MAX_ENGINE_RANKS = 10_000


def check_cluster_size(cfg: RunConfig) -> None:
    """At most MAX_ENGINE_RANKS engine ranks: workers x dp_size, summed over the P/D pools."""
    topo = cfg.topology
    pools: list[tuple[str, int, str, int]]  # (workers key, workers, dp key, dp_size)
    if isinstance(topo, DisaggTopology):
        engines = role_engines(cfg)
        pools = [
            (
                "topology.num_prefill_workers",
                topo.num_prefill_workers,
                "topology.prefill.dp_size",
                engines["prefill"].dp_size,
            ),
            (
                "topology.num_decode_workers",
                topo.num_decode_workers,
                "topology.decode.dp_size",
                engines["decode"].dp_size,
            ),
        ]
    else:
        pools = [("topology.num_workers", topo.num_workers, "engine.dp_size", cfg.engine.dp_size)]
    ranks = sum(n * dp for _, n, _, dp in pools)
    if ranks <= MAX_ENGINE_RANKS:
        return
    terms = " + ".join(f"{w} x {d}" for w, _, d, _ in pools)
    values = " + ".join(f"{n} x {dp}" for _, n, _, dp in pools)
    raise ValueError(
        f"{terms} = {values} = {ranks:,} engine ranks; at most {MAX_ENGINE_RANKS:,} can be "
        "simulated (every rank is built in full at the start, scheduler and KV pool, whether "
        "requests reach it or not: 100,000 workers take 6 GB and can fail to allocate); "
        "simulate a share of the cluster with the same share of the load"
    )


def cache_layout(cfg: RunConfig, engine: VllmEngineConfig) -> tuple[int, int]:
    """A worker's physical KV layout: (block size, KV bytes per token on one GPU of its TP
    group). Workers may share a host or disk pool only when this is identical; it is the
    model's geometry, whatever a P/D link charges per token."""
    return engine.block_size, kv_bytes_per_token(cfg.llm) // engine.tp_size


def kv_block_bytes(cfg: RunConfig, engine: VllmEngineConfig) -> int:
    """Bytes of one KV block of a worker (all its TP shards): what a tier copy moves."""
    return engine.block_size * kv_bytes_per_token(cfg.llm)


def check_kv_tiers(cfg: RunConfig) -> None:
    """The rules for host (G2) and disk (G3) tiers; each error names the rule."""
    host = cfg.kv_cache.host_offload
    disk = cfg.kv_cache.disk
    if disk.num_g3_blocks is not None and host.num_host_blocks is None:
        raise ValueError(
            "kv_cache.disk.num_g3_blocks needs kv_cache.host_offload.num_host_blocks: a G3 "
            "block is restored by staging it in G2, so G3 requires G2"
        )
    if host.num_host_blocks is None:
        return
    engines = role_engines(cfg)
    for role, engine in engines.items():
        if not engine.enable_prefix_caching:
            where = "engine" if role == "aggregated" else f"topology.{role} / engine"
            raise ValueError(
                f"kv_cache.host_offload needs prefix caching ({where}.enable_prefix_caching="
                "true): host blocks are found by their content hash"
            )
    shared = [
        name
        for name, scope in (
            ("kv_cache.host_offload", host.scope),
            ("kv_cache.disk", disk.scope if disk.num_g3_blocks is not None else ""),
        )
        if scope == "cluster_shared"
    ]
    layouts = {role: cache_layout(cfg, engine) for role, engine in engines.items()}
    if shared and len(set(layouts.values())) > 1:
        found = ", ".join(
            f"{role}: block_size {b} x {bpt} B/token per GPU" for role, (b, bpt) in layouts.items()
        )
        raise ValueError(
            f"{shared[0]}.scope=cluster_shared needs one physical KV layout on every worker "
            f"that shares the pool (block size x KV bytes per token per GPU); found {found}"
        )


def kv_events_on(cfg: RunConfig) -> bool:
    """Whether KV pools publish stored/removed events: for the kv_events table, or for a KV
    router's prefix index."""
    return cfg.output.kv_events or cfg.router.kind == "kv"
