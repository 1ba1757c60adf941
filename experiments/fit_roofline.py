"""Fit the calibrated roofline's efficiency factors on measured serving benchmarks.

    python experiments/fit_roofline.py --silicon ../shared/data/silicon_dev.csv \\
        [--backend vllm] [--mode agg] [--out model/timing/roofline_factors.json]

For every (GPU family, weight dtype) group of the dense models' rows servesim can describe (the
same model, system and precision maps as experiments/accuracy.py; mixture-of-experts rows are
left out, so the expert terms are checked on them, not fitted), it chooses the nine factors of
`servesim.timing.calibrated` (e_c, e_m, e_a, e_ar, o_p, o_d, o_seq, a_ar, o_req) that minimise
the mean absolute log error of TTFT plus that of TPOT, by coordinate descent over bounded log grids.
Running the full simulator inside the search would take hours, so it scores each row with a
closed-loop
steady-state estimate built from the same step-time model (below); `experiments/accuracy.py`
then measures the fitted factors with the simulator itself. For a row of concurrency B, mean
lengths i = 0.9 isl and o = 0.9 osl (uniform 80-100 %), context c = i + o / 2:

    decode pass      t_d = decode(B, c);  a pass with k = max(1, round(B / o)) prefills:
                     t_m = mixed(k prefills of i, B - k decodes at c)
    mean pass        t = (1 - B / o) t_d + (B / o) t_m   (t_m when B / o >= 1)
    TPOT             t                      (one new request every o / B passes)
    TTFT, steady     t / 2 + mixed(1 prefill of i, B - 1 decodes)
    TTFT, first wave (N + 1) / 2 x prefill(k, i)   for N = ceil(B i / 8192) chunks of k requests
    TTFT             0.9 steady + 0.1 first wave + o_req  (B of the 10 B requests start
                     together; o_req the frontend latency)

With `--refine` the attention and GEMM efficiencies and the frontend latency (`e_a`, `e_c`,
`o_req`) of each group are then
re-chosen on small grids around the estimate's values by running the simulator itself on the
group's rows (`refine_group`, a few minutes), since the estimate misses how often prefills
enter decode passes when outputs are short.

Rows whose requests cannot all hold their KV at once (`kv_bound`) are left out of the search:
they queue for KV, which the estimate does not model (the simulator does). The output is the
factors table with, per group, its rows and the estimate's own MAPE on the fitted rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/ is not a package
from accuracy import run_points  # noqa: E402  (one way to run a point)
from accuracy_points import (  # noqa: E402  (one set of maps)
    MODELS,
    PRECISIONS,
    SYSTEMS,
    Point,
    compose_point_config,
    kv_dtype_for,
    map_row,
    plan,
    read_silicon,
)

from servesim.config.derived import kv_bytes_per_token, moe_layers, weight_bytes
from servesim.config.schema import HardwareConfig, LlmConfig
from servesim.timing.calibrated import (
    FACTOR_KEYS,
    FACTORS_PATH,
    MOE_FACTOR,
    CalibratedRoofline,
    family_of,
    lookup,
    weight_class,
)

REPO = Path(__file__).resolve().parents[1]
DENSE = [
    path
    for path, name in MODELS.items()
    if "num_experts" not in yaml.safe_load((REPO / "conf" / "llm" / f"{name}.yaml").read_text())
]
BUDGET = 8192  # max_num_batched_tokens of the measured runs
# bounds of each factor (log-uniform grids between them)
BOUNDS = {
    "e_c": (0.05, 1.0),
    "e_m": (0.2, 1.0),
    "e_a": (0.02, 1.0),
    "e_ar": (0.05, 1.0),
    "o_p": (0.05, 60.0),
    "o_d": (5e-4, 0.4),  # per layer
    "o_seq": (1e-4, 0.5),
    "a_ar": (1e-4, 0.2),
    "o_req": (0.1, 200.0),
}
START = {
    "e_c": 0.5,
    "e_m": 0.7,
    "e_a": 0.3,
    "e_ar": 1.0,
    "o_p": 5.0,
    "o_d": 0.03,
    "o_seq": 0.01,
    "a_ar": 0.01,
    "o_req": 10.0,
}


def _conf(group: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "conf" / group / f"{name}.yaml").read_text())
    return data


def rows(csv: Path, backend: str, mode: str) -> pd.DataFrame:
    """The rows the fit uses: the backend's and mode's rows of dense models servesim
    describes (mixture-of-experts rows are left to their geometry: nothing is fitted on them,
    so they check the expert terms), without pipeline or attention-DP parallelism."""
    df = pd.read_csv(csv)
    df = df[(df["backend"] == backend) & (df["mode"] == mode)]
    df = df[df["model_path"].isin(DENSE) & df["system"].isin(SYSTEMS)]
    df = df[df["precision"].fillna("").isin(PRECISIONS)]
    df = df[(df["pp_size"].fillna(1) == 1) & (df["attention_dp_size"].fillna(1) == 1)]
    return df.reset_index(drop=True)


def model_for(row: Any) -> tuple[LlmConfig, HardwareConfig]:
    llm = _conf("llm", MODELS[row.model_path])
    llm["dtype"] = PRECISIONS[row.precision if isinstance(row.precision, str) else ""]
    llm["kv_dtype"] = kv_dtype_for(row.system)
    return LlmConfig(**llm), HardwareConfig(**_conf("hardware", SYSTEMS[row.system]))


def estimate(m: CalibratedRoofline, b: int, isl: int, osl: int) -> tuple[float, float]:
    """Closed-loop steady-state TTFT and TPOT (ms) of the module docstring."""
    i, o = max(1, round(0.9 * isl)), max(1.0, 0.9 * osl)
    ctx = round(i + o / 2)
    t_d = m.decode_ms(b, 0, 0, ctx)
    rate = b / o  # new requests (prefills) per decode pass
    k = max(1, round(rate))
    t_mix = m.mixed_ms(k, i, 0, max(1, b - k), ctx)
    mean_pass = (1 - rate) * t_d + rate * t_mix if rate < 1 else t_mix
    steady = mean_pass / 2 + m.mixed_ms(1, i, 0, max(1, b - 1), ctx)
    first_k = max(1, min(b, BUDGET // i))
    chunks = math.ceil(b * i / BUDGET)
    first = (chunks + 1) / 2 * m.prefill_ms(first_k, min(i, BUDGET), 0)
    return 0.9 * steady + 0.1 * first + m.f.get("o_req", 0.0), mean_pass


def score(models: list[tuple[CalibratedRoofline, Any]], f: dict[str, float]) -> float:
    err = 0.0
    for m, row in models:
        m.set_factors(f)
        ttft, tpot = estimate(m, int(row.batch_size), int(row.isl), int(row.osl))
        err += abs(math.log(ttft / row.silicon_ttft_ms)) + abs(math.log(tpot / row.silicon_tpot_ms))
    return err / len(models)


def kv_bound(row: Any) -> bool:
    """Whether the row's B requests cannot all hold their KV at once (HBM x 0.9 - weights - 2 GB
    per GPU, as servesim derives the pool): such points queue for KV, which only the simulator
    models, so the fit leaves them out (accuracy.py still scores them)."""
    llm, hw = model_for(row)
    tp = int(row.tp_size)
    room = hw.hbm_gb * 1e9 * 0.9 * tp - weight_bytes(llm) - 2e9 * tp
    return row.batch_size * (row.isl + row.osl) * kv_bytes_per_token(llm) > room


def fitted_models(
    group: pd.DataFrame, factors: dict[str, float]
) -> list[tuple[CalibratedRoofline, Any]]:
    """The group's rows the fit uses (not KV-bound), each with its step-time model."""
    models = []
    for row in group.itertuples():
        if not kv_bound(row):
            llm, hw = model_for(row)
            models.append((CalibratedRoofline(llm, hw, int(row.tp_size), factors=factors), row))
    return models


