"""Config sections of the offered traffic: workloads (traces and generators) and load."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from servesim.config.base import NonNegFloat, PositiveFloat, Schema

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
