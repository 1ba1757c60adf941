"""A Gantt chart of every worker's forward passes in a time window, with each arrival's wait."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from servesim.metrics.plots._common import axes_or_new, source_table

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from servesim.sim import Result

PASS_KINDS = {"prefill-only": "tab:orange", "decode-only": "tab:blue", "mixed": "tab:green"}
# passes of a disaggregated cluster's workers, coloured by role; a decode worker prefills only
# to recompute a preempted request
ROLE_KINDS = {
    "prefill worker": "tab:red",
    "decode worker": "tab:purple",
    "decode worker, recompute": "tab:olive",
}
# pools top to bottom in `pass_timeline`, and each one's row-label prefix (as in the KV pool
# names cluster.p0, cluster.d0, cluster.w0)
ROLE_ORDER = ("prefill", "decode", "aggregated")
ROLE_PREFIX = {"prefill": "p", "decode": "d", "aggregated": "w"}
# a worker's row in `pass_timeline` spans [lane - 0.5, lane + 0.5]: the bars fill the lower part,
# arrivals are drawn above them on a few staggered levels so overlapping waits stay apart
BAR_OFFSET, BAR_HEIGHT = 0.2, 0.5
ARRIVAL_LEVELS = (-0.12, -0.19, -0.26, -0.33, -0.4, -0.47)


def pass_kind(passes: pd.DataFrame) -> np.ndarray:
    """Each pass's kind: `mixed` (prefill and decode sequences), `prefill-only`, or
    `decode-only` (everything else, including a pass that only decodes)."""
    prefill = passes["prefill_seqs"].to_numpy() > 0
    decode = passes["decode_seqs"].to_numpy() > 0
    return np.select([prefill & decode, prefill], ["mixed", "prefill-only"], "decode-only")


def _roles(passes: pd.DataFrame) -> np.ndarray:
    """Each pass's role (a passes table without the column is an aggregated cluster's)."""
    if "role" not in passes:
        return np.full(len(passes), "aggregated", dtype=object)
    return passes["role"].to_numpy(dtype=object)


def pass_category(passes: pd.DataFrame) -> np.ndarray:
    """Each pass's colour key in `pass_timeline`: its `pass_kind` on an aggregated worker, else
    its role (`prefill worker`, `decode worker`, or `decode worker, recompute` when a decode
    worker prefilled a preempted request again)."""
    roles = _roles(passes)
    prefill = passes["prefill_seqs"].to_numpy() > 0
    return np.select(
        [roles == "aggregated", roles == "prefill", prefill],
        [pass_kind(passes), "prefill worker", "decode worker, recompute"],
        "decode worker",
    )


def _lanes(source: Result | pd.DataFrame, passes: pd.DataFrame) -> list[tuple[str, int, int]]:
    """The Gantt rows as (role, worker, dp_rank), prefill pool first: every rank of the
    configured cluster with a `Result`, else those that ran a pass."""
    lanes = set(
        zip(
            _roles(passes).tolist(),
            passes["worker"].tolist(),
            passes["dp_rank"].tolist(),
            strict=True,
        )
    )
    if not isinstance(source, pd.DataFrame):
        from servesim.config.derived import role_engines

        cfg = source.config
        topo = cfg.topology
        for role, engine in role_engines(cfg).items():
            n_workers = getattr(topo, f"num_{role}_workers", getattr(topo, "num_workers", 0))
            lanes.update((role, w, r) for w in range(n_workers) for r in range(engine.dp_size))
    return sorted(lanes, key=lambda lane: (ROLE_ORDER.index(lane[0]), lane[1], lane[2]))


def lane_labels(lanes: list[tuple[str, int, int]]) -> list[str]:
    """Row labels by pool: `p0`, `d1`, `w0`, with `.r{k}` when the pool has several DP ranks."""
    many_ranks = {role for role, _, rank in lanes if rank}
    return [
        f"{ROLE_PREFIX[role]}{w}.r{r}" if role in many_ranks else f"{ROLE_PREFIX[role]}{w}"
        for role, w, r in lanes
    ]


def pass_timeline(
    source: Result | pd.DataFrame,
    t0_ms: float,
    t1_ms: float,
    ax: Axes | None = None,
    *,
    label_decode: bool | None = None,
    show_arrivals: bool = True,
) -> Axes:
    """A Gantt chart of the passes that overlap [t0_ms, t1_ms], one row per worker (and DP rank),
    labelled by pool: `p0` (prefill), `d0` (decode), `w0` (aggregated), `.r1` for DP rank 1.

    Each pass is one bar, coloured by `pass_category`: aggregated passes by kind (prefill-only,
    decode-only, mixed), a disaggregated cluster's passes by role. The number inside is how many
    sequences decoded in it. `label_decode=None` labels only bars wide enough to read (at least
    1.2% of the window): narrow the window to see them all. With a `Result`, each request that
    arrives in the window is a marker on the row it arrived at (its aggregated worker, or its
    prefill worker) with a line to its first token, so its TTFT reads as the wait for the running
    pass plus its own prefill (plus, in P/D, the handoff and the first decode pass).
    """
    from matplotlib.patches import Patch

    if t1_ms <= t0_ms:
        raise ValueError(f"empty window: t0_ms={t0_ms} >= t1_ms={t1_ms}")
    passes = source_table(source, "passes")
    lanes = _lanes(source, passes)
    ax = axes_or_new(ax, (11, 1.2 + 1.4 * len(lanes)))
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    window = passes[(passes["start_ms"] < t1_ms) & (passes["end_ms"] > t0_ms)]
    categories = pass_category(window)
    y = np.array(
        [
            lane_of[lane]
            for lane in zip(_roles(window), window["worker"], window["dp_rank"], strict=True)
        ],
        dtype=float,
    )
    start = window["start_ms"].to_numpy(dtype=float)
    width = window["end_ms"].to_numpy(dtype=float) - start
    colours = {**PASS_KINDS, **ROLE_KINDS}
    for category, colour in colours.items():
        sel = categories == category
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

    roles = {role for role, _, _ in lanes}
    legend = list(PASS_KINDS) if "aggregated" in roles else []
    legend += [c for c in ("prefill worker", "decode worker") if c.split()[0] in roles]
    if (categories == "decode worker, recompute").any():
        legend.append("decode worker, recompute")
    handles: list[Any] = [Patch(color=colours[k], label=k) for k in legend]
    if show_arrivals and not isinstance(source, pd.DataFrame):
        handles += _draw_arrivals(ax, source.requests, lane_of, t0_ms, t1_ms)

    ax.set_yticks([i + BAR_OFFSET for i in range(len(lanes))])
    ax.set_yticklabels(lane_labels(lanes))
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


def _arrival_lanes(requests: pd.DataFrame) -> list[tuple[str, int, int] | None]:
    """The row each request arrived at: its prefill worker's rank in a disaggregated cluster,
    else its worker's rank (None before routing)."""
    out: list[tuple[str, int, int] | None] = []
    columns = ("prefill_worker_idx", "prefill_dp_rank", "decode_worker_idx", "dp_rank")
    for pw, pr, dw, dr in zip(*(requests[c].tolist() for c in columns), strict=True):
        if not pd.isna(pw):
            out.append(("prefill", int(pw), 0 if pd.isna(pr) else int(pr)))
        elif not pd.isna(dw):
            out.append(("aggregated", int(dw), int(dr)))
        else:
            out.append(None)
    return out


