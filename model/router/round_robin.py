"""Round robin: workers in turn, in dispatch order, starting at worker 0; within a worker,
its attention-DP ranks in turn (each worker keeps its own rank counter), as Dynamo's replay
does for aggregated workers. Its P/D pools instead rotate over the flat list of ranks
(worker-major: w0r0, w0r1, w1r0, ...): `flat=True`."""

from __future__ import annotations

from servesim.router.base import Router
from servesim.workload.request import Request


class RoundRobin(Router):
    def __init__(self, num_workers: int, dp_size: int = 1, flat: bool = False) -> None:
        super().__init__()
        self.num_workers = num_workers
        self.dp_size = dp_size
        self.flat = flat
        self._next = 0
        self._next_rank = [0] * num_workers

    def skip_to(self, j: int) -> None:
        """The next request routed is the run's j-th (0-based) request: those before it not
        routed here were routed in other parts of a partitioned run (model/speed/parallel.py). Only
        the worker (flat: the rank) turn moves; within a worker, ranks turn over the requests
        it takes, which are all routed here."""
        self._next = j % (self.num_workers * self.dp_size if self.flat else self.num_workers)

    def route(self, req: Request) -> tuple[int, int]:
        if self.flat:
            k = self._next
            self._next = (k + 1) % (self.num_workers * self.dp_size)
            return k // self.dp_size, k % self.dp_size
        w = self._next
        self._next = (w + 1) % self.num_workers
        rank = self._next_rank[w]
        self._next_rank[w] = (rank + 1) % self.dp_size
        return w, rank
