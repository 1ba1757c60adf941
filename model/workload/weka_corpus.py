"""Weka / AgentX agent corpora as recorded: each play's LLM calls and sub-agent runs, read from
the corpus files and checked, before they are lowered to the agentic graph (`workload.weka`,
reference §1.4).

**Input.** A `.json` file (one play object), a `.jsonl` file (one play object per non-blank
line), or a directory searched recursively for both, in sorted name order at every level
(other files are ignored; a symlink anywhere below the directory is an error naming it). A play
has `id`, `block_size` (tokens per hash id, equal in every play of the corpus),
`hash_id_scope` (must be `"local"`) and a non-empty `requests` list; `models`, `tool_tokens`,
`system_tokens`, `totals` and unknown keys are ignored. Each entry of `requests` has a `type`:

* `"n"` / `"s"`: an LLM call with `t` (start, seconds), optional `api_time` (seconds; missing
  means unknown, not 0), `in` (input tokens, > 0), `out` (output tokens, >= 0), `model` and
  `hash_ids` (one id per `block_size` tokens, non-negative ints);
* `"subagent"`: a marker with `t`, `agent_id` (unique in its play), optional `duration_ms`,
  `status`, `subagent_type`, and its own `requests` (calls of type n/s only).

**Nested timestamps.** `nested_timestamp_basis="absolute"` reads a sub-agent's call times as
given, `"relative"` adds the marker's `t` to them, `"auto"` picks `"relative"` when any nested
call in the corpus starts before its marker and `"absolute"` otherwise (`"not_applicable"` when
the corpus has no nested calls). The resolved basis is returned beside the graph.

The whole corpus is read and checked here before anything is lowered. Every problem is a
`TraceError` naming the file and line, and the play and request entry where that helps.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servesim.workload.errors import TraceError, existing, read_utf8
from servesim.workload.json_lines import read_json_lines
from servesim.workload.mooncake import _int, _ms

__all__ = [
    "NESTED_TIMESTAMP_BASES",
    "Call",
    "RecordedPlay",
    "Subagent",
    "apply_basis",
    "corpus_digest",
    "read_plays",
]

NESTED_TIMESTAMP_BASES = ("auto", "absolute", "relative")
CALL_TYPES = ("n", "s")
SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded LLM call (type n or s), at the top level of a play or in a sub-agent."""

    where: str
    t: float  # s
    api_time: float | None  # s; None: not recorded
    input_length: int
    output_length: int
    model: str
    hash_ids: tuple[int, ...]  # as recorded (play-local ids)

    @property
    def end(self) -> float:
        return self.t + (self.api_time or 0.0)


@dataclass(frozen=True, slots=True)
class Subagent:
    """A sub-agent marker and the calls it made."""

    where: str
    t: float  # s
    agent_id: str
    duration_ms: float | None
    status: str | None
    calls: tuple[Call, ...]


@dataclass(frozen=True, slots=True)
class RecordedPlay:
    """One play object of the corpus: its calls and sub-agents in recorded order."""

    file: Path
    line: int
    where: str  # "file:line: play id"
    play_id: str
    block_size: int
    entries: tuple[Call | Subagent, ...]


# --------------------------------------------------------------------------- files


def read_plays(root: Path) -> tuple[list[Path], list[RecordedPlay], int]:
    """The corpus's files in reading order, their plays parsed and checked, and the corpus
    block size (every play's)."""
    files = _corpus_files(root)
    plays = [_parse_play(file, line, obj) for file in files for line, obj in _play_objects(file)]
    if not plays:
        raise TraceError(f"trace file {root} did not contain any requests")
    return files, plays, _check_plays(plays)


def _corpus_files(root: Path) -> list[Path]:
    if not root.is_dir():
        return [existing(root)]
    files: list[Path] = []
    _walk(root, files)
    if not files:
        raise TraceError(f"Weka corpus {root} contains no .json or .jsonl files")
    return files


def _walk(folder: Path, out: list[Path]) -> None:
    # sorted by name at every level, depth first: the same corpus always reads in one order
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.is_symlink():
            raise TraceError(f"Weka corpus contains a symlink, which is not followed: {entry}")
        if entry.is_dir():
            _walk(entry, out)
        elif entry.is_file() and entry.suffix in SUFFIXES:
            out.append(existing(entry))  # one that cannot be read is named, with why


def _play_objects(file: Path) -> list[tuple[int, dict[str, Any]]]:
    if file.suffix == ".jsonl":
        return read_json_lines(file)
    text = read_utf8(file)
    if not text.strip():
        return []
    line = text[: len(text) - len(text.lstrip())].count("\n") + 1  # where the object starts
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{file}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{file}:{line}: expected a play object, got {type(obj).__name__}")
    return [(line, obj)]


def corpus_digest(root: Path, files: list[Path]) -> str:
    """SHA-256 over each file's name (relative to a directory corpus) and bytes, in order."""
    h = hashlib.sha256()
    for f in files:
        name = f.relative_to(root).as_posix() if root.is_dir() else f.name
        h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- parsing


def _required(obj: dict[str, Any], key: str, where: str) -> Any:
    value = obj.get(key)
    if value is None:
        raise TraceError(f"{where}: missing {key}")
    return value


