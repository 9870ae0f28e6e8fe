"""A results folder that cannot be written (no permission, read-only, disk or quota full): every
atomic write (patchbench.records) ends with one line naming the file and the reason (exit 4),
leaves no temporary file and never half a file; a bench run stops with exit 4 through the one
command line, without a traceback, with the finished cells intact and no server left."""

import errno
import json
import os
import re
import tempfile
from pathlib import Path

import pytest

from patchbench import cli, records
from patchbench.errors import RunFailed
from patchbench.records import ResultsWriteError
from patchbench.run import bench
from patchbench.run.ports import port_answers
from tests.run.test_bench_runner import BASIC, write_config

ROOT = os.geteuid() == 0  # chmod does not stop root: simulate EACCES there
PORT = 31987  # not test_bench_runner's port, so both files can run at the same time
CONFIG = re.sub(r"port: \d+", f"port: {PORT}", BASIC)
assert CONFIG != BASIC


def _tmp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


# ----------------------------------------------------------------------------- atomic writes
def _fail_at(monkeypatch, stage: str, err: OSError) -> None:
    """Make records.write_bytes fail at ``stage`` with ``err``."""

    def boom(*_a, **_k):
        raise err

    if stage == "mkstemp":
        monkeypatch.setattr(tempfile, "mkstemp", boom)
    elif stage == "fsync":
        monkeypatch.setattr(os, "fsync", boom)
    elif stage == "replace":
        monkeypatch.setattr(os, "replace", boom)
    elif stage == "write":  # the buffered write of the data itself (disk full mid-file)
        real = os.fdopen

        class Full:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[: len(data) // 2])  # half of it reaches the temp file
                raise err

            def __getattr__(self, k):
                return getattr(self.f, k)

        monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(real(fd, mode)))
    else:
        raise AssertionError(stage)


@pytest.mark.parametrize(
    "stage, code, reason",
    [
        ("mkstemp", errno.EACCES, "Permission denied (EACCES)"),
        ("mkstemp", errno.EROFS, "Read-only file system (EROFS)"),
        ("write", errno.ENOSPC, "No space left on device (ENOSPC)"),
        ("fsync", errno.ENOSPC, "No space left on device (ENOSPC)"),
        ("write", errno.EDQUOT, "Disk quota exceeded (EDQUOT)"),
        ("replace", errno.EACCES, "Permission denied (EACCES)"),
    ],
)
def test_a_failed_write_names_the_file_and_reason_and_keeps_the_old_file(
    tmp_path, monkeypatch, stage, code, reason
):
    target = tmp_path / "rep0" / "cell.json"
    records.write_json(target, {"status": "running", "pad": "x" * 10_000})
    before = target.read_bytes()
    _fail_at(monkeypatch, stage, OSError(code, os.strerror(code)))
    with pytest.raises(ResultsWriteError) as ei:
        records.write_json(target, {"status": "ok", "pad": "y" * 20_000})
    e = ei.value
    assert isinstance(e, RunFailed) and e.exit_code == 4
    assert isinstance(e, OSError) and e.errno == code and e.path == target
    msg = str(e)
    assert "\n" not in msg
    assert msg.startswith(f"cannot write {target}: {reason}; ")
    assert e.__cause__ is None and e.__suppress_context__  # no chained traceback
    monkeypatch.undo()
    assert target.read_bytes() == before  # the old file, whole
    assert _tmp_files(tmp_path) == []


@pytest.mark.skipif(ROOT, reason="chmod does not stop root (simulated in the test above)")
def test_a_real_read_only_folder_is_a_results_write_error(tmp_path):
    d = tmp_path / "run"
    records.write_text(d / "a.txt", "kept")
    d.chmod(0o555)
    try:
        with pytest.raises(
            ResultsWriteError,
            match=r"cannot write .*run/b\.txt: Permission denied "
            r"\(EACCES\)",
        ):
            records.write_text(d / "b.txt", "lost")
        with pytest.raises(ResultsWriteError, match=r"run/sub: Permission denied"):
            records.make_dir(d / "sub")
    finally:
        d.chmod(0o755)
    assert (d / "a.txt").read_text() == "kept"
    assert sorted(p.name for p in d.iterdir()) == ["a.txt"]


def test_make_dir_with_a_file_in_the_way_names_the_folder(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ResultsWriteError) as ei:
        records.make_dir(tmp_path / "f" / "sub")
    assert str(ei.value).startswith(f"cannot write {tmp_path / 'f' / 'sub'}: ")
    assert ei.value.exit_code == 4
    (tmp_path / "d").mkdir()
    with pytest.raises(FileExistsError):
        records.make_dir(tmp_path / "d", exist_ok=False)
    assert records.make_dir(tmp_path / "d") == tmp_path / "d"


