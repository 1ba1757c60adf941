"""Write a generated agentic workload as an agentic Mooncake v2 file, so another simulator (e.g.
Dynamo's mocker) can replay exactly the plays servesim replays.

    python experiments/agentic_trace.py --out plays.jsonl
    python experiments/agentic_trace.py --out plays.jsonl workload.num_plays=200 seed=3

Arguments after the options are Hydra overrides of `conf/` (`workload=agentic_synthetic` is
applied first); the graph is the one `simulate` would replay for that config and seed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from model import validate_config
from model.config.schema import AgenticSyntheticWorkload
from model.sim import random_streams
from model.workload.agentic import write_agentic_v2
from model.workload.agentic_synthetic import generate_agentic

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the v2 file to write")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload.num_plays=200")
    args = ap.parse_args(argv)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose("config", overrides=["workload=agentic_synthetic", *args.overrides])
    data = OmegaConf.to_container(composed, resolve=True)
    cfg = validate_config(cast(dict[str, Any], data))
    workload = cfg.workload
    assert isinstance(workload, AgenticSyntheticWorkload)
    # the same generator stream simulate() hands the generator
    graph = generate_agentic(workload, random_streams(cfg.seed)["lengths"])
    write_agentic_v2(graph, args.out, model=cfg.llm.name)
    print(f"{args.out}: {len(graph.plays)} plays, {len(graph.nodes)} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
