"""Packaging: the packages a wheel installs are found, not listed (one folder under
patchbench/suites/ is one suite), and nothing but ``patchbench`` is installed at the top. Read
through setuptools' own reader of pyproject.toml, which runs its package finder (what a wheel
build uses), so it is fast."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import read_configuration

REPO = Path(__file__).resolve().parents[2]


def installed_packages() -> list[str]:
    """The packages a wheel of this checkout installs (pyproject's ``packages.find``)."""
    with warnings.catch_warnings():  # older setuptools call [tool.setuptools] "beta"
        warnings.simplefilter("ignore")
        tool = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]
    return list(tool["packages"])  # setuptools' reader runs the find already


def test_every_suite_folder_is_an_installed_package():
    packages = installed_packages()
    suites = {
        "patchbench.suites." + d.name
        for d in (REPO / "patchbench" / "suites").iterdir()
        if (d / "__init__.py").is_file()
    }
    assert {"patchbench.suites.mmmu", "patchbench.suites.serving"} <= suites  # the walk works
    assert suites <= set(packages)


def test_only_patchbench_at_the_top_and_no_cpu_stand_in_as_a_package():
    packages = installed_packages()
    assert {p.split(".")[0] for p in packages} == {"patchbench"}
    assert "patchbench.shims" in packages
    assert not [p for p in packages if p.startswith("patchbench.shims.")]
    assert not [p for p in packages if p.startswith(("tools", "tests"))]


def test_console_script_is_the_cli_main():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripts = read_configuration(REPO / "pyproject.toml")["project"]["scripts"]
    assert scripts == {"patchbench": "patchbench.cli:main"}
    from patchbench import cli

    assert callable(cli.main)


def test_the_repository_tracks_no_symbolic_link_and_ignores_local_environments():
    """A tracked link (e.g. a worktree's ``.cache`` pointing at another checkout) breaks a clean
    clone and, on checkout, replaces the real folder; the local environments and caches are
    ignored as folders and as links."""
    import subprocess

    staged = subprocess.run(
        ["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert [line for line in staged.splitlines() if line.startswith("120000")] == []
    names = [".cache", ".venv", ".venv-0.5.23", ".venv-x"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *names],
        cwd=REPO, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert ignored == names
