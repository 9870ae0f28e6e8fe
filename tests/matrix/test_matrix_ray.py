"""The Ray executor (patchbench.matrix.executors.RayExecutor) on a real local Ray cluster started here:
two nodes (``ray.cluster_utils.Cluster``), each with 1 CPU, 2 logical GPUs and its own
``accelerator_type:<T>`` resource, no dashboard, an 80 MB object store. Units run bench with the
fake server and the mx_fake suite (tests/matrix/test_matrix.py as the bench command).

Checked: each unit lands on the node of its GPU type; run folders come back as archives and are
unpacked into <matrix run>/<unit id>/ with the same files a local run writes; a failing unit is
reported while the others finish; a unit no node can take fails at once with a message; Ctrl-C
cancels the running unit and its fake server's whole process group is gone, finished units kept.
The real-CPU unit through Ray is marked e2e (not run by the unit tests).
"""

import _thread
import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from patchbench.errors import Interrupted, RunFailed
from patchbench.inputs import REPO_ROOT
from patchbench.matrix.driver import run_matrix
from patchbench.matrix.executors import LocalExecutor, RayExecutor
from patchbench.matrix.spec import load_matrix
from patchbench.records import read_json
from tests.matrix import test_matrix as tm

if importlib.util.find_spec("ray") is None:  # never skip silently: make test installs Ray
    pytest.fail("the Ray tests need Ray: `make setup RAY=1` or `pip install .[ray]`", pytrace=False)

import ray
from ray.cluster_utils import Cluster

OBJECT_STORE = 80 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster():
    """Two nodes: X (the head) and Y, each 1 CPU, 2 logical GPUs; {accelerator type: node id}."""
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "num_gpus": 2,
            "resources": {"accelerator_type:X": 1},
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
        },
    )
    c.add_node(
        num_cpus=1,
        num_gpus=2,
        resources={"accelerator_type:Y": 1},
        object_store_memory=OBJECT_STORE,
    )
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        nodes = {
            next(
                k.split(":", 1)[1] for k in n["Resources"] if k.startswith("accelerator_type:")
            ): n["NodeID"]
            for n in ray.nodes()
            if n["Alive"]
        }
        yield nodes
    finally:
        ray.shutdown()
        c.shutdown()


def executor(**kw) -> RayExecutor:
    opts = {"ship_code": False, "env_setup": "current", "command": tm.FAKE_COMMAND}
    return RayExecutor(**{**opts, "stop_grace_s": 10, "log": lambda s: None, **kw})


def files_of(run: Path) -> set[str]:
    """The relative paths of a run folder's files, with the variable parts (timestamps in names,
    the fake server's per-process files) left out."""
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()}


