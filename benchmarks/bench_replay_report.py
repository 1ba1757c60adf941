"""The benchmark's report: the overview, scaling and per-case Markdown tables, and the JSON."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from bench_replay_env import revision
from bench_replay_profile import profile_markdown
from bench_replay_runner import REPORTED_KEYS, CaseResult, Variant

# issue 8: a 1,000,000-request generated trace on 4 workers in under 2 GB (reported, not asserted)
MEMORY_TARGET_MB = 2048.0
MEMORY_TARGET_REQUESTS = 1_000_000
MEMORY_TARGET_WORKERS = 4


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _median_if_any(values: list[float | None]) -> float | None:
    """The median of the values measured (None where a sample has none), or None."""
    measured = [x for x in values if x is not None]
    return statistics.median(measured) if measured else None


def variant_stats(v: Variant) -> dict[str, Any]:
    n = v.num_requests
    wall, sim = v.stat("wall_s"), v.stat("sim_s")
    return {
        "label": v.label,
        "wall_s_median": wall,
        "wall_s_min": v.stat("wall_s", "min"),
        "sim_s_median": sim,
        "sim_s_min": v.stat("sim_s", "min"),
        "req_per_wall_s": n / wall,
        "req_per_sim_s": n / sim,
        "peak_rss_mb_median": v.stat("peak_rss_mb"),
        "peak_rss_mb_max": max(s.peak_rss_mb for s in v.samples),
        "cpu_s_median": v.stat("cpu_s"),
        "import_s_median": _median_if_any([s.import_s for s in v.samples]),
        "passes_s_median": _median_if_any([s.passes_s for s in v.samples]),
        "num_requests": n,
    }


def paired_ratios(case: CaseResult, key: str = "wall_s", variant: str = "servesim") -> list[float]:
    """servesim (or another servesim variant) / mocker of `key` within each repetition (the
    two ran minutes apart at most, under the same load); empty when the mocker did not run."""
    if "mocker" not in case.variants or variant not in case.variants:
        return []
    ours, theirs = case.variants[variant].samples, case.variants["mocker"].samples
    return [getattr(a, key) / getattr(b, key) for a, b in zip(ours, theirs, strict=True)]


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def _setup_line(case: CaseResult) -> str:
    """How the case is configured on both sides."""
    spec, kw = case.spec, case.mocker_kwargs
    ours = f"cluster {case.shape}"
    if spec.pd:
        ours += f" (`compare_dynamo.py --pd {spec.pd}`)"
    if spec.overrides:
        ours += ", overrides `" + " ".join(spec.overrides) + "`"
    theirs = [f"router_mode={kw.get('router_mode')}"]
    if "num_prefill_workers" in kw:
        theirs.append(
            f"num_prefill_workers={kw['num_prefill_workers']}, "
            f"num_decode_workers={kw['num_decode_workers']}"
        )
    else:
        theirs.append(f"num_workers={kw.get('num_workers')}")
    return f"servesim: {ours}; mocker: `{', '.join(theirs)}` (from `compare_dynamo.mocker_kwargs`)."


def case_markdown(case: CaseResult) -> str:
    spec = case.spec
    n = next(iter(case.variants.values())).num_requests
    title = f"### {spec.name}: {spec.label}, {n:,} requests"
    lines = [
        title,
        "",
        f"Trace `{case.trace.name if spec.generated else case.trace}`; "
        f"{_runs(len(next(iter(case.variants.values())).samples))} each, median (min). "
        + _setup_line(case),
        "",
        "| simulator | wall s (process) | simulate() s | req / wall-s | req / simulate-s "
        "| peak RSS MB | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    stats = {name: variant_stats(v) for name, v in case.variants.items()}
    for st in stats.values():
        lines.append(
            f"| {st['label']} | {_f(st['wall_s_median'])} ({_f(st['wall_s_min'])}) "
            f"| {_f(st['sim_s_median'])} ({_f(st['sim_s_min'])}) "
            f"| {_f(st['req_per_wall_s'], 0)} | {_f(st['req_per_sim_s'], 0)} "
            f"| {_f(st['peak_rss_mb_median'], 0)} | {_f(st['cpu_s_median'])} |"
        )
    if "mocker" in stats:
        m = stats["mocker"]
        for name, st in stats.items():
            if name == "mocker":
                continue
            lines.append(
                f"| **{st['label']} / mocker** "
                f"| {_ratio(st['wall_s_median'], m['wall_s_median'])} "
                f"({_ratio(st['wall_s_min'], m['wall_s_min'])}) "
                f"| {_ratio(st['sim_s_median'], m['sim_s_median'])} "
                f"({_ratio(st['sim_s_min'], m['sim_s_min'])}) "
                f"| | | {_ratio(st['peak_rss_mb_median'], m['peak_rss_mb_median'])} "
                f"| {_ratio(st['cpu_s_median'], m['cpu_s_median'])} |"
            )
    elif case.mocker_skipped:
        lines.append("| mocker | not run (--mocker-max-requests, below) | | | | | |")
    if "servesim_step" in stats:
        ff, step = stats["servesim"], stats["servesim_step"]
        lines.append(
            "| **fast_forward=false / true** "
            f"| {_ratio(step['wall_s_median'], ff['wall_s_median'])} "
            f"| {_ratio(step['sim_s_median'], ff['sim_s_median'])} | | | "
            f"{_ratio(step['peak_rss_mb_median'], ff['peak_rss_mb_median'])} | |"
        )
    imports = stats["servesim"]["import_s_median"]
    passes = stats["servesim"]["passes_s_median"]
    paired = paired_ratios(case)
    if len(paired) > 1:
        lines += [
            "",
            "Wall ratio servesim / mocker within each repetition: "
            + ", ".join(f"{r:.2f}x" for r in paired)
            + f" (median {statistics.median(paired):.2f}x).",
        ]
    split = paired_ratios(case, variant="servesim_parallel")
    if len(split) > 1:
        lines += [
            "",
            f"Wall ratio {case.variants['servesim_parallel'].label} / mocker within each "
            "repetition: "
            + ", ".join(f"{r:.2f}x" for r in split)
            + f" (median {statistics.median(split):.2f}x); its CPU time is every process's, "
            "its peak RSS the largest process's.",
        ]
    lines += [
        "",
        f"servesim's process wall includes {imports:.2f} s to import `model` (median)"
        + (
            f" and {passes:.2f} s to read `result.passes` after `simulate()` (`--read-passes`: "
            "the passes table is built on its first read, not by `simulate()`)."
            if passes is not None
            else "."
        ),
        "",
        "Answers (same in every run: " + agreement_stability(case) + "):",
        "",
    ]
    not_run = "mocker not run" + (f": {case.mocker_skipped}" if case.mocker_skipped else "")
    for row in case.agreement:
        if row["variant"] == "mocker":
            continue
        if "mocker_mean_ttft_ms" in row:
            verdict = "agree" if row["agree"] else "**DISAGREE**"
            lines.append(
                f"* {case.variants[row['variant']].label} vs mocker: mean TTFT "
                f"{row['mean_ttft_ms']:.6f} vs {row['mocker_mean_ttft_ms']:.6f} ms "
                f"(rel. diff {row['ttft_rel_diff']:+.1e}); completed "
                f"{row['completed_requests']:,} vs {row['mocker_completed_requests']:,} "
                f"(rel. diff {row['completed_rel_diff']:+.1e}): {verdict}"
            )
        else:
            lines.append(
                f"* {case.variants[row['variant']].label}: mean TTFT {row['mean_ttft_ms']:.6f} ms, "
                f"completed {row['completed_requests']:,} ({not_run})"
            )
    if case.mocker_kwargs.get("router_mode") == "kv_router" and "mocker" in case.variants:
        mocker_ttft = [s.summary.get("mean_ttft_ms") for s in case.variants["mocker"].samples]
        lines += [
            "",
            "The mocker's kv_router breaks cost ties with an unseeded random choice, so its "
            "runs differ from one another (servesim's tie-break is seeded); the check compares "
            "each side's first run. Mocker mean TTFT per run: "
            + ", ".join(f"{x:.3f}" for x in mocker_ttft if x is not None)
            + " ms.",
        ]
    return "\n".join(lines)


def agreement_stability(case: CaseResult) -> str:
    bad = [r["variant"] for r in case.agreement if not r["repeats_identical"]]
    return "yes" if not bad else "NO for " + ", ".join(bad)


def overview_markdown(cases: Sequence[CaseResult]) -> str:
    lines = [
        "| case | requests | servesim wall s | mocker wall s | wall ratio | servesim simulate() s "
        "| mocker call s | simulate ratio | CPU ratio | servesim req / wall-s "
        "| mocker req / wall-s | servesim RSS MB | mocker RSS MB | RSS ratio "
        "| mean TTFT rel. diff | completed equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    skipped = []
    for c in cases:
        s = variant_stats(c.variants["servesim"])
        m = variant_stats(c.variants["mocker"]) if "mocker" in c.variants else None
        ag = next(r for r in c.agreement if r["variant"] == "servesim")
        ttft = ag.get("ttft_rel_diff")
        completed = "-"
        if "completed_rel_diff" in ag:
            completed = "yes" if ag["completed_rel_diff"] == 0 else "no"
        name = c.spec.name
        if c.mocker_skipped:
            skipped.append(c)
            name += " *"
        lines.append(
            f"| {name} | {s['num_requests']:,} | {_f(s['wall_s_median'])} "
            f"| {_f(m['wall_s_median']) if m else '-'} "
            f"| {_ratio(s['wall_s_median'], m['wall_s_median']) if m else '-'} "
            f"| {_f(s['sim_s_median'])} | {_f(m['sim_s_median']) if m else '-'} "
            f"| {_ratio(s['sim_s_median'], m['sim_s_median']) if m else '-'} "
            f"| {_ratio(s['cpu_s_median'], m['cpu_s_median']) if m else '-'} "
            f"| {_f(s['req_per_wall_s'], 0)} | {_f(m['req_per_wall_s'], 0) if m else '-'} "
            f"| {_f(s['peak_rss_mb_median'], 0)} | {_f(m['peak_rss_mb_median'], 0) if m else '-'} "
            f"| {_ratio(s['peak_rss_mb_median'], m['peak_rss_mb_median']) if m else '-'} "
            f"| {'-' if ttft is None else f'{ttft:+.1e}'} | {completed} |"
        )
    if skipped:
        lines.append("")
        lines += [f"\\* mocker not run on {c.spec.name}: {c.mocker_skipped}." for c in skipped]
    return "\n".join(lines)


def _exponent(t0: float | None, t1: float | None, n0: int, n1: int) -> str:
    """log(t1 / t0) / log(n1 / n0): how time grows between two sizes (1.00 = linearly)."""
    if not t0 or not t1 or n1 == n0:
        return "-"
    return f"{math.log(t1 / t0) / math.log(n1 / n0):.2f}"


def scaling_markdown(cases: Sequence[CaseResult], workers: int) -> str:
    """One table over the --scale cases on `workers` workers, smallest trace first."""
    rows = sorted(
        (c for c in cases if c.spec.name.startswith("scale-") and c.spec.workers == workers),
        key=lambda c: c.spec.generated,
    )
    lines = [
        f"#### Scaling with the number of requests, {workers} workers",
        "",
        "Generated traces (`--scale`), medians. Time grows linearly with requests when req / s "
        "stays the same from size to size; *growth* is log(time ratio) / log(request ratio) "
        "against the previous size (1.00 = linear, 2.00 = quadratic).",
        "",
        "| requests | input tokens | simulated s | passes | servesim simulate() s "
        "| servesim req / simulate-s | growth | servesim wall s | servesim req / wall-s "
        "| servesim peak RSS MB | mocker call s | mocker req / call-s | growth | mocker wall s "
        "| mocker req / wall-s | mocker peak RSS MB | simulate ratio | wall ratio | RSS ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|---:|",
    ]
    prev: tuple[int, dict[str, Any], dict[str, Any] | None] | None = None
    for c in rows:
        n = c.spec.generated
        s = variant_stats(c.variants["servesim"])
        m = variant_stats(c.variants["mocker"]) if "mocker" in c.variants else None
        summary = c.variants["servesim"].samples[0].summary
        ts = c.trace_stats or {}
        grow_s = grow_m = "-"
        if prev is not None:
            n0, s0, m0 = prev
            grow_s = _exponent(s0["sim_s_median"], s["sim_s_median"], n0, n)
            if m and m0:
                grow_m = _exponent(m0["sim_s_median"], m["sim_s_median"], n0, n)
        prev = (n, s, m)
        not_run = "not run" if c.mocker_skipped else "-"
        lines.append(
            f"| {n:,} | {ts.get('total_input_tokens', 0) / 1e6:,.1f} M "
            f"| {_f((summary.get('duration_ms') or 0) / 1000, 0)} "
            f"| {summary.get('n_passes') or 0:,} "
            f"| {_f(s['sim_s_median'])} | {_f(s['req_per_sim_s'], 0)} | {grow_s} "
            f"| {_f(s['wall_s_median'])} | {_f(s['req_per_wall_s'], 0)} "
            f"| {_f(s['peak_rss_mb_median'], 0)} "
            + (
                f"| {_f(m['sim_s_median'])} | {_f(m['req_per_sim_s'], 0)} | {grow_m} "
                f"| {_f(m['wall_s_median'])} | {_f(m['req_per_wall_s'], 0)} "
                f"| {_f(m['peak_rss_mb_median'], 0)} "
                f"| {_ratio(s['sim_s_median'], m['sim_s_median'])} "
                f"| {_ratio(s['wall_s_median'], m['wall_s_median'])} "
                f"| {_ratio(s['peak_rss_mb_median'], m['peak_rss_mb_median'])} |"
                if m
                else f"| {not_run} | | | | | | | | |"
            )
        )
    for c in rows:
        if c.mocker_skipped:
            lines += ["", f"Mocker not run at {c.spec.generated:,} requests: {c.mocker_skipped}."]
    target = next((c for c in rows if c.spec.generated == MEMORY_TARGET_REQUESTS), None)
    if target is not None and workers == MEMORY_TARGET_WORKERS:
        rss = variant_stats(target.variants["servesim"])["peak_rss_mb_max"]
        verdict = "met" if rss < MEMORY_TARGET_MB else "**missed**"
        lines += [
            "",
            f"Issue 8's memory target, a {MEMORY_TARGET_REQUESTS:,}-request trace on "
            f"{MEMORY_TARGET_WORKERS} workers under 2 GB ({MEMORY_TARGET_MB:,.0f} MB): servesim's "
            f"largest peak RSS {rss:,.0f} MB, {verdict} (reported, not asserted).",
        ]
    return "\n".join(lines)


def render(
    results: Sequence[CaseResult], profiles: Sequence[dict[str, Any]], env_info: dict[str, Any]
) -> str:
    parts = [
        "## servesim vs mocker: replay speed and memory",
        "",
        f"`{env_info['command']}`",
        "",
        f"servesim {revision(env_info)} (Python {env_info['python']}), mocker "
        f"ai-dynamo-runtime {env_info['mocker_version'] or '-'}; {env_info['cpu']} x "
        f"{env_info['cpu_count']}, {env_info['mem_total_gb']:.0f} GB RAM; load average at start "
        f"{env_info['loadavg_start']}, at end {env_info['loadavg_end']}. Medians of "
        f"{_runs(env_info['repeat'])}; ratio = servesim / mocker (below 1 would mean servesim is "
        "faster / smaller).",
        "",
    ]
    if "error" in env_info:
        first = env_info["error"].splitlines()[0]
        parts += [f"**The run stopped early** ({first}); the cases below are those that ended.", ""]
    if results:
        parts += [overview_markdown(results), ""]
        scale_workers = sorted(
            {c.spec.workers for c in results if c.spec.name.startswith("scale-")}
        )
        for w in scale_workers:
            parts += [scaling_markdown(results, w), ""]
        for case in results:
            parts += [case_markdown(case), ""]
            if case.trace_stats:
                ts = case.trace_stats
                parts += [
                    f"Generated trace: {ts['requests']:,} requests over {ts['span_s']:,.0f} s, "
                    f"input mean {ts['input_mean']:,.0f} / std {ts['input_std']:,.0f} / median "
                    f"{ts['input_median']:,.0f} tokens, output mean {ts['output_mean']:,.0f} / "
                    f"std {ts['output_std']:,.0f}, {ts['total_input_tokens']:,} input tokens, "
                    f"{ts['bytes'] / 1e6:,.1f} MB.",
                    "",
                ]
    for profile in profiles:
        parts += [profile_markdown(profile), ""]
    return "\n".join(parts).rstrip()


def to_json(
    results: Sequence[CaseResult], profiles: Sequence[dict[str, Any]], env_info: dict[str, Any]
) -> dict[str, Any]:
    cases = []
    for c in results:
        variants = {}
        for name, v in c.variants.items():
            variants[name] = {
                **variant_stats(v),
                "samples": [
                    {
                        "wall_s": s.wall_s,
                        "sim_s": s.sim_s,
                        "peak_rss_mb": s.peak_rss_mb,
                        "cpu_s": s.cpu_s,
                        "import_s": s.import_s,
                        "passes_s": s.passes_s,
                        "mean_ttft_ms": s.summary.get("mean_ttft_ms"),
                        "completed_requests": s.summary.get("completed_requests"),
                    }
                    for s in v.samples
                ],
                "summary": {
                    k: v.samples[0].summary.get(k)
                    for k in REPORTED_KEYS
                    if k in v.samples[0].summary
                },
            }
        ratios = {}
        if "mocker" in variants:
            m = variants["mocker"]
            for name, st in variants.items():
                if name != "mocker":
                    ratios[name] = {
                        key: st[key] / m[key]
                        for key in (
                            "wall_s_median",
                            "wall_s_min",
                            "sim_s_median",
                            "sim_s_min",
                            "peak_rss_mb_median",
                            "cpu_s_median",
                        )
                    }
        cases.append(
            {
                "case": c.spec.name,
                "label": c.spec.label,
                "trace": str(c.trace),
                "workers": c.spec.workers,
                "shape": c.shape,
                "pd": c.spec.pd,
                "overrides": list(c.spec.overrides),
                "generated_trace": c.trace_stats,
                "mocker_kwargs": c.mocker_kwargs,
                "mocker_skipped": c.mocker_skipped,
                "variants": variants,
                "ratios_servesim_over_mocker": ratios,
                "wall_ratios_per_repeat": paired_ratios(c),
                "agreement": c.agreement,
                "loadavg_per_repeat": c.loadavg,
            }
        )
    return {
        "environment": env_info,
        "cases": cases,
        "profiles": list(profiles),
        "profile": profiles[0] if profiles else None,  # the first, as before several cases
    }
