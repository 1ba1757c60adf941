"""experiments/accuracy.py on a hand-written silicon CSV (tests/data/accuracy/silicon_tiny.csv):
which rows run and why the others do not, the load each run reproduces (the composed
RunConfig), the MAPE arithmetic and the last line, and bad input exiting with status 2."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "accuracy.py"
TINY = REPO / "tests" / "data" / "accuracy" / "silicon_tiny.csv"
_spec = importlib.util.spec_from_file_location("accuracy", SCRIPT)
assert _spec is not None and _spec.loader is not None
accuracy = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = accuracy  # dataclasses, and the process pool's pickles, look it up
_spec.loader.exec_module(accuracy)

RUNNABLE = [
    "tiny_32b_h100_int4_c2_tp1",
    "tiny_70b_h100_fp8_c2_tp1",
    "tiny_8b_h100_bf16_c2_dp2",
    "tiny_8b_h100_bf16_c2_tp1",
    "tiny_8b_h100_bf16_disagg",
    "tiny_8b_h100_fp8_c4_tp2",
    "tiny_dsr1_b200_fp8_c2_tp8",
]
SKIPPED = {
    "tiny_32b_h100_int2_c2_tp1": "precision",
    "tiny_8b_a100_bf16_c2_tp1": "system",
    "tiny_8b_h100_bf16_c2_no_tpot": "incomplete row",
    "tiny_8b_h100_bf16_c2_pp2": "pp_size > 1",
    "tiny_mistral_h100_bf16_c2_tp1": "model",
}


def tiny_points() -> dict[str, object]:
    points, _ = accuracy.plan(accuracy.select(accuracy.read_silicon(TINY), "vllm", None))
    return {p.id: p for p in points}


def test_rows_map_to_points_or_skip_reasons() -> None:
    """vLLM rows: six agg rows and a disagg row run (sorted by id; MoE and INT4 ones among
    them), each other row is skipped for the first reason that applies; the sglang row is not
    selected at all."""
    df = accuracy.read_silicon(TINY)
    chosen = accuracy.select(df, "vllm", None)
    assert len(df) == 13 and len(chosen) == 12
    points, skips = accuracy.plan(chosen)
    assert [p.id for p in points] == RUNNABLE
    assert {s.id: s.reason for s in skips} == SKIPPED
    assert [s.id for s in skips] == sorted(SKIPPED)
    assert accuracy.skip_summary(skips) == (
        "model 1, system 1, precision 1, pp_size > 1 1, incomplete row 1"
    )
    p = {p.id: p for p in points}
    bf16 = p["tiny_8b_h100_bf16_c2_tp1"]
    assert (bf16.llm, bf16.hardware, bf16.precision, bf16.dtype) == (
        "llama3_8b",
        "h100_sxm",
        "bf16",
        "bfloat16",
    )
    assert (bf16.tp, bf16.batch_size, bf16.isl, bf16.osl) == (1, 2, 128, 16)
    assert (bf16.measured_ttft_ms, bf16.measured_tpot_ms) == (20.0, 5.0)
    fp8 = p["tiny_8b_h100_fp8_c4_tp2"]  # the Instruct checkpoint has the base geometry
    assert (fp8.llm, fp8.dtype, fp8.tp, fp8.batch_size) == ("llama3_8b", "fp8", 2, 4)
    assert accuracy.map_row({**chosen.iloc[0].to_dict(), "system": "b200_sxm"}).hardware == "b200"


def test_composed_config_reproduces_the_measured_load() -> None:
    """Closed loop at batch_size, 10 x batch_size one-turn requests with lengths uniform over
    80-100 % of nominal, no sharing, prefix caching off, the row's TP and dtype, KV in bfloat16,
    an HBM-sized pool, one worker, roofline timing; an override wins."""
    point = tiny_points()["tiny_8b_h100_fp8_c4_tp2"]
    cfg = accuracy.compose_point_config(point)
    assert cfg.load.kind == "concurrency" and cfg.load.concurrency == 4
    w = cfg.workload
    assert (w.kind, w.num_sessions, w.turns_per_session) == ("synthetic", 40, 1)
    assert w.input_tokens.model_dump() == {
        "dist": "uniform",
        "mean": pytest.approx(115.2),
        "std": 0.0,
        "min": 102,
        "max": 128,
    }
    assert (w.output_tokens.dist, w.output_tokens.min, w.output_tokens.max) == ("uniform", 13, 16)
    assert (w.shared_prefix_ratio, w.num_prefix_groups) == (0.0, 0)
    e = cfg.engine
    assert e.enable_prefix_caching is False
    assert (e.tp_size, e.max_num_batched_tokens, e.max_num_seqs) == (2, 8192, 256)
    assert e.num_gpu_blocks is None
    assert (cfg.llm.name, cfg.llm.dtype, cfg.llm.kv_dtype) == ("llama3_8b", "fp8", "bfloat16")
    assert cfg.hardware.name == "h100_sxm"
    assert cfg.timing.kind == "roofline"
    assert cfg.topology.kind == "aggregated" and cfg.topology.num_workers == 1
    assert cfg.router.kind == "round_robin"
    assert cfg.output.tables is False and cfg.output.progress == "off"
    assert cfg.seed == 0
    big = dataclasses.replace(point, batch_size=300)
    assert accuracy.compose_point_config(big).engine.max_num_seqs == 300
    over = accuracy.compose_point_config(point, "fixed", ["engine.max_num_batched_tokens=4096"])
    assert over.timing.kind == "fixed" and over.engine.max_num_batched_tokens == 4096


def test_disagg_rows_run_their_pd_pools_over_infiniband() -> None:
    """A disagg row runs topology=disagg with its roles' workers, TP and DP; its clients are the
    source's silicon_concurrency, else the decode batch x decode ranks; a worker count the
    row lacks is sized by rate matching before the run, said in the result's note."""
    point = tiny_points()["tiny_8b_h100_bf16_disagg"]
    assert (point.prefill, point.decode) == (accuracy.Pool(1, 1, 1), accuracy.Pool(1, 1, 1))
    assert point.concurrency == 2 and point.assumption == ""
    cfg = accuracy.compose_point_config(point)
    t = cfg.topology
    assert (t.kind, t.num_prefill_workers, t.num_decode_workers) == ("disagg", 1, 1)
    assert (cfg.link.bandwidth_gbps, cfg.load.concurrency) == (50.0, 2)
    df = accuracy.read_silicon(TINY)
    row = df[df["id"] == "tiny_8b_h100_bf16_disagg"].iloc[0].to_dict()
    row.update(
        silicon_data_source="x; silicon_concurrency=12; y",
        prefill_num_workers=None,
        prefill_tp_size=2,
        decode_num_workers=3,
        decode_tp_size=4,
        decode_attention_dp_size=2,
    )
    wide = accuracy.map_row(row)
    assert (wide.prefill, wide.decode) == (accuracy.Pool(None, 2, 1), accuracy.Pool(3, 4, 2))
    assert (wide.concurrency, wide.batch_size, wide.tp, wide.dp) == (12, 2, 4, 2)
    sized = accuracy.size_pools(wide)
    assert sized.decode == wide.decode and sized.prefill.workers >= 1
    assert sized.assumption == (
        f"not in the row, rate-matched: prefill_num_workers {sized.prefill.workers}"
    )
    assert accuracy.size_pools(sized) is sized  # a point with both counts is as it is
    cfg = accuracy.compose_point_config(sized)
    assert cfg.link.bandwidth_gbps == 100.0  # 2 NICs: the prefill worker's 2 GPUs
    assert (cfg.topology.decode.tp_size, cfg.topology.decode.dp_size) == (4, 2)
    result = accuracy.run_point(point)
    assert result["status"] == "ok" and result["completed_requests"] == 20
    result = accuracy.run_point(wide)  # sized, then run: the counts and the note in its row
    assert result["status"] == "ok" and result["note"] == sized.assumption
    assert (result["prefill_workers"], result["decode_workers"]) == (sized.prefill.workers, 3)


