"""Accuracy against measured serving benchmarks: servesim's mean TTFT and TPOT for every point
of a silicon CSV (AISimulate's `silicon_sample.csv` format, ../shared/data/README.md beside
the checkout), each point's load reproduced, and the mean absolute percentage error (MAPE) per
group.

    python experiments/accuracy.py --silicon CSV [--backend vllm] [--mode agg]
        [--timing calibrated_roofline] [--jobs N] [--limit N] [--seed S] [--override KEY=VALUE ...]
        --out RESULT.csv [--markdown TABLE.md]

For every row whose backend and mode match the flags (no flag: every value) it composes the
run that reproduces the row (experiments/accuracy_points.py says how: model, GPU, engine,
parallelism, P/D pools and the measured load) and runs `model.simulate`; rows it cannot
reproduce are skipped with their reason. `--timing` defaults to the shipped default,
`calibrated_roofline`.

Points run in a process pool (`--jobs`, default os.cpu_count()), the slowest-looking first;
the results are sorted by id. RESULT.csv has one row per selected row: `status` ok, failed or
skipped, `note` (the error or skip reason), the row's keys, measured and predicted mean TTFT /
TPOT (summary `mean_ttft_ms`, `mean_tpot_ms`), `*_rel_error` = predicted / measured - 1,
completed requests, preemptions, KV blocks and wall seconds. The table printed (and written to
`--markdown`) has per (system, backend, model, mode) and overall: rows, failures, the MAPE
(mean |rel_error| x 100) and the bias (mean rel_error x 100) of TTFT and TPOT. The last line
is `TTFT MAPE x% TPOT MAPE y% over N rows (M skipped)`, M the selected rows not predicted;
every skipped row and failed run is listed above it with its reason.

Exit status: 0 when it ran (whatever the accuracy), 2 on bad arguments, an unreadable CSV or
one without the columns needed, no row matching the filters, or overrides that do not compose.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/ is not a package
from accuracy_points import (  # noqa: E402
    CONF_DIR,
    SKIP_REASONS,
    BadInput,
    Point,
    Pool,  # noqa: F401  (re-exported for the tests)
    Skip,
    _number,
    _text,
    compose_point_config,
    map_row,  # noqa: F401
    plan,
    read_silicon,
    select,
    size_pools,
)

from servesim import simulate  # noqa: E402

RESULT_COLUMNS = (
    "id",
    "status",
    "note",
    "system",
    "backend",
    "model",
    "mode",
    "llm",
    "precision",
    "tp",
    "dp",
    "batch_size",
    "prefill_workers",
    "decode_workers",
    "isl",
    "osl",
    "measured_ttft_ms",
    "measured_tpot_ms",
    "predicted_ttft_ms",
    "predicted_tpot_ms",
    "ttft_rel_error",
    "tpot_rel_error",
    "num_requests",
    "completed_requests",
    "n_preemptions",
    "num_gpu_blocks",
    "wall_s",
)
INT_COLUMNS = (
    "tp",
    "dp",
    "batch_size",
    "prefill_workers",
    "decode_workers",
    "isl",
    "osl",
    "num_requests",
    "completed_requests",
    "n_preemptions",
    "num_gpu_blocks",
)
GROUP = ("system", "backend", "model", "mode")


# --------------------------------------------------------------------------- runs


def _rel_error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0 if math.isfinite(predicted) else math.nan


def _float(v: Any) -> float:
    x = _number(v)
    return math.nan if x is None else x


def run_point(
    point: Point, timing: str = "roofline", overrides: Sequence[str] = (), seed: int = 0
) -> dict[str, Any]:
    """One result row: size the P/D pools a row lacks, compose, simulate, compare. Never
    raises for a failing run: the error's type and message go to `note` with status
    `failed`."""
    start = time.perf_counter()
    try:
        point = size_pools(point, timing, overrides)
        result = simulate(compose_point_config(point, timing, overrides, seed))
    except Exception as e:  # recorded, never swallowed: the row is reported as failed
        record = _record(point)
        record.update(status="failed", note=f"{type(e).__name__}: {e}")
        record["wall_s"] = time.perf_counter() - start
        return record
    record = _record(point)
    s = result.summary
    ttft, tpot = _float(s.get("mean_ttft_ms")), _float(s.get("mean_tpot_ms"))
    record.update(
        predicted_ttft_ms=ttft,
        predicted_tpot_ms=tpot,
        ttft_rel_error=_rel_error(ttft, point.measured_ttft_ms),
        tpot_rel_error=_rel_error(tpot, point.measured_tpot_ms),
        num_requests=s.get("num_requests"),
        completed_requests=s.get("completed_requests"),
        n_preemptions=s.get("n_preemptions"),
        num_gpu_blocks=s.get("metadata", {}).get("num_gpu_blocks"),
        wall_s=time.perf_counter() - start,
    )
    if not (math.isfinite(ttft) and math.isfinite(tpot)):
        record.update(status="failed", note="no prediction: mean TTFT or TPOT is missing")
    elif s.get("completed_requests") != s.get("num_requests"):
        done = f"{s.get('completed_requests')} of {s.get('num_requests')} completed"
        record["note"] = "; ".join(n for n in (point.assumption, done) if n)
    return record


def _record(point: Point) -> dict[str, Any]:
    """A result row's description of its point (the run's outcome is added to it)."""
    return {
        "id": point.id,
        "status": "ok",
        "note": point.assumption,
        "system": point.system,
        "backend": point.backend,
        "model": point.model,
        "mode": "agg" if point.decode is None else "disagg",
        "llm": point.llm,
        "precision": point.precision,
        "tp": point.tp,
        "dp": point.dp,
        "batch_size": point.batch_size,
        "isl": point.isl,
        "osl": point.osl,
        "measured_ttft_ms": point.measured_ttft_ms,
        "measured_tpot_ms": point.measured_tpot_ms,
        "prefill_workers": None if point.prefill is None else point.prefill.workers,
        "decode_workers": None if point.decode is None else point.decode.workers,
    }


def _work(point: Point) -> float:
    """A rough cost, to start the slowest points first (decoded tokens dominate)."""
    return point.concurrency * (point.osl + point.isl / 64)


def run_points(
    points: Sequence[Point],
    timing: str = "roofline",
    overrides: Sequence[str] = (),
    seed: int = 0,
    jobs: int = 1,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Every point's result row, sorted by id; `jobs` > 1 runs them in a process pool."""
    todo = sorted(points, key=_work, reverse=True)
    records: list[dict[str, Any]] = []

    def report(rec: dict[str, Any]) -> None:
        records.append(rec)
        if progress:
            msg = rec["note"] if rec["status"] == "failed" else f"{rec['wall_s']:.1f} s"
            print(
                f"accuracy: [{len(records)}/{len(todo)}] {rec['id']}: {rec['status']} {msg}",
                file=sys.stderr,
                flush=True,
            )

    if jobs <= 1 or len(todo) <= 1:
        for p in todo:
            report(run_point(p, timing, overrides, seed))
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
            futures = [pool.submit(run_point, p, timing, overrides, seed) for p in todo]
            for f in as_completed(futures):
                report(f.result())
    return sorted(records, key=lambda r: r["id"])