def fit_group(group: pd.DataFrame, sweeps: int = 8, points: int = 41) -> dict[str, float]:
    models = fitted_models(group, START)
    f = dict(START)
    best = score(models, f)
    for _ in range(sweeps):
        for key in FACTOR_KEYS:
            lo, hi = BOUNDS[key]
            for v in np.geomspace(lo, hi, points):
                trial = {**f, key: float(v)}
                s = score(models, trial)
                if s < best:
                    best, f = s, trial
    return f


def mape(models: list[tuple[CalibratedRoofline, Any]]) -> tuple[float, float]:
    ttft, tpot = [], []
    for m, row in models:
        a, b = estimate(m, int(row.batch_size), int(row.isl), int(row.osl))
        ttft.append(abs(a / row.silicon_ttft_ms - 1))
        tpot.append(abs(b / row.silicon_tpot_ms - 1))
    return 100 * float(np.mean(ttft)), 100 * float(np.mean(tpot))


# the simulator-checked refinement: these factors, on these grids (x the estimate's value)
REFINE_GRID = {"e_a": (0.5, 1.0, 2.5), "e_c": (0.8, 1.0, 1.25), "o_req": (0.5, 1.0, 1.5)}


def refine_group(
    group: pd.DataFrame, table: dict[str, Any], key: str, out: Path, jobs: int
) -> tuple[float, float]:
    """Re-choose REFINE_GRID's factors of group `key` by running the simulator itself on the
    group's rows (experiments/accuracy.py's points), one factor at a time, keeping the value
    with the lowest TTFT + TPOT MAPE. Writes `out` after each trial; returns the final MAPEs."""
    points, _ = plan(group.drop(columns=["group"]))
    factors = table["groups"][key]["factors"]

    def measure(trial: dict[str, float]) -> tuple[float, float]:
        table["groups"][key]["factors"] = trial
        out.write_text(json.dumps(table, indent=1) + "\n")
        recs = [
            r
            for r in run_points(
                points, "calibrated_roofline", [f"timing.factors_path={out}"], jobs=jobs
            )
            if r["status"] == "ok"
        ]
        ttft = 100 * float(np.mean([abs(r["ttft_rel_error"]) for r in recs]))
        tpot = 100 * float(np.mean([abs(r["tpot_rel_error"]) for r in recs]))
        return ttft, tpot

    best = dict(factors)
    best_err = measure(best)
    for name, scales in REFINE_GRID.items():
        base = best[name]
        for scale in scales:
            if scale == 1.0:
                continue
            lo, hi = BOUNDS[name]
            trial = {**best, name: min(hi, max(lo, base * scale))}
            err = measure(trial)
            print(f"  {key} {name}={trial[name]:.4f}: TTFT {err[0]:.1f}% TPOT {err[1]:.1f}%")
            if sum(err) < sum(best_err):
                best, best_err = trial, err
    table["groups"][key]["factors"] = {k: round(v, 6) for k, v in best.items()}
    table["groups"][key]["simulator_mape_ttft_pct"] = round(best_err[0], 2)
    table["groups"][key]["simulator_mape_tpot_pct"] = round(best_err[1], 2)
    out.write_text(json.dumps(table, indent=1) + "\n")
    return best_err


