"""Plots of one run's tables: what each request saw, what each worker ran, how full each KV pool
was.

* `latency_timeline`: each completed request's TTFT and E2E latency against its arrival time,
  with a rolling median, so load building up and draining shows as a drift of the median.
* `pass_timeline`: a Gantt chart of every worker's forward passes in a time window, one row per
  worker (and DP rank), labelled by pool (`p0`, `d0`, `w0`). Aggregated workers' passes are
  coloured prefill-only / decode-only / mixed (continuous batching: prefill chunks ride along
  with decode steps); a disaggregated cluster's passes are coloured by role (prefill worker,
  decode worker). Each bar is labelled with its number of decoding sequences, and each arrival
  is drawn as a marker with a line to its first token (its TTFT).
* `request_swimlanes`: one lane per request, cut into the phases of its life: queue, prefill,
  (P/D only: wait for a decode reservation, transfer, decode queue), decode.
* `kv_occupancy`: used blocks (held by requests) and cached blocks (held by no request, kept for
  prefix reuse until evicted) of each KV pool over time, as a step plot, with each pool's
  capacity.
* `itl_distribution`: the distribution (CDF or histogram) of per-request TPOT and TTFT, and of
  the pooled inter-token gaps when the run kept token times (`output.per_token`).
* `latency_comparison`: TTFT, TPOT and (with token times) inter-token gap distributions of
  several runs side by side.

Of an agentic replay (docs/agentic.md), which adds `play_id`, `lane` and `phase` to the requests
and a `plays` table (any other run raises ValueError):

* `lane_timeline`: one row per agent lane: each play's span from start to settle, its LLM calls
  (main agent and sub-agents apart), the tool waits between a session's calls, and a warm run's
  preparation requests and barrier.
* `context_growth`: each play's main-session input tokens by turn, and how many were reused.
* `reuse_per_turn`: per turn index, the mean fraction of input tokens reused from G1 (device)
  and from G2 (host), stacked.

Every function takes a `Result` (or the one table it reads), draws on the given Axes or on a new
figure, and returns the Axes (`latency_comparison`, which draws several, returns the Figure).
Times on the x axis are seconds for whole-run plots and milliseconds for the pass window and the
swimlanes. matplotlib is imported inside the functions, so `import servesim` stays light; the model
itself never plots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from servesim.metrics.recorder import COMPLETED
from servesim.metrics.summary import nearest_rank

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from servesim.sim import Result

# pass kinds of `pass_timeline` on aggregated workers, in legend order, with their colours
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
    passes = _table(source, "passes")
    lanes = _lanes(source, passes)
    ax = _axes(ax, (11, 1.2 + 1.4 * len(lanes)))
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


def pool_role(pool: str) -> str:
    """The role of a KV pool from its dotted name: `cluster.p0` (prefill), `cluster.d1.r0`
    (decode), `cluster.w0` (aggregated)."""
    parts = str(pool).split(".")
    worker = parts[1] if len(parts) > 1 else ""
    if worker[:1] == "p" and worker[1:].isdigit():
        return "prefill"
    if worker[:1] == "d" and worker[1:].isdigit():
        return "decode"
    return "aggregated"


def pool_capacities(result: Result) -> dict[str, int]:
    """KV blocks per pool (one rank) of each role, from the summary's metadata:
    `num_gpu_blocks` is the aggregated or decode pools', `prefill_num_gpu_blocks` the prefill
    pools' (a run without it has no prefill pools)."""
    meta = result.summary.get("metadata", {})
    out: dict[str, int] = {}
    if meta.get("num_gpu_blocks") is not None:
        blocks = int(meta["num_gpu_blocks"])
        out["aggregated"] = out["decode"] = blocks
    if meta.get("prefill_num_gpu_blocks") is not None:
        out["prefill"] = int(meta["prefill_num_gpu_blocks"])
    return out


