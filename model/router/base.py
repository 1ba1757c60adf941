"""What a router is: the object a cluster hands each arriving request to; it sends the request
to a (worker, attention-DP rank) now or, if it keeps a pending queue, later, and hears when the
request's prefill is done and when it ends."""

from __future__ import annotations

from collections.abc import Callable

from servesim.workload.request import Request

Send = Callable[[Request, int, int], None]


def _unset(req: Request, worker: int, rank: int) -> None:
    raise RuntimeError("router.send is set by the cluster that owns the router")


class Router:
    """Stateless placement (round robin, random): `route` picks, `submit` sends at once."""

    def __init__(self) -> None:
        self.send: Send = _unset

    @property
    def has_waiting(self) -> bool:
        """Whether requests wait in the router (a lifecycle edge may then dispatch)."""
        return False

    def waiting(self) -> list[Request]:
        """The requests waiting in the router (dispatched, not yet sent to a worker)."""
        return []

    def route(self, req: Request) -> tuple[int, int]:
        """The (worker, attention-DP rank) that takes `req`."""
        raise NotImplementedError

    def submit(self, req: Request) -> None:
        worker, rank = self.route(req)
        self.send(req, worker, rank)

    def prefill_done(self, req: Request) -> None:
        """`req`'s prompt is prefilled (its first token, or its P/D prefill copy finished)."""

    def finished(self, req: Request) -> None:
        """`req` ended (completed or rejected) where the router sent it."""

    def settle(self) -> None:
        """A pass end's lifecycle edges (`prefill_done`, `finished`) are all in; a router with
        a queue applies the ones it held here, in the pass's batch order, and releases from
        the queue after each."""
