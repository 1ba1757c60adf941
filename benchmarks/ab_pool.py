"""The G1 pool per block against the pool by trace-block group, on one case: simulate() CPU time
and a digest of the requests, passes and KV tables (equal digests: the same answers).

    .venv/bin/python benchmarks/ab_pool.py TRACE WORKERS block|group [OVERRIDE ...]

The case is composed as experiments/compare_dynamo.py composes it (experiment=dynamo_compat).
Run both modes alternately several times: one process per run, CPU time of simulate() only.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import compare_dynamo  # noqa: E402

from servesim import simulate  # noqa: E402


def main(argv: list[str]) -> None:
    trace, workers, mode, *overrides = argv
    if mode not in ("block", "group"):
        raise SystemExit(f"mode must be block or group, got {mode!r}")
    if mode == "block":  # every rank per block, whatever the run's trace blocks
        overrides = [*overrides, "speed.grouped_pool=false"]
    cfg = compare_dynamo.compose_run_config(Path(trace), int(workers), overrides)
    start = time.process_time()
    result = simulate(cfg)
    cpu_s = time.process_time() - start
    digests = {
        name: hashlib.sha1(getattr(result, name).to_csv().encode()).hexdigest()[:12]
        for name in ("requests", "passes", "kv")
    }
    print(mode, "simulate_cpu_s", round(cpu_s, 2), *(f"{k}={v}" for k, v in digests.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