def kv_occupancy(
    source: Result | pd.DataFrame,
    ax: Axes | None = None,
    *,
    capacity_blocks: int | None = None,
) -> Axes:
    """Used and cached blocks of each KV pool over time, as steps (a level holds until the next
    record; before the first record it is 0). Pools are in the order prefill, decode,
    aggregated.

    Used blocks are held by running requests; cached blocks are held by none and stay for prefix
    reuse until evicted, so they climb towards the capacity and stay there. In a disaggregated
    cluster a prefill pool's used blocks include the KV it holds for requests in handoff (until
    the decode side has it). The capacity line is each pool's configured size when a `Result` is
    given (one line per role when prefill and decode pools differ), or `capacity_blocks`.
    """
    ax = _axes(ax, (9, 4))
    kv = _table(source, "kv")
    pools = sorted(kv["pool"].unique(), key=lambda p: (ROLE_ORDER.index(pool_role(p)), p))
    roles = list(dict.fromkeys(pool_role(p) for p in pools))
    if capacity_blocks is not None:
        capacities = dict.fromkeys(roles, capacity_blocks)
    elif isinstance(source, pd.DataFrame):
        capacities = {}
    else:
        known = pool_capacities(source)
        capacities = {role: known[role] for role in roles if role in known}
    many_tiers = kv["tier"].nunique() > 1
    groups = kv.groupby(["pool", "tier"], sort=True)
    keys = sorted(groups.groups, key=lambda k: (pools.index(k[0]), k[1]))
    for i, (pool, tier) in enumerate(keys):
        g = groups.get_group((pool, tier))
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
    if len(set(capacities.values())) == 1:
        (blocks,) = set(capacities.values())
        ax.axhline(blocks, color="grey", linestyle=":", label="capacity per pool")
    else:
        for (role, blocks), style in zip(capacities.items(), (":", "-.", "--"), strict=False):
            ax.axhline(blocks, color="grey", linestyle=style, label=f"capacity per {role} pool")
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

    TPOT of a request is (last - first token) / (tokens - 1), the `tpot_ms` column. With a
    `Result` that kept token times (`output.per_token`), every inter-token gap of the completed
    requests is drawn too: the pooled ITL, whose tail shows decode steps stretched by prefill
    chunks.
    """
    if kind not in ("cdf", "hist"):
        raise ValueError(f"kind must be 'cdf' or 'hist', not {kind!r}")
    ax = _axes(ax, (7, 4))
    done = _completed(_table(source, "requests"))
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


# the phases of a request's life in `request_swimlanes`, in order, as (start column, end
# column) for a disaggregated request and for an aggregated one (None: not a phase there)
SWIMLANE_SEGMENTS: dict[str, tuple[str, tuple[tuple[str, str] | None, tuple[str, str] | None]]] = {
    "queue": (
        "lightgrey",
        (("arrival_ms", "prefill_admit_ms"), ("arrival_ms", "first_admit_ms")),
    ),
    "prefill": (
        "tab:orange",
        (("prefill_admit_ms", "source_held_ms"), ("first_admit_ms", "first_token_ms")),
    ),
    "reservation wait": ("gold", (("source_held_ms", "destination_reserved_ms"), None)),
    "transfer": ("tab:red", (("destination_reserved_ms", "destination_activated_ms"), None)),
    "decode queue": ("tab:cyan", (("destination_activated_ms", "decode_admit_ms"), None)),
    "decode": (
        "tab:blue",
        (("decode_admit_ms", "last_token_ms"), ("first_token_ms", "last_token_ms")),
    ),
}


def swimlane_segments(requests: pd.DataFrame) -> pd.DataFrame:
    """The phases of each request's life, one row per (request, phase) whose two ends are known
    and apart, with columns request_id, segment, start_ms, end_ms.

    A disaggregated request (one with a prefill worker): queue (arrival -> prefill admission),
    prefill (-> its KV held on the prefill worker), reservation wait (-> a decode rank reserved
    KV for it), transfer (-> the decode worker activated it: the link's time plus the wait for
    the decode pass in flight to end), decode queue (-> decode admission), decode (-> last
    token; its first pass makes the first token). An aggregated request: queue (arrival ->
    first admission), prefill (-> first token), decode (-> last token).
    """
    pd_request = requests["prefill_worker_idx"].notna().to_numpy()
    rows = []
    for name, (_, (disagg, aggregated)) in SWIMLANE_SEGMENTS.items():
        for spans, sel in ((disagg, pd_request), (aggregated, ~pd_request)):
            if spans is None or not sel.any():
                continue
            part = requests[sel]
            start = part[spans[0]].to_numpy(dtype=float)
            end = part[spans[1]].to_numpy(dtype=float)
            keep = end > start  # NaN compares False: phases not reached are left out
            rows.append(
                pd.DataFrame(
                    {
                        "request_id": part["request_id"].to_numpy()[keep],
                        "segment": name,
                        "start_ms": start[keep],
                        "end_ms": end[keep],
                    }
                )
            )
    if not rows:
        return pd.DataFrame(columns=["request_id", "segment", "start_ms", "end_ms"])
    return pd.concat(rows, ignore_index=True)


def request_swimlanes(
    source: Result | pd.DataFrame,
    request_ids: list[str] | None = None,
    n: int = 20,
    ax: Axes | None = None,
    *,
    align: str = "absolute",
) -> Axes:
    """One horizontal lane per request, cut into the phases of `swimlane_segments`, with a tick
    at its first token (so TTFT is the stretch from the lane's start to the tick).

    `request_ids` picks the requests, top to bottom; else the first `n` to arrive.
    `align="absolute"` draws run time; `align="arrival"` starts every lane at 0 (time since its
    arrival), so the phases of different requests line up: zoom on TTFT with
    `ax.set_xlim(0, ...)`.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if align not in ("absolute", "arrival"):
        raise ValueError(f"align must be 'absolute' or 'arrival', not {align!r}")
    requests = _table(source, "requests")
    if request_ids is None:
        arrived = requests[requests["arrival_ms"].notna()]
        chosen = arrived.sort_values("arrival_ms", kind="stable").head(n)
    else:
        by_id = requests.set_index("request_id", drop=False)
        missing = [r for r in request_ids if r not in by_id.index]
        if missing:
            raise KeyError(f"no such requests: {missing}")
        chosen = by_id.loc[list(request_ids)].reset_index(drop=True)
    ids = chosen["request_id"].tolist()
    ax = _axes(ax, (11, 1.0 + 0.3 * max(len(ids), 1)))
    lane_of = {r: i for i, r in enumerate(ids)}
    origin = dict.fromkeys(ids, 0.0)
    if align == "arrival":
        origin = dict(zip(ids, chosen["arrival_ms"].astype(float), strict=True))

    segments = swimlane_segments(chosen)
    handles: list[Any] = []
    for name, (colour, _) in SWIMLANE_SEGMENTS.items():
        part = segments[segments["segment"] == name]
        if not len(part):
            continue
        shift = part["request_id"].map(origin).to_numpy(dtype=float)
        start = part["start_ms"].to_numpy(dtype=float) - shift
        ax.barh(
            part["request_id"].map(lane_of).to_numpy(dtype=float),
            part["end_ms"].to_numpy(dtype=float) - part["start_ms"].to_numpy(dtype=float),
            left=start,
            height=0.6,
            color=colour,
            edgecolor="none",
            label=name,
        )
        handles.append(Patch(color=colour, label=name))
    first = chosen["first_token_ms"].to_numpy(dtype=float)
    has_token = ~np.isnan(first)
    if has_token.any():
        shift = np.array([origin[r] for r in ids])
        y = np.arange(len(ids), dtype=float)
        ax.plot(
            (first - shift)[has_token],
            y[has_token],
            linestyle="none",
            marker="|",
            color="black",
            markersize=10,
        )
        handles.append(
            Line2D([], [], linestyle="none", marker="|", color="black", label="first token")
        )
    ax.set_yticks(range(len(ids)))
    ax.set_yticklabels(ids)
    ax.set_ylim(len(ids) - 0.5, -0.5)  # first request on top
    ax.set_xlabel("time since arrival (ms)" if align == "arrival" else "time (ms)")
    ax.set_title(f"Request lifecycles ({len(ids)} requests)")
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", frameon=False
    )
    ax.grid(True, axis="x", alpha=0.3)
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
    fraction of gaps at least x ms long, on a log scale, with p99 and the longest gap.
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
            x = np.sort(_completed(result.requests)[column].dropna().to_numpy(dtype=float))
            if not len(x):
                continue
            label = f"{name}: p50 {nearest_rank(x, 50):,.1f}, p90 {nearest_rank(x, 90):,.1f} ms"
            y = np.arange(1, len(x) + 1) / len(x)
            ax.step(x, y, where="post", color=f"C{i}", label=label)
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
    if with_gaps:
        ax = axes[2]
        for i, (name, result) in enumerate(results.items()):
            done = _completed(result.requests)["request_id"]
            gaps = [np.diff(result.token_times[r]) for r in done if r in result.token_times]
            x = np.sort(np.concatenate(gaps)) if gaps else np.empty(0)
            if not len(x):
                continue
            label = f"{name}: p99 {nearest_rank(x, 99):,.1f}, max {x[-1]:,.1f} ms"
            # the fraction of gaps >= x: from 1 down to 1/n, so it stays on a log scale
            y = (len(x) - np.arange(len(x))) / len(x)
            ax.step(x, y, where="post", color=f"C{i}", label=label)
        ax.set_yscale("log")
        ax.set_ylabel("fraction of gaps >= x")
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


