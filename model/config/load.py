"""Validate a plain config mapping into a RunConfig, with errors that name the config path."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from servesim.config.errors import ConfigError
from servesim.config.schema import RunConfig

__all__ = ["ConfigError", "schema_knows", "validate_config"]


# Fields holding a union chosen by `kind`: pydantic puts the chosen member's tag in the error
# location (('timing', 'fixed', 'prefill_ms')) where the user wrote timing.prefill_ms.
TAGGED_UNIONS = {"timing", "router", "workload", "load", "topology"}


def _path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for i, p in enumerate(loc):
        if i > 0 and loc[i - 1] in TAGGED_UNIONS and i == 1:
            continue
        parts.append(str(p))
    return ".".join(parts)


def _known_keys(data: Mapping[str, Any] | None, path: str) -> list[str]:
    """The keys beside the last one of the dotted `path` in the validated `data` (the
    composed config holds every key the schema knows there), for a did-you-mean."""
    node: Any = data
    for part in path.split(".")[:-1]:
        node = node.get(part) if isinstance(node, Mapping) else None
    leaf = path.rpartition(".")[2]
    return [str(k) for k in node if k != leaf] if isinstance(node, Mapping) else []


def format_validation_error(err: ValidationError, data: Mapping[str, Any] | None = None) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _path(loc)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (not in the schema)"
            stem, _, leaf = path.rpartition(".")
            close = difflib.get_close_matches(leaf, _known_keys(data, path), n=1, cutoff=0.6)
            if close:
                near = f"{stem}.{close[0]}" if stem else close[0]
                msg = f"unknown field (not in the schema; did you mean {near}?)"
        elif "input" in e and e["type"] not in ("missing",):
            got = e["input"]
            if not isinstance(got, Mapping):
                msg = f"{msg} (got {got!r})"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        lines.append(f"  {path}: {msg}" if path else f"  {msg}")
    return "invalid config:\n" + "\n".join(lines)


def schema_knows(data: Mapping[str, Any], path: str) -> bool:
    """Whether the schema has a field at the dotted `path` of the config `data` (a union
    member chosen by the `kind` given there), whether or not `data` sets it."""
    probe: dict[str, Any] = dict(data)
    node = probe
    parts = path.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, Mapping) else {}
        node = node[part]
    node[parts[-1]] = None
    try:
        RunConfig.model_validate(probe)
    except ValidationError as err:
        return not any(
            e["type"] == "extra_forbidden" and _path(tuple(e["loc"])) == path for e in err.errors()
        )
    return True


def validate_config(data: Mapping[str, Any]) -> RunConfig:
    """Validate once; raise ConfigError naming each offending config path."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, data)) from None
