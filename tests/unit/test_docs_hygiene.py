"""Docs, experiments and golden READMEs name no absolute path of the machine they were written
on (/work/..., /tmp/..., /root/..., /home/...) and no line number pinned to a commit
(`vllm.py:412`): commands use paths relative to the repository root or placeholders, code is
named by function or class."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|root|home)/[^\s`'\")]*")
PINNED_LINE = re.compile(r"\w+\.py:\d+")


def checked_files(root: Path) -> list[Path]:
    """The files held to these rules, under `root` (a checkout)."""
    files = [root / "README.md", root / "benchmarks" / "README.md"]
    files += sorted((root / "docs").rglob("*.md"))
    files += sorted((root / "experiments").rglob("*.py"))
    files += sorted((root / "tests" / "golden").rglob("README.md"))
    files += sorted((root / "tests" / "golden").rglob("make_fixtures.py"))
    return [f for f in files if f.is_file()]


def offences(root: Path) -> list[str]:
    """`file:line: what` for every machine path or pinned line number in the checked files."""
    found = []
    for path in checked_files(root):
        rel = path.relative_to(root)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in MACHINE_PATH.finditer(line):
                found.append(f"{rel}:{n}: absolute machine path {m.group()!r}")
            for m in PINNED_LINE.finditer(line):
                found.append(f"{rel}:{n}: line number pinned to a commit {m.group()!r}")
    return found


def test_docs_name_no_machine_path_or_pinned_line_number():
    found = offences(REPO)
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind_and_lets_relative_paths_pass(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(
        "ok: `../shared/traces/t.jsonl`, model/workload/mooncake.py, `MOCKER_PYTHON`\n"
        "python experiments/x.py --trace /work/shared/traces/t.jsonl --out /tmp/o\n"
        "raised at `mooncake.py:134`; see `/root/x` and (/home/u/y)\n"
    )
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "e.py").write_text('DEFAULT = "/work/venvs/dynamo/bin/python"\n')
    assert offences(tmp_path) == [
        "docs/a.md:2: absolute machine path '/work/shared/traces/t.jsonl'",
        "docs/a.md:2: absolute machine path '/tmp/o'",
        "docs/a.md:3: absolute machine path '/root/x'",
        "docs/a.md:3: absolute machine path '/home/u/y'",
        "docs/a.md:3: line number pinned to a commit 'mooncake.py:134'",
        "experiments/e.py:1: absolute machine path '/work/venvs/dynamo/bin/python'",
    ]