# ---------------------------------------------------------------- agentic replay

# a session is a sub-agent's when its id carries this mark (the synthetic generator's
# `play{p}:sub{k}`, kept inside snapshot instances' `PLAY@laneL.K/play{p}:sub{k}`)
SUBAGENT_MARK = ":sub"
# `lane_timeline`: a play's span coloured by how it settled, and what its requests' bars are
PLAY_STATUS_COLOURS = {"completed": "#d6e6f5", "failed": "#f5d0d0", "incomplete": "#e4e4e4"}
CALL_KINDS = {
    "main agent call": "tab:blue",
    "sub-agent call": "tab:orange",
    "preparation (primer / warmup)": "tab:purple",
}
TOOL_WAIT = "tool wait"
# a lane's row spans [row - 0.5, row + 0.5]: the play span fills most of it, main-agent calls
# sit in the top band, sub-agent sessions share the band below (one level per overlapping
# session), the play's name goes at the bottom
PLAY_SPAN = (-0.45, 0.45)
MAIN_BAND = (-0.40, -0.12)
SUB_BAND = (-0.08, 0.26)
PLAY_LABEL_Y = 0.36


def _agentic_requests(source: Result | pd.DataFrame) -> pd.DataFrame:
    """The requests table of an agentic run (one with a `play_id` column), else ValueError."""
    requests = _table(source, "requests")
    if "play_id" not in requests:
        raise ValueError(
            "not an agentic run: the requests table has no play_id column "
            "(run an agentic workload, e.g. workload=agentic_synthetic)"
        )
    return requests


