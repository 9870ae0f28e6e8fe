"""No import cycle among patchbench's modules (patchbench/ and patchbench/suites/, installed as
patchbench.suites), counting every import statement wherever it stands: module level, inside a
function, under ``if TYPE_CHECKING`` or ``try``, and ``importlib.import_module("literal")``.

An edge A -> B means A names module B in an import:

- ``import a.b.c`` (and ``import a.b.c as x``): a.b.c, or its longest prefix that is a module;
- ``from P import n``: P, and P.n when that is a module (``from patchbench import errors`` counts
  patchbench and patchbench.errors); relative forms resolve against A's package first;
- ``importlib.import_module("a.b")`` with a literal string: a.b.

Strongly connected components of that graph are cycles; the test fails naming their modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

REPO = Path(__file__).resolve().parents[2]
#: package name -> its folder (pyproject.toml's package-dir)
ROOTS = {"patchbench": REPO / "patchbench"}


def module_files(roots: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (file, is a package __init__)} of every ``.py`` under ``roots``.

    A root's folder is walked without following symlinks, so ``patchbench/suites`` (a symlink to
    ``patchbench/suites/``) is reached only through its own root.
    """
    out: dict[str, tuple[Path, bool]] = {}
    for pkg, folder in roots.items():
        for f in sorted(folder.rglob("*.py")):
            rel = f.relative_to(folder)
            if any((folder / p).is_symlink() for p in rel.parents if str(p) != "."):
                continue
            parts = [*pkg.split("."), *rel.with_suffix("").parts]
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join(parts)] = (f, is_pkg)
    return out


def _known_prefix(name: str, known: set[str]) -> str | None:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in known:
            return cand
    return None


def imports_of(name: str, tree: ast.AST, is_pkg: bool, known: set[str]) -> set[str]:
    """The modules in ``known`` that module ``name`` (its parsed ``tree``) imports anywhere."""
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str | None) -> None:
        hit = _known_prefix(target, known) if target else None
        if hit and hit != name:
            out.add(hit)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            add(source)
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    add(f"{source}.{alias.name}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value)
    return out


def import_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    """{module: modules it imports} over every module under ``roots``."""
    files = module_files(roots)
    known = set(files)
    return {
        name: imports_of(name, ast.parse(path.read_text(encoding="utf-8"), str(path)), pkg, known)
        for name, (path, pkg) in files.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, largest first."""
    names = sorted(graph)
    index = {n: i for i, n in enumerate(names)}
    rows = [index[a] for a, bs in graph.items() for _ in bs]
    cols = [index[b] for bs in graph.values() for b in bs]
    adj = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(adj, directed=True, connection="strong")
    comps: dict[int, list[str]] = {}
    for n, lab in zip(names, labels, strict=True):
        comps.setdefault(int(lab), []).append(n)
    return sorted((c for c in comps.values() if len(c) > 1), key=lambda c: (-len(c), c))


def test_no_import_cycle():
    graph = import_graph(ROOTS)
    assert "patchbench.cli" in graph and "patchbench.suites.mmmu" in graph  # the walk found both
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (strongly connected modules):\n" + "\n".join(
        f"  {len(c)}: {', '.join(c)}" for c in cycles
    )


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_checker_finds_a_synthetic_cycle(tmp_path):
    """A fake package: a -> b (module level), b -> c (inside a function, relative), c -> a
    (importlib with a literal); d imports a but nothing imports d; the cycle is a, b, c."""
    _write(
        tmp_path / "fake",
        {
            "__init__.py": "",
            "a.py": "from fake import b\n",
            "b.py": "def f():\n    from . import c\n",
            "c.py": "import importlib\nimportlib.import_module('fake.a')\n",
            "d.py": "import fake.a\n",
        },
    )
    graph = import_graph({"fake": tmp_path / "fake"})
    assert graph["fake.b"] == {"fake", "fake.c"}
    assert import_cycles(graph) == [["fake.a", "fake.b", "fake.c"]]


def test_checker_reads_package_imports(tmp_path):
    """``from P import n`` counts P and P.n; a package __init__ importing its submodule that
    imports it back through ``from P import ...`` is a cycle; a second root maps its folder to a
    subpackage name (as patchbench/suites/ is patchbench.suites)."""
    _write(
        tmp_path / "pkg",
        {"__init__.py": "from pkg.sub import x\n", "sub/__init__.py": ""},
    )
    _write(
        tmp_path / "plug",
        {
            "__init__.py": "from .impl import run\n",
            "impl.py": "from pkg.plug import helper\nfrom pkg.plug.helper import h\n",
            "helper.py": "",
        },
    )
    graph = import_graph({"pkg": tmp_path / "pkg", "pkg.plug": tmp_path / "plug"})
    assert graph["pkg"] == {"pkg.sub"}
    assert graph["pkg.plug.impl"] == {"pkg.plug", "pkg.plug.helper"}
    assert import_cycles(graph) == [["pkg.plug", "pkg.plug.impl"]]
