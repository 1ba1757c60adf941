"""Closed-form checks: the model against arithmetic and queueing theory."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import simulate


def p(t: float) -> float:
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142


def d(tokens: int, total: int = 16384 * 64) -> float:
    u = min(1.0, tokens / total)
    return max(1.0, -25.74 * (u * u) + 54.01 * u + 5.74)


def ns(ms: float) -> float:
    """A duration as the mocker keeps it: seconds rounded to the nanosecond."""
    return round(round(ms / 1000, 9) * 1e9) / 1e6


@pytest.mark.parametrize("n_in,n_out", [(1000, 1), (1000, 5), (5000, 40), (20000, 3)])
def test_lone_request_takes_prefill_plus_decodes(config, trace, n_in, n_out):
    """TTFT = the prefill chunks' times; E2E = TTFT + sum of decode passes, each priced at the
    sequence's length before the pass (the mocker's polynomial, nanosecond-rounded)."""
    ids = list(range(-(-n_in // 64)))
    cfg = config(
        workload={
            "kind": "mooncake",
            "path": trace(
                [{"timestamp": 0, "input_length": n_in, "output_length": n_out, "hash_ids": ids}]
            ),
            "trace_block_size": 64,
        },
        engine={"num_gpu_blocks": 16384},
    )
    req = simulate(cfg).requests.iloc[0]
    chunks = [8192] * (n_in // 8192) + ([n_in % 8192] if n_in % 8192 else [])
    ttft = sum(ns(p(c)) for c in chunks)
    e2e = ttft + sum(ns(d(n_in + k)) for k in range(1, n_out))
    assert req.ttft_ms == pytest.approx(ttft, abs=1e-9)
    assert req.e2e_latency_ms == pytest.approx(e2e, abs=1e-9)
    assert req.output_length == n_out


def test_fixed_timing_lone_request(config, trace):
    cfg = config(
        workload={
            "kind": "mooncake",
            "path": trace(
                [
                    {
                        "timestamp": 0,
                        "input_length": 300,
                        "output_length": 7,
                        "hash_ids": [1, 2, 3, 4, 5],
                    }
                ]
            ),
            "trace_block_size": 64,
        },
        timing={"kind": "fixed", "prefill_ms": 12.5, "decode_ms": 3.0},
    )
    req = simulate(cfg).requests.iloc[0]
    assert req.ttft_ms == 12.5 and req.e2e_latency_ms == 12.5 + 6 * 3.0
    assert req.tpot_ms == 3.0 and req.ttst_ms == 3.0


def test_md1_queue_matches_pollaczek_khinchine(config, tmp_path):
    """One worker serving one request at a time, each a fixed-time prefill with one output
    token, Poisson arrivals: an M/D/1 queue. Mean wait Wq = rho / (2 mu (1 - rho))."""
    service_ms, rho, n = 10.0, 0.7, 40_000
    cfg = config(
        workload={
            "kind": "synthetic",
            "num_sessions": n,
            "input_tokens": {"dist": "constant", "mean": 64},
            "output_tokens": {"dist": "constant", "mean": 1},
            "rate_rps": rho / service_ms * 1000.0,
        },
        timing={"kind": "fixed", "prefill_ms": service_ms, "decode_ms": 1.0},
        engine={"max_num_seqs": 1, "enable_prefix_caching": False},
        seed=3,
    )
    r = simulate(cfg).requests
    wait = (r.ttft_ms - service_ms).mean()
    mu = 1.0 / service_ms
    theory = rho / (2 * mu * (1 - rho))
    assert wait == pytest.approx(theory, rel=0.05)


def test_littles_law_on_the_request_table(config):
    """Time-average number in system = arrival rate x mean time in system."""
    cfg = config(
        workload={
            "kind": "synthetic",
            "num_sessions": 3000,
            "input_tokens": {"dist": "uniform", "mean": 300, "min": 64, "max": 600},
            "output_tokens": {"dist": "uniform", "mean": 30, "min": 1, "max": 60},
            "rate_rps": 20.0,
        },
        timing={"kind": "fixed", "prefill_ms": 20.0, "decode_ms": 5.0},
        seed=5,
    )
    r = simulate(cfg).requests
    t_end = r.terminal_ms.max()
    sojourn = r.terminal_ms - r.arrival_ms
    grid = np.linspace(0, t_end, 20001)
    in_system = (
        (r.arrival_ms.to_numpy()[:, None] <= grid) & (grid < r.terminal_ms.to_numpy()[:, None])
    ).sum(axis=0)
    lam = len(r) / t_end
    assert in_system.mean() == pytest.approx(lam * sojourn.mean(), rel=0.02)
