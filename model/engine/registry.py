"""The scheduler registry: `engine.kind` names the policy each rank runs.

    from servesim.engine.registry import register_scheduler
    from servesim.engine.vllm import VllmScheduler

    @register_scheduler("shortest_first")
    class ShortestFirst(VllmScheduler):
        ...

then `engine.kind=shortest_first`. A registered class is built per rank as
`cls(engine_config, pool, hasher, on_admit, role)`, like VllmScheduler, and must offer the
`Scheduler` interface (servesim.engine.scheduler; docs/schedulers.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servesim.config.errors import ConfigError
from servesim.engine.scheduler import Scheduler
from servesim.engine.sglang import SglangScheduler
from servesim.engine.trtllm import TrtllmScheduler
from servesim.engine.vllm import VllmScheduler
from servesim.speed import native
from servesim.speed.stretch import replaced_methods

SchedulerClass = Callable[..., Scheduler]

SCHEDULERS: dict[str, SchedulerClass] = {
    "vllm": VllmScheduler,
    "sglang": SglangScheduler,
    "trtllm": TrtllmScheduler,
}

# what every pass asks of a policy (the P/D handoff's four come with VllmScheduler's base)
_EVERY_PASS = ("enqueue", "has_work", "schedule", "finish")


def register_scheduler(name: str, cls: Any = None) -> Callable[[Any], Any]:
    """Register `cls` as the policy `engine.kind=name` (usable as a class decorator)."""

    def add(c: Any) -> Any:
        missing = [m for m in _EVERY_PASS if not callable(getattr(c, m, None))]
        if not isinstance(c, type) or missing:
            raise TypeError(
                f"a scheduler policy is a class with {', '.join(_EVERY_PASS)}; {c!r} lacks "
                f"{', '.join(missing) or 'being a class'} (subclass VllmScheduler to start)"
            )
        SCHEDULERS[name] = c
        return c

    if cls is not None:
        add(cls)
    return add


def scheduler_class(kind: str) -> SchedulerClass:
    """The policy registered as `kind`; ConfigError naming engine.kind if there is none."""
    cls = SCHEDULERS.get(kind)
    if cls is None:
        raise ConfigError(
            f"engine.kind: no scheduler policy {kind!r} is registered; registered: "
            f"{', '.join(sorted(SCHEDULERS))} (servesim.engine.registry.register_scheduler)"
        )
    replaced = replaced_methods()
    if replaced and native.ACTIVE is not None:
        raise native.NativeBuildError(
            f"{', '.join(replaced)} replaced after import: the native build's compiled "
            "scheduler calls its own compiled methods and would ignore the replacement. "
            "Subclass VllmScheduler and register it (servesim.engine.registry."
            "register_scheduler), or run the source (unset SERVESIM_NATIVE)"
        )
    return cls
