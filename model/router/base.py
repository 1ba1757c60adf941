"""What a router is: a plain object asked, at each dispatch, which worker (and which of its
attention-DP ranks) takes a request."""

from __future__ import annotations

from typing import Protocol

from model.workload.request import Request


class Router(Protocol):
    def route(self, req: Request) -> tuple[int, int]:
        """The (worker, attention-DP rank) that takes `req`."""
        ...
