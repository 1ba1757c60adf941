"""Plots of one run's tables: what each request saw, what each worker ran, how full each KV pool
was.

* `latency_timeline`: each completed request's TTFT and E2E latency against its arrival time,
  with a rolling median, so load building up and draining shows as a drift of the median.
* `pass_timeline`: a Gantt chart of every worker's forward passes in a time window, coloured
  prefill-only / decode-only / mixed (continuous batching: prefill chunks ride along with
  decode steps), each bar labelled with its number of decoding sequences, and each arrival
  drawn as a marker with a line to its first token (its TTFT).
* `kv_occupancy`: used blocks (held by requests) and cached blocks (held by no request, kept for
  prefix reuse until evicted) of each KV pool over time, as a step plot.
* `itl_distribution`: the distribution (CDF or histogram) of per-request TPOT and TTFT, and of
  the pooled inter-token gaps when the run kept token times (`output.per_token`).

Every function takes a `Result` (or the one table it reads), draws on the given Axes or on a new
figure, and returns the Axes. Times on the x axis are seconds for whole-run plots and
milliseconds for the pass window. matplotlib is imported inside the functions, so `import model`
stays light; the model itself never plots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from model.metrics.recorder import COMPLETED
from model.metrics.summary import nearest_rank

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from model.sim import Result

# pass kinds of `pass_timeline`, in legend order, with their colours
PASS_KINDS = {"prefill-only": "tab:orange", "decode-only": "tab:blue", "mixed": "tab:green"}
# a worker's row in `pass_timeline` spans [lane - 0.5, lane + 0.5]: the bars fill the lower part,
# arrivals are drawn above them on a few staggered levels so overlapping waits stay apart
BAR_OFFSET, BAR_HEIGHT = 0.2, 0.5
ARRIVAL_LEVELS = (-0.12, -0.19, -0.26, -0.33, -0.4, -0.47)


def _table(source: Result | pd.DataFrame, name: str) -> pd.DataFrame:
    """`source` itself if it is a table, else its table `name`."""
    if isinstance(source, pd.DataFrame):
        return source
    table = getattr(source, name)
    assert isinstance(table, pd.DataFrame)
    return table


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, new = plt.subplots(figsize=figsize, layout="constrained")
    return new


def _completed(requests: pd.DataFrame) -> pd.DataFrame:
    done = requests[requests["terminal_status"] == COMPLETED]
    return done.sort_values("arrival_ms", kind="stable")


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
    ax = _axes(ax, (9, 4))
    requests = _table(source, "requests")
    done = _completed(requests)
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


def pass_kind(passes: pd.DataFrame) -> np.ndarray:
    """Each pass's kind: `mixed` (prefill and decode sequences), `prefill-only`, or
    `decode-only` (everything else, including a pass that only decodes)."""
    prefill = passes["prefill_seqs"].to_numpy() > 0
    decode = passes["decode_seqs"].to_numpy() > 0
    return np.select([prefill & decode, prefill], ["mixed", "prefill-only"], "decode-only")


def pass_timeline(
    source: Result | pd.DataFrame,
    t0_ms: float,
    t1_ms: float,
    ax: Axes | None = None,
    *,
    label_decode: bool | None = None,
    show_arrivals: bool = True,
) -> Axes:
    """A Gantt chart of the passes that overlap [t0_ms, t1_ms], one row per worker (and DP rank).

    Each pass is one bar, coloured by `pass_kind`; the number inside is how many sequences
    decoded in it. `label_decode=None` labels only bars wide enough to read (at least 1.2% of
    the window): narrow the window to see them all. With a `Result`, each request that arrives
    in the window is a marker on its worker's row with a line to its first token, so its TTFT
    reads as the wait for the running pass plus its own prefill.
    """
    from matplotlib.patches import Patch

    if t1_ms <= t0_ms:
        raise ValueError(f"empty window: t0_ms={t0_ms} >= t1_ms={t1_ms}")
    passes = _table(source, "passes")
    lanes = sorted(set(zip(passes["worker"].tolist(), passes["dp_rank"].tolist(), strict=True)))
    ax = _axes(ax, (11, 1.2 + 1.4 * len(lanes)))
    many_ranks = any(rank for _, rank in lanes)
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    window = passes[(passes["start_ms"] < t1_ms) & (passes["end_ms"] > t0_ms)]
    kinds = pass_kind(window)
    y = np.array(
        [lane_of[w, r] for w, r in zip(window["worker"], window["dp_rank"], strict=True)],
        dtype=float,
    )
    start = window["start_ms"].to_numpy(dtype=float)
    width = window["end_ms"].to_numpy(dtype=float) - start
    for kind, colour in PASS_KINDS.items():
        sel = kinds == kind
        if sel.any():
            ax.barh(
                y[sel] + BAR_OFFSET,
                width[sel],
                left=start[sel],
                height=BAR_HEIGHT,
                color=colour,
                edgecolor="white",
                linewidth=0.5,
            )

    min_width = 0.0 if label_decode else 0.012 * (t1_ms - t0_ms)
    if label_decode is not False:
        # centre each label on the visible part of its bar
        lo = np.maximum(start, t0_ms)
        hi = np.minimum(start + width, t1_ms)
        for x0, x1, yy, n, w in zip(lo, hi, y, window["decode_seqs"], width, strict=True):
            if w >= min_width and w > 0:
                ax.text(
                    (x0 + x1) / 2,
                    yy + BAR_OFFSET,
                    str(n),
                    ha="center",
                    va="center",
                    fontsize=7,
                    clip_on=True,
                )

    handles: list[Any] = [Patch(color=c, label=k) for k, c in PASS_KINDS.items()]
    if show_arrivals and not isinstance(source, pd.DataFrame):
        handles += _draw_arrivals(ax, source.requests, lane_of, t0_ms, t1_ms)

    ax.set_yticks([i + BAR_OFFSET for i in range(len(lanes))])
    ax.set_yticklabels([f"w{w}.r{r}" if many_ranks else f"w{w}" for w, r in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # first worker on top
    ax.set_xlim(t0_ms, t1_ms)
    ax.set_xlabel("time (ms)")
    ax.set_title(
        f"Passes {t0_ms:,.0f}-{t1_ms:,.0f} ms ({len(window)} passes; numbers: decoding sequences)"
    )
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0, 1.08),
        ncols=len(handles),
        fontsize="small",
        frameon=False,
    )
    return ax


def _draw_arrivals(
    ax: Axes, requests: pd.DataFrame, lane_of: dict[tuple[int, int], int], t0: float, t1: float
) -> list[Any]:
    """Arrivals in [t0, t1) as markers above their worker's bars, each with a line to its first
    token, on one of `ARRIVAL_LEVELS`. Requests carry a worker index but no DP rank: they go
    on the worker's first lane."""
    from matplotlib.lines import Line2D

    first_lane: dict[int, int] = {}
    for (w, _), i in sorted(lane_of.items()):
        first_lane.setdefault(w, i)
    arr = requests[
        (requests["arrival_ms"] >= t0)
        & (requests["arrival_ms"] < t1)
        & requests["decode_worker_idx"].notna()
    ]
    arr = arr[arr["decode_worker_idx"].astype(int).isin(first_lane)]
    if not len(arr):
        return []
    arr = arr.sort_values("arrival_ms", kind="stable")
    x = arr["arrival_ms"].to_numpy(dtype=float)
    ft = arr["first_token_ms"].to_numpy(dtype=float)
    has_token = ~np.isnan(ft)
    ends = np.where(has_token, ft, x)
    # each arrival takes the first level of its row that is free by then (else the one that
    # frees first), so waits that overlap in time are drawn apart
    free_at: dict[int, list[float]] = {}
    y = np.empty(len(x))
    for i, w in enumerate(arr["decode_worker_idx"]):
        lane = first_lane[int(w)]
        levels = free_at.setdefault(lane, [-np.inf] * len(ARRIVAL_LEVELS))
        free = [k for k, t in enumerate(levels) if t <= x[i]]
        k = free[0] if free else int(np.argmin(levels))
        levels[k] = ends[i]
        y[i] = lane + ARRIVAL_LEVELS[k]
    ax.hlines(y[has_token], x[has_token], ft[has_token], colors="black", linewidth=1)
    ax.plot(x, y, linestyle="none", marker="v", color="black", markersize=5)
    ax.plot(ft[has_token], y[has_token], linestyle="none", marker="|", color="black", markersize=8)
    return [Line2D([], [], color="black", marker="v", markersize=5, label="arrival -> first token")]


