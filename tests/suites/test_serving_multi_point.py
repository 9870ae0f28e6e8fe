"""A sweep's points in one client process (patchbench/suites/serving/multi_point.py driven by
session.py) against the one-process-per-point path: the same argv per point, the same parsed results, the flush between
points, a failing point named and the points before it kept; a fake bench_serving (a real module
run by the driver with ``runpy``, as the release's is)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import pytest

from patchbench.records import read_json
from patchbench.suite import SuiteError
from patchbench.suites.serving import Params, run
from patchbench.suites.serving.points import run_sweep
from patchbench.suites.serving.sweep import Sweep, order_seed, point_order
from tests.suites.test_serving_run import DATA, FAKE_TOOL, make_ctx

# the fake tool also records the argv it got and fails at a chosen concurrency (FAKE_FAIL_AT:
# "<concurrency>:exit" exits 5, "<concurrency>:raise" raises)
TOOL = FAKE_TOOL.replace(
    '    mode = os.environ["FAKE_BENCH"]\n',
    """    mode = os.environ["FAKE_BENCH"]
    import json
    with open(os.path.join(os.path.dirname(args.output_file), "argv.json"), "w") as f:
        json.dump(sys.argv[1:], f)
    at, _, how = os.environ.get("FAKE_FAIL_AT", "").partition(":")
    if at and args.max_concurrency == int(at):
        print("point broke", file=sys.stderr)
        if how == "raise":
            raise RuntimeError("tool blew up")
        sys.exit(5)
