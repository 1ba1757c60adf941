"""Pandas tables built once, at the end of a run, from the recorder's tuples."""

from __future__ import annotations

import numpy as np
import pandas as pd

from model.metrics.recorder import (
    KV_COLUMNS,
    KV_EVENT_COLUMNS,
    PASS_COLUMNS,
    REQUEST_COLUMNS,
    Recorder,
)

REQUEST_DTYPES = {
    "turn_index": "int64",
    "input_length": "int64",
    "requested_output_length": "int64",
    "output_length": "int64",
    "reused_input_tokens": "int64",
    "first_admission_reused_input_tokens": "int64",
    "prefill_worker_idx": "Int64",
    "decode_worker_idx": "Int64",
    "n_preemptions": "int64",
}


def requests_table(rec: Recorder) -> pd.DataFrame:
    """One row per request, in trace order (records arrive in terminal order)."""
    df = pd.DataFrame.from_records(rec.requests, columns=["_idx", *REQUEST_COLUMNS])
    df = df.sort_values("_idx", kind="stable").drop(columns="_idx").reset_index(drop=True)
    return df.astype(REQUEST_DTYPES)


def passes_table(rec: Recorder) -> pd.DataFrame:
    return pd.DataFrame.from_records(rec.passes, columns=list(PASS_COLUMNS))


def kv_table(rec: Recorder) -> pd.DataFrame:
    return pd.DataFrame.from_records(rec.kv, columns=list(KV_COLUMNS))


def kv_events_table(rec: Recorder) -> pd.DataFrame:
    return pd.DataFrame.from_records(rec.kv_events, columns=list(KV_EVENT_COLUMNS))


def time_weighted_mean(kv: pd.DataFrame, column: str, end_ms: float) -> pd.Series:
    """Per pool, the mean of `column` over [0, end_ms], each value weighted by how long it held.

    A level recorded at t[i] holds until t[i+1] (the last one until `end_ms`); before the first
    record the level is 0.
    """
    out = {}
    for pool, g in kv.groupby("pool", sort=True):
        t = g["t_ms"].to_numpy(dtype=float)
        v = g[column].to_numpy(dtype=float)
        if end_ms <= 0:
            out[pool] = float(v[-1])
            continue
        until = np.minimum(np.append(t[1:], end_ms), end_ms)
        hold = np.clip(until - np.minimum(t, end_ms), 0.0, None)
        out[pool] = float(np.dot(hold, v) / end_ms)
    return pd.Series(out, dtype="float64")
