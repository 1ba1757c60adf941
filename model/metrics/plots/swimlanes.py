"""Request swimlanes: one lane per request, cut into the phases of its life (P/D handoff too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from servesim.metrics.plots._common import axes_or_new, source_table

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from servesim.sim import Result

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
    requests = source_table(source, "requests")
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
    ax = axes_or_new(ax, (11, 1.0 + 0.3 * max(len(ids), 1)))
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
