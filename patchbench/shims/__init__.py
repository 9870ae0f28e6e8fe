"""Import-time stand-ins and in-server instrumentation (put on the sglang server's PYTHONPATH).

- ``site/``: the site hook, a ``sitecustomize.py`` loaded by every sglang process (sglang spawns
  its scheduler and detokenizer, so a monkeypatch in the launcher would not reach them). What it
  does is switched by environment variables the harness sets: ``PATCHBENCH_CPU_STAND_INS=1``
  (torch compatibility and ``torch.ops.sgl_kernel`` handles for the CPU engine),
  ``PATCHBENCH_STABLE_VOCAB_ORDER=1``, and :data:`HOOKS_ENV` (the suites' in-server hook files, set
  in correctness cells only). Beside it, ``patchbench_import_hook.py``: the loader those hooks use
  to wrap an sglang module when it is imported.
- ``cpu/<name>/``: stand-in packages for what PyPI lacks on a machine without an NVIDIA GPU
  (docs/FACTS.md section 5): ``sgl_kernel`` (the CPU build of sgl-kernel is not on PyPI) and ``vllm``
  (sglang 0.5.1.x imports vllm layers on a CPU without AMX). A config names the ones it needs in
  ``server.cpu_stand_ins``. Every stand-in function raises when called and prints
  :data:`CALLED_MARKER` first, so the harness fails the cell when the server log shows it.
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