def skip_record(skip: Skip, row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": skip.id,
        "status": "skipped",
        "note": f"{skip.reason}: {skip.detail}",
        "system": _text(row["system"]),
        "backend": _text(row["backend"]),
        "model": _text(row["model_path"]),
        "mode": _text(row["mode"]),
        "precision": _text(row["precision"]),
        "tp": _number(row["tp_size"]),
        "batch_size": _number(row["batch_size"]),
        "isl": _number(row["isl"]),
        "osl": _number(row["osl"]),
        "measured_ttft_ms": _number(row["silicon_ttft_ms"]),
        "measured_tpot_ms": _number(row["silicon_tpot_ms"]),
    }


def result_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per record, RESULT_COLUMNS in order, sorted by id."""
    df = pd.DataFrame.from_records(list(records), columns=list(RESULT_COLUMNS))
    for col in INT_COLUMNS:  # whole numbers stay whole next to the empty cells of skipped rows
        x = pd.to_numeric(df[col], errors="coerce")
        if ((x % 1 == 0) | x.isna()).all():
            df[col] = x.astype("Int64")
    return df.sort_values("id", kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- accuracy


def _pct(errors: pd.Series, absolute: bool) -> float:
    e = errors.abs() if absolute else errors
    return float(e.mean() * 100) if len(e) else math.nan


def error_stats(results: pd.DataFrame) -> dict[str, Any]:
    """Over the `ok` rows of some results: how many, and the TTFT and TPOT MAPE and bias in
    percent."""
    ok = results[results["status"] == "ok"]
    ttft, tpot = ok["ttft_rel_error"].astype(float), ok["tpot_rel_error"].astype(float)
    return {
        "rows": int(len(ok)),
        "ttft_mape_pct": _pct(ttft, True),
        "tpot_mape_pct": _pct(tpot, True),
        "ttft_bias_pct": _pct(ttft, False),
        "tpot_bias_pct": _pct(tpot, False),
    }


def accuracy_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per (system, backend, model, mode), then `all`: rows in the MAPE, failed runs, TTFT and
    TPOT MAPE and bias in percent. Only status `ok` rows count; skipped rows are not in it."""
    ran = results[results["status"].isin(["ok", "failed"])]
    rows = []

    def stats(g: pd.DataFrame) -> dict[str, Any]:
        errors = error_stats(g)
        failed = int((g["status"] == "failed").sum())
        return {"rows": errors.pop("rows"), "failed": failed, **errors}

    for key, g in ran.groupby(list(GROUP), sort=True):
        rows.append({**dict(zip(GROUP, key, strict=True)), **stats(g)})
    rows.append({**dict.fromkeys(GROUP, "all"), **stats(ran)})
    return pd.DataFrame.from_records(rows)


