"""KV tiers (G2 host, G3 disk): store, load and restore times in closed form, reuse by tier,
shared-pool bandwidth, and the configuration rules.

Fixed timing (10 ms per pass with prefill work, 1 ms with decode work), Llama-3.1-8B geometry:
a 64-token block is 64 x 131,072 B = 8,388,608 B, so a tier link of 8.388608 GB/s moves one
block per ms.
"""

from __future__ import annotations

import pytest
import simpy

from servesim import simulate
from servesim.config import ConfigError
from servesim.kv.tier_pool import TierPool

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
BLOCK_BYTES = 64 * 131072
ONE_BLOCK_PER_MS = BLOCK_BYTES / 1e6  # GB/s


def row(t, n_in, n_out, ids):
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


# A: 2 blocks [1, 2]; B: 2 other blocks, whose 3 G1 blocks evict A's block 2 from a 4-block G1
# pool; C: A's prompt plus block 5. C finds block 1 in G1 and block 2 only below it.
ABC = [row(0, 128, 2, [1, 2]), row(20, 128, 2, [3, 4]), row(40, 192, 1, [1, 2, 5])]


def run(config, trace, rows=ABC, host=None, disk=None, workers=1, **extra):
    kv_cache = {}
    if host is not None:
        kv_cache["host_offload"] = host
    if disk is not None:
        kv_cache["disk"] = disk
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        engine={"num_gpu_blocks": 4},
        topology={"kind": "aggregated", "num_workers": workers},
        kv_cache=kv_cache,
        output={"progress": "off", "kv_events": True},
        **extra,
    )
    return simulate(cfg)


HOST = {
    "num_host_blocks": 100,
    "d2h_bandwidth_gbps": ONE_BLOCK_PER_MS,
    "h2d_bandwidth_gbps": ONE_BLOCK_PER_MS,
}


def copies(result, kind):
    t = result.transfers
    return t[t.kind == kind].reset_index(drop=True)


def test_hbm_only_reuses_what_g1_kept(config, trace):
    """Without tiers C finds block 1 only: it prefills 128 tokens (one 10 ms pass at 40)."""
    r = run(config, trace)
    c = r.requests.iloc[2]
    assert c.reused_input_tokens == 64 and c.g1_reused_input_tokens == 64
    assert c.host_reused_input_tokens == 0 and c.first_token_ms == 50
    assert len(r.transfers) == 0
    s = r.summary
    assert s["host_reused_input_tokens"] == 0 and s["mean_host_used_ratio"] is None


def test_store_copies_new_prompt_blocks_once_with_the_source_pinned(config, trace):
    """Each prefill's completed prompt blocks go to G2 at its pass end as one copy (2 blocks:
    2 ms); C's store holds only block 5, which G2 lacked."""
    r = run(config, trace, host=HOST)
    d2h = copies(r, "d2h")
    assert list(d2h.request_id) == ["1", "2", "3"]
    assert list(d2h.submit_ms) == [10, 30, 51]
    assert list(d2h.end_ms) == pytest.approx([12, 32, 52])
    assert list(d2h.tokens) == [128, 128, 64]
    assert list(d2h.bytes) == [2 * BLOCK_BYTES, 2 * BLOCK_BYTES, BLOCK_BYTES]
    assert set(zip(d2h.src_tier, d2h.dst_tier, strict=True)) == {("device", "host")}
    # A ended at 11, but its two blocks stay active in G1 until the copy lands at 12
    g1 = r.kv[(r.kv.pool == "cluster.w0") & (r.kv.t_ms > 11) & (r.kv.t_ms < 12)]
    assert len(g1) == 0
    at_11 = r.kv[(r.kv.pool == "cluster.w0") & (r.kv.t_ms <= 11)].iloc[-1]
    assert at_11.used_blocks == 2  # the pinned prompt blocks (its decode block went back)
    at_12 = r.kv[(r.kv.pool == "cluster.w0") & (r.kv.t_ms <= 12.5)].iloc[-1]
    assert (at_12.used_blocks, at_12.cached_blocks) == (0, 2)


