"""The package's shape: one import name, no import cycles, modules a reader can hold.

The import graph is read from the source (every `import` of a `servesim` module, function-local
and TYPE_CHECKING ones included): a cycle hidden behind a late import is still a cycle.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "model"  # installed as `servesim`
MAX_LINES = 500  # "about a screenful of concepts"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["servesim", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `name` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for a in node.names:  # `from servesim.kv import tiers` imports a module
                found.add(f"{module}.{a.name}" if f"{module}.{a.name}" in known else module)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50  # (the walk found the package)
    found = cycles(graph)
    described = [
        " <-> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in found
    ]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_no_module_outgrows_a_screenful_of_concepts():
    long = {
        str(p.relative_to(REPO)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_package_list_names_every_folder():
    """pyproject.toml lists the packages by hand (the folders install under another name):
    every folder of model/ with Python in it must be there."""
    text = (REPO / "pyproject.toml").read_text()
    folders = {
        "servesim." + ".".join(p.parent.relative_to(PACKAGE).parts)
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
    }
    missing = sorted(f for f in folders if f'"{f}"' not in text)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"


def test_the_wheel_installs_one_top_level_package(tmp_path):
    # built from a copy: setuptools leaves a build/ folder beside the sources it builds
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in ("model", "conf"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"] + ["-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("servesim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"servesim"}
    assert "servesim/conf/config.yaml" in names
    assert "servesim/conf/engine/vllm.yaml" in names
    assert "servesim/timing/roofline_factors.json" in names


@pytest.fixture
def crowded_dir(tmp_path: Path) -> Path:
    """A directory of the kind ML and Hydra projects have: its own model.py and conf/."""
    (tmp_path / "model.py").write_text("raise ImportError('the user model.py was imported')\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "__init__.py").write_text("raise ImportError('user conf imported')\n")
    (tmp_path / "conf" / "config.yaml").write_text("seed: 12345\n")
    return tmp_path


def test_compose_and_simulate_work_beside_a_users_model_and_conf(crowded_dir):
    code = (
        "import sys; sys.path.insert(0, '');"
        "from servesim import compose, simulate;"
        "cfg = compose(['workload.num_sessions=4', 'output.progress=off']);"
        "assert cfg.seed == 0, cfg.seed;"
        "r = simulate(cfg); print(r.summary['terminal_status_counts'])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=crowded_dir, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "{'completed': 12}"


def test_importing_servesim_loads_nothing_but_itself():
    """`import servesim` has no side effects: no model module, no Hydra, nothing global."""
    code = (
        "import sys; before = set(sys.modules); meta = list(sys.meta_path);"
        "import servesim;"
        "new = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('servesim', 'hydra', 'omegaconf', 'simpy', 'pandas', 'numpy', 'pydantic'));"
        "assert new == ['servesim', 'servesim.speed', 'servesim.speed.native'], new;"
        "assert sys.meta_path == meta"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "SERVESIM_NATIVE"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
