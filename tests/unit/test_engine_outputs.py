"""What a run's outputs say about its engine: the `engine` column of the requests and passes
tables, the counts of preemptions, retractions and readmissions (per request and in the
summary), and the engine and speculation settings in the run's metadata.

Two requests of 100 prompt and 20 output tokens arrive together, each with its own prompt;
fixed timing: a pass with prefill work takes 10 ms, one with decode work 1 ms. A pool of 220
tokens (SGLang: 220 one-token pages; vLLM and TRT-LLM: 110 blocks of 2) holds both prompts
and their first tokens but not both requests to completion (240 tokens), so the engine has to
choose: SGLang retracts one, vLLM preempts one, TRT-LLM admits one only when the other ends.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from servesim import simulate

FIXED = {"kind": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
COUNTS = ("n_preemptions", "n_retractions", "n_readmissions")
# per request: its counts, then when it ended
PER_REQUEST = ["n_preemptions", "n_admissions", "n_readmissions", "terminal_ms"]


def row(t, n_in, n_out, ids):
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


A, B = row(0, 100, 20, [1]), row(0, 100, 20, [2])


def engine(kind, tokens=220, **changes):
    """`kind` with a pool of `tokens` tokens (SGLang: one-token pages; the others: 2-token
    blocks); SGLang keeps back one token per running request (clip_max_new_tokens 1)."""
    if kind == "sglang":
        return {"kind": kind, "block_size": 1, "num_gpu_blocks": tokens, **changes} | {
            "clip_max_new_tokens": 1
        }
    out = {"kind": kind, "block_size": 2, "num_gpu_blocks": tokens // 2, **changes}
    if kind == "trtllm":
        out["capacity_scheduler_policy"] = "guaranteed_no_evict"
    return out


def run(config, trace, rows, eng, topology=None, trace_block_size=100):
    cfg = config(
        workload={"kind": "mooncake", "path": trace(rows), "trace_block_size": trace_block_size},
        engine=eng,
        timing=FIXED,
        topology=topology or {"kind": "aggregated", "num_workers": 1},
    )
    return simulate(cfg)


def per_request(result):
    """{request id: [n_preemptions, n_admissions, n_readmissions, terminal_ms]}"""
    req = result.requests
    return dict(zip(req.request_id, req[PER_REQUEST].values.tolist(), strict=True))


def counts(result):
    return {k: result.summary[k] for k in COUNTS}


def disagg(**decode):
    return {"kind": "disagg", "num_prefill_workers": 1, "num_decode_workers": 1, "decode": decode}


# --------------------------------------------------------------------------- the engine column


@pytest.mark.parametrize("kind", ["vllm", "sglang", "trtllm"])
def test_both_tables_and_the_metadata_name_the_engine(config, trace, kind):
    r = run(config, trace, [A, B], engine(kind, tokens=1000))
    assert r.requests.engine.tolist() == [kind, kind]
    assert set(r.passes.engine) == {kind} and len(r.passes) > 1
    assert r.summary["metadata"]["engine"] == kind
    # text columns as the others are kept (pandas' default str dtype)
    assert r.requests.engine.dtype == r.requests.request_id.dtype
    assert r.passes.engine.dtype == r.passes.role.dtype


def test_pd_rows_name_the_engine_of_both_pools(config, trace):
    """P/D with two decode ranks: every prefill and decode pass and every request names the
    engine both pools run; each request is admitted twice (its prefill, then its delivered
    KV), which is no readmission."""
    r = run(config, trace, [A, B], engine("sglang", 1000), disagg(dp_size=2))
    assert r.passes.groupby("role").engine.unique().map(list).to_dict() == {
        "prefill": ["sglang"],
        "decode": ["sglang"],
    }
    assert sorted(r.requests.dp_rank) == [0, 1]
    assert r.requests.engine.tolist() == ["sglang", "sglang"]
    assert r.requests.n_admissions.tolist() == [2, 2]
    assert counts(r) == {"n_preemptions": 0, "n_retractions": 0, "n_readmissions": 0}


# --------------------------------------------------------------------------- counts


def test_sglang_retracts_the_least_decoded_and_readmits_it(config, trace):
    """The prefill pass (0-10 ms) takes 2 x 101 pages (prompt and first token); each decode
    step takes 2 more, so the 18 left last 9 steps (10-19 ms). The step at 19 ms finds none
    free: A (10 tokens, as many as B: the earlier on a tie) is retracted, B decodes alone and
    ends at 29 ms (19 more tokens, one per ms). Only then do A's 110 pages fit again: it is
    readmitted at 29 ms, recomputes in one prefill pass (29-39, its 11th token) and decodes its
    last 9 tokens by 48 ms."""
    r = run(config, trace, [A, B], engine("sglang"))
    assert per_request(r) == {"1": [1, 2, 1, 48.0], "2": [0, 1, 0, 29.0]}
    assert counts(r) == {"n_preemptions": 1, "n_retractions": 1, "n_readmissions": 1}
    retracting = r.passes[r.passes.preemptions > 0]
    assert retracting[["start_ms", "decode_seqs", "preemptions"]].values.tolist() == [[19, 1, 1]]


def test_vllm_preempts_the_last_admitted_and_readmits_it(config, trace):
    """The same pool as 110 blocks of 2 tokens: the prompts take 100; each request takes a
    block every second token, so 10 are left for 10 decode steps (10-20 ms). The step at 20 ms
    needs 2 and none is free: B, admitted last, is preempted (LIFO); it is no retraction. A
    ends at 29 ms; B is readmitted then onto its cached blocks and ends 9 tokens later."""
    r = run(config, trace, [A, B], engine("vllm"))
    assert per_request(r) == {"1": [0, 1, 0, 29.0], "2": [1, 2, 1, 38.0]}
    assert counts(r) == {"n_preemptions": 1, "n_retractions": 0, "n_readmissions": 1}
    assert r.passes.loc[r.passes.preemptions > 0, "start_ms"].tolist() == [20]


def test_trtllm_admits_the_second_request_when_the_first_ends(config, trace):
    """guaranteed_no_evict: B's footprint (60 blocks) does not fit beside A's (60 of 110), so
    B waits until A ends at 29 ms: no preemption, no readmission."""
    r = run(config, trace, [A, B], engine("trtllm"))
    assert r.requests.first_admit_ms.tolist() == [0, 29]
    assert r.requests.n_admissions.tolist() == [1, 1]
    assert counts(r) == {"n_preemptions": 0, "n_retractions": 0, "n_readmissions": 0}


def test_every_rank_of_every_worker_counts_its_retractions(config, trace):
    """Two workers of two ranks each, each rank given the two-request scenario (round robin:
    worker, then rank): each of the four ranks retracts its first request once."""
    rows = [row(0, 100, 20, [k]) for k in range(1, 9)]
    r = run(
        config,
        trace,
        rows,
        engine("sglang", dp_size=2),
        {"kind": "aggregated", "num_workers": 2},
    )
    req = r.requests
    assert req.groupby(["decode_worker_idx", "dp_rank"]).size().tolist() == [2, 2, 2, 2]
    assert counts(r) == {"n_preemptions": 4, "n_retractions": 4, "n_readmissions": 4}
    assert req.n_preemptions.sum() == req.n_readmissions.sum() == r.passes.preemptions.sum() == 4
    assert (req.n_admissions == 1 + req.n_readmissions).all()


def test_pd_decode_retraction_is_a_decode_readmission(config, trace):
    """P/D, SGLang, the 220-page pool on the decode worker only: the two prompts are
    prefilled (0-10 ms) and delivered at once, and the decode worker retracts A as the
    aggregated worker does, one pass later (the first tokens come from its first decode pass,
    10-11 ms). A was admitted on the prefill worker, took in its delivered KV, and was
    readmitted: 3 admissions."""
    r = run(config, trace, [A, B], engine("sglang", 1000), disagg(num_gpu_blocks=220))
    assert r.requests[["n_preemptions", "n_admissions", "n_readmissions"]].values.tolist() == [
        [1, 3, 1],
        [0, 2, 0],
    ]
    assert counts(r) == {"n_preemptions": 1, "n_retractions": 1, "n_readmissions": 1}
    decode = r.passes[r.passes.role == "decode"]
    assert decode.loc[decode.preemptions > 0, "start_ms"].tolist() == [20]


def test_pd_prefill_preemption_is_a_prefill_readmission(config, trace):
    """P/D, vLLM, speculative decoding (k = 2), a prefill pool of 3 blocks of 16 tokens: A (32
    tokens) and B (16) take all 3, and once the pass is formed each reserves a block for its
    one token on the prefill worker: B, admitted last, is preempted there. It is readmitted
    (10-20 ms) and delivered: 2 prefill admissions and 1 decode admission."""
    rows = [row(0, 32, 5, [1, 2]), row(0, 16, 5, [3])]
    spec = {"num_speculative_tokens": 2, "acceptance_rates": [1.0, 1.0]}
    eng = {"kind": "vllm", "block_size": 16, "num_gpu_blocks": 100, "speculative": spec}
    topology = disagg() | {"prefill": {"num_gpu_blocks": 3}}
    r = run(config, trace, rows, eng, topology, trace_block_size=16)
    assert r.requests[["n_preemptions", "n_admissions", "n_readmissions"]].values.tolist() == [
        [0, 2, 0],
        [1, 3, 1],
    ]
    assert r.requests.prefill_admit_ms.tolist() == [0, 0]  # (its first admission)
    assert counts(r) == {"n_preemptions": 1, "n_retractions": 0, "n_readmissions": 1}
    assert r.passes.groupby("role").preemptions.sum().to_dict() == {"decode": 0, "prefill": 1}


def test_a_request_cut_off_after_its_preemption_has_no_readmission(config, trace):
    """The vLLM scenario stopped at 25 ms: B, preempted at 20 ms, is still waiting, so the
    run has one preemption and no readmission."""
    cfg = config(
        workload={"kind": "mooncake", "path": trace([A, B]), "trace_block_size": 100},
        engine=engine("vllm"),
        timing=FIXED,
        stop={"max_virtual_time_ms": 25.0},
    )
    r = simulate(cfg)
    assert r.requests.terminal_status.tolist() == ["incomplete", "incomplete"]
    assert counts(r) == {"n_preemptions": 1, "n_retractions": 0, "n_readmissions": 0}
    assert r.requests.n_admissions.tolist() == [1, 1]


@pytest.mark.parametrize("kind", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("pd", [False, True], ids=["aggregated", "pd"])
def test_the_counts_add_up_under_pressure(config, trace, kind, pd):
    """24 requests of varied lengths on two workers (P/D: one prefill and two decode
    workers) of 300 tokens each: a request is admitted once more than its readmissions on
    each side; a completed one was readmitted once per preemption, a rejected one (SGLang
    rejects a readmitted request whose first page does not fit) at most that often; the
    summary's counts are the tables' sums, and SGLang's preemptions are all retractions."""
    rows = [
        row(3 * k, 40 + 37 * (k % 5), 10 + 13 * (k % 4), list(range(5 * k, 5 * k + 5)))
        for k in range(24)
    ]
    if pd:
        topology = disagg(num_gpu_blocks=300 // (1 if kind == "sglang" else 2))
        r = run(config, trace, rows, engine(kind, 2000), topology | {"num_decode_workers": 2}, 40)
    else:
        topology = {"kind": "aggregated", "num_workers": 2}
        r = run(config, trace, rows, engine(kind, 300), topology, trace_block_size=40)
    req = r.requests
    done = req.terminal_status == "completed"
    assert done.sum() > 12 and set(req.terminal_status) <= {"completed", "rejected"}
    if kind != "trtllm":
        assert req.n_preemptions.sum() > 0  # the pool is tight enough
    assert (req.n_readmissions[done] == req.n_preemptions[done]).all()
    assert (req.n_readmissions <= req.n_preemptions).all()
    assert (req.n_admissions == (2 if pd else 1) + req.n_readmissions).all()
    n = int(req.n_preemptions.sum())
    assert counts(r) == {
        "n_preemptions": n,
        "n_retractions": n if kind == "sglang" else 0,
        "n_readmissions": int(req.n_readmissions.sum()),
    }
    assert r.passes.preemptions.sum() == n


# --------------------------------------------------------------------------- the run directory


def test_the_run_directory_names_the_engine_and_each_pools_speculation(config, trace, tmp_path):
    """P/D with speculation on the decode pool only: the metadata of summary.json says so per
    pool, and the tables written keep their engine column."""
    spec = {"num_speculative_tokens": 2, "acceptance_rates": [1.0, 0.5], "seed": 7}
    r = run(config, trace, [A, B], engine("vllm", 1000), disagg(speculative=spec))
    out = r.write(tmp_path / "run")
    metadata = json.loads((out / "summary.json").read_text())["metadata"]
    assert metadata["engine"] == "vllm"
    assert metadata["speculative"] == {
        "prefill": None,
        "decode": {
            "num_speculative_tokens": 2,
            "acceptance_rates": [1.0, 0.5],
            "seed": 7,
            "mean_tokens_per_decode_step": 2.5,
        },
    }
    for name in ("requests", "passes"):
        table = pd.read_parquet(out / f"{name}.parquet")
        assert set(table.engine) == {"vllm"}
