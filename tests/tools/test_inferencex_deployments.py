"""experiments/inferencex_deployments.py on a tiny git repository built here: two commits of a
hand-written nvidia-master.yaml (the second changes a decode worker count) and P/D rows written
in each test. Checks which commit a row is read at (at or before its `measured` time, a day-only
stamp standing for the whole day, the next commit when none precedes it), unique / ambiguous /
none matches and the deployment columns, and bad input exiting with status 2."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "inferencex_deployments.py"
_spec = importlib.util.spec_from_file_location("inferencex_deployments", SCRIPT)
assert _spec is not None and _spec.loader is not None
ixd = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ixd
_spec.loader.exec_module(ixd)

IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post2"
TEP8 = "num-worker: 1, tp: 8, ep: 8, dp-attn: false"
DEP8 = "num-worker: 1, tp: 8, ep: 8, dp-attn: true"
RECIPE = "additional-settings: ['CONFIG_FILE=recipes/trtllm/b200-fp8/1k1k"


def config(key: str, search_space: str) -> str:
    """A top-level disagg config of 1,024 / 1,024 tokens with these search-space lines."""
    return f"""\
{key}:
  image: {IMAGE}
  model-prefix: dsr1
  precision: fp8
  framework: dynamo-trt
  disagg: true
  seq-len-configs:
  - isl: 1024
    osl: 1024
    search-space:{search_space}
