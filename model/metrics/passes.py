"""Engine passes as recorded: a row per pass, and decode-only stretches kept as runs.

A pass recorded on its own appends a value to each column (`PassLog.appends`, bound once: the
engine records one per step). A stretch of decode-only passes applied at once (decode
fast-forward) is kept as one run: its worker, pass count, sequences and start, and the end
time and active blocks of each of its passes; `PassLog.columns` expands the runs into rows.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from servesim.metrics.columns import Appended

# a typed array per column ("b" role: a code, see ROLES)
PASS_COLUMNS = {
    "worker": "i",
    "dp_rank": "i",
    "start_ms": "d",
    "end_ms": "d",
    "prefill_tokens": "q",
    "prefill_seqs": "i",
    "decode_seqs": "i",
    "kv_used_blocks": "q",
    "preemptions": "i",
    "role": "b",
}
ROLES = ("aggregated", "prefill", "decode")


class PassLog:
    """The passes of a run (or of a part of it), in recording order."""

    def __init__(self) -> None:
        self.single: dict[str, array[Any]] = {
            name: array(code) for name, code in PASS_COLUMNS.items()
        }
        # per stretch: (single passes recorded before it, worker, passes, decoding sequences,
        # role code, start), and the end time and active blocks of each of its passes
        self.stretches: list[tuple[int, int, int, int, int, float]] = []
        self.stretch_ends = Appended("d")
        self.stretch_kv_used = Appended("q")
        self.appends: tuple[Callable[[Any], None], ...] = ()
        self._bind()

    def _bind(self) -> None:
        """Bind each column's append, in PASS_COLUMNS order."""
        self.appends = tuple(self.single[name].append for name in PASS_COLUMNS)

    def __getstate__(self) -> dict[str, Any]:
        # (bound appends are rebuilt on unpickling)
        state = dict(self.__dict__)
        del state["appends"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind()

    def __len__(self) -> int:
        """Passes kept: recorded one by one, and in stretches."""
        return len(self.single["end_ms"]) + len(self.stretch_ends)

    def add_stretch(
        self,
        worker: int,
        start_ms: float,
        ends: array,
        decode_seqs: int,
        kv_used_blocks: array,
        role: str,
    ) -> None:
        """Decode-only passes of rank 0, back to back from `start_ms`, ending at `ends`,
        `decode_seqs` sequences each, `kv_used_blocks` per pass (the arrays are kept)."""
        at = len(self.single["end_ms"])
        self.stretches.append((at, worker, len(ends), decode_seqs, ROLES.index(role), start_ms))
        self.stretch_ends.append(ends)
        self.stretch_kv_used.append(kv_used_blocks)

    def absorb(self, other: PassLog) -> None:
        """Append `other`'s passes after this one's (its columns are moved, not copied)."""
        n_single = len(self.single["end_ms"])
        for name, column in self.single.items():
            theirs = other.single[name]
            other.single[name] = theirs[:0]  # (freed once copied)
            column.extend(theirs)
        other._bind()
        self.stretches.extend(
            [(at + n_single, w, k, n, role, t) for at, w, k, n, role, t in other.stretches]
        )
        self.stretch_ends.absorb(other.stretch_ends)
        self.stretch_kv_used.absorb(other.stretch_kv_used)

    def columns(self) -> dict[str, np.ndarray]:
        """Every kept pass as columns (numpy arrays): the passes recorded one by one, then the
        stretches' runs expanded, and `seq`, each pass's place in recording order."""
        single = {name: np.frombuffer(col, dtype=col.typecode) for name, col in self.single.items()}
        n_single = len(single["end_ms"])
        if not self.stretches:
            return {**single, "seq": np.arange(n_single)}
        at, worker, k, decode_seqs, role, start = (
            np.array(c) for c in zip(*self.stretches, strict=True)
        )
        ends = self.stretch_ends.numpy()
        n_stretch = len(ends)
        first = np.cumsum(k) - k  # each stretch's first row among the run rows
        # each pass starts where the previous pass of its stretch ended
        starts = np.empty(n_stretch)
        starts[1:] = ends[:-1]
        starts[first] = start
        zeros = np.zeros(n_stretch, dtype=np.int8)
        runs = {
            "worker": np.repeat(worker, k),
            "dp_rank": zeros,
            "start_ms": starts,
            "end_ms": ends,
            "prefill_tokens": zeros,
            "prefill_seqs": zeros,
            "decode_seqs": np.repeat(decode_seqs, k),
            "kv_used_blocks": self.stretch_kv_used.numpy(),
            "preemptions": zeros,
            "role": np.repeat(role, k),
        }
        out = {
            name: np.concatenate((values, runs[name].astype(values.dtype, copy=False)))
            for name, values in single.items()
        }
        # recording order: a single pass comes after the run rows of every stretch recorded
        # before it; a stretch's j-th run row after the `at` single passes recorded before
        # that stretch and the run rows before it
        rows_before = np.concatenate(([0], np.cumsum(k)))
        single_seq = np.arange(n_single)
        single_seq += rows_before[np.searchsorted(at, single_seq, "right")]
        out["seq"] = np.concatenate((single_seq, np.repeat(at, k) + np.arange(n_stretch)))
        return out
