"""The summary's statistics of long arrays (a million requests' ITL gaps): the same floats as
numpy's on the whole array, computed without copies of it."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.metrics.summary import _std, distribution


@pytest.mark.parametrize("n", [1, 2, 7, 8, 129, 1000, 1001, 4097, 65_536, 200_003])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_std_in_pieces_is_numpys_std_to_the_last_bit(n, scale):
    rng = np.random.default_rng(n)
    x = rng.random(n) * scale + scale
    for view in (x, x[::-1], np.sort(x)):
        assert _std(view, chunk=128) == float(view.std())
        assert _std(view, chunk=1000) == float(view.std())


def test_distribution_of_a_sorted_view_is_that_of_the_values():
    rng = np.random.default_rng(0)
    x = rng.exponential(20.0, size=10_001)
    by_sorting = distribution(x, "itl")
    presorted = distribution(np.sort(x), "itl", is_sorted=True)
    assert by_sorting == presorted
    assert by_sorting["median_itl_ms"] == float(np.sort(x)[5000])
    assert by_sorting["std_itl_ms"] == float(np.sort(x).std())
