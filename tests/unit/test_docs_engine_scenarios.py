"""The engine scenarios of docs/schedulers.md (SGLang, speculative decoding) and the numbers of
docs/timing.md#speculative-decoding, checked against the code.

The page's scripts are run as written and must print the tables shown under them. Each
scenario is also composed and simulated here on its own, and the rules its prose tells are
asserted on the tables (who waits, who is preempted or retracted, where a first token comes
from), so a script that printed the wrong thing would not pass either.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from servesim import Result, compose, simulate
from servesim.metrics.plots import pass_kind
from servesim.timing import build_step_time

DOCS = Path(__file__).resolve().parents[2] / "docs"
# one worker, fixed timing: 10 ms for a pass with prefill, 2 ms more with decode
FIXED = ["topology.num_workers=1", "timing=fixed", "timing.prefill_ms=10", "timing.decode_ms=2"]


def section(doc: str, heading: str) -> str:
    start = doc.index(f"\n## {heading}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end >= 0 else len(doc)]


def scripts_and_outputs() -> list[tuple[str, str]]:
    """Each ```py block of the SGLang and speculative decoding sections, with the block shown
    under it, in page order (later scripts use `history` from the first)."""
    doc = (DOCS / "schedulers.md").read_text()
    pairs = []
    for heading in ("SGLang", "Speculative decoding (MTP)"):
        found = re.findall(r"```py\n(.*?)```\n\n```\n(.*?)```", section(doc, heading), re.S)
        assert found, f"no script and output in ## {heading}"
        pairs += found
    return pairs


def test_the_scripts_print_what_the_page_shows():
    namespace: dict[str, object] = {}
    pairs = scripts_and_outputs()
    assert len(pairs) == 3
    for code, shown in pairs:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/schedulers.md", "exec"), namespace)
        assert out.getvalue() == shown


# --------------------------------------------------------------------------- the same, here


def replay(tmp_path: Path, rows: list[dict], *overrides: str) -> Result:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = ["workload=mooncake", f"workload.path={trace}", "workload.trace_block_size=16"]
    return simulate(compose([*FIXED, *workload, "output.progress=off", *overrides]))


def row(t: int, n_in: int, n_out: int, ids: list[int]) -> dict:
    return {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def requests(result: Result) -> pd.DataFrame:
    """The requests table indexed A, B, C in trace order."""
    r = result.requests.assign(n=result.requests.request_id.astype(int)).sort_values("n")
    return r.set_index(pd.Index(list("ABC"[: len(r)])))


SCENARIO = [row(0, 60, 6, [1, 2, 3, 4]), row(1, 30, 6, [11, 12]), row(1, 30, 6, [21, 22])]


def test_sglang_makes_c_wait_where_vllm_admits_and_preempts_it(tmp_path):
    """The same 128 KV tokens: vLLM admits C with B in a mixed pass and preempts it at 26 ms;
    SGLang prefills B alone (A does not decode), keeps C waiting until A and B end at 30."""
    vllm = replay(
        tmp_path, SCENARIO, "engine=vllm", "engine.block_size=16", "engine.num_gpu_blocks=8"
    )
    sglang = replay(tmp_path, SCENARIO, "engine=sglang", "engine.num_gpu_blocks=128")
    v, s = requests(vllm), requests(sglang)
    assert v.first_admit_ms.tolist() == [0, 10, 10]
    assert v.n_preemptions.tolist() == [0, 0, 1]
    assert vllm.passes.start_ms[vllm.passes.preemptions > 0].tolist() == [26]
    assert v.terminal_ms.tolist() == [30, 42, 46]
    assert "mixed" not in set(pass_kind(sglang.passes))
    assert s.first_admit_ms.tolist() == [0, 10, 30]
    assert s.n_preemptions.tolist() == [0, 0, 0]
    assert s.first_token_ms.tolist() == [10, 20, 40]
    assert s.terminal_ms.tolist() == [30, 30, 50]
    # the prefill pass at 10 ms holds B's prompt and first token's page beside A's 61
    second = sglang.passes.iloc[1]
    assert (second.prefill_tokens, second.decode_seqs, second.kv_used_blocks) == (30, 0, 92)


def test_sglang_retracts_the_least_decoded_and_readmits_it_with_its_cache(tmp_path):
    rows = [row(0, 10, 12, [1]), row(11, 10, 12, [11])]
    result = replay(tmp_path, rows, "engine=sglang", "engine.num_gpu_blocks=42")
    r = requests(result)
    assert r.first_admit_ms.tolist() == [0, 12]
    assert r.n_preemptions.tolist() == [0, 1]
    assert result.passes.start_ms[result.passes.preemptions > 0].tolist() == [40]
    assert r.reused_input_tokens.B == 19  # 20 tokens known, the last one recomputed
    readmit = result.passes[result.passes.start_ms == 42].iloc[0]
    assert (readmit.prefill_tokens, readmit.decode_seqs) == (1, 0)
    assert r.terminal_ms.tolist() == [42, 54]


MTP = ["engine.speculative.num_speculative_tokens=2", "engine.speculative.acceptance_rates=[1,0]"]
MTP_ROWS = [row(0, 32, 7, [1, 2]), row(5, 32, 4, [11, 12])]


def test_vllm_and_trtllm_emit_a_first_burst_from_the_prefill_pass(tmp_path):
    """With speculation the pass that ends A's prefill has a decode part (10 + 2 ms) and A's
    first two tokens come at its end; TRT-LLM's passes are vLLM's here."""
    runs = {
        e: replay(
            tmp_path,
            MTP_ROWS,
            f"engine={e}",
            "engine.block_size=16",
            "engine.num_gpu_blocks=64",
            *MTP,
        )
        for e in ("vllm", "trtllm")
    }
    pd.testing.assert_frame_equal(
        runs["vllm"].passes.drop(columns=["role", "engine"]),
        runs["trtllm"].passes.drop(columns=["role", "engine"]),
    )
    first = runs["vllm"].passes.iloc[0]
    assert (first.end_ms, first.prefill_tokens, first.decode_seqs) == (12, 32, 1)
    r = requests(runs["vllm"])
    assert r.first_token_ms.tolist() == [12, 24]
    assert r.terminal_ms.tolist() == [28, 26]


def test_sglang_emits_one_token_from_the_prefill_pass_and_bursts_after(tmp_path):
    result = replay(
        tmp_path,
        MTP_ROWS,
        "engine=sglang",
        "engine.num_gpu_blocks=1024",
        "output.per_token=true",
        *MTP,
    )
    times = {k: v.tolist() for k, v in result.token_times.items()}
    assert times == {"1": [10, 22, 22, 24, 24, 26, 26], "2": [20, 22, 22, 24]}
    assert result.passes.end_ms.tolist() == [10, 20, 22, 24, 26]


# --------------------------------------------------------------------------- timing.md


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        # decode ms of (32 at 2,048), (256 at 512), (256 at 2,048): off, k = 1, k = 3
        ("roofline", [[11.20, 14.40, 33.63], [11.20, 15.18, 33.63], [11.20, 28.36, 33.63]]),
        (
            "calibrated_roofline",
            [[9.89, 19.92, 35.30], [9.89, 26.49, 41.88], [9.89, 39.64, 55.02]],
        ),
    ],
)
def test_the_verification_width_costs_what_timing_md_shows(timing, expected):
    got = []
    for k in (None, 1, 3):
        spec = [] if k is None else [f"engine.speculative.num_speculative_tokens={k}"]
        step = build_step_time(compose([f"timing={timing}", *spec]))
        got.append(
            [
                round(step.decode_ms(b, b * c, 0, c), 2)
                for b, c in ((32, 2048), (256, 512), (256, 2048))
            ]
        )
    assert got == expected
    doc = section((DOCS / "timing.md").read_text(), "Speculative decoding")
    column = 1 if timing == "roofline" else 2
    shown = []
    for line in doc.splitlines():
        if re.match(r"\| \d+ at ", line):
            cells = [c.strip() for c in line.strip("|").split("|")]
            shown.append([float(x) for x in cells[column].split(" / ")])
    assert [list(col) for col in zip(*shown, strict=True)] == expected


@pytest.mark.parametrize("timing", ["polynomial", "fixed"])
def test_polynomial_and_fixed_charge_a_plain_step(timing):
    plain = build_step_time(compose([f"timing={timing}"]))
    spec = build_step_time(
        compose([f"timing={timing}", "engine.speculative.num_speculative_tokens=3"])
    )
    for b, c in ((1, 100), (32, 2048), (256, 512)):
        assert spec.decode_ms(b, b * c, 411_520, c) == plain.decode_ms(b, b * c, 411_520, c)
