"""The Azure LLM inference CSV reader (Splitwise 2023): header, BOM, wall-clock timestamps turned
into ms after the first row, and errors naming file:line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import shared_trace

from servesim.workload.azure import read_azure
from servesim.workload.errors import TraceError
from servesim.workload.mooncake import SkipCounter, TraceRow

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def write(tmp_path: Path, lines: list[str], bom: bool = False, header: str = HEADER) -> Path:
    path = tmp_path / "azure.csv"
    text = "\r\n".join([header, *lines]) + "\r\n"
    path.write_text(("\ufeff" if bom else "") + text, encoding="utf-8")
    return path


def times(rows: list[TraceRow]) -> list[float]:
    return [r.timestamp_ms for r in rows]  # type: ignore[misc]


def test_rows_become_trace_rows(tmp_path):
    """Each data row is a TraceRow with the file's line number (header = line 1), its token
    counts, no hash ids and no session; the first row is at 0 ms."""
    path = write(
        tmp_path,
        ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,0"],
    )
    rows = list(read_azure(path))
    assert [(r.line, r.input_length, r.output_length, r.hash_ids) for r in rows] == [
        (2, 374, 44, []),
        (3, 396, 0, []),
    ]
    assert rows[0].timestamp_ms == 0.0
    assert rows[1].timestamp_ms == pytest.approx(4314.579, abs=1e-3)
    assert all(r.session_id is None and r.delay_ms is None for r in rows)


def test_seven_digit_fractions_half_second_apart(tmp_path):
    """Timestamps with 7 fractional digits 0.5 s apart are 500.0 ms apart (relative to the
    first row), across a minute and an hour boundary too."""
    path = write(
        tmp_path,
        [
            "2023-11-16 18:59:59.6805900,1,1",
            "2023-11-16 19:00:00.1805900,1,1",
            "2023-11-16 19:00:00.6805900,1,1",
        ],
    )
    assert times(list(read_azure(path))) == pytest.approx([0.0, 500.0, 1000.0], abs=1e-6)


def test_whole_second_and_millisecond_fractions(tmp_path):
    """A timestamp without a fraction is a whole second; millisecond fractions are exact."""
    path = write(
        tmp_path,
        ["2023-11-16 18:15:46,1,1", "2023-11-16 18:15:46.250,1,1", "2023-11-16 18:15:48.5,1,1"],
    )
    assert times(list(read_azure(path))) == pytest.approx([0.0, 250.0, 2500.0], abs=1e-6)


def test_seven_digit_fractions_keep_100ns_resolution(tmp_path):
    """All seven fractional digits count: .1234567 s after .0000000 is 123.4567 ms, and
    19:00:02 is 2319.41 ms after 18:59:59.6805900."""
    path = write(
        tmp_path,
        [
            "2023-11-16 18:15:46.0000000,1,1",
            "2023-11-16 18:15:46.1234567,1,1",
            "2023-11-16 18:15:46.1234568,1,1",
            "2023-11-16 18:15:48.3194100,1,1",
        ],
    )
    expected = [0.0, 123.4567, 123.4568, 2319.41]
    assert times(list(read_azure(path))) == pytest.approx(expected, abs=1e-6)


def test_utf8_bom_and_header_spaces(tmp_path):
    """A leading UTF-8 BOM (as in the published files) and padded header names are accepted."""
    path = write(
        tmp_path,
        ["2023-11-16 18:15:46.6805900,10,2"],
        bom=True,
        header="TIMESTAMP, ContextTokens ,GeneratedTokens",
    )
    assert [r.input_length for r in read_azure(path)] == [10]


@pytest.mark.parametrize(
    "header",
    ["Time,ContextTokens,GeneratedTokens", "TIMESTAMP,GeneratedTokens,ContextTokens", "TIMESTAMP"],
)
def test_wrong_header(tmp_path, header):
    """The first line must be TIMESTAMP,ContextTokens,GeneratedTokens (error at path:1)."""
    path = write(tmp_path, ["2023-11-16 18:15:46.6805900,10,2"], header=header)
    with pytest.raises(TraceError) as err:
        list(read_azure(path))
    assert str(err.value).startswith(
        f"{path}:1: expected header TIMESTAMP,ContextTokens,GeneratedTokens"
    )


BAD_ROWS = {
    "too few fields": ("2023-11-16 18:15:47.0,10", "expected 3 fields, got 2"),
    "bad timestamp": ("16/11/2023 18:15:47,10,2", "TIMESTAMP must look like"),
    "bad fraction": ("2023-11-16 18:15:47.12x,10,2", "TIMESTAMP must look like"),
    "earlier timestamp": ("2023-11-16 18:15:45.0,10,2", "earlier than the previous row's"),
    "text context": ("2023-11-16 18:15:47.0,ten,2", "ContextTokens must be an integer, got 'ten'"),
    "zero context": ("2023-11-16 18:15:47.0,0,2", "ContextTokens must be >= 1, got 0"),
    "float output": ("2023-11-16 18:15:47.0,10,2.5", "GeneratedTokens must be an integer"),
    "negative output": ("2023-11-16 18:15:47.0,10,-1", "GeneratedTokens must be >= 0, got -1"),
}


@pytest.mark.parametrize("text, expected", BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_bad_row_names_file_and_line(tmp_path, text, expected):
    """A malformed data row raises TraceError starting with `path:line` and saying what was
    expected; the bad row here is on file line 3."""
    path = write(tmp_path, ["2023-11-16 18:15:46.0,10,2", text, "2023-11-16 18:15:48.0,10,2"])
    with pytest.raises(TraceError) as err:
        list(read_azure(path))
    assert str(err.value).startswith(f"{path}:3: ")
    assert expected in str(err.value)


def test_skip_malformed_counts(tmp_path):
    """With skip_malformed, bad rows are dropped and counted (messages name file:line), blank
    lines are ignored, and the good rows keep their line numbers and relative times."""
    path = write(
        tmp_path,
        [
            "2023-11-16 18:15:46.0,10,2",
            "2023-11-16 18:15:47.0,x,2",
            "",
            "2023-11-16 18:15:45.0,10,2",
            "2023-11-16 18:15:48.5,20,3",
        ],
    )
    skipped = SkipCounter()
    rows = list(read_azure(path, skip_malformed=True, skipped=skipped))
    assert [(r.line, r.timestamp_ms) for r in rows] == [(2, 0.0), (6, 2500.0)]
    assert skipped.count == 2
    assert [m.split(": ", 1)[0] for m in skipped.examples] == [f"{path}:3", f"{path}:5"]


def test_max_requests(tmp_path):
    """max_requests keeps the first N rows and does not read on (the bad line 4 is never seen)."""
    path = write(
        tmp_path,
        ["2023-11-16 18:15:46.0,10,2", "2023-11-16 18:15:47.0,10,2", "bad,row,here"],
    )
    assert [r.line for r in read_azure(path, max_requests=2)] == [2, 3]


@pytest.mark.parametrize("content", ["", HEADER + "\r\n", HEADER + "\r\n\r\n"])
def test_empty_file(tmp_path, content):
    """An empty file, or a header without rows, holds no requests: an error naming the file."""
    path = tmp_path / "empty.csv"
    path.write_text(content)
    with pytest.raises(
        TraceError, match=re.escape(f"trace file {path} did not contain any requests")
    ):
        list(read_azure(path))


def test_missing_file(tmp_path):
    """A missing path fails with "failed to open trace file <path>"."""
    path = tmp_path / "missing.csv"
    with pytest.raises(TraceError, match=re.escape(f"failed to open trace file {path}")):
        list(read_azure(path))


@pytest.mark.slow
def test_real_code_trace():
    """The published code trace reads whole: 8,819 rows, times from 0, non-decreasing."""
    rows = list(read_azure(shared_trace("AzureLLMInferenceTrace_code.csv")))
    assert len(rows) == 8819
    t = times(rows)
    assert t[0] == 0.0
    assert all(b >= a for a, b in zip(t, t[1:], strict=False))
    assert all(r.input_length >= 1 and r.output_length >= 0 for r in rows)
