"""The python a matrix unit's bench runs with on its node, chosen before anything runs, and built
only when the user asked for it.

Modes (``spec["env_setup"]``): "current" (this interpreter), "auto" (default locally) and "make"
(default on Ray), which take the first that holds the unit's pin (:func:`plan_env`):

1. this interpreter, when its sglang is the pin and its ``patchbench.suites`` comes from the
   checkout bench runs in;
2. the checkout's venv for the pin (:func:`patchbench.envs.envinfo.venv_dir`);
3. "make" only: ``<env_root>/sglang-<pin>``, a persistent venv per pin on the node.

``make setup`` (idempotent) refreshes a venv found in 2 or 3. When none holds the pin the plan
is a *build*, done only with ``spec["build_envs"]`` (else EnvironmentNotReady, exit 3, naming
the node, the path and the size).
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, ConfigDict

from patchbench.envs.envinfo import environment_for, venv_dir
from patchbench.errors import EnvironmentNotReady, UsageError
from patchbench.inputs import REPO_ROOT

#: where nodes keep one environment per pin, reused across units and jobs
DEFAULT_ENV_ROOT = "~/.cache/patchbench/envs"
#: the flag that allows building a missing environment (patchbench matrix)
BUILD_FLAG = "--build-envs"


def node_name() -> str:
    """This machine's host name (how matrix.json names the node a unit ran on)."""
    return socket.gethostname()


