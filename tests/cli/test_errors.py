"""The exit-code table has one source, patchbench.errors.EXIT_CODES: the help prints it and the
docs hold it between markers (``python -m patchbench.errors docs/design.md`` rewrites it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbench import errors

REPO = Path(__file__).resolve().parents[2]


def test_design_md_holds_the_rendered_table():
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    assert errors.with_table(text, "docs/design.md") == text, (
        "docs/design.md's exit-code table differs from patchbench.errors.EXIT_CODES: run "
        "`python -m patchbench.errors docs/design.md`"
    )


def test_the_markdown_table_and_its_rewrite(tmp_path):
    table = errors.exit_code_table(markdown=True).splitlines()
    assert table[:3] == ["| code | meaning |", "|---|---|", "| 0 | done (nightly: no regression) |"]
    assert table[-1] == "| 70 | internal error (a bug: the traceback is printed) |"
    assert len(table) == 2 + 9
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- exit-codes -->\n| 0 | stale |\n<!-- /exit-codes -->\nend\n")
    assert errors.main([str(doc)]) == 0
    assert doc.read_text() == "intro\n<!-- exit-codes -->\n" + "\n".join(table) + (
        "\n<!-- /exit-codes -->\nend\n"
    )
    (tmp_path / "none.md").write_text("no markers\n")
    assert errors.main([str(tmp_path / "none.md")]) == 2
    with pytest.raises(ValueError, match="x.md: no <!-- exit-codes -->"):
        errors.with_table("text", "x.md")


def test_help_prints_the_table():
    text = errors.exit_code_table()
    assert text.splitlines()[0] == "exit codes:"
    assert "  143  terminated by SIGTERM (finished cells are kept)" in text.splitlines()
    assert text.splitlines()[-1].startswith("   70  internal error")
