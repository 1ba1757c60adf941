"""Qualification guards of agentic replay: each rejection names its rule; ordinary traces keep
every topology."""

from __future__ import annotations

import pytest

from servesim.config.load import ConfigError

G2 = {"host_offload": {"num_host_blocks": 1000}}
G3 = {"host_offload": {"num_host_blocks": 1000}, "disk": {"num_g3_blocks": 1000}}


@pytest.fixture
def agentic(one_request_agentic_file):
    return {"kind": "agentic_mooncake", "path": str(one_request_agentic_file), "agentic_lanes": 1}


def disagg(p, d, dp=1):
    role = {"dp_size": dp} if dp != 1 else {}
    return {
        "kind": "disagg",
        "num_prefill_workers": p,
        "num_decode_workers": d,
        "prefill": role,
        "decode": role,
    }


@pytest.mark.parametrize(
    "sections",
    [
        {"kv_cache": G2, "topology": {"kind": "aggregated", "num_workers": 1}},
        {"kv_cache": G2, "topology": disagg(1, 1)},
        {"topology": {"kind": "aggregated", "num_workers": 4}},  # HBM only: any topology
        {"topology": disagg(2, 2)},
    ],
)
def test_accepted(config, agentic, sections):
    config(workload=agentic, **sections)


@pytest.mark.parametrize(
    ("sections", "rule"),
    [
        ({"kv_cache": G3}, "agentic replay rejects G3"),
        (
            {"kv_cache": G2, "topology": {"kind": "aggregated", "num_workers": 2}},
            "one aggregated worker or 1P1D only.*got 2 aggregated workers",
        ),
        ({"kv_cache": G2, "topology": disagg(2, 1)}, "one aggregated worker or 1P1D.*got 2P1D"),
        ({"kv_cache": G2, "engine": {"dp_size": 2}}, "requires DP size 1"),
        ({"load": {"kind": "concurrency", "concurrency": 4}}, "requires trace-timestamp load"),
        ({"load": {"kind": "rate", "rate_rps": 1.0}}, "requires trace-timestamp load"),
        ({"stop": {"max_virtual_time_ms": 1000.0}}, "does not support max virtual time"),
    ],
)
def test_rejected_naming_the_rule(config, agentic, sections, rule):
    with pytest.raises(ConfigError, match=rule):
        config(workload=agentic, **sections)


def test_guards_apply_without_lanes_too(config, agentic):
    no_lanes = {k: v for k, v in agentic.items() if k != "agentic_lanes"}
    with pytest.raises(ConfigError, match="rejects G3"):
        config(workload=no_lanes, kv_cache=G3)


def test_ordinary_traces_keep_every_topology(config, trace):
    rows = [{"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1]}]
    mooncake = {"kind": "mooncake", "path": trace(rows), "trace_block_size": 64}
    config(workload=mooncake, kv_cache=G3, topology={"kind": "aggregated", "num_workers": 4})
    config(workload=mooncake, kv_cache=G2, load={"kind": "concurrency", "concurrency": 2})
