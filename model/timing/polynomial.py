"""Dynamo mocker's default step time: prefill quadratic in new tokens, decode in KV utilisation.

    t_prefill(T) = a T^2 + b T + c          (T = new tokens in the pass; T = 0 costs 0)
    t_decode(u)  = max(floor, a' u^2 + b' u + c'),  u = min(1, active_kv_tokens / total_kv_tokens)

Decode time does not depend on the batch size; that is the mocker's (uncalibrated) model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from servesim.config.schema import PolynomialTiming
from servesim.timing.base import new_tokens


class Polynomial:
    def __init__(self, cfg: PolynomialTiming) -> None:
        self.cfg = cfg

    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float:
        t = new_tokens(n, mean_isl, mean_prefix)
        if t <= 0:
            return 0.0
        c = self.cfg
        return c.prefill_a * t * t + c.prefill_b * t + c.prefill_c

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float:
        if batch <= 0:
            return 0.0
        u = min(1.0, active_kv_tokens / total_kv_tokens) if total_kv_tokens > 0 else 1.0
        c = self.cfg
        # a' (u u), in that order, as the mocker evaluates it (to the last bit)
        return max(c.decode_floor_ms, c.decode_a * (u * u) + c.decode_b * u + c.decode_c)

    def decode_ms_by_kv(self, total_kv_tokens: int) -> Callable[[np.ndarray], np.ndarray]:
        """`decode_ms_array` of a non-empty batch as a function of its KV tokens alone (the
        batch size and mean context do not enter this model's decode time)."""

        def by_kv(active_kv_tokens: np.ndarray) -> np.ndarray:
            return self.decode_ms_array(1, active_kv_tokens, total_kv_tokens, active_kv_tokens)

        return by_kv

    def decode_ms_array(
        self,
        batch: int,
        active_kv_tokens: np.ndarray,
        total_kv_tokens: int,
        mean_context: np.ndarray,
    ) -> np.ndarray:
        """`decode_ms` for many passes of `batch` sequences at once (the same floats: the
        same operations in the same order)."""
        if batch <= 0:
            return np.zeros(len(active_kv_tokens))
        if total_kv_tokens > 0:
            u = active_kv_tokens / total_kv_tokens
            np.minimum(u, 1.0, out=u)
        else:
            u = np.ones(len(active_kv_tokens))
        c = self.cfg
        # decode_a (u u) + decode_b u + decode_c, in place, in the scalar's order
        out = u * u
        out *= c.decode_a
        u *= c.decode_b
        out += u
        out += c.decode_c
        return np.maximum(out, c.decode_floor_ms, out=out)
