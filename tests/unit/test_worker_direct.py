"""A worker and its scheduler built by hand, without a cluster or a config file: the textbook
pass loop on two requests, with times worked out by hand.

Fixed timing: a pass with prefill costs 10 ms, one with decode 1 ms, both 11 ms. Two prompts
of 100 tokens arrive at t = 0 with 3 output tokens each and a budget of 8,192 tokens: one pass
prefills both (their first tokens at 10 ms), then two decode passes give the second and third
tokens at 11 and 12 ms.
"""

from __future__ import annotations

import simpy

from servesim.config.cluster import EngineConfig
from servesim.config.hardware import FixedTiming
from servesim.engine.vllm import VllmScheduler
from servesim.engine.worker import Worker
from servesim.kv.block_pool import BlockPool
from servesim.metrics.recorder import Recorder
from servesim.timing.fixed import Fixed
from servesim.workload.hashing import BlockHasher
from servesim.workload.request import Request


def test_a_hand_built_worker_runs_the_textbook_loop():
    env = simpy.Environment()
    engine = EngineConfig(block_size=16, num_gpu_blocks=64)
    admitted: list[tuple[str, int, float]] = []
    scheduler = VllmScheduler(
        engine,
        BlockPool(64, True, False),
        BlockHasher(16),
        lambda req, reused, now: admitted.append((req.request_id, reused, now)),
    )
    done: list[tuple[str, float]] = []
    worker = Worker(
        env,
        0,
        [scheduler],
        Fixed(FixedTiming(prefill_ms=10.0, decode_ms=1.0)),
        Recorder(),
        lambda req: done.append((req.request_id, env.now)),
        lambda req, why: done.append((f"rejected {req.request_id}: {why}", env.now)),
    )
    reqs = [Request(k, f"r{k}", 100, 3, []) for k in range(2)]
    for req in reqs:
        req.arrival_ms = 0.0
        worker.submit(req)
    env.run()
    assert [(r.first_token_ms, r.second_token_ms, r.last_token_ms) for r in reqs] == [
        (10.0, 11.0, 12.0)
    ] * 2
    assert [a[0] for a in admitted] == ["r0", "r1"]
    assert done == [("r0", 12.0), ("r1", 12.0)]
    assert scheduler.pool.n_active == 0 and not scheduler.has_work()
