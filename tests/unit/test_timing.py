"""Step-time models: the mocker's polynomial exactly, fixed, interpolation, roofline shape."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests_support import H100_CFG, LLAMA8B_CFG

from servesim.config.schema import (
    FixedTiming,
    InterpolatedTiming,
    PolynomialTiming,
    RooflineTiming,
)
from servesim.engine.worker import DecodeTable, decode_price
from servesim.timing.base import Scaled
from servesim.timing.fixed import Fixed
from servesim.timing.interpolated import Interpolated
from servesim.timing.polynomial import Polynomial
from servesim.timing.roofline import Roofline


def p(t: float) -> float:
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142


def test_polynomial_prefill_uses_integer_means_of_the_batch():
    """T = n * (sum_isl // n - sum_prefix // n); 0 new tokens cost 0."""
    m = Polynomial(PolynomialTiming())
    assert m.prefill_ms(1, 1000, 0) == pytest.approx(p(1000))
    assert m.prefill_ms(2, (3001 + 1000) // 2, 0) == pytest.approx(p(4000))
    assert m.prefill_ms(1, 1024, 1024) == 0.0
    assert round(m.prefill_ms(1, 1000, 0), 6) == 32.105859  # the mocker's value


def test_polynomial_decode_depends_on_kv_utilisation_only():
    m = Polynomial(PolynomialTiming())
    total = 16384 * 64
    u = 1001 / total
    assert m.decode_ms(1, 1001, total, 1001) == pytest.approx(-25.74 * u * u + 54.01 * u + 5.74)
    assert m.decode_ms(1, 2048, 1024, 0) == m.decode_ms(1, 1024, 1024, 0), "u clamps at 1"
    assert m.decode_ms(7, 1001, total, 143) == m.decode_ms(1, 1001, total, 1001)
    assert m.decode_ms(0, 0, total, 0) == 0.0


def test_polynomial_decode_floor():
    m = Polynomial(PolynomialTiming(decode_c=-100.0))
    assert m.decode_ms(1, 10, 100, 10) == 1.0


def test_speedup_ratios_divide_prefill_and_decode():
    m = Scaled(Polynomial(PolynomialTiming()), 2.0, 3.0)
    assert m.prefill_ms(1, 1000, 0) == pytest.approx(p(1000) / 2)
    base = Polynomial(PolynomialTiming()).decode_ms(1, 1001, 2**20, 1001)
    assert m.decode_ms(1, 1001, 2**20, 1001) == pytest.approx(base / 6)
    assert Scaled(Fixed(FixedTiming()), 0.0, 1.0).prefill_ms(1, 10, 0) == 50.0


@pytest.mark.parametrize(
    "model",
    [
        Scaled(Polynomial(PolynomialTiming()), 1.0, 1.0),
        Scaled(Polynomial(PolynomialTiming()), 1.7, 1.3),
        Scaled(Polynomial(PolynomialTiming(decode_c=-3.0)), 1.0, 1.0),  # the floor binds
    ],
)
def test_decode_table_gives_the_pass_by_pass_price(model):
    """The tabulated decode part of a pass, one by one or in bulk, is what pricing each pass
    gives (whole nanoseconds), at any batch size, chunk edges and loads past the pool's."""
    total = 3 * DecodeTable.CHUNK + 17
    table = DecodeTable(model.decode_ms_by_kv(total), total)
    price = decode_price(model, total)
    rng = np.random.default_rng(0)
    for n, start, m in [(1, 0, 50), (3, 4090, 40), (7, total - 30, 20), (64, 5, 200)]:
        expected = [price(n, start + n * j) for j in range(m)]
        assert table.prices(start, n, m).tolist() == expected
        assert [table.price(n, start + n * j) for j in range(m)] == expected
    for s in rng.integers(1, 2 * total, 300):
        n = int(rng.integers(1, 100))
        assert table.price(n, int(s)) == price(n, int(s))
    # a table first used high up widens downwards too, gap included
    late = DecodeTable(model.decode_ms_by_kv(total), total)
    assert late.prices(total - 100, 2, 30).tolist() == [
        price(2, total - 100 + 2 * j) for j in range(30)
    ]
    assert late.price(1, 10) == price(1, 10) and late.lo == 10 and late.hi == total
    # a model whose decode time depends on more than the KV tokens is not tabulated
    assert Scaled(Fixed(FixedTiming()), 1.0, 1.0).decode_ms_by_kv(total) is None


def test_fixed_costs_only_when_there_is_work():
    m = Fixed(FixedTiming(prefill_ms=10, decode_ms=2))
    assert m.prefill_ms(1, 100, 0) == 10 and m.prefill_ms(1, 100, 100) == 0
    assert m.decode_ms(3, 300, 1000, 100) == 2 and m.decode_ms(0, 0, 1000, 0) == 0


GRID = dict(
    prefill_isl=[100, 1000],
    prefill_ttft_ms=[10.0, 100.0],
    decode_active_kv_tokens=[0, 1000],
    decode_context_length=[0, 100],
    decode_itl=[2.0, 4.0, 6.0, 8.0],
)


def test_interpolated_prefill_is_linear_and_extrapolates():
    m = Interpolated(InterpolatedTiming(**GRID))
    assert m.prefill_ms(1, 550, 0) == pytest.approx(55.0)
    assert m.prefill_ms(1, 2000, 0) == pytest.approx(200.0)
    assert m.prefill_ms(1, 50, 0) == pytest.approx(5.0)
    assert m.prefill_ms(1, 5, 0) == pytest.approx(0.5)


def test_interpolated_decode_is_bilinear_with_floor():
    m = Interpolated(InterpolatedTiming(**GRID))
    # corners (kv, ctx): (0,0)=2 (0,100)=4 (1000,0)=6 (1000,100)=8
    assert m.decode_ms(1, 500, 0, 50) == pytest.approx(5.0)
    assert m.decode_ms(1, 2000, 0, 100) == pytest.approx(12.0)  # extrapolated along KV
    assert m.decode_ms(1, 0, 0, -400) == 1.0  # floored


def test_interpolated_loads_a_json_file(tmp_path):
    f = tmp_path / "profile.json"
    f.write_text(json.dumps(GRID))
    m = Interpolated(InterpolatedTiming(path=str(f)))
    assert m.prefill_ms(1, 550, 0) == pytest.approx(55.0)


def test_interpolated_rejects_a_grid_of_the_wrong_size():
    bad = dict(GRID, decode_itl=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="decode_itl"):
        Interpolated(InterpolatedTiming(**bad))


def test_roofline_prefill_compute_bound_decode_memory_bound():
    """Long prefills scale with FLOPs; decode at small batch costs about a weight read."""
    cfg = RooflineTiming(prefill_overhead_ms=0.0, decode_overhead_ms=0.0)
    m = Roofline(cfg, LLAMA8B_CFG, H100_CFG, 1)
    t8k = m.prefill_ms(1, 8192, 0)
    t4k = m.prefill_ms(1, 4096, 0)
    assert 1.9 < t8k / t4k < 2.3  # about linear, plus the attention term
    weights_ms = 8.03e9 * 2 / (3.35e12 * 0.8) * 1e3
    assert m.decode_ms(1, 1000, 10**6, 1000) == pytest.approx(weights_ms, rel=0.01)
    assert m.decode_ms(64, 64 * 1000, 10**6, 1000) > m.decode_ms(1, 1000, 10**6, 1000)
    tp2 = Roofline(cfg, LLAMA8B_CFG, H100_CFG, 2)
    assert tp2.prefill_ms(1, 8192, 0) < t8k


@pytest.mark.parametrize(
    "overrides, said",
    [
        ([], None),
        (["timing=polynomial"], None),
        (
            ["llm=llama3_70b", "engine.tp_size=4", "timing=polynomial"],
            "llm=llama3_70b, tp_size=4 only size",
        ),
        (["hardware=b200", "timing=polynomial"], "hardware=b200 only size"),
        (["timing=fixed", "engine.tp_size=2"], "timing=fixed ignores"),
        (["llm=llama3_70b", "engine.tp_size=4"], None),  # the default, calibrated_roofline
        (["experiment=dynamo_compat"], None),
    ],
)
def test_a_timing_model_blind_to_the_deployment_says_so(overrides, said):
    """polynomial, fixed and interpolated price every model, GPU and TP alike: a config that
    sets them gets one line saying so (the CLI prints it); the hardware models stay silent."""
    from servesim import compose
    from servesim.timing import geometry_ignored

    note = geometry_ignored(compose(overrides))
    if said is None:
        assert note is None
    else:
        assert note is not None and said in note and "calibrated_roofline" in note
