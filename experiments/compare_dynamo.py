"""Compare servesim with NVIDIA Dynamo's mocker (offline trace replay) on the same traces.

For every trace x cluster shape this runs

* servesim: `model.simulate` on a RunConfig composed from conf/ with Hydra's compose API
  (`experiment=dynamo_compat workload=mooncake workload.path=TRACE output.progress=off`, the
  shape -- `topology.num_workers=N`, or `topology=disagg topology.num_prefill_workers=P
  topology.num_decode_workers=D` -- and every `--override`), and
* the mocker: `dynamo._core.run_mocker_trace_replay([TRACE], ...)` with the settings
  translated from that same RunConfig (`mocker_kwargs`): the engine block (num_gpu_blocks,
  block_size, max_num_seqs, max_num_batched_tokens, prefix caching, chunked prefill,
  max_model_len, speed-up ratios, preemption mode) and the timing model (polynomial or fixed);
  the workload's trace_block_size, the load's arrival_speedup_ratio or concurrency and the
  stop time become keyword arguments.
  - Aggregated workers: `num_workers` and `extra_engine_args={"engine": {...},
    "tensor_parallel_size": tp}` (plus `dp_size` when it is not 1).
  - Prefill/decode disaggregation (`--pd PxD`, or `--override topology=disagg ...`):
    `num_prefill_workers`, `num_decode_workers`, and `prefill_engine_args` /
    `decode_engine_args` built from servesim's per-role engines
    (`servesim.config.derived.role_engines`: `engine` with `topology.prefill.*` /
    `topology.decode.*`), each `{"engine": {..., "worker_type": ROLE}, "dp_size": dp,
    "tensor_parallel_size": tp}`. The link goes on the prefill args, the only ones the mocker
    reads it from: `kv_transfer_bandwidth` (link.bandwidth_gbps, decimal GB/s; null = instant),
    `kv_bytes_per_token` (link.kv_bytes_per_token, or the llm geometry: 131072 for
    Llama-3.1-8B) and `kv_transfer_timing_mode` (link.timing_mode). No `extra_engine_args`.

  - router=kv: `router_mode="kv_router"`, `router_config` (a `KvRouterConfig` built from
    servesim's router.* knobs: overlap_score_credit, prefill_load_scale, host/disk hit
    weights, decode_active_request_weight, router_temperature, router_queue_threshold,
    router_queue_policy) and `kv_event_lag_ms`; round_robin: `router_mode="round_robin"`.

  - workload=agentic_mooncake (`--override workload=agentic_mooncake`): `trace_format=
    "agentic_mooncake"`, `agentic_lanes` and `execution_model` (llm.name); lanes must use
    `workload.agentic_lane_assignment=shared_queue`, the default (the mocker's lanes take the
    next unstarted play; stride is refused), and snapshots, warmup and profiles have no offline
    counterpart there.

  A setting the mocker cannot express stops the run (exit status 2): another timing model or
  polynomial coefficients, a random router, session affinity (router.affinity.mode), a
  workload other than mooncake / agentic_mooncake, a rate load; in P/D also
  link.latency_ms > 0 (e.g. link=infiniband), link.contention other than per_request,
  link.state_bytes > 0 and per-pair links (link.pairs).

and prints, per case, servesim's value, the mocker's value and their difference for: mean,
median and p90 of TTFT, ITL, TPOT and E2E latency; request, output and total throughput; prefix
cache reuse; duration; completed requests; prefill and decode worker-seconds and GPU hours.
Targets: latencies within 2 % (relative), throughputs, duration, completed requests,
worker-seconds and GPU hours within 1 % (relative), prefix reuse within 0.01 (absolute). The
mocker's ITL percentiles come from a DDSketch (0.1 % error); servesim's are exact. Each side's
wall time (the simulate / replay call alone) and their ratio are reported. With
`--per-request` every servesim request (as servesim's requests.jsonl writer renders it) is
also joined with the mocker's per-request records (`report_jsonl_path`) and the differences
are counted (informational): arrival, first-token and terminal times, and in P/D the
lifecycle (prefill_admit_ms, source_held_ms, destination_reserved_ms,
destination_activated_ms, decode_admit_ms, source_released_ms) to 1e-7 ms; reused tokens and
output lengths; prefill and decode worker ids (scheduler ids, worker x dp_size + rank); the
terminal status (servesim `rejected` = mocker `failed` for a prompt no decode rank can hold).

The mocker is imported if `dynamo._core` is importable here; otherwise it runs in its own
interpreter (`--mocker-python`, default $SERVESIM_MOCKER_PYTHON: a virtual environment with
`pip install ai-dynamo-runtime==1.6.1`) through experiments/_mocker_runner.py, with JSON in and
out.

    python experiments/compare_dynamo.py --trace conversation_trace.jsonl,synthetic_trace.jsonl \\
        --workers 1,2,4 --out results.json --markdown table.md
    python experiments/compare_dynamo.py --trace T --override engine.num_gpu_blocks=4096 \\
        --override timing=fixed --override timing.prefill_ms=10
    python experiments/compare_dynamo.py --trace T --pd 1x1,2x2 --override link.bandwidth_gbps=25 \\
        --override topology.decode.num_gpu_blocks=4096 --per-request
    python experiments/compare_dynamo.py --trace T --override topology=disagg \\
        --override topology.num_prefill_workers=2 --override topology.num_decode_workers=2

Exit status: 0 if every target is met, 1 if any is missed, 2 on a configuration or run error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/ is not a package
# the pieces, by topic; the names other tools and the tests use are re-exported here
from compare_dynamo_cases import (  # noqa: E402
    BASE_OVERRIDES,
    Case,
    Shape,
    compose_run_config,
    parse_pd,
    run_case,
    run_servesim,
    shape_title,
)
from compare_dynamo_join import (  # noqa: E402
    COUNT_FIELDS,
    ID_FIELDS,
    METRICS,
    PD_TIME_FIELDS,
    STATUS_ALIASES,
    TARGETS,
    TIME_ABS_MS,
    TIME_FIELDS,
    TIME_REL,
    Kind,
    Metric,
    PerRequest,
    Row,
    compare,
    difference,
    join_records,
    per_request,
    same_status,
    servesim_records,
)
from compare_dynamo_mocker import (  # noqa: E402
    RUNNER,
    MockerRunner,
    UnsupportedConfig,
    choose_runner,
    mocker_kwargs,
)
from compare_dynamo_report import (  # noqa: E402
    HEADER,
    fmt_diff,
    fmt_target,
    fmt_value,
    markdown,
    text_table,
    wall_line,
    worst_per_metric,
)

__all__ = [
    "BASE_OVERRIDES",
    "COUNT_FIELDS",
    "HEADER",
    "ID_FIELDS",
    "METRICS",
    "PD_TIME_FIELDS",
    "REPO",
    "RUNNER",
    "STATUS_ALIASES",
    "TARGETS",
    "TIME_ABS_MS",
    "TIME_FIELDS",
    "TIME_REL",
    "Case",
    "Kind",
    "Metric",
    "MockerRunner",
    "PerRequest",
    "Row",
    "Shape",
    "UnsupportedConfig",
    "case_shapes",
    "choose_runner",
    "compare",
    "compose_run_config",
    "difference",
    "fmt_diff",
    "fmt_target",
    "fmt_value",
    "join_records",
    "main",
    "markdown",
    "mocker_kwargs",
    "parse_args",
    "parse_pd",
    "per_request",
    "run_case",
    "run_servesim",
    "same_status",
    "servesim_records",
    "shape_title",
    "text_table",
    "wall_line",
    "worst_per_metric",
]

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- CLI


def _split(values: Sequence[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--trace", action="append", required=True, help="Mooncake JSONL (repeatable, or a,b,c)"
    )
    ap.add_argument(
        "--workers",
        help="aggregated worker counts, e.g. 1,2,4 (default 1 unless --pd or "
        "--override topology=disagg is given)",
    )
    ap.add_argument(
        "--pd",
        help="prefill/decode disaggregation cases as PxD pool sizes, e.g. 1x1,2x2 (adds "
        "topology=disagg; the link and per-role engines come from the overrides, e.g. "
        "--override link.bandwidth_gbps=25 --override topology.decode.num_gpu_blocks=4096)",
    )
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override for servesim (repeatable); translated for the mocker too",
    )
    ap.add_argument("--out", type=Path, help="write every case (rows, summaries) as JSON")
    ap.add_argument("--markdown", type=Path, help="write the tables as Markdown")
    ap.add_argument(
        "--per-request",
        action="store_true",
        help="also join every request with the mocker's report_jsonl_path records and count "
        "differences (informational; the mocker's wall time then includes writing them)",
    )
    ap.add_argument(
        "--mocker-python",
        help="interpreter with dynamo._core when it is not importable here "
        "(default: $SERVESIM_MOCKER_PYTHON)",
    )
    return ap.parse_args(argv)


def case_shapes(workers: str | None, pd: str | None, overrides: Sequence[str]) -> list[Shape]:
    """The cluster shapes to run: `--workers` aggregated counts, then `--pd` P/D pools; with
    neither, 1 worker, or the P/D pools of `--override topology=disagg ...`."""
    disagg = "topology=disagg" in overrides
    shapes: list[Shape] = []
    if workers is not None:
        if disagg:
            raise ValueError(
                "--workers runs aggregated workers; with --override topology=disagg give the "
                "pools as --pd PxD (or topology.num_prefill_workers / num_decode_workers)"
            )
        try:
            shapes += [Shape(workers=int(w)) for w in _split([workers])]
        except ValueError:
            raise ValueError(f"--workers must be integers, got {workers!r}") from None
    if pd is not None:
        shapes += [parse_pd(x) for x in _split([pd])]
    if not shapes:
        shapes = [Shape()] if disagg else [Shape(workers=1)]
    return shapes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    given = _split(args.trace)
    traces = [Path(t).resolve() for t in given]
    names = [t.name for t in traces]
    labels = [n if names.count(n) == 1 else g for n, g in zip(names, given, strict=True)]
    try:
        shapes = case_shapes(args.workers, args.pd, args.override)
    except ValueError as e:
        print(f"compare_dynamo: {e}", file=sys.stderr)
        return 2
    try:
        runner = choose_runner(args.mocker_python)
        cases = []
        for trace, label in zip(traces, labels, strict=True):
            if not trace.is_file():
                raise FileNotFoundError(f"trace {trace} does not exist")
            for shape in shapes:
                case = run_case(trace, shape, args.override, runner, label, args.per_request)
                print(text_table(case) + "\n", flush=True)
                cases.append(case)
    except (RuntimeError, OSError, ValueError, HydraException, OmegaConfBaseException) as e:
        # ValueError covers UnsupportedConfig, servesim's ConfigError and TraceError
        print(f"compare_dynamo: {e}", file=sys.stderr)
        return 2
    ok = all(c.ok for c in cases)
    print(
        f"{sum(c.ok for c in cases)}/{len(cases)} cases met every target; mocker ran "
        f"{runner.describe()}"
    )
    if args.out:
        command = [Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]
        args.out.write_text(
            json.dumps(
                {
                    "command": command,
                    "mocker": runner.describe(),
                    "targets": TARGETS,
                    "all_targets_met": ok,
                    "cases": [c.to_json() for c in cases],
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    if args.markdown:
        args.markdown.write_text(markdown(cases, args.override))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
