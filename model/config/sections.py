"""What a validated run config holds, section by section, as the derived values and rules read it.

`RunConfig` (servesim.config.schema) is the one implementation; derived values and cross-field
rules are written against this protocol so that the schema can run the rules without the rules
importing the schema (config flows one way: sections -> derived values -> rules -> RunConfig).
"""

from __future__ import annotations

from typing import Protocol

from servesim.config.cluster import (
    EngineConfig,
    KvCacheConfig,
    LinkConfig,
    RouterConfig,
    TopologyConfig,
)
from servesim.config.hardware import HardwareConfig, LlmConfig, TimingConfig
from servesim.config.run_options import (
    OutputConfig,
    SloConfig,
    SpeedConfig,
    StopConfig,
)
from servesim.config.workloads import LoadConfig, WorkloadConfig


class Sections(Protocol):
    """The sections of a run config (read-only)."""

    @property
    def seed(self) -> int: ...
    @property
    def llm(self) -> LlmConfig: ...
    @property
    def hardware(self) -> HardwareConfig: ...
    @property
    def engine(self) -> EngineConfig: ...
    @property
    def timing(self) -> TimingConfig: ...
    @property
    def topology(self) -> TopologyConfig: ...
    @property
    def router(self) -> RouterConfig: ...
    @property
    def workload(self) -> WorkloadConfig: ...
    @property
    def load(self) -> LoadConfig: ...
    @property
    def link(self) -> LinkConfig: ...
    @property
    def kv_cache(self) -> KvCacheConfig: ...
    @property
    def slo(self) -> SloConfig: ...
    @property
    def stop(self) -> StopConfig: ...
    @property
    def output(self) -> OutputConfig: ...
    @property
    def speed(self) -> SpeedConfig: ...
