"""Recover the InferenceX deployment (workers, dp-attn, MTP, recipe) behind measured P/D rows.

The InferenceX DeepSeek-R1 rows of the silicon CSV keep each role's tp and ep but lost the worker
counts and the attention-DP flag. For each such row this reads `.github/configs/nvidia-master.yaml`
at the last commit at or before the row's `measured` time (runs start seconds after the push that
triggers them) or, if no entry fits there, at the next commit changing the file, and lists the
search-space entries that fit the row: same image (exact string: a `-runtime` tag is all that
tells the b200 fp4 SGLang STP runs from the MTP ones), model prefix, precision, GPU, framework,
isl/osl, concurrency, prefill tp/ep and decode tp. The measured TTFT/TPOT are never used.

    python experiments/inferencex_deployments.py --repo /path/to/InferenceX.git \\
        --silicon ../shared/data/silicon_dev.csv --out experiments/data/inferencex_deployments.csv

Decode ep is not compared (--match-decode-ep compares it): the CSV's decode_moe_ep_size is the
prefill ep on every row, where the configs often give these runs another (a dep8 decode behind a
tep8 prefill is recorded 8/8). A day-only `measured` (a date, or midnight to the millisecond as in
the 2026-04-06 export) stands for the whole day: its cutoff is 23:59:59Z of that day.

`match` is unique (one candidate), agreeing (several with identical deployment columns),
ambiguous (several that differ: deployment columns left empty) or none.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import NoReturn

import pandas as pd
import yaml

CONFIG_PATH = ".github/configs/nvidia-master.yaml"
MODEL_PREFIX = {"deepseek-ai/DeepSeek-R1": "dsr1"}
FRAMEWORK = {"sglang": "dynamo-sglang", "trtllm": "dynamo-trt"}
GPU = {"b200_sxm": "b200", "h100_sxm": "h100"}  # a token of the config name: gb200 is not b200
ROLES = ("prefill", "decode")
PARALLEL = ["isl", "osl"] + [f"{r}_{c}" for r in ROLES for c in ("tp_size", "moe_ep_size")]
SILICON_COLUMNS = ["id", "silicon_data_source", "backend", "system", "precision", "mode"]
SILICON_COLUMNS += ["model_path", *PARALLEL]
DEPLOYMENT = ["config_key", "recipe", "spec_decoding"] + [
    f"{r}_{c}" for r in ROLES for c in ("num_workers", "tp", "ep", "dp_attn")
]
KIND = {"spec_decoding": "mtp", "decode_ep": "decode ep"}  # what ambiguous candidates differ in
KIND |= {f"{r}_num_workers": "workers" for r in ROLES} | {f"{r}_dp_attn": "dp-attn" for r in ROLES}
CONFIG_FIELDS = ("image", "model-prefix", "precision", "framework")
OUT_COLUMNS = ["id", "measured", "commit", "commit_when", "n_candidates", "match", *DEPLOYMENT]
DAY_ONLY = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:T00:00:00(?:\.0+)?Z)?$")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_source(source: str) -> dict[str, str]:
    """The `key=value` fields of a `;`-separated silicon_data_source."""
    fields = (part.strip().partition("=") for part in str(source).split(";"))
    return {key: value for key, sep, value in fields if sep}


def load_rows(path: Path) -> pd.DataFrame:
    """Disagg rows of known models whose source gives silicon_concurrency, measured and image."""
    if not path.is_file():
        fail(f"{path}: no such silicon CSV")
    frame = pd.read_csv(path)
    missing = [c for c in SILICON_COLUMNS if c not in frame.columns]
    if missing:
        fail(f"{path}: expected silicon CSV columns {missing}")
    frame = frame[frame["mode"] == "disagg"]
    sources = frame["silicon_data_source"].map(parse_source)
    keep = sources.map(lambda s: {"silicon_concurrency", "measured", "image"} <= s.keys())
    keep = keep.astype(bool)  # (an empty selection maps to an object Series, not a mask)
    frame, sources = frame[keep].copy(), sources[keep]
    for field in ("measured", "image"):
        frame[field] = sources.map(lambda s, f=field: s[f])
    try:
        frame["concurrency"] = sources.map(lambda s: int(s["silicon_concurrency"]))
    except ValueError as err:
        fail(f"{path}: expected an integer silicon_concurrency in silicon_data_source: {err}")
    unknown = ~frame["model_path"].isin(MODEL_PREFIX)
    for model, count in frame.loc[unknown, "model_path"].value_counts().items():
        print(f"skipped {count} row(s) of {model}: no InferenceX model prefix for it")
    return frame[~unknown].sort_values("id")


def cutoff(measured: str) -> str:
    """The latest time a run stamped `measured` can have started."""
    day = DAY_ONLY.match(measured)
    return f"{day.group(1)}T23:59:59Z" if day else measured


def recipe(settings: dict) -> str:
    """The file name of a role's CONFIG_FILE setting."""
    for setting in settings.get("additional-settings") or []:
        key, _, value = str(setting).partition("=")
        if key.strip() == "CONFIG_FILE":
            return PurePosixPath(value.strip()).name
    return ""