def kv_occupancy(
    source: Result | pd.DataFrame,
    ax: Axes | None = None,
    *,
    capacity_blocks: int | None = None,
) -> Axes:
    """Used and cached blocks of each KV pool over time, as steps (a level holds until the next
    record; before the first record it is 0).

    Used blocks are held by running requests; cached blocks are held by none and stay for prefix
    reuse until evicted, so they climb towards the capacity and stay there. The capacity line is
    the configured `num_gpu_blocks` when a `Result` is given (or `capacity_blocks`).
    """
    ax = _axes(ax, (9, 4))
    kv = _table(source, "kv")
    if capacity_blocks is None and not isinstance(source, pd.DataFrame):
        capacity_blocks = source.summary.get("metadata", {}).get("num_gpu_blocks")
    many_tiers = kv["tier"].nunique() > 1
    for i, ((pool, tier), g) in enumerate(kv.groupby(["pool", "tier"], sort=True)):
        name = f"{pool} ({tier})" if many_tiers else str(pool)
        t = g["t_ms"].to_numpy(dtype=float)
        used = g["used_blocks"].to_numpy(dtype=float)
        cached = g["cached_blocks"].to_numpy(dtype=float)
        if t[0] > 0:
            t, used, cached = np.r_[0.0, t], np.r_[0.0, used], np.r_[0.0, cached]
        colour = f"C{i % 10}"
        ax.step(t / 1000.0, used, where="post", color=colour, lw=1.2, label=f"{name} used")
        ax.step(
            t / 1000.0,
            cached,
            where="post",
            color=colour,
            lw=1.2,
            linestyle="--",
            label=f"{name} cached",
        )
    if capacity_blocks:
        ax.axhline(capacity_blocks, color="grey", linestyle=":", label="capacity per pool")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV blocks")
    ax.set_ylim(bottom=0)
    ax.set_title("KV cache occupancy")
    ax.legend(loc="upper left", fontsize="small", ncols=2)
    ax.grid(True, alpha=0.3)
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

    TPOT of a request is (last - first token) / (tokens - 1), the `itl_ms` column. With a
    `Result` that kept token times (`output.per_token`), every inter-token gap of the completed
    requests is drawn too: the pooled ITL, whose tail shows decode steps stretched by prefill
    chunks.
    """
    if kind not in ("cdf", "hist"):
        raise ValueError(f"kind must be 'cdf' or 'hist', not {kind!r}")
    ax = _axes(ax, (7, 4))
    done = _completed(_table(source, "requests"))
    series = {
        "TPOT per request": done["itl_ms"].dropna().to_numpy(dtype=float),
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
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=f"C{i}", label=label)
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
