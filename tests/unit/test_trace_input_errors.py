"""Trace files that cannot be read as written fail cleanly: a byte that is not UTF-8 anywhere in
a row, in every reader (Mooncake, Azure, agentic Mooncake, Weka, Dynamo; gzip too), is a
TraceError `FILE:LINE: not valid UTF-8 (byte 0xNN at byte offset K of ...)` that
`skip_malformed` skips and counts like any other bad row; a file that cannot be opened says why.
Through the CLI both end with exit status 2 and that one line, never a traceback."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import SERVESIM, run_servesim

from servesim.workload.agentic import read_agentic_mooncake
from servesim.workload.azure import read_azure
from servesim.workload.dynamo_trace import read_dynamo_trace
from servesim.workload.errors import SkipCounter, TraceError
from servesim.workload.mooncake import read_mooncake
from servesim.workload.weka import read_weka

ROW = {"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1, 2]}
# an ignored `note` field holding Latin-1 "café": its byte 0xe9 opens a three-byte UTF-8
# sequence that the closing quote cuts short
BAD_NOTE = b'"note": "caf\xe9"'


def jsonl(path: Path, rows: list[dict | bytes]) -> Path:
    """Each dict is a JSON line; each bytes object a raw line."""
    raw = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    path.write_bytes(b"".join(line + b"\n" for line in raw))
    return path


def with_bad_note(row: dict) -> bytes:
    """`row` as a JSON line with the Latin-1 note added as its last field."""
    return json.dumps(row).encode()[:-1] + b", " + BAD_NOTE + b"}"


def offset_of_bad_byte(line: bytes) -> int:
    return line.index(b"\xe9")


def expected(path: Path, line_no: int, line: bytes) -> str:
    return (
        f"{path}:{line_no}: not valid UTF-8 (byte 0xe9 at byte offset "
        f"{offset_of_bad_byte(line)} of the line)"
    )


# --------------------------------------------------------------------------- Mooncake


def test_mooncake_names_the_line_and_the_byte(tmp_path):
    bad = with_bad_note({**ROW, "timestamp": 5})
    path = jsonl(tmp_path / "t.jsonl", [ROW, bad, ROW])
    with pytest.raises(TraceError) as e:
        list(read_mooncake(path, trace_block_size=4))
    assert str(e.value) == expected(path, 2, bad)


def test_mooncake_skip_malformed_skips_and_counts_the_row(tmp_path):
    bad = with_bad_note({**ROW, "timestamp": 5})
    path = jsonl(tmp_path / "t.jsonl", [ROW, bad, {**ROW, "timestamp": 9}])
    skipped = SkipCounter()
    rows = list(read_mooncake(path, 4, skip_malformed=True, skipped=skipped))
    assert [r.line for r in rows] == [1, 3]
    assert skipped.count == 1 and skipped.examples == [expected(path, 2, bad)]


def test_valid_non_ascii_utf8_is_read(tmp_path):
    """UTF-8 text outside ASCII is fine, in ignored fields and in ids."""
    row = {**ROW, "note": "café ☕", "request_id": "r-é"}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    (r,) = read_mooncake(path, 4)
    assert r.request_id == "r-é"


@pytest.mark.parametrize(
    ("raw", "byte", "offset"),
    [
        (b"\xed\xa0\x80", 0xED, 0),  # an encoded surrogate (CESU-8): not UTF-8
        (b"\xc3", 0xC3, 0),  # a lead byte cut short by the closing quote
        (b"\xc3\xa9\xff", 0xFF, 2),  # after a valid two-byte character
    ],
)
def test_the_first_bad_byte_and_its_offset_are_named(tmp_path, raw, byte, offset):
    prefix = b'{"hash_ids": [1], "output_length": 1, "timestamp": 0, "x": "'
    line = prefix + raw + b'"}'
    path = jsonl(tmp_path / "t.jsonl", [line])
    message = (
        f"{path}:1: not valid UTF-8 (byte 0x{byte:02x} at byte offset "
        f"{len(prefix) + offset} of the line)"
    )
    with pytest.raises(TraceError, match=re.escape(message)):
        list(read_mooncake(path, 4))


def test_a_utf16_file_is_named_as_such(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes((json.dumps(ROW) + "\n").encode("utf-16"))  # with its byte order mark
    message = (
        f"{path}:1: not valid UTF-8 (byte 0xff at byte offset 0 of the line; the file looks "
        "like UTF-16: save it as UTF-8)"
    )
    with pytest.raises(TraceError, match=re.escape(message)):
        list(read_mooncake(path, 4))


# --------------------------------------------------------------------------- Azure

HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens"


def azure(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join([HEADER, *lines]) + b"\n")
    return path


def test_azure_names_the_line_field_and_byte(tmp_path):
    path = azure(
        tmp_path / "a.csv",
        [
            b"2023-11-16 18:15:46.6805900,374,44",
            b"2023-11-16 18:15:47.0000000,100,5,caf\xe9",  # an extra column the reader ignores
            b"2023-11-16 18:15:48.0000000,100,5",
        ],
    )
    message = f"{path}:3: not valid UTF-8 (byte 0xe9 at byte offset 3 of field 4)"
    with pytest.raises(TraceError, match=re.escape(message)):
        list(read_azure(path))
    skipped = SkipCounter()
    rows = list(read_azure(path, skip_malformed=True, skipped=skipped))
    assert [r.line for r in rows] == [2, 4]
    assert skipped.count == 1 and skipped.examples == [message]


def test_azure_names_a_known_column_and_the_header_line(tmp_path):
    path = azure(tmp_path / "a.csv", [b"2023-11-16 18:15:46.6805900,3\xb74,44"])
    with pytest.raises(TraceError, match=re.escape(f"{path}:2: not valid UTF-8 (byte 0xb7 at")):
        list(read_azure(path))
    with pytest.raises(TraceError, match="of field 2 \\(ContextTokens\\)"):
        list(read_azure(path))
    header = tmp_path / "h.csv"
    header.write_bytes(HEADER + b",Not\xe9\n2023-11-16 18:15:46.6805900,374,44\n")
    message = f"{header}:1: not valid UTF-8 (byte 0xe9 at byte offset 3 of field 4)"
    with pytest.raises(TraceError, match=re.escape(message)):
        list(read_azure(header, skip_malformed=True))  # a header is not a row to skip


# --------------------------------------------------------------------------- agentic readers


def v2_lines(agentic_file: Path) -> tuple[dict, dict]:
    """The header and the row of conftest's one-request agentic Mooncake v2 file."""
    header, row = agentic_file.read_text().splitlines()
    return json.loads(header), json.loads(row)


