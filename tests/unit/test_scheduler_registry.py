"""A scheduler policy of one's own: defined here, selected by `engine.kind`, replayed.

The same tests run on the source and (in CI's second run, SERVESIM_NATIVE=1) on the native
build, where VllmScheduler is compiled and this file's subclass is not.
"""

from __future__ import annotations

from collections import deque

import pytest

from servesim import ConfigError, simulate
from servesim.engine import vllm
from servesim.engine.registry import SCHEDULERS, register_scheduler
from servesim.engine.vllm import VllmScheduler
from servesim.speed import native as native_build
from servesim.workload.request import Request, Status


class ShortestPromptFirst(VllmScheduler):
    """Admits the waiting request with the shortest prompt first (vLLM admits in arrival
    order). Preempted requests still go back to the front, as vLLM's do."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.passes = 0

    def enqueue(self, req: Request) -> None:
        req.status = Status.WAITING
        queue = sorted([*self.waiting, req], key=lambda r: (r.input_length, r.idx))
        self.waiting = deque(queue)

    def schedule(self, now_ms: float):  # type: ignore[no-untyped-def]
        self.passes += 1
        return super().schedule(now_ms)


@pytest.fixture
def registered():
    register_scheduler("shortest_prompt_first", ShortestPromptFirst)
    yield
    SCHEDULERS.pop("shortest_prompt_first", None)


def _burst(config, tmp_path, kind: str):
    """One worker, a burst of prompts of decreasing length at t = 0."""
    rows = [
        {
            "timestamp": 0,
            "input_length": 4000 - 300 * i,
            "output_length": 4,
            "hash_ids": list(range(10 * i, 10 * i + 8)),
        }
        for i in range(8)
    ]
    path = tmp_path / "burst.jsonl"
    path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    return config(
        engine={"kind": kind, "max_num_seqs": 1},
        topology={"kind": "aggregated", "num_workers": 1},
        workload={"kind": "mooncake", "path": str(path)},
    )


def test_a_policy_defined_here_replays_through_the_registry(registered, config, tmp_path):
    fifo = simulate(_burst(config, tmp_path, "vllm")).requests
    spf = simulate(_burst(config, tmp_path, "shortest_prompt_first")).requests
    assert (fifo["terminal_status"] == "completed").all()
    assert (spf["terminal_status"] == "completed").all()
    # vLLM serves the burst in arrival order; this policy shortest prompt first (the first
    # request is admitted alone, at once, before the others have arrived in its queue)
    first = fifo.sort_values("first_token_ms")["input_length"].tolist()
    assert first == sorted(first, reverse=True)
    order = spf.sort_values("first_token_ms")["input_length"].tolist()
    assert order[1:] == sorted(order[1:])
    assert order != first


def test_every_pass_of_a_policy_of_ones_own_goes_through_its_schedule(registered, config, tmp_path):
    """Decode stretches stand in for the shipped policy's passes only: another policy's
    passes each go through its own schedule (here counted), native build or not."""
    made: list[ShortestPromptFirst] = []
    original = ShortestPromptFirst.__init__

    def counting_init(self, *args):  # type: ignore[no-untyped-def]
        original(self, *args)
        made.append(self)

    ShortestPromptFirst.__init__ = counting_init  # type: ignore[method-assign]
    try:
        result = simulate(_burst(config, tmp_path, "shortest_prompt_first"))
    finally:
        ShortestPromptFirst.__init__ = original  # type: ignore[method-assign]
    (sched,) = made
    assert sched.passes >= result.summary["n_passes"] > 0


def test_an_unknown_policy_names_the_config_path(config, tmp_path):
    with pytest.raises(ConfigError, match=r"engine.kind: no scheduler policy 'nope'.*vllm"):
        simulate(_burst(config, tmp_path, "nope"))


def test_registering_what_is_not_a_policy_says_what_is_missing():
    with pytest.raises(TypeError, match="schedule, finish"):
        register_scheduler("half", type("Half", (), {"enqueue": len, "has_work": len}))


def test_a_patched_shipped_method_is_honoured_or_refused(config, tmp_path):
    """A notebook that replaces VllmScheduler.schedule: the source calls the replacement at
    every pass (no stretch stands in for it); the native build, whose compiled code would
    ignore it, refuses to run and says why."""
    calls = []
    original = vllm.VllmScheduler.schedule

    def schedule(self, now_ms):  # type: ignore[no-untyped-def]
        calls.append(now_ms)
        return original(self, now_ms)

    vllm.VllmScheduler.schedule = schedule  # type: ignore[method-assign]
    try:
        if native_build.ACTIVE is not None:
            with pytest.raises(native_build.NativeBuildError, match="VllmScheduler.schedule"):
                simulate(_burst(config, tmp_path, "vllm"))
            return
        result = simulate(_burst(config, tmp_path, "vllm"))
    finally:
        vllm.VllmScheduler.schedule = original  # type: ignore[method-assign]
    assert len(calls) >= result.summary["n_passes"] > 0


def test_the_docs_example_runs(capsys):
    """docs/schedulers.md's example, as written, registers its policy and replays with it."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "schedulers.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    try:
        exec(compile(code, "docs/schedulers.md", "exec"), {})
    finally:
        SCHEDULERS.pop("shortest_prompt_first", None)
    fifo, spf = (float(x) for x in capsys.readouterr().out.split())
    assert fifo > 0 and spf > 0
