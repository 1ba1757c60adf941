"""Two states of the code on the same cases, interleaved: simulate() CPU time of each, source
and native build, and a digest of the tables (equal digests: the same answers).

    .venv/bin/python benchmarks/ab_commits.py --base ../servesim-base --rounds 3 \\
        --case conv4=../shared/traces/conversation_trace.jsonl:4 \\
        --case synth100k=/tmp/servesim_bench_traces/mooncake_100000_seed0_3a962bd47c36.jsonl:2

`--base DIR` is a checkout of the earlier state (from before the `servesim` package: its
`model/` folder is imported from DIR); the later state is the `servesim` this interpreter has
installed. An earlier state that is a `servesim` package too runs in an environment of its
own, `--base-python` (`python -m venv ENV && ENV/bin/pip install -e 'DIR[native]'`), imported
as the later state is. Each run is a fresh child process (one case, one state, one code kind),
in the order base, head, base, head, ... within each round, so drifts in the machine's load hit
both alike. Cases are composed as experiments/compare_dynamo.py composes them
(experiment=dynamo_compat, workload=mooncake, round robin), or, for `NAME=default`, the
default config (its synthetic workload), plus every `--override`. With
`--native`, each state also runs its native build (built first if missing: SERVESIM_NATIVE_DIR
keeps them apart).
Prints a table per case and code: the median CPU seconds of each state, the median of the
head / base ratios within each round (each pair ran back to back), the ratio of the fastest
runs, and whether every run's tables were the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import hashlib, json, sys, time
base, trace, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
overrides = ["experiment=dynamo_compat", "workload=mooncake", f"workload.path={trace}",
             f"topology.num_workers={workers}", "output.progress=off", *sys.argv[4:]]
if trace == "-":  # the default config (its synthetic workload)
    overrides = ["output.progress=off", *sys.argv[4:]]
if base:  # the earlier state: its model/ and conf/ folders
    sys.path.insert(0, base)
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    import model as pkg
    with initialize_config_dir(config_dir=base + "/conf", version_base="1.3"):
        data = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
    cfg = pkg.validate_config(data)
    code = pkg.native.ACTIVE
else:
    import servesim as pkg
    cfg = pkg.compose(overrides)
    code = pkg.native.ACTIVE
simulate = pkg.simulate  # (the later state imports the model on first use: not timed)
start = time.process_time()
result = simulate(cfg)
cpu_s = time.process_time() - start
# (the per-request TPOT column is compared under its earlier name, itl_ms)
requests = result.requests.rename(columns={"tpot_ms": "itl_ms"})
digest = hashlib.sha1(requests.to_csv().encode() + result.kv.to_csv().encode()).hexdigest()[:12]
print(json.dumps({"cpu_s": cpu_s, "digest": digest, "code": code,
                  "completed": result.summary["completed_requests"]}))
"""


def _env(state: str, native: bool, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SERVESIM_NATIVE_DIR"] = str(cache / state)
    if state == "base":  # the earlier state used a build whenever one existed
        env["SERVESIM_NATIVE"] = "1" if native else "0"
    elif native:
        env["SERVESIM_NATIVE"] = "1"
    else:
        env.pop("SERVESIM_NATIVE", None)
    return env


def _build(state: str, base: Path, cache: Path, base_python: Path | None = None) -> None:
    env = _env(state, False, cache)
    env["SERVESIM_NATIVE"] = "0"
    if state == "base" and base_python is not None:
        env["SERVESIM_NATIVE"] = "0"
        cmd = [str(base_python.parent / "servesim-native"), "build"]
    elif state == "base":
        cmd = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
               "from model.native import main; sys.exit(main(['build']))", str(base)]  # fmt: skip
    else:
        cmd = [str(Path(sys.executable).parent / "servesim-native"), "build"]
    subprocess.run(cmd, check=True, env=env, cwd=base if state == "base" else None)


def run_one(
    state: str,
    base: Path,
    trace: str,
    workers: int,
    native: bool,
    cache: Path,
    base_python: Path | None = None,
    overrides: list[str] | None = None,
) -> dict:
    python, base_arg = sys.executable, str(base) if state == "base" else ""
    env = _env(state, native, cache)
    if state == "base" and base_python is not None:  # a package of its own: imported as such
        python, base_arg = str(base_python), ""
        if native:
            env["SERVESIM_NATIVE"] = "1"
        else:
            env.pop("SERVESIM_NATIVE", None)
    proc = subprocess.run(
        [python, "-c", CHILD, base_arg, trace, str(workers), *(overrides or [])],
        capture_output=True,
        text=True,
        env=env,
        cwd=base if state == "base" else None,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{state} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="checkout of the earlier state")
    ap.add_argument(
        "--base-python", type=Path, help="interpreter with the earlier state installed (a package)"
    )
    ap.add_argument(
        "--override", action="append", default=[], help="a config override for every run"
    )
    ap.add_argument(
        "--case", action="append", required=True, help="NAME=TRACE:WORKERS or NAME=default"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--native", action="store_true", help="also time each native build")
    ap.add_argument("--cache", type=Path, default=Path(".ab-native"), help="native builds")
    ap.add_argument("--out", type=Path, help="write every run as JSON")
    args = ap.parse_args(argv)
    cases = []
    for spec in args.case:
        name, _, rest = spec.partition("=")
        if rest == "default":
            cases.append((name, "-", 1))
            continue
        trace, _, workers = rest.rpartition(":")
        cases.append((name, str(Path(trace).resolve()), int(workers)))
    kinds = [False, True] if args.native else [False]
    if args.native:
        for state in ("base", "head"):
            _build(state, args.base.resolve(), args.cache.resolve(), args.base_python)
    runs: list[dict] = []
    for r in range(args.rounds):
        for name, trace, workers in cases:
            for native in kinds:
                for state in ("base", "head"):
                    out = run_one(
                        state,
                        args.base.resolve(),
                        trace,
                        workers,
                        native,
                        args.cache.resolve(),
                        args.base_python,
                        args.override,
                    )
                    out.update(case=name, state=state, native=native, round=r)
                    runs.append(out)
                    print(json.dumps(out), flush=True)
    print()
    print(
        "| case | code | base CPU s (median) | head CPU s (median) | head / base, paired "
        "(median) | head / base, fastest | same tables |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    for name, _, _ in cases:
        for native in kinds:
            sel = [x for x in runs if x["case"] == name and x["native"] is native]
            b = [x["cpu_s"] for x in sel if x["state"] == "base"]
            h = [x["cpu_s"] for x in sel if x["state"] == "head"]
            same = len({x["digest"] for x in sel}) == 1
            mb, mh = statistics.median(b), statistics.median(h)
            paired = statistics.median(hr / br for br, hr in zip(b, h, strict=True))
            code = "native" if native else "source"
            print(
                f"| {name} | {code} | {mb:.2f} | {mh:.2f} | {paired:.3f} | "
                f"{min(h) / min(b):.3f} | {same} |"
            )
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
