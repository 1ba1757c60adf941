"""The `servesim` command: Hydra composes conf/, the model validates and runs it.

    servesim                                    # the shipped default, prints its summary
    servesim experiment=dynamo_compat workload=mooncake workload.path=TRACE \\
        topology.num_workers=4 hydra.run.dir=OUT
    servesim --multirun topology.num_workers=1,2,4

This is the only module that imports Hydra. Bad config or trace input exits with status 2 and
one message naming the config path or the file and line.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from model import native
from model.config.load import ConfigError, validate_config
from model.sim import simulate
from model.workload.errors import TraceError

ROWS = (
    ("TTFT", "ttft"),
    ("TTST", "ttst"),
    ("TPOT", "tpot"),
    ("ITL", "itl"),
    ("E2E", "e2e_latency"),
)


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:,.2f}"


def format_summary(summary: dict[str, Any]) -> str:
    """A short table of the run's latency distributions, throughput and counts."""
    lines = [f"{'metric (ms)':<12}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}{'max':>12}"]
    for label, key in ROWS:
        lines.append(
            f"{label:<12}"
            + "".join(
                f"{_fmt(summary.get(f'{s}_{key}_ms')):>12}"
                for s in ("mean", "median", "p90", "p99", "max")
            )
        )
    counts = summary.get("terminal_status_counts", {})
    not_arrived = summary.get("not_arrived_requests", 0)
    lines += [
        "",
        f"requests     {sum(counts.values()):,}: "
        + ", ".join(f"{v:,} {k}" for k, v in counts.items())
        + (f" ({not_arrived:,} of them never arrived)" if not_arrived else ""),
        f"duration     {summary['duration_ms'] / 1000:,.1f} s simulated in "
        f"{summary['wall_time_ms'] / 1000:,.2f} s wall",
        f"throughput   {summary['request_throughput_rps']:,.3f} req/s, "
        f"{summary['output_throughput_tok_s']:,.1f} output tok/s, "
        f"{summary['total_throughput_tok_s']:,.1f} total tok/s",
        f"prefix reuse {summary['prefix_cache_reused_ratio']:.4f} of input tokens",
    ]
    if "total_trajectories" in summary:  # an agentic replay
        lines.append(
            f"plays        {summary['total_trajectories']:,}: "
            + ", ".join(
                f"{summary[f'{k}_trajectories']:,} {k}" for k in ("completed", "incomplete")
            )
            + f" ({summary['failed_trajectories']:,} of them failed)"
        )
    return "\n".join(lines)


def run(cfg: DictConfig, out_dir: str) -> dict[str, Any]:
    """Validate a composed config, simulate it, write the run directory; returns the summary."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config: {e}") from None
    assert isinstance(data, dict)
    data.pop("hydra", None)
    result = simulate(validate_config({str(k): v for k, v in data.items()}))
    result.write(out_dir)
    return result.summary


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
def main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(cfg, out_dir)
    except (ConfigError, TraceError) as e:
        print(f"servesim: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_summary(summary))
    print(f"outputs      {out_dir}")
    # which code ran: the source, or its compiled build (`servesim-native build`)
    print(f"code         {'native build ' + native.ACTIVE if native.ACTIVE else 'Python source'}")


if __name__ == "__main__":
    main()
