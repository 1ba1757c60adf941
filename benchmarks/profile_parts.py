"""Own time of a servesim profile grouped by part of the model, as shares of the profiled time.

    .venv/bin/python benchmarks/profile_parts.py PROF [PROF ...]

PROF is a pstats file written by `bench_replay.py --profile-out` (one per profiled case). A
builtin (a `dict.get`, `list.extend`, ...) counts for the part of the caller that spent most
time in it. Prints one markdown row per file: the profiled seconds, then each part's share.
"""

from __future__ import annotations

import argparse
import pstats
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# part -> substrings of "file:function" that belong to it, first match wins
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("block pool (G1)", ("kv/block_pool.py", "speed/group_pool.py", "speed/group_keys.py")),
    ("prompt hashing", ("workload/hashing.py",)),
    (
        "trace reading",
        ("workload/mooncake.py", "workload/build.py", "workload/errors.py", "json/"),
    ),
    (
        "decode fast-forward and pricing",
        ("decode_stretch", "_decode_ends", "_record_stretch", "timing/", "pass_stretch"),
    ),
    ("scheduler", ("engine/vllm.py",)),
    ("worker loop", ("engine/worker.py", "workload/drivers.py")),
    ("KV router", ("router/",)),
    ("P/D handoff, links", ("cluster/", "kv/link.py")),
    ("recorder, tables, summary", ("metrics/", "pandas/", "pyarrow/", "numpy/")),
    ("SimPy", ("simpy/",)),
)
OTHER = "other"


def part_of(key: str) -> str:
    for name, patterns in PARTS:
        if any(p in key for p in patterns):
            return name
    return OTHER


def shares(path: str | Path) -> tuple[float, Counter[str]]:
    """(profiled seconds, own seconds by part) of one pstats file."""
    stats = pstats.Stats(str(path))
    by_part: Counter[str] = Counter()
    for (filename, _line, func), (_cc, _nc, tottime, _ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = f"{filename}:{func}"
        if filename == "~" and callers:  # a builtin: its costliest caller's part
            caller = max(callers.items(), key=lambda kv: kv[1][2])[0]
            key = f"{caller[0]}:{caller[2]}"
        by_part[part_of(key)] += tottime
    return stats.total_tt, by_part  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profiles", nargs="+", help="pstats files (bench_replay --profile-out)")
    args = parser.parse_args(argv)
    names = [name for name, _ in PARTS] + [OTHER]
    print("| profile | profiled s | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for path in args.profiles:
        total, by_part = shares(path)
        cells = [f"{100 * by_part[n] / total:.0f} %" if by_part[n] else "-" for n in names]
        print(f"| `{Path(path).name}` | {total:.2f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
