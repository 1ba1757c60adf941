"""JSON Lines trace files read whole: each non-blank line one JSON object, numbered by its line,
with every problem (a byte that is not UTF-8, bad JSON, a value that is not an object) an error
naming that line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from servesim.workload.errors import TraceError, check_utf8, open_text

__all__ = ["read_json_lines"]


def read_json_lines(
    path: Path, opener: Callable[[Path], TextIO] | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """The non-blank lines of a JSON Lines file as (line number, object); `opener` opens it
    as text with bytes that are not UTF-8 escaped (default: `errors.open_text`); such a byte
    is an error naming its line."""
    out = []
    with (opener or open_text)(path) as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            check_utf8(text, f"{path}:{line_no}")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(
                    f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}"
                )
            out.append((line_no, obj))
    return out
