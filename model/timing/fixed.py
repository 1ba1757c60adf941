"""Constant step time: `prefill_ms` for a pass with prefill work, `decode_ms` with decode work."""

from __future__ import annotations

from servesim.config.schema import FixedTiming
from servesim.timing.base import new_tokens


class Fixed:
    def __init__(self, cfg: FixedTiming) -> None:
        self.cfg = cfg

    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float:
        return self.cfg.prefill_ms if new_tokens(n, mean_isl, mean_prefix) > 0 else 0.0

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float:
        return self.cfg.decode_ms if batch > 0 else 0.0
