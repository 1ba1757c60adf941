"""The published deployments behind measured P/D rows that lost their worker counts.

The InferenceX DeepSeek-R1 rows of the silicon CSV keep each role's TP and EP but not its
workers, attention DP or speculative decoding. `experiments/data/inferencex_deployments.csv`
(written by `experiments/inferencex_deployments.py` from the public InferenceX configs, never
from the measurements) names, per row id, the configuration that ran where exactly one fits.
This reads it for `accuracy_points`:

* workers, TP and attention DP per role: a role with `dp_attn` runs `tp` attention-DP ranks of
  one GPU each (DEP), else one TP group of `tp` GPUs (TEP/TP); expert parallelism is priced as
  TP, as for every row;
* speculative decoding (`spec_decoding` mtp) on the decode role: the drafts per step from the
  TensorRT-LLM recipe's name (`..._mtp3_...`: 3); SGLang's recipes do not name it, so
  SGLANG_MTP_DRAFTS; the acceptance rates are servesim's default (the mocker's).

Not taken: the batch a TensorRT-LLM recipe names (`_batch8_`). As a cap on each decode rank's
requests it contradicts the measurements: `ctx1_gen5_tep8_batch8` measured at 100 clients
(40 decode slots) gives TTFT 3.1 s and TPOT 9.8 ms, where 60 clients waiting for a slot would
add seconds to one or the other.

Ambiguous rows (an MTP and a non-MTP run of the same shape measured side by side, or several
worker layouts at one concurrency) are not in it as deployments: the harness rate-matches them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pandas as pd

TABLE = Path(__file__).resolve().parent / "data" / "inferencex_deployments.csv"
# drafts per step of an SGLang MTP deployment, whose recipe names do not say: the one recipe
# read (srt-slurm recipes/b200-fp8/1k1k/mtp/max-tpt-dep8-1p2d.yaml) runs EAGLE with one step
SGLANG_MTP_DRAFTS = 1


@dataclass(frozen=True)
class Role:
    workers: int
    tp: int  # GPUs per attention rank
    dp: int  # attention-DP ranks per worker


@dataclass(frozen=True)
class Deployment:
    prefill: Role
    decode: Role
    drafts: int | None  # speculative tokens per decode step; None: no speculative decoding
    source: str  # what it comes from, for the result's note


def _role(row: pd.Series, role: str) -> Role:
    gpus = int(row[f"{role}_tp"])
    dp_attn = str(row[f"{role}_dp_attn"]).lower() == "true"
    return Role(
        workers=int(row[f"{role}_num_workers"]),
        tp=1 if dp_attn else gpus,
        dp=gpus if dp_attn else 1,
    )


def _deployment(row: pd.Series) -> Deployment:
    recipe = str(row["recipe"])
    trtllm = "-trt" in str(row["config_key"])
    drafts = None
    if row["spec_decoding"] == "mtp":
        m = re.search(r"_mtp(\d+)", recipe)
        drafts = (int(m.group(1)) if m else None) if trtllm else SGLANG_MTP_DRAFTS
    return Deployment(
        prefill=_role(row, "prefill"),
        decode=_role(row, "decode"),
        drafts=drafts or None,
        source=f"InferenceX {row['config_key']} @ {row['commit']} ({recipe})",
    )


@cache
def published(path: str = str(TABLE)) -> dict[str, Deployment]:
    """Row id -> its deployment, for the rows one published configuration fits."""
    df = pd.read_csv(path, dtype={"id": str, "commit": str})
    return {str(r["id"]): _deployment(r) for _, r in df[df["match"] == "unique"].iterrows()}
