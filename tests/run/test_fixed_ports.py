"""The fake-server tests launch on fixed ports (31900-31999). `make test` runs the unit tests in
two pytest-xdist workers with ``--dist loadfile`` (scripts/run_tests.sh): the tests of one module
run one after another in one worker, and modules run side by side, so no two modules may name
one port (a CI run failed on a port two tests held at once)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
PORT = re.compile(r"\b319\d\d\b")


def ports_by_module() -> dict[str, set[str]]:
    """Each test module (and helper) under tests/ -> the 319xx numbers its source names."""
    out = {}
    for path in sorted(TESTS.rglob("*.py")):
        found = set(PORT.findall(path.read_text()))
        if found:
            out[str(path.relative_to(TESTS))] = found
    return out


def test_no_two_test_modules_name_one_fixed_port():
    owners: dict[str, list[str]] = {}
    for module, ports in ports_by_module().items():
        for p in ports:
            owners.setdefault(p, []).append(module)
    shared = {p: m for p, m in owners.items() if len(m) > 1}
    assert not shared, f"fixed ports named by more than one test module: {shared}"


def test_the_unit_tests_keep_a_module_in_one_worker():
    script = (TESTS.parent / "scripts" / "run_tests.sh").read_text()
    assert re.search(r'-m "not e2e" -n "\$\{UNIT_WORKERS:-2\}" --dist loadfile', script)
