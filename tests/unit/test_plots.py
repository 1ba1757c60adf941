"""The plot helpers of `model.metrics.plots` on one small simulated run, with the Agg backend.

Behaviour, not pixels: each helper returns the Axes it drew on and draws the artists its tables
imply (one bar per pass overlapping the Gantt window, coloured by pass kind and labelled with its
decoding sequences; one step line per pool and level; one CDF per latency series).
"""

from __future__ import annotations

import subprocess
import sys

import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import make_config  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from model import Result, simulate  # noqa: E402
from model.metrics import plots  # noqa: E402


@pytest.fixture(scope="module")
def result() -> Result:
    """Two workers, 24 two-turn chat sessions sharing prefixes; token times kept."""
    cfg = make_config(
        workload={
            "kind": "synthetic",
            "num_sessions": 24,
            "turns_per_session": 2,
            "inter_turn_delay_ms": 300.0,
            "input_tokens": {"dist": "lognormal", "mean": 700, "std": 300, "min": 64, "max": 3000},
            "output_tokens": {"dist": "lognormal", "mean": 40, "std": 20, "min": 2, "max": 120},
            "shared_prefix_ratio": 0.4,
            "num_prefix_groups": 2,
            "rate_rps": 15.0,
        },
        topology={"num_workers": 2},
        output={"progress": "off", "per_token": True},
    )
    return simulate(cfg)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def bars(ax) -> list[Rectangle]:
    return [p for c in ax.containers for p in c.patches]


def test_import_model_does_not_import_matplotlib():
    """Plotting stays out of `import model` (and of importing the plots module itself)."""
    code = "import sys, model, model.metrics.plots; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_latency_timeline_draws_every_completed_request_and_two_medians(result):
    done = result.requests[result.requests["terminal_status"] == "completed"]
    fig, ax = plt.subplots()
    assert plots.latency_timeline(result, ax=ax, window=5) is ax
    assert [len(c.get_offsets()) for c in ax.collections] == [len(done), len(done)]
    medians = ax.get_lines()
    assert len(medians) == 2
    t_s = np.sort(done["arrival_ms"].to_numpy()) / 1000
    for line in medians:
        np.testing.assert_allclose(line.get_xdata(), t_s)
        assert not np.isnan(line.get_ydata()).any()
    # the TTFT median lies within the TTFT samples
    y = medians[0].get_ydata()
    assert done["ttft_ms"].min() <= y.min() and y.max() <= done["ttft_ms"].max()
    assert ax.get_yscale() == "log"


def test_latency_timeline_accepts_the_requests_table(result):
    ax = plots.latency_timeline(result.requests, log_y=False)
    assert len(ax.get_lines()) == 2 and ax.get_yscale() == "linear"


def mixed_window(result, span_ms: float = 80.0) -> tuple[float, float]:
    """A window opening just before the first pass that mixes prefill and decode."""
    p = result.passes
    first_mixed = p[(p["prefill_seqs"] > 0) & (p["decode_seqs"] > 0)]["start_ms"].min()
    return first_mixed - 10.0, first_mixed - 10.0 + span_ms


def test_pass_timeline_one_bar_per_pass_in_the_window(result):
    t0, t1 = mixed_window(result)
    p = result.passes
    inside = p[(p["start_ms"] < t1) & (p["end_ms"] > t0)]
    ax = plots.pass_timeline(result, t0, t1, label_decode=True)
    drawn = bars(ax)
    assert len(drawn) == len(inside) > 0
    # bars keep the passes' times, on their worker's row
    got = sorted((r.get_x(), r.get_x() + r.get_width()) for r in drawn)
    want = sorted(zip(inside["start_ms"], inside["end_ms"], strict=True))
    np.testing.assert_allclose(got, want)
    # colours by kind, and one decoding-sequence count per bar
    kinds = plots.pass_kind(inside)
    for kind, colour in plots.PASS_KINDS.items():
        n = sum(r.get_facecolor() == to_rgba(colour) for r in drawn)
        assert n == (kinds == kind).sum()
    assert (kinds == "mixed").any()
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(n) for n in inside["decode_seqs"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["w0", "w1"]
    assert ax.get_xlim() == (t0, t1)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:3] == list(plots.PASS_KINDS)


