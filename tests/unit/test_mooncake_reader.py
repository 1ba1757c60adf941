"""The Mooncake JSONL reader: fields, aliases, defaults, and an error naming file:line for every
row it cannot replay (spec §1.1, §9 "Trace loading", loader cases 1-4)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from servesim.workload.errors import TraceError
from servesim.workload.mooncake import SkipCounter, TraceRow, read_mooncake

GOOD = {"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1, 2]}


def write(tmp_path: Path, lines: list[str | dict], name: str = "trace.jsonl") -> Path:
    """Each dict becomes one JSON line; each str is written verbatim as one line."""
    path = tmp_path / name
    text = "".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines)
    path.write_text(text)
    return path


def read(path: Path, **kw) -> list[TraceRow]:
    return list(read_mooncake(path, **{"trace_block_size": 4, **kw}))


# --------------------------------------------------------------------------- fields


def test_fields_are_kept(tmp_path):
    """Every documented field lands in the row; ids are strings; the line number is the file's."""
    path = write(
        tmp_path,
        [
            {
                "timestamp": 27482.5,
                "input_length": 7,
                "output_length": 52,
                "hash_ids": [46, 47],
                "session_id": "u7",
                "request_id": "r-1",
            },
            {"session_id": "u7", "delay": 120, "output_length": 3, "hash_ids": [46, 47, 9]},
        ],
    )
    assert read(path) == [
        TraceRow(1, 27482.5, 7, 52, [46, 47], session_id="u7", request_id="r-1"),
        TraceRow(2, None, 12, 3, [46, 47, 9], session_id="u7", delay_ms=120.0),
    ]


def test_aliases(tmp_path):
    """input_tokens, output_tokens, created_time and delay_ms are aliases of the main names."""
    path = write(
        tmp_path,
        [
            {
                "created_time": 5,
                "input_tokens": 6,
                "output_tokens": 4,
                "hash_ids": [1, 2],
                "session_id": "s",
            },
            {"session_id": "s", "delay_ms": 25, "output_tokens": 1, "hash_ids": [1, 2, 3]},
        ],
    )
    first, second = read(path)
    assert (first.timestamp_ms, first.input_length, first.output_length) == (5.0, 6, 4)
    assert (second.delay_ms, second.output_length) == (25.0, 1)


def test_input_length_defaults_to_hash_capacity(tmp_path):
    """Without input_length, the prompt fills every trace block: 2 ids x 4 tokens = 8 (case 4)."""
    path = write(tmp_path, [{"timestamp": 0, "output_length": 1, "hash_ids": [1, 2]}])
    assert read(path)[0].input_length == 8
    assert list(read_mooncake(path))[0].input_length == 2 * 512  # the default block size


def test_blank_lines_ignored_and_lines_counted(tmp_path):
    """Blank and whitespace-only lines are skipped but still count for line numbers."""
    path = write(tmp_path, ["", json.dumps(GOOD), "   ", "\t", json.dumps(GOOD), ""])
    assert [r.line for r in read(path)] == [2, 5]


def test_output_length_zero_allowed(tmp_path):
    """output_length 0 is legal (a prefill-only, cache-warming request)."""
    path = write(tmp_path, [{**GOOD, "output_length": 0}])
    assert read(path)[0].output_length == 0


def test_ids_kept_as_strings_and_unknown_fields_ignored(tmp_path):
    """Numeric session/request ids become strings; unknown fields (priority, ...) are ignored."""
    path = write(tmp_path, [{**GOOD, "session_id": 12, "request_id": 34, "priority": 3}])
    row = read(path)[0]
    assert (row.session_id, row.request_id) == ("12", "34")


def test_integral_float_lengths_and_large_hash_ids(tmp_path):
    """A length written 8.0 is the integer 8; hash ids above 2**32 are kept as written."""
    big = 2**40 + 7
    path = write(tmp_path, [{**GOOD, "input_length": 8.0, "hash_ids": [big, 2**32]}])
    row = read(path)[0]
    assert row.input_length == 8 and isinstance(row.input_length, int)
    assert row.hash_ids == [big, 2**32]


