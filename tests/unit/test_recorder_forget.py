"""The end of a run lets go of each table's rows right after building it (issue 8), and the
result is the one a run that keeps every row until it returns gives: every table, the summary
and the pass count."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pandas as pd
import pytest

import servesim.sim as sim
from servesim.metrics.recorder import TABLES, Recorder
from servesim.metrics.summary import without_wall

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
FRAMES = ("requests", "passes", "kv", "kv_events", "transfers", "routing")


def rows() -> list[dict[str, Any]]:
    out = []
    for k in range(24):
        n_blocks = 3 + k % 4
        out.append(
            {
                "timestamp": 4 * k,
                "input_length": 64 * n_blocks - 5,
                "output_length": 2 + k % 6,
                "hash_ids": [k % 2, *range(100 * k, 100 * k + n_blocks - 1)],
            }
        )
    return out


def disagg_kv_router(config, trace):
    """1P2D over a slow link (transfers), the KV router (routing rows), KV events kept."""
    return config(
        workload={"kind": "mooncake", "path": trace(rows()), "trace_block_size": 64},
        timing=FIXED,
        topology={"kind": "disagg", "num_prefill_workers": 1, "num_decode_workers": 2},
        link={"bandwidth_gbps": 5.0},
        router={"kind": "kv"},
        output={"progress": "off", "kv_events": True},
    )


def host_offload(config, trace):
    """2 aggregated workers with small pools and host blocks (tier copies as transfers)."""
    return config(
        workload={"kind": "mooncake", "path": trace(rows()), "trace_block_size": 64},
        timing=FIXED,
        engine={"num_gpu_blocks": 24, "block_size": 64},
        topology={"kind": "aggregated", "num_workers": 2},
        kv_cache={"host_offload": {"num_host_blocks": 64}},
    )


def run(cfg: Any, recorder: type[Recorder], monkeypatch: pytest.MonkeyPatch):
    made: list[Recorder] = []

    def make(**options: Any) -> Recorder:
        made.append(recorder(**options))
        return made[-1]

    with monkeypatch.context() as m:
        m.setattr(sim, "Recorder", make)
        result = sim.simulate(cfg)
    return result, made[0]


class Keeping(Recorder):
    def forget_rows(self) -> None:
        """Keep every row until the run returns (the end of a run before issue 8)."""


def summary_json(result: sim.Result) -> str:
    out = without_wall(result.summary)
    out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "versions"}
    return json.dumps(out, sort_keys=True, default=str)


@pytest.mark.parametrize("scenario", [disagg_kv_router, host_offload])
def test_tables_built_one_at_a_time_are_the_tables(scenario, config, trace, monkeypatch):
    cfg = scenario(config, trace)
    lean, rec = run(cfg, Recorder, monkeypatch)
    kept, _ = run(cfg, Keeping, monkeypatch)
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(lean, name), getattr(kept, name), check_exact=True)
    assert summary_json(lean) == summary_json(kept)
    assert len(lean.transfers) > 0 and len(lean.passes) > 0
    if scenario is disagg_kv_router:
        assert len(lean.routing) > 0 and len(lean.kv_events) > 0
    # nothing is left in the recorder but the pass count
    assert len(rec.requests) == len(rec.late_values) == len(rec.kv) == 0
    assert not (rec.transfers or rec.routing or rec.kv_events)
    assert len(rec.passes) == 0
    assert rec.n_passes == len(lean.passes) == lean.summary["n_passes"]


def test_only_known_tables_can_be_named():
    rec = Recorder()
    with pytest.raises(ValueError, match="unknown table"):
        rec.table_built("request")
    assert set(TABLES) == set(FRAMES)


def test_the_passes_table_is_built_when_first_read(config, trace, monkeypatch):
    """simulate() returns before building the passes table (a run read through its summary
    and requests never pays for it); the first read, of the result or of a copy made before
    it, builds it once and lets go of the rows."""
    cfg = host_offload(config, trace)
    result, rec = run(cfg, Recorder, monkeypatch)
    assert callable(vars(result)["passes"])
    assert len(rec.passes) > 0  # the rows wait in the recorder
    copy = dataclasses.replace(result, token_times={})
    passes = result.passes
    assert isinstance(passes, pd.DataFrame) and len(passes) == result.summary["n_passes"] > 0
    assert result.passes is passes and copy.passes is passes
    assert len(rec.passes) == 0
    kept, _ = run(cfg, Keeping, monkeypatch)
    pd.testing.assert_frame_equal(passes, kept.passes, check_exact=True)
