"""The aiconfigurator step time: predictions pinned against aiconfigurator-core 0.12.0's tables,
the shape-bucketing error bound and memo, monotonicity over doublings, and the errors for what
the library does not cover. Skipped without the `aic` extra."""

from __future__ import annotations

import math
import sys

import pytest

pytest.importorskip("aiconfigurator_core")

from servesim.timing.aiconfigurator import (  # noqa: E402
    EXACT_BELOW,
    MISSING_EXTRA,
    AiconfiguratorStepTime,
    bucket,
)

LLAMA8B = "meta-llama/Llama-3.1-8B"


@pytest.fixture(scope="module")
def llama8b_h100() -> AiconfiguratorStepTime:
    return AiconfiguratorStepTime(LLAMA8B, "h100_sxm", "vllm")


@pytest.fixture(scope="module")
def llama8b_h100_exact() -> AiconfiguratorStepTime:
    return AiconfiguratorStepTime(LLAMA8B, "h100_sxm", "vllm", bucket_rel_error=0)


# (constructor kwargs, prefill_ms(1, 4096, 0), decode_ms(32, ., ., 2048)) with the default
# bucket_rel_error 0.02, as aiconfigurator-core 0.12.0 priced them on the machine that wrote
# this test
PINNED = [
    (
        dict(model_id=LLAMA8B, system="h100_sxm", backend="vllm"),
        89.29071792982843,
        9.650970720738291,
    ),
    (
        dict(model_id="meta-llama/Llama-3.1-70B", system="h200_sxm", backend="trtllm", tp_size=4),
        261.59243722135767,
        15.306470245715731,
    ),
    (
        dict(
            model_id="Qwen/Qwen3-32B",
            system="b200_sxm",
            backend="sglang",
            tp_size=2,
            gemm_quant="fp8",
            kv_cache_quant="fp8",
        ),
        92.65116049346827,
        7.629239768772306,
    ),
    (
        dict(model_id="Qwen/Qwen3-32B", system="b200_sxm", backend="vllm", gemm_quant="nvfp4"),
        89.60365152490571,
        9.426727542502098,
    ),
    (
        dict(
            model_id="Qwen/Qwen3-30B-A3B", system="h100_sxm", backend="vllm", tp_size=2, ep_size=2
        ),
        56.67487099363243,
        13.724041790489947,
    ),
]


@pytest.mark.parametrize(("kwargs", "prefill", "decode"), PINNED)
def test_pinned_predictions(kwargs, prefill, decode):
    """Known prefill (1 x 4096 new tokens) and decode (32 sequences at 2048) parts for dense
    bf16, TP 4, fp8 weights + fp8 KV, nvfp4 on Blackwell, and an MoE with EP 2."""
    st = AiconfiguratorStepTime(**kwargs)
    assert st.prefill_ms(1, 4096, 0) == pytest.approx(prefill, rel=1e-6)
    assert st.decode_ms(32, 65_536, 411_520, 2048) == pytest.approx(decode, rel=1e-6)


def test_exact_shapes_are_the_librarys_own_steps(llama8b_h100_exact):
    """With bucket_rel_error 0 the parts are AIC's context step (batch n, isl = mean_isl,
    prefix = mean_prefix) and its one decode step at s = mean_context."""
    st = llama8b_h100_exact
    eng = st._engine
    assert st.prefill_ms(1, 4096, 0) == pytest.approx(90.06585822023415, rel=1e-6)
    assert st.prefill_ms(4, 1024, 512) == eng.predict_prefill_latency(4, 1024, 512)
    assert st.prefill_ms(4, 1024, 512) == pytest.approx(43.57806801816932, rel=1e-6)
    assert st.decode_ms(32, 0, 0, 2048) == pytest.approx(9.631295053123305, rel=1e-6)
    assert st.decode_ms(32, 0, 0, 2048) == eng.decode_step_latency(32, 2047, 1)
    assert st.decode_ms(7, 0, 0, 1001) == eng.predict_decode_latency(7, 1000, 2)


