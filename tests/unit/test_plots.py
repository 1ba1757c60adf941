"""The plot helpers of `servesim.metrics.plots` on small simulated runs, with the Agg backend.

Behaviour, not pixels: each helper returns the Axes (or Figure) it drew on and draws the artists
its tables imply (one bar per pass overlapping the Gantt window, coloured by pass kind or by P/D
role and labelled with its decoding sequences; one step line per pool and level; one CDF per
latency series and run; one bar per phase of a request's life, as long as the phase). The P/D
tests use a 1P1D run with fixed timing and a 1 GB/s link, so lifecycle phases have exact
lengths. The agentic plots use four generated plays on two lanes with fixed timing: one play
span per play on its lane's row, one bar per dispatched call and per gap between a session's
calls, one pair of lines per play, one stacked G1/G2 bar per turn index.
"""

from __future__ import annotations

import subprocess
import sys

import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from conftest import make_config, write_jsonl  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from servesim import Result, simulate  # noqa: E402
from servesim.metrics import plots  # noqa: E402


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
    """Plotting stays out of `import servesim` (and of importing the plots module itself)."""
    code = "import sys, servesim, servesim.metrics.plots; assert 'matplotlib' not in sys.modules"
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


def cdf_points(line) -> tuple[np.ndarray, np.ndarray]:
    """The (sample, fraction of samples at or below it) points of an `Axes.ecdf` line, which
    opens at (shortest sample, 0)."""
    x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    assert x[0] == x[1] and y[0] == 0
    return x[1:], y[1:]


def test_itl_distribution_cdfs(result):
    ax = plots.itl_distribution(result)
    labels = [line.get_label() for line in ax.get_lines()]
    assert [s.split(":")[0] for s in labels] == ["TPOT per request", "TTFT", "ITL (every gap)"]
    done = result.requests[result.requests["terminal_status"] == "completed"]
    tpot, ttft, itl = ax.get_lines()
    np.testing.assert_allclose(cdf_points(ttft)[0], np.sort(done["ttft_ms"].dropna()))
    assert len(cdf_points(itl)[0]) == (done["output_length"] - 1).sum()
    for line in (tpot, ttft, itl):
        _, y = cdf_points(line)
        assert y[-1] == 1.0 and (np.diff(y) > 0).all()
    median = result.summary["median_ttft_ms"]
    assert f"p50 {median:,.1f}" in labels[1]


def test_itl_distribution_hist_and_table_only(result):
    ax = plots.itl_distribution(result.requests, kind="hist")
    assert len(ax.get_lines()) == 0 and len(ax.patches) > 0
    assert len(ax.get_legend().get_texts()) == 2  # no token times: no pooled ITL
    with pytest.raises(ValueError, match="kind"):
        plots.itl_distribution(result, kind="violin")


# ---------------------------------------------------------------- P/D (1P1D, fixed timing)

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}


