"""How far a run is: the event loop stepped a simulated second at a time under a progress bar.

`output.progress` (auto | on | off) decides whether a bar shows; `auto` shows it on a terminal
and in a Jupyter kernel (a widget there when ipywidgets is installed, via tqdm.auto). The bar
counts ended requests against the run's requests when they are known in advance; a streamed
trace replay (its rows read as their arrivals come) is measured instead in simulated seconds
against the trace's span, read from its first and last rows, so it too has a percentage and an
ETA. The bar only watches: the run's tables are the same with it or without it.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import simpy

from servesim.config.schema import AzureWorkload, MooncakeWorkload, RunConfig, TraceLoad
from servesim.workload.azure import TICKS_PER_S, parse_timestamp_ticks
from servesim.workload.mooncake import parse_row

STEP_MS = 1000.0  # simulated time between two updates of the bar
TAIL_BYTES = 1 << 16  # the last row is looked for in the file's last bytes, doubling to
MAX_TAIL_BYTES = 1 << 24  # at most this


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def wanted(setting: str) -> bool:
    """Whether `output.progress` asks for a bar here: `on`, or `auto` on a terminal or in a
    notebook."""
    if setting == "auto":
        return sys.stderr.isatty() or in_notebook()
    return setting == "on"


def _bar_class() -> Any:
    """tqdm's notebook widget in a Jupyter kernel with ipywidgets, else its text bar."""
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm
        except ImportError:
            pass
    from tqdm import tqdm

    return tqdm


def _lines(path: Path) -> tuple[str | None, str | None]:
    """The file's first and last non-blank lines (None where there is none or the file
    cannot be read; the last None also if it is longer than MAX_TAIL_BYTES)."""
    try:
        with path.open("rb") as fh:
            first = next((b for b in fh if b.strip()), None)
            size = fh.seek(0, 2)
            want = TAIL_BYTES
            while True:
                start = max(0, size - want)
                fh.seek(start)
                rows = [b for b in fh.read().splitlines() if b.strip()]
                # the first piece read is whole only if it starts the file
                if rows and (start == 0 or len(rows) > 1):
                    last: bytes | None = rows[-1]
                    break
                if start == 0 or want >= MAX_TAIL_BYTES:
                    last = None
                    break
                want *= 2
    except OSError:
        return None, None
    decode: Callable[[bytes | None], str | None] = lambda b: (  # noqa: E731
        None if b is None else b.decode("utf-8", errors="replace")
    )
    return decode(first), decode(last)


def _mooncake_ms(line: str, trace_block_size: int) -> float | None:
    row = parse_row(json.loads(line), "progress", 0, trace_block_size)
    return row.timestamp_ms


def _azure_ms(line: str) -> float:
    fields = next(csv.reader([line]))
    return parse_timestamp_ticks(fields[0]) / (TICKS_PER_S / 1000)


def trace_span_ms(cfg: RunConfig) -> float | None:
    """The simulated time from a streamed trace's first arrival to its last: the difference
    of its first and last rows' timestamps over `arrival_speedup_ratio`. None when it cannot
    be told up front: another workload, `max_requests` (the last row read is not the file's),
    a first or last row the reader would not take."""
    workload, load = cfg.workload, cfg.load
    if not isinstance(load, TraceLoad) or not isinstance(
        workload, MooncakeWorkload | AzureWorkload
    ):
        return None
    if workload.max_requests is not None:
        return None
    path = Path(workload.path)
    first, last = _lines(path)
    try:
        if isinstance(workload, MooncakeWorkload):
            if first is None or last is None:
                return None
            tbs = workload.trace_block_size
            t0, t1 = _mooncake_ms(first, tbs), _mooncake_ms(last, tbs)
        else:
            _, second = _lines_after_header(path)
            if second is None or last is None:
                return None
            t0, t1 = _azure_ms(second), _azure_ms(last)
    except (ValueError, TypeError, IndexError, StopIteration):  # TraceError is a ValueError
        return None
    if t0 is None or t1 is None or t1 <= t0:
        return None
    return (t1 - t0) / load.arrival_speedup_ratio


def _lines_after_header(path: Path) -> tuple[str | None, str | None]:
    """A CSV file's header and its first non-blank row after it."""
    try:
        with path.open("rb") as fh:
            rows = (b.decode("utf-8-sig", errors="replace") for b in fh if b.strip())
            return next(rows, None), next(rows, None)
    except OSError:
        return None, None


def run_with_bar(
    env: simpy.Environment,
    until_ms: float | None,
    total_requests: int | None,
    span_ms: float | None,
    n_ended: Callable[[], int],
) -> None:
    """Run `env` to its end (or the soft stop `until_ms`) a simulated second at a time, with
    a bar of ended requests out of `total_requests`, or else of simulated seconds out of
    `span_ms` (a streamed trace), or else of ended requests without a total."""
    by_time = total_requests is None and span_ms is not None
    if by_time:
        assert span_ms is not None
        total: float | None = round(span_ms / 1000.0, 3)
        unit = "s"
    else:
        total = total_requests
        unit = "req"
    bar_class = _bar_class()
    with bar_class(total=total, unit=unit, desc="servesim", leave=False) as bar:
        ended = 0
        while env.peek() != math.inf:
            target = env.now + STEP_MS
            if until_ms is not None and target >= until_ms:
                env.run(until=until_ms)
                while env.peek() == until_ms:  # the cut-off is soft: events at it still happen
                    env.step()
                break
            env.run(until=target)
            # SimPy (4.1) leaves the stopping event queued at `target` (without callbacks):
            # step through this instant, or the queue never looks empty
            while env.peek() == env.now:
                env.step()
            now_ended = n_ended()
            if by_time:
                assert total is not None
                # past the last arrival the run drains: the bar stays full until it ends
                bar.n = min(round(env.now / 1000.0, 3), total)
                bar.set_postfix_str(f"{now_ended:,} req ended", refresh=False)
                bar.refresh()
            else:
                bar.update(now_ended - ended)
                bar.set_postfix_str(f"t={env.now / 1000:.0f}s")
            ended = now_ended
