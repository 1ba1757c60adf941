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

from servesim import compose
from servesim.config.schema import AgenticSyntheticWorkload
from servesim.sim import random_streams
from servesim.workload.agentic import write_agentic_v2
from servesim.workload.agentic_synthetic import generate_agentic


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the v2 file to write")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload.num_plays=200")
    args = ap.parse_args(argv)
    cfg = compose(["workload=agentic_synthetic", *args.overrides])
    workload = cfg.workload
    assert isinstance(workload, AgenticSyntheticWorkload)
    # the same generator stream simulate() hands the generator
    graph = generate_agentic(workload, random_streams(cfg.seed)["lengths"])
    write_agentic_v2(graph, args.out, model=cfg.llm.name)
    print(f"{args.out}: {len(graph.plays)} plays, {len(graph.nodes)} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