def test_equal_timestamps_and_out_of_order_later_turns_allowed(tmp_path):
    """Only first turns must be in time order: equal first-turn times are fine, and a later
    turn's timestamp is not checked against other sessions' arrivals."""
    path = write(
        tmp_path,
        [
            {**GOOD, "timestamp": 10, "session_id": "a"},
            {**GOOD, "timestamp": 10},
            {**GOOD, "timestamp": 100},
            {**GOOD, "timestamp": 50, "session_id": "a"},
            {**GOOD, "timestamp": 100},
        ],
    )
    assert [r.timestamp_ms for r in read(path)] == [10.0, 10.0, 100.0, 50.0, 100.0]


# --------------------------------------------------------------------------- errors


def _obj(**fields) -> str:
    return json.dumps({**GOOD, **fields})


def _without(key: str) -> str:
    return json.dumps({k: v for k, v in GOOD.items() if k != key})


BAD_ROWS = {
    "invalid json": ('{"timestamp": 0, "hash_ids": [1', "not valid JSON"),
    "not an object": ("[1, 2, 3]", "expected a JSON object, got list"),
    "number row": ("42", "expected a JSON object, got int"),
    "missing hash_ids": (_without("hash_ids"), "trace line 2 is missing hash_ids"),
    "hash_ids not a list": (_obj(hash_ids=5), "hash_ids must be a list of non-negative integers"),
    "negative hash id": (_obj(hash_ids=[1, -2]), "hash_ids must be a list of non-negative"),
    "string hash id": (_obj(hash_ids=["a"]), "hash_ids must be a list of non-negative"),
    "bool hash id": (_obj(hash_ids=[1, True]), "hash_ids must be a list of non-negative"),
    "float hash id": (_obj(hash_ids=[1, 2.0]), "hash_ids must be a list of non-negative"),
    "missing output_length": (_without("output_length"), "trace line 2 is missing output_length"),
    "negative output": (_obj(output_length=-1), "output_length must be >= 0, got -1"),
    "fractional output": (_obj(output_length=1.5), "output_length must be an integer, got 1.5"),
    "string output": (_obj(output_length="3"), "output_length must be an integer, got '3'"),
    "bool output": (_obj(output_length=True), "output_length must be an integer, got True"),
    "negative input": (_obj(input_length=-4), "input_length must be >= 0, got -4"),
    "zero input": (_obj(input_length=0), "input_length must be positive"),
    "no hash ids": (_obj(hash_ids=[], input_length=None), "input_length must be positive"),
    "fractional input": (_obj(input_length=2.5), "input_length must be an integer, got 2.5"),
    "over capacity": (
        _obj(input_length=9),
        "trace line 2 input_length 9 exceeds hash_ids capacity 8",
    ),
    "string timestamp": (_obj(timestamp="0"), "timestamp must be a number of milliseconds"),
    "negative timestamp": (_obj(timestamp=-1), "timestamp must be finite and >= 0, got -1"),
    "nan timestamp": (_obj(timestamp=float("nan")), "timestamp must be finite and >= 0, got nan"),
    "inf timestamp": (_obj(timestamp=float("inf")), "timestamp must be finite and >= 0"),
    "no first timestamp": (_without("timestamp"), "first turn of a session needs a timestamp"),
    "first-turn delay": (
        _obj(session_id="s9", delay=5),
        "trace line 2 sets delay on the first turn of session s9",
    ),
    "both delays": (_obj(session_id="s1", delay=1, delay_ms=1), "sets both delay and delay_ms"),
    "negative delay": (_obj(session_id="s1", delay=-3), "delay must be finite and >= 0, got -3"),
    "string delay": (_obj(session_id="s1", delay_ms="3"), "delay must be a number of milliseconds"),
}


