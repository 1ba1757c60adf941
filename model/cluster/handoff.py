"""The P/D handoff of one request: a SimPy process from the prefill copy's finish to the
release of its source KV, in Dynamo's tested order.

    prefill done -> source holds KV -> destination reserves -> transfer -> destination
    activates -> source releases

The source's KV stays held (active blocks on the prefill worker) until the end; the
destination reserves blocks for the whole prompt (pinning what it already holds) before the
transfer starts; the transfer moves `full_prompt` tokens, or only the blocks the destination
lacked (`destination_missing`). Activation and release change an engine, so each waits for the
end of that worker's pass in flight, if any.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import simpy

from servesim.clock import TRANSFER_END, fire
from servesim.workload.request import Request

if TYPE_CHECKING:
    from servesim.cluster.disagg import Destination, DisaggCluster


def handoff(
    cluster: DisaggCluster, copy: Request, req: Request, dest: Destination
) -> Generator[simpy.Event, None, None]:
    env = cluster.env
    assert req.reserved is not None
    yield req.reserved  # the decode rank took KV for the prompt
    link = cluster.link(req.prefill_worker_idx, dest.worker.idx)
    n_bytes = req.transfer_tokens * cluster.kv_bytes_per_token + cluster.link_cfg.state_bytes
    landed = link.submit(req.request_id, n_bytes, req.transfer_tokens, "pd")
    cluster.unsubmitted -= 1
    yield landed

    activated = env.event()

    def activate() -> None:
        cluster.activate(req, dest)
        fire(env, activated, TRANSFER_END)

    dest.worker.apply(activate)
    yield activated

    released = env.event()

    def release() -> None:
        cluster.release_source(copy)
        fire(env, released, TRANSFER_END)

    cluster.prefill[req.prefill_worker_idx].apply(release)
    yield released