def test_load_from_host_defers_admission_then_runs_first(config, trace):
    """C at 40: block 1 in G1, block 2 in G2 -> a 1-block H2D copy 40 -> 41, then C is
    admitted at 41 with 128 cached tokens (64 from G1, 64 from G2) and prefills the other 64:
    first token at 51."""
    r = run(config, trace, host=HOST)
    h2d = copies(r, "h2d")
    assert len(h2d) == 1 and h2d.request_id[0] == r.requests.request_id[2]
    assert (h2d.submit_ms[0], h2d.end_ms[0]) == (40, pytest.approx(41))
    assert (h2d.src_tier[0], h2d.dst_tier[0]) == ("host", "device")
    c = r.requests.iloc[2]
    assert c.first_admit_ms == pytest.approx(41)
    assert c.first_token_ms == pytest.approx(51)
    assert c.reused_input_tokens == 128
    assert (c.g1_reused_input_tokens, c.host_reused_input_tokens) == (64, 64)
    s = r.summary
    assert (s["g1_reused_input_tokens"], s["host_reused_input_tokens"]) == (64, 64)
    assert s["h2d_bytes"] == BLOCK_BYTES and s["d2h_bytes"] == 5 * BLOCK_BYTES
    assert s["host_reused_ratio"] == pytest.approx(64 / (128 + 128 + 192))
    assert s["prefix_cache_reused_ratio"] == pytest.approx(128 / (128 + 128 + 192))


def test_private_pool_copies_queue_in_one_lane(config, trace):
    """Two stores submitted together on one rank's d2h lane run one after the other."""
    rows = [row(0, 64, 1, [1]), row(0, 128, 1, [2, 3])]
    r = run(config, trace, rows, host=HOST)
    d2h = copies(r, "d2h")
    assert list(d2h.submit_ms) == [10, 10]
    assert list(d2h.start_ms) == pytest.approx([10, 11])
    assert list(d2h.end_ms) == pytest.approx([11, 13])


def test_host_pool_evicts_lru_and_drops_what_cannot_fit(config, trace):
    """A 2-block G2: B's store evicts A's blocks (least recently used), so C finds nothing
    in G2 and reuses only G1's block 1."""
    host = dict(HOST, num_host_blocks=2)
    r = run(config, trace, host=host)
    c = r.requests.iloc[2]
    assert (c.g1_reused_input_tokens, c.host_reused_input_tokens) == (64, 0)
    ev = r.kv_events[r.kv_events.tier == "host"]
    assert list(ev.kind[:4]) == ["stored", "stored", "removed", "removed"]
    assert r.summary["host_evicted_blocks"] >= 2
    assert len(copies(r, "h2d")) == 0


def test_a_store_refused_at_every_pass_counts_its_blocks_once(config, trace):
    """A 6-block prompt cannot fit a 4-block G2: its store is refused at the pass that
    computes it and tried again at each of its 49 decode passes; `host_dropped_blocks` counts
    the 6 blocks once (it counted 300)."""
    cfg = config(
        workload={"kind": "mooncake", "path": trace([row(0, 384, 50, [1, 2, 3, 4, 5, 6])])},
        timing=FIXED,
        engine={"num_gpu_blocks": 16},
        kv_cache={"host_offload": dict(HOST, num_host_blocks=4)},
        output={"progress": "off"},
    )
    r = simulate(cfg)
    assert r.summary["completed_requests"] == 1
    assert r.summary["host_dropped_blocks"] == 6
    assert len(copies(r, "d2h")) == 0


DISK = {
    "num_g3_blocks": 100,
    "latency_to_first_byte_ms": 0.5,
    "read_bandwidth_gbps": ONE_BLOCK_PER_MS,
    "write_bandwidth_gbps": ONE_BLOCK_PER_MS,
}


