"""The frozen plan of a run: what it derives from its validated config, computed once.

Builders receive the plan, never re-derive: each role's engine (`engine` with a P/D role's
overrides), each role's KV blocks per rank, KV bytes per token as the pools hold it and as a
transfer charges it, and whether KV pools publish events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from servesim.config.cluster import DisaggTopology, EngineConfig
from servesim.config.derived import (
    kv_bytes_per_token,
    kv_events_on,
    num_gpu_blocks,
    role_engines,
    transfer_bytes_per_token,
)
from servesim.config.schema import RunConfig


@dataclass(frozen=True)
class Plan:
    cfg: RunConfig
    engines: Mapping[str, EngineConfig]  # by role: "aggregated", or "prefill" and "decode"
    gpu_blocks: Mapping[str, int]  # KV blocks per rank, by role
    kv_bytes_per_token: int  # K and V of one token, all layers, before TP sharding
    transfer_bytes_per_token: int  # what a P/D transfer charges per token
    block_size: int  # tokens per KV block (every role's: the rules check they agree)
    kv_events: bool  # whether KV pools publish stored/removed events

    def pool_sizes(self) -> dict[str, int]:
        """Workers and GPUs per worker (TP x DP) of each pool; aggregated workers are the
        decode pool, as in Dynamo's summary."""
        topo = self.cfg.topology
        if isinstance(topo, DisaggTopology):
            p, d = self.engines["prefill"], self.engines["decode"]
            return {
                "prefill_workers": topo.num_prefill_workers,
                "prefill_gpus_per_worker": p.tp_size * p.dp_size,
                "decode_workers": topo.num_decode_workers,
                "decode_gpus_per_worker": d.tp_size * d.dp_size,
            }
        e = self.engines["aggregated"]
        return {
            "prefill_workers": 0,
            "prefill_gpus_per_worker": 0,
            "decode_workers": topo.num_workers,
            "decode_gpus_per_worker": e.tp_size * e.dp_size,
        }


def make_plan(cfg: RunConfig) -> Plan:
    """The plan of a validated config (raises ConfigError if the HBM leaves no room for KV)."""
    engines = role_engines(cfg)
    return Plan(
        cfg=cfg,
        engines=MappingProxyType(engines),
        gpu_blocks=MappingProxyType(
            {role: num_gpu_blocks(cfg, engine, role) for role, engine in engines.items()}
        ),
        kv_bytes_per_token=kv_bytes_per_token(cfg.llm),
        transfer_bytes_per_token=transfer_bytes_per_token(cfg),
        block_size=next(iter(engines.values())).block_size,
        kv_events=kv_events_on(cfg),
    )
