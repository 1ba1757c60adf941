"""Workers replayed in several processes against one process (`speed.processes`, issue 8).

A run whose workers never interact (aggregated, round robin, a streamed open-loop trace) may be
split into parts replayed in separate processes and merged (model/speed/parallel.py). Each scenario
runs one config with `speed.processes=1` and with more, and compares, strictly: every table
(`_ms` columns to 1e-6 ms, everything else exactly, dtypes included), the per-token times and
the summary exactly, leaving out only the host-time keys and the process count itself. Each
scenario also checks that it exercises what its id says and that the run was split.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_TRACES, make_config, write_jsonl
from test_fast_forward_equivalence import (
    TABLES,
    table_differences,
    token_time_differences,
    value_differences,
)

from servesim import simulate
from servesim.metrics.summary import without_wall
from servesim.sim import Result
from servesim.workload.errors import TraceError

CONVERSATION = SHARED_TRACES / "conversation_trace.jsonl"
AZURE = SHARED_TRACES / "AzureLLMInferenceTrace_conv.csv"


def _without_processes(summary: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(without_wall(summary))
    meta = out["metadata"]
    del meta["processes"], meta["config"]["speed"]["processes"]
    meta.pop("processes_note", None)
    return out


def run_differences(split: Result, whole: Result) -> list[str]:
    found = []
    for name in TABLES:
        found += table_differences(name, getattr(split, name), getattr(whole, name))
    found += token_time_differences(
        dict(sorted(split.token_times.items())), dict(sorted(whole.token_times.items()))
    )
    found += value_differences(_without_processes(split.summary), _without_processes(whole.summary))
    return found


def run_with(sections: dict[str, Any], processes: int) -> Result:
    sections = dict(sections)
    speed = dict(sections.pop("speed", {}), processes=processes)
    return simulate(make_config(**sections, speed=speed))


def case(case_id: str, processes: int, expect: tuple[Any, ...] = (), **sections: Any) -> Any:
    """One scenario: `expect` holds summary keys that must be positive, terminal statuses that
    must occur, or predicates on the split run."""
    sections.setdefault("output", {})
    sections["output"] = {"progress": "off", "kv_events": True, **sections["output"]}
    sections["engine"] = {"num_gpu_blocks": 16384, **sections.get("engine", {})}
    sections.setdefault("timing", {"kind": "polynomial"})
    return pytest.param(sections, processes, expect, id=case_id)


def conversation(rows: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "mooncake", "path": str(CONVERSATION), "max_requests": rows, **extra}


def workers_used(n: int) -> Callable[[Result], bool]:
    def check(r: Result) -> bool:
        return r.requests["decode_worker_idx"].dropna().nunique() == n

    return check


SCENARIOS = [
    case("2w-2p", 2, (workers_used(2),), workload=conversation(300), topology={"num_workers": 2}),
    case(
        "4w-2p-per-token",
        2,
        (workers_used(4),),
        workload=conversation(300),
        topology={"num_workers": 4},
        output={"per_token": True},
    ),
    case(
        "4w-3p-uneven",
        3,
        (workers_used(4),),
        workload=conversation(300),
        topology={"num_workers": 4},
    ),
    case(
        "3w-2p-dp2",
        2,
        (workers_used(3), lambda r: r.requests["dp_rank"].nunique() == 2),
        workload=conversation(240),
        topology={"num_workers": 3},
        engine={"dp_size": 2},
    ),
    case(
        "2w-2p-preempt-evict",
        2,
        ("n_preemptions", "n_kv_evictions"),
        workload=conversation(200),
        topology={"num_workers": 2},
        engine={"num_gpu_blocks": 400, "preemption_mode": "lifo"},
    ),
    case(
        "2w-2p-stepped",
        2,
        ("n_kv_evictions",),
        workload=conversation(200),
        topology={"num_workers": 2},
        engine={"num_gpu_blocks": 600},
        speed={"fast_forward": False},
    ),
    case(
        "2w-2p-rejected",
        2,
        ("rejected",),
        workload=conversation(200),
        topology={"num_workers": 2},
        engine={"max_model_len": 9000},
    ),
    case(
        "2w-2p-cut-off",
        2,
        (
            "incomplete",
            lambda r: (r.requests["reason"] == "not arrived by max_virtual_time_ms").any(),
        ),
        workload=conversation(300),
        topology={"num_workers": 2},
        stop={"max_virtual_time_ms": 40_000.0},
    ),
    case(
        "2w-2p-no-pass-table",
        2,
        (lambda r: r.summary["n_passes"] > 0 and len(r.passes) == 0,),
        workload=conversation(200),
        topology={"num_workers": 2},
        output={"pass_table": False, "kv_events": False},
    ),
    case(
        "azure-3w-2p",
        2,
        (workers_used(3),),
        workload={"kind": "azure", "path": str(AZURE), "max_requests": 300},
        topology={"num_workers": 3},
    ),
    case(
        "more-processes-than-workers",
        8,
        (workers_used(2),),
        workload=conversation(120),
        topology={"num_workers": 2},
    ),
]


def _check_expectations(r: Result, expect: tuple[Any, ...]) -> None:
    for e in expect:
        if callable(e):
            assert e(r), f"scenario precondition {e} failed"
        elif e in ("rejected", "incomplete"):
            assert r.summary["terminal_status_counts"].get(e, 0) > 0, f"no {e} request"
        else:
            assert r.summary[e] > 0, f"summary {e} is {r.summary[e]}"


@pytest.mark.parametrize(("sections", "processes", "expect"), SCENARIOS)
def test_split_run_gives_the_one_process_answer(sections, processes, expect):
    whole = run_with(sections, 1)
    split = run_with(sections, processes)
    _check_expectations(whole, expect)
    n_workers = sections["topology"]["num_workers"]
    assert split.summary["metadata"]["processes"] == min(processes, n_workers)
    assert whole.summary["metadata"]["processes"] == 1
    found = run_differences(split, whole)
    assert not found, "the split run changed the answer:\n" + "\n".join(found[:20])


def test_skipped_rows_are_counted_once(tmp_path: Path):
    rows = [json.loads(line) for line in CONVERSATION.open().readlines()[:80]]
    rows[10] = {"timestamp": rows[10]["timestamp"], "input_length": "many"}
    rows[41]["output_length"] = -3
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    sections = {
        "workload": {"kind": "mooncake", "path": str(path), "skip_malformed": True},
        "topology": {"num_workers": 2},
    }
    whole, split = run_with(sections, 1), run_with(sections, 2)
    assert whole.summary["skipped_trace_rows"] == 2
    assert split.summary["metadata"]["processes"] == 2
    assert not run_differences(split, whole)


def test_a_bad_row_near_the_end_fails_the_split_run_with_its_line(tmp_path: Path):
    lines = CONVERSATION.open().readlines()[:400]
    lines[397] = '{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1]\n'
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(lines))
    sections = {"workload": {"kind": "mooncake", "path": str(path)}, "topology": {"num_workers": 2}}
    messages = []
    for processes in (1, 2):
        with pytest.raises(TraceError) as err:
            run_with(sections, processes)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert re.search(rf"{re.escape(str(path))}:398\b", messages[1]), messages[1]


@pytest.mark.parametrize(
    ("sections", "reason"),
    [
        ({"router": {"kind": "kv"}}, "router=kv"),
        ({"router": {"kind": "random"}}, "router=random"),
        ({"topology": {"num_workers": 1}}, "one worker"),
        (
            {
                "workload": {
                    "kind": "synthetic",
                    "num_sessions": 20,
                    "input_tokens": {"dist": "constant", "mean": 300, "min": 1, "max": 300},
                    "output_tokens": {"dist": "constant", "mean": 20, "min": 1, "max": 20},
                    "rate_rps": 5.0,
                }
            },
            "open-loop trace replay",
        ),
        (
            {"kv_cache": {"host_offload": {"num_host_blocks": 400}}},
            "KV tiers",
        ),
    ],
)
def test_a_run_whose_workers_interact_runs_in_one_process_and_says_why(sections, reason):
    base = {"workload": conversation(60), "topology": {"num_workers": 2}}
    sections = {**base, **sections}
    whole, asked = run_with(sections, 1), run_with(sections, 4)
    meta = asked.summary["metadata"]
    assert meta["processes"] == 1
    assert meta["processes_note"].startswith("speed.processes=4 not applied: ")
    assert reason in meta["processes_note"]
    assert "processes_note" not in whole.summary["metadata"]
    assert not run_differences(asked, whole)


@pytest.mark.parametrize("seed", range(4))
def test_random_traces_split_alike(seed: int, tmp_path: Path):
    """Random Mooncake rows (shared prefixes, bursts of equal timestamps, long and empty
    outputs), 2-5 workers, 2-3 processes, a small pool."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 120))
    t = np.cumsum(rng.choice([0, 0, 50, 400, 1500], size=n))
    rows = []
    for i in range(n):
        n_blocks = int(rng.integers(1, 12))
        prefix = list(range(int(rng.integers(0, 4)) * 3, int(rng.integers(0, 4)) * 3 + 3))
        ids = prefix + [1000 + i * 20 + k for k in range(n_blocks)]
        rows.append(
            {
                "timestamp": int(t[i]),
                "input_length": len(ids) * 512 - int(rng.integers(0, 500)),
                "output_length": int(rng.choice([0, 1, 5, 60, 300])),
                "hash_ids": ids,
            }
        )
    path = write_jsonl(tmp_path / f"r{seed}.jsonl", rows)
    workers = int(rng.integers(2, 6))
    sections = {
        "workload": {"kind": "mooncake", "path": str(path)},
        "topology": {"num_workers": workers},
        "engine": {"num_gpu_blocks": int(rng.integers(200, 800))},
        "output": {"progress": "off", "kv_events": True, "per_token": True},
        "timing": {"kind": "polynomial"},
    }
    processes = int(rng.integers(2, 4))
    whole, split = run_with(sections, 1), run_with(sections, processes)
    assert split.summary["metadata"]["processes"] == min(processes, workers)
    found = run_differences(split, whole)
    assert not found, "\n".join(found[:20])