def flatten(key: str, config: dict) -> list[dict]:
    """One dict per search-space entry of a top-level config."""
    shared = {f.replace("-", "_"): config.get(f) for f in CONFIG_FIELDS}
    shared |= {"config_key": key, "key_parts": key.split("-")}
    entries = []
    for seq in config.get("seq-len-configs") or []:
        for entry in seq.get("search-space") or []:
            roles = {r: entry.get(r) or {} for r in ROLES}
            spec = str(entry.get("spec-decoding", "none"))
            flat = shared | {"isl": seq.get("isl"), "osl": seq.get("osl")}
            flat |= {"conc": set(entry.get("conc-list") or []), "spec_decoding": spec}
            flat["recipe"] = recipe(roles["prefill"]) or recipe(roles["decode"])
            for r, fields in roles.items():
                flat |= {f"{r}_num_workers": fields.get("num-worker"), f"{r}_tp": fields.get("tp")}
                flat |= {f"{r}_ep": fields.get("ep"), f"{r}_dp_attn": fields.get("dp-attn")}
            entries.append(flat)
    return entries


class History:
    """nvidia-master.yaml along the checked-out history of an InferenceX clone."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.parsed: dict[str, list[dict]] = {}  # by blob id: each version of the file parses once
        self.git("rev-parse", "--git-dir")

    def git(self, *args: str) -> str:
        cmd = ["git", "-C", str(self.repo), *args]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            fail(f"{self.repo}: git {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def at_or_before(self, when: str) -> str:
        return self.git("log", "-1", "--format=%h", f"--until={when}")

    def after(self, when: str) -> str:
        """The first commit after `when` that changes the config file ('' if none)."""
        later = self.git("log", "--reverse", "--format=%h", f"--since={when}", "--", CONFIG_PATH)
        return later.split("\n")[0]

    def deployments(self, commit: str) -> list[dict]:
        """All disagg search-space entries of the config file at `commit`."""
        blob = self.git("rev-parse", f"{commit}:{CONFIG_PATH}")
        if blob not in self.parsed:
            where = f"{self.repo}: {CONFIG_PATH} at {commit}"
            try:
                configs = yaml.safe_load(self.git("cat-file", "blob", blob))
            except yaml.YAMLError as err:
                fail(f"{where}: expected YAML: {err}")
            if not isinstance(configs, dict):
                fail(f"{where}: expected a mapping of config names to configs")
            disagg = {k: v for k, v in configs.items() if isinstance(v, dict) and v.get("disagg")}
            self.parsed[blob] = [e for k, v in disagg.items() for e in flatten(k, v)]
        return self.parsed[blob]


def misses(row: pd.Series, entry: dict, decode_ep: bool) -> list[str]:
    """The criteria `entry` fails for `row` (none: it is a candidate)."""
    checks = {
        "image": entry["image"] == row["image"],
        "model": entry["model_prefix"] == MODEL_PREFIX[row["model_path"]],
        "precision": entry["precision"] == row["precision"],
        "gpu": GPU.get(row["system"]) in entry["key_parts"],
        "framework": entry["framework"] == FRAMEWORK.get(row["backend"]),
        "isl/osl": (entry["isl"], entry["osl"]) == (row["isl"], row["osl"]),
        "concurrency": row["concurrency"] in entry["conc"],
        "prefill tp/ep": (entry["prefill_tp"], entry["prefill_ep"])
        == (row["prefill_tp_size"], row["prefill_moe_ep_size"]),
        "decode tp": entry["decode_tp"] == row["decode_tp_size"],
        "decode ep": not decode_ep or entry["decode_ep"] == row["decode_moe_ep_size"],
    }
    return [name for name, ok in checks.items() if not ok]


def candidates(history: History, row: pd.Series, commit: str, decode_ep: bool) -> list[dict]:
    return [e for e in history.deployments(commit) if not misses(row, e, decode_ep)]


def resolve(history: History, row: pd.Series, decode_ep: bool) -> dict:
    """One output row: the commit read, the candidates and, if they settle it, the deployment."""
    when = cutoff(row["measured"])
    commit, how = history.at_or_before(when), "at_or_before"
    found = candidates(history, row, commit, decode_ep) if commit else []
    later = history.after(when) if not found else ""
    if later and (later_found := candidates(history, row, later, decode_ep)):
        commit, how, found = later, "after", later_found
    diff = [c for c in DEPLOYMENT if len({str(e[c]) for e in found}) > 1]
    match = "unique" if len(found) == 1 else "ambiguous" if diff else "agreeing"
    chosen = found[0] if found and not diff else {}
    entries = history.deployments(commit) if commit and not found else []
    near = {m[0] for e in entries if len(m := misses(row, e, decode_ep)) == 1}
    return {
        "id": row["id"],
        "measured": row["measured"],
        "commit": commit,
        "commit_when": how,
        "n_candidates": len(found),
        "match": match if found else "none",
        **{c: chosen.get(c, "") for c in DEPLOYMENT},
        "differs": "+".join(dict.fromkeys(KIND[c] for c in diff if c in KIND)) or "recipe",
        "only_miss": "" if found else "+".join(sorted(near)) or "several",
        "spec_set": "+".join(sorted({e["spec_decoding"] for e in found})),
        "found": found,
    }


def summarise(result: pd.DataFrame) -> None:
    """Print the matches, the after-commit use, and what ambiguous and repeated rows hold."""
    group = ["backend", "system", "precision"]
    print(pd.crosstab([result[c] for c in group], result["match"], margins=True).to_string())
    after, day_only = result["commit_when"] == "after", result["measured"].str.match(DAY_ONLY)
    print(f"\nafter-commit needed: {after.sum()} rows ({(after & day_only).sum()} day-only stamps)")
    for name, column in (("ambiguous", "differs"), ("none", "only_miss")):
        picked = result[result["match"] == name]
        if not picked.empty:
            print(f"\n{name}: what differs / the only criterion the nearest entries miss")
            print(picked.groupby(group + [column]).size().to_string())
    print("\nambiguous examples (candidates: spec, workers p/d, dp-attn p/d, decode ep, recipe):")
    for _, row in result[result["match"] == "ambiguous"].iloc[::40].iterrows():
        print(f"  {row['id']} @ {row['commit']}")
        for e in row["found"]:
            pair = (f"{e[f'prefill_{c}']}/{e[f'decode_{c}']}" for c in ("num_workers", "dp_attn"))
            print(f"    {e['spec_decoding']}, {', '.join(pair)}, {e['decode_ep']}, {e['recipe']}")
    same = ["measured", *group, "concurrency", *PARALLEL]  # the same run, config and load
    repeats = result[result.groupby(same)["id"].transform("size") > 1]
    print(f"\nrepeated measurements: {len(repeats)} rows in {repeats.groupby(same).ngroups} groups")
    print(repeats.groupby(["match", "spec_set"]).size().to_string())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="InferenceX git dir or clone")
    parser.add_argument("--silicon", type=Path, required=True, help="the silicon CSV")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--match-decode-ep", action="store_true", help="compare decode ep too")
    args = parser.parse_args(argv)
    rows = load_rows(args.silicon)
    if rows.empty:
        fail(f"{args.silicon}: expected disagg rows with silicon_concurrency=, measured=, image=")
    history = History(args.repo)
    found = [resolve(history, row, args.match_decode_ep) for _, row in rows.iterrows()]
    result = pd.DataFrame(found, index=rows.index)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result[OUT_COLUMNS].to_csv(args.out, index=False)
    print(f"wrote {len(result)} rows to {args.out}")
    summarise(result.join(rows[["backend", "system", "precision", "concurrency", *PARALLEL]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