def test_attention_dp_rows_run_dp_ranks_with_batch_size_per_rank() -> None:
    """attention_dp_size 2 runs two ranks per worker, batch_size requests in flight on each."""
    point = tiny_points()["tiny_8b_h100_bf16_c2_dp2"]
    assert (point.tp, point.dp, point.batch_size) == (1, 2, 2)
    cfg = accuracy.compose_point_config(point)
    assert (cfg.engine.tp_size, cfg.engine.dp_size) == (1, 2)
    assert cfg.load.concurrency == 4 and cfg.workload.num_sessions == 40
    assert cfg.engine.max_num_seqs == 256  # per rank
    assert (
        accuracy.compose_point_config(tiny_points()["tiny_8b_h100_bf16_c2_tp1"]).engine.dp_size == 1
    )


def test_a_run_is_compared_and_a_failing_run_recorded() -> None:
    """The 8B row runs to completion and its errors are predicted / measured - 1; 70B fp8 on one
    H100 leaves no HBM for KV, so that run fails with its ConfigError in `note`."""
    points = tiny_points()
    ok = accuracy.run_point(points["tiny_8b_h100_bf16_c2_tp1"])
    assert ok["status"] == "ok" and ok["note"] == ""
    assert ok["num_requests"] == ok["completed_requests"] == 20
    assert ok["predicted_ttft_ms"] > 0 and ok["predicted_tpot_ms"] > 0
    assert ok["ttft_rel_error"] == pytest.approx(ok["predicted_ttft_ms"] / 20.0 - 1)
    assert ok["tpot_rel_error"] == pytest.approx(ok["predicted_tpot_ms"] / 5.0 - 1)
    assert ok["num_gpu_blocks"] > 0 and ok["wall_s"] > 0
    bad = accuracy.run_point(points["tiny_70b_h100_fp8_c2_tp1"])
    assert bad["status"] == "failed"
    assert bad["note"].startswith("ConfigError: engine.num_gpu_blocks: llama3_70b")
    assert "leaves no room for KV" in bad["note"]
    assert "predicted_ttft_ms" not in bad


