"""Decode prices tabulated by the decoding sequences' KV tokens, for a timing model whose decode
time depends on nothing else (the mocker's polynomial): each price computed once, in bulk."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np

from servesim.timing.base import StepTime, whole_ns, whole_ns_array


def decode_price(step_time: StepTime, total_kv_tokens: int) -> Callable[[int, int], float]:
    """The decode part of a pass of `n` sequences holding `sum_ctx` tokens, as a function of
    (n, sum_ctx): `whole_ns(decode_ms(n, sum_ctx, total_kv_tokens, sum_ctx // n))`, in one
    call (a stretch priced pass by pass calls it once per pass)."""
    decode_ms = step_time.decode_ms

    def price(n: int, sum_ctx: int) -> float:
        return whole_ns(decode_ms(n, sum_ctx, total_kv_tokens, sum_ctx // n))

    return price


class DecodeTable:
    """The decode part of a pass, in whole nanoseconds, by the decoding sequences' KV tokens,
    for a timing model whose decode time depends on nothing else (the mocker's polynomial):
    each value computed once, in bulk, the first time a pass needs it.

    Loads past the pool's tokens cost what a full pool does (utilisation is capped at 1), so
    the table has one slot per token of the pool. Its memory is zeroed by the OS on first
    touch: a run pays only for the loads it reaches. The computed slots are one range,
    `lo..hi`, widened (gap included) to take in a load outside it."""

    CHUNK: Final = 4096  # slots computed together when the range widens

    def __init__(self, by_kv: Callable[[np.ndarray], np.ndarray], total_kv_tokens: int) -> None:
        self.by_kv = by_kv
        self.top = max(total_kv_tokens, 1)
        self.values = np.zeros(self.top + 1)
        self.lo, self.hi = 1, 0  # nothing computed yet
        # read as Python floats, without numpy scalars
        self._slots: Any = memoryview(self.values)  # type: ignore[arg-type]

    def _cover(self, a: int, b: int) -> None:
        """Widen the computed range to take in slots a..b (a <= b <= top)."""
        lo, hi = self.lo, self.hi
        if lo > hi:  # the first fill: a chunk's worth from a
            lo, hi = a, min(self.top, max(b, a + self.CHUNK - 1))
            self._fill(lo, hi)
        if a < lo:
            a = max(0, min(a, lo - self.CHUNK))
            self._fill(a, lo - 1)
            lo = a
        if b > hi:
            b = min(self.top, max(b, hi + self.CHUNK))
            self._fill(hi + 1, b)
            hi = b
        self.lo, self.hi = lo, hi

    def _fill(self, lo: int, hi: int) -> None:
        self.values[lo : hi + 1] = whole_ns_array(self.by_kv(np.arange(lo, hi + 1)))

    def price(self, n: int, sum_ctx: int) -> float:
        """The decode part of one pass of `n` >= 1 sequences holding `sum_ctx` tokens."""
        s = sum_ctx if sum_ctx < self.top else self.top
        if not self.lo <= s <= self.hi:
            self._cover(s, s)
        return self._slots[s]

    def prices(self, sum_ctx: int, n: int, m: int) -> np.ndarray:
        """The decode parts of `m` passes of `n` >= 1 sequences, the first holding `sum_ctx`
        tokens and each later one `n` more (a new array)."""
        top = self.top
        first = sum_ctx if sum_ctx < top else top
        last = sum_ctx + n * (m - 1)
        if last > top:
            last = top
        if first < self.lo or last > self.hi:
            self._cover(first, last)
        at = np.arange(sum_ctx, sum_ctx + n * m, n)
        np.minimum(at, top, out=at)
        return self.values[at]