def _draw_arrivals(
    ax: Axes,
    requests: pd.DataFrame,
    lane_of: dict[tuple[str, int, int], int],
    t0: float,
    t1: float,
) -> list[Any]:
    """Arrivals in [t0, t1) as markers above the bars of the row they arrived at, each with a
    line to its first token, on one of `ARRIVAL_LEVELS`."""
    from matplotlib.lines import Line2D

    arr = requests[(requests["arrival_ms"] >= t0) & (requests["arrival_ms"] < t1)]
    arr = arr.sort_values("arrival_ms", kind="stable")
    lanes = [lane_of.get(lane) if lane else None for lane in _arrival_lanes(arr)]
    keep = np.array([lane is not None for lane in lanes], dtype=bool)
    if not keep.any():
        return []
    lane_idx = [lane for lane in lanes if lane is not None]
    x = arr["arrival_ms"].to_numpy(dtype=float)[keep]
    ft = arr["first_token_ms"].to_numpy(dtype=float)[keep]
    has_token = ~np.isnan(ft)
    ends = np.where(has_token, ft, x)
    # each arrival takes the first level of its row that is free by then (else the one that
    # frees first), so waits that overlap in time are drawn apart
    free_at: dict[int, list[float]] = {}
    y = np.empty(len(x))
    for i, lane in enumerate(lane_idx):
        levels = free_at.setdefault(lane, [-np.inf] * len(ARRIVAL_LEVELS))
        free = [k for k, t in enumerate(levels) if t <= x[i]]
        k = free[0] if free else int(np.argmin(levels))
        levels[k] = ends[i]
        y[i] = lane + ARRIVAL_LEVELS[k]
    ax.hlines(y[has_token], x[has_token], ft[has_token], colors="black", linewidth=1)
    ax.plot(x, y, linestyle="none", marker="v", color="black", markersize=5)
    ax.plot(ft[has_token], y[has_token], linestyle="none", marker="|", color="black", markersize=8)
    return [Line2D([], [], color="black", marker="v", markersize=5, label="arrival -> first token")]
