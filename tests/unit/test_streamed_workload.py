"""Streamed trace replay: an open-loop Mooncake / Azure replay of single requests reads its rows
as arrivals come (servesim.workload.build.StreamedWorkload) and gives exactly the tables of the
whole-file path; bad rows fail with their file and line, rows a stop time never reached are
recorded as not arrived, and memory holds the requests in flight, not the trace."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pandas as pd
import pytest

import servesim.sim as sim
from servesim.workload.build import RequestIds, StreamedWorkload
from servesim.workload.errors import TraceError
from servesim.workload.mooncake import TraceRow
from servesim.workload.request import Request
from tests.conftest import make_config, shared_trace, write_jsonl


def _rows(n: int, gap_ms: float = 40.0, shared: int = 3) -> list[dict]:
    """n single requests; every third shares a prefix of `shared` trace blocks."""
    out = []
    for i in range(n):
        ids = list(range(shared)) if i % 3 == 0 else []
        ids += [1000 + 10 * i + k for k in range(2 + i % 4)]
        out.append({"timestamp": i * gap_ms, "output_length": 3 + i % 7, "hash_ids": ids})
    return out


def _config(path: str, **over) -> sim.RunConfig:
    sections = {
        "workload": {"kind": "mooncake", "path": path, "trace_block_size": 16},
        "engine": {"kind": "vllm", "num_gpu_blocks": 64, "block_size": 16},
        "topology": {"kind": "aggregated", "num_workers": 2},
        "timing": {"kind": "polynomial"},
        "output": {"progress": "off", "kv_events": True},
    }
    for key, value in over.items():
        replace = "kind" in value and value["kind"] != sections.get(key, {}).get("kind")
        sections[key] = value if replace else {**sections.get(key, {}), **value}
    return make_config(**sections)


def _both(cfg, monkeypatch) -> tuple[sim.Result, sim.Result]:
    """The run streamed, then the same run with the whole file read first."""
    streamed = sim.simulate(cfg)
    with monkeypatch.context() as m:
        m.setattr(sim, "stream_workload", lambda *a, **k: None)
        whole = sim.simulate(cfg)
    return streamed, whole


def _same(a: sim.Result, b: sim.Result) -> None:
    for name in ("requests", "passes", "kv", "kv_events", "transfers", "routing"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    sa = {k: v for k, v in a.summary.items() if k != "metadata"}
    sb = {k: v for k, v in b.summary.items() if k != "metadata"}
    assert sa == sb


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"topology": {"num_workers": 1}, "engine": {"num_gpu_blocks": 24}},  # preemption
        {"load": {"kind": "trace", "arrival_speedup_ratio": 2.5}},
        {"stop": {"max_virtual_time_ms": 300.0}},  # rows never reached: not arrived
        {"router": {"kind": "kv"}},
        {
            "topology": {"kind": "disagg", "num_prefill_workers": 1, "num_decode_workers": 1},
        },
    ],
    ids=["two-workers", "tight-pool", "speedup", "stop", "kv-router", "1p1d"],
)
def test_streamed_replay_gives_the_whole_file_tables(tmp_path, monkeypatch, over):
    path = str(write_jsonl(tmp_path / "t.jsonl", _rows(40)))
    cfg = _config(path, **over)
    streamed, whole = _both(cfg, monkeypatch)
    _same(streamed, whole)
    counts = streamed.summary["terminal_status_counts"]
    assert sum(counts.values()) + streamed.summary["not_arrived_requests"] >= 40
    assert len(streamed.requests) == 40
    if "stop" in over:
        assert streamed.summary["not_arrived_requests"] > 0
        assert set(streamed.requests.terminal_status) == {"completed", "incomplete"}


def test_streamed_replay_is_taken_only_for_single_requests_in_trace_time(tmp_path):
    single = str(write_jsonl(tmp_path / "a.jsonl", _rows(3)))
    multi = str(
        write_jsonl(
            tmp_path / "b.jsonl",
            [
                {"timestamp": 0, "output_length": 2, "hash_ids": [1], "session_id": "s"},
                {"output_length": 2, "hash_ids": [1, 2], "session_id": "s", "delay": 5},
            ],
        )
    )
    hasher = sim.BlockHasher(16)
    streams = sim.random_streams(0)
    cfg = _config(single)
    assert isinstance(
        sim.stream_workload(cfg.workload, cfg.load, hasher, streams), StreamedWorkload
    )
    cfg = _config(multi)
    assert sim.stream_workload(cfg.workload, cfg.load, hasher, streams) is None
    cfg = _config(single, load={"kind": "concurrency", "concurrency": 2})
    assert sim.stream_workload(cfg.workload, cfg.load, hasher, streams) is None


def test_a_malformed_line_near_the_end_fails_with_its_file_and_line(tmp_path):
    rows = _rows(500)
    path = tmp_path / "t.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in rows[:-1]) + '{"timestamp": 1e9, "hash_ids": [\n'
    path.write_text(text)
    with pytest.raises(TraceError, match=rf"{path}:500: not valid JSON"):
        sim.simulate(_config(str(path)))
    # the same row after a stop time: still read (as not arrived), still an error
    with pytest.raises(TraceError, match=rf"{path}:500:"):
        sim.simulate(_config(str(path), stop={"max_virtual_time_ms": 100.0}))


def test_skipped_rows_are_counted_as_in_the_whole_file_path(tmp_path, monkeypatch):
    rows = _rows(12)
    rows[4] = {"timestamp": 160.0, "hash_ids": [7]}  # no output_length
    path = str(write_jsonl(tmp_path / "t.jsonl", rows))
    cfg = _config(path, workload={"skip_malformed": True})
    streamed, whole = _both(cfg, monkeypatch)
    _same(streamed, whole)
    assert streamed.summary["skipped_trace_rows"] == 1
    assert len(streamed.requests) == 11


def test_request_ids_clash_with_line_numbers_in_either_order():
    ids = RequestIds("f.jsonl")

    def row(line: int, rid: str | None) -> TraceRow:
        return TraceRow(line, 0.0, 1, 1, [1], request_id=rid)

    assert ids.take(row(1, None)) == "1"
    assert ids.take(row(2, "a")) == "a"
    assert ids.take(row(3, "01")) == "01"  # not line 1's name
    assert ids.take(row(6, "²")) == "²"  # a digit, not a line number
    with pytest.raises(TraceError, match=r"f.jsonl:4: request_id '1' is already taken"):
        ids.take(row(4, "1"))
    assert ids.take(row(5, "9")) == "9"
    with pytest.raises(TraceError, match=r"f.jsonl:9: request_id '9' is already taken"):
        ids.take(row(9, None))
    with pytest.raises(TraceError, match=r"f.jsonl:10: request_id 'a' is already taken"):
        ids.take(row(10, "a"))


def test_only_requests_in_flight_are_alive_during_a_streamed_run(tmp_path):
    """The streamed path keeps no request after it ends: at any pass end the live Request
    objects are those in flight (plus the one the driver holds for its arrival)."""
    path = str(write_jsonl(tmp_path / "t.jsonl", _rows(300, gap_ms=25.0)))
    cfg = _config(path)
    peak = 0
    original = sim.Recorder.request_terminal

    def counting(self, req, *args, **kwargs):
        nonlocal peak
        original(self, req, *args, **kwargs)
        if req.idx % 25 == 0:
            gc.collect()
            peak = max(peak, sum(isinstance(o, Request) for o in gc.get_objects()))

    sim.Recorder.request_terminal = counting  # type: ignore[method-assign]
    try:
        result = sim.simulate(cfg)
    finally:
        sim.Recorder.request_terminal = original  # type: ignore[method-assign]
    assert result.summary["completed_requests"] == 300
    assert 0 < peak < 30  # of 300 requests


def test_streamed_replay_of_a_real_trace_slice(monkeypatch):
    cfg = _config(
        str(shared_trace("conversation_trace.jsonl")),
        workload={"trace_block_size": 512, "max_requests": 300},
        engine={"num_gpu_blocks": 4096, "block_size": 64},
    )
    streamed, whole = _both(cfg, monkeypatch)
    _same(streamed, whole)


def test_azure_rows_stream_too(tmp_path, monkeypatch):
    path = Path(tmp_path / "azure.csv")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(30):
        lines.append(f"2023-11-16 18:15:{i:02d}.0000000,{40 + 7 * i},{2 + i % 5}")
    path.write_text("\n".join(lines) + "\n")
    cfg = _config("unset", workload={"kind": "azure", "path": str(path)})
    hasher = sim.BlockHasher(16)
    assert isinstance(
        sim.stream_workload(cfg.workload, cfg.load, hasher, sim.random_streams(0)),
        StreamedWorkload,
    )
    streamed, whole = _both(cfg, monkeypatch)
    _same(streamed, whole)
