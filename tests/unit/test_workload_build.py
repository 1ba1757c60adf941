"""build_workload: rows -> sessions of requests with engine-block hashes and planned arrivals,
under trace, rate and concurrency load (spec §1.1 "Session / timing rules", §6.1, case 3)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from servesim.config.schema import (
    AzureWorkload,
    ConcurrencyLoad,
    MooncakeWorkload,
    RateLoad,
    SyntheticWorkload,
    TraceLoad,
)
from servesim.sim import random_streams, simulate
from servesim.workload.build import Workload, _follow_up_delay, build_workload
from servesim.workload.errors import TraceError
from servesim.workload.hashing import BlockHasher
from servesim.workload.mooncake import TraceRow


def build(path, load=None, block_size=4, trace_block_size=4, seed=0, **kw) -> Workload:
    cfg = MooncakeWorkload(path=str(path), trace_block_size=trace_block_size, **kw)
    return build_workload(cfg, load or TraceLoad(), BlockHasher(block_size), random_streams(seed))


def row(t=None, out=1, ids=(1,), **kw):
    r = {"output_length": out, "hash_ids": list(ids), **kw}
    if t is not None:
        r["timestamp"] = t
    return r


def plan(wl: Workload) -> list[list[tuple]]:
    """(request_id, turn_index, planned_arrival_ms, delay_ms) per request, session by session."""
    return [
        [(r.request_id, r.turn_index, r.planned_arrival_ms, r.delay_ms) for r in s]
        for s in wl.sessions
    ]


SESSION_ROWS = [
    row(100, session_id="u1"),
    row(150, session_id="u2"),
    row(session_id="u1", delay=25),
    row(180),
    row(400, session_id="u2"),
    row(session_id="u1"),
]


def test_sessions_from_session_ids(trace):
    """Rows sharing a session_id form one session in row order (turn 0, 1, ...), sessions in
    order of first appearance; a later turn's delay is its `delay`, else the difference of the
    turn timestamps (400 - 150), else 0. Rows without a session are one-request sessions, and
    request ids default to the line number."""
    wl = build(trace(SESSION_ROWS))
    assert plan(wl) == [
        [("1", 0, 0.0, 0.0), ("3", 1, None, 25.0), ("6", 2, None, 0.0)],
        [("2", 0, 50.0, 0.0), ("5", 1, None, 250.0)],
        [("4", 0, 80.0, 0.0)],
    ]
    assert [r.session_id for s in wl.sessions for r in s] == ["u1"] * 3 + ["u2"] * 2 + [None]
    assert [r.idx for s in wl.sessions for r in s] == [0, 2, 5, 1, 4, 3]  # idx = row order
    assert wl.num_requests == 6


def test_request_fields_and_prompt_hashes(trace):
    """A request keeps the row's request_id and lengths; prompt hashes come from the run's
    hasher, so rows with a common id prefix share those engine blocks."""
    wl = build(
        trace(
            [
                row(0, out=3, ids=[10, 11], request_id="a", input_length=7),
                row(1, out=0, ids=[10, 12], request_id="b"),
            ]
        ),
        block_size=2,
    )
    a, b = (s[0] for s in wl.sessions)
    assert (a.request_id, a.input_length, a.output_length) == ("a", 7, 3)
    assert (b.request_id, b.input_length, b.output_length) == ("b", 8, 0)
    assert len(a.prompt_hashes) == 3 and len(b.prompt_hashes) == 4
    assert a.prompt_hashes[:2] == b.prompt_hashes[:2]
    assert a.prompt_hashes[2] != b.prompt_hashes[2]


def test_negative_inferred_delay_rejected(trace):
    """A later turn timestamped before its predecessor gives a negative inferred delay: an error
    naming file:line ("has invalid delay")."""
    path = trace([row(100, session_id="s"), row(200), row(50, session_id="s")])
    with pytest.raises(TraceError) as err:
        build(path)
    assert str(err.value).startswith(f"{path}:3: trace line 3 has invalid delay -50.0")


def test_delay_needs_previous_timestamp():
    """A timestamped later turn without `delay`, whose session has no earlier timestamp, cannot
    infer its delay. (The Mooncake reader already demands a first-turn timestamp, so this is
    reached only by rows built in code.)"""
    r = TraceRow(
        line=4, timestamp_ms=30.0, input_length=4, output_length=1, hash_ids=[1], session_id="s"
    )
    with pytest.raises(
        TraceError,
        match=re.escape(
            "t.jsonl:4: trace line 4 for session s cannot infer delay without a previous timestamp"
        ),
    ):
        _follow_up_delay(r, None, "t.jsonl:4")
    assert _follow_up_delay(r, 10.0, "t.jsonl:4") == 20.0


def test_trace_load_normalises_and_speeds_up(trace):
    """Trace load: first arrivals shifted so the first is at 0, then divided by
    arrival_speedup_ratio, and so are all inter-turn delays (given or inferred)."""
    rows = [
        row(1000, session_id="a"),
        row(1500),
        row(session_id="a", delay=100),
        row(3000, session_id="a"),
    ]
    wl = build(trace(rows), load=TraceLoad(arrival_speedup_ratio=2.0))
    assert plan(wl) == [
        [("1", 0, 0.0, 0.0), ("3", 1, None, 50.0), ("4", 2, None, 1000.0)],
        [("2", 0, 250.0, 0.0)],
    ]


def test_rate_load_constant(trace):
    """Constant rate r: first turns restamped 0, 1000/r, 2000/r, ... in session order whatever
    the trace said; later turns keep their delays and no planned time."""
    rows = [row(0, session_id="a"), row(7), row(session_id="a", delay=30), row(9999)]
    wl = build(trace(rows), load=RateLoad(rate_rps=4, process="constant"))
    assert plan(wl) == [
        [("1", 0, 0.0, 0.0), ("3", 1, None, 30.0)],
        [("2", 0, 250.0, 0.0)],
        [("4", 0, 500.0, 0.0)],
    ]


def test_rate_load_poisson_is_seeded(tmp_path):
    """Poisson rate: first at 0, then exponential gaps of mean 1000/r drawn from the seeded
    `arrivals` stream: same seed same times, another seed other times."""
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(row(i)) + "\n" for i in range(3000)))

    def times(seed):
        wl = build(path, load=RateLoad(rate_rps=20, process="poisson"), seed=seed)
        return np.array([s[0].planned_arrival_ms for s in wl.sessions])

    t = times(0)
    assert t[0] == 0.0
    assert np.all(np.diff(t) >= 0)
    assert np.diff(t).mean() == pytest.approx(50.0, rel=0.05)
    assert np.array_equal(t, times(0))
    assert not np.array_equal(t, times(1))


def test_concurrency_load_leaves_arrivals_unset(trace):
    """Under concurrency load no request has a planned arrival (it is stamped at dispatch);
    delays are kept as written."""
    rows = [row(5, session_id="a"), row(10), row(session_id="a", delay=40)]
    wl = build(trace(rows), load=ConcurrencyLoad(concurrency=2))
    assert plan(wl) == [
        [("1", 0, None, 0.0), ("3", 1, None, 40.0)],
        [("2", 0, None, 0.0)],
    ]


def test_skipped_rows_reach_the_workload(tmp_path):
    """Rows dropped by skip_malformed are counted on the workload (for the run summary)."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row(0)) + "\nnot json\n" + json.dumps(row(5)) + "\n")
    wl = build(path, skip_malformed=True)
    assert wl.num_requests == 2
    assert wl.skipped.count == 1 and wl.skipped.examples[0].startswith(f"{path}:2:")


