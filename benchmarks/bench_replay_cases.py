"""The benchmark's cases: the named ones, the --scale ones, and the traces generated for them."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
COMPARE = EXPERIMENTS / "compare_dynamo.py"

CONV = "conversation_trace.jsonl"


@dataclass(frozen=True)
class CaseSpec:
    name: str
    trace: str  # file name under --traces; "" for a generated trace (path from the cache)
    workers: int  # aggregated workers; in P/D, prefill + decode workers
    label: str
    generated: int = 0  # >0: number of requests of a generated trace
    pd: str | None = None  # "PxD" pools, composed as `compare_dynamo.py --pd PxD`
    overrides: tuple[str, ...] = ()  # Hydra overrides; compare_dynamo translates them too


CASES: dict[str, CaseSpec] = {
    "conv4": CaseSpec("conv4", CONV, 4, "conversation trace, 4 workers (main case)"),
    "conv1": CaseSpec("conv1", CONV, 1, "conversation trace, 1 worker"),
    "conv2": CaseSpec("conv2", CONV, 2, "conversation trace, 2 workers"),
    "synth2": CaseSpec("synth2", "synthetic_trace.jsonl", 2, "synthetic trace, 2 workers"),
    "synth100k": CaseSpec(
        "synth100k", "", 2, "generated Mooncake-style trace, 2 workers", generated=100_000
    ),
    "kv4": CaseSpec(
        "kv4", CONV, 4, "conversation trace, 4 workers, KV router", overrides=("router=kv",)
    ),
    "pd22": CaseSpec(
        "pd22", CONV, 4, "conversation trace, 2P2D (2 prefill + 2 decode workers)", pd="2x2"
    ),
}
DEFAULT_CASES = "conv4,conv1,conv2,synth2"

# generated traces (synth100k, --scale): statistics fitted to synthetic_trace.jsonl (module doc)
SCALE_RATE_RPS = 3.9
SCALE_SEED = 0
SCALE_WORKLOAD: dict[str, Any] = {
    "kind": "synthetic",
    "turns_per_session": 1,
    "input_tokens": {"dist": "lognormal", "mean": 15325, "std": 18380, "min": 13, "max": 191378},
    "output_tokens": {"dist": "lognormal", "mean": 149, "std": 178, "min": 1, "max": 893},
    "shared_prefix_ratio": 0.3,
    "num_prefix_groups": 50,
    "trace_block_size": 512,
    "rate_rps": SCALE_RATE_RPS,
}
# arrival gaps are drawn in chunks of this many (the same numbers as one draw of all of them)
GAP_CHUNK = 65_536
# bump when generate_trace writes different rows for the same settings (invalidates the cache)
TRACE_FORMAT = 1


# --------------------------------------------------------------------------- configs


def compare_module() -> Any:
    """experiments/compare_dynamo.py (config composition and the mocker translation)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_dynamo", COMPARE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compose_case(spec: CaseSpec, trace: Path, compare: Any, extra: Sequence[str] = ()) -> Any:
    """The case's servesim RunConfig, composed as compare_dynamo.py composes it (`--pd PxD`
    for P/D cases, else `--workers N`, then the case's and `extra` overrides)."""
    shape = compare.parse_pd(spec.pd) if spec.pd else spec.workers
    return compare.compose_run_config(trace, shape, [*spec.overrides, *extra])


# --------------------------------------------------------------------------- generated traces


