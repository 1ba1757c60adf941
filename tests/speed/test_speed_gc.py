"""The event loop runs with the cyclic garbage collector paced for it (the speed layer's
`speed.gc_tuning`, servesim.speed.gc): what came before the loop frozen, young collections
further apart; all restored after. With it off, the interpreter's settings stay as they are."""

from __future__ import annotations

import gc
from typing import Any

import servesim.sim as sim
from servesim.speed.gc import GC_YOUNG_THRESHOLD

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
ROWS = [
    {"timestamp": 5 * k, "input_length": 200, "output_length": 4, "hash_ids": [0, k + 1, k + 2, 0]}
    for k in range(20)
]


def test_a_run_paces_the_collector_and_restores_it(config, trace, monkeypatch):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(ROWS), "trace_block_size": 64}, timing=FIXED
    )
    seen: dict[str, Any] = {}
    loop = sim._run_loop

    def watched(*args: Any) -> None:
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()
        seen["enabled"] = gc.isenabled()
        loop(*args)

    monkeypatch.setattr(sim, "_run_loop", watched)
    before = gc.get_threshold()
    result = sim.simulate(cfg)
    assert result.summary["completed_requests"] == 20
    assert seen["threshold"] == (GC_YOUNG_THRESHOLD, *before[1:])
    assert seen["frozen"] > 0 and seen["enabled"]
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_objects_the_caller_froze_stay_frozen(config, trace):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(ROWS), "trace_block_size": 64}, timing=FIXED
    )
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        sim.simulate(cfg)
        # still frozen (a few frozen objects may have been freed since): not unfrozen by the run
        assert frozen - 100 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_with_gc_tuning_off_the_collector_is_left_alone(config, trace, monkeypatch):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(ROWS), "trace_block_size": 64},
        timing=FIXED,
        speed={"gc_tuning": False},
    )
    seen: dict[str, Any] = {}
    loop = sim._run_loop

    def watched(*args: Any) -> None:
        seen["threshold"] = gc.get_threshold()
        loop(*args)

    monkeypatch.setattr(sim, "_run_loop", watched)
    before = gc.get_threshold()
    sim.simulate(cfg)
    assert seen["threshold"] == before
