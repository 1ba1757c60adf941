"""Calibrated roofline step time: one term per op class (GEMMs, attention, TP all-reduce) with
efficiency factors per GPU family and weight dtype, fitted on measured serving benchmarks.

Per GPU of a `tp`-way tensor-parallel worker (P_gemm: parameters outside the embedding table,
W: weight bytes, L layers, H query heads, d head dim, h hidden size, kv: KV bytes per token):

    GEMM       t_gemm = max(2 P_gemm T / (tp peak_w e_c),  W / (tp BW e_m))
               (MoE: P_gemm from the active parameters, W the dense part plus the experts
               the T tokens touch in expectation)
    attention  prefill: 4 L H d T (prefix + chunk / 2) / (tp peak_bf16 e_a)
                        + kv n isl / (tp BW e_m)
               decode:  max(4 L H d B ctx / (tp peak_bf16 e_c),  kv B ctx / (tp BW e_m))
               (kv: KV bytes the TP group reads per token, each GPU its own share, and all of
               it where every GPU holds it: MLA's latent, or fewer KV heads than GPUs; MLA
               decodes in its compressed form, 2 L H (2 r + rope) flops per pair)
               + 2 S (n + B) / (tp BW e_m)   (linear-attention layers: each sequence's
               state S, `linear_state_bytes`, read and written back once per pass)
    all-reduce 2 L (a_ar + 2 (tp - 1) / tp x tokens h 2 B / (NVLink B/s e_ar))  (tp > 1 only)
    all-to-all 2 L a_ar + tokens x a2a / (tp NVLink B/s e_ar)   (MoE, dp > 1 only)
    MoE layers t_moe = o_moe L_moe   (every pass: routing, token permutation and the grouped
               expert kernels of each of the L_moe MoE layers, a fixed cost per layer)
    part       t = t_gemm + t_attn + t_comm + t_moe + o_p             (prefill)
                 t = t_gemm + t_attn + t_comm + t_moe + o_d L + o_seq B   (decode)
    mixed      t = t_gemm(T + B) + both t_attn + t_comm(T + B) + t_moe + o_p + o_seq B
               (a pass with both parts is priced as one: its weights are read once)

With attention data parallelism (dp ranks per worker, each `tp` GPUs) a rank prices its own
part: W is its copy of the dense weights plus 1/dp of the experts that the tokens of all
ranks touch (dp T tokens, the ranks in lock-step), and a MoE token's dispatch and combine
cross the worker's tp dp GPUs (a2a: L x 2 k h 2 B x (G - 1) / G, `all_to_all_bytes_per_token`)
at the all-reduce's fitted latency and efficiency.

T is the part's new tokens (prefill) or its batch B (decode; B (k + 1) with speculative
decoding's k drafts, verified in the step: the GEMMs and all-reduce of every verified token,
the KV read and `o_seq` once per sequence); peak_w the dense tensor rate of the
weights' dtype (fp4, fp8, else bf16). The fitted factors, per (GPU family, weight dtype), are
`e_c` (GEMM compute efficiency), `e_m` (HBM efficiency), `e_a` (attention efficiency), `e_ar`
(all-reduce bandwidth efficiency: achieved / rated NVLink bytes per second; 1 if absent), `o_p`,
`o_d` (fixed ms per prefill part / per layer of a decode part: a decode step's kernel
launches and syncs, which grow with the layers), `o_seq` (ms per decoding sequence: sampling,
detokenization, scheduling), `a_ar` (ms per all-reduce), `o_moe` (ms per MoE layer of a
pass; fitted on the mixture-of-experts rows at few clients, the others on dense rows) and
`o_req` (a request's frontend latency before the scheduler sees it: tokenization, API; the
cluster applies it, and it counts in TTFT only); they live in
`model/timing/roofline_factors.json`, written by `experiments/fit_roofline.py` from
`silicon_dev.csv`. A combination the table lacks falls back to the family's other dtype, then
to the mean over the table, and says so in `source` (never silently: it is in the summary
metadata).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from servesim.config.derived import (
    DTYPE_BYTES,
    active_params,
    all_to_all_bytes_per_token,
    attn_flops_per_pair,
    kv_bytes_read_per_token,
    linear_state_bytes,
    moe_layers,
    rank_weight_bytes,
    weight_bytes_read,
    window_attention_flops,
    window_kv_bytes,
)
from servesim.config.schema import HardwareConfig, LlmConfig
from servesim.timing.base import new_tokens

FACTORS_PATH = Path(__file__).resolve().with_name("roofline_factors.json")
FACTOR_KEYS = ("e_c", "e_m", "e_a", "e_ar", "o_p", "o_d", "o_seq", "a_ar", "o_req")
# factors a table may lack (written before they existed), and the value that leaves the
# formula as it was without them
OPTIONAL_FACTORS = {"e_ar": 1.0, "o_seq": 0.0, "o_moe": 0.0}
# the factor fitted on mixture-of-experts rows (experiments/fit_roofline.py's last stage)
MOE_FACTOR = "o_moe"
ALL_FACTOR_KEYS = (*FACTOR_KEYS, MOE_FACTOR)
# GPU families by hardware name prefix (a hardware config may set `family` itself)
FAMILIES = {
    "h100": "hopper",
    "h200": "hopper",
    "h20": "hopper",
    "b200": "blackwell",
    "gb200": "blackwell",
}


def family_of(hw: HardwareConfig) -> str:
    if hw.family is not None:
        return hw.family
    name = hw.name.lower()
    for prefix, family in sorted(FAMILIES.items(), key=lambda kv: -len(kv[0])):
        if name.startswith(prefix):
            return family
    return "unknown"


def weight_class(llm: LlmConfig, hw: HardwareConfig | None = None) -> str:
    """The tensor-core rate the GEMMs run at, which keys the fitted factors: fp8 for 8-bit
    weights, fp4 for NVFP4 on a GPU with FP4 tensor cores; bf16 otherwise, weight-only 4-bit
    weights included (INT4, or FP4 on a GPU without FP4 tensor cores, e.g. MXFP4 on Hopper:
    the engines dequantize them and multiply in bfloat16)."""
    if llm.dtype == "fp4" and hw is not None and hw.fp4_tflops is None:
        return "bf16"
    return {"fp8": "fp8", "int8": "fp8", "fp4": "fp4"}.get(llm.dtype, "bf16")


@cache
def load_factors(path: str = str(FACTORS_PATH)) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def lookup(table: dict[str, Any], family: str, dtype: str) -> tuple[dict[str, float], str]:
    """The factors for (family, dtype) and where they came from."""
    groups = table["groups"]
    key = f"{family}/{dtype}"
    if key in groups:
        return groups[key]["factors"], key
    same_family = [k for k in groups if k.startswith(f"{family}/")]
    if same_family:
        k = sorted(same_family)[0]
        return groups[k]["factors"], f"{k} (no {key} in the table)"
    mean = {
        f: sum(_factor(g["factors"], f) for g in groups.values()) / len(groups)
        for f in ALL_FACTOR_KEYS
    }
    return mean, f"mean of {sorted(groups)} (no {family} entries in the table)"


def _factor(factors: dict[str, float], key: str) -> float:
    return factors[key] if key in factors else OPTIONAL_FACTORS[key]


def calibrated_factors(
    llm: LlmConfig, hw: HardwareConfig, path: str | None = None
) -> tuple[dict[str, float], str]:
    """The fitted factors for this model's weight dtype on this GPU family, and their source."""
    return lookup(load_factors(path or str(FACTORS_PATH)), family_of(hw), weight_class(llm, hw))