def test_pass_timeline_marks_arrivals_with_their_first_token(result):
    t0, t1 = mixed_window(result, span_ms=400.0)
    r = result.requests
    arrived = r[(r["arrival_ms"] >= t0) & (r["arrival_ms"] < t1)]
    assert len(arrived)
    ax = plots.pass_timeline(result, t0, t1)
    arrivals, first_tokens = ax.get_lines()
    np.testing.assert_allclose(np.sort(arrivals.get_xdata()), np.sort(arrived["arrival_ms"]))
    np.testing.assert_allclose(
        np.sort(first_tokens.get_xdata()), np.sort(arrived["first_token_ms"])
    )
    (waits,) = ax.collections  # one line from each arrival to its first token
    assert len(waits.get_segments()) == len(arrived)


def test_pass_timeline_auto_labels_only_wide_bars_and_tables_have_no_arrivals(result):
    end = result.passes["end_ms"].max()
    ax = plots.pass_timeline(result.passes, 0.0, end)
    assert len(bars(ax)) == len(result.passes)
    assert len(ax.texts) < len(result.passes)
    assert len(ax.get_lines()) == 0 and len(ax.collections) == 0


def test_pass_timeline_empty_window_keeps_the_rows(result):
    end = result.passes["end_ms"].max()
    ax = plots.pass_timeline(result, end + 1000.0, end + 2000.0)
    assert bars(ax) == [] and len(ax.get_yticks()) == 2
    with pytest.raises(ValueError, match="empty window"):
        plots.pass_timeline(result, 10.0, 10.0)


def test_kv_occupancy_steps_each_pool_from_time_zero(result):
    """A level holds until the next record; before a pool's first record it is 0."""
    ax = plots.kv_occupancy(result)
    lines = ax.get_lines()
    capacity = result.summary["metadata"]["num_gpu_blocks"]
    assert len(lines) == 2 * 2 + 1  # used and cached per pool, the capacity
    assert [line.get_label() for line in lines] == [
        "cluster.w0 used",
        "cluster.w0 cached",
        "cluster.w1 used",
        "cluster.w1 cached",
        "capacity per pool",
    ]
    kv = result.kv
    for line, (pool, column) in zip(
        lines,
        [(p, c) for p in ("cluster.w0", "cluster.w1") for c in ("used_blocks", "cached_blocks")],
        strict=False,
    ):
        assert line.get_drawstyle() == "steps-post"
        g = kv[kv["pool"] == pool]
        y = np.asarray(line.get_ydata())
        assert line.get_xdata()[0] == 0
        assert y[0] == (g[column].iloc[0] if g["t_ms"].iloc[0] == 0 else 0)
        assert y.max() == g[column].max()
    assert set(lines[-1].get_ydata()) == {capacity}
    assert kv["cached_blocks"].max() > 0  # shared prefixes were cached


def test_itl_distribution_cdfs(result):
    ax = plots.itl_distribution(result)
    labels = [line.get_label() for line in ax.get_lines()]
    assert [s.split(":")[0] for s in labels] == ["TPOT per request", "TTFT", "ITL (every gap)"]
    done = result.requests[result.requests["terminal_status"] == "completed"]
    tpot, ttft, itl = ax.get_lines()
    assert len(ttft.get_xdata()) == done["ttft_ms"].notna().sum()
    assert len(itl.get_xdata()) == (done["output_length"] - 1).sum()
    for line in (tpot, ttft, itl):
        y = np.asarray(line.get_ydata())
        assert y[-1] == 1.0 and (np.diff(y) > 0).all()
    median = result.summary["median_ttft_ms"]
    assert f"p50 {median:,.1f}" in labels[1]


def test_itl_distribution_hist_and_table_only(result):
    ax = plots.itl_distribution(result.requests, kind="hist")
    assert len(ax.get_lines()) == 0 and len(ax.patches) > 0
    assert len(ax.get_legend().get_texts()) == 2  # no token times: no pooled ITL
    with pytest.raises(ValueError, match="kind"):
        plots.itl_distribution(result, kind="violin")