def test_zero_work_costs_zero(llama8b_h100):
    """No new tokens (mean_isl == mean_prefix), no prefill items or no decoding sequences: 0."""
    st = llama8b_h100
    assert st.prefill_ms(3, 500, 500) == 0.0
    assert st.prefill_ms(0, 500, 0) == 0.0
    assert st.decode_ms(0, 0, 0, 0) == 0.0


@pytest.mark.parametrize("e", [0.005, 0.01, 0.02, 0.05, 0.1, 0.3])
def test_bucket_error_bound_and_order(e):
    """Every integer up to 2^18 is bucketed within relative error e, exactly below the
    threshold, and bucketing never decreases."""
    exact_below = max(EXACT_BELOW, math.ceil(1 / e))
    log_step = 2 * math.log1p(e / 2)
    prev = -1
    for x in range(2**18):
        b = bucket(x, log_step, exact_below)
        assert abs(b - x) <= e * x, (x, b)
        assert b >= prev
        if x < exact_below:
            assert b == x
        prev = b


def test_memo_prices_each_bucket_once_at_its_grid_point(llama8b_h100):
    """Decode contexts 3000..3999 at batch 100 take one memo entry per distinct bucket, and each
    is the library's prediction at the bucketed (batch, context); the same holds for prefill
    chunks and prefixes."""
    st = llama8b_h100
    b = st._bucket
    eng = st._engine
    before = len(st._decode_memo)
    values = {st.decode_ms(100, 0, 0, c) for c in range(3000, 4000)}
    buckets = {b(c) for c in range(3000, 4000)}
    assert len(st._decode_memo) - before == len(buckets) == len(values)
    assert len(buckets) < 20
    for c in (3000, 3333, 3999):
        assert st.decode_ms(100, 0, 0, c) == eng.predict_decode_latency(b(100), b(c) - 1, 2)
    n, isl, prefix = 70, 9000, 5000
    want = eng.predict_prefill_latency(b(n), b(prefix) + b(isl - prefix), b(prefix))
    assert st.prefill_ms(n, isl, prefix) == want


def test_bucketed_prediction_stays_near_the_exact_one(llama8b_h100, llama8b_h100_exact):
    """In the near-linear range the 2% argument bound keeps the prediction within about 2%."""
    for shape in [(1, 4096, 0), (2, 3000, 1000), (1, 20_000, 0)]:
        got = llama8b_h100.prefill_ms(*shape)
        assert got == pytest.approx(llama8b_h100_exact.prefill_ms(*shape), rel=0.025)
    for batch, ctx in [(32, 2048), (200, 5000), (48, 30_000)]:
        got = llama8b_h100.decode_ms(batch, 0, 0, ctx)
        assert got == pytest.approx(llama8b_h100_exact.decode_ms(batch, 0, 0, ctx), rel=0.025)


def test_more_work_costs_more_over_doublings(llama8b_h100):
    """More new tokens, more sequences, a longer cached prefix, a longer context or a bigger
    batch cost more. (The measured tables are not monotone at fine grain or tiny shapes: one
    4-token prefill is priced above an 8-token one, so the checks start where they are.)"""
    st = llama8b_h100
    series = [
        [st.prefill_ms(1, t, 0) for t in (256, 512, 1024, 2048, 4096, 8192, 16384)],
        [st.prefill_ms(n, 512, 0) for n in (1, 2, 4, 8, 16, 32, 64)],
        [st.prefill_ms(1, 512 + p, p) for p in (0, 1024, 4096, 16384, 65536)],
        [st.decode_ms(32, 0, 0, c) for c in (512, 1024, 2048, 4096, 8192, 16384, 65536)],
        [st.decode_ms(b, 0, 0, 2048) for b in (1, 4, 16, 64, 256, 1024)],
    ]
    for s in series:
        assert all(a < b for a, b in zip(s, s[1:], strict=False)), s


