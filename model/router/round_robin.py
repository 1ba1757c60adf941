"""Round robin: workers in turn, in dispatch order, starting at worker 0."""

from __future__ import annotations

from model.workload.request import Request


class RoundRobin:
    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._next = 0

    def route(self, req: Request) -> int:
        w = self._next
        self._next = (w + 1) % self.num_workers
        return w