def test_units_land_on_their_gpu_type_come_back_and_a_failure_is_kept(cluster, tmp_path):
    bases = [tm.write_base(tmp_path, name=f"cfg{i}") for i in range(3)]
    flag = tmp_path / "fail-flag"
    flag.touch()
    m = tm.write_matrix(
        tmp_path,
        f"""\
        name: on-ray
        units:
          - {{config: {bases[0]}, gpu_type: X}}
          - {{config: {bases[1]}, gpu_type: Y}}
          - {{config: {bases[2]}, gpu_type: Y, set: {{suites.mx_fake.fail_if_exists: "{flag}"}}}}
          - {{config: {bases[0]}, gpu_type: Z}}
        """,
    )
    mx = load_matrix(m)
    t0 = time.monotonic()
    with pytest.raises(RunFailed, match=r"2 of 4 units did not end ok") as ei:
        run_matrix(m, executor=executor(), results=tmp_path / "results", log=lambda s: None)
    wall = time.monotonic() - t0
    mdir = ei.value.run_dir
    units = {u["id"]: u for u in read_json(mdir / "matrix.json")["units"]}
    x, y, y_fail, z = (units[u.id] for u in mx.units)
    # routing: the node id Ray reports for the task is the node of the unit's accelerator type
    assert x["status"] == "ok" and cluster["X"][:12] in x["node"]
    assert y["status"] == "ok" and cluster["Y"][:12] in y["node"]
    assert y_fail["status"] == "failed" and y_fail["exit_code"] == 4
    assert cluster["Y"][:12] in y_fail["node"]
    # the unschedulable unit failed before submission, naming what is missing and what exists
    assert z["status"] == "unschedulable" and z["node"] is None
    assert "no node of the cluster has GPU type Z (resource accelerator_type:Z)" in z["message"]
    assert "types present: X, Y" in z["message"]
    # run folders came back through the object store and were unpacked in place
    for u, ok in ((x, True), (y, True), (y_fail, False)):
        run = mdir / u["id"]
        man = read_json(run / "manifest.json")
        assert all(
            (c["status"] == "ok") == (ok or c["variant"] == "baseline") for c in man["cells"]
        )
        assert (run / "compare.json").exists() and (run / "report.md").exists()
        assert u["archive_bytes"] > 0 and u["timings_s"]["unpack"] >= 0
    assert not (mdir / z["id"]).exists()
    report = (mdir / "report.md").read_text()
    assert (
        f"[{x['id']}]({x['id']}/report.md)" in report and f"- `{z['id']}`: unschedulable" in report
    )
    # the two Y units shared one node with 1 CPU: they ran one after the other, never together
    ty = sorted(
        (u["timings_s"]["start_delay"], u["timings_s"]["start_delay"] + u["timings_s"]["task"])
        for u in (y, y_fail)
    )
    assert ty[1][0] >= ty[0][1] - 0.5
    # the later Y unit queued for the node the first one held; the queueing is not overhead
    later = max((y, y_fail), key=lambda u: u["timings_s"]["start_delay"])
    for u in (x, y, y_fail):
        t = u["timings_s"]
        assert t["queued"] + t["dispatch"] == pytest.approx(t["start_delay"], abs=0.01)
    assert later["timings_s"]["queued"] >= min(y["timings_s"]["task"], y_fail["timings_s"]["task"])
    assert "| queued s |" in report
    print(
        f"\nray matrix wall {wall:.1f} s; per unit: "
        + "; ".join(
            f"{u['id']}: task {u['timings_s']['task']} s, bench {u['timings_s']['bench']} s, "
            f"start_delay {u['timings_s']['start_delay']} s, return_delay "
            f"{u['timings_s']['return_delay']} s, get {u['timings_s']['get']} s, pack "
            f"{u['timings_s'].get('pack')} s, unpack {u['timings_s']['unpack']} s, "
            f"archive {u['archive_bytes']} B"
            for u in (x, y, y_fail)
        )
    )
    # --on local writes the same files for the same unit
    ml = tm.write_matrix(
        tmp_path,
        f"name: same\nunits:\n  - {{config: {bases[0]}, gpu_type: X}}\n",
        name="local.yaml",
    )
    t0 = time.monotonic()
    ldir = run_matrix(
        ml,
        executor=LocalExecutor(env_setup="current", command=tm.FAKE_COMMAND),
        results=tmp_path / "local",
        log=lambda s: None,
    )
    print(f"local 1-unit matrix wall {time.monotonic() - t0:.1f} s")
    assert files_of(ldir / x["id"]) == files_of(mdir / x["id"])
    assert {p.name for p in ldir.iterdir()} == {
        "matrix.json",
        "configs",
        x["id"],
        "report.md",
        "plots",
    }


def test_env_plan_is_probed_on_each_node_that_may_run_a_unit(cluster, tmp_path):
    """One probe per node of the units' GPU types; each worker here holds the pin and imports
    this checkout, so its own interpreter is the plan and nothing would be built."""
    base = tm.write_base(tmp_path)
    m = tm.write_matrix(tmp_path, f"name: p\nbase: {base}\naxes: {{gpu_type: [X, Y]}}\n")
    plans = executor(env_setup="auto").plan_envs(load_matrix(m).units)
    assert len(plans) == 2 and {p.source for p in plans} == {"interpreter"}
    assert {p.pin for p in plans} == {tm.SGLANG}


def _server_groups(port: int) -> dict[int, list[int]]:
    """{pgid: [pids]} of the (fake) servers on ``port`` running now."""
    out: dict[int, list[int]] = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if "sglang.launch_server" in cmd and str(port) in cmd:
                out.setdefault(psutil.os.getpgid(p.pid), []).append(p.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return out


def _group_alive(pgid: int) -> bool:
    for p in psutil.process_iter(["pid"]):
        try:
            if psutil.os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.Error, ProcessLookupError):
            continue
    return False


def _quick_and_slow(tmp_path: Path, name: str) -> tuple[Path, Any]:
    """A matrix ``name`` of two units: a quick one (GPU type Y) and one whose every /generate
    after readiness hangs 60 s (GPU type X); (its file, the loaded matrix)."""
    quick = tm.write_base(tmp_path, name="quick")
    slow = tm.write_base(tmp_path, name="slow")
    m = tm.write_matrix(
        tmp_path,
        f"""\
        name: {name}
        units:
          - {{config: {quick}, gpu_type: Y}}
          - {{config: {slow}, gpu_type: X, set: {{server.env: {{FAKE_GENERATE_SLEEP_S: "60"}}}}}}
        """,
    )
    return m, load_matrix(m)


