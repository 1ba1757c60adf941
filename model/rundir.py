"""The run directory: what a run writes there, written so that a finished run can be told apart.

The contract (docs/running.md):

* every file goes to a hidden temporary name (`.requests.parquet.partial`) and is renamed into
  place once whole, so no table is ever read half-written;
* `summary.json` is written last: its presence means the run finished and every table beside
  it is this run's;
* a run that fails or is interrupted writes `error.json` (its status, exit status and message)
  and no `summary.json`; one that ends without completing a single request writes both (its
  summary, and `error.json` saying why it exits 3);
* before a run writes anything, the files a previous servesim run left in the directory are
  removed: only servesim's own names (`RUN_FILES`), never other files (Hydra's `.hydra/` and
  its log stay).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.metrics.records import jsonl_records

SUMMARY = "summary.json"
ERROR = "error.json"
REQUESTS_JSONL = "requests.jsonl"
# every table a run may write, as NAME.parquet or NAME.csv
TABLES = ("requests", "passes", "kv", "kv_events", "transfers", "routing", "plays")
# servesim's own files, the summary first: a clearing cut short leaves no summary beside
# another run's tables
RUN_FILES = (
    SUMMARY,
    ERROR,
    REQUESTS_JSONL,
    *(f"{t}.{ext}" for t in TABLES for ext in ("parquet", "csv")),
)


def partial_path(path: Path) -> Path:
    """The temporary name `path` is written under before it is renamed into place."""
    return path.with_name(f".{path.name}.partial")


def clear(out_dir: str | Path) -> None:
    """Remove the files (and half-written temporaries) of an earlier run in `out_dir`."""
    out = Path(out_dir)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
        partial_path(out / name).unlink(missing_ok=True)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield the temporary path to write `path`'s content to; rename it into place when the
    block ends normally, remove it when the block raises (an interrupt included)."""
    tmp = partial_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    """`obj` as indented JSON, written whole or not at all."""
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def write_table(df: pd.DataFrame, path: Path) -> None:
    """A table as Parquet, or CSV if `path` ends in .csv, written whole or not at all."""
    with replacing(path) as tmp:
        if path.suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)


def write_error(out_dir: str | Path, status: str, exit_status: int, message: str) -> Path:
    """`error.json`: why the run in `out_dir` has no summary (status `failed` or
    `interrupted`), with the exit status the command ended with."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ERROR
    write_json(path, {"status": status, "exit_status": exit_status, "message": message})
    return path


def write_requests_jsonl(
    requests: pd.DataFrame, path: Path, prefill_dp: int = 1, decode_dp: int = 1
) -> None:
    """One JSON object per ended request (`jsonl_records`: the mocker's per-request field names;
    worker indices are its scheduler ids, worker x dp_size + rank)."""
    with replacing(path) as tmp, tmp.open("w") as fh:
        for rec in jsonl_records(requests, prefill_dp, decode_dp):
            fh.write(json.dumps({k: _jsonable(v) for k, v in rec.items()}) + "\n")


def _jsonable(v: Any) -> Any:
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


COMPLETED, FAILED, INCOMPLETE_RUN = "completed", "failed", "incomplete"


def run_status(out_dir: str | Path) -> tuple[str, int | None, str]:
    """What a run directory says of its run: (`completed` | `failed` | `incomplete`, the
    exit status its command ended with if recorded, the message of its `error.json`).

    `failed`: `error.json` says so (the run stopped on an error, or finished without
    completing a request: then `summary.json` is there too); `completed`: `summary.json` and
    no failure; `incomplete`: no `summary.json` (interrupted, killed, or still running)."""
    out = Path(out_dir)
    error: dict[str, Any] = {}
    try:
        loaded = json.loads((out / ERROR).read_text())
        if isinstance(loaded, dict):
            error = loaded
    except (OSError, ValueError):
        pass
    exit_status = error.get("exit_status")
    message = str(error.get("message", ""))
    code = exit_status if isinstance(exit_status, int) else None
    if error.get("status") == FAILED:
        return FAILED, code, message
    if (out / SUMMARY).is_file():
        return COMPLETED, code, message
    return INCOMPLETE_RUN, code, message