def machine_key() -> str:
    """``<host name>/<boot id>``: equal in two processes only on the same machine."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{node_name()}/{boot}"


def log_tail(path: Path, n: int = 20) -> str:
    """The last ``n`` lines of a text file ("" when it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def expected_env_gb(pin: str, checkout: Path = REPO_ROOT) -> float | None:
    """About how many GB a new environment of ``pin`` takes: the ``# disk-gb:`` line of
    ``requirements/cpu-<pin>.txt`` (None without one)."""
    try:
        text = (checkout / "requirements" / f"cpu-{pin}.txt").read_text()
    except OSError:
        return None
    m = re.search(r"^# disk-gb: *([0-9.]+)", text, re.M)
    return float(m.group(1)) if m else None


EnvSource = Literal["current", "interpreter", "checkout", "env_root", "build"]


class EnvPlan(BaseModel):
    """Where units of one pin get their python on one node (``matrix.json``'s ``environments[]``):
    ``source`` (module docstring; "build": would be built at ``path``), ``path``, ``why``."""

    model_config = ConfigDict(extra="forbid")

    pin: str
    node: str
    source: EnvSource
    path: str
    expected_gb: float | None = None
    why: str = ""

    @property
    def python(self) -> str:
        """The python bench runs with."""
        if self.source in ("current", "interpreter"):
            return self.path
        return str(Path(self.path) / "bin" / "python")

    def describe(self) -> str:
        """One line: ``<pin> on <node>: <what>``."""
        what = {
            "current": f"this interpreter {self.path} (--env-setup current)",
            "interpreter": f"the worker's own interpreter {self.path} (holds the pin)",
            "checkout": f"the checkout's venv {self.path} (`make setup` only refreshes it)",
            "env_root": f"the node's venv {self.path} (`make setup` only refreshes it)",
            "build": f"MISSING: would build {self.path} ({size_txt(self.expected_gb)})",
        }[self.source]
        return f"sglang {self.pin} on {self.node}: {what}"


def size_txt(gb: float | None) -> str:
    """ "about 9 GB", or "size unknown"."""
    return f"about {gb:g} GB" if gb is not None else "size unknown: no CPU profile for the pin"


def _interpreter_facts(python: str) -> tuple[str | None, Path | None]:
    """(the sglang version ``python`` holds, the folder its ``patchbench.suites`` comes from);
    None for what it cannot tell."""
    code = (
        "import importlib.metadata as m, pathlib\n"
        "try: print(m.version('sglang'))\nexcept Exception: print('')\n"
        "try:\n import patchbench.suites as s\n"
        " print(pathlib.Path(s.__file__).resolve().parent)\n"
        "except Exception: print('')\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None, None
    out += ["", ""]
    return (out[0].strip() or None), (Path(out[1].strip()) if out[1].strip() else None)


def plan_env(spec: dict, workdir: Path) -> EnvPlan:
    """Where a unit of ``spec["sglang"]`` gets its python on this node (module docstring);
    changes nothing. UsageError for an unknown mode."""
    mode, pin, node = spec.get("env_setup") or "current", str(spec["sglang"]), node_name()
    if mode == "current":
        return EnvPlan(pin=pin, node=node, source="current", path=sys.executable)
    if mode not in ("auto", "make"):
        raise UsageError(f"env_setup must be current, auto or make, not {mode!r}")
    have, suites_from = _interpreter_facts(sys.executable)
    own = {(workdir / "suites").resolve(), (workdir / "patchbench" / "suites").resolve()}
    if have == pin and suites_from in own:
        return EnvPlan(pin=pin, node=node, source="interpreter", path=sys.executable)
    looked = [
        f"this interpreter (sglang {have or 'none'}, its patchbench.suites from {suites_from})"
    ]
    cands: list[tuple[EnvSource, Path]] = [("checkout", venv_dir(pin, workdir))]
    if mode == "make":
        root = Path(os.path.expanduser(spec.get("env_root") or DEFAULT_ENV_ROOT))
        cands.append(("env_root", root / f"sglang-{pin}"))
    for source, venv in cands:
        if environment_for(pin, venvs=[venv], current=False) is not None:
            return EnvPlan(pin=pin, node=node, source=source, path=str(venv))
        looked.append(str(venv))
    return EnvPlan(
        pin=pin,
        node=node,
        source="build",
        path=str(cands[-1][1]),
        expected_gb=expected_env_gb(pin),
        why="looked at " + "; ".join(looked),
    )


def missing_env_message(plans: list[EnvPlan]) -> str:
    """Why nothing runs: the environments that would be built and how to allow it."""
    total = sum(p.expected_gb or 0 for p in plans)
    lines = "; ".join(
        f"sglang {p.pin} on {p.node} at {p.path} ({size_txt(p.expected_gb)})" for p in plans
    )
    return (
        f"{len(plans)} environment(s) would be built ({lines}"
        + (f"; {total:g} GB in all" if total else "")
        + f"); nothing is built without {BUILD_FLAG}: pass it to build them, set the pin up "
        "there first (`make setup SGLANG=<pin>`), or use a pin the node already holds"
        + (f" ({plans[0].why})" if len(plans) == 1 and plans[0].why else "")
    )


def prepare_python(spec: dict, workdir: Path, log_file: IO[str]) -> str:
    """The python that runs a unit's bench, after ``make setup`` (under a file lock, output to
    ``log_file``) on the venv :func:`plan_env` found or, with ``spec["build_envs"]``, a new one.
    Raises EnvironmentNotReady (exit 3) for a missing environment without ``build_envs`` or a
    failed setup (with its output's tail), UsageError for an unknown mode."""
    plan = plan_env(spec, workdir)
    if plan.source in ("current", "interpreter"):
        return plan.path
    if plan.source == "build" and not spec.get("build_envs"):
        raise EnvironmentNotReady(missing_env_message([plan]))
    pin, venv = plan.pin, Path(plan.path)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".lock-sglang-{pin}", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        cmd = ["make", "-C", str(workdir), "setup", f"SGLANG={pin}", f"VENV={venv}"]
        log_file.write(f"$ {' '.join(cmd)}\n")
        log_file.flush()
        code = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT).returncode
        if code == 0 and venv != venv_dir(pin, workdir):
            code = _install_checkout(plan.python, workdir, log_file)
    if code != 0:
        log_file.flush()
        raise EnvironmentNotReady(
            f"setting up sglang {pin} on {node_name()} failed "
            f"(exit {code}): " + log_tail(Path(log_file.name), 5).replace("\n", " | ")
        )
    return plan.python


def _install_checkout(python: str, workdir: Path, log_file: IO[str]) -> int:
    """Install ``workdir`` (editable, no dependencies) into ``python``'s venv unless it imports
    patchbench from there already; the exit code."""
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
