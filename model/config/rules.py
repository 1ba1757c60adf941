"""The cross-field rules of a run config: what its sections must agree on, each error naming
the config paths and the rule.

`RunConfig` runs `check` once, as it is validated (so a config that validates can be built);
the agentic rule also runs on a plain Dynamo trace once it is read (`agentic_violation`).
"""

from __future__ import annotations

from servesim.config.cluster import (
    SGLANG_KEYS,
    TRTLLM_KEYS,
    AggregatedTopology,
    DisaggTopology,
    EngineConfig,
    KvRouter,
)
from servesim.config.derived import cache_layout, role_engines
from servesim.config.sections import Sections
from servesim.config.workloads import AgenticOptions, DynamoTraceWorkload, SyntheticWorkload


def check(cfg: Sections) -> None:
    """Every rule, in this order; the first broken one raises ValueError (or ConfigError)."""
    check_roles(cfg)
    check_engines(cfg)
    check_cluster_size(cfg)
    check_kv_tiers(cfg)
    check_kv_router(cfg)
    check_agentic(cfg)
    check_link_pairs(cfg)


def check_roles(cfg: Sections) -> None:
    """The prefill and decode engines agree on what the two pools share."""
    engines = role_engines(cfg)  # (a role's override that does not validate raises here)
    if "decode" not in engines:
        return
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


# Engine keys read by one engine only, by the `engine.kind` that reads them.
ENGINE_ONLY_KEYS = {"sglang": SGLANG_KEYS, "trtllm": TRTLLM_KEYS}


def _engine_path(cfg: Sections, role: str, key: str) -> str:
    """Where a role's engine key was set: its topology override, else `engine`."""
    topo = cfg.topology
    if isinstance(topo, DisaggTopology) and getattr(getattr(topo, role), key, None) is not None:
        return f"topology.{role}.{key}"
    return f"engine.{key}"


def check_engines(cfg: Sections) -> None:
    """Each role's engine sets only keys its kind reads, within that engine's limits (the
    mocker's own checks, with their config paths)."""
    for role, engine in role_engines(cfg).items():
        kind = engine.kind
        for owner, keys in ENGINE_ONLY_KEYS.items():
            for key in keys:
                if owner != kind and getattr(engine, key) is not None:
                    raise ValueError(
                        f"{_engine_path(cfg, role, key)}: a key of engine={owner} only; "
                        f"engine.kind is {kind} (choose engine={owner}, or drop the key)"
                    )
        if kind == "sglang":
            _check_sglang(cfg, role, engine)
        elif engine.block_size < 2:
            raise ValueError(
                f"{_engine_path(cfg, role, 'block_size')}: engine.kind={kind} needs blocks of "
                f"at least 2 tokens, got {engine.block_size} (only sglang pages may hold 1)"
            )
        _check_speculative(cfg, role, engine)


def _check_sglang(cfg: Sections, role: str, engine: EngineConfig) -> None:
    if not engine.enable_chunked_prefill:
        raise ValueError(
            f"{_engine_path(cfg, role, 'enable_chunked_prefill')}: SGLang always chunks its "
            "prefill; false is not supported with engine.kind=sglang"
        )
    chunk = engine.chunked_prefill_size
    if chunk is not None and chunk % engine.block_size:
        raise ValueError(
            f"{_engine_path(cfg, role, 'chunked_prefill_size')}: {chunk} is not a multiple of "
            f"the page size, engine.block_size={engine.block_size}"
        )


def _check_speculative(cfg: Sections, role: str, engine: EngineConfig) -> None:
    spec = engine.speculative
    path = _engine_path(cfg, role, "speculative")
    if spec.num_speculative_tokens is None:
        if spec.acceptance_rates is not None:
            raise ValueError(
                f"{path}.acceptance_rates is set without {path}.num_speculative_tokens "
                "(speculative decoding is off)"
            )
        return
    if engine.decode_speedup_ratio != 1.0:
        raise ValueError(
            f"{path}.num_speculative_tokens needs {_engine_path(cfg, role, 'decode_speedup_ratio')}"
            f"=1.0, got {engine.decode_speedup_ratio}: speculation already speeds decode up "
            "(tokens per step), as the mocker models it"
        )
    if cfg.kv_cache.host_offload.num_host_blocks is not None:
        raise ValueError(
            f"{path}.num_speculative_tokens with kv_cache.host_offload: speculative decoding "
            "with KV tiers is not modelled (nor by the mocker); drop one of them"
        )


# The most engine ranks (one scheduler and KV pool each) one run simulates. Every worker and
# rank is built in full at the start whether or not requests reach it, each worker with its
# own decode-price table (one slot per KV token of its pool, in separately mapped memory):
# 100,000 workers took 5.7 GB and, under experiment=dynamo_compat, failed an allocation at
# about 32,000 (each table took two of the kernel's 65,530 memory maps a process may hold).
# Ranks cost time too: a worker's pass visits each of its ranks, and one request on one worker
# of dp_size 100,000 took 237 s. 10,000 workers build in about 4 s in 250 MB.
MAX_ENGINE_RANKS = 10_000


def check_cluster_size(cfg: Sections) -> None:
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


def check_kv_tiers(cfg: Sections) -> None:
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
        if engine.kind in ENGINE_ONLY_KEYS:
            raise ValueError(
                f"kv_cache.host_offload is modelled for the vllm engine only (vLLM's offloading "
                f"connector); {_engine_path(cfg, role, 'kind')} is {engine.kind}"
            )
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


