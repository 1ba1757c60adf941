"""Run Dynamo's mocker offline trace replay once; used by experiments/compare_dynamo.py.

Runs inside the mocker's own interpreter (the one that has `dynamo._core`), with the standard
library only:

    MOCKER_PYTHON experiments/_mocker_runner.py REQUEST.json RESULT.json

(MOCKER_PYTHON: a virtual environment's python with `pip install ai-dynamo-runtime==1.6.1`.)

REQUEST.json is `{"trace_files": [...], "kwargs": {...}}` (keyword arguments of
`dynamo._core.run_mocker_trace_replay`; a `router_config` dict becomes a `KvRouterConfig`);
RESULT.json receives
`{"summary": {...}, "call_wall_s": float, "coverage": {...}}`. compare_dynamo.py also imports
`run()` directly when `dynamo._core` is importable in its own interpreter.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def run(trace_files: list[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    """One offline replay; the summary, the host wall time of the call and the coverage."""
    import dynamo._core as core

    kwargs = dict(kwargs)
    if isinstance(kwargs.get("router_config"), dict):  # JSON cannot carry the object
        kwargs["router_config"] = core.KvRouterConfig.from_json(json.dumps(kwargs["router_config"]))
    start = time.perf_counter()
    result = core.run_mocker_trace_replay(list(trace_files), **kwargs)
    wall = time.perf_counter() - start
    summary = result if isinstance(result, dict) else result.summary
    coverage = getattr(result, "coverage", None)
    return {"summary": dict(summary), "call_wall_s": wall, "coverage": coverage}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as fh:
        request = json.load(fh)
    out = run(request["trace_files"], request.get("kwargs", {}))
    with open(argv[2], "w") as fh:
        json.dump(out, fh, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
