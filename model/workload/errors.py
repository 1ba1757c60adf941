"""What every trace source shares: the row it yields, its errors, skipped-row counts, and the
rules common to all files (the file must exist and hold at least one request)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace file or workload setting that cannot be replayed as written."""


@dataclass(slots=True)
class TraceRow:
    """One request as a source describes it (times in ms, lengths in tokens)."""

    line: int
    timestamp_ms: float | None
    input_length: int
    output_length: int
    hash_ids: list[int]
    session_id: str | None = None
    delay_ms: float | None = None
    request_id: str | None = None
    # the conversation family a row belongs to (sibling_group affinity's key); None: no lineage
    group_id: str | None = None


class SkipCounter:
    """Rows dropped by `skip_malformed`, with the first few reasons kept for the summary."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[str] = []

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.examples) < 5:
            self.examples.append(message)


def existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"failed to open trace file {path}")
    return path


def bounded(path: Path, rows: Iterator[TraceRow], max_requests: int | None) -> Iterator[TraceRow]:
    """At most `max_requests` rows of `rows`; an error if the file yields none at all."""
    n = 0
    for row in rows:
        yield row
        n += 1
        if max_requests is not None and n >= max_requests:
            return
    if n == 0:
        raise TraceError(f"trace file {path} did not contain any requests")
