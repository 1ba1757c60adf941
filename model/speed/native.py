"""The optional native build: the hot modules compiled by mypyc, imported instead of their source.

servesim is plain Python and runs as such. `servesim-native build` compiles the modules a replay
spends its time in (`MODULES`: the engine, the KV pools, hashing, the trace reader and drivers,
the routers, links and the cluster)
with mypyc, the compiler that ships with mypy, from the very same source files, into a cache
directory named by a digest of every source file of the package and of the interpreter's ABI.
At `import servesim`, `activate()` looks for the build of the current sources and, when there is
one, has those modules imported from it. Editing any source file changes the digest: the
edited source then runs as Python until the next build, never a stale build. The answers are
the same either way (tests/speed/test_native_equivalence.py compares every table of both);
only the speed differs (docs/performance.md).

Environment: `SERVESIM_NATIVE=1` uses the build (unset or `0`: the source); `SERVESIM_NATIVE_DIR`
moves the cache (default `$XDG_CACHE_HOME/servesim/native`, else `~/.cache/servesim/native`),
which keeps the `KEEP` newest builds (a few MB each).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# (what only `build` and the command use is imported there: `import servesim` runs this module)

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the package root (this is speed/native.py)

# what a replay spends its time in (docs/performance.md); a class compiled here can only be
# subclassed by another compiled class, so ClusterBase's subclasses come with it
MODULES = (
    "servesim.engine.batch",
    "servesim.engine.scheduler_base",
    "servesim.engine.vllm",
    "servesim.speed.stretch",
    "servesim.speed.fast_worker",
    "servesim.timing.tabulated",
    "servesim.engine.worker",
    "servesim.kv.block_pool",
    "servesim.kv.pool_base",
    "servesim.kv.radix_pool",
    "servesim.speed.group_keys",
    "servesim.speed.group_pool",
    "servesim.workload.hashing",
    "servesim.workload.build",
    "servesim.workload.mooncake",
    "servesim.metrics.gaps",
    "servesim.cluster.base",
    "servesim.cluster.aggregated",
    "servesim.cluster.disagg",
    "servesim.cluster.handoff",
    "servesim.cluster.reservation",
    "servesim.kv.link",
    "servesim.router.base",
    "servesim.router.round_robin",
    "servesim.router.random",
    "servesim.router.kv",
    "servesim.router.prefix_index",
    "servesim.timing.base",
    "servesim.timing.polynomial",
    "servesim.workload.drivers",
)

MANIFEST = "manifest.json"
KEEP = 4  # builds kept in the cache: the newest (of whichever sources)
# type-checking settings of the build (the project's, from pyproject.toml)
MYPY_INI = """[mypy]
python_version = 3.11
ignore_missing_imports = True
plugins = pydantic.mypy
"""

# the build in use (its digest), or None: the source runs
ACTIVE: str | None = None


class NativeBuildError(RuntimeError):
    """The native build could not be made (no compiler, or the compiler failed)."""


def cache_root() -> Path:
    """Where builds are kept, one directory per digest."""
    moved = os.environ.get("SERVESIM_NATIVE_DIR")
    if moved:
        return Path(moved)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servesim" / "native"


def digest() -> str:
    """The build's name: every source file of the package, the compiled modules' list and the
    interpreter's extension ABI."""
    h = hashlib.sha256()
    h.update(f"{sysconfig.get_config_var('EXT_SUFFIX')}\0{','.join(MODULES)}\0".encode())
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:20]


def asked() -> bool:
    """Whether SERVESIM_NATIVE=1 asks for the native build."""
    return os.environ.get("SERVESIM_NATIVE", "0") == "1"


def missing_compiler() -> str | None:
    """The C compiler Python's extensions are built with, if it cannot be found (else None)."""
    import shutil

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return compiler if shutil.which(compiler) is None else None


def built() -> Path | None:
    """The build of the current sources, if there is one."""
    where = cache_root() / digest()
    return where if (where / MANIFEST).is_file() else None


