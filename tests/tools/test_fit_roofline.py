"""experiments/fit_roofline.py: its closed-loop estimate and its KV-bound screen."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests_support import CALIBRATED_FACTORS

REPO = Path(__file__).resolve().parents[2]
F = CALIBRATED_FACTORS


def _fit():
    sys.path.insert(0, str(REPO / "experiments"))
    spec = importlib.util.spec_from_file_location(
        "fit_roofline", REPO / "experiments" / "fit_roofline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(**kw):
    base = {
        "model_path": "meta-llama/Llama-3.1-70B",
        "system": "b200_sxm",
        "precision": "fp8",
        "tp_size": 1,
        "batch_size": 64,
        "isl": 1024,
        "osl": 8192,
    }
    return SimpleNamespace(**{**base, **kw})


def test_estimate_is_the_documented_closed_loop():
    fit = _fit()
    llm, hw = fit.model_for(row())
    from servesim.timing.calibrated import CalibratedRoofline

    m = CalibratedRoofline(llm, hw, 1, factors=F)
    ttft, tpot = fit.estimate(m, 16, 1000, 500)
    i, o = 900, 450.0
    ctx = round(i + o / 2)
    rate = 16 / o
    mean_pass = (1 - rate) * m.decode_ms(16, 0, 0, ctx) + rate * m.mixed_ms(1, i, 0, 15, ctx)
    first = (math.ceil(16 * i / 8192) + 1) / 2 * m.prefill_ms(9, 900, 0)
    steady = mean_pass / 2 + m.mixed_ms(1, i, 0, 15, ctx)
    assert tpot == pytest.approx(mean_pass)
    assert ttft == pytest.approx(0.9 * steady + 0.1 * first + 30.0)


def test_kv_bound_uses_the_systems_kv_dtype():
    """Batch 64 at 1024x8192 needs 64 x 9,216 tokens of KV: on a B200 pair in fp8 (163,840
    B/token, 97 GB) it fits the 249 GB left beside the weights; on an H100 pair in bf16
    (327,680 B/token, 193 GB) it does not fit the 69 GB left; a lone B200 (89 GB left) is
    just short."""
    fit = _fit()
    assert not fit.kv_bound(row(tp_size=2))
    assert fit.kv_bound(row(system="h100_sxm", tp_size=2))
    assert fit.kv_bound(row())


def test_o_moe_is_the_median_gap_per_moe_layer_at_few_clients(tmp_path):
    """Three DeepSeek-V3 rows at 1-4 clients whose measured TPOT is the estimate plus 10, 20
    and 60 us per MoE layer (58 of its 61 layers) give o_moe = 20 us in their group; a row at
    64 clients, an attention-DP row and a dense model's row are not used."""
    import pandas as pd

    from servesim.timing.calibrated import CalibratedRoofline

    fit = _fit()
    table = {"groups": {"blackwell/fp8": {"factors": dict(F)}}}
    header = (REPO / "tests" / "data" / "accuracy" / "silicon_tiny.csv").read_text().split("\n")[0]
    columns = header.split(",")

    def silicon(rid, model, batch, dp, gap_ms_per_layer, layers):
        row = dict.fromkeys(columns, "")
        row.update(
            id=rid, backend="vllm", model_path=model, system="b200_sxm", precision="fp8",
            mode="agg", isl=1024, osl=1024, batch_size=batch, tp_size=8, pp_size=1,
            attention_dp_size=dp, silicon_ttft_ms=100.0, silicon_tpot_ms=1.0,
        )  # fmt: skip
        point = fit.map_row(pd.Series(row))
        cfg = fit.compose_point_config(point, "calibrated_roofline")
        m = CalibratedRoofline(cfg.llm, cfg.hardware, 8, factors={**F, "o_moe": 0.0})
        _, tpot = fit.estimate(m, batch, 1024, 1024)
        row["silicon_tpot_ms"] = tpot + gap_ms_per_layer * layers
        return row

    rows = [
        silicon("a", "deepseek-ai/DeepSeek-V3", 1, 1, 0.010, 58),
        silicon("b", "deepseek-ai/DeepSeek-V3", 2, 1, 0.020, 58),
        silicon("c", "deepseek-ai/DeepSeek-V3", 4, 1, 0.060, 58),
        silicon("many clients", "deepseek-ai/DeepSeek-V3", 64, 1, 1.0, 58),
        silicon("attention dp", "deepseek-ai/DeepSeek-V3", 4, 2, 1.0, 58),
        silicon("dense", "meta-llama/Llama-3.1-70B", 1, 1, 1.0, 80),
    ]
    csv = tmp_path / "moe.csv"
    pd.DataFrame(rows, columns=columns).to_csv(csv, index=False)
    gaps = fit.fit_moe(csv, table)
    assert sorted(gaps) == ["blackwell/fp8"]
    assert sorted(gaps["blackwell/fp8"]) == pytest.approx([0.010, 0.020, 0.060])
    assert table["groups"]["blackwell/fp8"]["factors"]["o_moe"] == pytest.approx(0.020)
    assert table["groups"]["blackwell/fp8"]["moe_rows"] == 3
