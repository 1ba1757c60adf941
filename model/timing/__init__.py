"""Step-time models: how long one engine pass takes, from its prefill and decode shape."""

from __future__ import annotations

from servesim.config.derived import role_engines
from servesim.config.errors import ConfigError
from servesim.config.schema import (
    AiconfiguratorTiming,
    CalibratedRooflineTiming,
    EngineConfig,
    FixedTiming,
    InterpolatedTiming,
    PolynomialTiming,
    RooflineTiming,
    RunConfig,
)
from servesim.timing.base import Scaled, StepTime
from servesim.timing.calibrated import CalibratedRoofline, calibrated_factors
from servesim.timing.fixed import Fixed
from servesim.timing.interpolated import Interpolated
from servesim.timing.polynomial import Polynomial
from servesim.timing.roofline import Roofline

# the shipped defaults (conf/config.yaml): a run that keeps them says nothing about its model
DEFAULT_LLM, DEFAULT_HARDWARE = "llama3_8b", "h100_sxm"


def geometry_ignored(cfg: RunConfig) -> str | None:
    """One line for a run whose timing model takes no account of the model, the GPU or the
    tensor parallelism while its config sets them (another llm or hardware than the defaults,
    or `tp_size` > 1): its pass times would be the same for any of them. None otherwise."""
    t = cfg.timing
    if not isinstance(t, (PolynomialTiming, FixedTiming, InterpolatedTiming)):
        return None
    tp = max(e.tp_size for e in role_engines(cfg).values())
    set_here = []
    if cfg.llm.name != DEFAULT_LLM:
        set_here.append(f"llm={cfg.llm.name}")
    if cfg.hardware.name != DEFAULT_HARDWARE:
        set_here.append(f"hardware={cfg.hardware.name}")
    if tp > 1:
        set_here.append(f"tp_size={tp}")
    if not set_here:
        return None
    return (
        f"timing={t.kind} ignores the model, the GPU and tensor parallelism "
        f"({', '.join(set_here)} only size the KV pool): use timing=calibrated_roofline for "
        "pass times of this deployment"
    )


def build_step_time(cfg: RunConfig, engine: EngineConfig | None = None) -> StepTime:
    """The configured timing model, scaled by the engine's speedup ratios (`engine` defaults
    to cfg.engine; pass a role's engine in a disagg topology)."""
    engine = engine or cfg.engine
    t = cfg.timing
    # a decode step's tokens per sequence: k + 1 when it verifies k speculative drafts (the
    # hardware models price them; polynomial, fixed and measured profiles charge a step)
    drafts = engine.speculative.num_speculative_tokens
    per_seq = 1 if drafts is None else drafts + 1
    inner: StepTime
    if isinstance(t, PolynomialTiming):
        inner = Polynomial(t)
    elif isinstance(t, FixedTiming):
        inner = Fixed(t)
    elif isinstance(t, InterpolatedTiming):
        inner = Interpolated(t)
    elif isinstance(t, RooflineTiming):
        inner = Roofline(t, cfg.llm, cfg.hardware, engine.tp_size, per_seq, engine.dp_size)
    elif isinstance(t, CalibratedRooflineTiming):
        try:
            inner = CalibratedRoofline(
                cfg.llm,
                cfg.hardware,
                engine.tp_size,
                path=t.factors_path,
                decode_tokens_per_seq=per_seq,
                dp_size=engine.dp_size,
            )
        except (ValueError, OSError) as e:
            raise ConfigError(str(e)) from None
    elif isinstance(t, AiconfiguratorTiming):
        inner = _aiconfigurator(cfg, t, engine)
    else:  # pragma: no cover - the schema admits no other kind
        raise TypeError(f"unknown timing kind {t!r}")
    return Scaled(inner, engine.speedup_ratio, engine.decode_speedup_ratio)


# servesim names -> AIConfigurator's (the library caches Llama 3.1 under its old repo names;
# servesim.timing.aiconfigurator aliases the new ones)
AIC_MODELS = {
    "llama3_8b": "meta-llama/Llama-3.1-8B",
    "llama3_70b": "meta-llama/Llama-3.1-70B",
    "qwen3_32b": "Qwen/Qwen3-32B",
    "qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3_235b_a22b": "Qwen/Qwen3-235B-A22B",
}
AIC_SYSTEMS = {"h100_sxm": "h100_sxm", "h200_sxm": "h200_sxm", "b200": "b200_sxm"}
AIC_GEMM_QUANT = {"bfloat16": None, "fp8": "fp8", "fp4": "nvfp4"}
AIC_KV_QUANT = {"auto": None, "bfloat16": None, "fp8": "fp8", "int8": "int8"}


def _aiconfigurator(cfg: RunConfig, t: AiconfiguratorTiming, engine: EngineConfig) -> StepTime:
    """AIConfigurator's step time for this llm / hardware / engine, or a ConfigError naming
    what it cannot price (never a silent fallback)."""
    llm, hw = cfg.llm, cfg.hardware
    model_id = t.model_id or AIC_MODELS.get(llm.name)
    system = t.system or AIC_SYSTEMS.get(hw.name)
    problems = []
    if model_id is None:
        problems.append(f"llm.name={llm.name} has no Hugging Face id (set timing.model_id)")
    if system is None:
        problems.append(f"hardware.name={hw.name} has no AIC system (set timing.system)")
    if llm.dtype not in AIC_GEMM_QUANT:
        problems.append(f"llm.dtype={llm.dtype} (AIC prices bfloat16, fp8, fp4)")
    kv = llm.kv_dtype
    if kv not in AIC_KV_QUANT:
        problems.append(f"llm.kv_dtype={kv} (AIC prices auto, bfloat16, fp8, int8)")
    if problems:
        raise ConfigError(
            "timing=aiconfigurator cannot price this run: "
            + "; ".join(problems)
            + " (timing=calibrated_roofline or roofline price any llm x hardware)"
        )
    assert model_id is not None and system is not None  # else a problem was named above
    try:
        from servesim.timing.aiconfigurator import AiconfiguratorStepTime

        return AiconfiguratorStepTime(
            model_id,
            system,
            t.backend,
            backend_version=t.backend_version,
            tp_size=engine.tp_size,
            ep_size=t.ep_size,
            attention_dp_size=engine.dp_size,
            gemm_quant=AIC_GEMM_QUANT[llm.dtype],
            kv_cache_quant=AIC_KV_QUANT[kv],
            bucket_rel_error=t.bucket_rel_error,
        )
    except ImportError as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:
        raise ConfigError(
            f"timing=aiconfigurator: {e} (timing=calibrated_roofline or roofline price any "
            "llm x hardware)"
        ) from None


def frontend_latency_ms(cfg: RunConfig) -> float:
    """A request's latency before the scheduler sees it (tokenization, API, scheduling), in ms:
    the calibrated roofline's fitted `o_req`; 0 for every other timing model."""
    t = cfg.timing
    if not isinstance(t, CalibratedRooflineTiming):
        return 0.0
    try:
        return calibrated_factors(cfg.llm, cfg.hardware, t.factors_path)[0].get("o_req", 0.0)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(
            f"timing.factors_path: cannot read the calibrated roofline's factors "
            f"({type(e).__name__}: {e}); expected a JSON object with a `groups` table"
        ) from None


__all__ = ["StepTime", "build_step_time", "frontend_latency_ms"]