def test_max_requests(trace):
    """max_requests limits the workload to the first N rows."""
    wl = build(trace([row(i) for i in range(5)]), max_requests=3)
    assert [s[0].request_id for s in wl.sessions] == ["1", "2", "3"]


def test_azure_prompts_share_nothing(tmp_path):
    """Azure rows have no prefix data: every prompt gets fresh blocks (input // block_size of
    them), so identical rows share nothing; times are relative to the first row."""
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.5,130,2\n2023-11-16 18:15:47.0,130,2\n"
    )
    wl = build_workload(
        AzureWorkload(path=str(path)), TraceLoad(), BlockHasher(64), random_streams(0)
    )
    a, b = (s[0] for s in wl.sessions)
    assert len(a.prompt_hashes) == len(b.prompt_hashes) == 2
    assert not set(a.prompt_hashes) & set(b.prompt_hashes)
    assert (a.planned_arrival_ms, b.planned_arrival_ms) == (0.0, 500.0)
    assert (a.request_id, b.request_id) == ("2", "3")


def test_synthetic_trace_load_uses_its_own_rate():
    """A synthetic workload under trace load arrives at its own rate_rps/arrival_process; later
    turns follow with inter_turn_delay_ms."""
    cfg = SyntheticWorkload.model_validate(
        {
            "num_sessions": 3,
            "turns_per_session": 2,
            "inter_turn_delay_ms": 15,
            "input_tokens": {"mean": 64},
            "output_tokens": {"mean": 4},
            "rate_rps": 5,
            "arrival_process": "constant",
        }
    )
    wl = build_workload(cfg, TraceLoad(), BlockHasher(16), random_streams(0))
    assert plan(wl) == [
        [("s0t0", 0, 0.0, 0.0), ("s0t1", 1, None, 15.0)],
        [("s1t0", 0, 200.0, 0.0), ("s1t1", 1, None, 15.0)],
        [("s2t0", 0, 400.0, 0.0), ("s2t1", 1, None, 15.0)],
    ]


def test_default_request_ids_cannot_collide_with_given_ones(config, trace):
    """A row without request_id is named by its line; a given id equal to that is an error."""
    rows = [
        {"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 1, "input_length": 8, "output_length": 1, "hash_ids": [2], "request_id": "1"},
    ]
    path = trace(rows)
    with pytest.raises(TraceError, match=f"{path}:2: request_id '1' is already taken"):
        simulate(config(workload={"kind": "mooncake", "path": path, "trace_block_size": 8}))


def test_later_turns_need_no_timestamps_when_the_load_sets_arrivals(config, trace):
    """With load=rate (or concurrency) a session may have no timestamps at all: later turns
    without `delay` follow at once."""
    rows = [
        {"session_id": "s", "input_length": 8, "output_length": 1, "hash_ids": [1]},
        {"session_id": "s", "input_length": 16, "output_length": 1, "hash_ids": [1, 2]},
    ]
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 8},
        load={"kind": "rate", "rate_rps": 1.0},
        timing={"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0},
    )
    req = simulate(cfg).requests
    assert list(req.terminal_status) == ["completed", "completed"]
    assert req.arrival_ms.iloc[1] == req.last_token_ms.iloc[0]