def hand_results() -> pd.DataFrame:
    rows = [
        # id, status, system, model, ttft_rel_error, tpot_rel_error
        ("a", "ok", "h100_sxm", "m1", 0.10, -0.20),
        ("b", "ok", "h100_sxm", "m1", -0.30, 0.00),
        ("c", "ok", "b200_sxm", "m1", 0.50, 0.05),
        ("d", "failed", "b200_sxm", "m1", math.nan, math.nan),
        ("e", "skipped", "b200_sxm", "m2", math.nan, math.nan),
    ]
    return accuracy.result_frame(
        {
            "id": i,
            "status": st,
            "system": sy,
            "backend": "vllm",
            "model": m,
            "mode": "agg",
            "ttft_rel_error": t,
            "tpot_rel_error": p,
        }
        for i, st, sy, m, t, p in rows
    )


def test_mape_arithmetic_on_a_hand_made_result() -> None:
    """MAPE = mean |rel_error| x 100 and bias = mean rel_error x 100 over `ok` rows; failed runs
    are counted apart, skipped rows not at all; the overall row pools every ok row."""
    table = accuracy.accuracy_table(hand_results())
    assert list(table["system"]) == ["b200_sxm", "h100_sxm", "all"]
    b200, h100, overall = (table.iloc[i].to_dict() for i in range(3))
    assert (b200["rows"], b200["failed"]) == (1, 1)
    assert b200["ttft_mape_pct"] == pytest.approx(50.0)
    assert b200["tpot_mape_pct"] == pytest.approx(5.0)
    assert (h100["rows"], h100["failed"]) == (2, 0)
    assert h100["ttft_mape_pct"] == pytest.approx(20.0)
    assert h100["ttft_bias_pct"] == pytest.approx(-10.0)
    assert h100["tpot_mape_pct"] == pytest.approx(10.0)
    assert (overall["rows"], overall["failed"]) == (3, 1)
    assert overall["ttft_mape_pct"] == pytest.approx(30.0)
    assert overall["tpot_mape_pct"] == pytest.approx(25 / 3)
    assert overall["tpot_bias_pct"] == pytest.approx(-5.0)
    line = accuracy.last_line(table, hand_results())
    assert line == "TTFT MAPE 30.0% TPOT MAPE 8.3% over 3 rows (2 skipped)"