# ----------------------------------------------------------------------------- bench runs
def _disk_full_from(monkeypatch, run_root: Path, trigger: str, *, only_trigger: bool = False):
    """fsync raises ENOSPC for files under ``run_root`` once a temp file whose path contains
    ``trigger`` is written (``only_trigger``: for that file only, as when space comes back)."""
    real = os.fsync
    state = {"full": False, "failed": []}

    def fsync(fd):
        p = _fd_path(fd)
        if p.startswith(str(run_root.resolve())):
            hit = trigger in p
            if hit or (state["full"] and not only_trigger):
                state["full"] = True
                state["failed"].append(p)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return state


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("patchbench bench:")]
    assert len(lines) == 1, err
    return lines[0]


def _assert_cell_kept(run_dir: Path, variant: str, repeat: int) -> None:
    c = records.read_json(run_dir / variant / f"rep{repeat}" / "cell.json")
    assert c["status"] == "ok" and c["error"] is None
    s = records.read_json(run_dir / variant / f"rep{repeat}" / "fake" / "summary.json")
    assert s["status"] == "ok" and s["metrics"] == {"requests_count": 2.0}


def test_disk_full_mid_cell_exits_4_with_one_line_and_keeps_finished_cells(
    fake_cli_env, tmp_path, monkeypatch, capsys
):
    cfg = write_config(tmp_path, CONFIG)
    root = tmp_path / "results"
    # cells run baseline#0, control#0, ...: the disk fills while control#0's suite writes
    state = _disk_full_from(monkeypatch, root, "control/rep0/fake/.records.json.")
    rc = cli.main(["bench", str(cfg), "--results", str(root)])
    out = capsys.readouterr()
    assert rc == 4
    line = _one_error_line(out.err)
    run_dir = next(root.iterdir())
    # the last write that failed is named, with the reason
    assert line.startswith(
        "patchbench bench: run failed (exit 4): cannot write "
        f"{state['failed'][-1].rsplit('/', 1)[0]}/"
    )
    assert str(run_dir / "control" / "rep0") in line
    assert "No space left on device (ENOSPC)" in line
    _assert_cell_kept(run_dir, "baseline", 0)
    man = records.read_json(run_dir / "manifest.json")
    assert [(c["variant"], c["repeat"], c["status"]) for c in man["cells"]] == [
        ("baseline", 0, "ok")
    ]
    # nothing half-written, no temp file, no server left
    cell = records.read_json(run_dir / "control" / "rep0" / "cell.json")
    assert cell["variant"] == "control" and cell["repeat"] == 0
    assert not (run_dir / "control" / "rep0" / "fake" / "summary.json").exists()
    assert _tmp_files(run_dir) == []
    assert not port_answers("127.0.0.1", PORT)
    assert not (run_dir / "control" / "rep1").exists()  # the run stopped there


def test_a_failed_summary_write_leaves_cell_json_final_and_failed(
    fake_cli_env, tmp_path, monkeypatch, capsys
):
    cfg = write_config(tmp_path, CONFIG)
    root = tmp_path / "results"
    _disk_full_from(monkeypatch, root, "control/rep0/fake/.summary.json.", only_trigger=True)
    rc = cli.main(["bench", str(cfg), "--results", str(root)])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 4
    run_dir = next(root.iterdir())
    assert f"cannot write {run_dir}/control/rep0/fake/summary.json: No space left" in line
    cell = records.read_json(run_dir / "control" / "rep0" / "cell.json")
    assert cell["status"] == "failed" and cell["ended_at"]
    assert "summary.json" in cell["error"] and "ENOSPC" in cell["error"]
    _assert_cell_kept(run_dir, "baseline", 0)
    man = records.read_json(run_dir / "manifest.json")  # the run's end and why, where writable
    assert man["ended_at"] and man["error"] == line.split(": ", 1)[1].split(": ", 1)[1]
    assert not port_answers("127.0.0.1", PORT)


def _make_read_only(monkeypatch, folder: Path) -> None:
    """``folder`` becomes read-only: real chmod, or (as root, where chmod stops nothing)
    EACCES from every file or folder creation under it."""
    if not ROOT:
        for d in [folder, *[p for p in folder.rglob("*") if p.is_dir()]]:
            d.chmod(0o555)
        return
    deny = OSError(errno.EACCES, os.strerror(errno.EACCES))
    real_mkstemp, real_mkdir = tempfile.mkstemp, os.mkdir

    def mkstemp(*a, **k):
        if str(k.get("dir", "")).startswith(str(folder)):
            raise deny
        return real_mkstemp(*a, **k)

    def mkdir(path, *a, **k):
        if str(path).startswith(str(folder)):
            raise deny
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "mkdir", mkdir)


def _read_only_after(monkeypatch, writes: int) -> dict:
    """The run folder becomes read-only right after bench's ``writes``-th manifest write."""
    real = bench.write_manifest
    state = {"n": 0, "run_dir": None}

    def write_manifest(run_dir, manifest):
        out = real(run_dir, manifest)
        state["n"] += 1
        if state["n"] == writes:
            state["run_dir"] = Path(run_dir)
            _make_read_only(monkeypatch, Path(run_dir))
        return out

    monkeypatch.setattr(bench, "write_manifest", write_manifest)
    return state


