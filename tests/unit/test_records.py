"""The per-request record is defined once (`REQUEST_RECORD`, model/metrics/records.py): the
column table of docs/metrics.md is that list, the `requests` table has its columns and dtypes,
the recorder's row puts each value under its column, and requests.jsonl exports the fields
with a JSONL name, in table order."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from servesim import simulate
from servesim.metrics.records import (
    REQUEST_FIELDS,
    REQUEST_RECORD,
    jsonl_records,
    request_row,
)
from servesim.workload.request import Request

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
FIXED = {"kind": "fixed", "prefill_ms": 10.5, "decode_ms": 1.25}


def doc_table(heading: str, header: str) -> list[list[str]]:
    """The cells of the first table under `heading` in docs/metrics.md whose header row is
    `header` (a cell holds no `|`: markdown would end it there)."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(f"\n{heading}\n") :]
    lines = section[section.index(f"\n{header}\n") + 1 :].splitlines()
    rows = []
    for line in lines[2:]:  # (header and rule)
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line[1:-1].split("|")])
    return rows


def test_the_docs_column_table_is_the_record():
    documented = doc_table("## `requests` table", "| column | type | unit | meaning |")
    expected = [[f"`{f.name}`", f.type, f.unit, f.meaning] for f in REQUEST_RECORD]
    # on a difference, the message is the table to paste into docs/metrics.md
    table = "\n".join(f"| {' | '.join(cells)} |".replace("|  |", "| |") for cells in expected)
    assert documented == expected, "\n" + table


def test_the_docs_jsonl_table_lists_the_exported_fields_in_order():
    documented = doc_table(
        "## Per-request JSONL", "| servesim field | from column | mocker field |"
    )
    exported = [f for f in REQUEST_RECORD if f.jsonl is not None]
    assert [row[0] for row in documented] == [f"`{f.jsonl}`" for f in exported]
    for row, f in zip(documented, exported, strict=True):
        assert row[1].startswith(f"`{f.name}`"), (row, f.name)


def test_the_tpot_column_says_what_it_holds():
    """Per-request TPOT is `tpot_ms` in the table; requests.jsonl keeps the mocker's `itl_ms`
    (the pooled inter-token gaps are the summary's `itl`, not a column)."""
    (tpot,) = [f for f in REQUEST_RECORD if f.name == "tpot_ms"]
    assert tpot.jsonl == "itl_ms" and "TPOT" in tpot.meaning
    assert not any(f.name == "itl_ms" for f in REQUEST_RECORD)


def test_a_run_has_the_record_columns_and_dtypes(config, trace):
    """A P/D run with sessions: every column in order, each of its dtype (times are floats
    here: arrivals off the start of the clock)."""
    rows = [
        {
            "timestamp": 3 + 7 * k,
            "session_id": f"s{k % 2}",
            "input_length": 200 + 10 * k,
            "output_length": k % 4,
            "hash_ids": [k % 2, 10 + k, 20 + k, 30 + k, 40 + k],
        }
        for k in range(8)
    ]
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        topology={"kind": "disagg", "num_prefill_workers": 1, "num_decode_workers": 2},
        link={"bandwidth_gbps": 5.0},
    )
    requests = simulate(cfg).requests
    assert list(requests.columns) == [f.name for f in REQUEST_RECORD]
    assert {c: str(t) for c, t in requests.dtypes.items()} == {
        f.name: f.dtype for f in REQUEST_RECORD
    }


