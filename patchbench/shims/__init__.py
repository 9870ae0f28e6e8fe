"""What patchbench puts on the sglang server's PYTHONPATH.

- ``site/sitecustomize.py``: loaded by every server process; switched by environment variables
  (CPU stand-ins, stable vocabulary order, :data:`HOOKS_ENV`); beside it
  ``patchbench_import_hook.py``, the loader the suites' in-server hooks use.
- ``cpu/<name>/``: stand-in packages for what PyPI lacks without an NVIDIA GPU (``sgl_kernel``,
  ``vllm``: docs/FACTS.md section 5), named in ``server.cpu_stand_ins``. Every stand-in function
  prints :data:`CALLED_MARKER` and raises when called; the harness fails the cell on the marker.
"""

from pathlib import Path

SHIMS_DIR = Path(__file__).resolve().parent
SITE_DIR = SHIMS_DIR / "site"
CPU_DIR = SHIMS_DIR / "cpu"
#: the server's environment variable naming the hook files the site hook imports
#: (``os.pathsep``-separated; ``Instrumentation.hooks`` of every suite of a correctness cell)
HOOKS_ENV = "PATCHBENCH_SERVER_HOOKS"
#: printed to stderr (the server log) by any stand-in that is called
CALLED_MARKER = "PATCHBENCH-STAND-IN-CALLED"


def available_stand_ins() -> list[str]:
    """Names accepted in ``server.cpu_stand_ins`` (folders under shims/cpu/)."""
    return sorted(p.name for p in CPU_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))


def stand_in_path(name: str) -> Path:
    """Folder to put on PYTHONPATH for stand-in ``name``; KeyError names the allowed ones."""
    p = CPU_DIR / name
    if not p.is_dir():
        raise KeyError(
            f"unknown CPU stand-in '{name}'; available: {', '.join(available_stand_ins())}"
        )
    return p
