"""Pandas tables built once, at the end of a run, from the recorder's columns."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from servesim.metrics.columns import Columns
from servesim.metrics.passes import ROLES
from servesim.metrics.recorder import KV_EVENT_COLUMNS, ROUTING_COLUMNS, TRANSFER_COLUMNS, Recorder
from servesim.metrics.records import (
    NULL_WHERE_NEGATIVE,
    REQUEST_COLUMNS,
    REQUEST_DTYPES,
    REQUEST_RECORD,
)

# pandas' default text dtype (pandas 3 with pyarrow): what it infers for a column of str
STR = pd.StringDtype("pyarrow", na_value=np.nan)


def requests_table(rec: Recorder) -> pd.DataFrame:
    """One row per request, in trace order (records arrive in terminal order)."""
    store = rec.requests
    # the engine that served a request: the decode pool's in P/D (both pools run one kind)
    engine = rec.engines.get("decode", rec.engines.get("aggregated"))
    if not len(store):  # pandas' frame of no records (object columns but the typed ones)
        empty = pd.DataFrame.from_records([], columns=[f.name for f in REQUEST_RECORD])
        empty["engine"] = constant_strings(engine, 0)
        return empty.astype(REQUEST_DTYPES)
    idx = store.array("_idx", copy=False)
    order = np.argsort(idx, kind="stable")
    # each column is copied once, by the reordering; pandas keeps those copies as they are
    cols = {name: store.array(name, copy=False)[order] for name in REQUEST_COLUMNS}
    absent = {name: cols[by] < 0 for name, by in NULL_WHERE_NEGATIVE.items()}
    ints_only = set(store.ints_only)
    if len(rec.late_values):
        _apply_late(rec.late_values, idx[order], cols, absent, ints_only)
    for name in ints_only:
        cols[name] = cols[name].astype(np.int64)
    for name, mask in absent.items():
        cols[name] = pd.arrays.IntegerArray(cols[name], mask)
    cols["engine"] = constant_strings(engine, len(idx))  # (not recorded per row)
    table = {f.name: cols[f.name] for f in REQUEST_RECORD}  # in table order
    return pd.DataFrame(table, copy=False).astype(REQUEST_DTYPES)


def _apply_late(
    late: Columns,
    sorted_idx: np.ndarray,
    cols: dict[str, np.ndarray],
    absent: dict[str, np.ndarray],
    ints_only: set[str],
) -> None:
    """Set the values learnt after their rows were written (the last one set wins) on the
    columns sorted by request index; every row of a request index gets it."""
    at = late.array("idx")
    lo = np.searchsorted(sorted_idx, at, "left")
    counts = np.searchsorted(sorted_idx, at, "right") - lo
    if (counts == 0).any():
        raise KeyError(int(at[counts == 0][0]))
    entry = np.repeat(np.arange(len(at)), counts)  # entry of each (entry, row) pair
    row = lo[entry] + np.arange(len(entry)) - np.repeat(np.cumsum(counts) - counts, counts)
    names = late.array("column")[entry]
    values = late.array("value")[entry]
    for name in dict.fromkeys(names.tolist()):
        mine = names == name
        rows, vals = row[mine], values[mine]
        _, last = np.unique(rows[::-1], return_index=True)
        keep = len(rows) - 1 - last
        rows, vals = rows[keep], vals[keep]
        col = cols[name]
        if col.dtype == object:
            col[rows] = vals
            continue
        if name in absent:  # None sets NA, a number clears it
            none = np.array([v is None for v in vals], dtype=bool)
            absent[name][rows] = none
            rows, vals = rows[~none], vals[~none]
        if name in ints_only and any(isinstance(v, float) for v in vals):
            ints_only.discard(name)
        col[rows] = vals.astype(col.dtype)


def passes_table(rec: Recorder) -> pd.DataFrame:
    """One row per engine pass, ordered by end time then worker (fast-forwarded workers
    record ahead of the event loop; passes alike in all of these stay in recording order)."""
    cols = rec.pass_columns()
    seq = cols.pop("seq")
    # a sort by end time, then role, worker, rank, then recording order (np.lexsort: last
    # key first)
    order = np.lexsort((seq, cols["dp_rank"], cols["worker"], cols["role"], cols["end_ms"]))
    data: dict[str, object] = {name: col[order] for name, col in cols.items()}
    roles = cast(np.ndarray, data["role"])
    data["role"] = coded_strings(roles, ROLES)
    # the engine of each pass's role: each role's engine code, looked up by role code
    engines = rec.engines
    kinds = tuple(dict.fromkeys(engines.values()))
    engine_of_role = np.array([kinds.index(engines[r]) if r in engines else -1 for r in ROLES])
    data["engine"] = coded_strings(engine_of_role[roles], kinds)
    # the columns are fresh copies already: pandas need not copy them again into blocks
    return pd.DataFrame(data, copy=False)


def coded_strings(codes: np.ndarray, names: tuple[str, ...]) -> pd.api.extensions.ExtensionArray:
    """The text column `names[codes]` (null where a code is negative) as pandas' default `str`
    dtype, decoded by Arrow (for 1.4 M passes a few times faster than a numpy string array
    that pandas then converts)."""
    null = codes < 0
    indices = pa.array(codes, mask=null) if null.any() else pa.array(codes)
    decoded = pa.DictionaryArray.from_arrays(
        indices, pa.array(names, pa.large_string())
    ).dictionary_decode()
    return pd.array(decoded, dtype=STR)


def constant_strings(value: str | None, n: int) -> pd.api.extensions.ExtensionArray:
    """A text column of `n` times `value` (null for None), as `coded_strings` makes one."""
    codes = np.zeros(n, dtype=np.int8) if value is not None else np.full(n, -1, dtype=np.int8)
    return coded_strings(codes, (value,) if value is not None else ())


def kv_table(rec: Recorder) -> pd.DataFrame:
    """Pool levels at each change, in time order (pools in name order at equal times)."""
    store = rec.kv
    if not len(store):
        df = pd.DataFrame.from_records([], columns=list(store.fields))
        return df.sort_values(["t_ms", "pool"], kind="stable").reset_index(drop=True)
    t = store.array("t_ms", copy=False)
    pool_codes, pool_names = store.coded("pool")
    # a stable sort by time, then pool name (np.lexsort: last key first)
    name_rank = np.argsort(np.argsort(np.array(pool_names, dtype=object), kind="stable"))
    order = np.lexsort((name_rank[pool_codes], t))
    cols: dict[str, Any] = {}
    for name, kind in store.fields.items():
        if kind == "c":
            codes, names = store.coded(name)
            cols[name] = coded_strings(codes[order], names)
        else:
            cols[name] = store.array(name, copy=False)[order]
    for name in store.ints_only:
        cols[name] = cols[name].astype(np.int64)
    return pd.DataFrame(cols, copy=False)


def kv_events_table(rec: Recorder) -> pd.DataFrame:
    """KV events in time order (at equal times prefill workers, then decode workers, each
    pool in index order), numbered in that order."""
    df = pd.DataFrame.from_records(rec.kv_events, columns=list(KV_EVENT_COLUMNS))
    df = df.sort_values(["t_ms", "worker_order", "dp_rank"], kind="stable").reset_index(drop=True)
    df["event_id"] = np.arange(len(df), dtype="int64")
    return df.drop(columns="worker_order")


def time_weighted_mean(
    kv: pd.DataFrame, column: str, end_ms: float, tier: str | None = None
) -> pd.Series:
    """Per pool (of `tier`, or of every tier), the mean of `column` over [0, end_ms], each
    value weighted by how long it held.

    A level recorded at t[i] holds until t[i+1] (the last one until `end_ms`); before the first
    record the level is 0. Only the three columns it reads are taken out of `kv` (a long run's
    table has millions of rows).
    """
    pools = kv["pool"].to_numpy()
    t_all = kv["t_ms"].to_numpy(dtype=float)
    v_all = kv[column].to_numpy(dtype=float)
    if tier is not None:
        mine = (kv["tier"] == tier).to_numpy()
        pools, t_all, v_all = pools[mine], t_all[mine], v_all[mine]
    out = {}
    for pool in sorted(set(pools.tolist())):
        rows = pools == pool
        t = t_all[rows]
        v = v_all[rows]
        if end_ms <= 0:
            out[pool] = float(v[-1])
            continue
        until = np.minimum(np.append(t[1:], end_ms), end_ms)
        hold = np.clip(until - np.minimum(t, end_ms), 0.0, None)
        out[pool] = float(np.dot(hold, v) / end_ms)
    return pd.Series(out, dtype="float64")


def transfers_table(rec: Recorder) -> pd.DataFrame:
    """One row per KV transfer, in completion order."""
    return pd.DataFrame.from_records(rec.transfers, columns=list(TRANSFER_COLUMNS))


def routing_table(rec: Recorder) -> pd.DataFrame:
    """One row per routing decision of a KV router, in decision order."""
    return pd.DataFrame.from_records(rec.routing, columns=list(ROUTING_COLUMNS))
