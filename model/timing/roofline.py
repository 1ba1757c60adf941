"""Roofline step time from servesim geometry x GPU: prefill compute-bound, decode memory-bound.

Each part of a pass costs the larger of its compute time and its memory time, plus a fixed
overhead, across `tp_size` GPUs (formula and factors in docs/timing.md). With the pass summary
of the mocker (n sequences, integer means of prompt-so-far `isl` and cached/computed `prefix`,
T = n (isl - prefix) new tokens, chunk c = T / n):

    prefill flops = 2 P_gemm T + 4 L H d T (prefix + c / 2)       (GEMMs + causal attention)
    prefill bytes = W + kv x n x isl
    decode flops  = n (2 P_gemm + 4 L H d ctx)                     (ctx = mean sequence length)
    decode bytes  = W + kv x n x ctx       (kv: KV bytes the TP group reads per token)
    t_comp = flops / (tp x peak x compute_efficiency),  t_mem = bytes / (tp x HBM B/s x
    memory_efficiency),  t_comm = 2 L (tp - 1)/tp x tokens x hidden x 2 B / NVLink B/s
    t = max(t_comp, t_mem) + t_comm + overhead

With attention data parallelism (dp ranks per worker, each `tp` GPUs) a rank prices its own
part: its attention and KV, its copy of the dense weights, 1/dp of the experts that the tokens
of all ranks touch, and each token's expert all-to-all (servesim.config.derived).

In the attention terms L counts the full-attention layers; sliding-window layers add the same
terms over at most their window, linear-attention layers none but their state (read and written
back once per sequence and pass: 2 x `linear_state_bytes` bytes); an MLA model decodes with
2 H (2 r + rope) in place of 4 H d (servesim.config.derived, docs/timing.md).

With speculative decoding (k drafts) a decode step verifies k + 1 tokens per sequence: the
GEMMs, the attention flops and the all-reduce are those of n (k + 1) tokens, each attending
over the sequence, while the weights and each sequence's KV are still read once.

P_gemm excludes the embedding table (a lookup, not a GEMM); the LM head is counted. For a
mixture of experts P_gemm counts the active parameters and W the dense part plus the experts
the pass's tokens touch in expectation (`weight_bytes_read`). The peak is
the dense BF16 rate for 16-bit models, FP8 for 8-bit (fp8, int8) and half the BF16 rate (TF32)
for float32.
"""

from __future__ import annotations

from servesim.config.derived import (
    DTYPE_BYTES,
    active_params,
    all_to_all_bytes_per_token,
    attn_flops_per_pair,
    kv_bytes_read_per_token,
    linear_state_bytes,
    weight_bytes_read,
    window_attention_flops,
    window_kv_bytes,
)
from servesim.config.schema import HardwareConfig, LlmConfig, RooflineTiming
from servesim.timing.base import new_tokens


class Roofline:
    def __init__(
        self,
        cfg: RooflineTiming,
        llm: LlmConfig,
        hw: HardwareConfig,
        tp_size: int,
        decode_tokens_per_seq: int = 1,
        dp_size: int = 1,
    ) -> None:
        self.cfg = cfg
        self.tp = tp_size
        # attention-DP ranks of the worker: a rank prices its own part of the pass
        self.dp = dp_size
        # tokens a decode step computes per sequence: 1, or k + 1 verifying k drafts
        self.decode_tokens_per_seq = decode_tokens_per_seq
        if llm.dtype in ("fp8", "int8"):
            peak_tflops = hw.fp8_tflops
        elif llm.dtype == "float32":
            peak_tflops = hw.bf16_tflops / 2  # TF32 tensor cores
        else:
            peak_tflops = hw.bf16_tflops
        self.flops_per_ms = tp_size * peak_tflops * 1e12 * cfg.compute_efficiency / 1e3
        self.bytes_per_ms = tp_size * hw.hbm_bandwidth_tbps * 1e12 * cfg.memory_efficiency / 1e3
        self.llm = llm
        gemm_params = active_params(llm) - llm.vocab_size * llm.hidden_size
        self.gemm_flops_per_token = 2.0 * gemm_params
        # 2 matmuls (QK^T, PV) x 2 flops per MAC, over every layer's query heads
        self.attn_flops_per_pair = attn_flops_per_pair(llm)
        self.attn_flops_per_pair_decode = attn_flops_per_pair(llm, decode=True)
        self.kv_bytes_read_per_token = kv_bytes_read_per_token(llm, tp_size)
        act_bytes = DTYPE_BYTES["bfloat16"]
        if tp_size > 1:
            per_token = 2 * llm.num_layers * (tp_size - 1) / tp_size * llm.hidden_size * act_bytes
            self.comm_ms_per_token = per_token / (hw.nvlink_gbps * 1e9 / 1e3)
        else:
            self.comm_ms_per_token = 0.0
        # experts shared by the worker's DP ranks: each token's all-to-all, over the rank's GPUs
        a2a = all_to_all_bytes_per_token(llm, tp_size, dp_size)
        self.comm_ms_per_token += a2a / (tp_size * hw.nvlink_gbps * 1e9 / 1e3)

    def _part_ms(self, flops: float, bytes_: float, tokens: int, overhead_ms: float) -> float:
        t = max(flops / self.flops_per_ms, bytes_ / self.bytes_per_ms)
        return t + self.comm_ms_per_token * tokens + overhead_ms

    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float:
        t = new_tokens(n, mean_isl, mean_prefix)
        if t <= 0:
            return 0.0
        chunk = t / n
        llm = self.llm
        context = mean_prefix + chunk / 2
        flops = self.gemm_flops_per_token * t + self.attn_flops_per_pair * t * context
        flops += window_attention_flops(llm, t, context, decode=False)
        bytes_ = weight_bytes_read(llm, t, self.dp) + self.kv_bytes_read_per_token * n * mean_isl
        bytes_ += (window_kv_bytes(llm, mean_isl) + 2 * linear_state_bytes(llm)) * n
        return self._part_ms(flops, bytes_, t, self.cfg.prefill_overhead_ms)

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float:
        if batch <= 0:
            return 0.0
        tokens = batch * self.decode_tokens_per_seq
        llm = self.llm
        per_token = self.gemm_flops_per_token + self.attn_flops_per_pair_decode * mean_context
        flops = tokens * per_token + window_attention_flops(llm, tokens, mean_context, decode=True)
        bytes_ = (
            weight_bytes_read(llm, tokens, self.dp)
            + self.kv_bytes_read_per_token * batch * mean_context
        )
        bytes_ += (window_kv_bytes(llm, mean_context) + 2 * linear_state_bytes(llm)) * batch
        return self._part_ms(flops, bytes_, tokens, self.cfg.decode_overhead_ms)
