"""output.progress (model/progress.py): a streamed trace replay's bar measures simulated time
against the trace's span (first to last timestamp over arrival_speedup_ratio), so it has a
percentage and an ETA; `auto` shows the bar in a Jupyter kernel as on a terminal; the bar
never changes the run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import make_config

from servesim import progress
from servesim.sim import simulate

SCRIPT = Path(sys.executable).parent / "servesim"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "servesim.cli"]


def _mooncake(path: Path, timestamps: list[float]) -> Path:
    rows = [
        {"timestamp": t, "input_length": 100, "output_length": 4, "hash_ids": [i]}
        for i, t in enumerate(timestamps)
    ]
    # a blank line at the end, and a long row before it: the tail is read backwards
    rows[-2]["padding"] = "x" * 200_000
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    return path


def test_the_span_of_a_streamed_trace_is_its_first_to_last_timestamp(tmp_path):
    trace = _mooncake(tmp_path / "t.jsonl", [1000.0, 1500.0, 4000.0, 9000.0])

    def span(**over: Any) -> float | None:
        over.setdefault("workload", {"kind": "mooncake", "path": str(trace)})
        return progress.trace_span_ms(make_config(**over))

    assert span() == 8000.0
    assert span(load={"kind": "trace", "arrival_speedup_ratio": 4.0}) == 2000.0
    # the last row read is not the file's: unknown up front
    assert span(workload={"kind": "mooncake", "path": str(trace), "max_requests": 2}) is None
    assert span(load={"kind": "concurrency", "concurrency": 2}) is None
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0000000,100,10\n"
        "2023-11-16 18:15:47.5000000,100,10\n"
        "2023-11-16 18:16:46.2500000,100,10\n"
    )
    assert progress.trace_span_ms(
        make_config(workload={"kind": "azure", "path": str(azure)})
    ) == pytest.approx(60250.0)


class Bar:
    """Stands in for tqdm: records the total and every position shown."""

    made: list[Bar] = []

    def __init__(self, total: float | None, unit: str, **kwargs: Any) -> None:
        self.total, self.unit, self.n, self.shown = total, unit, 0.0, []
        Bar.made.append(self)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def refresh(self) -> None:
        self.shown.append(self.n)

    def update(self, k: float) -> None:
        self.n += k
        self.shown.append(self.n)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text


def test_a_streamed_replay_counts_simulated_seconds_against_the_span(tmp_path, monkeypatch):
    """Arrivals at 0, 0.5, 3 and 8 s (span 8 s); the bar advances a simulated second at a
    time up to 8 and stays full while the last requests drain; the tables are the run's."""
    trace = _mooncake(tmp_path / "t.jsonl", [0.0, 500.0, 3000.0, 8000.0])
    monkeypatch.setattr(progress, "_bar_class", lambda: Bar)
    Bar.made.clear()
    shown = simulate(
        make_config(workload={"kind": "mooncake", "path": str(trace)}, output={"progress": "on"})
    )
    (bar,) = Bar.made
    assert (bar.total, bar.unit) == (8.0, "s")
    # the last request arrives at 8 s and ends within the next simulated second
    assert bar.shown == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 8.0]
    assert bar.postfix == "4 req ended"
    hidden = simulate(make_config(workload={"kind": "mooncake", "path": str(trace)}))
    pd.testing.assert_frame_equal(shown.requests, hidden.requests, check_exact=True)


def test_the_console_bar_of_a_streamed_replay_has_a_percentage_and_an_eta(tmp_path):
    trace = _mooncake(tmp_path / "t.jsonl", [0.0, 10.0, 25.0])
    out = subprocess.run(
        [
            *COMMAND,
            "workload=mooncake",
            f"workload.path={trace}",
            "load.arrival_speedup_ratio=0.01",  # a 2.5 s span
            "output.progress=on",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SERVESIM_NATIVE": "0"},
    )
    assert out.returncode == 0, out.stderr
    # tqdm: "servesim:   0%|          | 0/2.5 [00:00<?, ?s/s]" (elapsed<remaining: the ETA)
    assert re.search(r"servesim: +\d+%\|.*\| [\d.]+/2\.5 \[\d\d:\d\d<", out.stderr), out.stderr


def test_auto_shows_the_bar_in_a_jupyter_kernel(monkeypatch):
    ZMQInteractiveShell = type("ZMQInteractiveShell", (), {})
    fake = types.ModuleType("IPython")
    fake.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not progress.wanted("auto")
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert progress.in_notebook() and progress.wanted("auto") and not progress.wanted("off")
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        expected = "tqdm.std"  # no widget without ipywidgets: the text bar
    else:
        expected = "tqdm.notebook"
    assert progress._bar_class().__module__ == expected