def is_subagent(session_ids: pd.Series) -> np.ndarray:
    """Whether each request's session is a sub-agent's (its id contains `SUBAGENT_MARK`)."""
    return session_ids.fillna("").astype(str).str.contains(SUBAGENT_MARK, regex=False).to_numpy()


def _preparation(requests: pd.DataFrame) -> np.ndarray:
    """Whether each request prepared a lane (a warm run's primer or warmup request): those are
    in no measured metric."""
    from servesim.agentic.report import PREPARATION

    return requests["phase"].isin(PREPARATION).to_numpy()


def _levels(spans: list[tuple[float, float]]) -> list[int]:
    """A level per span (in the given order) such that spans on one level never overlap: each
    takes the lowest level free at its start."""
    free_at: list[float] = []
    out = []
    for start, end in spans:
        level = next((k for k, t in enumerate(free_at) if t <= start), len(free_at))
        if level == len(free_at):
            free_at.append(end)
        else:
            free_at[level] = end
        out.append(level)
    return out


def lane_timeline(result: Result, ax: Axes | None = None, *, label_plays: bool = True) -> Axes:
    """What every agent lane did over the run, one row per lane (per play when the replay ran
    without lanes), x in seconds.

    Each play on the lane is a light span from its start to its settle, coloured by its status.
    Inside it, each of its LLM calls is a solid bar from arrival to terminal: main-agent calls
    in the top band, sub-agent calls (sessions whose id contains `SUBAGENT_MARK`) in the band
    below, one level per sub-agent session that overlaps another. The gaps between a session's
    consecutive calls (the previous call's terminal to the next call's arrival) are hatched
    "tool wait": the recorded tool time, plus, for a main turn that joins a blocking sub-agent,
    the wait for that sub-agent. A warm run's primer and warmup requests are drawn in the main
    band before the barrier, which is a vertical line: every lane's first play starts there.
    Requests that were never dispatched have no bar. `label_plays` writes each play's id at the
    start of its span.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    requests = _agentic_requests(result)
    plays = result.plays
    if not len(plays):
        raise ValueError("not an agentic run: the result has no plays table")
    no_lanes = plays["lane"].isna().all()
    row_of_play = {
        play: i if no_lanes else int(lane)
        for i, (play, lane) in enumerate(zip(plays["play_id"], plays["lane"], strict=True))
    }
    rows = sorted(set(row_of_play.values()))
    row_labels = list(plays["play_id"]) if no_lanes else [f"lane {lane}" for lane in rows]
    y_of_row = {row: i for i, row in enumerate(rows)}
    ax = _axes(ax, (12, 1.2 + 0.9 * len(rows)))

    sent = requests[requests["arrival_ms"].notna() & requests["terminal_ms"].notna()]
    sent = sent[sent["play_id"].isin(row_of_play)].sort_values(
        ["arrival_ms", "request_id"], kind="stable"
    )
    sub = is_subagent(sent["session_id"])
    preparation = _preparation(sent)
    # sub-agent sessions get levels in their lane's sub band by their spans
    sessions = sent[sub & ~preparation].groupby(["play_id", "session_id"], sort=False)
    span = sessions.agg(start=("arrival_ms", "min"), end=("terminal_ms", "max"))
    span_rows = span.index.get_level_values("play_id").map(row_of_play)
    level_of: dict[tuple[str, str], int] = {}
    for _, lane_sessions in span.groupby(span_rows.to_numpy(), sort=False):
        ordered = lane_sessions.sort_values("start", kind="stable")
        spans = list(zip(ordered["start"], ordered["end"], strict=True))
        level_of.update(zip(ordered.index, _levels(spans), strict=True))
    n_levels = max(level_of.values(), default=0) + 1
    level_height = (SUB_BAND[1] - SUB_BAND[0]) / n_levels

    def band(play: str, session: str, is_sub: bool) -> tuple[float, float]:
        """Offset of a bar's centre from its row, and the bar's height."""
        if not is_sub:
            return (MAIN_BAND[0] + MAIN_BAND[1]) / 2, MAIN_BAND[1] - MAIN_BAND[0]
        top = SUB_BAND[0] + level_of[play, session] * level_height
        return top + level_height / 2, 0.85 * level_height

    handles: list[Any] = []
    settle = plays["settled_at_ms"].fillna(plays["last_terminal_ms"]).to_numpy(dtype=float)
    start = plays["started_ms"].to_numpy(dtype=float)
    play_y = np.array([y_of_row[row_of_play[p]] for p in plays["play_id"]], dtype=float)
    for status, colour in PLAY_STATUS_COLOURS.items():
        sel = (plays["status"] == status).to_numpy() & ~np.isnan(settle)
        if sel.any():
            ax.barh(
                play_y[sel] + (PLAY_SPAN[0] + PLAY_SPAN[1]) / 2,
                (settle - start)[sel] / 1000.0,
                left=start[sel] / 1000.0,
                height=PLAY_SPAN[1] - PLAY_SPAN[0],
                color=colour,
                edgecolor="grey",
                linewidth=0.5,
                label=f"play ({status})",
            )
            handles.append(Patch(facecolor=colour, edgecolor="grey", label=f"play ({status})"))

    offsets = [
        band(p, s, b)
        for p, s, b in zip(sent["play_id"], sent["session_id"], sub & ~preparation, strict=True)
    ]
    y = np.array([y_of_row[row_of_play[p]] for p in sent["play_id"]], dtype=float)
    centre = y + np.array([o[0] for o in offsets])
    height = np.array([o[1] for o in offsets])
    arrival = sent["arrival_ms"].to_numpy(dtype=float) / 1000.0
    terminal = sent["terminal_ms"].to_numpy(dtype=float) / 1000.0

    # tool waits: between consecutive measured calls of one session
    measured = ~preparation
    waits = []
    for _, idx in sent[measured].groupby(["play_id", "session_id"], sort=False).indices.items():
        pos = np.flatnonzero(measured)[idx]
        for a, b in zip(pos[:-1], pos[1:], strict=True):
            if arrival[b] > terminal[a]:
                waits.append((centre[a], height[a], terminal[a], arrival[b] - terminal[a]))
    if waits:
        wy, wh, wx, ww = (np.array(col) for col in zip(*waits, strict=True))
        ax.barh(
            wy,
            ww,
            left=wx,
            height=wh,
            facecolor="whitesmoke",
            edgecolor="grey",
            hatch="////",
            linewidth=0,
            label=TOOL_WAIT,
        )

    kinds = np.select(
        [preparation, sub], ["preparation (primer / warmup)", "sub-agent call"], "main agent call"
    )
    for kind, colour in CALL_KINDS.items():
        sel = kinds == kind
        if sel.any():
            ax.barh(
                centre[sel],
                (terminal - arrival)[sel],
                left=arrival[sel],
                height=height[sel],
                color=colour,
                edgecolor="white",  # back-to-back calls (a lane's warmup) stay apart
                linewidth=0.4,
                label=kind,
            )
            handles.append(Patch(color=colour, label=kind))
    if waits:
        handles.append(
            Patch(facecolor="whitesmoke", edgecolor="grey", hatch="////", label=TOOL_WAIT)
        )

    phases = result.summary.get("metadata", {}).get("agentic_phases") or {}
    if phases.get("warmup") and phases.get("profile_start_ms") is not None:
        barrier_s = float(phases["profile_start_ms"]) / 1000.0
        ax.axvline(barrier_s, color="black", linestyle="--", lw=1, label="barrier")
        handles.append(Line2D([], [], color="black", linestyle="--", lw=1, label="barrier"))

    if label_plays:
        for p, x, yy in zip(plays["play_id"], start, play_y, strict=True):
            if not np.isnan(x):
                ax.text(
                    x / 1000.0,
                    yy + PLAY_LABEL_Y,
                    f" {p}",
                    ha="left",
                    va="center",
                    fontsize=7,
                    clip_on=True,
                )

    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(row_labels)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first lane on top
    ax.set_xlabel("time (s)")
    ax.set_title(f"Agent lanes ({len(plays)} plays, {len(sent)} LLM calls dispatched)")
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0, 1.06),
        ncols=min(len(handles), 4),
        fontsize="small",
        frameon=False,
    )
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def _measured_completed(source: Result | pd.DataFrame) -> pd.DataFrame:
    """An agentic run's completed requests that count in the metrics (no primer or warmup)."""
    requests = _agentic_requests(source)
    done = requests[(requests["terminal_status"] == COMPLETED) & ~_preparation(requests)]
    return done.sort_values(["arrival_ms", "request_id"], kind="stable")


