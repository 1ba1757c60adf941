"""Keeps recorded rows column by column in typed arrays: the storage under the recorder.

Rows of a fixed schema go into `Columns`, arrays of one type appended end to end into
`Appended`. A replay of a million requests holds 8 bytes a number this way instead of a tuple
of boxed floats; nothing here knows what the rows mean (`servesim.metrics.records` and the
recorder do).
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np


class Appended:
    """Arrays of one typecode appended end to end, read back as one numpy array.

    The arrays are kept as they are and joined a few thousand at a time: one array grown by
    `extend` would be reallocated, and copied, every time it grows by a sixteenth."""

    JOIN_EVERY = 4096

    __slots__ = ("typecode", "_parts", "_chunks", "_n")

    def __init__(self, typecode: str) -> None:
        self.typecode = typecode
        self._parts: list[array[Any]] = []  # appended since the last join
        self._chunks: list[bytes] = []
        self._n = 0

    def append(self, values: array[Any]) -> None:
        """Append `values` (an array of this typecode; kept, not copied, until joined)."""
        if values.typecode != self.typecode:
            raise TypeError(f"expected an array {self.typecode!r}, got {values.typecode!r}")
        self._parts.append(values)
        self._n += len(values)
        if len(self._parts) >= self.JOIN_EVERY:
            self._chunks.append(b"".join(self._parts))
            self._parts = []

    def __len__(self) -> int:
        return self._n

    def absorb(self, other: Appended) -> None:
        """Append every value of `other` (of this typecode) after this one's."""
        self._chunks.append(b"".join(self._parts))
        self._parts = []
        self._chunks.extend([*other._chunks, b"".join(other._parts)])
        self._n += other._n

    def numpy(self) -> np.ndarray:
        """Every value appended, in order (a new array)."""
        joined = b"".join([*self._chunks, *self._parts])
        return np.frombuffer(joined, dtype=self.typecode)


def _all_ints(values: tuple[Any, ...]) -> bool:
    """Whether every value is an int (what an int64 array takes: a float, even 1.0, is not)."""
    try:
        array("q", values)
    except (TypeError, OverflowError):
        return False
    return True


class Columns:
    """Rows of a fixed schema, kept column by column.

    The hot path appends one tuple per row; every `CHUNK` rows the tuples move into one column
    per field, so a long run holds its values rather than its tuples: an array 'd' (float) or
    'q' (int) holds 8 bytes a number where a tuple slot and a boxed float take 32, a list holds
    objects ("o"), and a column of a few distinct values ("c": statuses, pool names) holds a
    4-byte code per row.

    A float column that has only ever received ints comes out int64, as pandas infers it from
    the values (SimPy's clock starts at the int 0: a run whose arrivals all come at t=0 stamps
    ints).
    """

    CHUNK = 4096

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields
        self.rows: list[tuple] = []  # appended, not yet moved into the columns
        self.columns: dict[str, array[Any] | list[Any]] = {
            name: [] if kind == "o" else array("i" if kind == "c" else kind)
            for name, kind in fields.items()
        }
        # per coded column, value -> code (in code order)
        self.codes: dict[str, dict[Any, int]] = {
            name: {} for name, kind in fields.items() if kind == "c"
        }
        # float columns that have seen no float yet
        self.ints_only = {name for name, kind in fields.items() if kind == "d"}

    def append(self, row: tuple) -> None:
        rows = self.rows
        rows.append(row)
        if len(rows) >= self.CHUNK:
            self.flush()

    def extend(self, rows: list[tuple]) -> None:
        """`append` each of `rows`."""
        self.rows.extend(rows)
        if len(self.rows) >= self.CHUNK:
            self.flush()

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) + len(self.rows)

    def flush(self) -> None:
        """Move the appended rows into the columns."""
        rows = self.rows
        if not rows:
            return
        ints_only = self.ints_only
        for (name, kind), values in zip(self.fields.items(), zip(*rows, strict=True), strict=True):
            column = self.columns[name]
            if kind == "c":
                codes = self.codes[name]
                for v in dict.fromkeys(values):  # new values coded by first appearance
                    if v not in codes:
                        codes[v] = len(codes)
                column.extend(map(codes.__getitem__, values))
                continue
            if name in ints_only and not _all_ints(values):
                ints_only.discard(name)
            column.extend(values)
        rows.clear()

    def absorb(self, other: Columns) -> None:
        """Move `other`'s rows (the same fields) after this one's, a column at a time: `other`
        is left empty, each of its columns freed once copied."""
        self.flush()
        other.flush()
        for name, kind in self.fields.items():
            column = self.columns[name]
            theirs = other.columns[name]
            other.columns[name] = theirs[:0]
            if kind == "c":
                codes = self.codes[name]
                for v in other.codes[name]:
                    codes.setdefault(v, len(codes))
                recode = [codes[v] for v in other.codes[name]]
                column.extend(map(recode.__getitem__, theirs))  # type: ignore[arg-type]
            else:
                column.extend(theirs)  # type: ignore[arg-type]
        self.ints_only &= other.ints_only

    def array(self, name: str, copy: bool = True) -> np.ndarray:
        """One column in row order, as a numpy array: float64 or int64 for numbers (a float
        column of ints only is still float64 here: see `ints_only`), objects otherwise. With
        `copy=False` a number column is a read-only view of the stored values (valid until the
        next append), for a caller that copies what it keeps anyway."""
        self.flush()
        column = self.columns[name]
        if isinstance(column, list):
            out = np.empty(len(column), dtype=object)
            out[:] = column
            return out
        values = np.frombuffer(column, dtype=column.typecode)
        if self.fields[name] == "c":
            decoded = np.empty(len(self.codes[name]), dtype=object)
            decoded[:] = list(self.codes[name])
            return decoded[values]
        return values.copy() if copy else values

    def coded(self, name: str) -> tuple[np.ndarray, tuple[Any, ...]]:
        """A coded column as its codes (a read-only view, valid until the next append) and
        the value of each code."""
        self.flush()
        column = self.columns[name]
        assert isinstance(column, array) and self.fields[name] == "c"
        return np.frombuffer(column, dtype=column.typecode), tuple(self.codes[name])
