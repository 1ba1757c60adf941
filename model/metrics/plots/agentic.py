"""Agentic replay plots: agent lanes over time, context growth per play, prefix reuse per turn."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from servesim.metrics.plots._common import axes_or_new, source_table
from servesim.metrics.recorder import COMPLETED

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from servesim.sim import Result


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
    requests = source_table(source, "requests")
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
    ax = axes_or_new(ax, (12, 1.2 + 0.9 * len(rows)))

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
    ax = axes_or_new(ax, (9, 4.5))
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
    ax = axes_or_new(ax, (9, 4))
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
