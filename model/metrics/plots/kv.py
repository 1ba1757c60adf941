"""KV occupancy: used and cached blocks of each KV pool over time, with each pool's capacity."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from servesim.metrics.plots._common import axes_or_new, source_table
from servesim.metrics.plots.passes import ROLE_ORDER

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from servesim.sim import Result


def pool_role(pool: str) -> str:
    """The role of a KV pool from its dotted name: `cluster.p0` (prefill), `cluster.d1.r0`
    (decode), `cluster.w0` (aggregated)."""
    parts = str(pool).split(".")
    worker = parts[1] if len(parts) > 1 else ""
    if worker[:1] == "p" and worker[1:].isdigit():
        return "prefill"
    if worker[:1] == "d" and worker[1:].isdigit():
        return "decode"
    return "aggregated"


def pool_capacities(result: Result) -> dict[str, int]:
    """KV blocks per pool (one rank) of each role, from the summary's metadata:
    `num_gpu_blocks` is the aggregated or decode pools', `prefill_num_gpu_blocks` the prefill
    pools' (a run without it has no prefill pools)."""
    meta = result.summary.get("metadata", {})
    out: dict[str, int] = {}
    if meta.get("num_gpu_blocks") is not None:
        blocks = int(meta["num_gpu_blocks"])
        out["aggregated"] = out["decode"] = blocks
    if meta.get("prefill_num_gpu_blocks") is not None:
        out["prefill"] = int(meta["prefill_num_gpu_blocks"])
    return out


def kv_occupancy(
    source: Result | pd.DataFrame,
    ax: Axes | None = None,
    *,
    capacity_blocks: int | None = None,
) -> Axes:
    """Used and cached blocks of each KV pool over time, as steps (a level holds until the next
    record; before the first record it is 0). Pools are in the order prefill, decode,
    aggregated.

    Used blocks are held by running requests; cached blocks are held by none and stay for prefix
    reuse until evicted, so they climb towards the capacity and stay there. In a disaggregated
    cluster a prefill pool's used blocks include the KV it holds for requests in handoff (until
    the decode side has it). The capacity line is each pool's configured size when a `Result` is
    given (one line per role when prefill and decode pools differ), or `capacity_blocks`.
    """
    ax = axes_or_new(ax, (9, 4))
    kv = source_table(source, "kv")
    pools = sorted(kv["pool"].unique(), key=lambda p: (ROLE_ORDER.index(pool_role(p)), p))
    roles = list(dict.fromkeys(pool_role(p) for p in pools))
    if capacity_blocks is not None:
        capacities = dict.fromkeys(roles, capacity_blocks)
    elif isinstance(source, pd.DataFrame):
        capacities = {}
    else:
        known = pool_capacities(source)
        capacities = {role: known[role] for role in roles if role in known}
    many_tiers = kv["tier"].nunique() > 1
    groups = kv.groupby(["pool", "tier"], sort=True)
    keys = sorted(groups.groups, key=lambda k: (pools.index(k[0]), k[1]))
    for i, (pool, tier) in enumerate(keys):
        g = groups.get_group((pool, tier))
        name = f"{pool} ({tier})" if many_tiers else str(pool)
        t = g["t_ms"].to_numpy(dtype=float)
        used = g["used_blocks"].to_numpy(dtype=float)
        cached = g["cached_blocks"].to_numpy(dtype=float)
        if t[0] > 0:
            t, used, cached = np.r_[0.0, t], np.r_[0.0, used], np.r_[0.0, cached]
        colour = f"C{i % 10}"
        ax.step(t / 1000.0, used, where="post", color=colour, lw=1.2, label=f"{name} used")
        ax.step(
            t / 1000.0,
            cached,
            where="post",
            color=colour,
            lw=1.2,
            linestyle="--",
            label=f"{name} cached",
        )
    if len(set(capacities.values())) == 1:
        (blocks,) = set(capacities.values())
        ax.axhline(blocks, color="grey", linestyle=":", label="capacity per pool")
    else:
        for (role, blocks), style in zip(capacities.items(), (":", "-.", "--"), strict=False):
            ax.axhline(blocks, color="grey", linestyle=style, label=f"capacity per {role} pool")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV blocks")
    ax.set_ylim(bottom=0)
    ax.set_title("KV cache occupancy")
    ax.legend(loc="upper left", fontsize="small", ncols=2)
    ax.grid(True, alpha=0.3)
    return ax