@pytest.mark.parametrize("text, expected", BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_bad_row_names_file_line_and_expectation(tmp_path, text, expected):
    """A bad row raises TraceError with `path:line` and what was expected. Line 1 starts
    session s1 at t=0, so line 2 may be a later turn of it."""
    path = write(tmp_path, [{**GOOD, "session_id": "s1"}, text, GOOD])
    with pytest.raises(TraceError) as err:
        read(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:2: ")
    assert expected in msg


def test_decreasing_first_turn_timestamps_rejected(tmp_path):
    """First turns (rows without a session, or a session's first row) must not go back in time."""
    path = write(tmp_path, [{**GOOD, "timestamp": 10}, {**GOOD, "timestamp": 5}])
    with pytest.raises(TraceError, match="arrivals must be in time order") as err:
        read(path)
    assert f"{path}:2: timestamp 5.0 is earlier than the previous arrival 10.0" in str(err.value)


def test_decreasing_session_start_rejected(tmp_path):
    """A new session's first turn is an arrival too and is checked against the previous one."""
    path = write(
        tmp_path,
        [
            {**GOOD, "timestamp": 10},
            {**GOOD, "timestamp": 20},
            {**GOOD, "timestamp": 15, "session_id": "late"},
        ],
    )
    with pytest.raises(TraceError, match="arrivals must be in time order") as err:
        read(path)
    assert f"{path}:3:" in str(err.value)


@pytest.mark.parametrize("content", ["", "\n\n   \n"], ids=["empty", "blank-only"])
def test_file_without_rows(tmp_path, content):
    """A file with no request rows is an error naming the file."""
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(
        TraceError, match=re.escape(f"trace file {path} did not contain any requests")
    ):
        read(path)


def test_missing_file(tmp_path):
    """A path that is not a file fails with "failed to open trace file <path>"."""
    path = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=re.escape(f"failed to open trace file {path}")):
        read(path)
    with pytest.raises(TraceError, match="failed to open trace file"):
        read(tmp_path)  # a directory is not a trace file either


# --------------------------------------------------------------------------- skipping, laziness


def test_skip_malformed_counts_and_keeps_good_rows(tmp_path):
    """With skip_malformed, bad rows are dropped and counted with their messages; good rows pass
    unchanged and a skipped row's timestamp does not enter the time-order check."""
    path = write(
        tmp_path,
        [
            {**GOOD, "timestamp": 0},
            "not json",
            {**GOOD, "timestamp": 50, "hash_ids": None},
            {**GOOD, "timestamp": 10},
            {**GOOD, "timestamp": 5},  # earlier than 10: skipped
            {**GOOD, "timestamp": 20},
        ],
    )
    skipped = SkipCounter()
    rows = read(path, skip_malformed=True, skipped=skipped)
    assert [(r.line, r.timestamp_ms) for r in rows] == [(1, 0.0), (4, 10.0), (6, 20.0)]
    assert skipped.count == 3
    assert [m.split(": ", 1)[0] for m in skipped.examples] == [
        f"{path}:2",
        f"{path}:3",
        f"{path}:5",
    ]
    assert "is missing hash_ids" in skipped.examples[1]


def test_skip_counter_keeps_five_examples():
    """The counter counts every skip but keeps only the first five messages."""
    skipped = SkipCounter()
    for i in range(7):
        skipped.add(f"m{i}")
    assert (skipped.count, skipped.examples) == (7, ["m0", "m1", "m2", "m3", "m4"])


def test_skip_malformed_with_no_good_rows_still_fails(tmp_path):
    """Skipping every row leaves an empty trace, which is still an error."""
    path = write(tmp_path, ["{", "[]"])
    skipped = SkipCounter()
    with pytest.raises(TraceError, match="did not contain any requests"):
        read(path, skip_malformed=True, skipped=skipped)
    assert skipped.count == 2


def test_max_requests_stops_early(tmp_path):
    """max_requests yields the first N good rows and never reads past them."""
    path = write(tmp_path, [GOOD, "not json", GOOD, GOOD, "also not json"])
    skipped = SkipCounter()
    rows = read(path, max_requests=2, skip_malformed=True, skipped=skipped)
    assert [r.line for r in rows] == [1, 3]
    assert skipped.count == 1
    assert [r.line for r in read(path, max_requests=1)] == [1]  # line 2 is never parsed


def test_reader_is_lazy(tmp_path):
    """The reader is a generator: rows before a malformed line 3 are yielded before it raises."""
    path = write(tmp_path, [GOOD, GOOD, "{broken"])
    rows = read_mooncake(path, trace_block_size=4)
    assert inspect.isgenerator(rows)
    assert next(rows).line == 1
    assert next(rows).line == 2
    with pytest.raises(TraceError, match=re.escape(f"{path}:3: not valid JSON")):
        next(rows)
