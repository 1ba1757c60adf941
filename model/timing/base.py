"""What a step-time model answers: how long the prefill and decode parts of one pass take.

A pass's prefill part is summarised as Dynamo's mocker does: `n` prefill items with integer mean
`mean_isl` (cached or computed prefix plus this chunk) and integer mean `mean_prefix`. The decode
part is the number of decoding sequences, their KV tokens (the sum of their sequence lengths,
a shared prefix counted once per sequence, as the mocker does), the pool's total KV tokens and
the mean sequence length. All results are milliseconds; zero work costs zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np


class StepTime(Protocol):
    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float: ...

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float: ...


def whole_ns(ms: float) -> float:
    """`ms` kept in whole nanoseconds, rounded the way the mocker stores a duration: seconds
    (ms / 1000) rounded to the nanosecond."""
    return round(round(ms / 1000.0, 9) * 1e9) / 1e6


def whole_ns_array(ms: np.ndarray) -> np.ndarray:
    """`whole_ns` of every element, equal to it to the last bit.

    The float product (ms / 1000) x 1e9 rounds to the same integer as the exact one except
    where it lies within rounding error of a half nanosecond; those elements take the scalar
    rounding."""
    p = ms / 1000.0
    p *= 1e9
    # how far p lies from a half: |p - floor(p) - 0.5|
    near = np.floor(p)
    np.subtract(p, near, out=near)
    near -= 0.5
    np.abs(near, out=near)
    suspect = near <= 4.0 * np.spacing(p)
    out = np.rint(p, out=p)
    out /= 1e6
    for i in np.flatnonzero(suspect):
        out[i] = whole_ns(float(ms[i]))
    return out


def new_tokens(n: int, mean_isl: int, mean_prefix: int) -> int:
    """New (uncached) tokens of a prefill summary, as the mocker reconstructs them."""
    return n * (mean_isl - mean_prefix)


class Scaled:
    """Divides prefill by `speedup_ratio` and decode by `speedup_ratio x decode_speedup_ratio`.

    A ratio <= 0 leaves that time unscaled, as in the mocker.
    """

    def __init__(self, inner: StepTime, speedup_ratio: float, decode_speedup_ratio: float) -> None:
        self.inner = inner
        self.prefill_div = speedup_ratio if speedup_ratio > 0 else 1.0
        decode = speedup_ratio * decode_speedup_ratio
        self.decode_div = decode if decode > 0 else 1.0
        # a model that prices mixed passes as one (a pass is then scaled by the prefill ratio)
        self.mixed_ms = self._mixed if hasattr(inner, "mixed_ms") else None
        # a model that prices many decode passes at once (decode fast-forward uses it)
        self.decode_ms_array = self._decode_array if hasattr(inner, "decode_ms_array") else None

    def decode_ms_by_kv(self, total_kv_tokens: int) -> Callable[[np.ndarray], np.ndarray] | None:
        """Decode times of non-empty batches as a function of their KV tokens alone, when the
        inner model's depend on nothing else (it offers `decode_ms_by_kv`); else None."""
        by_kv_of = getattr(self.inner, "decode_ms_by_kv", None)
        if by_kv_of is None:
            return None
        inner = by_kv_of(total_kv_tokens)
        div = self.decode_div

        def scaled(active_kv_tokens: np.ndarray) -> np.ndarray:
            return inner(active_kv_tokens) / div  # type: ignore[no-any-return]

        return scaled

    def _mixed(
        self, n: int, mean_isl: int, mean_prefix: int, batch: int, mean_context: int
    ) -> float:
        return self.inner.mixed_ms(n, mean_isl, mean_prefix, batch, mean_context) / self.prefill_div  # type: ignore[attr-defined]

    def _decode_array(
        self,
        batch: int,
        active_kv_tokens: np.ndarray,
        total_kv_tokens: int,
        mean_context: np.ndarray,
    ) -> np.ndarray:
        inner = self.inner.decode_ms_array  # type: ignore[attr-defined]
        return inner(batch, active_kv_tokens, total_kv_tokens, mean_context) / self.decode_div

    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float:
        return self.inner.prefill_ms(n, mean_isl, mean_prefix) / self.prefill_div

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float:
        return (
            self.inner.decode_ms(batch, active_kv_tokens, total_kv_tokens, mean_context)
            / self.decode_div
        )
