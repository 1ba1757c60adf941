"""What every trace source shares: the row it yields, its errors, skipped-row counts, and the
rules common to all files (the file must open, be UTF-8 and hold at least one request)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


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
    """`path`, once it is known to be a regular file this process can open for reading; else
    a TraceError that says why not."""
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise TraceError(f"failed to open trace file {path}: {_kind(path)}")
        with path.open("rb"):
            pass
    except OSError as e:
        raise TraceError(f"failed to open trace file {path}: {_why(path, e)}") from None
    return path


def _kind(path: Path) -> str:
    if path.is_dir():
        return "it is a directory"
    return "not a regular file (a device, pipe or socket)"


def _why(path: Path, e: OSError) -> str:
    if e.errno == errno.ENOENT:
        where = "" if path.is_absolute() else f" (relative to the working directory {os.getcwd()})"
        return f"no such file{where}"
    if e.errno == errno.EACCES:
        return "permission denied"
    return (e.strerror or str(e)).lower()


def open_text(path: Path, encoding: str = "utf-8", newline: str | None = None) -> TextIO:
    """`path` as text in which a byte that is not UTF-8 reads as a lone surrogate (Python's
    `surrogateescape`) instead of failing the whole read: the reader checks each line where
    it parses it (`check_utf8`), so the error names that line and `skip_malformed` can drop
    just that row."""
    return path.open(encoding=encoding, errors="surrogateescape", newline=newline)


def not_utf8(text: str) -> tuple[int, int] | None:
    """The first byte of `text` (read by `open_text`) that is not UTF-8 and its offset in
    bytes from the start of `text`, or None when it is all UTF-8. Free for ASCII text."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # only escaped bytes are lone surrogates in decoded text
        offset = len(text[: e.start].encode("utf-8", "surrogateescape"))
        return ord(text[e.start]) - 0xDC00, offset
    return None


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def utf8_message(byte: int, offset: int, of: str, head: bytes) -> str:
    """What a reader says of a byte that is not UTF-8 at `offset` bytes into `of`; `head`, the
    first bytes of the line or file, tells a UTF-16 file by its byte order mark."""
    hint = "; the file looks like UTF-16: save it as UTF-8" if head[:2] in UTF16_BOMS else ""
    return f"not valid UTF-8 (byte 0x{byte:02x} at byte offset {offset} of {of}{hint})"


def check_utf8(text: str, where: str) -> None:
    """A TraceError at `where` if the line `text` (read by `open_text`) holds a byte that is
    not UTF-8."""
    bad = not_utf8(text)
    if bad is not None:
        byte, offset = bad
        head = text[:2].encode("utf-8", "surrogateescape")
        raise TraceError(f"{where}: {utf8_message(byte, offset, 'the line', head)}")


def read_utf8(path: Path) -> str:
    """The whole file as UTF-8 text; a byte that is not UTF-8 is a TraceError naming its line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        offset = e.start - (data.rfind(b"\n", 0, e.start) + 1)
        message = utf8_message(data[e.start], offset, "the line", data)
        raise TraceError(f"{path}:{line}: {message}") from None


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