def test_disk_write_behind_and_restore_through_host(config, trace):
    """G2 of 2 blocks with G3 under it: A's blocks land in G2 at 12 and are written behind to
    G3 (0.5 ms to first byte + 2 ms), B's store then evicts them from G2. C restores block 2:
    G3 -> G2 40 -> 41.5 (0.5 + 1 ms), G2 -> G1 41.5 -> 42.5, admitted at 42.5, first token
    at 52.5."""
    r = run(config, trace, host=dict(HOST, num_host_blocks=2), disk=DISK)
    writes = copies(r, "g2_to_g3")
    assert list(writes.submit_ms[:2]) == pytest.approx([12, 32])
    assert list(writes.end_ms[:2]) == pytest.approx([14.5, 34.5])
    assert (writes.src_tier[0], writes.dst_tier[0]) == ("host", "disk")
    reads = copies(r, "g3_to_g2")
    assert len(reads) == 1
    assert (reads.submit_ms[0], reads.end_ms[0]) == (40, pytest.approx(41.5))
    h2d = copies(r, "h2d")
    assert (h2d.submit_ms[0], h2d.end_ms[0]) == pytest.approx((41.5, 42.5))
    c = r.requests.iloc[2]
    assert c.first_admit_ms == pytest.approx(42.5) and c.first_token_ms == pytest.approx(52.5)
    assert (c.g1_reused_input_tokens, c.host_reused_input_tokens) == (64, 0)
    assert c.disk_reused_input_tokens == 64
    s = r.summary
    assert s["disk_reused_input_tokens"] == 64 and s["g3_to_g2_bytes"] == BLOCK_BYTES
    assert s["mean_disk_used_ratio"] > 0
    assert set(r.kv[r.kv.tier == "disk"].pool) == {"cluster.w0.disk"}


def test_shared_host_pool_shares_its_bandwidth(config, trace):
    """Two workers each store 2 blocks at 10 into one cluster-shared G2 whose total d2h
    bandwidth is one block per ms: each copy moves at half that and both land at 14 (private
    pools: 12)."""
    rows = [row(0, 128, 1, [1, 2]), row(0, 128, 1, [3, 4])]
    shared = dict(
        HOST,
        scope="cluster_shared",
        shared_d2h_bandwidth_gbps=ONE_BLOCK_PER_MS,
        d2h_bandwidth_gbps=10 * ONE_BLOCK_PER_MS,
    )
    r = run(config, trace, rows, host=shared, workers=2)
    d2h = copies(r, "d2h")
    assert list(d2h.end_ms) == pytest.approx([14, 14])
    assert set(d2h.link) == {"cluster.host.d2h"}
    assert set(r.kv[r.kv.tier == "host"].pool) == {"cluster.host"}
    private = run(config, trace, rows, host=HOST, workers=2)
    assert list(copies(private, "d2h").end_ms) == pytest.approx([12, 12])


def test_a_shared_host_pool_serves_every_worker(config, trace):
    """A's blocks, stored by worker 0, are loaded by worker 1 (round robin sends C there):
    2 blocks 60 -> 62, first token at 72. With private pools worker 1 recomputes them."""
    rows = [row(0, 128, 2, [1, 2]), row(20, 64, 1, [9]), row(40, 64, 1, [8])]
    rows.append(row(60, 192, 1, [1, 2, 5]))
    r = run(config, trace, rows, host=dict(HOST, scope="cluster_shared"), workers=2)
    c = r.requests.iloc[3]
    assert c.decode_worker_idx == 1
    assert (c.g1_reused_input_tokens, c.host_reused_input_tokens) == (0, 128)
    assert c.first_admit_ms == pytest.approx(62) and c.first_token_ms == pytest.approx(72)
    private = run(config, trace, rows, host=HOST, workers=2).requests.iloc[3]
    assert private.reused_input_tokens == 0 and private.first_token_ms == 70


def test_instant_copies_still_defer_to_the_next_pass(config, trace):
    """With 0 GB/s (instant) copies land at once; the loaded request is admitted at 40 in
    the pass that starts after the copy lands."""
    host = dict(HOST, d2h_bandwidth_gbps=0, h2d_bandwidth_gbps=0)
    r = run(config, trace, host=host)
    c = r.requests.iloc[2]
    assert c.first_admit_ms == 40 and c.first_token_ms == 50
    assert c.host_reused_input_tokens == 64


