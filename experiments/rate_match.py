"""A P/D deployment sized by rate matching: enough decode workers to hold the clients' KV, and
enough prefill workers to prefill requests as fast as the decode pool completes them.

For a closed loop of C clients sending requests of `isl` input and `osl` output tokens to a
disaggregated config (its roles' engines, timing model and KV pools as servesim derives them):

    decode workers   n_d = ceil(C / (dp_d x min(max_num_seqs, KV tokens per rank // (isl + osl))))
    completion rate  lambda = C / (osl x t_decode(ceil(C / (n_d dp_d)), context isl + osl / 2))
    prefill rate     mu = dp_p x k isl / t_prefill(k, isl),  k = max(1, token budget // isl)
    prefill workers  n_p = ceil(lambda x isl / (0.9 mu))

0.9 is the prefill degradation factor of AIConfigurator's rate matching
(`_RATE_MATCHING_PREFILL_DEGRADATION_FACTOR`): a prefill pool run at 90 % of its throughput.
experiments/accuracy.py uses it for measured P/D rows that do not say their worker counts.
"""

from __future__ import annotations

import math

from servesim import RunConfig
from servesim.config.derived import num_gpu_blocks, role_engine
from servesim.timing import build_step_time

PREFILL_UTILISATION = 0.9  # AIConfigurator's prefill rate-matching degradation factor


def rate_matched_workers(cfg: RunConfig, concurrency: int, isl: int, osl: int) -> tuple[int, int]:
    """(prefill workers, decode workers) for `concurrency` clients on a disagg `cfg`."""
    if cfg.topology.kind != "disagg":
        raise ValueError("rate matching sizes a disaggregated topology (topology=disagg)")
    if min(concurrency, isl, osl) <= 0:
        raise ValueError(f"concurrency, isl and osl must be positive: {concurrency}, {isl}, {osl}")
    decode = role_engine(cfg, "decode")
    kv_tokens_per_rank = num_gpu_blocks(cfg, decode, "decode") * decode.block_size
    seqs_per_rank = min(decode.max_num_seqs, kv_tokens_per_rank // (isl + osl))
    n_decode = max(1, math.ceil(concurrency / (decode.dp_size * max(1, seqs_per_rank))))
    batch = math.ceil(concurrency / (n_decode * decode.dp_size))
    context = isl + osl // 2
    step_ms = build_step_time(cfg, decode).decode_ms(
        batch, batch * context, kv_tokens_per_rank, context
    )
    requests_per_ms = concurrency / (osl * step_ms)

    prefill = role_engine(cfg, "prefill")
    per_pass = max(1, prefill.max_num_batched_tokens // isl)
    pass_ms = build_step_time(cfg, prefill).prefill_ms(per_pass, isl, 0)
    tokens_per_ms = prefill.dp_size * per_pass * isl / pass_ms
    n_prefill = max(1, math.ceil(requests_per_ms * isl / (PREFILL_UTILISATION * tokens_per_ms)))
    return n_prefill, n_decode
