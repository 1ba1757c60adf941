"""experiments/engines_figure.py: the same KV tokens for every engine, one quick run end to end
(a small trace: a PNG and a table row per engine), and, on the shared conversation trace, the
numbers docs/schedulers.md#three-engines-on-one-trace quotes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from conftest import shared_trace

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "engines_figure.py"
_spec = importlib.util.spec_from_file_location("engines_figure", SCRIPT)
assert _spec is not None and _spec.loader is not None
engines_figure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engines_figure)


def test_every_engine_gets_the_same_kv_tokens(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1]}) + "\n"
    )
    for engine in engines_figure.ENGINES:
        result = engines_figure.run_engine(engine, trace, 1, 65_536, [])
        metadata = result.summary["metadata"]
        assert metadata["num_gpu_blocks"] * metadata["config"]["engine"]["block_size"] == 65_536


def test_a_small_trace_end_to_end(tmp_path, capsys):
    rows = [
        {
            "timestamp": 40 * i,
            "input_length": 600 + 7 * i,
            "output_length": 30,
            "hash_ids": [1, 100 + i],
        }
        for i in range(40)
    ]
    trace = tmp_path / "small.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    png = tmp_path / "engines.png"
    args = ["--trace", str(trace), "--max-requests", "40", "--kv-tokens", "8192", "--out", str(png)]
    assert engines_figure.main(args) == 0
    assert png.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert [
        line.split("|")[1].strip()
        for line in out.splitlines()
        if re.match(r"\| (vllm|sglang|trtllm) ", line)
    ] == [
        "vllm",
        "sglang",
        "trtllm",
    ]


@pytest.mark.slow
def test_the_numbers_the_docs_quote():
    """docs/schedulers.md reads the figure: SGLang's TTFT p50 is the lowest (468 ms, vLLM 536,
    TRT-LLM 550) and its longest inter-token gap the longest (6.6 s), vLLM's longest comes
    from a preemption (1.4 s), TRT-LLM's stays about one mixed pass (203 ms, no preemption)."""
    trace = shared_trace("conversation_trace.jsonl")
    results = {
        e: engines_figure.run_engine(e, trace, 1500, 262_144, []) for e in engines_figure.ENGINES
    }
    table = engines_figure.table(results, dict.fromkeys(results, 0.0)).set_index("engine")
    assert table.ttft_p50_ms.round().to_dict() == {"vllm": 536, "sglang": 468, "trtllm": 550}
    assert table.itl_max_ms.round(-2).to_dict() == {"vllm": 1400, "sglang": 6600, "trtllm": 200}
    assert table.preemptions.trtllm == 0 and table.preemptions.vllm > 0
    assert table.mixed_passes.sglang == 0
