"""The recorder's compact rows give exactly the tables a tuple per row gives (issue 8).

`Recorder.requests` and `Recorder.kv` keep their rows column by column (typed arrays, codes for
the few distinct strings, -1 for a missing worker). Each run here records through a recorder
that also keeps the straightforward rows (a tuple per call, as the recorder stored them before)
and checks that the tables built both ways are equal, dtypes included; with the rows moved into
the columns every 3 rows too, so the chunk boundaries are crossed. `output.pass_table=false`
keeps no pass rows: passes are only counted, and nothing else changes.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

import servesim.sim as sim
from servesim import simulate
from servesim.metrics.columns import Appended, Columns
from servesim.metrics.recorder import COMPLETED, Recorder
from servesim.metrics.records import REQUEST_DTYPES
from servesim.metrics.summary import without_wall
from servesim.metrics.tables import STR, kv_table, passes_table, requests_table
from servesim.workload.request import Request

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
OLD_REQUEST_COLUMNS = (
    "_idx",
    "request_id",
    "session_id",
    "turn_index",
    "arrival_ms",
    "first_admit_ms",
    "first_token_ms",
    "last_token_ms",
    "terminal_ms",
    "ttft_ms",
    "ttst_ms",
    "tpot_ms",
    "e2e_latency_ms",
    "input_length",
    "requested_output_length",
    "output_length",
    "reused_input_tokens",
    "g1_reused_input_tokens",
    "host_reused_input_tokens",
    "disk_reused_input_tokens",
    "first_admission_reused_input_tokens",
    "prefill_worker_idx",
    "decode_worker_idx",
    "dp_rank",
    "n_preemptions",
    "n_admissions",
    "n_readmissions",
    "terminal_status",
    "reason",
    "prefill_dp_rank",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "decode_reused_input_tokens",
    "transfer_tokens",
)
OLD_KV_COLUMNS = ("t_ms", "pool", "tier", "used_blocks", "cached_blocks", "worker", "dp_rank")

# ------------------------------------------------------------------ the tuple-per-row reference


def reference_row(req: Request, status: str, now_ms: float, reason: str) -> tuple:
    """The row a request's end recorded as one tuple (None for a missing worker)."""
    n = req.num_output_tokens
    first = req.first_token_ms
    return (
        req.idx,
        req.request_id,
        req.session_id,
        req.turn_index,
        req.arrival_ms,
        req.first_admit_ms,
        first,
        req.last_token_ms,
        now_ms,
        first - req.arrival_ms if n else math.nan,
        req.second_token_ms - first if n >= 2 else math.nan,
        (req.last_token_ms - first) / (n - 1) if n >= 2 else math.nan,
        req.last_token_ms - req.arrival_ms if n else math.nan,
        req.input_length,
        req.output_length,
        n,
        req.reused_input_tokens,
        req.reused_input_tokens - req.host_reused_input_tokens - req.disk_reused_input_tokens,
        req.host_reused_input_tokens,
        req.disk_reused_input_tokens,
        req.first_admission_reused_tokens,
        req.prefill_worker_idx if req.prefill_worker_idx >= 0 else None,
        req.worker_idx if req.worker_idx >= 0 else None,
        req.dp_rank,
        req.n_preemptions,
        req.n_prefill_admissions + req.n_admissions,
        max(req.n_prefill_admissions - 1, 0) + max(req.n_admissions - 1, 0),
        status,
        reason,
        req.prefill_dp_rank if req.prefill_worker_idx >= 0 else None,
        req.prefill_admit_ms,
        req.source_held_ms,
        req.destination_reserved_ms,
        req.destination_activated_ms,
        req.decode_admit_ms,
        req.source_released_ms,
        req.decode_reused_input_tokens,
        req.transfer_tokens,
    )


