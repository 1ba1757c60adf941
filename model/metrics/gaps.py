"""A multiset of float64 values (a run's inter-token gaps) kept as its distinct values with counts.

The summary's ITL statistics are exact (nearest-rank percentiles, mean, std of every gap), so
every gap is kept, but gaps are differences of pass end times that many requests share: 100,000
requests make 14.4 M gaps with 843,519 distinct values. The multiset holds each distinct value
once with how often it occurs (16 bytes), and the latest values in append buffers that are
folded in once they hold at least `fold_at` values and at least as many as there are distinct
values (so folding costs a bounded amount per gap, and the buffers stay bounded). A request's gaps
arrive as its token times (`add_gaps_of`): the multiset keeps those arrays and takes their
differences in bulk when it folds them in, not request by request.
"""

from __future__ import annotations

from array import array

import numpy as np

FOLD_AT = 1 << 22  # 32 MB of buffered gaps


class Multiset:
    """Float64 values added in any order; read back as (distinct values ascending, counts)."""

    def __init__(self, fold_at: int = FOLD_AT) -> None:
        if fold_at < 1:
            raise ValueError(f"fold_at must be >= 1, got {fold_at}")
        self.fold_at = fold_at
        self._buffer = array("d")  # added, not yet folded in
        # series whose consecutive differences are added, not yet folded in (the arrays
        # themselves: copying each onto one growing buffer costs more), and their lengths
        self._series: list[array] = []
        self._series_lengths = array("q")
        self._n_series_values = 0
        self._values = np.empty(0, dtype=np.float64)  # distinct, ascending
        self._counts = np.empty(0, dtype=np.int64)  # each > 0
        self.n_folds = 0

    @classmethod
    def of(cls, values: np.ndarray, fold_at: int = FOLD_AT) -> Multiset:
        out = cls(fold_at)
        out.extend(values)
        out.fold()
        return out

    def extend(self, values: np.ndarray) -> None:
        self._buffer.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        self._fold_if_full()

    def add_gaps_of(self, series: array) -> None:
        """Add the differences of consecutive values of `series` (a request's token times,
        an array 'd'): series[i + 1] - series[i] for each i."""
        if len(series) < 2:
            return  # no gap
        self._series.append(series)
        self._series_lengths.append(len(series))
        self._n_series_values += len(series)
        self._fold_if_full()

    def _fold_if_full(self) -> None:
        if len(self._buffer) + self._n_series_values >= max(self.fold_at, len(self._values)):
            self.fold()

    def __len__(self) -> int:
        n_series = self._n_series_values - len(self._series)  # each gives one gap fewer
        return int(self._counts.sum()) + len(self._buffer) + n_series

    def _added(self) -> np.ndarray:
        """Every value added since the last fold, in one new array (in no particular order):
        the buffered values, then the differences within each buffered series."""
        n_raw = len(self._buffer)
        out = np.empty(n_raw + self._n_series_values - len(self._series), dtype=np.float64)
        out[:n_raw] = np.frombuffer(self._buffer, dtype=np.float64)
        self._buffer = array("d")
        if self._series:
            values = np.frombuffer(b"".join(self._series), dtype=np.float64)
            self._series = []  # the joined copy is all that is left of them
            diffs = np.diff(values)
            del values
            # the difference at position end - 1 spans a series' last value and the next
            # series' first: not a gap
            keep = np.ones(len(diffs), dtype=bool)
            ends = np.cumsum(np.frombuffer(self._series_lengths, dtype=np.int64))
            keep[ends[:-1] - 1] = False
            out[n_raw:] = diffs[keep]
        self._series_lengths = array("q")
        self._n_series_values = 0
        return out

    def fold(self) -> None:
        """Merge the buffered values into the distinct values and counts."""
        if not self._buffer and not self._series:
            return
        added = self._added()
        added.sort()
        # distinct values of the sorted array and how often each occurs
        starts = np.empty(len(added), dtype=bool)
        starts[0] = True
        np.not_equal(added[1:], added[:-1], out=starts[1:])
        first = np.flatnonzero(starts)
        del starts
        new = added[first]
        new_counts = np.diff(np.append(first, len(added)))
        del added, first
        self.n_folds += 1
        self._merge(new, new_counts)

    def absorb(self, other: Multiset) -> None:
        """Add every value of `other` (another run part's gaps: model/speed/parallel.py)."""
        values, counts = other.distinct()
        if len(values):
            self.fold()
            self._merge(values, counts)

    def _merge(self, new: np.ndarray, new_counts: np.ndarray) -> None:
        """Add distinct ascending values `new`, each `new_counts` times."""
        values, counts = self._values, self._counts.copy()  # distinct() may have handed it out
        at = np.searchsorted(values, new)
        known = at < len(values)
        known[known] = values[at[known]] == new[known]
        # each known new value matches a different old one: no index repeats
        counts[at[known]] += new_counts[known]
        fresh = ~known
        self._values = np.insert(values, at[fresh], new[fresh])
        self._counts = np.insert(counts, at[fresh], new_counts[fresh])

    def distinct(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct values in ascending order and how often each occurs (the arrays
        themselves: do not write to them)."""
        self.fold()
        return self._values, self._counts

    def sorted(self) -> np.ndarray:
        """Every value, in ascending order (a new array of all of them)."""
        values, counts = self.distinct()
        return np.repeat(values, counts)