def last_line(table: pd.DataFrame, results: pd.DataFrame) -> str:
    """`TTFT MAPE x% TPOT MAPE y% over N rows (M skipped)` from the table's overall row; M
    counts the selected rows not predicted (skipped, or a run that failed)."""
    overall = table.iloc[-1]
    not_predicted = int((results["status"] != "ok").sum())
    return (
        f"TTFT MAPE {overall['ttft_mape_pct']:.1f}% TPOT MAPE {overall['tpot_mape_pct']:.1f}% "
        f"over {int(overall['rows'])} rows ({not_predicted} skipped)"
    )


def markdown(df: pd.DataFrame) -> str:
    """A GitHub markdown table: floats to 1 decimal, missing values as `-`."""

    def fmt(v: object) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.astype(object).itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def skip_summary(skips: Sequence[Skip]) -> str:
    counts = Counter(s.reason for s in skips)
    return ", ".join(f"{reason} {counts[reason]}" for reason in SKIP_REASONS if counts[reason])


def slowest(results: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    ran = results[results["status"] != "skipped"]
    cols = ["id", "batch_size", "isl", "osl", "tp", "n_preemptions", "wall_s"]
    return ran.sort_values("wall_s", ascending=False).head(n)[cols]


# --------------------------------------------------------------------------- CLI


def timing_options() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "timing").glob("*.yaml"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--silicon", required=True, help="silicon CSV (measured benchmark points)")
    ap.add_argument("--backend", help="only rows of this backend (vllm, sglang, trtllm)")
    ap.add_argument("--mode", help="only rows of this mode (agg, disagg)")
    ap.add_argument(
        "--timing",
        default="calibrated_roofline",
        choices=timing_options(),
        help="conf/timing option (default: the shipped default)",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel runs")
    ap.add_argument("--limit", type=int, help="run only the first N runnable rows (by id)")
    ap.add_argument("--seed", type=int, default=0, help="servesim seed of every run")
    ap.add_argument("--override", action="append", default=[], help="Hydra override for every run")
    ap.add_argument("--out", required=True, help="per-row result CSV")
    ap.add_argument("--markdown", help="also write the per-group table here")
    args = ap.parse_args(argv)

    prog = "accuracy"
    if args.jobs < 1 or (args.limit is not None and args.limit < 1):
        print(f"{prog}: --jobs and --limit must be positive", file=sys.stderr)
        return 2
    try:
        df = read_silicon(args.silicon)
        chosen = select(df, args.backend, args.mode)
        if chosen.empty:
            raise BadInput(
                f"--silicon {args.silicon}: no row has backend={args.backend or 'any'} "
                f"mode={args.mode or 'any'} (backends: {sorted(df['backend'].dropna().unique())}, "
                f"modes: {sorted(df['mode'].dropna().unique())})"
            )
        points, skips = plan(chosen)
        if args.limit is not None:
            points = points[: args.limit]
        if points:  # bad overrides or timing fail every run: say so once, before the pool
            first = size_pools(points[0], args.timing, args.override)
            compose_point_config(first, args.timing, args.override, args.seed)
    except BadInput as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        print(f"{prog}: the run config does not compose: {e}", file=sys.stderr)
        return 2

    print(
        f"{prog}: {len(chosen)} of {len(df)} rows of {args.silicon} selected "
        f"(backend={args.backend or 'any'}, mode={args.mode or 'any'}); "
        f"running {len(points)}, skipped {len(skips)}"
        + (f" ({skip_summary(skips)})" if skips else ""),
        flush=True,
    )
    start = time.perf_counter()
    records = run_points(
        points, args.timing, args.override, args.seed, jobs=args.jobs, progress=True
    )
    wall = time.perf_counter() - start
    by_id = {str(r["id"]): r for r in chosen.to_dict("records")}
    results = result_frame([*records, *(skip_record(s, by_id[s.id]) for s in skips)])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results.to_csv(out, index=False)

    table = accuracy_table(results)
    text = markdown(table)
    print(f"\n{text}\n")
    for status, what in (("skipped", "skipped row(s)"), ("failed", "failed run(s)")):
        rows = results[results["status"] == status]
        if len(rows):
            print(f"{len(rows)} {what} (not in the MAPE):")
            for rec in rows.itertuples(index=False):
                print(f"  {rec.id}: {rec.note}")
    if points:
        print(f"slowest points:\n{slowest(results).to_string(index=False)}")
    print(f"{len(points)} runs in {wall:.1f} s with --jobs {args.jobs}; results: {out}")
    line = last_line(table, results)
    if args.markdown:
        Path(args.markdown).write_text(f"{text}\n\n{line}\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
