"""experiments/published_deployments.py: the published P/D deployments of rows that lost their
worker counts, and how the accuracy harness runs them."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))

import published_deployments as pub  # noqa: E402
from test_accuracy import accuracy  # noqa: E402  (the harness, loaded once)

COLUMNS = (
    "id,measured,commit,commit_when,n_candidates,match,config_key,recipe,spec_decoding,"
    "prefill_num_workers,prefill_tp,prefill_ep,prefill_dp_attn,"
    "decode_num_workers,decode_tp,decode_ep,decode_dp_attn"
)
ROWS = [
    "trt,t,abc,at_or_before,1,unique,dsr1-fp8-b200-dynamo-trt,"
    "ctx2_gen5_dep8_batch16_eplb0_mtp3.yaml,mtp,2,8,8,True,5,8,8,True",
    "sgl,t,abc,at_or_before,1,unique,dsr1-fp4-b200-dynamo-sglang-mtp,"
    "low-latency-tp4-1p-tp8-1d.yaml,mtp,1,4,4,False,1,8,8,False",
    "stp,t,abc,at_or_before,1,unique,dsr1-fp8-b200-dynamo-trt,"
    "ctx1_gen3_tep8_batch32_eplb0_mtp0.yaml,none,1,8,8,True,3,8,8,False",
    "two,t,abc,at_or_before,2,ambiguous,,,,,,,,,,,",
]


def test_unique_rows_give_roles_and_drafts(tmp_path: Path) -> None:
    """A DEP role runs tp attention-DP ranks of one GPU, a TEP role one TP group; MTP drafts
    come from a TensorRT-LLM recipe's name (mtp0: none), an SGLang MTP run takes
    SGLANG_MTP_DRAFTS; an ambiguous row has no deployment."""
    table = tmp_path / "t.csv"
    table.write_text("\n".join([COLUMNS, *ROWS]) + "\n")
    d = pub.published(str(table))
    assert sorted(d) == ["sgl", "stp", "trt"]
    trt = d["trt"]
    assert (trt.prefill, trt.decode) == (pub.Role(2, 1, 8), pub.Role(5, 1, 8))
    assert trt.drafts == 3
    assert trt.source == (
        "InferenceX dsr1-fp8-b200-dynamo-trt @ abc (ctx2_gen5_dep8_batch16_eplb0_mtp3.yaml)"
    )
    sgl = d["sgl"]
    assert (sgl.prefill, sgl.decode) == (pub.Role(1, 4, 1), pub.Role(1, 8, 1))
    assert sgl.drafts == pub.SGLANG_MTP_DRAFTS
    assert (d["stp"].drafts, d["stp"].decode) == (None, pub.Role(3, 8, 1))


def test_a_published_row_runs_its_deployment() -> None:
    """A silicon row whose id the shipped table names runs that deployment (not rate matching):
    its pools and the decode role's drafts, said in the result's note; the decode batch limit
    stays the harness's (the recipe's `batch128` is not taken)."""
    rid = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c896_tp8_ep8_1467"
    header = (REPO / "tests" / "data" / "accuracy" / "silicon_tiny.csv").read_text()
    row = dict.fromkeys(header.split("\n")[0].split(","), None)
    row.update(
        id=rid, silicon_data_source="silicon_concurrency=896", backend="trtllm",
        model_path="deepseek-ai/DeepSeek-R1", system="b200_sxm", precision="fp8", mode="disagg",
        isl=1024, osl=1024, prefill_tp_size=8, prefill_moe_ep_size=8, decode_tp_size=8,
        decode_moe_ep_size=8, silicon_ttft_ms=1000.0, silicon_tpot_ms=10.0,
    )  # fmt: skip
    point = accuracy.map_row(pd.Series(row))
    assert (point.prefill, point.decode) == (accuracy.Pool(1, 1, 8), accuracy.Pool(7, 1, 8))
    assert (point.decode_drafts, point.batch_size) == (3, 16)
    assert point.assumption.startswith("not in the row, published: InferenceX dsr1-fp8-b200")
    assert accuracy.size_pools(point) is point
    cfg = accuracy.compose_point_config(point, "calibrated_roofline")
    decode = cfg.topology.decode
    assert (decode.speculative.num_speculative_tokens, decode.max_num_seqs) == (3, None)
    assert cfg.engine.max_num_seqs == 256
    assert (cfg.topology.num_prefill_workers, cfg.topology.num_decode_workers) == (1, 7)
    assert cfg.topology.prefill.speculative is None
