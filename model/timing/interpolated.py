"""Step time interpolated from measured points.

Prefill: ms against new tokens in the pass, piecewise linear, extrapolated linearly beyond the
first and last points, floored at 0. Decode: ms on a grid over (active KV tokens, mean context
length), bilinear inside the grid and extrapolated linearly outside it, floored at 1 ms.
The arrays use the names of Dynamo's profiler output (`prefill_isl`, `prefill_ttft_ms`,
`decode_active_kv_tokens`, `decode_context_length`, `decode_itl`); `decode_itl` is the grid
flattened with the KV axis outer: value (i, j) sits at index i * len(context axis) + j.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from pathlib import Path

import numpy as np

from servesim.config.errors import ConfigError
from servesim.config.schema import InterpolatedTiming
from servesim.timing.base import new_tokens

DECODE_FLOOR_MS = 1.0
ARRAYS = (
    "prefill_isl",
    "prefill_ttft_ms",
    "decode_active_kv_tokens",
    "decode_context_length",
    "decode_itl",
)


def load_points(cfg: InterpolatedTiming) -> dict[str, list[float]]:
    """The five arrays, inline from the config or from a .json/.npz file at `path`."""
    if cfg.path is None:
        return {name: list(getattr(cfg, name)) for name in ARRAYS}
    path = Path(cfg.path)
    if not path.is_file():
        raise ConfigError(f"timing.path: {path} does not exist")
    if path.suffix == ".npz":
        with np.load(path) as data:
            raw = {k: data[k] for k in data.files}
    else:
        raw = json.loads(path.read_text())
    missing = [k for k in ARRAYS if k not in raw]
    if missing:
        raise ConfigError(f"timing.path: {path} lacks arrays {missing} (needs {list(ARRAYS)})")
    return {k: [float(x) for x in np.ravel(raw[k])] for k in ARRAYS}


def _segment(xs: list[float], x: float) -> int:
    """Index i of the segment [xs[i], xs[i+1]] used for x (end segments extrapolate)."""
    return min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)


def _lerp(xs: list[float], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0]
    i = _segment(xs, x)
    x0, x1 = xs[i], xs[i + 1]
    return ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0)


def _check_axis(name: str, xs: list[float]) -> None:
    if not xs:
        raise ConfigError(f"timing.{name}: needs at least one point")
    if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
        raise ConfigError(f"timing.{name}: points must be strictly increasing")


class Interpolated:
    def __init__(self, cfg: InterpolatedTiming) -> None:
        pts = load_points(cfg)
        order = sorted(range(len(pts["prefill_isl"])), key=lambda i: pts["prefill_isl"][i])
        self.prefill_x = [pts["prefill_isl"][i] for i in order]
        if len(pts["prefill_ttft_ms"]) != len(self.prefill_x):
            raise ConfigError("timing.prefill_ttft_ms: must have one value per prefill_isl point")
        self.prefill_y = [pts["prefill_ttft_ms"][i] for i in order]
        _check_axis("prefill_isl", self.prefill_x)
        self.kv_axis = pts["decode_active_kv_tokens"]
        self.ctx_axis = pts["decode_context_length"]
        _check_axis("decode_active_kv_tokens", self.kv_axis)
        _check_axis("decode_context_length", self.ctx_axis)
        grid = pts["decode_itl"]
        if len(grid) != len(self.kv_axis) * len(self.ctx_axis):
            raise ConfigError(
                f"timing.decode_itl: needs len(decode_active_kv_tokens) x "
                f"len(decode_context_length) = {len(self.kv_axis) * len(self.ctx_axis)} "
                f"values (KV axis outer), got {len(grid)}"
            )
        nc = len(self.ctx_axis)
        self.grid = [grid[i * nc : (i + 1) * nc] for i in range(len(self.kv_axis))]

    def prefill_ms(self, n: int, mean_isl: int, mean_prefix: int) -> float:
        t = new_tokens(n, mean_isl, mean_prefix)
        if t <= 0:
            return 0.0
        return max(0.0, _lerp(self.prefill_x, self.prefill_y, float(t)))

    def decode_ms(
        self, batch: int, active_kv_tokens: int, total_kv_tokens: int, mean_context: int
    ) -> float:
        if batch <= 0:
            return 0.0
        ctx = float(mean_context)
        # interpolate along context on each KV row, then along the KV axis
        column = [_lerp(self.ctx_axis, row, ctx) for row in self.grid]
        return max(DECODE_FLOOR_MS, _lerp(self.kv_axis, column, float(active_kv_tokens)))