def _size_tag(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def trace_cache_name(n: int, seed: int = SCALE_SEED) -> str:
    """The cache file name of a generated trace: size, seed and a digest of everything that
    decides its rows (generator settings, the generator's and the streams' source, numpy)."""
    import numpy as np

    from servesim.sim import STREAMS
    from servesim.workload import synthetic

    key = {
        "format": TRACE_FORMAT,
        "workload": SCALE_WORKLOAD,
        "rate_rps": SCALE_RATE_RPS,
        "gap_chunk": GAP_CHUNK,
        "streams": list(STREAMS),
        "generator": hashlib.sha256(Path(synthetic.__file__).read_bytes()).hexdigest(),
        "numpy": np.__version__,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"mooncake_{n}_seed{seed}_{digest}.jsonl"


def cached_trace(n: int, cache: Path) -> tuple[Path, dict[str, Any], bool]:
    """A generated trace of `n` requests from the cache, generating it first if it is missing;
    its statistics (kept next to it as .json) and whether it was generated now."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / trace_cache_name(n)
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return path, json.loads(meta.read_text()), False
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    t0 = time.perf_counter()
    try:
        stats = generate_trace(n, partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    stats["generate_s"] = time.perf_counter() - t0
    os.replace(partial, path)  # a trace in the cache is always complete
    stats["bytes"] = path.stat().st_size
    meta.write_text(json.dumps(stats, indent=1) + "\n")
    return path, stats, True


def generate_trace(n: int, path: Path, seed: int = SCALE_SEED) -> dict[str, Any]:
    """A Mooncake JSONL trace of `n` single-turn requests (servesim's synthetic generator for
    lengths and hash ids, Poisson arrivals rounded to whole ms), streamed to `path` row by
    row. Returns its statistics. Only the lengths (16 bytes a row) stay in memory, for them."""
    import numpy as np

    from servesim.config.schema import SyntheticWorkload
    from servesim.sim import random_streams
    from servesim.workload.synthetic import generate

    cfg = SyntheticWorkload.model_validate({**SCALE_WORKLOAD, "num_sessions": n})
    streams = random_streams(seed)
    mean_gap_ms = 1000.0 / SCALE_RATE_RPS
    inputs = np.empty(n, dtype=np.int64)
    outputs = np.empty(n, dtype=np.int64)
    t = last_t = 0.0  # the first request arrives at 0, request i at the sum of i gaps
    gaps: Any = ()
    with path.open("w") as fh:
        rows = generate(cfg, streams["lengths"], streams["prefix_groups"])
        for i, row in enumerate(rows):
            if i % GAP_CHUNK == 0:
                gaps = streams["arrivals"].exponential(mean_gap_ms, size=min(GAP_CHUNK, n - i))
            inputs[i] = row.input_length
            outputs[i] = row.output_length
            rec = {
                "timestamp": int(round(t)),
                "input_length": row.input_length,
                "output_length": row.output_length,
                "hash_ids": row.hash_ids,
            }
            fh.write(json.dumps(rec) + "\n")
            last_t, t = t, t + float(gaps[i % GAP_CHUNK])
    return {
        "requests": n,
        "span_s": last_t / 1000.0,
        "input_mean": float(np.mean(inputs)),
        "input_std": float(np.std(inputs)),
        "input_median": float(np.median(inputs)),
        "output_mean": float(np.mean(outputs)),
        "output_std": float(np.std(outputs)),
        "total_input_tokens": int(np.sum(inputs)),
        "bytes": path.stat().st_size,
        "seed": seed,
    }


def count_rows(path: Path) -> int:
    """Rows of a JSONL trace (its lines), read in 1 MB pieces: for --mocker-max-requests."""
    n = 0
    last = b"\n"
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")  # a last row without a newline


# --------------------------------------------------------------------------- --scale cases


def make_scale_spec(n: int, workers: int) -> CaseSpec:
    """A --scale case: a generated trace of `n` requests on `workers` workers (scale-10k-4w)."""
    return CaseSpec(
        f"scale-{_size_tag(n)}-{workers}w",
        "",
        workers,
        f"generated Mooncake-style trace, {workers} worker{'s' if workers > 1 else ''}",
        generated=n,
    )


def scale_spec(name: str) -> CaseSpec | None:
    """The --scale case a name such as scale-10k-4w or scale-1M-4w stands for, else None."""
    m = re.fullmatch(r"scale-(\d+)([kM]?)-(\d+)w", name)
    if m is None or int(m[1]) < 1 or int(m[3]) < 1:
        return None
    return make_scale_spec(int(m[1]) * {"": 1, "k": 1000, "M": 1_000_000}[m[2]], int(m[3]))


def scale_specs(args: argparse.Namespace) -> list[CaseSpec]:
    """The --scale cases: every size on every worker count."""
    return [make_scale_spec(n, w) for w in args.scale_workers for n in args.scale_sizes]
