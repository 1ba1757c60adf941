"""experiments/rate_match.py: the P/D worker counts rate matching gives, by hand."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from conftest import make_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))
_spec = importlib.util.spec_from_file_location("rate_match", REPO / "experiments" / "rate_match.py")
assert _spec is not None and _spec.loader is not None
rate_match = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rate_match)


def pd_config(prefill_ms: float, decode_blocks: int = 100, dp: int = 1):
    return make_config(
        engine={"block_size": 16, "max_num_batched_tokens": 1000, "max_num_seqs": 256},
        timing={"kind": "fixed", "prefill_ms": prefill_ms, "decode_ms": 3.0},
        topology={
            "kind": "disagg",
            "num_prefill_workers": 1,
            "num_decode_workers": 1,
            "prefill": {"num_gpu_blocks": 1000},
            "decode": {"num_gpu_blocks": decode_blocks, "dp_size": dp},
        },
    )


def test_decode_workers_hold_the_clients_kv_and_prefill_keeps_up_with_them() -> None:
    """25 clients of 100 + 60 tokens; a decode rank holds 100 x 16 = 1,600 tokens, so 10 of
    them: 3 decode workers (batch 9). They complete 25 requests per 60 steps of 3 ms; a
    prefill pass of 10 prompts (the 1,000-token budget) takes `prefill_ms`."""
    cfg = pd_config(prefill_ms=70.0)
    demand = 25 / (60 * 3.0) * 100  # prompt tokens per ms the decode pool asks for
    supply = 10 * 100 / 70.0  # prompt tokens per ms a prefill worker gives
    assert math.ceil(demand / (0.9 * supply)) == 2
    assert rate_match.rate_matched_workers(cfg, 25, 100, 60) == (2, 3)
    # a fast prefill worker keeps up alone; a bigger decode pool holds every client
    assert rate_match.rate_matched_workers(pd_config(7.0, 1000), 25, 100, 60) == (1, 1)


def test_attention_dp_ranks_share_the_clients() -> None:
    """Two ranks per decode worker hold 20 of the clients: 2 workers for 25."""
    assert rate_match.rate_matched_workers(pd_config(7.0, dp=2), 25, 100, 60)[1] == 2


def test_only_a_disaggregated_config_is_sized() -> None:
    with pytest.raises(ValueError, match="topology=disagg"):
        rate_match.rate_matched_workers(make_config(), 25, 100, 60)
    with pytest.raises(ValueError, match="must be positive"):
        rate_match.rate_matched_workers(pd_config(7.0), 0, 100, 60)


def test_the_rule_against_rows_that_give_their_counts(capsys, tmp_path) -> None:
    """The command compares each P/D row that gives both counts with what the rule picks for
    it; a CSV with no such row exits 2."""
    tiny = REPO / "tests" / "data" / "accuracy" / "silicon_tiny.csv"
    df = rate_match.compare_counted(str(tiny))
    assert df.id.tolist() == ["tiny_8b_h100_bf16_disagg"]
    assert (df.prefill_given[0], df.decode_given[0]) == (1, 1)
    assert df.prefill_matched[0] >= 1 and df.decode_matched[0] >= 1
    assert rate_match.main(["--silicon", str(tiny)]) == 0
    assert "of 1 rows" in capsys.readouterr().out
    import pandas as pd

    agg_only = tmp_path / "agg.csv"
    rows = pd.read_csv(tiny)
    rows[rows["mode"] == "agg"].to_csv(agg_only, index=False)
    assert rate_match.main(["--silicon", str(agg_only)]) == 2
