"""Packaging: the top-level suites/ folder is installed as ``patchbench.suites`` (nothing installs
a generic top-level ``suites``), every suite package is listed, and every listed package exists.
Read through setuptools' own reader of pyproject.toml (what a wheel build uses), so it is fast."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import read_configuration

REPO = Path(__file__).resolve().parent.parent


def setuptools_config() -> tuple[list[str], dict[str, str]]:
    with warnings.catch_warnings():  # older setuptools call [tool.setuptools] "beta"
        warnings.simplefilter("ignore")
        tool = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]
    return list(tool["packages"]), dict(tool.get("package-dir", {}))


def source_dir(package: str, package_dir: dict[str, str]) -> Path:
    """The folder setuptools builds ``package`` from (the longest package-dir prefix wins)."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in package_dir:
            return REPO / package_dir[prefix] / Path(*parts[n:])
    return REPO / package_dir.get("", ".") / Path(*parts)


def test_every_suite_package_is_installed_under_patchbench_suites():
    packages, package_dir = setuptools_config()
    found = {
        "patchbench.suites"
        + "".join("." + p for p in init.parent.relative_to(REPO / "suites").parts)
        for init in (REPO / "suites").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert {"patchbench.suites.mmmu", "patchbench.suites.serving"} <= found  # the walk works
    missing = sorted(found - set(packages))
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_every_patchbench_subpackage_is_installed():
    """Every folder under patchbench/ that is a package all the way up (an ``__init__.py`` in it
    and in each folder above it) is listed; the CPU stand-ins under patchbench/shims/cpu/ are
    package data, not packages of patchbench."""
    packages, _ = setuptools_config()
    root = REPO / "patchbench"
    found = set()
    for init in root.rglob("__init__.py"):
        rel = init.parent.relative_to(root)
        if root.joinpath(*rel.parts[:1]).is_symlink() or "__pycache__" in rel.parts:
            continue  # patchbench/suites -> ../suites: listed through its own package-dir
        if all(
            (root.joinpath(*rel.parts[:n]) / "__init__.py").is_file() for n in range(len(rel.parts))
        ):
            found.add(".".join(("patchbench", *rel.parts)))
    assert {"patchbench", "patchbench.config", "patchbench.shims"} <= found  # the walk works
    missing = sorted(found - set(packages))
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_every_listed_package_exists_and_nothing_installs_a_top_level_suites():
    packages, package_dir = setuptools_config()
    assert package_dir.get("patchbench.suites") == "suites"
    tops = {p.split(".")[0] for p in packages}
    assert tops == {"patchbench"}, f"top-level packages installed: {sorted(tops)}"
    for p in packages:
        assert (source_dir(p, package_dir) / "__init__.py").is_file(), p


def test_console_script_is_the_cli_main():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripts = read_configuration(REPO / "pyproject.toml")["project"]["scripts"]
    assert scripts == {"patchbench": "patchbench.cli:main"}
    from patchbench import cli

    assert callable(cli.main)
