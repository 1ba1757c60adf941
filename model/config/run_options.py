"""Config sections of how a run is run and reported: SLO bounds, stop, the speed layer, outputs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from servesim.config.base import PositiveFloat, Schema


class SloConfig(Schema):
    """Service-level bounds for goodput: a completed request is good if it meets every bound
    set (TTFT, mean ITL = (E2E - TTFT) / (tokens - 1), E2E)."""

    ttft_ms: PositiveFloat | None = None
    itl_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None


class StopConfig(Schema):
    max_virtual_time_ms: PositiveFloat | None = Field(
        None, description="soft cut-off: requests still in flight end `incomplete`"
    )


class SpeedConfig(Schema):
    """The speed layer (docs/speed.md): shortcuts that change no answer, each checked by an
    equivalence test against the textbook loop. `speed=textbook` turns them all off."""

    fast_forward: bool = Field(
        True,
        description="chain passes nothing can interrupt, and apply runs of decode-only passes "
        "at once (false: every pass goes through the worker's textbook loop)",
    )
    grouped_pool: bool = Field(
        True,
        description="keep the engine blocks of one trace block as one group in the KV pool "
        "where they tile it (false: every block on its own)",
    )
    gc_tuning: bool = Field(
        True,
        description="pace Python's cyclic garbage collector for the event loop (false: the "
        "interpreter's defaults)",
    )
    processes: int = Field(
        1,
        ge=1,
        description="OS processes to replay the workers in (each owns every P-th worker); only "
        "where workers never interact (aggregated, round-robin, streamed open-loop trace, no "
        "frontend latency, no KV tiers), else one process (summary metadata says why)",
    )


class OutputConfig(Schema):
    tables: bool = Field(True, description="write requests/passes/kv tables to the run dir")
    format: Literal["parquet", "csv"] = "parquet"
    per_request_jsonl: bool = Field(
        False, description="also write requests.jsonl with the mocker's per-request field names"
    )
    per_token: bool = Field(False, description="keep every token's time per request")
    pass_table: bool = Field(
        True,
        description="keep one row per engine pass (the passes table); false for very long "
        "replays: passes are then only counted",
    )
    kv_events: bool = Field(False, description="record KV events (stored/removed) as a table")
    progress: Literal["auto", "on", "off"] = Field(
        "auto", description="progress bar over requests; auto = only on a terminal"
    )

    @field_validator("progress", mode="before")
    @classmethod
    def _yaml_booleans(cls, v: object) -> object:
        # YAML 1.1 reads a bare on/off as a boolean
        if isinstance(v, bool):
            return "on" if v else "off"
        return v
