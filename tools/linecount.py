"""Lines of the installed package per area: code, docstrings, comments and blank lines.

    python tools/linecount.py [--json] [ROOT]

An area is a folder under patchbench/ (patchbench/suites/ counts each suite apart); the modules
loose at the top of patchbench/ are one area, ``(top)``. Docstrings are the first string of a
module, class or function; everything else that is not a comment or blank is code.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path


def count_file(path: Path) -> Counter:
    """Counter of total, code, doc, comment and blank lines of one Python file."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    doc: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(
                getattr(first, "value", None), ast.Constant
            ):
                if isinstance(first.value.value, str):
                    doc.update(range(first.lineno, first.end_lineno + 1))
    c = Counter(total=len(lines), doc=len(doc))
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if i in doc:
            continue
        c["blank" if not s else "comment" if s.startswith("#") else "code"] += 1
    return c


def area_of(rel: Path) -> str:
    """The area of a file, from its path relative to the package folder."""
    parts = rel.parts
    if len(parts) == 1:
        return "(top)"
    if parts[0] == "suites" and len(parts) > 2:
        return f"suites/{parts[1]}"
    return parts[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    a = ap.parse_args(argv)
    pkg = Path(a.root) / "patchbench"
    areas: dict[str, Counter] = {}
    for f in sorted(p for p in pkg.rglob("*.py") if not any(s.startswith(".") for s in p.parts)):
        areas.setdefault(area_of(f.relative_to(pkg)), Counter()).update(count_file(f))
    total = sum(areas.values(), Counter())
    top = sorted(p.name for p in pkg.glob("*.py"))
    if a.json:
        out = {k: dict(v) for k, v in sorted(areas.items())}
        print(json.dumps({"areas": out, "total": dict(total), "top_modules": top}, indent=1))
        return 0
    cols = ("total", "code", "doc", "comment", "blank")
    print(f"{'area':<22}" + "".join(f"{c:>9}" for c in cols))
    for k, v in sorted(areas.items(), key=lambda kv: -kv[1]["total"]):
        print(f"{k:<22}" + "".join(f"{v[c]:>9}" for c in cols))
    print(f"{'all':<22}" + "".join(f"{total[c]:>9}" for c in cols))
    print(f"modules loose at the top of patchbench/: {len(top)} ({', '.join(top)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
