"""Compose the shipped Hydra config (servesim.conf) into a validated RunConfig, from anywhere.

    from servesim import compose, simulate
    cfg = compose(["topology=disagg", "workload.num_sessions=20"])
    result = simulate(cfg)

The same composition the `servesim` command does, without a run directory or the cwd: the
configs are read from the installed package, so a notebook copied out of the repository runs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from servesim.config.load import ConfigError, schema_knows, validate_config
from servesim.config.rules import ENGINE_ONLY_KEYS
from servesim.config.schema import RunConfig

CONFIG_MODULE = "servesim.conf"
CONFIG_NAME = "config"


def to_data(cfg: Any) -> dict[str, Any]:
    """A composed DictConfig as the plain mapping the schema validates (interpolations resolved,
    Hydra's own section dropped)."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config: {e}") from None
    assert isinstance(data, Mapping)
    return {str(k): v for k, v in data.items() if k != "hydra"}


def compose_data(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The shipped config with Hydra `overrides` applied, as a plain (unvalidated) mapping;
    raises ConfigError for an override Hydra cannot apply (an unknown key or option)."""
    if GlobalHydra.instance().is_initialized():
        # inside a Hydra app (or a test's initialize): compose on our own, then put it back
        saved = GlobalHydra.instance().hydra
        GlobalHydra.instance().clear()
    else:
        saved = None
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            composed = hydra_compose(CONFIG_NAME, overrides=list(overrides))
    except (ConfigCompositionException, OverrideParseException, MissingConfigException) as e:
        raise ConfigError(composition_message(e)) from None
    finally:
        if saved is not None:
            GlobalHydra.instance().initialize(saved)
    return to_data(composed)


def compose(overrides: Sequence[str] = ()) -> RunConfig:
    """The shipped config with Hydra `overrides` applied (`["topology=disagg",
    "workload.num_sessions=20"]`), validated; raises ConfigError naming each bad config path."""
    return validate_config(compose_data(overrides))


def _composed(node: Any) -> dict[str, Any]:
    """The composed config that `node` is part of, as a plain mapping ({} if unreadable)."""
    root = node
    while getattr(root, "_get_parent", None) is not None and root._get_parent() is not None:
        root = root._get_parent()
    try:
        data = OmegaConf.to_container(root, resolve=False)
    except OmegaConfBaseException:
        return {}
    if not isinstance(data, dict):
        return {}
    data.pop("hydra", None)
    return {str(k): v for k, v in data.items()}


def _engine_owner(full_key: str) -> str:
    """The engine kind whose own key `full_key` is (engine.K, topology.ROLE.K), else ""."""
    head, _, key = full_key.rpartition(".")
    if head not in ("engine", "topology.prefill", "topology.decode"):
        return ""
    return next((kind for kind, keys in ENGINE_ONLY_KEYS.items() if key in keys), "")


def _suggest(word: str, options: Sequence[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def composition_message(e: HydraException) -> str:
    """One clear line for an override Hydra could not apply: an unknown key or option, with
    the closest known one."""
    if isinstance(e, MissingConfigException) and e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        options = list(e.options or [])
        if group and options:
            return (
                f"unknown option {group}={option}"
                + _suggest(option, options, f"{group}=")
                + f"; the options of {group}: {', '.join(options)}"
            )
        return f"no config {e.missing_cfg_file} in conf/ (not a config group option)"
    cause = e.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        full_key = str(getattr(cause, "full_key", ""))
        parent = getattr(cause, "parent_node", None)
        siblings = [str(k) for k in parent if k != "hydra"] if parent is not None else []
        key = str(getattr(cause, "key", full_key.rpartition(".")[2]))
        stem = full_key[: len(full_key) - len(key)]
        composed = _composed(parent)
        owner = _engine_owner(full_key)
        if owner and (composed.get("engine") or {}).get("kind") != owner:
            return (
                f"{full_key}: a key of engine={owner} only, which the chosen engine option "
                f"does not read (choose engine={owner})"
            )
        if schema_knows(composed, full_key):  # a key the chosen option files leave out
            plus = re.search(r"use (\+\S+)", str(e))
            return (
                f"{full_key} is a config key the chosen option files do not set: add it "
                f"with {plus.group(1) if plus else '+' + full_key + '=VALUE'}"
            )
        return f"unknown key {full_key}" + _suggest(key, siblings, stem)
    if isinstance(e, OverrideParseException):
        return f"cannot parse the override {e.override}: {e.message}"
    return str(e).split("\nConfig search path:")[0].strip()
