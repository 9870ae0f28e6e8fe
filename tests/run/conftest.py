"""The fake server as ``run_bench``'s ``launch_spec`` (tests/fake_server first on every server's
PYTHONPATH)."""

import os
from pathlib import Path

import pytest

from patchbench.run import cell

FAKE = Path(__file__).parent.parent / "fake_server"


class FakeLaunch(dict):
    """A ``launch_spec``: every server is the fake server; ``self["<variant>/rep<k>"]``:
    environment added to that cell's server (faults); ``seen``: {cell label: its LaunchSpec}."""

    def __init__(self) -> None:
        super().__init__()
        self.real = cell.launch_spec
        self.seen: dict = {}

    def __call__(self, cfg, venv, cdir, port):
        spec = self.real(cfg, venv, cdir, port)
        spec.env["PYTHONPATH"] = str(FAKE) + os.pathsep + spec.env["PYTHONPATH"]
        label = f"{venv.name}/{cdir.name}"
        spec.env.update(self.get(label, {}))
        self.seen[label] = spec
        return spec


@pytest.fixture
def fake_env() -> FakeLaunch:
    """Pass as ``run_bench(..., launch_spec=fake_env)``; set faults per cell label."""
    return FakeLaunch()


@pytest.fixture
def fake_cli_env(monkeypatch) -> FakeLaunch:
    """The same for ``patchbench bench`` through ``cli.main``, which has no such parameter: it
    replaces patchbench.run.cell.launch_spec for the test."""
    fake = FakeLaunch()
    monkeypatch.setattr(cell, "launch_spec", fake)
    return fake