def test_agentic_mooncake_v2_and_legacy(tmp_path, one_request_agentic_file):
    header, row = v2_lines(one_request_agentic_file)
    bad = with_bad_note(row)
    path = jsonl(tmp_path / "v2.jsonl", [header, bad])
    with pytest.raises(TraceError, match=re.escape(expected(path, 2, bad))):
        read_agentic_mooncake(path)
    bad = with_bad_note({**ROW, "request_id": "a"})
    path = jsonl(tmp_path / "legacy.jsonl", [bad])
    with pytest.raises(TraceError, match=re.escape(expected(path, 1, bad))):
        read_agentic_mooncake(path, 4)


def weka_play(play_id: str) -> dict:
    call = {"type": "n", "t": 0, "in": 8, "out": 2, "model": "m", "hash_ids": [1, 2]}
    return {"id": play_id, "block_size": 4, "hash_id_scope": "local", "requests": [call]}


def test_weka_jsonl_json_and_directory(tmp_path):
    bad = with_bad_note(weka_play("b"))
    path = jsonl(tmp_path / "plays.jsonl", [weka_play("a"), bad])
    with pytest.raises(TraceError, match=re.escape(expected(path, 2, bad))):
        read_weka(path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pretty = json.dumps(weka_play("c"), indent=2).encode()
    pretty = pretty.replace(b'"model": "m"', b'"model": "m\xe9"')  # line 11 of the object
    (corpus / "c.json").write_bytes(pretty)
    line_no = pretty[: pretty.index(b"\xe9")].count(b"\n") + 1
    line = pretty.split(b"\n")[line_no - 1]
    message = expected(corpus / "c.json", line_no, line)
    for source in (corpus / "c.json", corpus):
        with pytest.raises(TraceError, match=re.escape(message)):
            read_weka(source)


def dynamo_record(rid: str) -> dict:
    return {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "request": {
            "request_id": rid,
            "output_tokens": 2,
            "request_received_ms": 1000,
            "replay": {"trace_block_size": 4, "input_length": 8, "input_sequence_hashes": [1, 2]},
        },
    }


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_dynamo_plain_and_gzip(tmp_path, suffix):
    bad = with_bad_note(dynamo_record("b"))
    data = json.dumps(dynamo_record("a")).encode() + b"\n" + bad + b"\n"
    path = tmp_path / f"trace{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with pytest.raises(TraceError, match=re.escape(expected(path, 2, bad))):
        read_dynamo_trace(path)


# --------------------------------------------------------------------------- opening the file


def test_why_a_file_cannot_be_opened(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = (
        "failed to open trace file nope.jsonl: no such file (relative to the working "
        f"directory {tmp_path})"
    )
    for read in (read_mooncake, read_azure, read_agentic_mooncake, read_weka, read_dynamo_trace):
        with pytest.raises(TraceError, match=re.escape(missing)):
            read("nope.jsonl")  # the file is opened before the first row is asked for
    absent = tmp_path / "gone" / "t.jsonl"
    with pytest.raises(TraceError, match=re.escape(f"{absent}: no such file")) as e:
        read_mooncake(absent)
    assert "relative" not in str(e.value)
    for read in (read_mooncake, read_azure, read_agentic_mooncake, read_dynamo_trace):
        with pytest.raises(
            TraceError, match=re.escape(f"failed to open trace file {tmp_path}: it is a directory")
        ):
            read(tmp_path)


# --------------------------------------------------------------------------- the CLI


def servesim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_servesim(*args, "hydra.run.dir=out", "output.progress=off", cwd=cwd)


def exits_2_with(out: subprocess.CompletedProcess[str], message: str) -> None:
    assert out.returncode == 2, out.stderr
    assert f"servesim: {message}" in out.stderr.splitlines()
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("kind", ["streamed", "sessions"])
def test_cli_mooncake_exits_2_streamed_or_read_whole(tmp_path, kind):
    """A trace of single requests is streamed (the bad row is met mid-run), one with sessions is
    read whole before the run: both end the same way."""
    extra = {"session_id": "s"} if kind == "sessions" else {}
    bad = with_bad_note({**ROW, **extra, "timestamp": 5, "delay": 1} if extra else ROW)
    path = jsonl(tmp_path / "t.jsonl", [{**ROW, **extra}, bad])
    out = servesim("workload=mooncake", f"workload.path={path}", cwd=tmp_path)
    exits_2_with(out, expected(path, 2, bad))


def test_cli_skip_malformed_counts_the_row_in_the_summary(tmp_path):
    bad = with_bad_note({**ROW, "timestamp": 5})
    path = jsonl(tmp_path / "t.jsonl", [ROW, bad, {**ROW, "timestamp": 9}])
    out = servesim(
        "workload=mooncake", f"workload.path={path}", "workload.skip_malformed=true", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["num_requests"] == summary["completed_requests"] == 2
    assert summary["skipped_trace_rows"] == 1
    assert summary["skipped_trace_row_examples"] == [expected(path, 2, bad)]


@pytest.mark.parametrize("kind", ["azure", "dynamo_trace", "weka", "agentic_mooncake"])
def test_cli_other_readers_exit_2(tmp_path, kind, one_request_agentic_file):
    if kind == "azure":
        path = azure(tmp_path / "a.csv", [b"2023-11-16 18:15:46.6805900,374,44,\xe9"])
        message = f"{path}:2: not valid UTF-8 (byte 0xe9 at byte offset 0 of field 4)"
    else:
        header, row = v2_lines(one_request_agentic_file)
        first, bad = {
            "dynamo_trace": (dynamo_record("a"), with_bad_note(dynamo_record("b"))),
            "weka": (weka_play("a"), with_bad_note(weka_play("b"))),
            "agentic_mooncake": (header, with_bad_note(row)),
        }[kind]
        path = tmp_path / ("t.jsonl.gz" if kind == "dynamo_trace" else "t.jsonl")
        data = json.dumps(first).encode() + b"\n" + bad + b"\n"
        path.write_bytes(gzip.compress(data) if kind == "dynamo_trace" else data)
        message = expected(path, 2, bad)
    out = servesim(f"workload={kind}", f"workload.path={path}", cwd=tmp_path)
    exits_2_with(out, message)


def test_cli_says_why_the_file_cannot_be_opened(tmp_path):
    out = servesim("workload=mooncake", "workload.path=nope.jsonl", cwd=tmp_path)
    exits_2_with(
        out,
        "failed to open trace file nope.jsonl: no such file (relative to the working "
        f"directory {tmp_path})",
    )
    out = servesim("workload=azure", f"workload.path={tmp_path}", cwd=tmp_path)
    exits_2_with(out, f"failed to open trace file {tmp_path}: it is a directory")


def _without_root_privilege() -> list[str] | None:
    """A command prefix under which file permissions apply to this process: none needed for a
    normal user; for root (which reads any file) `setpriv` dropping the capabilities that
    bypass them, where the system has it and allows it; else None."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


@pytest.mark.parametrize("kind", ["mooncake", "weka"])
def test_cli_says_permission_denied(tmp_path, kind):
    """A file without read permission, given as the trace or found in a Weka corpus."""
    prefix = _without_root_privilege()
    if prefix is None:
        pytest.skip("running as root without setpriv: root reads any file, so no denial to see")
    if kind == "mooncake":
        path = given = jsonl(tmp_path / "t.jsonl", [ROW])
    else:
        given = tmp_path / "corpus"
        given.mkdir()
        jsonl(given / "a.jsonl", [weka_play("a")])
        path = jsonl(given / "b.jsonl", [weka_play("b")])
    path.chmod(0)
    try:
        out = subprocess.run(
            [*prefix, str(SERVESIM), f"workload={kind}", f"workload.path={given}"]
            + ["hydra.run.dir=out", "output.progress=off"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        path.chmod(0o644)
    exits_2_with(out, f"failed to open trace file {path}: permission denied")