def _name(value: Any, key: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        raise TraceError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return str(value)


def _seconds(value: Any, key: str, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise TraceError(f"{where}: {key} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _parse_play(file: Path, line: int, obj: dict[str, Any]) -> RecordedPlay:
    at = f"{file}:{line}"
    play_id = _name(_required(obj, "id", f"{at}: play"), "id", f"{at}: play")
    where = f"{at}: play {play_id}"
    block_size = _required(obj, "block_size", where)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise TraceError(f"{where}: block_size must be a positive integer, got {block_size!r}")
    scope = _required(obj, "hash_id_scope", where)
    if scope != "local":
        raise TraceError(f"{where}: hash_id_scope must be 'local', got {scope!r}")
    requests = _required(obj, "requests", where)
    if not isinstance(requests, list):
        raise TraceError(f"{where}: requests must be a list")
    if not requests:
        raise TraceError(f"{where}: requests is empty")
    entries = tuple(
        _parse_entry(e, f"{where} requests[{i}]", False) for i, e in enumerate(requests)
    )
    agents: dict[str, str] = {}
    for e in entries:
        if isinstance(e, Subagent):
            if e.agent_id in agents:
                raise TraceError(
                    f"{e.where}: duplicate agent_id {e.agent_id} (first at {agents[e.agent_id]})"
                )
            agents[e.agent_id] = e.where
    return RecordedPlay(file, line, where, play_id, block_size, entries)


def _parse_entry(obj: Any, where: str, nested: bool) -> Call | Subagent:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a request object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind in CALL_TYPES:
        return _parse_call(obj, where)
    if kind == "subagent" and not nested:
        return _parse_subagent(obj, where)
    expected = "'n' or 's' (a sub-agent's requests)" if nested else "'n', 's' or 'subagent'"
    raise TraceError(f"{where}: unknown request type {kind!r} (expected {expected})")


def _parse_call(obj: dict[str, Any], where: str) -> Call:
    t = _seconds(_required(obj, "t", where), "t", where)
    api = obj.get("api_time")
    api_time = None if api is None else _seconds(api, "api_time", where)
    input_length = _int(_required(obj, "in", where), "in", where, 1)
    output_length = _int(_required(obj, "out", where), "out", where, 0)
    model = _name(_required(obj, "model", where), "model", where)
    hash_ids = _required(obj, "hash_ids", where)
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hash_ids
    ):
        raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
    return Call(where, t, api_time, input_length, output_length, model, tuple(hash_ids))


def _parse_subagent(obj: dict[str, Any], where: str) -> Subagent:
    t = _seconds(_required(obj, "t", where), "t", where)
    agent_id = _name(_required(obj, "agent_id", where), "agent_id", where)
    where = f"{where} (sub-agent {agent_id})"
    duration = obj.get("duration_ms")
    duration_ms = None if duration is None else _ms(duration, "duration_ms", where)
    status = obj.get("status")
    if status is not None and not isinstance(status, str):
        raise TraceError(f"{where}: status must be a string, got {status!r}")
    kind = obj.get("subagent_type")
    if kind is not None and not isinstance(kind, str):
        raise TraceError(f"{where}: subagent_type must be a string, got {kind!r}")
    requests = _required(obj, "requests", where)
    if not isinstance(requests, list):
        raise TraceError(f"{where}: requests must be a list")
    calls = []
    for j, e in enumerate(requests):
        call = _parse_entry(e, f"{where} requests[{j}]", True)
        assert isinstance(call, Call)
        calls.append(call)
    return Subagent(where, t, agent_id, duration_ms, status, tuple(calls))


def _check_plays(plays: list[RecordedPlay]) -> int:
    """The corpus block size; plays must agree on it and have distinct ids."""
    first = plays[0]
    seen: dict[str, str] = {}
    for p in plays:
        if p.block_size != first.block_size:
            raise TraceError(
                f"{p.where}: Weka corpus mixes block sizes: block_size {p.block_size} here, "
                f"{first.block_size} in {first.where}"
            )
        if p.play_id in seen:
            raise TraceError(
                f"{p.where}: duplicate play id {p.play_id} (first at {seen[p.play_id]})"
            )
        seen[p.play_id] = p.where
    return first.block_size


# --------------------------------------------------------------------------- nested timestamps


def apply_basis(plays: list[RecordedPlay], basis: str) -> tuple[list[RecordedPlay], str]:
    """The plays with sub-agent call times read on `basis` (shifted by their marker's `t` when
    it resolves to "relative"), and the resolved basis."""
    resolved = _resolve_basis(plays, basis)
    if resolved == "relative":
        plays = [_shift_nested(p) for p in plays]
    return plays, resolved


def _resolve_basis(plays: list[RecordedPlay], basis: str) -> str:
    if basis != "auto":
        return basis
    nested = [(s, c) for p in plays for s in p.entries if isinstance(s, Subagent) for c in s.calls]
    if not nested:
        return "not_applicable"
    return "relative" if any(c.t < s.t for s, c in nested) else "absolute"


def _shift_nested(play: RecordedPlay) -> RecordedPlay:
    entries = tuple(
        replace(e, calls=tuple(replace(c, t=c.t + e.t) for c in e.calls))
        if isinstance(e, Subagent)
        else e
        for e in play.entries
    )
    return replace(play, entries=entries)
