"""A module is one idea: no module of patchbench uses a ``_private`` name of another module, by
``from M import _name`` or by ``M._name`` on a module it imported. Where a split needed that, it
was not a seam: the code belongs together.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def private_uses(root: Path, repo: Path = REPO) -> set[tuple[str, str, str]]:
    """{(file relative to the repo, module, name)}: every private name of another patchbench
    module that a file under ``root`` imports or reads as an attribute of an imported module."""
    out: set[tuple[str, str, str]] = set()
    for f in sorted(root.rglob("*.py")):
        rel = str(f.relative_to(repo))
        tree = ast.parse(f.read_text(encoding="utf-8"), rel)
        modules: dict[str, str] = {}  # local name -> the patchbench module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith("patchbench")
            ):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        out.add((rel, node.module or "." * node.level, a.name))
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("patchbench"):
                        modules[a.asname or a.name.split(".")[0]] = a.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                out.add((rel, modules[node.value.id], node.attr))
    return out


def test_no_module_uses_another_modules_private_names():
    uses = private_uses(REPO / "patchbench")
    assert not uses, (
        "private names used across modules (make them public or merge the modules):\n"
        + "\n".join(f"  {f}: {m}.{n}" for f, m, n in sorted(uses))
    )


def test_the_checker_finds_both_forms(tmp_path):
    pkg = tmp_path / "patchbench"
    pkg.mkdir()
    (pkg / "a.py").write_text("def _x():\n    pass\n\n\ndef y():\n    pass\n")
    (pkg / "b.py").write_text("from patchbench.a import _x, y\n")
    (pkg / "c.py").write_text(
        "from patchbench import a\nimport patchbench.a as aa\na._x()\naa.y()\n"
    )
    assert private_uses(pkg, tmp_path) == {
        ("patchbench/b.py", "patchbench.a", "_x"),
        ("patchbench/c.py", "patchbench.a", "_x"),
    }