def _split_in_a_pool_worker(sections: dict[str, Any]) -> dict[str, Any]:
    return run_with(sections, 2).summary["metadata"]


def test_a_pool_worker_runs_the_split_in_one_process_and_says_why():
    """A multiprocessing.Pool worker is daemonic and may not start processes of its own."""
    import multiprocessing

    sections = {"workload": conversation(40), "topology": {"num_workers": 2}}
    with multiprocessing.get_context("fork").Pool(1) as pool:
        meta = pool.apply(_split_in_a_pool_worker, (sections,))
    assert meta["processes"] == 1
    assert "daemonic" in meta["processes_note"]


def test_a_part_that_cannot_be_written_to_a_file_is_sent_back(monkeypatch):
    """A child whose part file cannot be written (a full disk) returns its part through the
    process pool instead: the same tables and summary, and no file left behind."""
    import pickle
    import tempfile
    import types

    import servesim.speed.parallel as parallel

    def no_room(obj: Any, fh: Any, protocol: int | None = None) -> None:
        raise OSError(28, "No space left on device")

    fake = types.SimpleNamespace(
        dump=no_room, load=pickle.load, HIGHEST_PROTOCOL=pickle.HIGHEST_PROTOCOL
    )
    monkeypatch.setattr(parallel, "pickle", fake)
    made: list[str] = []
    real_tmp = tempfile.TemporaryDirectory

    def tracked(*args: Any, **kwargs: Any) -> Any:
        d = real_tmp(*args, **kwargs)
        made.append(d.name)
        return d

    monkeypatch.setattr(parallel.tempfile, "TemporaryDirectory", tracked)
    sections = {"workload": conversation(60), "topology": {"num_workers": 3}}
    whole, split = run_with(sections, 1), run_with(sections, 3)
    assert split.summary["metadata"]["processes"] == 3
    found = run_differences(split, whole)
    assert not found, "\n".join(found[:20])
    assert made and not any(Path(d).exists() for d in made)