"""


CONFIG = config(
    "dsr1-fp8-b200-dynamo-trt",
    f"""
    - conc-list: [4]
      prefill: {{{TEP8}, {RECIPE}/stp/ctx1_genWORKERS_tep8.yaml']}}
      decode: {{num-worker: WORKERS, tp: 8, ep: 8, dp-attn: false}}
    - spec-decoding: "mtp"
      conc-list: [64]
      prefill: {{{DEP8}, {RECIPE}/mtp/ctx1_gen1_tp8_mtp3.yaml']}}
      decode: {{num-worker: 1, tp: 8, ep: 1, dp-attn: false}}
    - conc-list: [64]
      prefill: {{{DEP8}, {RECIPE}/stp/ctx1_gen1_dep8.yaml']}}
      decode: {{{DEP8}}}""",
) + config(  # gb200 is not b200
    "dsr1-fp8-gb200-dynamo-trt",
    f" [{{conc-list: [4], prefill: {{{TEP8}}}, decode: {{{TEP8}}}}}]",
)
COMMITS = {"2026-03-18T10:00:00Z": 1, "2026-03-18T20:00:00Z": 3}  # time -> decode workers


def git(repo: Path, *args: str, when: str | None = None) -> str:
    env = os.environ | ({"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when} if when else {})
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[str]]:
    """An InferenceX-like repository and the short hashes of its commits, oldest first."""
    root = tmp_path / "InferenceX"
    (root / ".github" / "configs").mkdir(parents=True)
    git(root, "init", "-q")
    git(root, "config", "user.name", "test")
    git(root, "config", "user.email", "test@example.com")
    for when, workers in COMMITS.items():
        (root / ixd.CONFIG_PATH).write_text(CONFIG.replace("WORKERS", str(workers)))
        git(root, "add", ixd.CONFIG_PATH)
        git(root, "-c", "commit.gpgsign=false", "commit", "-q", "-m", when, when=when)
    return root, git(root, "log", "--reverse", "--format=%h").split()


def row(name: str, measured: str = "2026-03-18T12:00:00Z", conc: int = 4, **columns) -> dict:
    """A DeepSeek-R1 trtllm b200 fp8 1k/1k P/D row, tep8 prefill and decode."""
    image = columns.pop("image", IMAGE)
    source = f"source_file=2026-03-25.csv; model=DeepSeek-R1; silicon_concurrency={conc}; "
    source += f"measured={measured}; wip=False; image={image}"
    return {
        "id": name,
        "silicon_data_source": source,
        "backend": "trtllm",
        "system": "b200_sxm",
        "precision": "fp8",
        "mode": "disagg",
        "model_path": "deepseek-ai/DeepSeek-R1",
        **{"isl": 1024, "osl": 1024, "prefill_tp_size": 8, "prefill_moe_ep_size": 8},
        **{"decode_tp_size": 8, "decode_moe_ep_size": 8},
    } | columns


def run(tmp_path: Path, repo: Path, rows: list[dict], *flags: str) -> dict[str, dict]:
    """Run main on `rows`; the output CSV as strings, by id."""
    silicon, out = tmp_path / "silicon.csv", tmp_path / "out" / "deployments.csv"
    pd.DataFrame(rows).to_csv(silicon, index=False)
    assert (
        ixd.main(["--repo", str(repo), "--silicon", str(silicon), "--out", str(out), *flags]) == 0
    )
    result = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(result.columns) == ixd.OUT_COLUMNS
    return result.set_index("id").to_dict("index")


def workers_and_commit(found: dict) -> tuple[str, str, str]:
    return found["decode_num_workers"], found["commit"], found["commit_when"]


def test_one_fitting_entry_is_a_unique_match(tmp_path, repo):
    found = run(tmp_path, repo[0], [row("r")])["r"]
    assert found["commit"] == repo[1][0] and found["commit_when"] == "at_or_before"
    assert (found["n_candidates"], found["match"]) == ("1", "unique")
    assert {c: found[c] for c in ixd.DEPLOYMENT} == {
        "config_key": "dsr1-fp8-b200-dynamo-trt",
        "recipe": "ctx1_gen1_tep8.yaml",
        "spec_decoding": "none",
        **{"prefill_num_workers": "1", "prefill_tp": "8", "prefill_ep": "8"},
        **{"prefill_dp_attn": "False", "decode_num_workers": "1", "decode_tp": "8"},
        **{"decode_ep": "8", "decode_dp_attn": "False"},
    }


def test_mtp_and_stp_entries_fitting_is_ambiguous(tmp_path, repo):
    found = run(tmp_path, repo[0], [row("r", conc=64)])["r"]
    assert (found["n_candidates"], found["match"]) == ("2", "ambiguous")
    assert all(found[c] == "" for c in ixd.DEPLOYMENT)


def test_match_decode_ep_keeps_only_the_entry_with_the_rows_decode_ep(tmp_path, repo):
    found = run(tmp_path, repo[0], [row("r", conc=64)], "--match-decode-ep")["r"]
    assert (found["n_candidates"], found["match"]) == ("1", "unique")
    assert (found["spec_decoding"], found["recipe"]) == ("none", "ctx1_gen1_dep8.yaml")


def test_the_config_at_or_before_measured_is_read_not_a_later_one(tmp_path, repo):
    rows = [row("between", "2026-03-18T19:59:59Z"), row("after", "2026-03-18T20:00:00Z")]
    found = run(tmp_path, repo[0], rows)
    assert workers_and_commit(found["between"]) == ("1", repo[1][0], "at_or_before")
    assert workers_and_commit(found["after"]) == ("3", repo[1][1], "at_or_before")


@pytest.mark.parametrize("measured", ["2026-03-18T00:00:00.000Z", "2026-03-18"])
def test_a_day_only_measured_sees_the_commits_of_that_whole_day(tmp_path, repo, measured):
    found = run(tmp_path, repo[0], [row("r", measured)])["r"]
    assert workers_and_commit(found) == ("3", repo[1][1], "at_or_before")


def test_a_row_before_every_commit_reads_the_next_commit(tmp_path, repo):
    found = run(tmp_path, repo[0], [row("r", "2026-03-17T23:00:00Z")])["r"]
    assert workers_and_commit(found) == ("1", repo[1][0], "after")
    assert found["match"] == "unique"


@pytest.mark.parametrize(
    "columns",
    [
        {"image": "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1"},  # the image is exact
        {"conc": 8},
        {"system": "h100_sxm"},
        {"decode_tp_size": 4},
    ],
)
def test_a_row_no_entry_fits_matches_none(tmp_path, repo, columns):
    found = run(tmp_path, repo[0], [row("r", **columns)])["r"]
    assert (found["n_candidates"], found["match"]) == ("0", "none")
    assert (found["commit"], found["commit_when"]) == (repo[1][0], "at_or_before")
    assert all(found[c] == "" for c in ixd.DEPLOYMENT)


def exit_message(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        ixd.main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_repo_that_is_not_a_git_repository_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / "plain").mkdir()
    pd.DataFrame([row("r")]).to_csv(tmp_path / "silicon.csv", index=False)
    argv = ["--repo", str(tmp_path / "plain"), "--silicon", str(tmp_path / "silicon.csv")]
    err = exit_message(capsys, [*argv, "--out", str(tmp_path / "out.csv")])
    assert "plain: git rev-parse --git-dir failed" in err and "not a git repository" in err


def test_a_silicon_csv_missing_a_column_exits_2(tmp_path, repo, capsys):
    pd.DataFrame([row("r")]).drop(columns="decode_tp_size").to_csv(tmp_path / "s.csv", index=False)
    argv = ["--repo", str(repo[0]), "--silicon", str(tmp_path / "s.csv")]
    err = exit_message(capsys, [*argv, "--out", str(tmp_path / "out.csv")])
    assert "expected silicon CSV columns ['decode_tp_size']" in err


def test_a_silicon_csv_without_disagg_rows_exits_2(tmp_path, repo, capsys):
    pd.DataFrame([row("r", mode="agg")]).to_csv(tmp_path / "s.csv", index=False)
    argv = ["--repo", str(repo[0]), "--silicon", str(tmp_path / "s.csv")]
    err = exit_message(capsys, [*argv, "--out", str(tmp_path / "out.csv")])
    assert "expected disagg rows" in err
