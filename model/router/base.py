"""What a router is: a plain object asked, at each dispatch, which worker takes a request."""

from __future__ import annotations

from typing import Protocol

from model.workload.request import Request


class Router(Protocol):
    def route(self, req: Request) -> int:
        """Index of the worker that takes `req`."""
        ...