def test_ctrl_c_cancels_running_units_stops_their_servers_and_keeps_finished(cluster, tmp_path):
    m, mx = _quick_and_slow(tmp_path, "cancel")
    port = mx.units[1].config.server.port
    seen: dict[str, int] = {}
    results = tmp_path / "results"

    def interrupt_when_ready():
        # once the quick unit is back and the slow unit's server answers (a /generate hangs)
        deadline = time.time() + 300  # a cold CI machine may take minutes to start a unit
        while time.time() < deadline:
            groups = set(_server_groups(port))
            done = list(results.glob(f"*/{mx.units[0].id}/manifest.json"))
            if groups and done:
                seen["pgid"] = groups.pop()
                time.sleep(1.0)  # the suite is inside its hanging request
                _thread.interrupt_main()
                return
            time.sleep(0.2)

    t = threading.Thread(target=interrupt_when_ready, daemon=True)
    t.start()
    with pytest.raises(Interrupted) as ei:
        run_matrix(m, executor=executor(), results=results, log=lambda s: None)
    t.join()
    assert "pgid" in seen, "the slow unit's server never started"
    mdir = ei.value.run_dir
    units = {u["id"]: u for u in read_json(mdir / "matrix.json")["units"]}
    assert units[mx.units[0].id]["status"] == "ok"
    assert (mdir / mx.units[0].id / "compare.json").exists()
    assert units[mx.units[1].id]["status"] == "cancelled"
    assert read_json(mdir / "matrix.json")["interrupted"] is True
    # the cancelled unit's fake server: its whole process group is gone
    deadline = time.time() + 15
    while _group_alive(seen["pgid"]) and time.time() < deadline:
        time.sleep(0.2)
    assert not _group_alive(seen["pgid"])
    assert "--resume" in str(ei.value)


@pytest.mark.e2e
def test_one_real_cpu_unit_through_ray(tmp_path):  # pragma: no cover - run by the lead
    """configs/demo-cpu.yaml cut to its smallest (the tiny model, stock vs ours, 1 repeat, a short
    serving suite) as one unit on a one-node local cluster, environment set up with make on the
    node."""
    import yaml

    raw = yaml.safe_load((REPO_ROOT / "configs" / "demo-cpu.yaml").read_text())
    raw["name"] = "cpu-e2e-small"
    raw["variants"] = {"baseline": [], "mrope-sync-free": ["mrope-sync-free"]}
    serving = dict(raw["suites"]["serving"], num_prompts=8, output_len=16)
    serving.pop("sweep", None)  # one point: the smallest unit
    raw["suites"] = {"serving": serving}
    base = tmp_path / "cpu-e2e-small.yaml"
    base.write_text(yaml.safe_dump(raw, sort_keys=False))
    m = tm.write_matrix(
        tmp_path,
        f"name: cpu-e2e\nbase: {base}\naxes: {{schedule.repeats: [1]}}\n",
    )
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        ex = RayExecutor(c.address, ship_code=False, env_setup="auto")
        mdir = run_matrix(m, executor=ex, results=tmp_path / "results")
    finally:
        c.shutdown()
    unit = read_json(mdir / "matrix.json")["units"][0]
    assert unit["status"] == "ok"
    assert (mdir / unit["id"] / "compare.json").exists()


def test_a_killed_worker_is_a_lost_unit_and_its_server_still_stops(cluster, tmp_path):
    """SIGKILL to the Ray worker running a unit (as when a node's worker dies): the unit is
    reported lost, the other unit is kept, and bench (told by the kernel that its parent died)
    stops its server's group."""
    m, mx = _quick_and_slow(tmp_path, "lost")
    port = mx.units[1].config.server.port
    seen: dict[str, int] = {}

    def kill_worker_when_ready():
        deadline = time.time() + 300  # a cold CI machine may take minutes to start the unit
        while time.time() < deadline:
            groups = _server_groups(port)
            if groups:
                pgid, pids = next(iter(groups.items()))
                time.sleep(1.0)
                try:
                    bench = psutil.Process(pids[0]).parent()  # the server's parent: bench
                    worker = bench.parent()  # bench's parent: the Ray worker running the task
                    worker.kill()
                except (psutil.Error, AttributeError):
                    continue  # that server went away meanwhile: look again
                seen["pgid"], seen["worker"] = pgid, worker.pid
                return
            time.sleep(0.2)

    t = threading.Thread(target=kill_worker_when_ready, daemon=True)
    t.start()
    with pytest.raises(RunFailed, match=r"1 of 2 units did not end ok") as ei:
        run_matrix(m, executor=executor(), results=tmp_path / "results", log=lambda s: None)
    t.join()
    assert "worker" in seen, "the slow unit's server never started"
    units = {u["id"]: u for u in read_json(ei.value.run_dir / "matrix.json")["units"]}
    assert units[mx.units[0].id]["status"] == "ok"
    lost = units[mx.units[1].id]
    assert lost["status"] == "lost" and "Worker" in lost["message"]
    deadline = time.time() + 20
    while _group_alive(seen["pgid"]) and time.time() < deadline:
        time.sleep(0.2)
    assert not _group_alive(seen["pgid"])
    # the killed task never cleaned its scratch folder (bench wrote its last cells there)
    import shutil
    import tempfile

    for d in Path(tempfile.gettempdir()).glob(f"patchbench-unit-{lost['id']}-*"):
        shutil.rmtree(d, ignore_errors=True)
