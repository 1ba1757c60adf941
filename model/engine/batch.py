"""A pass as a scheduler forms it: who computes what, and what the pass's price depends on."""

from __future__ import annotations

from typing import Any

from servesim.workload.request import Request


class Batch:
    """What one pass computes.

    `items` are (request, tokens scheduled, prompt tokens computed, prompt tokens before) in
    running order. Prefill work counts prompt positions only; decode items are requests that
    caught up and still owe output, except a request whose first token comes from this
    pass's prefill (it adds no decode time). `others` are the items that are not a running
    request's plain decode step (those `schedule` counts as it forms them).

    With KV tiers, `stores` are the copies to G2 of the prompt blocks this pass completes,
    prepared (room taken in G2) once it is formed and started at its end; `fences` are the
    landings of the stores to G2 this pass must wait for before it computes: those of the
    requests it preempted (vLLM flushes a preempted request's stores before reusing its
    blocks) and those still reading a cached block it evicted.

    With speculative decoding, `bursts` are the requests that caught up this pass, in running
    order, each with the tokens it emits at the pass end (drawn as the pass was formed); None
    when speculation is off (one token each).
    """

    __slots__ = (
        "items",
        "others",
        "n_prefill",
        "sum_prefill_isl",
        "sum_prefix",
        "prefill_tokens",
        "n_decode",
        "sum_decode_context",
        "n_preempted",
        "active_blocks",
        "rejected",
        "fences",
        "stores",
        "bursts",
    )

    def __init__(self) -> None:
        self.items: list[tuple[Request, int, int, int]] = []
        self.others: list[tuple[Request, int, int, int]] = []
        self.n_prefill = 0
        self.sum_prefill_isl = 0
        self.sum_prefix = 0
        self.prefill_tokens = 0
        self.n_decode = 0
        self.sum_decode_context = 0
        self.n_preempted = 0
        self.active_blocks = 0
        self.rejected: list[tuple[Request, str]] = []
        self.fences: list[Any] = []  # simpy events (the scheduler itself knows no SimPy)
        self.stores: list[Any] = []  # copies to G2 prepared as the pass was formed (KV tiers)
        self.bursts: list[tuple[Request, int]] | None = None  # speculative decoding only
