"""The topologies and load an agentic replay is qualified for (reference §1.3 and §7.5).

Agentic replay is `functional_only`: its timing checks lifecycle semantics, not accuracy. The
rules, each named in its error:

* load: trace timestamps only (no concurrency, no re-stamped rate), no virtual-time cut-off;
* host offload (G2) only on one aggregated worker or one prefill + one decode worker, every
  role at DP size 1; disk (G3) never;
* static pools and speculation off always hold here (servesim has neither autoscaling nor
  speculative decoding).

Ordinary (non-agentic) traces keep every topology.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.config.schema import RunConfig

QUALIFICATION = "functional_only"


def agentic_violation(cfg: RunConfig, what: str) -> str | None:
    """Why `cfg` cannot replay the agentic input `what` (None: it can)."""
    from servesim.config.derived import role_engines
    from servesim.config.schema import AggregatedTopology, DisaggTopology

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


def _shape(cfg: RunConfig) -> str:
    topo = cfg.topology
    if topo.kind == "disagg":
        return f"{topo.num_prefill_workers}P{topo.num_decode_workers}D"  # type: ignore[union-attr]
    return f"{topo.num_workers} aggregated workers"  # type: ignore[union-attr]
