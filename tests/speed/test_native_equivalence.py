"""The native build against the source (model/speed/native.py): the same answers, table by table.

The modules `servesim.speed.native.MODULES` compiled by mypyc must replay exactly as their
source does. This builds them (once per state of the sources: the build is cached) and replays every
scenario of the fast-forward equivalence suite (tests/speed/test_fast_forward_equivalence.py)
in two fresh interpreters, one running the source (`SERVESIM_NATIVE=0`) and one the build (`=1`),
each in its fast-forward mode and, for a few, stepping too; then compares, per scenario, every
table (`_ms` columns to 1e-6 ms, everything else exactly, dtypes included), the per-token
times and the summary (exactly, host-time keys aside). It is skipped only where mypyc or a C
compiler is missing; a build that fails is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_fast_forward_equivalence import (
    SCENARIOS,
    TABLES,
    table_differences,
    token_time_differences,
    value_differences,
)

from servesim.metrics.summary import without_wall
from servesim.speed import native

TESTS = Path(__file__).resolve().parents[1]
# scenarios also replayed stepping every pass (engine.fast_forward=false)
STEPPED = 4

CHILD = textwrap.dedent(
    """
    import pickle, sys
    from pathlib import Path
    sys.path[:0] = [{tests!r}, {speed!r}]
    import servesim
    from servesim import simulate
    from servesim.speed import native
    from conftest import make_config, write_jsonl
    from _pytest.outcomes import Skipped
    import test_fast_forward_equivalence as ff

    out, tmp = {{}}, Path(sys.argv[2])  # the same trace paths in both runs
    written = iter(range(10**6))

    def trace(rows):
        return str(write_jsonl(tmp / f"trace{{next(written)}}.jsonl", rows))

    runs = [(p.id, True, p.values[0]) for p in ff.SCENARIOS]
    runs += [(p.id, False, p.values[0]) for p in ff.SCENARIOS[:{stepped}]]
    for sid, fast, sections in runs:
        try:
            cfg = make_config(**ff.with_mode(ff._resolve_workload(sections, trace), fast))
        except Skipped as why:
            out[(sid, fast)] = str(why)
            continue
        r = simulate(cfg)
        out[(sid, fast)] = dict(
            {{name: getattr(r, name) for name in ff.TABLES}},
            token_times=r.token_times,
            summary=r.summary,
        )
    Path(sys.argv[1]).write_bytes(pickle.dumps((native.ACTIVE, out)))
    """
)


def _replay_all(tmp: Path, use_build: bool) -> tuple[str | None, dict[Any, Any]]:
    """Every scenario replayed by a fresh interpreter, on the build or on the source."""
    code = CHILD.format(tests=str(TESTS), speed=str(TESTS / "speed"), stepped=STEPPED)
    env = dict(os.environ)
    env["SERVESIM_NATIVE"] = "1" if use_build else "0"
    path = tmp / f"runs-{'native' if use_build else 'source'}.pkl"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path), str(tmp)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    active, runs = pickle.loads(path.read_bytes())
    return active, runs


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[Any, Any], dict[Any, Any]]:
    if importlib.util.find_spec("mypyc") is None:
        pytest.skip("mypyc is not installed (pip install -e '.[native]')")
    compiler = native.missing_compiler()
    if compiler is not None:
        pytest.skip(f"no C compiler ({compiler}) for the native build")
    tmp = tmp_path_factory.mktemp("native")
    try:  # the build's cache, or (where it cannot be written) one of this session's own
        native.cache_root().mkdir(parents=True, exist_ok=True)
        writable = os.access(native.cache_root(), os.W_OK)
    except OSError:
        writable = False
    with pytest.MonkeyPatch.context() as patch:
        if not writable:
            patch.setenv("SERVESIM_NATIVE_DIR", str(tmp / "cache"))  # (the children inherit it)
        where = native.build()
        built, compiled = _replay_all(tmp, use_build=True)
        assert built == where.name, "the child did not run the build of these sources"
        source_active, source = _replay_all(tmp, use_build=False)
        assert source_active is None
    return compiled, source


def _summary(s: dict[str, Any]) -> dict[str, Any]:
    return without_wall(s)


RUN_IDS = [(p.id, True) for p in SCENARIOS] + [(p.id, False) for p in SCENARIOS[:STEPPED]]


@pytest.mark.parametrize(
    "sid,fast", RUN_IDS, ids=[f"{s}-{'ff' if f else 'stepped'}" for s, f in RUN_IDS]
)
def test_the_build_gives_the_source_answer(sid, fast, both):
    compiled, source = both
    a, b = compiled[(sid, fast)], source[(sid, fast)]
    if isinstance(b, str):
        pytest.skip(b)
    found = []
    for name in TABLES:
        found += table_differences(name, a[name], b[name])
    found += token_time_differences(a["token_times"], b["token_times"])
    found += value_differences(_summary(a["summary"]), _summary(b["summary"]))
    assert not found, "the native build changed the answer:\n" + "\n".join(found[:20])


def test_a_source_edited_after_the_build_is_not_built(tmp_path, monkeypatch):
    """The build is named by the sources: a changed source file names another build, so
    nothing stale is imported."""
    package = tmp_path / "model"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(native, "PACKAGE_DIR", package)
    before = native.digest()
    (package / "a.py").write_text("x = 2\n")
    assert native.digest() != before
    monkeypatch.setenv("SERVESIM_NATIVE_DIR", str(tmp_path / "cache"))
    assert native.built() is None


def test_the_status_command_names_the_build_or_the_source(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SERVESIM_NATIVE_DIR", str(tmp_path))
    assert native.main(["status"]) == 0
    assert "no build of the current sources" in capsys.readouterr().out
    where = tmp_path / native.digest()
    where.mkdir()
    (where / native.MANIFEST).write_text('{"files": {}}')
    assert native.main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"build {where.name}" in out
    # (in CI's second run the build of these sources is in use)
    assert ("(in use)" if where.name == native.ACTIVE else "SERVESIM_NATIVE=1 uses it") in out


def test_asking_for_a_build_that_is_not_there_says_so(tmp_path, monkeypatch):
    """SERVESIM_NATIVE=1 without a build of the current sources is an error, not the source
    quietly run in its place."""
    monkeypatch.setenv("SERVESIM_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("SERVESIM_NATIVE", "1")
    code = "import servesim"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "servesim-native build" in proc.stderr
    assert "no build of the current sources" in proc.stderr


def test_a_build_in_the_cache_is_not_used_unless_asked(tmp_path, monkeypatch):
    """A build sitting in the cache changes nothing until SERVESIM_NATIVE=1 asks for it."""
    monkeypatch.setenv("SERVESIM_NATIVE_DIR", str(tmp_path))
    where = tmp_path / native.digest()
    where.mkdir()
    (where / native.MANIFEST).write_text('{"files": {"servesim.clock": "nowhere.so"}}')
    monkeypatch.delenv("SERVESIM_NATIVE", raising=False)
    code = "import servesim, servesim.clock, servesim.speed.native as n; print(n.ACTIVE)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


def test_without_mypyc_the_build_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESIM_NATIVE_DIR", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        native.importlib.util, "find_spec", lambda name: None if name == "mypyc" else real(name)
    )
    with pytest.raises(native.NativeBuildError, match=r"pip install -e '\.\[native\]'"):
        native.build()


def test_without_a_c_compiler_the_build_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESIM_NATIVE_DIR", str(tmp_path))
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(native.NativeBuildError, match="needs a C compiler"):
        native.build()


def test_a_new_build_keeps_only_the_newest_others(tmp_path):
    builds = []
    for k in range(native.KEEP + 2):
        where = tmp_path / f"b{k}"
        where.mkdir()
        (where / native.MANIFEST).write_text('{"files": {}}')
        os.utime(where, (1000 + k, 1000 + k))
        builds.append(where)
    current = builds[0]  # the oldest on disk, but the one just built
    gone = native.prune(tmp_path, current)
    assert sorted(gone) == builds[1:3]
    assert sorted(d for d in tmp_path.iterdir()) == [current, *builds[3:]]
