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

    python experiments/rate_match.py --silicon ../shared/data/silicon_dev.csv

compares the rule with the P/D rows that do give both counts (one line per row, then how
often the counts agree).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/ is not a package

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


def compare_counted(silicon: str, timing: str = "calibrated_roofline") -> pd.DataFrame:
    """For every P/D row of a silicon CSV that gives both worker counts: the counts it gives
    and the ones rate matching picks for it (how well the rule stands in for missing counts)."""
    from accuracy_points import plan, read_silicon, select, size_pools

    points, _ = plan(select(read_silicon(silicon), None, "disagg"))
    rows = []
    for p in points:
        if p.prefill is None or p.decode is None or None in (p.prefill.workers, p.decode.workers):
            continue
        unsized = replace(
            p, prefill=replace(p.prefill, workers=None), decode=replace(p.decode, workers=None)
        )
        sized = size_pools(unsized, timing)
        assert sized.prefill is not None and sized.decode is not None
        rows.append(
            {
                "id": p.id,
                "clients": p.concurrency,
                "prefill_given": p.prefill.workers,
                "prefill_matched": sized.prefill.workers,
                "decode_given": p.decode.workers,
                "decode_matched": sized.decode.workers,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rate matching against the P/D rows that give counts")
    ap.add_argument("--silicon", required=True)
    ap.add_argument("--timing", default="calibrated_roofline")
    args = ap.parse_args(argv)
    df = compare_counted(args.silicon, args.timing)
    if df.empty:
        print(f"rate_match: no P/D row of {args.silicon} gives both worker counts", file=sys.stderr)
        return 2
    p_off = (df.prefill_matched - df.prefill_given).abs()
    d_off = df.decode_matched - df.decode_given
    print(df.to_string(index=False))
    print(
        f"prefill workers: as given on {(p_off == 0).sum()}, within one on {(p_off <= 1).sum()}; "
        f"decode workers: as given on {(d_off == 0).sum()}, fewer on {(d_off < 0).sum()}; "
        f"of {len(df)} rows"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
