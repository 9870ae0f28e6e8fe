"""docs/design.md's layer diagram is data: the fenced ``layers`` block lists patchbench's packages
and leaf modules from the top layer down, and every import of every module (wherever it stands,
as tests/cli/test_import_graph.py reads them) must go to its own layer or one below. Every module
must belong to a listed name, so the diagram cannot leave a module out.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli.test_import_graph import ROOTS, import_graph

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"


def layers(text: str) -> list[list[str]]:
    """The ``layers`` block of a markdown text: one list of names a line, top layer first; a line
    is names separated by spaces, then two spaces or more and a description. Raises ValueError
    when there is no such block."""
    m = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    if not m:
        raise ValueError("no ```layers block")
    out = []
    for line in m.group(1).splitlines():
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if names:
            out.append(names.split())
    return out


def layer_of(module: str, rows: list[list[str]]) -> int | None:
    """The row index of the longest listed name that is ``module`` or a package above it
    (names are relative to ``patchbench``; ``patchbench`` itself is the package's __init__)."""
    rel = module.removeprefix("patchbench").lstrip(".") or "__init__"
    best: tuple[int, int] | None = None
    for i, row in enumerate(rows):
        for name in row:
            if rel == name or rel.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (i, len(name))
    return None if best is None else best[0]


def violations(graph: dict[str, set[str]], rows: list[list[str]]) -> tuple[list[str], list[str]]:
    """(modules no listed name covers, imports that climb to a higher layer as "a -> b")."""
    unlisted = sorted(m for m in graph if layer_of(m, rows) is None)
    up = sorted(
        f"{a} -> {b}"
        for a, bs in graph.items()
        for b in bs
        if layer_of(a, rows) is not None
        and layer_of(b, rows) is not None
        and layer_of(b, rows) < layer_of(a, rows)
    )
    return unlisted, up


def test_design_md_layers_match_the_imports():
    rows = layers(DESIGN.read_text(encoding="utf-8"))
    unlisted, up = violations(import_graph(ROOTS), rows)
    assert not unlisted, "modules docs/design.md's layers leave out:\n  " + "\n  ".join(unlisted)
    assert not up, "imports that climb a layer of docs/design.md:\n  " + "\n  ".join(up)


def test_the_checker_finds_a_climb_and_a_module_left_out():
    rows = layers("x\n```layers\ncli  top\nrun report  middle\nerrors\n```\n")
    assert rows == [["cli"], ["run", "report"], ["errors"]]
    graph = {
        "patchbench.cli": {"patchbench.run.bench"},
        "patchbench.run.bench": {"patchbench.report", "patchbench.errors"},
        "patchbench.report": {"patchbench.cli"},
        "patchbench.errors": set(),
        "patchbench.extra": set(),
    }
    assert violations(graph, rows) == (
        ["patchbench.extra"],
        ["patchbench.report -> patchbench.cli"],
    )
