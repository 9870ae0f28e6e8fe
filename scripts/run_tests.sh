#!/usr/bin/env bash
# The test command of `make test`: unit tests first (fast, fail early), then the end-to-end
# tests against real sglang servers on the CPU. Prints the time each part took.
# The unit tests run in UNIT_WORKERS pytest-xdist processes (2: they wait on subprocesses and
# timers about half of their time, so two overlap on 2 cores; 0 runs them in this process), one
# module's tests in one worker (--dist loadfile: the fake-server tests of a module share a fixed
# port; tests/run/test_fixed_ports.py keeps ports apart between modules); the
# end-to-end tests share one session's demo runs and server, so they run in one process.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
# the tests that need sglang must run here: a missing sglang fails the run (tests/conftest.py)
export PATCHBENCH_REQUIRE_SGLANG=1
t0=$(date +%s)
$PY -m pytest -q -m "not e2e" -n "${UNIT_WORKERS:-2}" --dist loadfile --durations=10 -p no:cacheprovider "$@"
rc1=$?
t1=$(date +%s)
echo "== unit tests: $((t1 - t0)) s (exit $rc1)"
$PY -m pytest -q -m "e2e" --durations=0 -p no:cacheprovider "$@"
rc2=$?
t2=$(date +%s)
echo "== end-to-end tests: $((t2 - t1)) s (exit $rc2); all tests: $((t2 - t0)) s"
# pytest exit 5 = no test selected (e.g. a -k filter that only matches one group)
[ $rc1 -eq 5 ] && rc1=0
[ $rc2 -eq 5 ] && rc2=0
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]
