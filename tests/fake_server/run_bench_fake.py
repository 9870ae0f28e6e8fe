"""``python tests/fake_server/run_bench_fake.py CONFIG RESULTS [ARGS...]``: ``patchbench bench`` with every
server launched as the fake server and the fake suites registered (for tests that signal or kill
the runner process itself). ``CELLENV_<NAME>=value`` sets NAME on the servers (only on cell
``CELLENV_FOR``, e.g. "control/rep0", when that is set). ``FAKE_REPORT_MARK=<file>``: the report
at the end of the run first writes that file, then waits ``FAKE_REPORT_DELAY_S`` seconds (tests
signal the runner while it reports). Exits with patchbench's exit code."""

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the script's own folder holds the fake sglang package: keep it off this process's path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent.parent))

import tests.fake_server.fake_suites  # noqa: E402,F401 - registers the fake suites
from patchbench.cli import main  # noqa: E402
from patchbench.run import bench, cell  # noqa: E402

_real = cell.launch_spec


def _fake(cfg, venv, cdir, port):
    spec = _real(cfg, venv, cdir, port)
    spec.env["PYTHONPATH"] = str(HERE) + os.pathsep + spec.env["PYTHONPATH"]
    if f"{venv.name}/{cdir.name}" == os.environ.get("CELLENV_FOR", f"{venv.name}/{cdir.name}"):
        spec.env.update(
            {
                k[len("CELLENV_") :]: v
                for k, v in os.environ.items()
                if k.startswith("CELLENV_") and k != "CELLENV_FOR"
            }
        )
    return spec


cell.launch_spec = _fake
_real_report = bench._compare_and_report


def _slow_report(run_dir, **kw):
    Path(os.environ["FAKE_REPORT_MARK"]).write_text("reporting")
    time.sleep(float(os.environ.get("FAKE_REPORT_DELAY_S", "0")))
    return _real_report(run_dir, **kw)


if os.environ.get("FAKE_REPORT_MARK"):
    bench._compare_and_report = _slow_report
# main() reads sys.argv as the console script does (a process of its own: its closed-pipe guard)
sys.argv[:] = ["patchbench", "bench", sys.argv[1], "--results", sys.argv[2], *sys.argv[3:]]
sys.exit(main())
