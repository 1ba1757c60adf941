"""Arrival drivers end to end through `simulate`, with fixed timing so every time is closed form:
a pass with prefill work costs 10 ms and a pass with decode work 2 ms, so a lone request that
arrives at a and emits n tokens has its first token at a + 10 and its last at a + 10 + 2(n - 1).
(Spec §1.1 "Session / timing rules", §6.1, case 14.)"""

from __future__ import annotations

import pandas as pd
import pytest

from servesim import simulate

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def row(t=None, out=3, ids=(1,), **kw):
    r = {"output_length": out, "hash_ids": list(ids), "input_length": 64, **kw}
    if t is not None:
        r["timestamp"] = t
    return r


def run(config, trace, rows, load=None, workers=1) -> pd.DataFrame:
    """The requests table, indexed by request_id."""
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        topology={"num_workers": workers},
        load=load or {"kind": "trace"},
    )
    return simulate(cfg).requests.set_index("request_id")


def times(df: pd.DataFrame, *cols: str) -> dict[str, tuple]:
    return {rid: tuple(float(df.at[rid, c]) for c in cols) for rid in df.index}


def test_open_loop_replays_timestamps(config, trace):
    """Open loop: each request arrives at its timestamp minus the first one's, whether or not
    earlier requests are still running (1005 arrives while 1000 is mid-prefill)."""
    rows = [
        row(1000, ids=[1], request_id="a"),
        row(1005, ids=[2], request_id="b"),
        row(1500, ids=[3], request_id="c"),
        row(4000, ids=[4], request_id="d"),
    ]
    df = run(config, trace, rows)
    assert times(df, "arrival_ms")["b"] == (5.0,)
    got = times(df, "arrival_ms", "first_token_ms", "last_token_ms")
    assert got["c"] == (500.0, 510.0, 514.0)
    assert got["d"] == (3000.0, 3010.0, 3014.0)
    assert (df["terminal_status"] == "completed").all()


def test_open_loop_speedup(config, trace):
    """arrival_speedup_ratio divides the gaps between arrivals, not the compute time."""
    rows = [row(0, ids=[1], request_id="a"), row(1000, ids=[2], request_id="b")]
    df = run(config, trace, rows, load={"kind": "trace", "arrival_speedup_ratio": 4})
    assert times(df, "arrival_ms", "last_token_ms") == {"a": (0.0, 14.0), "b": (250.0, 264.0)}


def test_follow_up_turn_waits_for_completion_plus_delay(config, trace):
    """A session's next turn arrives exactly at the previous turn's last token + its delay
    (given, 0, or inferred from timestamps), never before the previous turn completes."""
    rows = [
        row(0, session_id="s", request_id="t1"),
        row(session_id="s", delay_ms=25, out=2, ids=[1, 2], input_length=100, request_id="t2"),
        row(session_id="s", out=1, ids=[1, 2, 3], input_length=150, request_id="t3"),
        row(10_000, session_id="u", request_id="u1"),
        row(10_100, session_id="u", request_id="u2"),
    ]
    df = run(config, trace, rows)
    got = times(df, "arrival_ms", "first_token_ms", "last_token_ms", "terminal_ms")
    assert got == {
        "t1": (0.0, 10.0, 14.0, 14.0),
        "t2": (39.0, 49.0, 51.0, 51.0),
        "t3": (51.0, 61.0, 61.0, 61.0),
        "u1": (10_000.0, 10_010.0, 10_014.0, 10_014.0),
        "u2": (10_114.0, 10_124.0, 10_128.0, 10_128.0),
    }
    assert list(df.loc[["t1", "t2", "t3"], "turn_index"]) == [0, 1, 2]


def test_concurrency_one_backfills_at_last_token(config, trace):
    """Closed loop with concurrency 1: timestamps are ignored and each request arrives when the
    previous one emits its last token (the mocker's tested behaviour)."""
    rows = [
        row(0, ids=[1], request_id="a"),
        row(50_000, ids=[2], out=1, request_id="b"),
        row(90_000, ids=[3], out=2, request_id="c"),
    ]
    df = run(config, trace, rows, load={"kind": "concurrency", "concurrency": 1})
    got = times(df, "arrival_ms", "last_token_ms")
    assert got == {"a": (0.0, 14.0), "b": (14.0, 24.0), "c": (24.0, 36.0)}


def test_concurrency_n_bounds_in_flight(config, trace):
    """Concurrency 2: the first two requests arrive at 0, every later one exactly when some
    request ends, and at no instant are more than 2 requests in flight."""
    outs = [5, 1, 3, 8, 2, 4, 1]
    rows = [row(i, ids=[i + 1], out=n, request_id=f"r{i}") for i, n in enumerate(outs)]
    df = run(config, trace, rows, load={"kind": "concurrency", "concurrency": 2})
    arrival = df["arrival_ms"].to_numpy()
    end = df["terminal_ms"].to_numpy()
    assert sorted(arrival)[:2] == [0.0, 0.0]
    for a in arrival:
        in_flight = ((arrival <= a) & (a < end)).sum()
        assert in_flight <= 2
        assert a == 0.0 or a in set(end)
    assert max(((arrival <= a) & (a < end)).sum() for a in arrival) == 2


def test_concurrency_session_holds_slot_through_delay(config, trace):
    """Under concurrency 1 a multi-turn session keeps its slot through its think time: the next
    session starts only after the last turn of the previous one."""
    rows = [
        row(0, session_id="A", request_id="A1"),
        row(session_id="A", delay_ms=50, ids=[1, 2], input_length=100, request_id="A2"),
        row(1, request_id="B"),
    ]
    df = run(config, trace, rows, load={"kind": "concurrency", "concurrency": 1})
    got = times(df, "arrival_ms", "last_token_ms")
    assert got == {"A1": (0.0, 14.0), "A2": (64.0, 78.0), "B": (78.0, 92.0)}


@pytest.mark.parametrize("load", [{"kind": "trace"}, {"kind": "concurrency", "concurrency": 4}])
def test_equal_timestamps_dispatch_in_line_order(config, trace, load):
    """Requests with equal timestamps (or started together by the closed loop) are dispatched in
    line order: round robin over 2 workers gives workers 0, 1, 0, 1 by line, whatever the ids."""
    rows = [row(0, ids=[i], request_id=rid) for i, rid in enumerate(["d", "c", "b", "a"])]
    df = run(config, trace, rows, load=load, workers=2)
    assert df["decode_worker_idx"].to_dict() == {"d": 0, "c": 1, "b": 0, "a": 1}
    assert (df["arrival_ms"] == 0.0).all()
