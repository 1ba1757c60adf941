"""Random placement: each request to a uniformly drawn worker, from the seeded `router` stream."""

from __future__ import annotations

import numpy as np

from model.workload.request import Request


class RandomRouter:
    def __init__(self, num_workers: int, rng: np.random.Generator) -> None:
        self.num_workers = num_workers
        self.rng = rng

    def route(self, req: Request) -> int:
        return int(self.rng.integers(self.num_workers))
