"""Tests that need the public traces find them beside the checkout, and under CI a missing
trace fails the test instead of skipping it."""

from __future__ import annotations

import os
from pathlib import Path

import conftest
import pytest


def test_the_traces_are_looked_for_beside_the_checkout():
    beside = conftest.REPO.parent / "shared" / "traces"
    assert Path(os.environ.get("SERVESIM_SHARED_TRACES", beside)) == conftest.SHARED_TRACES


def test_a_missing_trace_fails_under_ci_and_is_skipped_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "SHARED_TRACES", tmp_path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="missing"):
        conftest.shared_trace("conversation_trace.jsonl")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="missing"):
        conftest.shared_trace("conversation_trace.jsonl")
    trace = tmp_path / "conversation_trace.jsonl"
    trace.write_text("{}\n")
    assert conftest.shared_trace("conversation_trace.jsonl") == trace
