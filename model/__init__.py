"""servesim: a SimPy model of LLM inference serving.

    from servesim import compose, simulate
    result = simulate(compose(["topology=disagg", "workload.num_sessions=20"]))
    result.summary, result.requests, result.passes, result.kv

Importing servesim changes nothing outside it and loads the model only when a name below is
first used. The native build (servesim/native.py) is used only when asked for:
SERVESIM_NATIVE=1, or `servesim.speed.native.activate()` before the first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from servesim.speed import native

native.activate_if_asked()

if TYPE_CHECKING:
    from servesim.config import ConfigError, RunConfig, validate_config
    from servesim.config.compose import compose
    from servesim.outcome import Result
    from servesim.sim import simulate

# the public names, and the module each comes from (imported on first use)
_PUBLIC = {
    "compose": "servesim.config.compose",
    "ConfigError": "servesim.config",
    "RunConfig": "servesim.config",
    "validate_config": "servesim.config",
    "Result": "servesim.outcome",
    "simulate": "servesim.sim",
}

__all__ = ["ConfigError", "Result", "RunConfig", "compose", "simulate", "validate_config"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
