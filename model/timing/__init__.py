"""Step-time models: how long one engine pass takes, from its prefill and decode shape."""

from __future__ import annotations

from model.config.schema import (
    CalibratedRooflineTiming,
    FixedTiming,
    InterpolatedTiming,
    PolynomialTiming,
    RooflineTiming,
    RunConfig,
    VllmEngineConfig,
)
from model.timing.base import Scaled, StepTime
from model.timing.calibrated import CalibratedRoofline, calibrated_factors
from model.timing.fixed import Fixed
from model.timing.interpolated import Interpolated
from model.timing.polynomial import Polynomial
from model.timing.roofline import Roofline


def build_step_time(cfg: RunConfig, engine: VllmEngineConfig | None = None) -> StepTime:
    """The configured timing model, scaled by the engine's speedup ratios (`engine` defaults
    to cfg.engine; pass a role's engine in a disagg topology)."""
    engine = engine or cfg.engine
    t = cfg.timing
    inner: StepTime
    if isinstance(t, PolynomialTiming):
        inner = Polynomial(t)
    elif isinstance(t, FixedTiming):
        inner = Fixed(t)
    elif isinstance(t, InterpolatedTiming):
        inner = Interpolated(t)
    elif isinstance(t, RooflineTiming):
        inner = Roofline(t, cfg.llm, cfg.hardware, engine.tp_size)
    elif isinstance(t, CalibratedRooflineTiming):
        inner = CalibratedRoofline(cfg.llm, cfg.hardware, engine.tp_size, path=t.factors_path)
    else:  # pragma: no cover - the schema admits no other kind
        raise TypeError(f"unknown timing kind {t!r}")
    return Scaled(inner, engine.speedup_ratio, engine.decode_speedup_ratio)


def frontend_latency_ms(cfg: RunConfig) -> float:
    """A request's latency before the scheduler sees it (tokenization, API, scheduling), in ms:
    the calibrated roofline's fitted `o_req`; 0 for every other timing model."""
    t = cfg.timing
    if not isinstance(t, CalibratedRooflineTiming):
        return 0.0
    return calibrated_factors(cfg.llm, cfg.hardware, t.factors_path)[0].get("o_req", 0.0)


__all__ = ["StepTime", "build_step_time", "frontend_latency_ms"]
