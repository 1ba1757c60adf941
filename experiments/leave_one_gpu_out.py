"""Leave one GPU out: the calibrated roofline's accuracy on a GPU whose rows its factors never saw.

    python experiments/leave_one_gpu_out.py --silicon CSV [--backend vllm] [--mode agg]
        [--jobs N] [--factors JSON] --out RESULT.csv [--markdown TABLE.md]

The factors (model/timing/roofline_factors.json, or --factors) are fitted per GPU family and
weight dtype, each group on its own family's rows only (experiments/fit_roofline.py), so
fitting on one GPU's rows gives exactly that family's groups. For each family in the table,
this writes a factors file holding only that family's groups and runs experiments/accuracy.py's
points of every *other* system with it: there, as for any GPU servesim has no factors for, the
calibrated roofline falls back to the mean of the table's groups (its `source` says so). It
prints one row per (fitted on, tested on) with the rows, TTFT / TPOT MAPE and bias, and beside
them the same rows with the full table (in-sample), then
`held out: TTFT MAPE x% TPOT MAPE y% over N rows`.

The default selection (--backend vllm --mode agg, dense models) is the rows the factors are
fitted on, so the held-out number measures what the fit carries from one GPU to another.
Exit status: 0 when it ran, 2 on bad input (as experiments/accuracy.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/ is not a package
from accuracy import error_stats, markdown, run_points  # noqa: E402  (one way to run, report)
from accuracy_points import CONF_DIR, BadInput, plan, read_silicon, select  # noqa: E402

from servesim.config.schema import HardwareConfig  # noqa: E402
from servesim.timing.calibrated import FACTORS_PATH  # noqa: E402
from servesim.timing.calibrated import family_of as gpu_family  # noqa: E402

DENSE = ("llama3_8b", "llama3_70b", "qwen3_32b")  # the models the factors are fitted on


def family_of(hardware: str) -> str:
    """A conf/hardware option -> its GPU family (the key of the calibrated roofline's factors)."""
    conf = yaml.safe_load((CONF_DIR / "hardware" / f"{hardware}.yaml").read_text())
    return gpu_family(HardwareConfig(**conf))


def only_family(table: dict, family: str) -> dict:
    """The factors table with only `family`'s groups: what a fit on that family's rows gives."""
    groups = {k: v for k, v in table["groups"].items() if k.split("/")[0] == family}
    return {**table, "groups": groups, "fitted_on": f"{family} only (leave-one-GPU-out)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--silicon", required=True)
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--mode", default="agg")
    ap.add_argument("--all-models", action="store_true", help="not only the dense fitted models")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--factors", default=str(FACTORS_PATH))
    ap.add_argument("--out", required=True)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    try:
        chosen = select(read_silicon(args.silicon), args.backend, args.mode)
        table = json.loads(Path(args.factors).read_text())
    except (BadInput, OSError, ValueError) as e:
        print(f"leave_one_gpu_out: {e}", file=sys.stderr)
        return 2
    points, _ = plan(chosen)
    if not args.all_models:
        points = [p for p in points if p.llm in DENSE]
    families = sorted({k.split("/")[0] for k in table["groups"]})
    rows, frames = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            held_out = [p for p in points if family_of(p.hardware) != family]
            if not held_out:
                continue
            path = Path(tmp) / f"{family}.json"
            path.write_text(json.dumps(only_family(table, family)))
            for name, factors in (("held out", str(path)), ("in sample", args.factors)):
                over = [f"timing.factors_path={factors}"]
                res = pd.DataFrame(
                    run_points(held_out, "calibrated_roofline", over, jobs=args.jobs)
                )
                res["fitted_on"], res["factors"] = family, name
                frames.append(res)
                for system, g in res.groupby("system"):
                    rows.append(
                        {
                            "fitted_on": family,
                            "tested_on": system,
                            "factors": name,
                            **error_stats(g),
                        }
                    )
    if not frames:
        print("leave_one_gpu_out: no row of another GPU family to test on", file=sys.stderr)
        return 2
    results = pd.concat(frames, ignore_index=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out, index=False)
    text = markdown(pd.DataFrame(rows))
    held = error_stats(results[results["factors"] == "held out"])
    line = (
        f"held out: TTFT MAPE {held['ttft_mape_pct']:.1f}% TPOT MAPE {held['tpot_mape_pct']:.1f}% "
        f"over {held['rows']} rows"
    )
    if args.markdown:
        Path(args.markdown).write_text(f"{text}\n\n{line}\n")
    print(f"{text}\n\n{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