def main_sessions(requests: pd.DataFrame) -> pd.Series:
    """Each play's main session: of its sessions that are not a sub-agent's, the one with the
    most requests (ties: the first to arrive). Indexed by play_id, in the order the plays'
    sessions first arrived (for a table sorted by arrival)."""
    own = requests[~is_subagent(requests["session_id"]) & requests["session_id"].notna()]
    counts = own.groupby(["play_id", "session_id"], sort=False).size().rename("n").reset_index()
    # groupby keeps first-arrival order (the table is sorted by arrival), so a stable sort on
    # the count leaves ties in that order
    first = counts.sort_values("n", ascending=False, kind="stable").drop_duplicates("play_id")
    # back in first-arrival order of the plays
    return first.set_index("play_id")["session_id"].reindex(counts["play_id"].unique())


def context_growth(
    source: Result | pd.DataFrame,
    ax: Axes | None = None,
    *,
    plays: list[str] | None = None,
) -> Axes:
    """How each play's context grows: the input tokens of its main session's completed calls
    by turn index (solid, dots), and how many of them were reused from the prefix cache (G1 or
    G2; dashed, crosses), one colour per play.

    An agent's turn k+1 re-reads turn k's whole input, its output and a tool's output, so the
    input climbs turn after turn while the reused part trails it by roughly the new tokens; a
    turn whose prefix was evicted falls towards 0 reused. `plays` picks the plays (in the
    legend's order); by default every play, in the order they first arrived. The main session
    is `main_sessions`' pick; preparation requests of a warm run are left out.
    """
    import matplotlib as mpl
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    done = _measured_completed(source)
    mains = main_sessions(done)
    chosen = list(mains.index) if plays is None else list(plays)
    missing = [p for p in chosen if p not in mains.index]
    if missing:
        raise KeyError(f"no completed main-session calls for plays {missing}")
    ax = _axes(ax, (9, 4.5))
    colours = mpl.colormaps["tab20" if len(chosen) > 10 else "tab10"]
    handles: list[Any] = [
        Line2D([], [], color="black", marker="o", markersize=4, label="input tokens"),
        Line2D(
            [], [], color="black", marker="x", linestyle="--", markersize=5, label="reused tokens"
        ),
    ]
    for i, play in enumerate(chosen):
        calls = done[(done["play_id"] == play) & (done["session_id"] == mains[play])]
        calls = calls.sort_values("turn_index", kind="stable")
        turn = calls["turn_index"].to_numpy(dtype=float)
        colour = colours(i % colours.N)
        (line,) = ax.plot(
            turn,
            calls["input_length"].to_numpy(dtype=float),
            color=colour,
            marker="o",
            markersize=4,
            lw=1.4,
            label=str(play),
        )
        ax.plot(
            turn,
            calls["reused_input_tokens"].to_numpy(dtype=float),
            color=colour,
            marker="x",
            markersize=5,
            lw=1,
            linestyle="--",
            label=f"_{play} reused",
        )
        handles.append(line)
    ax.set_xlabel("turn index (main session)")
    ax.set_ylabel("tokens")
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"Context growth per play ({len(chosen)} plays, main sessions)")
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", frameon=False
    )
    ax.grid(True, alpha=0.3)
    return ax