def reference_requests(
    rows: list[tuple], late: dict[tuple[int, str], Any], engine: str | None = None
) -> pd.DataFrame:
    """The requests table from tuple rows, with `engine` in every row (null for None)."""
    df = pd.DataFrame.from_records(rows, columns=list(OLD_REQUEST_COLUMNS))
    if late:
        row = pd.Series(range(len(df)), index=df["_idx"])
        for (idx, column), value in late.items():
            df.loc[row[idx], column] = value
    df = df.sort_values("_idx", kind="stable").drop(columns="_idx").reset_index(drop=True)
    engines = pd.array([engine if engine is not None else np.nan] * len(df), dtype=STR)
    df.insert(df.columns.get_loc("dp_rank") + 1, "engine", engines)
    return df.astype(REQUEST_DTYPES)


def reference_kv(rows: list[tuple]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(rows, columns=list(OLD_KV_COLUMNS))
    return df.sort_values(["t_ms", "pool"], kind="stable").reset_index(drop=True)


class TwinRecorder(Recorder):
    """A recorder that also keeps every request end, late value and KV level as a tuple."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ref_requests: list[tuple] = []
        self.ref_late: dict[tuple[int, str], Any] = {}
        self.ref_kv: list[tuple] = []
        self.pass_calls: list[tuple[str, tuple]] = []

    def forget_rows(self) -> None:
        """Keep the rows after the run: the tests build the tables from them again."""

    def request_terminal(self, req: Request, status: str, now_ms: float, reason: str = "") -> None:
        self.ref_requests.append(reference_row(req, status, now_ms, reason))
        super().request_terminal(req, status, now_ms, reason)

    def request_late(self, req: Request, column: str, value: Any) -> None:
        self.ref_late[(req.idx, column)] = value
        super().request_late(req, column, value)

    def kv_level(self, *args: Any) -> None:
        self.ref_kv.append(args + (-1, 0)[len(args) - 5 :])  # the defaults, as the call had them
        super().kv_level(*args)

    def pass_done(self, *args: Any, **kwargs: Any) -> None:
        self.pass_calls.append(("pass_done", args, kwargs))  # type: ignore[arg-type]
        super().pass_done(*args, **kwargs)

    def pass_stretch(self, *args: Any) -> None:
        # the caller may reuse its lists: keep copies
        self.pass_calls.append(("pass_stretch", tuple(_copy(a) for a in args)))
        super().pass_stretch(*args)


def _copy(value: Any) -> Any:
    return value[:] if isinstance(value, list | array) else value


@pytest.fixture
def twin_run(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[sim.Result, TwinRecorder]]:
    """simulate(cfg) through a TwinRecorder (given `output.pass_table` even if simulate does not
    pass it on); returns the result and the recorder."""

    def run(cfg: Any) -> tuple[sim.Result, TwinRecorder]:
        made: list[TwinRecorder] = []

        def make(**options: Any) -> TwinRecorder:
            made.append(TwinRecorder(**{"pass_table": cfg.output.pass_table, **options}))
            return made[-1]

        with monkeypatch.context() as m:
            m.setattr(sim, "Recorder", make)
            result = simulate(cfg)
        (rec,) = made
        return result, rec

    return run


def assert_same_tables(result: sim.Result, rec: TwinRecorder) -> None:
    engine = rec.engines.get("decode", rec.engines.get("aggregated"))
    expected = reference_requests(rec.ref_requests, rec.ref_late, engine)
    pd.testing.assert_frame_equal(requests_table(rec), expected, check_exact=True)
    pd.testing.assert_frame_equal(result.requests, expected, check_exact=True)
    expected_kv = reference_kv(rec.ref_kv)
    pd.testing.assert_frame_equal(kv_table(rec), expected_kv, check_exact=True)
    pd.testing.assert_frame_equal(result.kv, expected_kv, check_exact=True)
    assert rec.n_passes == len(passes_table(rec)) == len(result.passes)
    assert result.summary["n_passes"] == rec.n_passes


# ------------------------------------------------------------------ scenarios


def row(t: float | None, n_in: int, n_out: int, first_id: int, **extra: Any) -> dict[str, Any]:
    ids = list(range(first_id, first_id + -(-n_in // 64)))
    out = {"input_length": n_in, "output_length": n_out, "hash_ids": ids, **extra}
    if t is not None:
        out["timestamp"] = t
    return out


def aggregated(config, trace):
    """2 workers; shared prefixes, a 3-turn session among single requests, arrivals at t=0."""
    rows = [
        row(0, 300, 4, 0),
        row(0, 300, 6, 0),
        row(0, 200, 3, 50, session_id="s0"),
        row(None, 260, 5, 50, session_id="s0", delay=2.5),
        row(None, 330, 2, 50, session_id="s0", delay=1.0),
        row(3.5, 640, 8, 100),
        row(7.25, 128, 1, 0),
        row(9, 900, 12, 200),
        row(30, 64, 0, 300),
    ]
    return config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        topology={"kind": "aggregated", "num_workers": 2},
    )


def closed_loop_at_zero(config, trace):
    """Every request dispatched at SimPy's integer t=0: arrival_ms comes out int64."""
    rows = [row(0, 100 * (k + 1), 3, 10 * k) for k in range(4)]
    return config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        load={"kind": "concurrency", "concurrency": 8},
        timing=FIXED,
    )


