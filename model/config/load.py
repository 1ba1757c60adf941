"""Validate a plain config mapping into a RunConfig, with errors that name the config path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from model.config.schema import RunConfig


class ConfigError(ValueError):
    """A config value is missing, unknown, of the wrong type or out of range."""


def _path(loc: tuple[Any, ...]) -> str:
    # pydantic puts the discriminator tag of a union member in the location
    # (e.g. ('timing', 'fixed', 'prefill_ms')); the user wrote timing.prefill_ms.
    parts = [str(p) for p in loc]
    return ".".join(parts)


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _path(loc)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not in the schema)"
        elif "input" in e and e["type"] not in ("missing",):
            got = e["input"]
            if not isinstance(got, Mapping):
                msg = f"{msg} (got {got!r})"
        lines.append(f"  {path}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def validate_config(data: Mapping[str, Any]) -> RunConfig:
    """Validate once; raise ConfigError naming each offending config path."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
