"""Golden run folders: ``patchbench report`` on each folder under tests/data/golden/ renders
compare.json (its floats to 10 significant digits), report.md, report-details.md and the console
summary byte for byte as committed.

The folders are real runs of this repository's harness, kept without their rendered outputs
(compare.json, report.md, plots/) and without the profiler's raw traces (the report does not read
them):

- ``demo-cpu``: ``make demo`` (schema 2; three variants, correctness cells, MMMU records, serving
  requests, the sync probe and the profiler);
- ``sequential``: a group-sequential run (``schedule.repeats: {min: 3, max: 5, step: 2}``, serving
  only) on the CPU engine;
- ``schema1``: a schema-1 run folder (migrated on read).

They pin what a reader sees while code moves: a refactor must leave all three byte-identical. A
change that means to alter the report regenerates them on purpose with
``PATCHBENCH_GOLDEN_UPDATE=1 .venv/bin/python -m pytest tests/report/test_golden.py`` and says so in its
commit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from patchbench.cli import main
from tests.helpers import json_digits

GOLDEN = Path(__file__).parent.parent / "data" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "run").is_dir())
#: the rendered files compared byte for byte (plots are PNGs whose bytes depend on matplotlib)
RENDERED = ("compare.json", "report.md", "report-details.md")


def test_every_golden_case_is_present():
    assert CASES == ["demo-cpu", "schema1", "sequential"]


@pytest.mark.parametrize("case", CASES)
def test_report_renders_byte_identical(case, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(GOLDEN / case / "run", run)
    for name in RENDERED:
        assert not (run / name).exists(), f"golden input {case}/run holds a rendered {name}"
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    # a message may name a file of the run folder by its absolute path
    got = {name: (run / name).read_bytes().replace(bytes(run), b"<RUN>") for name in RENDERED}
    got["console.txt"] = capsys.readouterr().out.replace(str(run), "<RUN>").encode()
    expected = GOLDEN / case / "expected"
    if os.environ.get("PATCHBENCH_GOLDEN_UPDATE") == "1":
        expected.mkdir(exist_ok=True)
        for name, data in got.items():
            (expected / name).write_bytes(data)
    for name, data in got.items():
        want = (expected / name).read_bytes()
        if name == "compare.json":  # its floats to 10 digits (tests/helpers.py, json_digits)
            data, want = json_digits(data), json_digits(want)
        assert data == want, f"{case}: {name} differs from tests/data/golden/{case}/expected/{name}"
