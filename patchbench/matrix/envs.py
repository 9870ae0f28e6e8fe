"""The python a unit's bench runs with: this interpreter, or a venv per sglang pin set up with the
repository's ``make setup`` (reused by every unit and job on a node).

Modes (``spec["env_setup"]`` of :func:`prepare_python`): "current" (this interpreter), "auto" (this
interpreter when its sglang is the unit's pin, else ``make setup SGLANG=<pin>`` into the
checkout's venv for the pin, :func:`pin_venv`), "make" (``make setup SGLANG=<pin>
VENV=<env_root>/sglang-<pin>``: a persistent venv per pin on the node, outside the shipped working
directory; then this checkout is installed into it when it is not the one installed).
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

from patchbench.errors import EnvironmentNotReady, UsageError

#: where nodes keep one environment per pin, reused across units and jobs
DEFAULT_ENV_ROOT = "~/.cache/patchbench/envs"


def node_name() -> str:
    """This machine's host name (how matrix.json names the node a unit ran on)."""
    return socket.gethostname()


def log_tail(path: Path, n: int = 20) -> str:
    """The last ``n`` lines of a text file ("" when it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def pin_venv(workdir: Path, pin: str) -> Path:
    """The venv ``make setup SGLANG=<pin>`` makes inside a checkout (the Makefile's VENV rule:
    ``.venv`` for 0.5.1.post3, ``.venv-<pin>`` otherwise)."""
    return workdir / (".venv" if pin == "0.5.1.post3" else f".venv-{pin}")


def _installed_sglang(python: str) -> str | None:
    try:
        out = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _venv_for(spec: dict, workdir: Path) -> Path | None:
    """The venv the unit's pin needs under ``spec["env_setup"]``; None: this interpreter."""
    mode, pin = spec.get("env_setup", "current"), spec["sglang"]
    if mode == "current":
        return None
    if mode == "auto":
        return None if _installed_sglang(sys.executable) == pin else pin_venv(workdir, pin)
    if mode == "make":
        root = Path(os.path.expanduser(spec.get("env_root") or DEFAULT_ENV_ROOT))
        return root / f"sglang-{pin}"
    raise UsageError(f"env_setup must be current, auto or make, not {mode!r}")


def prepare_python(spec: dict, workdir: Path, log_file: IO[str]) -> str:
    """The python that runs a unit's bench, setting up its pin's environment first (see the
    module docstring for ``spec["env_setup"]``; ``spec["sglang"]``: the pin; ``spec["env_root"]``:
    where "make" keeps its venvs, default :data:`DEFAULT_ENV_ROOT`).

    ``make setup`` is idempotent; a file lock keeps two units on one node from setting up the
    same venv at once; its output goes to ``log_file``. Raises EnvironmentNotReady with the setup
    output's tail when setup fails, UsageError for an unknown mode.
    """
    pin = spec["sglang"]
    venv = _venv_for(spec, workdir)
    if venv is None:
        return sys.executable
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = str(venv / "bin" / "python")
    with open(venv.parent / f".lock-sglang-{pin}", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        cmd = ["make", "-C", str(workdir), "setup", f"SGLANG={pin}", f"VENV={venv}"]
        log_file.write(f"$ {' '.join(cmd)}\n")
        log_file.flush()
        code = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT).returncode
        if code == 0 and spec.get("env_setup") == "make":
            code = _install_checkout(python, workdir, log_file)
    if code != 0:
        log_file.flush()
        raise EnvironmentNotReady(
            f"setting up sglang {pin} on {node_name()} failed "
            f"(exit {code}): " + log_tail(Path(log_file.name), 5).replace("\n", " | ")
        )
    return python


def _install_checkout(python: str, workdir: Path, log_file: IO[str]) -> int:
    """Install ``workdir`` (editable, no dependencies) into the venv of ``python`` unless that
    checkout is the one it already imports patchbench from; the exit code (0 when nothing to
    do)."""
    where = subprocess.run(
        [
            python,
            "-c",
            "import patchbench, pathlib; "
            "print(pathlib.Path(patchbench.__file__).resolve().parent.parent)",
        ],
        capture_output=True,
        text=True,
    )
    if where.stdout.strip() == str(workdir.resolve()):
        return 0
    cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    cmd += ["--no-deps", "-e", str(workdir)]
    return subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT).returncode