def disagg_late_release(config, trace):
    """1P2D over a slow link; one-token requests end on the decode side before their source
    lets go of the KV, so the source release is set late."""
    rows = [row(5 * k, 1000, 1 + (k % 3 == 0), 20 * k) for k in range(8)]
    return config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        topology={"kind": "disagg", "num_prefill_workers": 1, "num_decode_workers": 2},
        link={"bandwidth_gbps": 5.0},
    )


def stopped(config, trace):
    """A stop at 25 ms: requests in flight and not yet arrived end incomplete."""
    rows = [row(t, 500, 3, 10 * k) for k, t in enumerate([0, 15, 18, 22, 30, 40])]
    return config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        stop={"max_virtual_time_ms": 25.0},
    )


def rejecting(config, trace):
    """16 blocks of 16 tokens: prompts over 256 tokens can never fit and are rejected."""
    rows = [row(k, [100, 400, 200, 5000, 60][k], 3, 10 * k) for k in range(5)]
    return config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        engine={"num_gpu_blocks": 16, "block_size": 16},
        timing=FIXED,
    )


SCENARIOS = {
    "aggregated_2w": aggregated,
    "closed_loop_at_zero": closed_loop_at_zero,
    "disagg_late_release": disagg_late_release,
    "stopped": stopped,
    "rejecting": rejecting,
}


@pytest.mark.parametrize("chunk", [3, Columns.CHUNK])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_tables_equal_the_tuple_reference(name, chunk, config, trace, twin_run, monkeypatch):
    """Requests and kv tables (content, column order, dtypes) as built from one tuple per
    row; every scenario exercises what its name says."""
    monkeypatch.setattr(Columns, "CHUNK", chunk)
    result, rec = twin_run(SCENARIOS[name](config, trace))
    assert_same_tables(result, rec)
    req = result.requests
    status = set(req.terminal_status)
    if name == "closed_loop_at_zero":
        assert (
            req.arrival_ms.dtype == np.float64 and (req.arrival_ms == 0).all()
        )  # (stamped as int 0)
    if name == "aggregated_2w":
        assert set(req.decode_worker_idx) == {0, 1}
        assert req.session_id.isna().sum() == 6 and (req.session_id == "s0").sum() == 3
        assert (req.reused_input_tokens > 0).any()
    if name == "disagg_late_release":
        assert rec.ref_late and len(rec.late_values) == len(rec.ref_late)
        assert req.prefill_worker_idx.notna().all() and set(req.decode_worker_idx) == {0, 1}
        late = req.source_released_ms > req.terminal_ms
        assert late.sum() == len(rec.ref_late)
    if name == "stopped":
        assert status == {COMPLETED, "incomplete"}
        assert len(set(req.reason)) == 3  # "", in flight, not arrived
        not_arrived = req.reason.str.startswith("not arrived")
        assert not_arrived.any() and (req.decode_worker_idx.isna() == not_arrived).all()
    if name == "rejecting":
        assert list(req.terminal_status) == [
            COMPLETED,
            "rejected",
            COMPLETED,
            "rejected",
            COMPLETED,
        ]
        assert req.first_admit_ms.isna().tolist() == [False, True, False, True, False]