def _writable_again(folder: Path) -> None:
    for d in [folder, *[p for p in folder.rglob("*") if p.is_dir()]]:
        d.chmod(0o755)


def test_results_folder_read_only_after_a_cell_exits_4_naming_the_manifest(
    fake_cli_env, tmp_path, monkeypatch, capsys
):
    cfg = write_config(tmp_path, CONFIG)
    root = tmp_path / "results"
    real_run_cell = bench.run_cell
    calls = []

    def run_cell(*a, **k):  # the folder turns read-only as the first cell ends
        rec = real_run_cell(*a, **k)
        calls.append(rec.status)
        _make_read_only(monkeypatch, a[3])
        return rec

    monkeypatch.setattr(bench, "run_cell", run_cell)
    try:
        rc = cli.main(["bench", str(cfg), "--results", str(root)])
        run_dir = next(root.iterdir())
        line = _one_error_line(capsys.readouterr().err)
        assert rc == 4 and calls == ["ok"]
        assert line == (
            f"patchbench bench: run failed (exit 4): cannot write {run_dir}/manifest.json: "
            "Permission denied (EACCES); the folder is not writable by this user: fix its "
            "permissions or use --results DIR"
        )
    finally:
        _writable_again(root)
    _assert_cell_kept(run_dir, "baseline", 0)
    assert json.loads((run_dir / "manifest.json").read_text())["cells"] == []  # the earlier one
    assert _tmp_files(run_dir) == []
    assert not port_answers("127.0.0.1", PORT)


def test_results_folder_read_only_before_the_next_cell_exits_4(
    fake_cli_env, tmp_path, monkeypatch, capsys
):
    cfg = write_config(tmp_path, CONFIG)
    root = tmp_path / "results"
    state = _read_only_after(monkeypatch, 2)  # the initial manifest, then after baseline#0
    try:
        rc = cli.main(["bench", str(cfg), "--results", str(root)])
        line = _one_error_line(capsys.readouterr().err)
        run_dir = state["run_dir"]
        assert rc == 4
        assert f"cannot write {run_dir}/control" in line and "(EACCES)" in line
    finally:
        _writable_again(root)
    _assert_cell_kept(run_dir, "baseline", 0)
    assert _tmp_files(run_dir) == []
    assert not port_answers("127.0.0.1", PORT)


def test_resume_into_a_read_only_run_folder_exits_4_and_changes_nothing(
    fake_cli_env, tmp_path, monkeypatch, capsys
):
    cfg = write_config(tmp_path, CONFIG.replace("repeats: 2", "repeats: 1"))
    run_dir = bench.run_bench(cfg, results_root=tmp_path / "results", launch_spec=fake_cli_env)
    (run_dir / "control" / "rep0" / "fake" / "summary.json").unlink()  # one cell left to run
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    _make_read_only(monkeypatch, run_dir)
    try:
        rc = cli.main(["bench", str(cfg), "--resume", str(run_dir)])
        line = _one_error_line(capsys.readouterr().err)
    finally:
        _writable_again(run_dir)
    assert rc == 4
    assert f"cannot write {run_dir}/manifest.json: Permission denied (EACCES)" in line
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    assert not port_answers("127.0.0.1", PORT)


def test_every_test_the_fault_table_names_exists():
    doc = (Path(__file__).parents[2] / "docs" / "faults.md").read_text()
    import re

    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[[^\]`]*\])?`", doc)
    assert len(named) >= 40
    missing = [
        f"{f}::{t}"
        for f, t in named
        if f"def {t}(" not in (Path(__file__).parents[2] / f).read_text()
    ]
    assert missing == []


@pytest.mark.parametrize("name", ["compare.json", "report.md"])
def test_report_into_a_full_disk_exits_4_naming_the_report_command_and_loses_nothing(
    tmp_path, monkeypatch, capsys, name
):
    """`patchbench report RUN` on a full disk: one line naming the file and `patchbench report
    RUN` (not a bench run's --resume / --results), exit 4; every measured file byte-identical,
    the report written before kept whole."""
    import shutil

    golden = Path(__file__).parent.parent / "data" / "golden" / "sequential"
    run = shutil.copytree(golden / "run", tmp_path / "run")
    (run / "report.md").write_text("the report written before\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    _disk_full_from(monkeypatch, run, name, only_trigger=True)
    assert cli.main(["report", str(run), "--no-plots"]) == 4
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("patchbench report:"))
    assert "Traceback" not in err and "--resume" not in line
    assert f"cannot write {run / name}: No space left on device (ENOSPC)" in line
    assert line.endswith(f"then run `patchbench report {run}` again")
    for p, data in before.items():
        assert p.read_bytes() == data, p
    assert _tmp_files(run) == []
