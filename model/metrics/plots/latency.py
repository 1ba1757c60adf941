"""Latency plots: TTFT and E2E by arrival time, and CDFs of TTFT, TPOT and inter-token gaps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from servesim.metrics.plots._common import axes_or_new, completed, source_table
from servesim.metrics.summary import nearest_rank

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from servesim.sim import Result


def latency_timeline(
    source: Result | pd.DataFrame,
    ax: Axes | None = None,
    *,
    window: int = 25,
    log_y: bool = True,
) -> Axes:
    """TTFT and E2E latency of each completed request against its arrival time.

    Dots are requests; lines are medians over a centred window of `window` requests in arrival
    order. The y axis is logarithmic by default because E2E (the whole answer) is tens of times
    TTFT (the first token).
    """
    ax = axes_or_new(ax, (9, 4))
    requests = source_table(source, "requests")
    done = completed(requests)
    t_s = done["arrival_ms"].to_numpy(dtype=float) / 1000.0
    for column, name, colour in (("ttft_ms", "TTFT", "C0"), ("e2e_latency_ms", "E2E", "C1")):
        y = done[column].astype(float).reset_index(drop=True)
        ax.scatter(t_s, y, s=8, alpha=0.35, color=colour, linewidths=0, label=name)
        median = y.rolling(window, center=True, min_periods=1).median()
        ax.plot(t_s, median, color=colour, lw=2, label=f"{name}, rolling median of {window}")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"Latency by arrival ({len(done)} of {len(requests)} requests completed)")
    ax.legend(loc="upper left", fontsize="small", ncols=2)
    ax.grid(True, which="major", alpha=0.3)
    return ax


def itl_distribution(
    source: Result | pd.DataFrame,
    ax: Axes | None = None,
    *,
    kind: str = "cdf",
    bins: int = 40,
    log_x: bool = True,
) -> Axes:
    """The distribution of per-request TPOT and TTFT over completed requests, as empirical CDFs
    (`kind="cdf"`) or histograms (`kind="hist"`), with p50 and p90 (the summary's nearest-rank
    percentiles) in the legend.

    TPOT of a request is (last - first token) / (tokens - 1), the `tpot_ms` column. With a
    `Result` that kept token times (`output.per_token`), every inter-token gap of the completed
    requests is drawn too: the pooled ITL, whose tail shows decode steps stretched by prefill
    chunks.
    """
    if kind not in ("cdf", "hist"):
        raise ValueError(f"kind must be 'cdf' or 'hist', not {kind!r}")
    ax = axes_or_new(ax, (7, 4))
    done = completed(source_table(source, "requests"))
    series = {
        "TPOT per request": done["tpot_ms"].dropna().to_numpy(dtype=float),
        "TTFT": done["ttft_ms"].dropna().to_numpy(dtype=float),
    }
    token_times = {} if isinstance(source, pd.DataFrame) else source.token_times
    if token_times:
        gaps = [np.diff(token_times[r]) for r in done["request_id"] if r in token_times]
        series["ITL (every gap)"] = np.concatenate(gaps) if gaps else np.empty(0)
    series = {k: np.sort(v) for k, v in series.items() if len(v)}
    if kind == "hist" and series:
        pooled = np.concatenate(list(series.values()))
        positive = pooled[pooled > 0]
        if log_x and len(positive):
            edges = np.geomspace(positive.min(), positive.max() * 1.0001, bins + 1)
        else:
            edges = np.linspace(pooled.min(), pooled.max(), bins + 1)
    for i, (name, x) in enumerate(series.items()):
        label = f"{name}: p50 {nearest_rank(x, 50):,.1f}, p90 {nearest_rank(x, 90):,.1f} ms"
        if kind == "cdf":
            ax.ecdf(x, color=f"C{i}", label=label)
        else:
            ax.hist(x, bins=edges.tolist(), color=f"C{i}", alpha=0.5, label=label)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of samples" if kind == "cdf" else "samples")
    ax.set_title(f"Latency distributions ({len(done)} completed requests)")
    ax.legend(loc="lower right" if kind == "cdf" else "upper right", fontsize="small")
    ax.grid(True, which="major", alpha=0.3)
    return ax


def _log_ms_axis(ax: Axes) -> None:
    """A log x axis with plain numbers at 1, 2, 5 x 10^k (a CDF over less than a decade would
    otherwise get one labelled tick, or minor ticks in scientific notation)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def latency_comparison(
    results: dict[str, Result],
    *,
    log_x: bool = True,
) -> Figure:
    """TTFT and TPOT distributions of several runs side by side, as empirical CDFs over their
    completed requests (one line per run, p50 and p90 in the legend); when every run kept token
    times (`output.per_token`), a third panel shows the tail of the pooled inter-token gaps: the
    fraction of gaps longer than x ms (the complementary CDF), on a log scale, with p99 and the
    longest gap.
    `log_x` puts TTFT and the gaps on log axes (TPOT stays linear).

    TPOT (the `tpot_ms` column) is one value per request, (last - first token) / (tokens - 1):
    it shows how fast decoding went on average. The pooled gaps show the individual stalls that
    an average hides, such as a decode step stretched by a prefill chunk in the same pass.
    """
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("no runs to compare")
    with_gaps = all(r.token_times for r in results.values())
    fig, axes = plt.subplots(
        1, 3 if with_gaps else 2, figsize=(15 if with_gaps else 11, 4), layout="constrained"
    )
    panels = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT per request")]
    for ax, (column, title) in zip(axes, panels, strict=False):
        for i, (name, result) in enumerate(results.items()):
            x = np.sort(completed(result.requests)[column].dropna().to_numpy(dtype=float))
            if not len(x):
                continue
            label = f"{name}: p50 {nearest_rank(x, 50):,.1f}, p90 {nearest_rank(x, 90):,.1f} ms"
            ax.ecdf(x, color=f"C{i}", label=label)
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
    if with_gaps:
        ax = axes[2]
        for i, (name, result) in enumerate(results.items()):
            done = completed(result.requests)["request_id"]
            gaps = [np.diff(result.token_times[r]) for r in done if r in result.token_times]
            x = np.sort(np.concatenate(gaps)) if gaps else np.empty(0)
            if not len(x):
                continue
            label = f"{name}: p99 {nearest_rank(x, 99):,.1f}, max {x[-1]:,.1f} ms"
            # the fraction of gaps longer than x: 1 before the shortest, 1/n up to the longest,
            # where it drops to 0 (off the log scale: the line runs down to the axis there)
            ax.ecdf(x, complementary=True, color=f"C{i}", label=label)
        ax.set_yscale("log")
        ax.set_ylabel("fraction of gaps > x")
        ax.set_title("Inter-token gaps (tail)")
    # CDFs rise to the right, the tail falls: each legend goes where its lines are not. TPOT
    # spans a narrow range (a decode pass, give or take): its axis stays linear
    locs = ("lower right", "lower right", "lower left")
    for i, (ax, loc) in enumerate(zip(axes, locs, strict=False)):
        if log_x and i != 1:
            _log_ms_axis(ax)
        ax.set_xlabel("ms")
        ax.legend(loc=loc, fontsize="small")
        ax.grid(True, which="major", alpha=0.3)
    return fig
