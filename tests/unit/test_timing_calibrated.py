"""The calibrated roofline: its op-class terms in closed form, the factor table lookup and its
fallbacks, the frontend latency, and its errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tests_support import CALIBRATED_FACTORS, H100_CFG, LLAMA8B_CFG

from servesim import simulate
from servesim.config.errors import ConfigError
from servesim.config.schema import HardwareConfig
from servesim.timing.calibrated import CalibratedRoofline, calibrated_factors, family_of, lookup

REPO = Path(__file__).resolve().parents[2]
F = CALIBRATED_FACTORS


def test_decode_is_weights_plus_kv_plus_overheads_on_one_gpu():
    """Llama-3.1-8B bf16 on one H100, batch 4 at context 1000: memory-bound GEMMs (16.06 GB at
    0.8 x 3.35 TB/s), the attention bound by its KV read (131,072 B x 4,000 tokens; its flops,
    4 L H d per pair at 0.5 x 989 TFLOP/s, take less), o_d x 32 layers + 4 o_seq, no
    all-reduce."""
    m = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 1, factors=F)
    bw_per_ms = 3.35e12 * 0.8 / 1e3
    weights = 8.03e9 * 2 / bw_per_ms
    attn = 4 * 32 * 32 * 128 * 4 * 1000 / (989e12 * 0.5 / 1e3)
    kv = 131_072 * 4 * 1000 / bw_per_ms
    assert attn < kv
    assert m.decode_ms(4, 0, 0, 1000) == pytest.approx(weights + kv + 2.0 + 0.04)


def test_mla_decode_reads_the_whole_latent_on_every_gpu():
    """DeepSeek-V3 at TP 8, batch 4 at context 1,000: each GPU holds and reads every token's
    576-wide latent in all 61 layers (not an eighth of it), and computes its 16 of the 128
    heads in the compressed form (2 H (2 x 512 + 64) flops per pair and layer, at the GEMM
    efficiency): the read bounds the attention. On one GPU, with 64 sequences at 8,000 tokens,
    the flops do."""
    import yaml

    from servesim.config.derived import kv_bytes_read_per_token, weight_bytes_read
    from servesim.config.schema import LlmConfig

    llm = LlmConfig(**yaml.safe_load((REPO / "conf" / "llm" / "deepseek_v3.yaml").read_text()))
    assert kv_bytes_read_per_token(llm, 8) == 8 * 61 * 576 * 2
    f = {**F, "o_seq": 0.0}
    m = CalibratedRoofline(llm, H100_CFG, 8, factors=f)
    bw_per_ms = 8 * 3.35e12 * 0.8 / 1e3
    gemm_flops = 2 * (37e9 - 129280 * 7168) * 4 / (8 * 989e12 * 0.5 / 1e3)
    gemm = max(gemm_flops, weight_bytes_read(llm, 4) / bw_per_ms)
    attn = 61 * 2 * 128 * (2 * 512 + 64) * 4 * 1000 / (8 * 989e12 * 0.5 / 1e3)
    kv = 8 * 61 * 576 * 2 * 4 * 1000 / bw_per_ms  # = 61 x 576 x 2 B x 4,000 per GPU
    comm = 2 * 61 * (0.02 + 2 * 7 / 8 * 7168 * 2 * 4 / 900e6)
    expected = gemm + max(attn, kv) + comm + 0.0625 * 61
    assert attn < kv and m.decode_ms(4, 0, 0, 1000) == pytest.approx(expected)
    one = CalibratedRoofline(llm, H100_CFG, 1, factors=f)
    pairs = 64 * 8000
    attn = 61 * 2 * 128 * (2 * 512 + 64) * pairs / (989e12 * 0.5 / 1e3)
    kv = 61 * 576 * 2 * pairs / (3.35e12 * 0.8 / 1e3)
    no_attention = one.decode_ms(64, 0, 0, 0)
    assert attn > kv and one.decode_ms(64, 0, 0, 8000) - no_attention == pytest.approx(attn)


def test_prefill_is_compute_bound_gemm_plus_attention_and_tp_all_reduce():
    """8,192 new tokens at TP 2: GEMM flops at 0.5 x 2 x 989 TFLOP/s, causal attention at
    0.25 x, 2 L all-reduces of a_ar plus their ring bytes over NVLink, and o_p."""
    m = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 2, factors=F)
    gemm_params = 8.03e9 - 128256 * 4096
    gemm = 2 * gemm_params * 8192 / (2 * 989e12 * 0.5 / 1e3)
    attn = 4 * 32 * 32 * 128 * 8192 * 4096 / (2 * 989e12 * 0.25 / 1e3)
    kv = 131_072 * 8192 / (2 * 3.35e12 * 0.8 / 1e3)
    comm = 2 * 32 * (0.02 + 2 * 0.5 * 4096 * 2 * 8192 / 900e6)
    assert m.prefill_ms(1, 8192, 0) == pytest.approx(gemm + attn + kv + comm + 4.0)
    assert m.prefill_ms(1, 100, 100) == 0.0 and m.decode_ms(0, 0, 0, 0) == 0.0


def test_all_reduce_bandwidth_efficiency_scales_the_ring_bytes_only():
    """e_ar 0.25 makes the ring bytes of the 2 L all-reduces 4x slower and leaves their fixed
    a_ar latency alone; a table without e_ar (as above) prices them at the rated NVLink speed,
    and at TP 1 there is no all-reduce to slow down."""
    slow = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 2, factors={**F, "e_ar": 0.25})
    rated = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 2, factors=F)
    ring = 2 * 32 * 2 * 0.5 * 4096 * 2 * 8192 / 900e6
    assert slow.prefill_ms(1, 8192, 0) - rated.prefill_ms(1, 8192, 0) == pytest.approx(3 * ring)
    one = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 1, factors={**F, "e_ar": 0.25})
    assert one.prefill_ms(1, 8192, 0) == CalibratedRoofline(
        LLAMA8B_CFG, H100_CFG, 1, factors=F
    ).prefill_ms(1, 8192, 0)


def test_a_mixed_pass_reads_the_weights_once():
    """2,048 new tokens and 16 decodes at context 1,000 in one pass: one GEMM over 2,064
    tokens (compute-bound here), both attention terms, o_p + 16 o_seq; cheaper than the two
    parts priced apart, which would read the weights twice."""
    m = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 1, factors=F)
    gemm = 2 * (8.03e9 - 128256 * 4096) * 2064 / (989e12 * 0.5 / 1e3)
    attn = 4 * 32 * 32 * 128 * 2048 * 1024 / (989e12 * 0.25 / 1e3)
    kv = 131_072 * (2048 + 16 * 1000) / (3.35e12 * 0.8 / 1e3)  # (decode: the read bounds it)
    assert m.mixed_ms(1, 2048, 0, 16, 1000) == pytest.approx(gemm + attn + kv + 4.0 + 0.16)
    assert m.mixed_ms(1, 2048, 0, 16, 1000) < m.prefill_ms(1, 2048, 0) + m.decode_ms(16, 0, 0, 1000)


def test_table_lookup_falls_back_and_says_so():
    table = {
        "groups": {"hopper/fp8": {"factors": F}, "blackwell/fp8": {"factors": {**F, "e_c": 0.7}}}
    }
    assert lookup(table, "hopper", "fp8") == (F, "hopper/fp8")
    f, src = lookup(table, "hopper", "bf16")
    assert f == F and "no hopper/bf16" in src
    f, src = lookup(table, "ampere", "fp8")
    assert f["e_c"] == pytest.approx(0.6) and "no ampere entries" in src
    assert f["e_ar"] == 1.0  # tables written before e_ar existed: the rated NVLink speed


def test_family_by_name_or_given():
    h200 = HardwareConfig(**{**H100_CFG.model_dump(), "name": "h200_sxm", "family": None})
    assert family_of(h200) == "hopper"
    assert (
        family_of(HardwareConfig(**{**H100_CFG.model_dump(), "name": "x", "family": "blackwell"}))
        == "blackwell"
    )


def test_4_bit_weights_without_fp4_tensor_cores_multiply_in_bf16():
    """FP4 weights on a GPU without an FP4 rate (MXFP4 on Hopper), and INT4 weights anywhere,
    are weight-only: 4.5-bit weights read from HBM, GEMMs at the bf16 rate with its factors."""
    fp4 = LLAMA8B_CFG.model_copy(update={"dtype": "fp4"})
    int4 = LLAMA8B_CFG.model_copy(update={"dtype": "int4"})
    bf16 = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 1)
    for llm in (fp4, int4):
        t = CalibratedRoofline(llm, H100_CFG.model_copy(update={"fp4_tflops": None}), 1)
        assert (t.dtype, t.peak_tflops, t.f) == ("bf16", H100_CFG.bf16_tflops, bf16.f)
        assert t.weight_bytes == bf16.weight_bytes * 0.5625 / 2


def test_shipped_table_has_the_dev_set_groups():
    f, src = calibrated_factors(LLAMA8B_CFG.model_copy(update={"dtype": "fp8"}), H100_CFG)
    assert src == "hopper/fp8" and set(F) <= set(f)
    assert all(v > 0 for v in f.values())


def test_frontend_latency_counts_in_ttft(config, trace, tmp_path):
    """A lone request with the table's o_req: TTFT grows by exactly o_req against the same
    factors without it."""
    rows = [{"timestamp": 0, "input_length": 512, "output_length": 4, "hash_ids": [1]}]
    base = {"groups": {"hopper/bf16": {"factors": {**F, "o_req": 0.0}}}}
    late = {"groups": {"hopper/bf16": {"factors": F}}}
    ttft = []
    for table in (base, late):
        path = tmp_path / f"f{len(ttft)}.json"
        path.write_text(json.dumps(table))
        cfg = config(
            workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 512},
            timing={"kind": "calibrated_roofline", "factors_path": str(path)},
        )
        ttft.append(simulate(cfg).summary["mean_ttft_ms"])
    assert ttft[1] - ttft[0] == pytest.approx(30.0)


def test_aiconfigurator_names_what_it_cannot_price(config, trace):
    """Checked before the library is imported, so the default install reports it too."""
    rows = [{"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1]}]
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing={"kind": "aiconfigurator"},
        llm={"dtype": "int8"},
    )
    with pytest.raises(ConfigError, match=r"cannot price this run: llm.dtype=int8"):
        simulate(cfg)


def test_aiconfigurator_without_the_extra_says_how_to_install(config, trace):
    if importlib.util.find_spec("aiconfigurator_core") is not None:
        pytest.skip("the aic extra is installed here")
    rows = [{"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1]}]
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing={"kind": "aiconfigurator"},
    )
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[aic\]'"):
        simulate(cfg)


def test_moe_reads_the_dense_part_and_the_experts_its_tokens_touch():
    """Qwen3-30B-A3B (128 experts, 8 per token, 30.5 B total, 3.3 B active): per expert
    (30.5 - 3.3) / 120 B; one token reads the dense part and 8 experts, many tokens all."""
    import yaml

    from servesim.config.derived import weight_bytes, weight_bytes_read
    from servesim.config.schema import LlmConfig

    llm = LlmConfig(**yaml.safe_load((REPO / "conf" / "llm" / "qwen3_30b_a3b.yaml").read_text()))
    expert = (30.5 - 3.3) / 120
    dense = 30.5 - 128 * expert
    assert weight_bytes_read(llm, 1) == pytest.approx((dense + 8 * expert) * 2e9)
    assert weight_bytes_read(llm, 10_000) == pytest.approx(weight_bytes(llm))
    m = CalibratedRoofline(llm, H100_CFG, 1, factors=F)
    dense_twin = CalibratedRoofline(
        llm.model_copy(
            update={"num_experts": None, "experts_per_token": None, "active_params_b": None}
        ),
        H100_CFG,
        1,
        factors=F,
    )
    assert m.decode_ms(1, 0, 0, 1000) < dense_twin.decode_ms(1, 0, 0, 1000) / 3


def test_each_moe_layer_adds_its_fixed_cost_to_every_pass():
    """o_moe is ms per MoE layer of a pass: DeepSeek-V3's 61 layers, the first 3 dense, add
    58 o_moe to a prefill, a decode and a mixed pass alike; a dense model adds nothing."""
    import yaml

    from servesim.config.derived import moe_layers
    from servesim.config.schema import LlmConfig

    llm = LlmConfig(**yaml.safe_load((REPO / "conf" / "llm" / "deepseek_v3.yaml").read_text()))
    assert moe_layers(llm) == 58 and moe_layers(LLAMA8B_CFG) == 0
    b200 = HardwareConfig(**yaml.safe_load((REPO / "conf" / "hardware" / "b200.yaml").read_text()))
    without = CalibratedRoofline(llm, b200, 8, factors=F)
    with_moe = CalibratedRoofline(llm, b200, 8, factors={**F, "o_moe": 0.05})
    assert with_moe.prefill_ms(2, 1000, 0) - without.prefill_ms(2, 1000, 0) == pytest.approx(2.9)
    assert with_moe.decode_ms(8, 0, 0, 900) - without.decode_ms(8, 0, 0, 900) == pytest.approx(2.9)
    assert with_moe.mixed_ms(1, 1000, 0, 7, 900) - without.mixed_ms(
        1, 1000, 0, 7, 900
    ) == pytest.approx(2.9)
    dense = CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 1, factors={**F, "o_moe": 0.05})
    assert dense.decode_ms(4, 0, 0, 1000) == pytest.approx(
        CalibratedRoofline(LLAMA8B_CFG, H100_CFG, 1, factors=F).decode_ms(4, 0, 0, 1000)
    )


def test_dense_layers_are_for_moe_models_and_leave_a_moe_layer(config):
    with pytest.raises(ConfigError, match="num_dense_layers is for a mixture-of-experts"):
        config(llm={"num_dense_layers": 2})
    moe = {"num_experts": 8, "experts_per_token": 2, "active_params_b": 2.0}
    with pytest.raises(ConfigError, match="must leave at least one MoE layer"):
        config(llm={**moe, "num_dense_layers": 32})


def test_moe_fields_come_together(config):
    with pytest.raises(
        ConfigError, match="needs num_experts, experts_per_token and active_params_b"
    ):
        config(llm={"num_experts": 8})


def test_a_request_still_in_the_frontend_at_the_stop_ends_incomplete(config, trace, tmp_path):
    """Arrived at 0, held 30 ms by the frontend, the run stopped at 10 ms: it is in flight
    (incomplete, 'in flight at max_virtual_time_ms'), not lost."""
    rows = [{"timestamp": 0, "input_length": 512, "output_length": 4, "hash_ids": [1]}]
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"groups": {"hopper/bf16": {"factors": F}}}))
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 512},
        timing={"kind": "calibrated_roofline", "factors_path": str(path)},
        stop={"max_virtual_time_ms": 10.0},
    )
    req = simulate(cfg).requests
    assert list(req.terminal_status) == ["incomplete"]
    assert list(req.reason) == ["in flight at max_virtual_time_ms"]


def test_a_missing_factors_file_is_a_config_error(config, trace, tmp_path):
    rows = [{"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1]}]
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing={"kind": "calibrated_roofline", "factors_path": str(tmp_path / "nope.json")},
    )
    with pytest.raises(ConfigError, match="timing.factors_path: cannot read"):
        simulate(cfg)


def test_an_attention_dp_rank_prices_its_share_of_the_experts_and_the_all_to_all():
    """Qwen3-30B-A3B on 2 attention-DP ranks of 1 H100: a rank's decode step of B sequences
    reads its dense part and half the experts that 2 B tokens touch, and adds the all-to-all
    (2 L a_ar + B x a2a / (NVLink e_ar)); with dp 1 it has neither."""
    import yaml

    from servesim.config.derived import (
        all_to_all_bytes_per_token,
        attn_flops_per_pair,
        kv_bytes_per_token,
        weight_bytes_read,
    )
    from servesim.config.schema import LlmConfig

    llm = LlmConfig(**yaml.safe_load((REPO / "conf" / "llm" / "qwen3_30b_a3b.yaml").read_text()))
    f = {**F, "e_ar": 0.5, "a_ar": 0.01, "o_seq": 0.0}
    one, two = (CalibratedRoofline(llm, H100_CFG, 1, factors=f, dp_size=dp) for dp in (1, 2))
    batch, ctx = 4, 1000
    bw = H100_CFG.hbm_bandwidth_tbps * 1e9 * f["e_m"]  # bytes per ms
    gemm_flops_per_ms = H100_CFG.bf16_tflops * 1e9 * f["e_c"]
    flops = 2 * (llm.active_params_b * 1e9 - llm.vocab_size * llm.hidden_size) * batch
    kv = kv_bytes_per_token(llm) * batch * ctx / bw
    attn = attn_flops_per_pair(llm, decode=True) * batch * ctx / (H100_CFG.bf16_tflops * 1e9 * 0.5)
    for model, dp in ((one, 1), (two, 2)):
        gemm = max(flops / gemm_flops_per_ms, weight_bytes_read(llm, batch, dp) / bw)
        a2a = all_to_all_bytes_per_token(llm, 1, dp) * batch
        comm = (2 * llm.num_layers * f["a_ar"] + a2a / (H100_CFG.nvlink_gbps * 1e6 * 0.5)) * (
            dp > 1
        )
        expected = gemm + max(attn, kv) + comm + f["o_d"] * llm.num_layers
        assert model.decode_ms(batch, 0, 0, ctx) == pytest.approx(expected)
    assert weight_bytes_read(llm, batch, 2) < weight_bytes_read(llm, batch, 1)


def test_each_sequence_reads_and_writes_back_its_linear_attention_state():
    """A pass of n prefills and B decodes moves 2 S (n + B) bytes of state more than the same
    model without it (S: the state of one sequence, all layers) at the HBM rate."""
    llm = LLAMA8B_CFG.model_copy(update={"num_linear_attention_layers": 24})
    stateful = llm.model_copy(update={"linear_state_elements_per_layer": 2**20})
    plain, full = (CalibratedRoofline(m, H100_CFG, 2, factors=F) for m in (llm, stateful))
    per_seq_ms = 2 * 24 * 2**20 * 4 / (2 * 3.35e12 * 0.8 / 1e3)
    assert full.decode_ms(8, 0, 0, 500) - plain.decode_ms(8, 0, 0, 500) == pytest.approx(
        8 * per_seq_ms
    )
    assert full.mixed_ms(2, 300, 0, 8, 500) - plain.mixed_ms(2, 300, 0, 8, 500) == pytest.approx(
        10 * per_seq_ms
    )
