"""The comparison's reports: a text table per case, and Markdown tables over the cases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from compare_dynamo_cases import Case
from compare_dynamo_join import METRICS, TARGETS, Kind, Metric, Row

# --------------------------------------------------------------------------- formatting


def fmt_value(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or (float(x).is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.1f}"
    if abs(x) >= 1:
        return f"{x:,.3f}"
    return f"{x:.5f}"


def _signed(x: float, decimals: int) -> str:
    """Fixed point, or scientific when fixed point would round a non-zero value to zero."""
    if x == 0:
        return "0"
    if abs(x) < 0.5 * 10**-decimals:
        return f"{x:+.1e}"
    return f"{x:+.{decimals}f}"


def fmt_diff(kind: Kind, diff: float | None) -> str:
    if diff is None:
        return "missing"
    if kind == "reuse":
        return _signed(diff, 5)
    return _signed(diff * 100, 4) + " %"


def fmt_target(kind: Kind) -> str:
    return f"±{TARGETS[kind]:.2f}" if kind == "reuse" else f"±{TARGETS[kind] * 100:g} %"


def _cells(row: Row) -> list[str]:
    return [
        row.metric,
        fmt_value(row.servesim),
        fmt_value(row.mocker),
        fmt_diff(row.kind, row.diff),
        fmt_target(row.kind),
        "ok" if row.ok else "MISS",
    ]


HEADER = ["metric", "servesim", "mocker", "diff", "target", ""]


def wall_line(case: Case) -> str:
    return (
        f"wall time: servesim {case.servesim_wall_s:.2f} s, mocker {case.mocker_wall_s:.2f} s "
        f"(replay call; {case.mocker_process_wall_s:.2f} s with process start-up), "
        f"servesim / mocker = {case.wall_ratio:.1f}x"
    )


def text_table(case: Case) -> str:
    lines = [[*HEADER], *(_cells(r) for r in case.rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    out = [f"== {case.title}" + (f"  ({' '.join(case.overrides)})" if case.overrides else "")]
    for k, line in enumerate(lines):
        out.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append(wall_line(case))
    if case.per_request is not None:
        out.append(case.per_request.line())
    out.append(
        "all targets met"
        if case.ok
        else "TARGETS MISSED: " + ", ".join(r.metric for r in case.rows if not r.ok)
    )
    return "\n".join(out)


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def worst_per_metric(cases: Sequence[Case]) -> list[tuple[Metric, float | None, str]]:
    """Per metric, the difference of largest magnitude over the cases and the case it is in
    ("all" when every case has the same difference, e.g. 0; None: missing in some case)."""
    out: list[tuple[Metric, float | None, str]] = []
    for i, m in enumerate(METRICS):
        diffs = [(c.rows[i].diff, c.title) for c in cases]
        if any(d is None for d, _ in diffs):
            out.append((m, None, next(t for d, t in diffs if d is None)))
            continue
        worst, title = max(diffs, key=lambda dt: abs(cast(float, dt[0])))
        if len(cases) > 1 and all(d == worst for d, _ in diffs):
            title = "all"
        out.append((m, worst, title))
    return out


def markdown(cases: Sequence[Case], overrides: Sequence[str]) -> str:
    """An overview table, the worst difference per metric and one side-by-side table per
    case."""
    extra = f" with overrides `{' '.join(overrides)}`" if overrides else ""
    out = [
        f"Overview (servesim vs mocker{extra}; diff = servesim / mocker - 1, prefix reuse as an "
        "absolute difference; wall = the simulate / replay call alone):",
        "",
        _md_row(
            [
                "trace",
                "cluster",
                "worst latency diff",
                "worst throughput diff",
                "prefix reuse diff",
                "servesim wall s",
                "mocker wall s",
                "servesim / mocker",
                "targets",
            ]
        ),
        _md_row(["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---"]),
    ]
    for c in cases:
        reuse = next(r for r in c.rows if r.kind == "reuse")
        out.append(
            _md_row(
                [
                    c.label,
                    c.shape,
                    _signed(c.worst("latency") * 100, 4).lstrip("+") + " %",
                    _signed(c.worst("throughput") * 100, 4).lstrip("+") + " %",
                    fmt_diff("reuse", reuse.diff),
                    f"{c.servesim_wall_s:.2f}",
                    f"{c.mocker_wall_s:.2f}",
                    f"{c.wall_ratio:.1f}x",
                    "met" if c.ok else "**missed**",
                ]
            )
        )
    out += [
        "",
        "Worst difference per metric over these cases:",
        "",
        _md_row(["metric", "worst diff", "case"]),
        _md_row(["---", "---:", "---"]),
    ]
    for m, diff, title in worst_per_metric(cases):
        out.append(_md_row([m.key, fmt_diff(m.kind, diff), title]))
    for c in cases:
        out += ["", f"### {c.title}", "", _md_row(HEADER), _md_row(["---", *["---:"] * 5])]
        out += [_md_row(_cells(r)) for r in c.rows]
        out += ["", wall_line(c) + "."]
        if c.per_request is not None:
            line = c.per_request.line()
            out += ["", line[0].upper() + line[1:] + "."]
    return "\n".join(out) + "\n"
