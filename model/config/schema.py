"""The validated run configuration: one frozen pydantic tree, a section per Hydra group.

Hydra composes YAML; `RunConfig.model_validate(...)` validates it once. Every section is frozen
and rejects unknown keys, so a typo in an override fails with the config path that holds it.
Config flows one way: the sections (servesim.config.hardware, .cluster, .workloads,
.run_options) -> derived values (servesim.config.derived) -> the cross-field rules
(servesim.config.rules) -> this RunConfig; what a run derives from it is computed once into a
frozen plan (servesim.config.plan). The section classes are importable from here too.
"""

from __future__ import annotations

from pydantic import model_validator

from servesim.config import rules
from servesim.config.base import (
    NonNegFloat,
    PositiveFloat,
    Schema,
)
from servesim.config.cluster import (
    AffinityConfig,
    AggregatedTopology,
    DisaggTopology,
    DiskConfig,
    EngineConfig,
    EngineOverrides,
    HostOffloadConfig,
    KvCacheConfig,
    KvRouter,
    LinkConfig,
    LinkPair,
    RandomRouter,
    RoundRobinRouter,
    RouterConfig,
    SpeculativeConfig,
    TopologyConfig,
)
from servesim.config.hardware import (
    AiconfiguratorTiming,
    CalibratedRooflineTiming,
    FixedTiming,
    HardwareConfig,
    InterpolatedTiming,
    LlmConfig,
    PolynomialTiming,
    RooflineTiming,
    TimingConfig,
)
from servesim.config.run_options import (
    OutputConfig,
    SloConfig,
    SpeedConfig,
    StopConfig,
)
from servesim.config.workloads import (
    AgenticMooncakeWorkload,
    AgenticOptions,
    AgenticProfile,
    AgenticSnapshot,
    AgenticSyntheticWorkload,
    AzureWorkload,
    ConcurrencyLoad,
    DynamoTraceWorkload,
    LengthDistribution,
    LoadConfig,
    MooncakeWorkload,
    RateLoad,
    SyntheticWorkload,
    TraceLoad,
    WekaWorkload,
    WorkloadConfig,
)

__all__ = [
    "AffinityConfig",
    "AgenticMooncakeWorkload",
    "AgenticOptions",
    "AgenticProfile",
    "AgenticSnapshot",
    "AgenticSyntheticWorkload",
    "AggregatedTopology",
    "AiconfiguratorTiming",
    "AzureWorkload",
    "CalibratedRooflineTiming",
    "ConcurrencyLoad",
    "DisaggTopology",
    "DiskConfig",
    "DynamoTraceWorkload",
    "EngineConfig",
    "EngineOverrides",
    "FixedTiming",
    "HardwareConfig",
    "HostOffloadConfig",
    "InterpolatedTiming",
    "KvCacheConfig",
    "KvRouter",
    "LengthDistribution",
    "LinkConfig",
    "LinkPair",
    "LlmConfig",
    "LoadConfig",
    "MooncakeWorkload",
    "NonNegFloat",
    "OutputConfig",
    "PolynomialTiming",
    "PositiveFloat",
    "RandomRouter",
    "RateLoad",
    "RooflineTiming",
    "RoundRobinRouter",
    "RouterConfig",
    "Schema",
    "SloConfig",
    "SpeculativeConfig",
    "SpeedConfig",
    "StopConfig",
    "SyntheticWorkload",
    "TimingConfig",
    "TopologyConfig",
    "TraceLoad",
    "WekaWorkload",
    "WorkloadConfig",
    "RunConfig",
]


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
    speed: SpeedConfig = SpeedConfig()

    @model_validator(mode="after")
    def _rules_hold(self) -> RunConfig:
        rules.check(self)  # the first rule broken raises, naming its config paths
        return self
