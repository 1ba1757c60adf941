"""experiments/leave_one_gpu_out.py on the hand-written silicon CSV: each GPU family's factors
alone price the other family's rows (the fallback a GPU without factors gets), beside the full
table's in-sample prices of the same rows."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "leave_one_gpu_out.py"
TINY = REPO / "tests" / "data" / "accuracy" / "silicon_tiny.csv"
FACTORS = REPO / "model" / "timing" / "roofline_factors.json"
_spec = importlib.util.spec_from_file_location("leave_one_gpu_out", SCRIPT)
assert _spec is not None and _spec.loader is not None
logo = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = logo
_spec.loader.exec_module(logo)


def test_a_family_alone_is_what_a_fit_on_its_rows_gives() -> None:
    table = json.loads(FACTORS.read_text())
    hopper = logo.only_family(table, "hopper")
    assert set(hopper["groups"]) == {k for k in table["groups"] if k.startswith("hopper/")}
    assert hopper["groups"]["hopper/bf16"] == table["groups"]["hopper/bf16"]
    assert (logo.family_of("h100_sxm"), logo.family_of("b200")) == ("hopper", "blackwell")


def test_each_family_prices_the_other_gpus_rows(tmp_path: Path, capsys) -> None:
    out = tmp_path / "logo.csv"
    argv = ["--silicon", str(TINY), "--all-models", "--jobs", "1", "--out", str(out)]
    assert logo.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"held out: TTFT MAPE \d+\.\d% TPOT MAPE \d+\.\d% over \d+ rows", lines[-1])
    df = pd.read_csv(out)
    ok = df[df["status"] == "ok"]
    # blackwell's factors price the H100 rows, hopper's the B200 row; never a GPU's own
    tested = ok.groupby("fitted_on")["system"].unique().map(set).to_dict()
    assert tested == {"blackwell": {"h100_sxm"}, "hopper": {"b200_sxm"}}
    pair = ok.pivot_table(index=["id", "fitted_on"], columns="factors", values="predicted_ttft_ms")
    assert (pair["held out"] != pair["in sample"]).all()  # other factors, other predictions
