"""benchmarks/profile_parts.py: a profile's own time grouped by part of the model."""

from __future__ import annotations

import cProfile
import gc
import importlib.util
from pathlib import Path

import pytest

from servesim.kv.block_pool import BlockPool
from servesim.speed import native
from servesim.workload.request import Request

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_parts.py"


@pytest.fixture(scope="module")
def parts():
    spec = importlib.util.spec_from_file_location("profile_parts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    native.ACTIVE is not None, reason="cProfile sees no frames of the compiled modules"
)
def test_block_pool_work_is_counted_as_the_pool_and_shares_add_up(parts, tmp_path, capsys):
    pool = BlockPool(4096)
    prof = cProfile.Profile()
    # Own times are wall times: a garbage collection or a moment descheduled (a few ms) lands
    # on whichever function runs then. Enough work (tens of ms) and no collection keep one such
    # moment from deciding the shares (with 300 requests and collection on, 1 run in 3 failed
    # on a loaded machine).
    gc.disable()
    prof.enable()
    try:
        for k in range(3000):
            req = Request(k, str(k), 640, 1, [])
            pool.allocate(req, 10)
            pool.register_many(req, [k * 100 + j for j in range(10)])
            pool.release(req)
    finally:
        prof.disable()
        gc.enable()
    path = tmp_path / "pool.prof"
    prof.dump_stats(path)
    total, by_part = parts.shares(path)
    assert sum(by_part.values()) == pytest.approx(total)
    assert by_part["block pool (G1)"] > 0.5 * total  # builtins count with their caller
    assert parts.part_of("/x/model/router/kv.py:route") == "KV router"
    assert parts.part_of("/x/somewhere.py:f") == parts.OTHER
    assert parts.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| profile | profiled s | block pool (G1) |")
    assert out[2].startswith("| `pool.prof` |")
