"""Many bench_serving calls in ONE client process: ``python multi_point.py <control_dir>``.

Run with the variant's client python by :class:`patchbench.suites.serving.session.ClientSession`
(docs/serving.md, "How a cell runs a sweep"), which hands it the points one at a time, so a
capacity search can choose each probe from the last. Each point's ``__main__`` is re-run by
:func:`runpy.run_module` with ``sys.argv`` set.

Protocol, in ``control_dir``: point i is ``point-<i>.json`` ``{"key", "dir", "argv", "wrapper"}``
(``wrapper``, optional: ``[script, args...]`` run as ``__main__`` with ``args`` before ``argv``,
the script running the tool itself, e.g. the traffic suite's replay.py); a file ``end`` means no
more points (exit 0). Per point, in ``dir``: ``stdout.txt``, ``stderr.txt`` (fds 1 and 2
redirected), the tool's ``--output-file``, ``client.json`` (clientwatch.py) and ``point.json``
``{"rc", "wall_s", "error"}``; then ``done-<i>`` in ``control_dir``. A failing point ends the
driver (exit 1); so does losing its parent, the harness (exit 4). Standard library only, besides
the release."""

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
#: seconds between looks for the harness's next point
ANSWER_POLL_S = 0.02
#: exit code when the harness that started the driver is gone
ORPHANED_RC = 4


def next_point(control: Path, index: int, parent: int) -> dict | None:
    """Wait for point ``index`` (its spec) or the ``end`` file (None); exit ``ORPHANED_RC`` when
    the parent process ``parent`` is gone, so no driver outlives the harness."""
    spec = control / f"point-{index}.json"
    while True:
        if spec.exists():
            return json.loads(spec.read_text())
        if (control / "end").exists():
            return None
        if os.getppid() != parent:
            sys.exit(ORPHANED_RC)
        time.sleep(ANSWER_POLL_S)


def run_one(argv: list[str], out_dir: Path, wrapper: list[str] = ()) -> tuple[int, str | None]:
    """Run the tool once with ``argv`` (through ``wrapper``, see the protocol), watched
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


def main(control_dir: str) -> int:
    """Run the points handed over in ``control_dir`` (see the protocol); the driver's exit code."""
    control = Path(control_dir)
    parent = os.getppid()
    t = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        __import__(TOOL_MODULE)
    print(f"multi_point: imported {TOOL_MODULE} in {time.monotonic() - t:.1f} s", flush=True)
    # runpy warns that the module is already imported: expected, the import above is the point
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
    i = 0
    while (pt := next_point(control, i, parent)) is not None:
        out = Path(pt["dir"])
        out.mkdir(parents=True, exist_ok=True)
        print(f"multi_point: point {pt['key']} ({i + 1})", flush=True)
        t = time.monotonic()
        rc, err = run_one(list(pt["argv"]), out, pt.get("wrapper") or [])
        wall = time.monotonic() - t
        (out / "point.json").write_text(json.dumps({"rc": rc, "wall_s": wall, "error": err}))
        (control / f"done-{i}").write_text("")
        print(f"multi_point: point {pt['key']} exit {rc} in {wall:.1f} s", flush=True)
        if rc != 0:
            return 1
        i += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
