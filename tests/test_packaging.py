"""What a fresh `pip install herd` brings: every module herd imports, and its version."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import herd
from herd.rag.embedders import optimize

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL_MODULES = ("herd/integrations/", "herd/rag/vectors/", "herd/rag/embedders/")
# Modules elsewhere that import an extra's package inside try/except ImportError, with
# the extra (tests/test_telemetry.py runs herd without the package).
GUARDED = {"herd/telemetry.py": "otel", "herd/llm/eval/results.py": "parquet"}
# Folders whose every module may import what one extra declares: herd.testing ships
# the suite's servers, which need the `test` extra (no default path imports them).
EXTRA_FOLDERS = {"herd/testing/": "test"}


def _extra_of(file: str) -> str | None:
    """The extra a module of herd may import from, if any."""
    if file in GUARDED:
        return GUARDED[file]
    if file.startswith(OPTIONAL_MODULES):
        return Path(file).stem
    return next((x for folder, x in EXTRA_FOLDERS.items() if file.startswith(folder)), None)


def _dist(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name[0]).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_dist(r) for r in project["dependencies"]}


def optional() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {k: {_dist(r) for r in v} for k, v in project["optional-dependencies"].items()}


def imported_modules() -> dict[str, list[str]]:
    """Top-level modules that herd's own files import, with the files that do."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "herd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                files = found.setdefault(name.partition(".")[0], [])
                if str(path.relative_to(ROOT)) not in files:
                    files.append(str(path.relative_to(ROOT)))
    return found


def test_every_module_herd_imports_is_a_declared_dependency():
    by_module = importlib.metadata.packages_distributions()
    wanted = declared()
    undeclared = {}
    # In a process of its own: CPython 3.11 keeps the AST converter's recursion count per
    # interpreter, not per thread (gh-106905), so a thread an earlier test left parsing
    # made ast.parse here raise "AST constructor recursion depth mismatch" (seen in CI).
    scan = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, tests.test_packaging as t; print(json.dumps(t.imported_modules()))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    extras = optional()
    for module, files in json.loads(scan.stdout).items():
        if module in sys.stdlib_module_names or module in {"herd", "__future__"}:
            continue
        dists = {_dist(d) for d in by_module.get(module, [module])}
        # An integration (herd/integrations/NAME.py) or a vector store
        # (herd/rag/vectors/NAME.py, imported only when HERD_VECTOR_URL names it) or an
        # optional embedder (herd/rag/embedders/NAME.py) may import what its extra NAME
        # declares, and only it: nothing on a default path may.
        # So may a module that guards the import and is a no-op without it (GUARDED).
        # So may herd.testing (EXTRA_FOLDERS).
        integrations = [_extra_of(f) for f in files]
        in_extras = all(
            name is not None and dists & extras.get(name, set()) for name in integrations
        )
        if not dists & wanted and not in_extras:
            outside = [f for f in files if _extra_of(f) is None]
            undeclared[module] = (sorted(dists), (outside or files)[0])
    assert not undeclared, f"imported but not in [project].dependencies: {undeclared}"


def test_the_fast_models_build_dependencies_are_declared():
    # Imported by onnxruntime.transformers, not by herd: the scan above cannot see them.
    assert {_dist(d) for d in optimize.NEEDED_MODULES.values()} <= declared()


def test_the_version_is_written_once():
    assert herd.__version__ == importlib.metadata.version("herd")


def test_every_sql_file_of_herd_is_package_data():
    """Each feature keeps its migrations in its own package: each folder must ship."""
    from fnmatch import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["herd"]
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "herd").rglob("*.sql"))
        if not any(fnmatch(str(path.relative_to(ROOT / "herd")), g) for g in globs)
    ]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def _imports(path: Path) -> list[str]:
    """The modules a file imports, type-only imports and those inside functions too."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_no_module_of_bench_or_chaos_imports_the_test_suite():
    # What they share with the suite lives in herd.testing, which ships.
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for folder in ("bench", "chaos")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in _imports(path)
        if name == "tests" or name.startswith("tests.")
    ]
    assert not offenders, offenders


def test_herd_and_its_cli_do_not_import_herd_testing():
    # herd.testing.servers needs the `test` extra: no default path may reach it.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, herd, herd.cli; print(sorted(m for m in sys.modules"
            " if m.startswith(('herd.testing', 'herd.llm.simulator'))))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout


FEATURE_CLIS = ("herd.llm.cli", "herd.cache.cli", "herd.rag.cli", "herd.api.cli")


@pytest.mark.parametrize(
    "argv, loaded",
    [
        (["--version"], []),
        (["jobs", "--help"], []),
        (["eval", "--help"], ["herd.cache.cli", "herd.llm.cli"]),
        (["--help"], sorted(FEATURE_CLIS)),  # it lists them all
    ],
)
def test_a_cli_call_imports_only_the_feature_commands_it_may_run(argv, loaded):
    # The feature modules are most of a call's import time: `herd --version` loaded
    # every one of them (1,130 modules against 656 for `herd jobs stats`).
    script = (
        "import sys; import herd.cli as c\n"
        f"sys.argv = ['herd', *{argv!r}]\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in sys.modules if m in {FEATURE_CLIS!r}))"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    assert out.stdout.splitlines()[-1] == repr(loaded), out.stdout[-2000:]


def import_graph(package: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, type-only imports included."""
    files = {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
        for path in package.rglob("*.py")
    }
    graph = {
        module: {n for n in _imports(path) if n in files and n != module}
        for module, path in files.items()
    }
    # A package's __init__ re-exports its modules: an edge into the package itself is
    # where Python finds a submodule (`from pkg import mod`), not a use of __init__.
    for module, deps in graph.items():
        graph[module] = {d for d in deps if not module.startswith(d + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path round each circle that a depth-first walk meets, as module names."""
    found: list[list[str]] = []
    seen: dict[str, int] = {}  # 1: on the walk's path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        seen[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if seen.get(dep) == 1:
                found.append([*path[path.index(dep) :], dep])
            elif dep not in seen:
                visit(dep)
        path.pop()
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module)
    return found


def test_herd_has_no_import_circle():
    """Between any of herd's modules, counting type-only imports and imports inside
    functions: imports run one way (docs/architecture.md)."""
    found = [" -> ".join(c) for c in circles(import_graph(ROOT / "herd"))]
    assert not found, "import circles:\n" + "\n".join(found)


def test_the_circle_check_sees_a_type_only_import(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    (tmp_path / "pkg" / "c.py").write_text("def f():\n    from pkg import a\n")
    graph = import_graph(tmp_path / "pkg", root=tmp_path)
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert graph["pkg.c"] == {"pkg.a"}
