"""The comparison's cases: cluster shapes, servesim's config, one case run on both sides."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compare_dynamo_join import Kind, PerRequest, Row, compare, per_request
from compare_dynamo_mocker import MockerRunner, mocker_kwargs

from servesim import Result, RunConfig, compose, simulate
from servesim.config.schema import DisaggTopology

BASE_OVERRIDES = ("experiment=dynamo_compat", "workload=mooncake", "output.progress=off")


# --------------------------------------------------------------------------- servesim


@dataclass(frozen=True)
class Shape:
    """A cluster shape: `workers` aggregated workers, or `prefill` x `decode` P/D pools; all
    None: the shape the overrides give (e.g. `--override topology=disagg ...`)."""

    workers: int | None = None
    prefill: int | None = None
    decode: int | None = None

    def overrides(self, user: Sequence[str]) -> list[str]:
        if self.workers is not None:
            return [f"topology.num_workers={self.workers}"]
        if self.prefill is None:
            return []
        out = [] if "topology=disagg" in user else ["topology=disagg"]
        return [
            *out,
            f"topology.num_prefill_workers={self.prefill}",
            f"topology.num_decode_workers={self.decode}",
        ]


def parse_pd(text: str) -> Shape:
    """`PxD` (e.g. 2x2, or 2P2D) as a P/D shape."""
    t = text.strip().lower().replace("p", "x").replace("d", "")
    parts = [x for x in t.split("x") if x]
    if len(parts) != 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
        raise ValueError(f"--pd takes PxD pool sizes such as 1x1,2x2; got {text!r}")
    return Shape(prefill=int(parts[0]), decode=int(parts[1]))


def shape_title(cfg: RunConfig) -> str:
    topo = cfg.topology
    if isinstance(topo, DisaggTopology):
        return f"{topo.num_prefill_workers}P{topo.num_decode_workers}D"
    n = topo.num_workers
    return f"{n} worker{'s' if n > 1 else ''}"


def compose_run_config(trace: Path, shape: Shape | int, overrides: Sequence[str] = ()) -> RunConfig:
    """servesim's RunConfig for one case, composed from conf/ as the `servesim` CLI would
    (`shape` an int: that many aggregated workers)."""
    if isinstance(shape, int):
        shape = Shape(workers=shape)
    base = list(BASE_OVERRIDES)
    if any(o.startswith("workload=") for o in overrides):  # e.g. workload=agentic_mooncake
        base.remove("workload=mooncake")
    return compose([*base, f"workload.path={trace}", *shape.overrides(overrides), *overrides])


def run_servesim(cfg: RunConfig) -> tuple[Result, float]:
    """The run's result and the wall time of `simulate` in seconds."""
    start = time.perf_counter()
    result = simulate(cfg)
    return result, time.perf_counter() - start


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    trace: str
    shape: str  # "N worker(s)" (aggregated) or "PxD" pools ("1P1D", "2P2D")
    overrides: list[str]
    mocker_kwargs: dict[str, Any]
    servesim_wall_s: float
    mocker_wall_s: float
    mocker_process_wall_s: float
    rows: list[Row]
    servesim_summary: dict[str, Any] = field(repr=False)
    mocker_summary: dict[str, Any] = field(repr=False)
    label: str = ""  # the trace's name in tables: its file name unless that is ambiguous
    per_request: PerRequest | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def wall_ratio(self) -> float:
        return self.servesim_wall_s / self.mocker_wall_s if self.mocker_wall_s > 0 else math.inf

    @property
    def title(self) -> str:
        return f"{self.label or self.trace}, {self.shape}"

    def worst(self, kind: Kind) -> float:
        diffs = [abs(r.diff) for r in self.rows if r.kind == kind and r.diff is not None]
        return max(diffs, default=math.nan)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ok=self.ok, wall_ratio=self.wall_ratio)
        return out


def run_case(
    trace: Path,
    shape: Shape | int,
    overrides: Sequence[str],
    runner: MockerRunner,
    label: str = "",
    check_requests: bool = False,
) -> Case:
    cfg = compose_run_config(trace, shape, overrides)
    kwargs = mocker_kwargs(cfg)
    result, servesim_wall = run_servesim(cfg)
    servesim = result.summary
    joined = None
    if check_requests:
        with tempfile.TemporaryDirectory(prefix="compare_dynamo_") as tmp:
            report = Path(tmp) / "requests.jsonl"
            mocker, mocker_wall, mocker_process_wall = runner.run(
                trace, {**kwargs, "report_jsonl_path": str(report)}
            )
            joined = per_request(result, report)
    else:
        mocker, mocker_wall, mocker_process_wall = runner.run(trace, kwargs)
    return Case(
        trace=str(trace),
        shape=shape_title(cfg),
        overrides=list(overrides),
        mocker_kwargs=kwargs,
        servesim_wall_s=servesim_wall,
        mocker_wall_s=mocker_wall,
        mocker_process_wall_s=mocker_process_wall,
        rows=compare(servesim, mocker),
        servesim_summary=servesim,
        mocker_summary=mocker,
        label=label or trace.name,
        per_request=joined,
    )