def test_the_row_puts_each_value_under_its_column():
    req = Request(7, "r7", 300, 9, [], session_id="s1", turn_index=2)
    for i, name in enumerate(
        [
            "arrival_ms",
            "first_admit_ms",
            "first_token_ms",
            "second_token_ms",
            "last_token_ms",
            "prefill_admit_ms",
            "source_held_ms",
            "destination_reserved_ms",
            "destination_activated_ms",
            "decode_admit_ms",
            "source_released_ms",
        ]
    ):
        setattr(req, name, 100.0 + 10 * i)
    req.num_output_tokens = 5
    req.reused_input_tokens, req.host_reused_input_tokens = 192, 64
    req.disk_reused_input_tokens, req.first_admission_reused_tokens = 32, 128
    req.prefill_worker_idx, req.prefill_dp_rank, req.worker_idx, req.dp_rank = 3, 1, 4, 2
    req.n_preemptions, req.decode_reused_input_tokens, req.transfer_tokens = 6, 16, 300
    req.n_prefill_admissions, req.n_admissions = 2, 3  # P/D: admitted twice, then thrice
    row = dict(zip(REQUEST_FIELDS, request_row(req, "rejected", 999.0, "why"), strict=True))
    assert row == {
        "_idx": 7,
        "request_id": "r7",
        "session_id": "s1",
        "turn_index": 2,
        "arrival_ms": 100.0,
        "first_admit_ms": 110.0,
        "first_token_ms": 120.0,
        "last_token_ms": 140.0,
        "terminal_ms": 999.0,
        "ttft_ms": 20.0,
        "ttst_ms": 10.0,
        "tpot_ms": 5.0,  # (140 - 120) / (5 - 1)
        "e2e_latency_ms": 40.0,
        "input_length": 300,
        "requested_output_length": 9,
        "output_length": 5,
        "reused_input_tokens": 192,
        "g1_reused_input_tokens": 96,
        "host_reused_input_tokens": 64,
        "disk_reused_input_tokens": 32,
        "first_admission_reused_input_tokens": 128,
        "prefill_worker_idx": 3,
        "decode_worker_idx": 4,
        "dp_rank": 2,
        "n_preemptions": 6,
        "n_admissions": 5,
        "n_readmissions": 3,  # (2 - 1) + (3 - 1)
        "terminal_status": "rejected",
        "reason": "why",
        "prefill_dp_rank": 1,
        "prefill_admit_ms": 150.0,
        "source_held_ms": 160.0,
        "destination_reserved_ms": 170.0,
        "destination_activated_ms": 180.0,
        "decode_admit_ms": 190.0,
        "source_released_ms": 200.0,
        "decode_reused_input_tokens": 16,
        "transfer_tokens": 300,
    }


def test_a_row_without_a_second_token_has_no_tpot():
    req = Request(0, "r0", 10, 1, [])
    req.arrival_ms = req.first_token_ms = req.last_token_ms = 4.0
    req.num_output_tokens = 1
    row = dict(zip(REQUEST_FIELDS, request_row(req, "completed", 4.0, ""), strict=True))
    assert row["ttft_ms"] == 0.0 and math.isnan(row["ttst_ms"]) and math.isnan(row["tpot_ms"])


def _table(**columns: list) -> pd.DataFrame:
    """A requests table of len(columns' lists) rows: the given columns, 0 / NaN elsewhere."""
    n = len(next(iter(columns.values())))
    data = {}
    for f in REQUEST_RECORD:
        if f.name in columns:
            data[f.name] = pd.array(columns[f.name], dtype=f.dtype)
        elif f.type == "float":
            data[f.name] = np.full(n, np.nan)
        else:
            data[f.name] = pd.array([0] * n, dtype="int64" if f.type == "int" else f.dtype)
    return pd.DataFrame(data)


def test_jsonl_records_export_the_named_fields_in_table_order():
    """Ended requests by arrival then id; worker ids as scheduler ids (worker x dp + rank);
    decode reuse only with both workers."""
    requests = _table(
        request_id=["b", "a", "c", "d"],
        session_id=[None, None, None, None],
        terminal_status=["completed", "rejected", "incomplete", "completed"],
        reason=["", "no room", "cut", ""],
        arrival_ms=[5.0, 5.0, 1.0, 0.0],
        tpot_ms=[2.5, np.nan, np.nan, 1.0],
        prefill_worker_idx=[1, 0, None, None],
        prefill_dp_rank=[1, 0, None, None],
        decode_worker_idx=[1, None, 0, 2],
        dp_rank=[0, 0, 0, 1],
        decode_reused_input_tokens=[64, 0, 0, 0],
    )
    records = list(jsonl_records(requests, prefill_dp=2, decode_dp=3))
    assert [r["request_id"] for r in records] == ["d", "a", "b"]
    assert list(records[0]) == [f.jsonl for f in REQUEST_RECORD if f.jsonl is not None]
    d, a, b = records
    assert (b["itl_ms"], b["arrival_time_ms"]) == (2.5, 5.0)
    assert (b["prefill_worker_idx"], b["decode_worker_idx"]) == (3, 3)
    assert (a["prefill_worker_idx"], a["decode_worker_idx"]) == (0, None)
    assert (d["prefill_worker_idx"], d["decode_worker_idx"]) == (None, 7)
    assert b["decode_reused_input_tokens"] == 64
    assert a["decode_reused_input_tokens"] is None and d["decode_reused_input_tokens"] is None
    assert "reason" not in b and "tpot_ms" not in b
