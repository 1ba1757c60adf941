"""Shared by the plot modules: a `Result`'s table, the Axes to draw on, its completed requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from servesim.metrics.recorder import COMPLETED

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from servesim.sim import Result


def source_table(source: Result | pd.DataFrame, name: str) -> pd.DataFrame:
    """`source` itself if it is a table, else its table `name`."""
    if isinstance(source, pd.DataFrame):
        return source
    table = getattr(source, name)
    assert isinstance(table, pd.DataFrame)
    return table


def axes_or_new(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    """`ax`, else the Axes of a new figure of `figsize` (matplotlib is imported only here)."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, new = plt.subplots(figsize=figsize, layout="constrained")
    return new


def completed(requests: pd.DataFrame) -> pd.DataFrame:
    """The completed requests, in arrival order."""
    done = requests[requests["terminal_status"] == COMPLETED]
    return done.sort_values("arrival_ms", kind="stable")
