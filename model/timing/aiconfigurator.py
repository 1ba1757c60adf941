"""Step time from NVIDIA AIConfigurator's measured per-operation tables (optional `aic` extra).

`aiconfigurator-core` (Apache-2.0, CPU-only) ships GEMM, attention, all-reduce and MoE latencies
measured on real GPUs (h100_sxm, h200_sxm, b200_sxm, ...) under a serving framework (vLLM,
TensorRT-LLM, SGLang) at a given version. It builds a model's operator graph from its Hugging
Face config (cached in the package, so nothing is downloaded) and prices one engine step by
interpolating each operator in those tables. This backend asks it for the two parts of a pass:

    prefill part = context step of n sequences, each computing mean_isl - mean_prefix new tokens
                   after mean_prefix cached ones (so attending over mean_isl positions)
    decode part  = generation step of `batch` sequences, each attending over mean_context
                   positions (AIC's decode step at s = isl + 1 with isl = mean_context - 1)

`active_kv_tokens` and `total_kv_tokens` are not used: AIC prices a decode step from the batch
and one context length. The batch is one attention-DP rank's (servesim prices each rank's batch
on its own, and AIC's batch is per rank too); `attention_dp_size` only changes the model when it
has experts (an MoE layer sees every rank's tokens). A mixed pass pays the two steps in full,
as every servesim timing model does; AIC's own mixed-step estimate, which runs the GEMMs once
over both phases' tokens, can be lower.

Predictions are memoised on bucketed shapes (see `bucket`); the first prediction of a new
bucket costs tens of microseconds to a few hundred milliseconds (the tables load lazily), a
repeated bucket a microsecond or two.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

MISSING_EXTRA = "timing=aiconfigurator needs the aic extra: pip install -e '.[aic]'"

# Hugging Face renamed the Llama 3.1 repositories; the library caches them under the old names.
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B": "meta-llama/Meta-Llama-3.1-405B",
}

# Below this (or below 1 / bucket_rel_error, if larger: the bound of `bucket` needs it), batch
# sizes and token counts are priced exactly: small values are common and few.
EXACT_BELOW = 64

# A short shape priced once at construction, so that a quantisation or parallelism the tables
# lack fails while the run is being built, not in its first pass.
_PROBE_PREFILL = (1, 128, 0)
_PROBE_DECODE = (1, 128)


def bucket(x: int, log_step: float, exact_below: int) -> int:
    """`x` rounded to a geometric grid: exact below `exact_below`, else the grid point
    round(rho^(k + 1/2)) of the interval [rho^k, rho^(k+1)) holding `x`, with
    log_step = ln(rho), never less than `exact_below` (so bucketing is non-decreasing in `x`).

    Bound: with sqrt(rho) = 1 + e/2 and exact_below >= 1/e, |bucket(x) - x| <= e x for every
    integer x >= 0. The grid point before rounding is within a factor sqrt(rho) of x (relative
    error <= e/2), and rounding to an integer adds at most 1/2 <= (e/2) x.
    """
    if x < exact_below:
        return x
    k = math.floor(math.log(x) / log_step)
    return max(exact_below, round(math.exp((k + 0.5) * log_step)))


class AiconfiguratorStepTime:
    """StepTime from `aiconfigurator-core` for one (model, system, backend, parallelism).

    model_id: Hugging Face id the library has cached (e.g. "meta-llama/Meta-Llama-3.1-8B", or
        "meta-llama/Llama-3.1-8B", Hugging Face's current name for it), or a local directory
        with a config.json.
    system: the library's system name: "h100_sxm", "h200_sxm", "b200_sxm", ...
    backend: "vllm", "trtllm" or "sglang".
    backend_version: a version the library lists for (system, backend), or one of its aliases
        "current" / "previous" / "next"; None is "current", the newest complete collection
        ("next", where present, is a development drop whose missing tables are filled from
        "current").
    tp_size: tensor-parallel GPUs per rank. ep_size: expert-parallel size (MoE models only;
        the experts' TP is tp_size x attention_dp_size / ep_size). attention_dp_size:
        attention data-parallel ranks per worker (servesim's engine.dp_size).
    gemm_quant, kv_cache_quant, fmha_quant: the library's quantisation mode names (e.g. "fp8",
        "nvfp4", "fp8_block"; KV "fp8", "int8"); None is the checkpoint's own precision, read
        from its config.json (bfloat16 for a bf16 checkpoint).
    bucket_rel_error: e. Batch sizes, new tokens per sequence, cached prefix and decode context
        are each rounded to a geometric grid before pricing (`bucket`), exact below
        max(EXACT_BELOW, ceil(1/e)) and with relative error <= e above; so a prefill's new-token
        total n x chunk is within (1 + e)^2 - 1. 0 prices every shape exactly.

    Raises ImportError (MISSING_EXTRA) without the library, and ValueError naming what is
    missing, with what is available, for a model, system, backend, version, quantisation or
    parallelism the library or its tables do not cover. There is no fallback.
    """

    def __init__(
        self,
        model_id: str,
        system: str,
        backend: str,
        backend_version: str | None = None,
        tp_size: int = 1,
        ep_size: int = 1,
        attention_dp_size: int = 1,
        gemm_quant: str | None = None,
        kv_cache_quant: str | None = None,
        fmha_quant: str | None = None,
        bucket_rel_error: float = 0.02,
    ) -> None:
        for name, value in (
            ("tp_size", tp_size),
            ("ep_size", ep_size),
            ("attention_dp_size", attention_dp_size),
        ):
            if value < 1:
                raise ValueError(f"aiconfigurator: {name} must be >= 1, got {value}")
        if not 0 <= bucket_rel_error < 0.5:
            raise ValueError(
                f"aiconfigurator: bucket_rel_error must be in [0, 0.5), got {bucket_rel_error}"
            )
        try:
            from aiconfigurator_core.sdk import common, perf_database
            from aiconfigurator_core.sdk.engine import EngineHandle
            from aiconfigurator_core.sdk.models.helpers import check_is_moe
        except ImportError as exc:
            raise ImportError(MISSING_EXTRA) from exc

        self.model_id = _resolve_model(MODEL_ALIASES.get(model_id, model_id), common)
        self.system = system
        self.backend = backend
        self.backend_version = _resolve_version(system, backend, backend_version, perf_database)
        self.tp_size = tp_size
        self.ep_size = ep_size
        self.attention_dp_size = attention_dp_size
        quant = {
            "gemm_quant_mode": _check_quant("gemm_quant", gemm_quant, common.GEMMQuantMode),
            "kvcache_quant_mode": _check_quant(
                "kv_cache_quant", kv_cache_quant, common.KVCacheQuantMode
            ),
            "fmha_quant_mode": _check_quant("fmha_quant", fmha_quant, common.FMHAQuantMode),
        }
        self.label = (
            f"{self.model_id} on {system} {backend} {self.backend_version} tp{tp_size} "
            f"ep{ep_size} dp{attention_dp_size} gemm={gemm_quant} kv={kv_cache_quant} "
            f"fmha={fmha_quant}"
        )
        parallel: dict[str, int] = {"tp_size": tp_size, "attention_dp_size": attention_dp_size}
        try:
            with _quiet_library():
                is_moe = check_is_moe(self.model_id)
        except (ValueError, KeyError) as exc:  # a local config.json the library cannot read
            raise ValueError(f"aiconfigurator cannot read {self.model_id}: {exc}") from exc
        if is_moe:
            width = tp_size * attention_dp_size
            if width % ep_size:
                raise ValueError(
                    f"aiconfigurator: tp_size x attention_dp_size = {width} is not a multiple "
                    f"of ep_size {ep_size} ({self.label})"
                )
            parallel.update(moe_ep_size=ep_size, moe_tp_size=width // ep_size)
        elif ep_size != 1:
            raise ValueError(
                f"aiconfigurator: ep_size {ep_size} > 1 needs a model with experts; "
                f"{self.model_id} is dense"
            )
        try:
            with _quiet_library():
                self._engine: Any = EngineHandle.compile(
                    self.model_id,
                    system,
                    backend,
                    backend_version=self.backend_version,
                    **parallel,
                    **{k: v for k, v in quant.items() if v is not None},
                )
        except (ValueError, AssertionError, KeyError, NotImplementedError, RuntimeError) as exc:
            raise ValueError(f"aiconfigurator cannot build {self.label}: {exc}") from exc

        e = bucket_rel_error
        self.bucket_rel_error = e
        if e > 0:
            self.exact_below = max(EXACT_BELOW, math.ceil(1.0 / e))
            self.log_step = 2.0 * math.log1p(e / 2.0)
        else:
            self.exact_below = 2**62  # every shape exact
            self.log_step = 1.0
        self._prefill_memo: dict[tuple[int, int, int], float] = {}
        self._decode_memo: dict[tuple[int, int], float] = {}
        # unsupported quantisation / attention / comm tables surface on the first query
        self.prefill_ms(*_PROBE_PREFILL)
        self.decode_ms(_PROBE_DECODE[0], 0, 0, _PROBE_DECODE[1])

    def _bucket(self, x: int) -> int:
        return bucket(x, self.log_step, self.exact_below)

    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float:
        chunk = mean_isl - mean_prefix
        if n <= 0 or chunk <= 0:
            return 0.0
        b = self._bucket
        key = (b(n), b(chunk), b(mean_prefix) if mean_prefix > 0 else 0)
        ms = self._prefill_memo.get(key)
        if ms is None:
            bn, bc, bp = key
            ms = self._checked(
                self._engine.predict_prefill_latency,
                f"prefill of {bn} x {bc} new tokens after {bp} cached",
                bn,
                bp + bc,
                bp,
            )
            self._prefill_memo[key] = ms
        return ms

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float:
        if batch <= 0:
            return 0.0
        key = (self._bucket(batch), self._bucket(max(mean_context, 1)))
        ms = self._decode_memo.get(key)
        if ms is None:
            bb, bc = key
            # AIC's one decode step (osl 2) attends over isl + 1 positions
            ms = self._checked(
                self._engine.predict_decode_latency,
                f"decode of {bb} sequences at context {bc}",
                bb,
                bc - 1,
                2,
            )
            self._decode_memo[key] = ms
        return ms

    def _checked(self, predict: Any, what: str, *args: int) -> float:
        try:
            with _quiet_library():
                ms = float(predict(*args))
        except (ValueError, RuntimeError) as exc:
            raise ValueError(
                f"aiconfigurator cannot price the {what} ({self.label}): {exc}"
            ) from exc
        if not (math.isfinite(ms) and ms >= 0.0):
            raise ValueError(f"aiconfigurator priced the {what} at {ms} ms ({self.label})")
        return ms


def _resolve_model(model_id: str, common: Any) -> str:
    if os.path.isdir(model_id) or model_id in common.DefaultHFModels:
        return model_id
    # any other id would make the library fetch config.json from Hugging Face
    known = ", ".join(sorted(common.DefaultHFModels))
    raise ValueError(
        f"aiconfigurator has no cached config for model {model_id!r} (and a directory of that "
        f"name does not exist); cached models: {known}"
    )


def _available(perf_database: Any) -> str:
    lines = []
    for system, backends in sorted(perf_database.get_supported_databases().items()):
        versions = "; ".join(f"{b} {', '.join(v)}" for b, v in sorted(backends.items()))
        lines.append(f"{system}: {versions}")
    return "\n  ".join(lines)


def _resolve_version(system: str, backend: str, version: str | None, perf_database: Any) -> str:
    # the version slots exist only where the system has data for the backend; listing every
    # database (about a second) is left to the error path
    slots = perf_database.get_version_slots(system, backend)
    if not slots:
        supported = perf_database.get_supported_databases()
        what = (
            f"system {system!r}" if system not in supported else f"backend {backend!r} on {system}"
        )
        raise ValueError(
            f"aiconfigurator has no performance data for {what}; systems and "
            f"backends/versions with data:\n  {_available(perf_database)}"
        )
    requested = "current" if version is None else version
    try:
        return str(perf_database.resolve_query_version(system, backend, requested))
    except ValueError as exc:
        listed = ", ".join(f"{v} ({k})" for k, v in slots.items())
        raise ValueError(
            f"aiconfigurator has no {backend} version {requested!r} for {system}; "
            f"available: {listed}"
        ) from exc


def _check_quant(name: str, value: str | None, modes: Any) -> str | None:
    if value is None or value in modes.__members__:
        return value
    raise ValueError(
        f"aiconfigurator: unknown {name} {value!r}; the library's modes: "
        f"{', '.join(modes.__members__)} (None: the checkpoint's own precision)"
    )


@contextmanager
def _quiet_library() -> Iterator[None]:
    """Keeps the library's warnings (tables of other model families it loads, lane defaults)
    out of a run's log; its errors still show."""
    logger = logging.getLogger("aiconfigurator_core")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
