"""Every point of a load sweep in ONE client process: ``python multi_point.py <plan.json>``.

Run with the variant's client python (docs/serving.md, "How a cell runs a sweep"); each point's
``__main__`` is re-run by :func:`runpy.run_module` with ``sys.argv`` set.

Plan: ``{"control_dir", "points": [{"key", "dir", "argv", "wrapper"}]}`` (``wrapper``, optional:
``[script, args...]`` run as ``__main__`` with ``args`` before ``argv``, the script running the
tool itself, e.g. the traffic suite's replay.py). Per point, in ``dir``:
``stdout.txt``, ``stderr.txt`` (fds 1 and 2 redirected), the tool's ``--output-file``,
``client.json`` (clientwatch.py) and ``point.json`` ``{"rc", "wall_s", "error"}``. The first
failing point ends the driver (exit 1).
Before every point after the first it creates ``<control_dir>/flush-<i>.want`` and waits for
``flush-<i>.ok`` or ``flush-<i>.fail`` (exit 3). Standard library only, besides the release."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import clientwatch  # this script's folder is sys.path[0]

#: the module run as ``python -m`` for every point
TOOL_MODULE = "sglang.bench_serving"
#: seconds between looks for the harness's answer to a flush request
ANSWER_POLL_S = 0.05
#: exit code when the harness reports a failed flush
FLUSH_FAILED_RC = 3


def wait_flush(control: Path, index: int) -> bool:
    """Ask the harness to flush the cache before point ``index`` and wait for its answer; True
    when flushed, False when it failed."""
    (control / f"flush-{index}.want").write_text("")
    while True:
        if (control / f"flush-{index}.ok").exists():
            return True
        if (control / f"flush-{index}.fail").exists():
            return False
        time.sleep(ANSWER_POLL_S)


def run_one(argv: list[str], out_dir: Path, wrapper: list[str] = ()) -> tuple[int, str | None]:
    """Run the tool once with ``argv`` (through ``wrapper``, see the plan), watched
    (``clientwatch.watch``: ``out_dir``/client.json), fds 1 and 2 into ``out_dir``/stdout.txt,
    stderr.txt; (exit code, the exception's last line or None)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    so = open(out_dir / "stdout.txt", "wb")  # closed below, after fds 1 and 2 return
    se = open(out_dir / "stderr.txt", "wb")
    os.dup2(so.fileno(), 1)
    os.dup2(se.fileno(), 2)
    try:
        with clientwatch.watch(out_dir / "client.json"):
            return clientwatch.run_module(TOOL_MODULE, argv, wrapper)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        so.close()
        se.close()


def main(plan_path: str) -> int:
    """Run the plan at ``plan_path`` (see the module docstring); the driver's exit code."""
    plan = json.loads(Path(plan_path).read_text())
    control = Path(plan["control_dir"])
    t = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        __import__(TOOL_MODULE)
    print(f"multi_point: imported {TOOL_MODULE} in {time.monotonic() - t:.1f} s", flush=True)
    # runpy warns that the module is already imported: expected, the import above is the point
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
    for i, pt in enumerate(plan["points"]):
        if i and not wait_flush(control, i):
            print(f"multi_point: the cache flush before {pt['key']} failed", flush=True)
            return FLUSH_FAILED_RC
        out = Path(pt["dir"])
        out.mkdir(parents=True, exist_ok=True)
        print(f"multi_point: point {pt['key']} ({i + 1}/{len(plan['points'])})", flush=True)
        t = time.monotonic()
        rc, err = run_one(list(pt["argv"]), out, pt.get("wrapper") or [])
        wall = time.monotonic() - t
        (out / "point.json").write_text(json.dumps({"rc": rc, "wall_s": wall, "error": err}))
        print(f"multi_point: point {pt['key']} exit {rc} in {wall:.1f} s", flush=True)
        if rc != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
