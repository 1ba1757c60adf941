"""KV transfer links: latency + bytes / bandwidth, and the three contention models."""

from __future__ import annotations

import pytest

from servesim.clock import Environment
from servesim.kv.link import Link
from servesim.metrics.recorder import Recorder
from servesim.metrics.tables import transfers_table

MB = 1_000_000


def run(contention, jobs, bandwidth_gbps=1.0, latency_ms=0.0, lanes=1):
    """Submit (t_ms, bytes) jobs; return each job's completion time, in submission order."""
    env = Environment()
    rec = Recorder()
    link = Link(env, "link.p0-d0", bandwidth_gbps, latency_ms, contention, rec, lanes)
    done: dict[int, float] = {}

    def submit_at(i, t, n_bytes):
        yield env.timeout(t)
        ev = link.submit(f"r{i}", n_bytes, n_bytes // MB, "pd")
        yield ev
        done[i] = env.now

    for i, (t, n_bytes) in enumerate(jobs):
        env.process(submit_at(i, t, n_bytes))
    env.run()
    return [done[i] for i in range(len(jobs))], transfers_table(rec)


def test_transfer_time_is_latency_plus_bytes_over_bandwidth():
    """128 tokens x 1 MB at 1 GB/s = 128 ms (the mocker's worked value), plus latency."""
    ends, table = run("per_request", [(0, 128 * MB)])
    assert ends == [128.0]
    ends, _ = run("per_request", [(0, 128 * MB)], latency_ms=0.5)
    assert ends == [128.5]
    assert list(table.columns) == [
        "request_id",
        "link",
        "kind",
        "src_tier",
        "dst_tier",
        "submit_ms",
        "start_ms",
        "end_ms",
        "bytes",
        "tokens",
    ]
    assert table.iloc[0].bytes == 128 * MB and table.iloc[0].link == "link.p0-d0"
    assert (table.iloc[0].src_tier, table.iloc[0].dst_tier) == ("device", "device")


def test_no_bandwidth_is_instant():
    ends, _ = run("shared", [(3.0, 10 * MB)], bandwidth_gbps=None)
    assert ends == [3.0]


def test_per_request_transfers_do_not_contend():
    ends, _ = run("per_request", [(0, 100 * MB), (0, 100 * MB), (50, 100 * MB)])
    assert ends == [100.0, 100.0, 150.0]


def test_fifo_lanes_queue_in_submission_order():
    ends, table = run("fifo_lanes", [(0, 100 * MB), (0, 100 * MB), (10, 50 * MB)])
    assert ends == [100.0, 200.0, 250.0]
    assert list(table.start_ms) == [0.0, 100.0, 200.0]
    ends, _ = run("fifo_lanes", [(0, 100 * MB), (0, 100 * MB), (10, 50 * MB)], lanes=2)
    assert ends == [100.0, 100.0, 150.0]


def test_shared_link_is_processor_sharing():
    """Two equal transfers together each get half the bandwidth; a third arriving later slows
    both: A, B = 100 MB at t=0; C = 25 MB at t=50 (A and B have 75 MB left). Three-way sharing
    until C is done at 50 + 75 = 125 (A, B at 50 MB left); then A and B finish at 125 + 100."""
    ends, _ = run("shared", [(0, 100 * MB), (0, 100 * MB)])
    assert ends == pytest.approx([200.0, 200.0])
    ends, _ = run("shared", [(0, 100 * MB), (0, 100 * MB), (50, 25 * MB)])
    assert ends == pytest.approx([225.0, 225.0, 125.0])


def test_shared_link_latency_before_sharing():
    ends, table = run("shared", [(0, 100 * MB)], latency_ms=2.0)
    assert ends == pytest.approx([102.0])
    assert table.iloc[0].start_ms == pytest.approx(2.0)