def trace_row(t: float, n_in: int, n_out: int, first_block: int) -> dict:
    return {
        "timestamp": t,
        "input_length": n_in,
        "output_length": n_out,
        "hash_ids": list(range(first_block, first_block + -(-n_in // 64))),
    }


# four prompts on one prefill worker (10 ms per pass): 2 and 3 arrive while a pass runs and
# queue; a 20-block decode pool cannot hold 3 (16 blocks) beside 1 and 2, so it waits for a
# reservation, and so does 4 behind it; the 1 GB/s link moves 131,072 B per token
PD_TRACE = [
    trace_row(0, 512, 8, 0),
    trace_row(5, 256, 6, 100),
    trace_row(12, 1024, 4, 200),
    trace_row(40, 384, 5, 300),
]


def pd_config(path: str, **sections):
    return make_config(
        workload={"kind": "mooncake", "path": path, "trace_block_size": 64},
        timing=FIXED,
        link={"bandwidth_gbps": 1.0},
        output={"progress": "off", "per_token": True},
        **sections,
    )


@pytest.fixture(scope="module")
def pd_trace(tmp_path_factory) -> str:
    return str(write_jsonl(tmp_path_factory.mktemp("pd") / "trace.jsonl", PD_TRACE))


@pytest.fixture(scope="module")
def pd_result(pd_trace) -> Result:
    """1P1D; the decode pool holds 20 blocks of 64 tokens, the prefill pool 16,384."""
    return simulate(
        pd_config(pd_trace, topology={"kind": "disagg", "decode": {"num_gpu_blocks": 20}})
    )


@pytest.fixture(scope="module")
def agg_result(pd_trace) -> Result:
    """The same trace on one aggregated worker."""
    return simulate(pd_config(pd_trace, topology={"num_workers": 1}))


def segment_bars(ax) -> dict[str, list[Rectangle]]:
    return {c.get_label(): list(c.patches) for c in ax.containers}


def test_pd_run_has_every_handoff_phase(pd_result):
    """The scenario the swimlane tests rely on: queueing, reservation waits and transfers."""
    r = pd_result.requests.set_index("request_id")
    assert list(r["prefill_admit_ms"] - r["arrival_ms"]) == [0, 5, 8, 0]
    assert list(r["destination_reserved_ms"] > r["source_held_ms"]) == [False, False, True, True]
    transfer = r["destination_activated_ms"] - r["destination_reserved_ms"]
    assert transfer["1"] == pytest.approx(512 * 131_072 / 1e6)


def test_request_swimlanes_segments_have_the_lifecycle_lengths(pd_result):
    """Each phase is one bar on its request's lane, from one lifecycle column to the next:
    queue (arrival -> prefill admission), prefill (-> source held), reservation wait (->
    reserved), transfer (-> activated), decode (decode admission -> last token). Zero-length
    phases (no decode queue here) are not drawn."""
    r = pd_result.requests
    ax = plots.request_swimlanes(pd_result)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "3", "4"]
    drawn = segment_bars(ax)
    assert list(drawn) == ["queue", "prefill", "reservation wait", "transfer", "decode"]
    spans = {
        "queue": ("arrival_ms", "prefill_admit_ms"),
        "prefill": ("prefill_admit_ms", "source_held_ms"),
        "reservation wait": ("source_held_ms", "destination_reserved_ms"),
        "transfer": ("destination_reserved_ms", "destination_activated_ms"),
        "decode": ("decode_admit_ms", "last_token_ms"),
    }
    for name, (start, end) in spans.items():
        want = sorted(
            (lane, s, e - s)
            for lane, (s, e) in enumerate(zip(r[start], r[end], strict=True))
            if e > s
        )
        got = sorted(
            (round(b.get_y() + b.get_height() / 2), b.get_x(), b.get_width()) for b in drawn[name]
        )
        assert [g[0] for g in got] == [w[0] for w in want], name
        np.testing.assert_allclose([g[1:] for g in got], [w[1:] for w in want], err_msg=name)
    # the transfer bars are the link's time (activation here never waits for a decode pass)
    t = pd_result.transfers.set_index("request_id").loc[r["request_id"]]
    widths = sorted(b.get_width() for b in drawn["transfer"])
    np.testing.assert_allclose(widths, sorted(t["end_ms"] - t["start_ms"]))
    # phases tile each lane from arrival to last token
    total = sum(b.get_width() for bars_ in drawn.values() for b in bars_)
    assert total == pytest.approx((r["last_token_ms"] - r["arrival_ms"]).sum())
    (ticks,) = ax.get_lines()
    np.testing.assert_allclose(ticks.get_xdata(), r["first_token_ms"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [*drawn, "first token"]


def test_request_swimlanes_pick_and_align(pd_result):
    """`request_ids` picks and orders the lanes; `align="arrival"` starts each at 0, so a
    first-token tick sits at the request's TTFT; `n` keeps the first arrivals."""
    r = pd_result.requests.set_index("request_id")
    ax = plots.request_swimlanes(pd_result, ["4", "1"], align="arrival")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["4", "1"]
    np.testing.assert_allclose(ax.get_lines()[0].get_xdata(), r.loc[["4", "1"], "ttft_ms"])
    queue = segment_bars(ax)["prefill"]
    assert sorted(b.get_x() for b in queue) == [0.0, 0.0]  # neither queued
    assert "time since arrival" in ax.get_xlabel()
    ax = plots.request_swimlanes(pd_result.requests, n=2)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
    with pytest.raises(KeyError, match="nope"):
        plots.request_swimlanes(pd_result, ["nope"])
    with pytest.raises(ValueError, match="align"):
        plots.request_swimlanes(pd_result, align="end")


def test_request_swimlanes_aggregated_requests(agg_result):
    """An aggregated request: queue (arrival -> first admission), prefill (-> first token),
    decode (-> last token)."""
    r = agg_result.requests
    ax = plots.request_swimlanes(agg_result)
    drawn = segment_bars(ax)
    assert list(drawn) == ["queue", "prefill", "decode"]
    np.testing.assert_allclose(
        sorted(b.get_x() + b.get_width() for b in drawn["prefill"]), sorted(r["first_token_ms"])
    )
    np.testing.assert_allclose(
        sorted(b.get_width() for b in drawn["decode"]),
        sorted(r["last_token_ms"] - r["first_token_ms"]),
    )


def test_pass_timeline_colours_pd_passes_by_role_and_rows_by_pool(pd_result):
    p = pd_result.passes
    t1 = p["end_ms"].max()
    ax = plots.pass_timeline(pd_result, 0.0, t1)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["p0", "d0"]
    drawn = bars(ax)
    assert len(drawn) == len(p)
    for role, colour in (("prefill", "prefill worker"), ("decode", "decode worker")):
        mine = [b for b in drawn if b.get_facecolor() == to_rgba(plots.ROLE_KINDS[colour])]
        assert len(mine) == (p["role"] == role).sum() > 0
        # prefill on the top row (0), decode below (1)
        assert {round(b.get_y()) for b in mine} == {0 if role == "prefill" else 1}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["prefill worker", "decode worker", "arrival -> first token"]
    # arrivals are marked on the prefill worker's row, each with a line to its first token
    arrivals = ax.get_lines()[0]
    np.testing.assert_allclose(np.sort(arrivals.get_xdata()), pd_result.requests["arrival_ms"])
    assert all(-0.5 < y < 0 for y in arrivals.get_ydata())


def test_pass_category():
    passes = pd.DataFrame(
        {
            "role": ["aggregated", "aggregated", "prefill", "decode", "decode"],
            "prefill_seqs": [1, 1, 2, 0, 1],
            "decode_seqs": [0, 3, 0, 4, 4],
        }
    )
    assert list(plots.pass_category(passes)) == [
        "prefill-only",
        "mixed",
        "prefill worker",
        "decode worker",
        "decode worker, recompute",
    ]
    # a table without roles is an aggregated cluster's
    assert list(plots.pass_category(passes.drop(columns="role"))[:2]) == ["prefill-only", "mixed"]


def test_pass_timeline_labels_ranks_when_a_pool_has_several(pd_trace):
    """Decode workers with two DP ranks: one row per rank (`d0.r0`, `d0.r1`), the prefill pool
    (one rank) stays `p0`; every configured rank has a row even if it never ran a pass."""
    result = simulate(
        pd_config(
            pd_trace, topology={"kind": "disagg", "num_decode_workers": 2, "decode": {"dp_size": 2}}
        )
    )
    ax = plots.pass_timeline(result, 0.0, 50.0)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["p0", "d0.r0", "d0.r1", "d1.r0", "d1.r1"]


def test_kv_occupancy_pd_pools_and_capacities(pd_result):
    """Prefill pools first; each role's capacity from the metadata (prefill_num_gpu_blocks for
    the prefill pool, num_gpu_blocks for the decode pool), one line each when they differ."""
    meta = pd_result.summary["metadata"]
    assert (meta["prefill_num_gpu_blocks"], meta["num_gpu_blocks"]) == (16384, 20)
    ax = plots.kv_occupancy(pd_result)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == [
        "cluster.p0 used",
        "cluster.p0 cached",
        "cluster.d0 used",
        "cluster.d0 cached",
        "capacity per prefill pool",
        "capacity per decode pool",
    ]
    prefill_cap, decode_cap = ax.get_lines()[-2:]
    assert set(prefill_cap.get_ydata()) == {16384} and set(decode_cap.get_ydata()) == {20}
    decode_used = ax.get_lines()[2]
    assert max(decode_used.get_ydata()) <= 20
    assert plots.pool_role("cluster.d1.r0") == "decode" and plots.pool_role("cluster.w3") == (
        "aggregated"
    )


def test_latency_comparison_one_line_per_run_in_each_panel(pd_result, agg_result):
    runs = {"1P1D": pd_result, "aggregated": agg_result}
    fig = plots.latency_comparison(runs)
    ttft_ax, tpot_ax, gaps_ax = fig.axes[:3]
    assert [ax.get_title() for ax in (ttft_ax, tpot_ax, gaps_ax)] == [
        "TTFT",
        "TPOT per request",
        "Inter-token gaps (tail)",
    ]
    for ax, column in ((ttft_ax, "ttft_ms"), (tpot_ax, "tpot_ms")):
        lines = ax.get_lines()
        assert [line.get_label().split(":")[0] for line in lines] == list(runs)
        for line, result in zip(lines, runs.values(), strict=True):
            x, y = cdf_points(line)
            np.testing.assert_allclose(x, np.sort(result.requests[column]))
            assert y[-1] == 1.0
    assert f"p50 {pd_result.summary['median_ttft_ms']:,.1f}" in ttft_ax.get_lines()[0].get_label()
    for line, result in zip(gaps_ax.get_lines(), runs.values(), strict=True):
        n_gaps = (result.requests["output_length"] - 1).sum()
        # the fraction of gaps longer than x: 1 before the shortest gap, 1/n up to the longest,
        # 0 from there
        x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        assert len(x) == n_gaps + 1 and x[-1] == x[-2]
        assert y[0] == 1.0 and y[-2] == pytest.approx(1 / n_gaps) and y[-1] == 0
        assert f"max {result.summary['max_itl_ms']:,.1f}" in line.get_label()
    assert gaps_ax.get_yscale() == "log" and tpot_ax.get_xscale() == "linear"


def test_latency_comparison_without_token_times_has_two_panels(pd_result, result):
    no_times = Result(**{**vars(pd_result), "token_times": {}})
    fig = plots.latency_comparison({"a": no_times, "b": result})
    assert len(fig.axes) == 2
    with pytest.raises(ValueError, match="no runs"):
        plots.latency_comparison({})


# ---------------------------------------------------------------- agentic replay

AGENTIC_PLAYS = 4


def uniform(mean: float, lo: float, hi: float) -> dict:
    return {"dist": "uniform", "mean": mean, "min": lo, "max": hi}


def agentic_config(workload: dict | None = None, **sections):
    """Four generated plays on two lanes, with fixed timing: short calls, tool waits of
    20-180 ms, a sub-agent off half the main turns (half of them blocking)."""
    return make_config(
        workload={
            "kind": "agentic_synthetic",
            "num_plays": AGENTIC_PLAYS,
            "turns_per_play": uniform(4, 3, 5),
            "system_prompt_tokens": 256,
            "first_user_tokens": uniform(300, 100, 500),
            "tool_output_tokens": uniform(200, 50, 350),
            "output_tokens": uniform(20, 5, 40),
            "tool_time_ms": uniform(100, 20, 180),
            "subagent_probability": 0.5,
            "subagent_blocking_probability": 0.5,
            "play_interval_ms": 50.0,
            "agentic_lanes": 2,
            **(workload or {}),
        },
        timing=FIXED,
        output={"progress": "off"},
        **sections,
    )


@pytest.fixture(scope="module")
def agentic_result() -> Result:
    return simulate(agentic_config(topology={"num_workers": 2}))


@pytest.fixture(scope="module")
def warm_result() -> Result:
    """The same plays cut by a snapshot, each lane primed and warmed before the barrier."""
    return simulate(
        agentic_config(
            {"agentic_snapshot": {"seed": 1}, "agentic_warmup": True},
            topology={"num_workers": 2},
        )
    )


def labelled_bars(ax) -> dict[str, list[Rectangle]]:
    return {c.get_label(): list(c.patches) for c in ax.containers}


def bar_y(b: Rectangle) -> float:
    return b.get_y() + b.get_height() / 2


def test_agentic_fixture_has_sub_agents_and_tool_waits(agentic_result):
    """The scenario the lane tests rely on: every play completes, some sessions are
    sub-agents', and consecutive calls of a session are apart (the tool time)."""
    r = agentic_result.requests
    assert len(agentic_result.plays) == AGENTIC_PLAYS
    assert set(agentic_result.plays["status"]) == {"completed"}
    assert plots.is_subagent(r["session_id"]).any() and not plots.is_subagent(r["session_id"]).all()
    assert (r["terminal_status"] == "completed").all()


def tool_waits(requests: pd.DataFrame) -> list[tuple[float, float]]:
    """(start, end) in seconds of every gap between a session's consecutive calls."""
    out = []
    for _, s in requests.groupby("session_id"):
        s = s.sort_values("arrival_ms")
        ends, starts = s["terminal_ms"].to_numpy()[:-1], s["arrival_ms"].to_numpy()[1:]
        out += [(e / 1000, a / 1000) for e, a in zip(ends, starts, strict=True) if a > e]
    return sorted(out)


def test_lane_timeline_rows_plays_calls_and_tool_waits(agentic_result):
    """One row per lane; per play a span from start to settle on its lane's row; per request
    a bar from arrival to terminal (seconds), main-agent calls above sub-agent calls within the
    row; per gap between a session's consecutive calls a tool-wait bar."""
    res = agentic_result
    p, r = res.plays, res.requests
    fig, ax = plt.subplots()
    assert plots.lane_timeline(res, ax=ax) is ax
    assert [t.get_text() for t in ax.get_yticklabels()] == ["lane 0", "lane 1"]
    drawn = labelled_bars(ax)
    assert list(drawn) == ["play (completed)", "tool wait", "main agent call", "sub-agent call"]

    spans = sorted(
        (round(bar_y(b)), b.get_x(), b.get_x() + b.get_width()) for b in drawn["play (completed)"]
    )
    want = sorted(zip(p["lane"], p["started_ms"] / 1000, p["settled_at_ms"] / 1000, strict=True))
    np.testing.assert_allclose(spans, want)

    sub = plots.is_subagent(r["session_id"])
    for name, sel in (("main agent call", ~sub), ("sub-agent call", sub)):
        got = sorted((b.get_x(), b.get_x() + b.get_width()) for b in drawn[name])
        mine = r[sel]
        np.testing.assert_allclose(
            got, sorted(zip(mine["arrival_ms"] / 1000, mine["terminal_ms"] / 1000, strict=True))
        )
    assert len(drawn["main agent call"]) + len(drawn["sub-agent call"]) == len(r)
    # within each lane's row, main calls sit above (smaller y) every sub-agent call
    for lane in (0, 1):
        main_y = [bar_y(b) - lane for b in drawn["main agent call"] if round(bar_y(b)) == lane]
        sub_y = [bar_y(b) - lane for b in drawn["sub-agent call"] if round(bar_y(b)) == lane]
        assert main_y and max(main_y) < min(sub_y, default=np.inf)

    waits = sorted((b.get_x(), b.get_x() + b.get_width()) for b in drawn["tool wait"])
    np.testing.assert_allclose(waits, tool_waits(r))
    assert sorted(t.get_text().strip() for t in ax.texts) == sorted(p["play_id"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["play (completed)", "main agent call", "sub-agent call", "tool wait"]
    assert ax.get_xlabel() == "time (s)"


def test_lane_timeline_warm_run_draws_preparation_before_the_barrier(warm_result):
    """A warm run: the primer and warmup requests are bars of their own kind, all before the
    barrier (a vertical line at profile_start_ms); every measured call starts at or after it."""
    res = warm_result
    r = res.requests
    barrier_ms = res.summary["metadata"]["agentic_phases"]["profile_start_ms"]
    assert barrier_ms > 0
    ax = plots.lane_timeline(res, label_plays=False)
    drawn = labelled_bars(ax)
    prep = drawn["preparation (primer / warmup)"]
    assert len(prep) == r["phase"].isin(["primer", "warmup"]).sum() > 0
    assert max(b.get_x() + b.get_width() for b in prep) <= barrier_ms / 1000 + 1e-12
    calls = drawn["main agent call"] + drawn.get("sub-agent call", [])
    assert len(calls) == (r["phase"] == "replay").sum()
    assert min(b.get_x() for b in calls) >= barrier_ms / 1000
    (barrier,) = ax.get_lines()
    assert list(barrier.get_xdata()) == [barrier_ms / 1000] * 2
    assert "barrier" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert not ax.texts


def test_lane_timeline_without_lanes_has_a_row_per_play():
    res = simulate(agentic_config({"agentic_lanes": None}, topology={"num_workers": 2}))
    ax = plots.lane_timeline(res)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(res.plays["play_id"])


def test_main_sessions_most_calls_first_arrival_on_ties():
    requests = pd.DataFrame(
        {
            "play_id": ["a", "a", "a", "a", "b", "b"],
            "session_id": ["a:x", "a:sub1", "a:sub1", "a:y", "b:y", "b:x"],
        }
    )
    # a: the sub-agent has the most calls but is not a candidate; x and y tie, x came first
    assert plots.main_sessions(requests).to_dict() == {"a": "a:x", "b": "b:y"}


def test_context_growth_input_and_reused_tokens_per_main_turn(agentic_result):
    """Two lines per play (input tokens, reused tokens) over its main session's turn indices;
    the legend has the two styles, then the plays in order of first arrival."""
    r = agentic_result.requests
    ax = plots.context_growth(agentic_result)
    lines = ax.get_lines()
    assert len(lines) == 2 * AGENTIC_PLAYS
    mains = r[~plots.is_subagent(r["session_id"])].sort_values(["arrival_ms", "request_id"])
    order = list(mains["play_id"].unique())
    for play, (inp, reused) in zip(order, zip(lines[::2], lines[1::2], strict=True), strict=True):
        calls = mains[mains["play_id"] == play].sort_values("turn_index")
        assert inp.get_label() == play
        np.testing.assert_array_equal(inp.get_xdata(), calls["turn_index"])
        np.testing.assert_array_equal(inp.get_ydata(), calls["input_length"])
        np.testing.assert_array_equal(reused.get_ydata(), calls["reused_input_tokens"])
        assert reused.get_linestyle() == "--" and reused.get_color() == inp.get_color()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["input tokens", "reused tokens", *order]
    ax = plots.context_growth(r, plays=order[:1])
    assert len(ax.get_lines()) == 2
    with pytest.raises(KeyError, match="nope"):
        plots.context_growth(agentic_result, plays=["nope"])


def reuse_means(requests: pd.DataFrame) -> pd.DataFrame:
    done = requests[requests["phase"] == "replay"]
    return (
        pd.DataFrame(
            {
                "g1": done["g1_reused_input_tokens"] / done["input_length"],
                "g2": done["host_reused_input_tokens"] / done["input_length"],
                "turn": done["turn_index"],
            }
        )
        .groupby("turn")[["g1", "g2"]]
        .mean()
    )


def test_reuse_per_turn_stacks_g1_and_g2_fractions():
    """On one worker with a 20-block G1 and a host pool, later turns find part of their
    context in G2: per turn index the G2 bar sits on the G1 bar, each the mean fraction of
    input tokens reused from that tier; the count over each bar is its number of calls."""
    res = simulate(
        agentic_config(
            topology={"num_workers": 1},
            engine={"num_gpu_blocks": 20},
            kv_cache={"host_offload": {"num_host_blocks": 2000}},
        )
    )
    r = res.requests
    assert r["host_reused_input_tokens"].sum() > 0
    ax = plots.reuse_per_turn(res)
    drawn = labelled_bars(ax)
    assert list(drawn) == ["G1 (device) hit", "G2 (host) hit"]
    want = reuse_means(r)
    g1, g2 = drawn.values()
    np.testing.assert_allclose([b.get_x() + b.get_width() / 2 for b in g1], want.index)
    np.testing.assert_allclose([b.get_height() for b in g1], want["g1"])
    np.testing.assert_allclose([b.get_height() for b in g2], want["g2"])
    np.testing.assert_allclose([b.get_y() for b in g2], want["g1"])
    assert max(b.get_height() for b in g2) > 0
    counts = r.groupby("turn_index").size()
    assert [t.get_text() for t in ax.texts] == [str(n) for n in counts]


def test_reuse_per_turn_leaves_out_preparation_requests(warm_result):
    r = warm_result.requests
    ax = plots.reuse_per_turn(warm_result.requests)
    g1 = labelled_bars(ax)["G1 (device) hit"]
    np.testing.assert_allclose([b.get_height() for b in g1], reuse_means(r)["g1"])
    assert sum(int(t.get_text()) for t in ax.texts) == (r["phase"] == "replay").sum()


def test_agentic_plots_reject_a_non_agentic_run(result):
    for plot in (plots.lane_timeline, plots.context_growth, plots.reuse_per_turn):
        with pytest.raises(ValueError, match="not an agentic run"):
            plot(result)
    for plot in (plots.context_growth, plots.reuse_per_turn):
        with pytest.raises(ValueError, match="not an agentic run"):
            plot(result.requests)
    # an agentic requests table without its plays table
    no_plays = Result(**{**vars(result), "requests": result.requests.assign(play_id="p")})
    with pytest.raises(ValueError, match="no plays table"):
        plots.lane_timeline(no_plays)
