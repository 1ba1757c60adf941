"""Shared test fixtures: small validated configs and trace files written to tmp_path."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from servesim.config import RunConfig, validate_config

REPO = Path(__file__).resolve().parents[1]
# the public traces (not in the repo): ../shared/traces beside the checkout, or where
# SERVESIM_SHARED_TRACES says
SHARED_TRACES = Path(os.environ.get("SERVESIM_SHARED_TRACES", REPO.parent / "shared" / "traces"))


# the installed `servesim` command (the console script next to this interpreter)
SERVESIM = Path(sys.executable).parent / "servesim"
if not SERVESIM.exists():
    SERVESIM = Path(shutil.which("servesim") or "servesim")


def run_servesim(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `servesim ARGS` in a child process from `cwd`, its output captured as text."""
    return subprocess.run(
        [str(SERVESIM), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def shared_trace(name: str) -> Path:
    """The public trace `name`. Missing, the test fails under CI (`CI` set: the checkout must
    have ../shared beside it) and is skipped, saying why, elsewhere."""
    path = SHARED_TRACES / name
    if not path.is_file():
        why = f"{path} is missing (public traces: ../shared/traces or $SERVESIM_SHARED_TRACES)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path


LLAMA3_8B = {
    "name": "llama3_8b",
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "num_params_b": 8.03,
}
H100 = {
    "name": "h100_sxm",
    "hbm_gb": 80,
    "hbm_bandwidth_tbps": 3.35,
    "bf16_tflops": 989,
    "fp8_tflops": 1979,
    "nvlink_gbps": 900,
    "host_link_gbps": 64,
}
BASE: dict[str, Any] = {
    "llm": LLAMA3_8B,
    "hardware": H100,
    "engine": {"kind": "vllm", "num_gpu_blocks": 16384},
    "topology": {"kind": "aggregated", "num_workers": 1},
    "workload": {"kind": "mooncake", "path": "unset"},
    "output": {"progress": "off"},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and "kind" not in v:
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def make_config(**sections: Any) -> RunConfig:
    """A validated RunConfig: BASE with each given section merged in (a section that names a
    `kind` replaces the default one)."""
    return validate_config(_merge(BASE, sections))


# three requests (two share a prefix block, one decodes nothing): the CLI and run-output tests
TINY_ROWS: list[dict[str, Any]] = [
    {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]},
    {"timestamp": 10, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]},
    {"timestamp": 25, "input_length": 300, "output_length": 0, "hash_ids": [4]},
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def config() -> Callable[..., RunConfig]:
    return make_config


@pytest.fixture
def trace(tmp_path: Path) -> Callable[[list[dict[str, Any]]], str]:
    """Write rows as a Mooncake JSONL file; returns its path."""
    counter = iter(range(1_000_000))

    def write(rows: list[dict[str, Any]]) -> str:
        return str(write_jsonl(tmp_path / f"trace{next(counter)}.jsonl", rows))

    return write


@pytest.fixture
def one_request_agentic_file(tmp_path: Path) -> Path:
    """An agentic Mooncake v2 file: its header and one play of one request."""
    header = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64}
    row = {
        "request_id": "r0",
        "play_id": "p",
        "session_id": "s",
        "model": "m",
        "input_length": 64,
        "output_length": 2,
        "hash_ids": [1],
        "not_before_ms": 0,
    }
    return write_jsonl(tmp_path / "agentic.jsonl", [header, row])


@cache
def compare_dynamo_module() -> ModuleType:
    """experiments/compare_dynamo.py, imported as a module (experiments/ is not a package)."""
    path = REPO / "experiments" / "compare_dynamo.py"
    spec = importlib.util.spec_from_file_location("compare_dynamo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
