"""scripts/setup.sh's disk check: a fresh CPU venv on a disk with less free space than the pin's
``# disk-gb:`` line is refused at once (exit 4, naming the need, the free space and the folder),
before any venv or download exists. Runs on a copy of the script and its inputs, so nothing is
installed; the free space is read with os.statvfs (independent of the script's df)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PINS = sorted(p.name[len("cpu-") : -len(".txt")] for p in (REPO / "requirements").glob("cpu-*.txt"))


def free_gb(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // 2**30


def copy_inputs(dst: Path, pin: str, disk_gb: int) -> Path:
    """A repo copy holding only what setup.sh reads; the pin's disk-gb line set to ``disk_gb``."""
    (dst / "scripts").mkdir(parents=True)
    (dst / "requirements").mkdir()
    shutil.copy2(REPO / "scripts" / "setup.sh", dst / "scripts" / "setup.sh")
    shutil.copy2(REPO / "pyproject.toml", dst / "pyproject.toml")
    shutil.copy2(REPO / "requirements" / "harness.txt", dst / "requirements" / "harness.txt")
    req = (REPO / "requirements" / f"cpu-{pin}.txt").read_text()
    req = re.sub(r"(?m)^# disk-gb: *\d+", f"# disk-gb: {disk_gb}", req)
    (dst / "requirements" / f"cpu-{pin}.txt").write_text(req)
    return dst / "scripts" / "setup.sh"


@pytest.mark.parametrize("pin", PINS)
def test_every_cpu_profile_states_its_disk_need(pin):
    req = (REPO / "requirements" / f"cpu-{pin}.txt").read_text()
    m = re.search(r"(?m)^# disk-gb: *(\d+)", req)
    assert m, f"requirements/cpu-{pin}.txt has no '# disk-gb: N' line"
    assert 1 <= int(m.group(1)) <= 64


def test_fresh_venv_on_a_too_small_disk_is_refused_before_anything_is_made(tmp_path):
    pin = PINS[0]
    need = free_gb(tmp_path) + 1000  # more than this disk has free
    script = copy_inputs(tmp_path / "repo", pin, need)
    venv = tmp_path / "venvs" / "v"
    proc = subprocess.run(
        ["bash", str(script), pin, str(venv), "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 4, proc.stderr
    assert f"needs about {need} GB free" in proc.stderr
    assert f"{free_gb(tmp_path)} GB free there" in proc.stderr
    assert f"requirements/cpu-{pin}.txt" in proc.stderr
    assert not venv.exists()


def test_enough_disk_passes_the_check(tmp_path):
    """With a need of 0 GB the check passes and setup goes on to make the venv; the run is
    stopped by a python that exits 9 (PYTHON=false-like stand-in), before pip is called."""
    pin = PINS[0]
    script = copy_inputs(tmp_path / "repo", pin, 0)
    fake_py = tmp_path / "py"
    fake_py.write_text(
        '#!/bin/sh\ncase "$1" in -c) echo 3.11.7;; *) exit 9;; esac\n', encoding="utf-8"
    )
    fake_py.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(script), pin, str(tmp_path / "v"), "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": str(fake_py)},
    )
    assert proc.returncode == 9, proc.stderr
    assert "needs about" not in proc.stderr
    assert f"setup: creating {tmp_path / 'v'}" in proc.stdout