def _fail_in_part_one(cfg: Any, k: int, n: int) -> None:
    if k == 1:
        raise ValueError("part one cannot go on")
    # every other part gives nothing: nothing is merged once a part failed


def test_a_failing_child_part_raises_its_error_naming_the_part():
    """A child's error reaches the caller as itself (type and message), with the child's
    traceback as its cause and a note naming the part; no child is left running."""
    import multiprocessing

    from servesim.speed.parallel import run_parts

    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError) as err:
        run_parts(None, 3, _fail_in_part_one)
    assert str(err.value) == "part one cannot go on"
    assert err.value.__notes__ == [
        "(raised by part 1 of 3 of a partitioned replay, in a child process)"
    ]
    assert "_fail_in_part_one" in str(err.value.__cause__)
    assert set(multiprocessing.active_children()) == before


def _interrupt_part_zero(cfg: Any, k: int, n: int) -> None:
    """`cfg` is a folder: a child says there that it started, then replays "forever"; part 0
    (in the caller) waits until every child is busy and is then interrupted."""
    import time

    folder = Path(cfg)
    if k > 0:
        (folder / f"started-{k}").touch()
        time.sleep(600)
        return
    deadline = time.monotonic() + 60
    while len(list(folder.glob("started-*"))) < n - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    raise KeyboardInterrupt


def test_an_interrupted_split_run_ends_its_busy_children(tmp_path: Path):
    """An interrupt (Ctrl-C) while the parts replay ends every child before it propagates:
    none is left replaying, or orphaned."""
    import multiprocessing
    import time

    from servesim.speed.parallel import run_parts

    before = set(multiprocessing.active_children())
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_parts(tmp_path, 3, _interrupt_part_zero)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["started-1", "started-2"]
    assert time.monotonic() - t0 < 120
    assert set(multiprocessing.active_children()) == before