@pytest.mark.parametrize(
    "sections,needle",
    [
        ({"kv_cache": {"disk": {"num_g3_blocks": 10}}}, "G3 requires G2"),
        ({"kv_cache": {"host_offload": {"num_host_blocks": 0}}}, "num_host_blocks"),
        ({"kv_cache": {"host_offload": {"num_host_blocks": -5}}}, "num_host_blocks"),
        (
            {"kv_cache": {"host_offload": {"num_host_blocks": 10, "h2d_bandwidth_gbps": "inf"}}},
            "h2d_bandwidth_gbps",
        ),
        (
            {"kv_cache": {"host_offload": {"num_host_blocks": 10, "d2h_bandwidth_gbps": -1}}},
            "d2h_bandwidth_gbps",
        ),
        (
            {
                "kv_cache": {"host_offload": {"num_host_blocks": 10}, "disk": {"num_g3_blocks": 0}},
            },
            "num_g3_blocks",
        ),
        (
            {
                "kv_cache": {"host_offload": {"num_host_blocks": 10}},
                "engine": {"num_gpu_blocks": 4, "enable_prefix_caching": False},
            },
            "needs prefix caching",
        ),
        (
            {
                "kv_cache": {"host_offload": {"num_host_blocks": 10, "scope": "cluster_shared"}},
                "topology": {"kind": "disagg", "decode": {"tp_size": 2}},
            },
            "cluster_shared needs one physical KV layout",
        ),
    ],
)
def test_bad_tier_configs_name_the_rule(config, sections, needle):
    with pytest.raises(ConfigError, match=needle):
        config(**sections)


def test_per_rank_pools_with_different_tp_are_fine(config):
    """Private pools need no common layout: a 1P1D with TP 1 prefill and TP 2 decode."""
    cfg = config(
        kv_cache={"host_offload": {"num_host_blocks": 10}},
        topology={"kind": "disagg", "decode": {"tp_size": 2}},
    )
    assert cfg.kv_cache.host_offload.scope == "dp_rank_local"


def test_pd_host_tier_on_both_roles_and_handoff_uses_device_residency_only(config, trace):
    """1P1D with G2 on every rank: the prefill worker stores its prompt blocks, the decode
    worker stores what the transfer delivered; with destination_missing a decode rank charges
    every block it lacks in G1, whatever its G2 holds."""
    rows = [row(0, 128, 3, [1, 2]), row(100, 128, 3, [1, 2])]
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": 64},
        timing=FIXED,
        engine={"num_gpu_blocks": 16},
        topology={"kind": "disagg", "decode": {"num_gpu_blocks": 16}},
        link={"timing_mode": "destination_missing"},
        kv_cache={"host_offload": HOST},
    )
    r = simulate(cfg)
    assert list(r.requests.terminal_status) == ["completed", "completed"]
    d2h = copies(r, "d2h")
    assert set(d2h.link) == {"cluster.p0.d2h", "cluster.d0.d2h"}
    pd_rows = copies(r, "pd")
    # the second request finds both blocks cached in the decode worker's G1: nothing moves
    assert list(pd_rows.tokens) == [128, 0]


class _Levels:
    """A recorder stand-in for a lone TierPool: it keeps nothing."""

    def kv_level(self, *args: object) -> None:
        pass


def test_a_touch_repeated_after_other_blocks_moved_moves_them_again():
    """Touching a prompt puts its blocks at the recent end, its first block the most recent;
    touching it again is a no-op only while no other block moved in between."""
    pool = TierPool(simpy.Environment(), "g2", "host", 8, _Levels(), None)  # type: ignore[arg-type]
    prompt = [1, 2, 3]
    for keys in ([1, 2, 3], [4], [5]):
        assert pool.reserve(keys) == keys
        pool.land(keys)
    pool.touch(prompt)
    assert list(pool.resident) == [4, 5, 3, 2, 1]
    pool.touch(prompt)
    assert list(pool.resident) == [4, 5, 3, 2, 1]
    pool.touch([4])
    pool.touch(prompt)
    assert list(pool.resident) == [5, 4, 3, 2, 1]
    assert pool.reserve([6]) == [6]
    pool.land([6])
    pool.touch(prompt)
    assert list(pool.resident) == [5, 4, 6, 3, 2, 1]