class CalibratedRoofline:
    def __init__(
        self,
        llm: LlmConfig,
        hw: HardwareConfig,
        tp_size: int,
        factors: dict[str, float] | None = None,
        path: str | None = None,
        decode_tokens_per_seq: int = 1,
        dp_size: int = 1,
    ) -> None:
        self.tp = tp_size
        # attention-DP ranks of the worker: a rank prices its own part of the pass
        self.dp = dp_size
        # tokens a decode step computes per sequence: 1, or k + 1 verifying k drafts
        self.decode_tokens_per_seq = decode_tokens_per_seq
        self.family = family_of(hw)
        self.dtype = weight_class(llm, hw)
        if factors is None:
            factors, self.source = lookup(
                load_factors(path or str(FACTORS_PATH)), self.family, self.dtype
            )
        else:
            self.source = "given"
        peak = {"fp4": hw.fp4_tflops, "fp8": hw.fp8_tflops, "bf16": hw.bf16_tflops}[self.dtype]
        assert peak is not None  # (fp4 only on a GPU with an fp4 rate: `weight_class`)
        self.peak_tflops: float = peak
        self.llm, self.hw = llm, hw
        self.weight_bytes = rank_weight_bytes(llm, dp_size)
        self.gemm_flops_per_token = 2.0 * (active_params(llm) - llm.vocab_size * llm.hidden_size)
        self.attn_flops_per_pair = attn_flops_per_pair(llm)
        self.attn_flops_per_pair_decode = attn_flops_per_pair(llm, decode=True)
        self.kv_bytes_read_per_token = kv_bytes_read_per_token(llm, tp_size)
        # a sequence's linear-attention state, read and written back by every pass it is in
        self.state_bytes_per_seq = 2 * linear_state_bytes(llm)
        self.set_factors(factors)

    def set_factors(self, factors: dict[str, float]) -> None:
        """Use these factors from now on (the fit calls this for every trial)."""
        f = self.f = dict(factors)
        llm, hw, tp = self.llm, self.hw, self.tp
        assert self.peak_tflops is not None
        self.gemm_flops_per_ms = tp * self.peak_tflops * 1e12 * f["e_c"] / 1e3
        self.attn_flops_per_ms = tp * hw.bf16_tflops * 1e12 * f["e_a"] / 1e3
        self.decode_attn_flops_per_ms = tp * hw.bf16_tflops * 1e12 * f["e_c"] / 1e3
        self.bytes_per_ms = tp * hw.hbm_bandwidth_tbps * 1e12 * f["e_m"] / 1e3
        if tp > 1:
            ring = 2 * (tp - 1) / tp * llm.hidden_size * DTYPE_BYTES["bfloat16"]
            self.comm_fixed_ms = 2 * llm.num_layers * f["a_ar"]
            # e_ar: the rated NVLink rate is a peak; a TP all-reduce, which sits between the
            # GEMMs and does not overlap them, achieves a fraction of it
            nvlink_bytes_per_ms = hw.nvlink_gbps * 1e9 / 1e3 * _factor(f, "e_ar")
            self.comm_ms_per_token = 2 * llm.num_layers * ring / nvlink_bytes_per_ms
        else:
            self.comm_fixed_ms = self.comm_ms_per_token = 0.0
        # the fixed cost of a pass's MoE layers (routing, permutation, grouped expert kernels)
        self.moe_fixed_ms = _factor(f, MOE_FACTOR) * moe_layers(llm)
        a2a = all_to_all_bytes_per_token(llm, tp, self.dp)
        if a2a:  # experts shared by the worker's DP ranks: dispatch and combine per layer
            nvlink_bytes_per_ms = hw.nvlink_gbps * 1e9 / 1e3 * _factor(f, "e_ar")
            self.comm_fixed_ms += 2 * llm.num_layers * f["a_ar"]
            self.comm_ms_per_token += a2a / (tp * nvlink_bytes_per_ms)

    def _gemm_ms(self, tokens: float) -> float:
        weights = (
            self.weight_bytes
            if self.llm.num_experts is None
            else weight_bytes_read(self.llm, tokens, self.dp)
        )
        return max(
            self.gemm_flops_per_token * tokens / self.gemm_flops_per_ms,
            weights / self.bytes_per_ms,
        )

    def _comm_ms(self, tokens: float) -> float:
        return self.comm_fixed_ms + self.comm_ms_per_token * tokens

    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float:
        t = new_tokens(n, mean_isl, mean_prefix)
        if t <= 0:
            return 0.0
        attn = self._attention_ms(n, mean_isl, mean_prefix, t, 0, 0)
        fixed = self.f["o_p"] + self.moe_fixed_ms
        return _finite(self._gemm_ms(t) + attn + self._comm_ms(t) + fixed, "prefill")

    def _attention_ms(
        self, n: int, mean_isl: int, mean_prefix: int, t: int, batch: int, mean_context: int
    ) -> float:
        """Attention of a pass: the prefill part's flops (n sequences, t new tokens) and
        reading the KV of its sequences; the decode part (`batch` sequences of `mean_context`
        tokens) as the larger of its flops and its KV read."""
        llm = self.llm
        attn = 0.0
        if t:
            context = mean_prefix + t / n / 2
            attn = self.attn_flops_per_pair * t * context / self.attn_flops_per_ms
            attn += window_attention_flops(llm, t, context, False) / self.attn_flops_per_ms
            attn += self.kv_bytes_read_per_token * n * mean_isl / self.bytes_per_ms
        if batch:
            # a decode attention kernel is bound by its KV read or by its flops, which run as
            # batched GEMMs (MLA's absorbed form: over the latent) at the GEMM efficiency
            pairs = batch * mean_context
            attn += max(
                self.attn_flops_per_pair_decode * pairs / self.decode_attn_flops_per_ms,
                self.kv_bytes_read_per_token * pairs / self.bytes_per_ms,
            )
        attn += self.state_bytes_per_seq * (n + batch) / self.bytes_per_ms
        if llm.sliding_window is not None:
            window = window_kv_bytes(llm, mean_isl) * n + window_kv_bytes(llm, mean_context) * batch
            attn += window / self.bytes_per_ms
        return attn

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float:
        if batch <= 0:
            return 0.0
        tokens = batch * self.decode_tokens_per_seq
        attn = self._attention_ms(0, 0, 0, 0, batch, mean_context)
        fixed = self.f["o_d"] * self.llm.num_layers + _factor(self.f, "o_seq") * batch
        fixed += self.moe_fixed_ms
        return _finite(self._gemm_ms(tokens) + attn + self._comm_ms(tokens) + fixed, "decode")

    def mixed_ms(
        self, n: int, mean_isl: int, mean_prefix: int, batch: int, mean_context: int
    ) -> float:
        """A pass with both parts, priced as one: its GEMMs run once over the prefill tokens
        and the decode batch (the weights are read once), the attention and all-reduce terms
        of both, and the prefill part's fixed cost plus the per-sequence cost."""
        t = new_tokens(n, mean_isl, mean_prefix)
        tokens = t + batch * self.decode_tokens_per_seq
        attn = self._attention_ms(n, mean_isl, mean_prefix, t, batch, mean_context)
        fixed = self.f["o_p"] + _factor(self.f, "o_seq") * batch + self.moe_fixed_ms
        return _finite(self._gemm_ms(tokens) + attn + self._comm_ms(tokens) + fixed, "mixed")


def _finite(ms: float, part: str) -> float:
    if not math.isfinite(ms) or ms < 0:
        raise ValueError(f"calibrated roofline priced a {part} part at {ms} ms")
    return ms
