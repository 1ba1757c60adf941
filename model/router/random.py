"""Random placement: each request to a uniformly drawn (worker, rank), from the seeded `router`
stream."""

from __future__ import annotations

import numpy as np

from servesim.router.base import Router
from servesim.workload.request import Request


class RandomRouter(Router):
    def __init__(self, num_workers: int, rng: np.random.Generator, dp_size: int = 1) -> None:
        super().__init__()
        self.num_workers = num_workers
        self.dp_size = dp_size
        self.rng = rng

    def route(self, req: Request) -> tuple[int, int]:
        k = int(self.rng.integers(self.num_workers * self.dp_size))
        return k // self.dp_size, k % self.dp_size