def test_main_end_to_end_in_parallel_matches_serial(tmp_path: Path, capsys) -> None:
    """The CLI on the tiny CSV: one result row per selected row, sorted by id, skipped and failed
    rows said so; two jobs give the same predictions as one; the last line's format."""
    outs = {}
    for jobs in (1, 2):
        out = tmp_path / f"r{jobs}.csv"
        md = tmp_path / f"r{jobs}.md"
        argv = ["--silicon", str(TINY), "--backend", "vllm", "--jobs", str(jobs)]
        assert accuracy.main([*argv, "--out", str(out), "--markdown", str(md)]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert re.fullmatch(
            r"TTFT MAPE \d+\.\d% TPOT MAPE \d+\.\d% over 6 rows \(6 skipped\)", lines[-1]
        )
        assert md.read_text().strip().splitlines()[-1] == lines[-1]
        outs[jobs] = pd.read_csv(out)
    df = outs[1]
    assert list(df["id"]) == sorted(RUNNABLE + list(SKIPPED))
    status = dict(zip(df["id"], df["status"], strict=True))
    assert [i for i in RUNNABLE if status[i] != "ok"] == ["tiny_70b_h100_fp8_c2_tp1"]
    assert status["tiny_70b_h100_fp8_c2_tp1"] == "failed"
    assert all(status[i] == "skipped" for i in SKIPPED)
    note = dict(zip(df["id"], df["note"], strict=True))
    assert note["tiny_mistral_h100_bf16_c2_tp1"].startswith("model: unsupported model")
    same = ["id", "status", "predicted_ttft_ms", "predicted_tpot_ms", "completed_requests"]
    pd.testing.assert_frame_equal(outs[1][same], outs[2][same])


def test_bad_csv_exits_2_naming_the_file_and_column(tmp_path: Path, capsys) -> None:
    """A CSV without silicon_tpot_ms, a missing file and a filter that selects nothing: exit 2
    with a message that names the file and what was expected."""
    bad = tmp_path / "bad.csv"
    pd.read_csv(TINY).drop(columns=["silicon_tpot_ms"]).to_csv(bad, index=False)
    out = str(tmp_path / "r.csv")
    assert accuracy.main(["--silicon", str(bad), "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"--silicon {bad}: missing column(s) silicon_tpot_ms" in err
    missing = tmp_path / "nope.csv"
    assert accuracy.main(["--silicon", str(missing), "--out", out]) == 2
    assert f"--silicon {missing}: cannot read it as CSV" in capsys.readouterr().err
    assert accuracy.main(["--silicon", str(TINY), "--backend", "vlm", "--out", out]) == 2
    assert "no row has backend=vlm" in capsys.readouterr().err
    assert accuracy.main(["--silicon", str(TINY), "--override", "engine.nope=1", "--out", out]) == 2
    assert "does not compose" in capsys.readouterr().err
    assert not Path(out).exists()


def test_each_backend_runs_its_own_engine() -> None:
    """An SGLang row runs engine=sglang (its 1-token pages) with every request exactly the
    nominal lengths (its rows move in waves), a vLLM row engine=vllm; a MoE row composes its
    geometry (DeepSeek-R1: MLA, 8-way TP on B200)."""
    df = accuracy.read_silicon(TINY)
    (sglang,), _ = accuracy.plan(accuracy.select(df, "sglang", "agg"))
    cfg = accuracy.compose_point_config(sglang)
    assert (cfg.engine.kind, cfg.engine.block_size) == ("sglang", 1)
    w = cfg.workload
    assert (w.input_tokens.min, w.input_tokens.max, w.input_tokens.mean) == (128, 128, 128)
    assert (w.output_tokens.min, w.output_tokens.max, w.output_tokens.mean) == (16, 16, 16)
    moe = tiny_points()["tiny_dsr1_b200_fp8_c2_tp8"]
    cfg = accuracy.compose_point_config(moe)
    assert (cfg.engine.kind, cfg.llm.name, cfg.llm.attention, cfg.engine.tp_size) == (
        "vllm",
        "deepseek_v3",
        "mla",
        8,
    )