def test_non_finite_or_negative_prediction_is_an_error(llama8b_h100_exact, monkeypatch):
    """A NaN, infinite or negative prediction is refused, not passed on to the clock."""
    st = llama8b_h100_exact

    class Bad:
        def __init__(self, value):
            self.value = value

        def predict_prefill_latency(self, *_):
            return self.value

        def predict_decode_latency(self, *_):
            return self.value

    for i, value in enumerate([math.nan, math.inf, -1.0]):
        monkeypatch.setattr(st, "_engine", Bad(value))
        with pytest.raises(ValueError, match="priced the prefill"):
            st.prefill_ms(1, 77_777 + i, 0)
        with pytest.raises(ValueError, match="priced the decode"):
            st.decode_ms(3, 0, 0, 77_777 + i)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(model_id="meta-llama/Llama-3.2-1B"), r"no cached config.*Qwen/Qwen3-32B"),
        (dict(system="h100_pcie"), r"no performance data for system 'h100_pcie'.*h200_sxm:"),
        (dict(backend="tensorrt"), r"backend 'tensorrt' on h100_sxm.*trtllm 1\.3\.0rc20"),
        (dict(backend_version="0.9.0"), r"version '0\.9\.0'.*0\.24\.0 \(current\)"),
        (dict(backend_version="previous"), r"version 'previous'.*0\.27\.0 \(next\)"),
        (dict(tp_size=3), r"cannot build .*tp3.*divisible"),
        (dict(ep_size=2), r"ep_size 2 > 1 needs a model with experts"),
        (dict(gemm_quant="fp7"), r"unknown gemm_quant 'fp7'.*nvfp4"),
        (dict(gemm_quant="nvfp4"), r"nvfp4.*fp4_tc_flops"),
        (dict(gemm_quant="int4_wo"), r"GEMM perf data missing for quant 'int4_wo'.*fp8"),
        (dict(kv_cache_quant="int8"), r"context attention data missing.*int8"),
        (dict(tp_size=0), r"tp_size must be >= 1"),
        (dict(bucket_rel_error=0.5), r"bucket_rel_error"),
    ],
)
def test_unsupported_combinations_are_value_errors_naming_what_is_there(kwargs, match):
    """A model, system, backend, version, parallelism or quantisation the library or its
    h100_sxm tables lack is refused at construction, naming what is available."""
    base = dict(model_id=LLAMA8B, system="h100_sxm", backend="vllm")
    with pytest.raises(ValueError, match=f"(?s){match}"):
        AiconfiguratorStepTime(**{**base, **kwargs})


def test_moe_expert_parallelism_must_divide_the_attention_width():
    """Expert TP is tp x dp / ep, so ep must divide tp x dp."""
    with pytest.raises(ValueError, match="not a multiple of ep_size 4"):
        AiconfiguratorStepTime("Qwen/Qwen3-30B-A3B", "h100_sxm", "vllm", tp_size=2, ep_size=4)


def test_version_aliases_and_default(llama8b_h100):
    """None is the 'current' slot; an alias or a listed version resolves to its literal."""
    assert llama8b_h100.backend_version == "0.24.0"
    st = AiconfiguratorStepTime(LLAMA8B, "h100_sxm", "vllm", backend_version="next")
    assert st.backend_version == "0.27.0"
    assert st.model_id == "meta-llama/Meta-Llama-3.1-8B"


def test_missing_extra_names_the_install_command(monkeypatch):
    """Without aiconfigurator-core the constructor says how to install the extra."""
    for name in [m for m in sys.modules if m.startswith("aiconfigurator_core.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[aic\]'") as info:
        AiconfiguratorStepTime(LLAMA8B, "h100_sxm", "vllm")
    assert str(info.value) == MISSING_EXTRA


def test_a_moe_model_prices_below_a_dense_one_of_similar_size():
    """Qwen3-30B-A3B (3.3 B active) decodes one sequence faster than dense Qwen3-32B."""
    moe = AiconfiguratorStepTime("Qwen/Qwen3-30B-A3B", "h100_sxm", "vllm", bucket_rel_error=0)
    dense = AiconfiguratorStepTime("Qwen/Qwen3-32B", "h100_sxm", "vllm", bucket_rel_error=0)
    assert 0 < moe.decode_ms(1, 0, 0, 1024) < dense.decode_ms(1, 0, 0, 1024)
