"""Profiles of servesim: the top functions by own time, where pstats files go, and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_replay_cases import REPO


def _short(filename: str) -> str:
    for marker in ("/site-packages/", str(REPO) + "/", "/lib/python"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def top_functions(stats: Any, n: int) -> list[dict[str, Any]]:
    total = stats.total_tt
    rows = []
    for (filename, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append(
            {
                "function": f"{_short(filename)}:{line}({func})",
                "ncalls": nc,
                "primitive_calls": cc,
                "tottime_s": tt,
                "tottime_share": tt / total if total else 0.0,
                "cumtime_s": ct,
            }
        )
    rows.sort(key=lambda r: r["tottime_s"], reverse=True)
    return [{"profiled_total_s": total, **r} for r in rows[:n]]


def profile_path(template: str | None, case: str, several: bool) -> str | None:
    if not template:
        return None
    if "{case}" in template:
        return str(Path(template.format(case=case)).resolve())
    path = Path(template).resolve()
    return str(path.with_name(f"{path.stem}.{case}{path.suffix}")) if several else str(path)


def profile_markdown(profile: dict[str, Any]) -> str:
    rows = profile["rows"]
    total = rows[0]["profiled_total_s"] if rows else 0.0
    s = profile.get("summary", {})
    lines = [
        f"### Profile: {profile['case']}",
        "",
        f"cProfile of servesim `simulate()`: {total:.2f} s profiled (process wall "
        f"{profile['wall_s']:.2f} s; profiling inflates times) for {s.get('num_requests') or 0:,} "
        f"requests and {s.get('n_passes') or 0:,} passes. Top functions by own time:",
        "",
        "| # | function | calls | tottime s | share | cumtime s |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"| {i} | `{r['function']}` | {r['ncalls']:,} | {r['tottime_s']:.2f} "
            f"| {100 * r['tottime_share']:.1f} % | {r['cumtime_s']:.2f} |"
        )
    if profile.get("pstats"):
        lines += ["", f"pstats file: `{profile['pstats']}`."]
    return "\n".join(lines)