class _BuildFinder:
    """Imports the compiled modules (and mypyc's shared runtime) from one build (a meta path
    finder: `find_spec` is all the import system asks of one)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def activate() -> str:
    """Import `MODULES` from the build of the current sources from now on; returns the build's
    digest. Raises NativeBuildError if there is no such build, or if a compiled module was
    imported from source already (the two would be mixed)."""
    global ACTIVE
    if ACTIVE is not None:
        return ACTIVE
    loaded = [m for m in MODULES if m in sys.modules]
    if loaded:
        raise NativeBuildError(
            f"activate the native build before importing the model: {loaded[0]} is imported "
            "from source already (set SERVESIM_NATIVE=1 before starting Python)"
        )
    where = built()
    if where is None:
        raise NativeBuildError(
            f"the native build was asked for, but there is no build of the current sources in "
            f"{cache_root()}: run `servesim-native build` (or unset SERVESIM_NATIVE)"
        )
    try:
        manifest = json.loads((where / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise NativeBuildError(f"unreadable native build {where}: {exc}") from None
    finder = _BuildFinder({m: where / f for m, f in manifest["files"].items()})
    sys.meta_path.insert(0, finder)
    ACTIVE = where.name
    return ACTIVE


def activate_if_asked() -> str | None:
    """`activate()` if SERVESIM_NATIVE=1 asks for it (run at `import servesim`); else None."""
    return activate() if asked() else None


def build(force: bool = False) -> Path:
    """Compile `MODULES` of the current sources into the cache (unless built already, or
    `force`); returns the build's directory. Raises NativeBuildError if mypyc is missing or
    fails (its output in the message)."""
    import shutil
    import subprocess
    import tempfile

    tag = digest()
    root = cache_root()
    dest = root / tag
    if (dest / MANIFEST).is_file() and not force:
        return dest
    if importlib.util.find_spec("mypyc") is None:
        raise NativeBuildError(
            "the native build needs mypyc, which comes with mypy: "
            "pip install -e '.[native]' (or pip install mypy)"
        )
    compiler = missing_compiler()
    if compiler is not None:
        raise NativeBuildError(f"the native build needs a C compiler; {compiler} was not found")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="servesim-native-") as tmp:
        src = Path(tmp)
        shutil.copytree(
            PACKAGE_DIR,
            src / "servesim",
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"),
        )
        (src / "mypy.ini").write_text(MYPY_INI)
        paths = [m.replace(".", "/") + ".py" for m in MODULES]
        proc = subprocess.run(
            [sys.executable, "-m", "mypyc", "--config-file", "mypy.ini", *paths],
            cwd=src,
            capture_output=True,
            text=True,
            env={**os.environ, "SERVESIM_NATIVE": "0"},
        )
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr)[-4000:]
            raise NativeBuildError(f"mypyc failed (exit {proc.returncode}):\n{out}")
        files: dict[str, str] = {}
        for so in src.rglob("*" + suffix):
            rel = so.relative_to(src)
            if rel.parts[0] == "build":
                continue  # the compiler's own copies
            module = ".".join((*rel.parts[:-1], so.name[: -len(suffix)]))
            files[module] = rel.as_posix()  # (package directories kept: names repeat)
        missing = sorted(set(MODULES) - set(files))
        if missing:
            raise NativeBuildError(f"mypyc built no module for {missing}")
        stage = Path(tempfile.mkdtemp(prefix=f"{tag}.", dir=root))
        for rel_path in files.values():
            (stage / rel_path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel_path, stage / rel_path)
        (stage / MANIFEST).write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
        if dest.exists():  # a forced rebuild (or a concurrent one): the newer build wins
            shutil.rmtree(dest, ignore_errors=True)
        try:
            stage.rename(dest)
        except OSError:  # another build landed first: keep it
            shutil.rmtree(stage, ignore_errors=True)
    prune(root, dest)
    return dest


def typecheck() -> int:
    """Type-check the whole package with mypy as `servesim` (the name mypyc compiles it under;
    run on the folder, mypy would call it `model`); returns mypy's exit status."""
    import shutil
    import subprocess
    import tempfile

    if importlib.util.find_spec("mypy") is None:
        raise NativeBuildError("the type check needs mypy: pip install -e '.[dev]'")
    with tempfile.TemporaryDirectory(prefix="servesim-check-") as tmp:
        src = Path(tmp)
        shutil.copytree(
            PACKAGE_DIR, src / "servesim", ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
        (src / "mypy.ini").write_text(MYPY_INI)
        proc = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "-p", "servesim"],
            cwd=src,
            capture_output=True,
            text=True,
        )
    print((proc.stdout + proc.stderr).replace(str(src) + os.sep, "").rstrip())
    return proc.returncode


def prune(root: Path, current: Path) -> list[Path]:
    """Remove the builds in `root` but `current` and the `KEEP` - 1 newest others (other
    checkouts, or other states of these sources, may use them); returns those removed."""
    import shutil

    others = [d for d in root.iterdir() if d.is_dir() and d != current and (d / MANIFEST).is_file()]
    others.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    gone = others[KEEP - 1 :]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return gone


def clean() -> int:
    """Remove every build from the cache; returns how many there were."""
    import shutil

    root = cache_root()
    if not root.is_dir():
        return 0
    n = 0
    for entry in root.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            n += 1
    return n


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="servesim-native",
        description="Compile servesim's hot modules with mypyc (same source, same answers, "
        "faster), say which build is in use, or type-check the package (check).",
    )
    parser.add_argument(
        "command", choices=("build", "status", "clean", "check"), nargs="?", default="status"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if built")
    args = parser.parse_args(argv)
    if args.command == "build":
        existing = built()
        if existing is not None and not args.force:
            print(f"servesim-native: already built: {existing}")
            return 0
        print(f"servesim-native: compiling {len(MODULES)} modules with mypyc (a minute or two)")
        try:
            where = build(force=args.force)
        except NativeBuildError as exc:
            print(f"servesim-native: {exc}", file=sys.stderr)
            return 1
        print(f"servesim-native: built {len(MODULES)} modules in {where}")
        return 0
    if args.command == "check":
        try:
            return typecheck()
        except NativeBuildError as exc:
            print(f"servesim-native: {exc}", file=sys.stderr)
            return 1
    if args.command == "clean":
        print(f"servesim-native: removed {clean()} build(s) from {cache_root()}")
        return 0
    current = built()
    if current is None:
        print(
            f"servesim-native: no build of the current sources in {cache_root()} (the source runs)"
        )
    else:
        state = "in use" if current.name == ACTIVE else "not in use: SERVESIM_NATIVE=1 uses it"
        print(f"servesim-native: build {current.name} in {current.parent} ({state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
