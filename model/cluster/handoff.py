"""The P/D handoff of one request: a SimPy process from its prefill copy's finish to the release
of its source KV, in Dynamo's tested order.

    prefill done -> source holds KV -> yield a reservation on the decode rank
    -> yield the transfer over the link -> activate on the decode rank -> release the source

(SGLang reserves the destination as the request arrives and waits for its prefill after.)

The source's KV stays held (active blocks on the prefill worker) until the end; the decode rank
reserves blocks for the whole prompt (pinning what it already holds) before the transfer starts
(servesim.cluster.reservation); the transfer moves `full_prompt` tokens, or only the blocks the
destination lacked (`destination_missing`). Activation and release change an engine, so each
happens between that worker's passes: now if it is idle, else at the end of its pass in flight.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Protocol

import simpy

from servesim.clock import SETTLE_DELIVERED, at_time
from servesim.cluster.reservation import Reservations
from servesim.engine.worker import Worker
from servesim.kv.link import Link
from servesim.metrics.recorder import COMPLETED, Recorder
from servesim.router import Router
from servesim.workload.request import Request


class PdCluster(Protocol):
    """What a handoff asks of its cluster (servesim.cluster.disagg.DisaggCluster)."""

    env: simpy.Environment
    recorder: Recorder
    prefill: list[Worker]
    between_pools: dict[int, Request]  # prefill done, decode not begun (by request index)
    prefill_copies: dict[int, Request]  # prefill copies until handed off (by request index)
    prefill_router: Router
    awaiting_link: set[int]  # reserved, transfer not on its link yet (by request index)
    transfer_bytes_per_token: int
    state_bytes: int  # moved once per request on top of its KV

    def link(self, prefill_worker: int, decode_worker: int) -> Link: ...
    def end(self, req: Request, status: str, reason: str = "") -> None: ...


def handoff(
    cluster: PdCluster,
    copy: Request | None,
    req: Request,
    reserved: simpy.Event,
    dest: Reservations,
    prefilled: simpy.Event | None = None,
) -> Generator[simpy.Event, None, None]:
    """The life of `req` between the pools: `copy` (its prefill copy) finished and holds its KV
    on the source; `reserved` fires once the decode rank `dest` has taken KV for it. SGLang
    reserves first: the handoff starts as the request arrives (no copy yet), the request goes
    to the prefill router once the reservation is made, and `prefilled` fires when its prefill
    copy has finished."""
    yield reserved  # the decode rank took KV blocks for the prompt
    if prefilled is not None:  # (destination first) now it is prefilled
        cluster.prefill_router.submit(req)
        yield prefilled  # the source holds the prompt's KV
        copy = cluster.prefill_copies.pop(req.idx)
    assert copy is not None
    source = cluster.prefill[req.prefill_worker_idx]
    link = cluster.link(req.prefill_worker_idx, dest.worker.idx)
    n_bytes = req.transfer_tokens * cluster.transfer_bytes_per_token + cluster.state_bytes
    landed = link.submit(req.request_id, n_bytes, req.transfer_tokens, "pd")
    cluster.awaiting_link.discard(req.idx)
    yield landed  # the KV is on the decode worker
    yield dest.worker.between_passes(lambda: activate(cluster, req, dest))
    yield source.between_passes(lambda: release_source(cluster, copy, source))


def activate(cluster: PdCluster, req: Request, dest: Reservations) -> None:
    """The transfer landed (now, between the decode worker's passes): the request joins the
    decode rank's running set with its prompt's KV in place."""
    env = cluster.env
    req.destination_activated_ms = env.now
    del cluster.between_pools[req.idx]
    if req.output_length == 0 and not dest.worker.has_work():
        # nothing to decode on an idle worker: whether it ends here or joins a pass is
        # settled once every transfer of this instant has landed
        at_time(env, env.now, SETTLE_DELIVERED).callbacks.append(
            lambda _: _settle_delivered(cluster, req, dest)
        )
        return
    _join(req, dest)


def _join(req: Request, dest: Reservations) -> None:
    dest.rank.scheduler.activate(req)
    dest.worker.sample_kv()
    dest.worker.wake()
    dest.attempt()


def _settle_delivered(cluster: PdCluster, req: Request, dest: Reservations) -> None:
    """A request with nothing to decode was delivered (now) to an idle decode worker. If
    nothing else was delivered there at this instant, it ends here (admitted and done at once,
    as in Dynamo) and its reserved KV goes back; otherwise it joins the pass that starts now
    like any delivered request, at no cost, and ends at that pass's end."""
    if dest.worker.has_work():
        _join(req, dest)
        return
    req.decode_admit_ms = cluster.env.now
    scheduler = dest.rank.scheduler
    # its prompt blocks are registered (and stay cached once released); Dynamo tries the
    # rank's reservation queue once while they are still held, and again after
    scheduler.materialize(req)
    dest.attempt()
    if scheduler.tiers is not None:  # its prompt is stored to G2 before its blocks go back
        scheduler.tiers.store_delivered(req)
    dest.rank.pool.release(req)
    dest.worker.sample_kv()
    dest.worker.wake()  # the freed blocks may admit what waits there
    cluster.end(req, COMPLETED)
    dest.attempt()


def release_source(cluster: PdCluster, copy: Request, source: Worker) -> None:
    """The source lets go of the KV it held (now, between the prefill worker's passes)."""
    req = copy.parent
    assert req is not None
    source.ranks[req.prefill_dp_rank].scheduler.release_held(copy)
    source.sample_kv()
    now = cluster.env.now
    req.source_released_ms = now
    if req.terminal_status:  # the decode side finished first: its row is written
        cluster.recorder.request_late(req, "source_released_ms", now)
    source.wake()  # freed blocks may admit what waits there