def test_no_rows_give_the_empty_tables():
    rec = Recorder()
    pd.testing.assert_frame_equal(requests_table(rec), reference_requests([], {}))
    pd.testing.assert_frame_equal(kv_table(rec), reference_kv([]))
    assert rec.n_passes == 0 and len(passes_table(rec)) == 0


def test_a_float_column_of_ints_until_a_later_chunk_is_float(monkeypatch):
    """ints in the first chunk, a float in the second: float64, as pandas infers all values."""
    monkeypatch.setattr(Columns, "CHUNK", 2)
    rec = Recorder()
    times = [0, 0, 1, 2.5, 3]
    for t in times:
        rec.kv_level(t, "cluster.w0", "device", 1, 0, 0)
    assert kv_table(rec).t_ms.dtype == np.float64
    assert kv_table(rec).t_ms.tolist() == [0.0, 0.0, 1.0, 2.5, 3.0]
    ints = Recorder()
    for t in (0, 1, 2):
        ints.kv_level(t, "cluster.w0", "device", 1, 0, 0)
    assert kv_table(ints).t_ms.dtype == np.int64


def test_late_values_last_one_wins_and_nullable_columns():
    """Two late values for one cell: the second is kept; a late None makes an Int64 cell NA, a
    late number fills one."""
    rec = Recorder()
    reqs = [Request(i, f"r{i}", 10, 2, []) for i in (2, 0, 1)]
    for k, req in enumerate(reqs):
        req.arrival_ms = float(k)
        req.worker_idx = k - 1  # r2 has no worker (-1)
        rec.request_terminal(req, COMPLETED, 10.0 + k)
    rec.request_late(reqs[0], "source_released_ms", 11.5)
    rec.request_late(reqs[0], "source_released_ms", 12.5)
    rec.request_late(reqs[1], "decode_worker_idx", None)
    rec.request_late(reqs[0], "decode_worker_idx", 4)
    rec.request_late(reqs[2], "reason", "later")
    df = requests_table(rec)
    assert df.request_id.tolist() == ["r0", "r1", "r2"]
    assert df.source_released_ms.tolist()[2] == 12.5 and df.source_released_ms.isna().sum() == 2
    assert df.decode_worker_idx.tolist() == [pd.NA, 1, 4]
    assert df.reason.tolist() == ["", "later", ""]
    assert rec.late == {
        (2, "source_released_ms"): 12.5,
        (0, "decode_worker_idx"): None,
        (2, "decode_worker_idx"): 4,
        (1, "reason"): "later",
    }


# ------------------------------------------------------------------ output.pass_table


def _summary(result: sim.Result) -> str:
    out = without_wall(result.summary)
    out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "config"}
    return json.dumps(out, sort_keys=True, default=str)


@pytest.mark.parametrize("name", ["aggregated_2w", "disagg_late_release", "stopped"])
def test_without_the_pass_table_passes_are_only_counted(name, config, trace, twin_run):
    """pass_table=false: the passes table is empty with the columns and dtypes of the full one,
    the recorder counts as many passes as the full table has rows, and the requests and kv
    tables, the last event time and the summary are those of pass_table=true."""
    assert config(output={"pass_table": False}).output.pass_table is False  # validated
    cfg = SCENARIOS[name](config, trace)
    full, rec_full = twin_run(cfg)
    lean, rec_lean = twin_run(
        cfg.model_copy(update={"output": cfg.output.model_copy(update={"pass_table": False})})
    )
    assert len(full.passes) > 0 and rec_full.n_passes == len(full.passes)
    assert len(lean.passes) == 0 and len(passes_table(rec_lean)) == 0
    assert list(lean.passes.columns) == list(full.passes.columns)
    assert lean.passes.dtypes.to_dict() == full.passes.dtypes.to_dict()
    assert rec_lean.n_passes == len(full.passes) == lean.summary["n_passes"]
    assert rec_lean.last_event_ms == rec_full.last_event_ms
    pd.testing.assert_frame_equal(lean.requests, full.requests, check_exact=True)
    pd.testing.assert_frame_equal(lean.kv, full.kv, check_exact=True)
    assert _summary(lean) == _summary(full)


