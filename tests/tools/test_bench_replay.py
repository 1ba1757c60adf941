"""benchmarks/bench_replay.py's servesim child: what it times and reports."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from servesim import simulate

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_replay.py"
FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
ROWS = [
    {"timestamp": 7 * k, "input_length": 180, "output_length": 5, "hash_ids": [0, k + 1, k + 2]}
    for k in range(12)
]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_replay"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_replay"]


@pytest.fixture(scope="module")
def runs(bench):
    """bench_replay_runner.py, the timed runs (bench_replay.py put benchmarks/ on sys.path): the
    functions a case's run calls are replaced there."""
    return importlib.import_module("bench_replay_runner")


@pytest.fixture(scope="module")
def report(bench):
    return importlib.import_module("bench_replay_report")


@pytest.mark.parametrize("read_passes", [False, True])
def test_the_child_times_reading_the_passes_table_only_when_asked(
    runs, config, trace, tmp_path, read_passes
):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(ROWS), "trace_block_size": 64},
        timing=FIXED,
        output={"progress": "off"},
    )
    request, result = tmp_path / "request.json", tmp_path / "result.json"
    request.write_text(
        json.dumps({"config": cfg.model_dump(mode="json"), "read_passes": read_passes})
    )
    assert runs.child_main(str(request), str(result)) == 0
    out = json.loads(result.read_text())
    assert out["summary"]["completed_requests"] == 12
    passes = {"passes_s", "passes_rows"} if read_passes else set()
    assert set(out) == {"import_s", "config_s", "simulate_s", "summary", *passes}
    assert out["simulate_s"] > 0
    if read_passes:  # the rows of the table the run's passes are read into
        assert out["passes_rows"] == len(simulate(cfg).passes)


class _Config:
    def model_dump(self, mode: str) -> dict:
        return {}


class _Compare:
    def mocker_kwargs(self, cfg: object) -> dict:
        return {"router_mode": "round_robin", "num_workers": 2}

    def shape_title(self, cfg: object) -> str:
        return "2 workers"


def test_repetitions_alternate_which_simulator_runs_first_and_pair_their_ratios(
    bench, runs, report, monkeypatch, tmp_path
):
    """Every other repetition runs the mocker first; the case reports servesim / mocker within
    each repetition."""
    calls: list[str] = []
    walls = iter([2.0, 1.0, 4.0, 3.0, 2.0, 4.0])  # in call order

    def sample(who: str) -> object:
        calls.append(who)
        summary = {"num_requests": 12, "mean_ttft_ms": 5.0, "completed_requests": 12}
        return runs.Sample(next(walls), 1.0, 100.0, 1.0, summary, import_s=0.1)

    monkeypatch.setattr(runs, "compose_case", lambda *a, **k: _Config())
    monkeypatch.setattr(runs, "run_servesim", lambda *a, **k: sample("servesim"))
    monkeypatch.setattr(runs, "run_mocker", lambda *a, **k: sample("mocker"))
    args = bench.parse_args(["--repeat", "3", "--mocker-python", "none"])
    case = runs.run_case(
        bench.CASES["conv4"], tmp_path / "t.jsonl", args, _Compare(), "mocker-python", tmp_path, 12
    )
    assert calls == ["servesim", "mocker", "mocker", "servesim", "servesim", "mocker"]
    assert report.paired_ratios(case) == [2.0, 0.75, 0.5]
    markdown = report.case_markdown(case)
    assert "within each repetition: 2.00x, 0.75x, 0.50x (median 0.75x)" in markdown


def test_processes_adds_a_parallel_variant_paired_with_the_mocker(
    bench, runs, report, monkeypatch, tmp_path
):
    """`--processes 2` times servesim a second time with speed.processes=2 and reports its
    wall ratio to the mocker within each repetition."""
    overrides: list[list[str]] = []
    walls = iter([4.0, 2.0, 3.0, 3.0, 2.0, 4.0])  # repetition 1: servesim, split, mocker

    def compose(spec, trace, compare, extra=()):
        overrides.append(list(extra))
        return _Config()

    def sample(*a, **k):
        summary = {"num_requests": 12, "mean_ttft_ms": 5.0, "completed_requests": 12}
        return runs.Sample(next(walls), 1.0, 100.0, 1.0, summary, import_s=0.1)

    monkeypatch.setattr(runs, "compose_case", compose)
    monkeypatch.setattr(runs, "_plan_processes", lambda cfg: (2, ""))
    monkeypatch.setattr(runs, "run_servesim", sample)
    monkeypatch.setattr(runs, "run_mocker", sample)
    args = bench.parse_args(["--repeat", "2", "--processes", "2"])
    case = runs.run_case(
        bench.CASES["conv4"], tmp_path / "t.jsonl", args, _Compare(), "mocker-python", tmp_path, 12
    )
    assert overrides == [[], ["speed.processes=2"]]
    assert list(case.variants) == ["servesim", "servesim_parallel", "mocker"]
    assert case.variants["servesim_parallel"].label == "servesim, speed.processes=2"
    # repetition 2 runs in reverse order: mocker 3.0, split 2.0, servesim 4.0
    assert report.paired_ratios(case, variant="servesim_parallel") == [2.0 / 3.0, 2.0 / 3.0]
    assert "speed.processes=2 / mocker within each repetition: 0.67x, 0.67x" in (
        report.case_markdown(case)
    )


def test_processes_adds_no_variant_to_a_case_that_cannot_be_split(
    bench, runs, monkeypatch, tmp_path
):
    monkeypatch.setattr(runs, "compose_case", lambda *a, **k: _Config())
    monkeypatch.setattr(runs, "_plan_processes", lambda cfg: (1, "router=kv ..."))
    summary = {"num_requests": 12, "mean_ttft_ms": 5.0, "completed_requests": 12}
    sample = runs.Sample(1.0, 1.0, 100.0, 1.0, summary, import_s=0.1)
    monkeypatch.setattr(runs, "run_servesim", lambda *a, **k: sample)
    args = bench.parse_args(["--repeat", "1", "--processes", "2"])
    case = runs.run_case(
        bench.CASES["kv4"], tmp_path / "t.jsonl", args, _Compare(), None, tmp_path, 12
    )
    assert list(case.variants) == ["servesim"]
