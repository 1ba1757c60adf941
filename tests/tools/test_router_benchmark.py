"""benchmarks/router_decision.py in quick mode: it runs, keeps its invariants (every decision
dispatched, the queue held at its size, one release per freed target) and prints a table of the
expected shape. No time is asserted: timings are the benchmark's output, never a limit."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "router_decision.py"
_spec = importlib.util.spec_from_file_location("router_decision", SCRIPT)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up there
_spec.loader.exec_module(bench)


def _cells(line: str) -> list[str]:
    assert line.startswith("|") and line.endswith("|"), line
    return [c.strip() for c in line[1:-1].split("|")]


def test_quick_run_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = _cells(lines[0])
    assert header[:4] == ["case", "targets", "queue", "us/decision"]
    assert header == [name for name, _ in bench.COLUMNS]
    assert all(set(c) <= set("-:") for c in _cells(lines[1]))
    rows = [_cells(line) for line in lines[2:] if line.startswith("|")]
    quick = bench.QUICK
    assert len(rows) == len(quick["workers"]) + len(quick["queues"])
    assert all(len(r) == len(header) for r in rows)
    expected = [("workers", str(n), "0") for n in quick["workers"]] + [
        ("queue", str(bench.QUEUE_TARGETS), f"{n:,}") for n in quick["queues"]
    ]
    assert [tuple(r[:3]) for r in rows] == expected
    for r in rows:
        assert float(r[3].replace(",", "")) > 0.0
    assert any(line.startswith("Log-growth check:") for line in lines)

    payload = json.loads(out.read_text())
    assert [r["case"] for r in payload["rows"]] == [e[0] for e in expected]
    for r in payload["rows"]:
        assert r["decisions"] == quick["repeat"] * (
            quick["worker_steps"][r["targets"]] if r["case"] == "workers" else quick["queue_steps"]
        )
        assert len(r["round_us"]) == quick["repeat"]
        assert r["us_decision"] == min(r["round_us"])
        if r["case"] == "queue":
            assert r["released_per_drain"] == 1.0
        else:
            assert r["released_per_drain"] is None
    check = payload["log_check"]
    assert (check["small"], check["large"]) == (min(quick["queues"]), max(quick["queues"]))
    assert check["log_ratio"] == pytest.approx(
        math.log2(check["large"]) / math.log2(check["small"])
    )
    assert payload["settings"]["quick"] is True


def test_queue_bench_holds_its_size():
    b = bench.QueueBench(25, cache_blocks=64, warm=5)
    router = b.router
    assert router.n_waiting == 25
    assert all(router._busy(t) for t in range(b.n_targets))
    clock = bench.Clock()
    for _ in range(30):
        b.step(clock)
    assert router.n_waiting == 25
    assert clock.calls["submit"] == clock.calls["prefill_done"] == clock.drains == 30
    assert clock.released == 30


def test_log_check_and_markdown_on_given_rows():
    def row(queue, us):
        return bench.Row("queue", 8, queue, us, us / 2, us / 2, 1.0, 1.0, 10)

    rows = [row(10, 100.0), row(1000, 150.0), row(100_000, 200.0)]
    check = bench.log_check(rows)
    assert check["us_decision"] == pytest.approx(2.0)
    assert check["log_ratio"] == pytest.approx(5.0)
    assert check["within_log"] is True
    assert bench.log_check(rows[:1]) is None
    text = bench.markdown(rows, check)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(rows)
    assert _cells(table[-1])[:3] == ["queue", "8", "100,000"]
    assert "= 2.00" in text and "= 5.00" in text
