"""The machine and checkout a benchmark ran on: CPU, memory, load, commit, build, versions."""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_replay_cases import REPO


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def mem_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2  # kB
    except (OSError, ValueError, IndexError):
        pass
    return math.nan


def _version(python: str, dist: str) -> str | None:
    code = f"from importlib.metadata import version; print(version({dist!r}))"
    try:
        return subprocess.run(
            [python, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def revision(env_info: dict[str, Any]) -> str:
    git = env_info.get("servesim_git")
    where = f"git {git}" if git else f"from {env_info['servesim_repo']} (not a git checkout)"
    build = env_info.get("servesim_native")
    return f"{where}, {'native build ' + build if build else 'source (no native build)'}"


def _native_build(python: str) -> str | None:
    """The native build (model/speed/native.py) the servesim interpreter uses, if any."""
    code = "import servesim, servesim.speed.native as n; print(n.ACTIVE or '')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def environment(args: argparse.Namespace, mocker_python: str | None) -> dict[str, Any]:
    return {
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "mem_total_gb": mem_total_gb(),
        "loadavg_start": os.getloadavg(),
        "servesim_python": args.servesim_python,
        "servesim_native": _native_build(args.servesim_python),
        "servesim_repo": str(REPO),
        "servesim_git": _git("describe", "--always", "--dirty"),
        "servesim_git_dirty_files": (
            _git("status", "--porcelain", "--untracked-files=no") or ""
        ).splitlines(),
        "python": platform.python_version(),
        "mocker_python": mocker_python,
        "mocker_version": _version(mocker_python, "ai-dynamo-runtime") if mocker_python else None,
        "mocker_max_requests": args.mocker_max_requests,
        "servesim_overrides": list(args.servesim_override),
        "trace_cache": str(args.trace_cache),
        "repeat": args.repeat,
    }