def check_kv_router(cfg: Sections) -> None:
    """router=kv needs more than one target; sibling-group affinity needs conversation lineage."""
    router = cfg.router
    if not isinstance(router, KvRouter):
        return
    topo = cfg.topology
    if isinstance(topo, AggregatedTopology):
        targets = topo.num_workers * cfg.engine.dp_size
        if targets < 2:
            raise ValueError(
                "router=kv requires more than one routable worker (topology.num_workers x "
                f"engine.dp_size = {targets}); use router=round_robin for one"
            )
    if router.affinity.mode == "sibling_group":
        w = cfg.workload
        if not (isinstance(w, SyntheticWorkload) and w.num_prefix_groups > 0):
            raise ValueError(
                "router.affinity.mode=sibling_group requires conversation lineage (a "
                "family per session); workload="
                f"{w.kind} has none here (synthetic workloads with num_prefix_groups > 0 "
                "do); use router.affinity.mode=session"
            )


def check_agentic(cfg: Sections) -> None:
    """An agentic workload runs only where it is qualified (`agentic_violation`); a plain
    Dynamo trace is checked once it is read (whether it is agentic shows only then)."""
    w = cfg.workload
    if not isinstance(w, AgenticOptions):
        return
    plain_dynamo = (
        isinstance(w, DynamoTraceWorkload)
        and w.agentic_lanes is None
        and w.agentic_snapshot is None
    )
    if not plain_dynamo:
        problem = agentic_violation(cfg, f"workload={w.kind}")
        if problem:
            raise ValueError(problem)


def check_link_pairs(cfg: Sections) -> None:
    """Per-pair link settings name workers that exist."""
    topo = cfg.topology
    if not isinstance(topo, DisaggTopology):
        return
    pools = (("prefill", topo.num_prefill_workers), ("decode", topo.num_decode_workers))
    for k, pair in enumerate(cfg.link.pairs):
        for side, n in pools:
            bad = [i for i in getattr(pair, f"{side}_workers") or [] if not 0 <= i < n]
            if bad:
                raise ValueError(
                    f"link.pairs[{k}].{side}_workers: {bad} out of range; the {side} pool "
                    f"has workers 0..{n - 1}"
                )


# --------------------------------------------------------------------------- agentic replay

# The topologies and load an agentic replay is qualified for (reference §1.3 and §7.5).
#
# Agentic replay is `functional_only`: its timing checks lifecycle semantics, not accuracy. The
# rules, each named in its error:
#
# * load: trace timestamps only (no concurrency, no re-stamped rate), no virtual-time cut-off;
# * host offload (G2) only on one aggregated worker or one prefill + one decode worker, every
#   role at DP size 1; disk (G3) never;
# * engines vllm or sglang, speculative decoding off; static pools (servesim does not
#   autoscale).
#
# Ordinary (non-agentic) traces keep every topology.


def agentic_violation(cfg: Sections, what: str) -> str | None:
    """Why `cfg` cannot replay the agentic input `what` (None: it can)."""
    if cfg.load.kind != "trace":
        return (
            f"{what} requires trace-timestamp load (load=trace); load={cfg.load.kind} is not "
            "supported for agentic replay (rule: agentic inputs replay their own timing)"
        )
    if cfg.stop.max_virtual_time_ms is not None:
        return (
            f"agentic trace does not support max virtual time (stop.max_virtual_time_ms is set; "
            f"{what} ends when its plays settle, or by workload.agentic_profile)"
        )
    for role, engine in role_engines(cfg).items():
        if engine.kind not in ("vllm", "sglang"):
            return (
                f"agentic replay supports the vllm and sglang engines only; "
                f"{_engine_path(cfg, role, 'kind')} is {engine.kind}"
            )
        if engine.speculative.num_speculative_tokens is not None:
            return (
                "agentic replay requires speculative decoding off ("
                f"{_engine_path(cfg, role, 'speculative')}.num_speculative_tokens is set)"
            )
    kv = cfg.kv_cache
    if kv.disk.num_g3_blocks is not None:
        return (
            "agentic replay rejects G3 (kv_cache.disk.num_g3_blocks is set; rule: agentic "
            "replay is qualified for HBM-only or HBM + host (G2) KV)"
        )
    if kv.host_offload.num_host_blocks is not None:
        topo = cfg.topology
        single = (isinstance(topo, AggregatedTopology) and topo.num_workers == 1) or (
            isinstance(topo, DisaggTopology)
            and topo.num_prefill_workers == 1
            and topo.num_decode_workers == 1
        )
        if not single:
            return (
                "agentic replay with host offload (kv_cache.host_offload) is qualified for one "
                "aggregated worker or 1P1D only (rule: G2 needs a single-worker static setup); "
                f"got {_shape(cfg)}"
            )
        dp = {role: e.dp_size for role, e in role_engines(cfg).items() if e.dp_size != 1}
        if dp:
            return (
                "agentic replay with host offload (kv_cache.host_offload) requires DP size 1 "
                f"(rule: G2 on one rank per worker); got dp_size {dp}"
            )
    return None


def _shape(cfg: Sections) -> str:
    topo = cfg.topology
    if topo.kind == "disagg":
        return f"{topo.num_prefill_workers}P{topo.num_decode_workers}D"  # type: ignore[union-attr]
    return f"{topo.num_workers} aggregated workers"  # type: ignore[union-attr]