""",
)
assert TOOL != FAKE_TOOL

REC = DATA / "v0513_random_ids.jsonl"  # 20 requests
SWEEP = Sweep(points=[4, 1])


@pytest.fixture
def pkg(tmp_path):
    p = tmp_path / "fakepkg" / "sglang"
    p.mkdir(parents=True)
    (p / "__init__.py").write_text("")
    (p / "bench_serving.py").write_text(TOOL)
    return p


def recording_ctx(tmp_path, pkg, name, flushes, **env):
    """A context whose fake bench_serving replays the recording, flushes noted in ``flushes``."""
    base = tmp_path / name
    base.mkdir()
    ctx = make_ctx(base, pkg, f"copy:{REC}")
    srv = dataclasses.replace(ctx.server, flush_cache=lambda: flushes.append(time.monotonic()))
    return dataclasses.replace(ctx, server=srv, stock_env=dict(ctx.stock_env, **env))


def _params(**kw):
    return Params(dataset_name="random-ids", num_prompts=20, sweep=SWEEP, **kw)


def _strip(res):
    """A result without what differs between two runs of the same recording (times, paths)."""
    d = res.to_json("serving")
    for pt in d["meta"]["sweep"]["points"].values():
        for k in ("wall_s", "startup_overhead_s", "argv", "tool_source"):
            pt["meta"].pop(k, None)
    return d


def test_one_process_gives_the_per_process_results(tmp_path, pkg):
    flushes_a: list[float] = []
    flushes_b: list[float] = []
    a = recording_ctx(tmp_path, pkg, "together", flushes_a)
    b = recording_ctx(tmp_path, pkg, "apart", flushes_b)
    together = run(a, _params())
    apart = run_sweep(b, _params(), together=False)  # one bench_serving process per point
    assert together.status == "ok" == apart.status
    assert _strip(together) == _strip(apart)
    assert len(flushes_a) == 1 == len(flushes_b)  # between the two points only
    order = [SWEEP.key(p) for p in point_order(SWEEP, order_seed(a.variant, a.repeat))]
    assert together.meta["sweep"]["order"] == order
    for k in order:
        pa, pb = a.out_dir / "points" / k, b.out_dir / "points" / k
        # the argv the tool parsed is the single-point command line, minus python -m ...
        argv = read_json(pa / "command.json")["argv"]
        assert argv[1:3] == ["-m", "sglang.bench_serving"]
        assert read_json(pa / "argv.json") == argv[3:]
        assert read_json(pb / "argv.json") == read_json(pb / "command.json")["argv"][3:]
        assert [x for x in argv if "/together/" not in x] == [
            x for x in read_json(pb / "command.json")["argv"] if "/apart/" not in x
        ]
        for f in ("result.jsonl", "requests.json", "summary.json"):
            assert (pa / f).is_file() and (pb / f).is_file()
        assert (pa / "stdout.txt").read_text().startswith("fake bench_serving")
        assert read_json(pa / "point.json")["rc"] == 0
    assert (a.out_dir / "multi_point" / "stdout.txt").read_text().count("multi_point: point") == 4


def test_a_single_point_keeps_the_one_process_command(tmp_path, pkg):
    ctx = recording_ctx(tmp_path, pkg, "one", [])
    res = run(ctx, Params(dataset_name="random-ids", num_prompts=20, sweep=Sweep(points=[4])))
    assert res.status == "ok"
    assert not (ctx.out_dir / "multi_point").exists()
    assert (ctx.out_dir / "points" / "c4" / "argv.json").is_file()


@pytest.mark.parametrize("how", ["exit", "raise"])
def test_a_failing_point_is_named_and_the_earlier_points_kept(tmp_path, pkg, how):
    ctx = recording_ctx(tmp_path, pkg, "fail", [], FAKE_FAIL_AT=f"1:{how}")
    order = [SWEEP.key(p) for p in point_order(SWEEP, order_seed(ctx.variant, ctx.repeat))]
    with pytest.raises(SuiteError, match=r"sweep point c1: (.|\n)*point broke"):
        run(ctx, _params())
    pts = ctx.out_dir / "points"
    got = read_json(pts / "c1" / "point.json")
    assert got["rc"] == (5 if how == "exit" else 1)
    if how == "raise":
        assert "tool blew up" in got["error"]
        assert "RuntimeError: tool blew up" in (pts / "c1" / "stderr.txt").read_text()
    if order[0] == "c4":  # the point before the failing one keeps its result
        assert read_json(pts / "c4" / "summary.json")["status"] == "ok"


def test_a_failed_flush_stops_the_client(tmp_path, pkg):
    ctx = recording_ctx(tmp_path, pkg, "flush", [])

    def refuse():
        raise RuntimeError("flush refused")

    ctx = dataclasses.replace(ctx, server=dataclasses.replace(ctx.server, flush_cache=refuse))
    with pytest.raises(RuntimeError, match="flush refused"):
        run(ctx, _params())
    ctl = ctx.out_dir / "multi_point"
    # the second point was never handed over; the driver was told to end and did (exit 0)
    assert (ctl / "done-0").exists() and not (ctl / "point-1.json").exists()
    assert (ctl / "end").exists()
    assert (ctl / "stdout.txt").read_text().count("multi_point: point") == 2
    first = point_order(SWEEP, order_seed(ctx.variant, ctx.repeat))[0]
    assert read_json(ctx.out_dir / "points" / SWEEP.key(first) / "summary.json")["status"] == "ok"


def test_the_timeout_is_each_points_own(tmp_path, pkg):
    ctx = recording_ctx(tmp_path, pkg, "hang", [])
    ctx = dataclasses.replace(ctx, stock_env=dict(ctx.stock_env, FAKE_BENCH="hang"))
    t0 = time.monotonic()
    with pytest.raises(SuiteError, match=r"sweep point c\d+: bench_serving ran past timeout_s=2"):
        run(ctx, _params(timeout_s=2))
    assert time.monotonic() - t0 < 30


def test_the_driver_runs_alone(tmp_path, pkg):
    """multi_point.py with one point and the end handed over beforehand, as the client python
    runs it: it runs the point, marks it done and exits 0."""
    import subprocess

    out = tmp_path / "p"
    out.mkdir()
    argv = ["--dataset-name", "random-ids", "--output-file", str(out / "r.jsonl")]
    spec = {"key": "c1", "dir": str(out), "argv": argv}
    (tmp_path / "point-0.json").write_text(json.dumps(spec))
    (tmp_path / "end").write_text("")
    script = Path(__file__).parents[2] / "patchbench" / "suites" / "serving" / "multi_point.py"
    env = {"PYTHONPATH": str(pkg.parent), "FAKE_BENCH": f"copy:{REC}", "PATH": "/usr/bin:/bin"}
    cp = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert cp.returncode == 0, cp.stderr
    assert read_json(out / "argv.json") == argv
    assert (out / "r.jsonl").read_text() == REC.read_text()
    assert (tmp_path / "done-0").exists() and read_json(out / "point.json")["rc"] == 0


def test_the_driver_ends_without_its_harness(tmp_path, pkg):
    """A driver whose parent (the harness) is gone exits on its own (multi_point.ORPHANED_RC) instead
    of waiting for a point forever: a python parent starts it, waits for its first line and exits."""
    import subprocess

    script = Path(__file__).parents[2] / "patchbench" / "suites" / "serving" / "multi_point.py"
    env = {"PYTHONPATH": str(pkg.parent), "FAKE_BENCH": f"copy:{REC}", "PATH": "/usr/bin:/bin"}
    log = tmp_path / "driver.txt"
    parent = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, {str(script)!r}, {str(tmp_path)!r}],"
        f" stdout=open({str(log)!r}, 'w'), stderr=subprocess.STDOUT)\n"
        f"while 'imported' not in open({str(log)!r}).read(): time.sleep(0.05)\n"
        "print(p.pid)\n"
    )
    cp = subprocess.run(
        [sys.executable, "-c", parent], env=env, capture_output=True, text=True, timeout=60
    )
    pid = int(cp.stdout)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # gone, or a zombie nobody reaps (a container's init may not)
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the orphaned driver still waits for a point after 30 s")
