"""The three engines on one trace: TTFT, TPOT, inter-token gaps and KV use of vLLM, SGLang and
TRT-LLM.

    python experiments/engines_figure.py [--trace TRACE.jsonl] [--max-requests N]
        [--kv-tokens T] [--out PNG] [HYDRA_OVERRIDE ...]

It replays the first N requests (default 1,500) of a Mooncake trace (default:
conversation_trace.jsonl in $SERVESIM_SHARED_TRACES, else in ../shared/traces beside the
checkout) on 4 aggregated Llama-3.1-8B / H100 workers with polynomial timing, once per engine
(`engine=vllm`, `sglang`, `trtllm`, each with its option file's defaults). Every rank gets the
same KV, T tokens (default 262,144): `engine.num_gpu_blocks` is T / the engine's block size,
so 4,096 blocks of 64 tokens for vLLM, 262,144 pages of 1 token for SGLang and 8,192 blocks of
32 tokens for TRT-LLM (the same count for all three would give SGLang a pool 64 times smaller).
Token times are kept (`output.per_token=true`) so every inter-token gap can be drawn.

It draws the three runs with `servesim.metrics.plots.latency_comparison` (TTFT and TPOT CDFs,
the tail of the pooled inter-token gaps) into PNG (default docs/img/engines.png), the KV in use
on worker 0 over time into PNG's name with `_kv` (docs/img/engines_kv.png), and prints a
markdown table: completed requests, TTFT percentiles, mean TPOT, p99 and longest inter-token
gap, preemptions (SGLang: retractions) and passes by kind. The defaults take about 30 s.

Exit status: 0, or 2 for bad arguments or a config servesim refuses.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

from servesim import Result, compose, simulate
from servesim.config.errors import ConfigError
from servesim.metrics.plots import latency_comparison, pass_kind

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "sglang", "trtllm")
BLOCK_SIZE = {"vllm": 64, "sglang": 1, "trtllm": 32}  # each option file's block_size
CLUSTER = ["llm=llama3_8b", "hardware=h100_sxm", "timing=polynomial", "topology.num_workers=4"]


def default_trace() -> Path:
    """conversation_trace.jsonl in $SERVESIM_SHARED_TRACES, else in ../shared/traces beside
    the checkout."""
    beside = REPO.parent / "shared" / "traces"
    return Path(os.environ.get("SERVESIM_SHARED_TRACES", beside)) / "conversation_trace.jsonl"


def run_engine(
    engine: str, trace: Path, max_requests: int, kv_tokens: int, extra: list[str]
) -> Result:
    """One replay of the trace's first `max_requests` rows with `engine`, `kv_tokens` of KV per
    rank."""
    blocks = kv_tokens // BLOCK_SIZE[engine]
    overrides = [
        f"engine={engine}",
        f"engine.num_gpu_blocks={blocks}",
        *CLUSTER,
        "workload=mooncake",
        f"workload.path={trace}",
        f"workload.max_requests={max_requests}",
        "output.per_token=true",
        "output.progress=off",
        *extra,
    ]
    return simulate(compose(overrides))


def table(results: dict[str, Result], wall_s: dict[str, float]) -> pd.DataFrame:
    """One row per engine: what the figure shows, in numbers."""
    rows = []
    for engine, result in results.items():
        s = result.summary
        kinds = pd.Series(pass_kind(result.passes)).value_counts()
        rows.append(
            {
                "engine": engine,
                "completed": s["completed_requests"],
                "ttft_p50_ms": s["median_ttft_ms"],
                "ttft_p90_ms": s["p90_ttft_ms"],
                "ttft_p99_ms": s["p99_ttft_ms"],
                "tpot_mean_ms": s["mean_tpot_ms"],
                "itl_p99_ms": s["p99_itl_ms"],
                "itl_max_ms": s["max_itl_ms"],
                "preemptions": s["n_preemptions"],
                "mixed_passes": int(kinds.get("mixed", 0)),
                "prefill_only_passes": int(kinds.get("prefill-only", 0)),
                "wall_s": wall_s[engine],
            }
        )
    return pd.DataFrame(rows)


def plot(results: dict[str, Result], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = latency_comparison(results)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_kv(results: dict[str, Result], kv_tokens: int, path: Path, title: str) -> Path:
    """KV use over the run: the tokens of KV in use on worker 0 at each pass end, per engine
    (blocks x the engine's block size, so the three share one axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(15, 3.2), layout="constrained")
    for engine, result in results.items():
        p = result.passes
        p = p[p.worker == 0]
        ax.step(
            p.end_ms.to_numpy() / 1000,
            p.kv_used_blocks.to_numpy() * BLOCK_SIZE[engine] / kv_tokens * 100,
            where="post",
            label=engine,
            linewidth=0.8,
        )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV in use, worker 0 (%)")
    ax.set_ylim(0, 105)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", type=Path, help="Mooncake JSONL trace (default: conversation)")
    ap.add_argument("--max-requests", type=int, default=1500, help="replay the first N rows")
    ap.add_argument("--kv-tokens", type=int, default=262_144, help="KV tokens per rank")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "engines.png")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args(argv)
    trace = args.trace or default_trace()
    if not trace.is_file():
        ap.error(f"no trace at {trace} (give --trace, or set SERVESIM_SHARED_TRACES)")
    results: dict[str, Result] = {}
    wall_s: dict[str, float] = {}
    for engine in ENGINES:
        t0 = time.perf_counter()
        try:
            results[engine] = run_engine(
                engine, trace, args.max_requests, args.kv_tokens, args.overrides
            )
        except (ConfigError, ValueError) as e:
            print(f"engines_figure: engine={engine}: {e}", file=sys.stderr)
            return 2
        wall_s[engine] = round(time.perf_counter() - t0, 1)
    title = (
        f"{trace.name}, first {args.max_requests:,} requests, 4 workers, "
        f"{args.kv_tokens:,} KV tokens per worker"
    )
    plot(results, args.out, title)
    kv_out = args.out.with_name(f"{args.out.stem}_kv{args.out.suffix}")
    plot_kv(results, args.kv_tokens, kv_out, title)
    print(table(results, wall_s).to_markdown(index=False, floatfmt=".1f"))
    print(f"\nwrote {args.out} and {kv_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