def test_a_lean_recorder_counts_the_calls_of_a_full_one(config, trace, twin_run):
    """The pass calls of a run (single passes and decode stretches) replayed on a recorder
    without the pass table: the same count and last event time as the table's."""
    cfg = aggregated(config, trace)
    result, rec = twin_run(
        cfg.model_copy(update={"speed": cfg.speed.model_copy(update={"fast_forward": True})})
    )
    kinds = {kind for kind, *_ in rec.pass_calls}
    assert kinds == {"pass_done", "pass_stretch"}
    lean = Recorder(pass_table=False)
    for kind, args, *kwargs in rec.pass_calls:
        getattr(lean, kind)(*args, **(kwargs[0] if kwargs else {}))
    assert lean.n_passes == rec.n_passes == len(result.passes)
    assert lean.last_event_ms == max(result.passes.end_ms)
    assert len(passes_table(lean)) == 0


def test_a_run_lets_go_of_its_rows_once_the_tables_are_built(config, trace, monkeypatch):
    """The end of a long run holds each request row once (in the table), not twice."""
    seen: list[Recorder] = []

    class Watched(Recorder):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            seen.append(self)

    monkeypatch.setattr(sim, "Recorder", Watched)
    result = sim.simulate(aggregated(config, trace))
    assert len(result.requests) > 0 and len(result.kv) > 0
    assert len(seen[0].requests) == 0 and len(seen[0].kv) == 0


@pytest.mark.parametrize("join_every", [1, 3, 4096])
def test_appended_arrays_read_back_end_to_end(join_every, monkeypatch):
    """Stretch end times and levels are kept as the arrays appended, joined in chunks: read
    back, they are every value in order, whatever the chunking."""
    monkeypatch.setattr(Appended, "JOIN_EVERY", join_every)
    rng = np.random.default_rng(1)
    floats, ints = Appended("d"), Appended("q")
    expected_f: list[float] = []
    expected_q: list[int] = []
    for _ in range(20):
        k = int(rng.integers(0, 9))
        f = array("d", rng.uniform(0, 1e6, k))
        q = array("q", rng.integers(-5, 1 << 40, k).tolist())
        floats.append(f)
        ints.append(q)
        expected_f += f.tolist()
        expected_q += q.tolist()
    assert len(floats) == len(expected_f) and len(ints) == len(expected_q)
    assert floats.numpy().tolist() == expected_f and floats.numpy().dtype == np.float64
    assert ints.numpy().tolist() == expected_q and ints.numpy().dtype == np.int64
    with pytest.raises(TypeError, match="expected an array 'd'"):
        floats.append(array("q", [1]))


def test_absorbed_rows_follow_and_leave_the_other_empty(monkeypatch):
    """Merging another part's recorder (model/speed/parallel.py) appends its kv rows after these,
    with its pool names recoded into this recorder's codes, and moves them: the other
    recorder's columns are emptied, so a merge never holds both parts' rows twice."""
    monkeypatch.setattr(Columns, "CHUNK", 2)
    mine, theirs = Recorder(), Recorder()
    mine.kv_level(0.0, "cluster.w0", "device", 1, 0, 0)
    theirs.kv_level(0.5, "cluster.w1", "device", 2, 1, 1)
    theirs.kv_level(1.5, "cluster.w0", "device", 3, 0, 0)
    theirs.kv_level(2.5, "cluster.w1", "host", 4, 2, 1)
    mine.absorb(theirs)
    table = kv_table(mine)
    assert table.t_ms.tolist() == [0.0, 0.5, 1.5, 2.5]
    assert table.pool.tolist() == ["cluster.w0", "cluster.w1", "cluster.w0", "cluster.w1"]
    assert table.tier.tolist() == ["device", "device", "device", "host"]
    assert table.used_blocks.tolist() == [1, 2, 3, 4]
    assert len(theirs.kv) == 0