class _StubTiers:
    """KV tiers for one scheduler, reduced to what a pass asks of them: every prompt continues
    in G2 after its G1 hit, and a store's landing is named after the block it reads."""

    def __init__(self) -> None:
        self.g2 = TierPool(simpy.Environment(), "g2", "host", 8, _Levels(), None)  # type: ignore[arg-type]
        self.g3 = None
        self.loads: list[tuple[str, list[str]]] = []

    def lookup(self, hashes, start, stop):
        return stop - start, False

    def reserve_load(self, keys):
        pass

    def landings(self, keys):
        return [f"store of {k}" for k in keys]

    def staged_from_g3(self, req, keys):
        return 0

    def load(self, req, keys, landed, fences):
        self.loads.append((req.request_id, fences))

    def g1_changed(self):
        pass

    def prepare_stores(self, batch):
        pass


def test_a_pass_and_a_load_it_starts_each_wait_for_the_stores_they_evicted_from():
    """R's decode step evicts block 203 (a store to G2 still reads it), then C's load in the
    same pass evicts 202: the pass waits for 203's store, the load for 202's."""
    from servesim.config.schema import EngineConfig
    from servesim.engine.vllm import VllmScheduler
    from servesim.kv.block_pool import BlockPool
    from servesim.workload.hashing import BlockHasher
    from servesim.workload.request import Request

    cfg = EngineConfig(block_size=4, max_num_batched_tokens=64, max_num_seqs=8)
    pool = BlockPool(5, True, False)
    sched = VllmScheduler(cfg, pool, BlockHasher(4), lambda *_: None)
    sched.tiers = tiers = _StubTiers()  # type: ignore[assignment]
    r = Request(0, "R", 4, 10, [100])
    sched.enqueue(r)
    sched.finish(sched.schedule(0), 1)  # R's prompt fills its one block; it decodes next
    x = Request(1, "X", 16, 0, [200, 201, 202, 203])  # four released blocks, stores reading them
    pool.allocate(x, 4)
    x.num_computed_tokens = 16
    pool.register_many(x, [200, 201, 202, 203])
    pool.pin([203, 202, 201, 200])
    pool.release(x)
    sched.enqueue(Request(2, "C", 8, 1, [300, 301]))
    batch = sched.schedule(1)
    assert batch.fences == ["store of 203"]
    assert tiers.loads == [("C", ["store of 202"])]


def test_a_request_waiting_for_a_block_still_being_written_to_g3_goes_on_when_it_lands(
    config, trace
):
    """A's block 1 is stored to worker 0's G2 at 10 and written to the shared G3 10 -> 11.1. B
    (block 1 + block 7, worker 1, whose G2 lacks block 1) arrives at 11: the block is still on
    its way into G3, so B is set aside; the landing wakes it, its lookup stages the block into
    G2 11.1 -> 12.2, it is loaded (instantly) and admitted at 12.2, first token at 22.2."""
    host = {"num_host_blocks": 1, "d2h_bandwidth_gbps": 0.0, "h2d_bandwidth_gbps": 0.0}
    disk = {
        "num_g3_blocks": 1,
        "scope": "cluster_shared",
        "read_bandwidth_gbps": ONE_BLOCK_PER_MS,
        "write_bandwidth_gbps": ONE_BLOCK_PER_MS,
        "shared_read_bandwidth_gbps": 0.0,
        "shared_write_bandwidth_gbps": 0.0,
    }
    rows = [row(0, 64, 0, [1]), row(11, 128, 1, [1, 7])]
    r = run(config, trace, rows, host=host, disk=disk, workers=2)
    b = r.requests.iloc[1]
    assert b.terminal_status == "completed"
    assert b.first_admit_ms == pytest.approx(12.2)
    assert b.first_token_ms == pytest.approx(22.2)
    assert b.disk_reused_input_tokens == 64
    assert copies(r, "g2_to_g3").end_ms[0] == pytest.approx(11.1)  # (B's block 7 later)
    restore = copies(r, "g3_to_g2")
    assert len(restore) == 1
    assert [restore.submit_ms[0], restore.end_ms[0]] == pytest.approx([11.1, 12.2])