MOE_MAX_CLIENTS = 4  # requests in flight per rank on the rows o_moe is fitted on


def fit_moe(csv: Path, table: dict[str, Any]) -> dict[str, list[float]]:
    """Choose `o_moe` (ms per MoE layer of a pass) of each group: on the aggregated rows of the
    mixture-of-experts models (every backend, no attention DP) at most MOE_MAX_CLIENTS
    requests in flight, where a decode step is mostly fixed cost, the median over the rows of
    (measured TPOT - the estimate's TPOT without it) / the model's MoE layers, at least 0.
    Rows go to the group whose factors they use (`lookup`: a dtype the table lacks uses the
    family's other one). Sets the factor in `table`; returns each group's per-row values."""
    gaps: dict[str, list[float]] = {}
    df = read_silicon(csv)
    for _, row in df[df["mode"] == "agg"].iterrows():
        point = map_row(row)
        if not isinstance(point, Point) or point.dp > 1 or point.batch_size > MOE_MAX_CLIENTS:
            continue
        cfg = compose_point_config(point, "calibrated_roofline")
        layers = moe_layers(cfg.llm)
        if not layers:
            continue
        hw = cfg.hardware
        factors, source = lookup(table, family_of(hw), weight_class(cfg.llm, hw))
        key = source.split(" ")[0]
        if key not in table["groups"]:
            continue  # no group of this family: the mean of the others, nothing to fit
        m = CalibratedRoofline(cfg.llm, hw, point.tp, factors={**factors, MOE_FACTOR: 0.0})
        _, tpot = estimate(m, point.batch_size, point.isl, point.osl)
        gaps.setdefault(key, []).append((point.measured_tpot_ms - tpot) / layers)
    for key, values in gaps.items():
        group = table["groups"][key]
        group["factors"][MOE_FACTOR] = round(max(0.0, float(np.median(values))), 6)
        group["moe_rows"] = len(values)
    return gaps


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--silicon", type=Path, required=True)
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--mode", default="agg")
    ap.add_argument("--out", type=Path, default=FACTORS_PATH)
    ap.add_argument(
        "--refine",
        action="store_true",
        help="then re-choose e_a, e_c and o_req per group with the simulator itself (minutes)",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--moe-only",
        action="store_true",
        help="keep the table at --out and only re-choose its o_moe (seconds)",
    )
    args = ap.parse_args(argv)
    if not args.silicon.is_file():
        print(f"fit_roofline: {args.silicon} does not exist", file=sys.stderr)
        return 2
    if args.moe_only:
        table = json.loads(args.out.read_text())
        _fit_moe_and_write(args.silicon, table, args.out)
        return 0
    df = rows(args.silicon, args.backend, args.mode)
    df["group"] = [f"{family_of(model_for(r)[1])}/{_dtype_class(r)}" for r in df.itertuples()]
    groups: dict[str, Any] = {}
    for key, group in sorted(df.groupby("group")):
        f = fit_group(group)
        models = fitted_models(group, f)
        e_ttft, e_tpot = mape(models)
        groups[str(key)] = {
            "factors": {k: round(v, 6) for k, v in f.items()},
            "rows": int(len(group)),
            "rows_fitted": len(models),  # the others queue for KV (see kv_bound)
            "models": sorted(group["model_path"].unique().tolist()),
            "systems": sorted(group["system"].unique().tolist()),
            "estimate_mape_ttft_pct": round(e_ttft, 2),
            "estimate_mape_tpot_pct": round(e_tpot, 2),
        }
        print(f"{key}: {len(group)} rows, estimate MAPE TTFT {e_ttft:.1f}% TPOT {e_tpot:.1f}%, {f}")
    table = {
        "fitted_on": {
            "file": args.silicon.name,
            "sha256": hashlib.sha256(args.silicon.read_bytes()).hexdigest(),
            "backend": args.backend,
            "mode": args.mode,
            "command": "python experiments/fit_roofline.py " + " ".join(argv or sys.argv[1:]),
        },
        "groups": groups,
    }
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    if args.refine:
        for key, group in sorted(df.groupby("group")):
            ttft, tpot = refine_group(group, table, str(key), args.out, args.jobs)
            print(f"{key}: simulator MAPE TTFT {ttft:.1f}% TPOT {tpot:.1f}% after refinement")
    _fit_moe_and_write(args.silicon, table, args.out)
    return 0


def _fit_moe_and_write(csv: Path, table: dict[str, Any], out: Path) -> None:
    table["fitted_on"]["o_moe"] = (
        f"fit_moe: aggregated MoE rows of every backend of {csv.name}, at most "
        f"{MOE_MAX_CLIENTS} clients per rank, no attention DP"
    )
    for key, values in sorted(fit_moe(csv, table).items()):
        q25, q50, q75 = np.percentile(values, [25, 50, 75]) * 1000
        print(
            f"{key}: o_moe {table['groups'][key]['factors'][MOE_FACTOR] * 1000:.1f} us per MoE "
            f"layer from {len(values)} rows (quartiles {q25:.1f} / {q50:.1f} / {q75:.1f} us)"
        )
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {out}")


def _dtype_class(row: Any) -> str:
    p = row.precision if isinstance(row.precision, str) else ""
    return {"fp8": "fp8", "fp4": "fp4"}.get(p, "bf16")


if __name__ == "__main__":
    sys.exit(main())