def reuse_per_turn(source: Result | pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Per turn index, the mean fraction of a completed call's input tokens that was reused
    from G1 (device HBM: `g1_reused_input_tokens / input_length`) and from G2 (host memory:
    `host_reused_input_tokens / input_length`), as stacked bars, over every session (main and
    sub-agent) of the measured requests. The number above a bar is how many calls it averages.

    The rest of each bar's height up to 1 was prefilled. A first turn reuses at most the shared
    system prompt; later turns reuse their session's previous context, from G1 while it is
    still there and from G2 once G1 has evicted it (when the run has a host pool).
    """
    done = _measured_completed(source)
    ax = _axes(ax, (9, 4))
    n_in = done["input_length"].to_numpy(dtype=float)
    frac = pd.DataFrame(
        {
            "turn": done["turn_index"].to_numpy(),
            "g1": done["g1_reused_input_tokens"].to_numpy(dtype=float) / n_in,
            "g2": done["host_reused_input_tokens"].fillna(0).to_numpy(dtype=float) / n_in,
        }
    )
    per_turn = frac.groupby("turn").agg(g1=("g1", "mean"), g2=("g2", "mean"), n=("g1", "size"))
    turns = per_turn.index.to_numpy(dtype=float)
    g1 = per_turn["g1"].to_numpy(dtype=float)
    g2 = per_turn["g2"].to_numpy(dtype=float)
    ax.bar(turns, g1, width=0.8, color="tab:blue", label="G1 (device) hit")
    ax.bar(turns, g2, width=0.8, bottom=g1, color="tab:green", label="G2 (host) hit")
    for x, top, n in zip(turns, g1 + g2, per_turn["n"], strict=True):
        ax.text(x, top + 0.01, str(n), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(turns)
    ax.set_xticklabels([str(int(t)) for t in turns])
    ax.set_xlabel("turn index")
    ax.set_ylabel("mean fraction of input tokens reused")
    ax.set_ylim(0, 1.2)
    hit = done["reused_input_tokens"].sum() / done["input_length"].sum() if len(done) else np.nan
    ax.set_title(f"Prefix reuse per turn ({len(done)} calls, {hit:.1%} of input tokens reused)")
    ax.legend(loc="upper right", ncols=2, fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    return ax
