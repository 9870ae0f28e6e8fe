"""patchbench/suites/sync_probe and scripts/gpu_probe.py, on the CPU (their CUDA half needs a lent GPU).

The suite is run on folders laid out like an sglang package (``<dir>/srt/model_executor/
forward_batch_info.py``) holding the stock and patched files of each release; the GPU script's
``--device cpu`` mode runs the same probes on the prepared files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchbench.suite import SuiteContext, get_suite
from tools.mrope_sources import release_sources

REPO = Path(__file__).resolve().parents[2]
RELEASES = ["0.5.1.post3", "0.5.23"]


def _pkg(tmp: Path, name: str, src: Path) -> Path:
    """A folder standing for an ``sglang`` package holding only ``src`` as forward_batch_info.py."""
    dest = tmp / name / "sglang" / "srt" / "model_executor" / "forward_batch_info.py"
    dest.parent.mkdir(parents=True)
    shutil.copyfile(src, dest)
    return tmp / name / "sglang"


def _ctx(tmp: Path, variant_dir: Path, stock_dir: Path, variant: str, device: str = "cpu"):
    out = tmp / f"out-{variant}"
    out.mkdir()
    return SuiteContext(
        server=None,
        out_dir=out,
        run_dir=tmp,
        cache_dir=tmp,
        variant=variant,
        repeat=0,
        baseline="stock",
        sglang_version="x",
        python=sys.executable,
        stock_env={},
        variant_sglang_dir=variant_dir,
        stock_sglang_dir=stock_dir,
        device=device,
        log=lambda s: None,
    )


@pytest.mark.parametrize("release", RELEASES)
def test_suite_cpu_probes(tmp_path, release):
    suite = get_suite("sync_probe")
    assert suite.needs_server is False
    assert {m.better for m in suite.metrics.values()} == {"lower"}
    assert [n for n, m in suite.metrics.items() if m.primary] == ["host_syncs_per_call_count"]
    assert suite.metrics["host_syncs_per_call_count"].kind == "deterministic"
    src = release_sources(release)
    stock_dir = _pkg(tmp_path, "stock", src["stock"])
    patched_dir = _pkg(tmp_path, "patched", src["patched"])
    params = suite.Params(batch_sizes=[1, 8, 32])
    results = {}
    for variant, d in (("stock", stock_dir), ("patched", patched_dir)):
        results[variant] = suite.run(_ctx(tmp_path, d, stock_dir, variant), params)
    stock, patched = results["stock"].metrics, results["patched"].metrics
    if release == "0.5.1.post3":
        # two int(seq_lens[i]) reads and one blocking copy per request: 2 * (1 + 8 + 32)
        assert stock["sync_d2h_reads_count"] == 82.0
        assert stock["sync_blocking_h2d_copies_count"] == 41.0
    else:
        # one torch.tensor(deltas, device=...) per call, no read
        assert stock["sync_d2h_reads_count"] == 0.0
        assert stock["sync_blocking_h2d_copies_count"] == 3.0
    assert patched == {
        "sync_d2h_reads_count": 0.0,
        "sync_blocking_h2d_copies_count": 0.0,
        "positions_mismatch_count": 0.0,
        "host_syncs_per_call_count": 0.0,
    }
    # host syncs per call = reads + blocking copies (0.5.1.post3: 82 + 41; 0.5.23: 0 + 3)
    assert stock["host_syncs_per_call_count"] == (123.0 if release == "0.5.1.post3" else 3.0)
    assert results["stock"].bounds == {} and results["patched"].bounds == {}  # every read answered
    r = results["patched"]
    assert r.status == "ok" and r.meta["mode"] == "cpu-probes" and "CPU probes" in r.meta["note"]
    probe = json.loads((tmp_path / "out-patched" / "probe.json").read_text())
    assert [row["batch_size"] for row in probe["rows"]] == [1, 8, 32]
    assert all(row["images"] >= 1 for row in probe["rows"])
    block = suite.report_block(tmp_path / "out-stock")
    assert "cpu-probes" in block and "D2H reads/call" in block
    lines = [ln.split() for ln in block.splitlines()]
    batch_rows = [ln for ln in lines if ln and ln[0] in ("1", "8", "32")]
    assert [ln[2] for ln in batch_rows] == (
        ["2", "16", "64"] if release == "0.5.1.post3" else ["0", "0", "0"]
    )


def test_suite_cuda_requested_without_gpu_says_so(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    suite = get_suite("sync_probe")
    src = release_sources("0.5.23")
    stock_dir = _pkg(tmp_path, "stock", src["stock"])
    res = suite.run(
        _ctx(tmp_path, stock_dir, stock_dir, "stock", device="cuda"), suite.Params(batch_sizes=[4])
    )
    assert res.meta["mode"] == "cpu-probes"
    assert any("no GPU visible" in w for w in res.warnings)
    assert "host_blocked_ms" not in res.metrics


def test_suite_missing_file_is_a_suite_error(tmp_path):
    from patchbench.suite import SuiteError

    suite = get_suite("sync_probe")
    with pytest.raises(SuiteError, match="no .*forward_batch_info.py"):
        suite.run(_ctx(tmp_path, tmp_path / "nope", tmp_path / "nope", "v"), suite.Params())


def test_params_forbid_unknown_keys():
    suite = get_suite("sync_probe")
    with pytest.raises(Exception, match="batch_size"):
        suite.Params(batch_size=[1])


def _gpu_probe():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_probe", REPO / "scripts" / "gpu_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "src"
    assert _gpu_probe().main(["prepare", str(out)]) == 0
    return out


def test_gpu_probe_cpu_mode(prepared, tmp_path, capsys):
    files = json.loads((prepared / "sources.json").read_text())["files"]
    assert sorted(files) == [
        "0.5.1.post3/patched",
        "0.5.1.post3/stock",
        "0.5.1.post3/upstream",
        "0.5.23/patched",
        "0.5.23/stock",
    ]
    size = sum(p.stat().st_size for p in prepared.rglob("*") if p.is_file())
    assert size < 1 << 20  # far under the device tool's 64 MiB carry limit
    rc = _gpu_probe().main(
        [
            "run",
            "--sources",
            str(prepared),
            "--device",
            "cpu",
            "--batch-sizes",
            "1,8",
            "--json",
            str(tmp_path / "rows.json"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "verdict: patched rows sync-free and equal to stock" in out
    rows = {
        (r["release"], r["variant"], r["batch_size"]): r
        for r in json.loads((tmp_path / "rows.json").read_text())["rows"]
    }
    assert rows["0.5.1.post3", "stock", 8]["d2h_reads_per_call"] == 16
    assert rows["0.5.23", "stock", 8]["blocking_h2d_copies_per_call"] == 1
    # upstream (PR #9460): the text-only request in the mixed batch of 8 reads seq_lens
    assert rows["0.5.1.post3", "upstream", 8]["strict_error"].endswith("meta tensors")
    for release in RELEASES:
        for bs in (1, 8):
            r = rows[release, "patched", bs]
            assert (
                r["d2h_reads_per_call"],
                r["blocking_h2d_copies_per_call"],
                r["strict_error"],
                r["positions_equal_stock"],
            ) == (0, 0, None, True)


def test_gpu_probe_fails_on_a_syncing_patched_file(prepared, tmp_path, capsys):
    # pretend the stock file is the patched one: the verdict must fail
    src = tmp_path / "src"
    shutil.copytree(prepared, src)
    shutil.copyfile(
        src / "0.5.23" / "stock" / "forward_batch_info.py",
        src / "0.5.23" / "patched" / "forward_batch_info.py",
    )
    index = json.loads((src / "sources.json").read_text())
    index["files"]["0.5.23/patched"] = index["files"]["0.5.23/stock"]
    (src / "sources.json").write_text(json.dumps(index))
    rc = _gpu_probe().main(["run", "--sources", str(src), "--device", "cpu", "--batch-sizes", "4"])
    out = capsys.readouterr().out
    assert rc == 1 and "verdict: FAILED" in out
    assert "0.5.23/patched batch 4" in out


def _blocker(root: Path, names: list[str]) -> Path:
    """A folder for PYTHONPATH whose sitecustomize.py puts an import blocker first on
    sys.meta_path: importing any of ``names`` (or a submodule) writes ``<root>/imported-<name>``
    and raises ImportError, so even a caught ImportError leaves its trace. It also beats the
    editable install's finder, which a shadowing package on PYTHONPATH would not."""
    block = root / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import sys\n"
        f"NAMES, ROOT = {names!r}, {str(root)!r}\n"
        "class Blocker:\n"
        "    def find_spec(self, fullname, path=None, target=None):\n"
        "        top = fullname.split('.')[0]\n"
        "        if top in NAMES:\n"
        "            open(ROOT + '/imported-' + top, 'w').close()\n"
        "            raise ImportError(top + ' is blocked: the GPU check must run without it')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Blocker())\n"
    )
    return block


BLOCKED = ["pydantic", "pydantic_core", "sglang", "patchbench", "yaml"]


def test_blocker_shadows_the_installed_packages(tmp_path):
    # the guard of the next test: the blocker really hides what is installed here
    block = _blocker(tmp_path, BLOCKED)
    env = dict(__import__("os").environ, PYTHONPATH=str(block))
    for name in BLOCKED:
        proc = subprocess.run(
            [sys.executable, "-c", f"import {name}"], env=env, capture_output=True, text=True
        )
        assert proc.returncode != 0 and f"{name} is blocked" in proc.stderr
        assert (tmp_path / f"imported-{name}").exists()


def test_gpu_check_sh_cpu_end_to_end_with_only_torch(prepared, tmp_path):
    """The shell entry point on a copy holding only scripts/, patchbench/suites/sync_probe/mrope/ and
    patchbench/suites/sync_probe/table.py (no patchbench package), with pydantic, sglang, patchbench and
    PyYAML blocked: the lent GPU machine has python3 and torch only. One subprocess: the torch
    import is slow."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    for name in ("gpu_check.sh", "gpu_probe.py"):
        shutil.copy(REPO / "scripts" / name, work / "scripts" / name)
    (work / "patchbench" / "suites" / "sync_probe").mkdir(parents=True)
    shutil.copy(
        REPO / "patchbench" / "suites" / "sync_probe" / "table.py",
        work / "patchbench" / "suites" / "sync_probe",
    )
    shutil.copytree(
        REPO / "patchbench" / "suites" / "sync_probe" / "mrope",
        work / "patchbench" / "suites" / "sync_probe" / "mrope",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copytree(prepared, work / ".cache" / "gpu_check")
    block = _blocker(tmp_path, BLOCKED)
    env = dict(__import__("os").environ, PYTHON=sys.executable, PYTHONPATH=str(block))
    proc = subprocess.run(
        ["bash", str(work / "scripts" / "gpu_check.sh"), "--device", "cpu", "--batch-sizes", "2"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: patched rows sync-free" in proc.stdout
    assert sorted(p.name for p in tmp_path.glob("imported-*")) == []


def test_gpu_check_sh_documents_the_command():
    text = (REPO / "scripts" / "gpu_check.sh").read_text()
    assert 'run(command="bash scripts/gpu_check.sh", carry=[".cache/gpu_check"]' in text


class _FakeCuda:
    """Simulated CUDA timing for the measurement arithmetic: ``_sleep`` keeps a fake stream busy
    for 50 ms of real time; a syncing call waits until then."""

    def __init__(self):
        import time

        self.time, self.busy_until, self.mode = time, 0.0, 0

    def install(self, monkeypatch):
        import torch

        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = fake.time.perf_counter()

            def elapsed_time(self, other):  # kernel duration in ms, as CUDA events would see it
                return 50.0

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", self.sync)
        monkeypatch.setattr(
            torch.cuda,
            "_sleep",
            lambda cycles: setattr(self, "busy_until", self.time.perf_counter() + 0.05),
        )
        monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: self.mode)
        monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: setattr(self, "mode", m))

    def sync(self):
        import warnings

        if self.mode == "warn":
            warnings.warn("called a synchronizing CUDA operation", stacklevel=2)
        while self.time.perf_counter() < self.busy_until:
            self.time.sleep(0.001)


def test_cuda_measurement_arithmetic_on_a_simulated_gpu(monkeypatch):
    from patchbench.suites.sync_probe.mrope import cuda_host_blocked_ms, cuda_sync_warnings

    fake = _FakeCuda()
    fake.install(monkeypatch)
    waits = cuda_host_blocked_ms(fake.sync, sleep_cycles=1, repeats=3)
    assert 35.0 <= waits["host_blocked_ms"] <= 80.0 and waits["kernel_ms"] == 50.0
    free = cuda_host_blocked_ms(lambda: None, sleep_cycles=1, repeats=3)
    assert free["host_blocked_ms"] < 5.0
    assert (
        cuda_sync_warnings(lambda: (fake.sync(), fake.sync()))
        == ["called a synchronizing CUDA operation"] * 2
    )
    assert cuda_sync_warnings(lambda: None) == [] and fake.mode == 0


def test_suite_upstream_pr9460_reads_are_counted_exactly(tmp_path):
    """The upstream change (0.5.2rc2) builds a text-only request's decode positions with
    ``torch.full((3, 1), seq_lens[i] - 1, ...)``: the fill value is a 0-d device tensor, which
    torch.full reads (one sync per text-only request; image requests take a non-blocking copy).
    The CPU probe answers that read with a placeholder and counts on, so the counts are exact:
    reads = text-only requests (batch size - image requests), no blocking copy, no lower bound."""
    from tools.mrope_sources import stock_source

    suite = get_suite("sync_probe")
    stock_dir = _pkg(tmp_path, "stock", release_sources("0.5.1.post3")["stock"])
    upstream_dir = _pkg(tmp_path, "upstream", stock_source("0.5.2rc2"))
    res = suite.run(
        _ctx(tmp_path, upstream_dir, stock_dir, "upstream"),
        suite.Params(batch_sizes=[1, 8, 32], image_share=0.5),
    )
    assert res.status == "ok" and res.errors == []
    rows = json.loads((tmp_path / "out-upstream" / "probe.json").read_text())["rows"]
    mixed = [r for r in rows if 0 < r["images"] < r["batch_size"]]
    assert mixed, "the seeded batches must mix text-only and image requests"
    for r in rows:
        assert r["d2h_reads_per_call"] == r["batch_size"] - r["images"]
        assert r["blocking_h2d_copies_per_call"] == 0
        assert r["h2d_copies_per_call"] == r["images"]  # .to(device, non_blocking=True)
        assert r["counts_lower_bound"] is False and r["stopped_by"] is None
    text_only = sum(r["batch_size"] - r["images"] for r in rows)
    assert res.metrics["host_syncs_per_call_count"] == float(text_only)
    assert res.metrics["positions_mismatch_count"] == 0.0
    assert res.bounds == {} and not any("lower bounds" in w for w in res.warnings)


def test_suite_marks_counts_of_a_stopped_probe_as_lower_bounds(tmp_path, monkeypatch):
    """A counting run that a read stops (one the placeholders cannot answer) counted only what
    came before: the three sync counts are marked as lower bounds, positions are not."""
    import patchbench.suites.sync_probe.mrope as mrope

    def stopped_row(methods, stock, bs, **kw):
        return {
            "batch_size": bs,
            "device": "cpu",
            "images": 1,
            "positions_equal_stock": True,
            "d2h_reads_per_call": 2,
            "blocking_h2d_copies_per_call": 0,
            "h2d_copies_per_call": 0,
            "counts_lower_bound": bs == 8,
            "stopped_by": "RuntimeError: x" if bs == 8 else None,
        }

    monkeypatch.setattr(mrope, "measure_row", stopped_row)
    suite = get_suite("sync_probe")
    stock_dir = _pkg(tmp_path, "stock", release_sources("0.5.1.post3")["stock"])
    res = suite.run(_ctx(tmp_path, stock_dir, stock_dir, "v"), suite.Params(batch_sizes=[1, 8]))
    assert res.metrics["host_syncs_per_call_count"] == 4.0
    assert res.bounds == {
        "sync_d2h_reads_count": "lower",
        "sync_blocking_h2d_copies_count": "lower",
        "host_syncs_per_call_count": "lower",
    }
    assert res.to_json("sync_probe")["bounds"] == res.bounds
    assert any("batch 8: counts are lower bounds" in w for w in res.warnings)


def test_pair_and_report_section_from_two_probed_cells(tmp_path):
    from patchbench.analysis.comparison import Comparison

    suite = get_suite("sync_probe")
    src = release_sources("0.5.1.post3")
    stock_dir = _pkg(tmp_path, "stock", src["stock"])
    patched_dir = _pkg(tmp_path, "patched", src["patched"])
    params = suite.Params(batch_sizes=[1, 8])
    dirs = {}
    for variant, d in (("stock", stock_dir), ("patched", patched_dir)):
        ctx = _ctx(tmp_path, d, stock_dir, variant)
        res = suite.run(ctx, params)
        (ctx.out_dir / "summary.json").write_text(json.dumps(res.to_json("sync_probe")))
        dirs[variant] = ctx.out_dir
    p = suite.pair([dirs["stock"]], [dirs["patched"]], params)
    # stock 0.5.1.post3: 2 reads + 1 blocking copy per request: 3 * (1 + 8) = 27 host syncs
    assert p["metrics"]["host_syncs_per_call_count"] == {
        "baseline": [27.0],
        "variant": [0.0],
        "same_in_every_repeat": True,
    }
    assert [r["batch_size"] for r in p["variant"]["rows"]] == [1, 8]
    assert p["server_crosscheck"] == {"baseline": None, "variant": None}
    cmp = Comparison(baseline="stock", variants=["patched"], pairs={"sync_probe": {"patched": p}})
    md = "\n".join(suite.report_section(cmp))
    assert "**stock** (cpu-probes" in md and "**patched** (cpu-probes" in md
    assert "| 8 | " in md and "In-server cross-check" not in md
    assert md.count("no GPU measurement (the run is on the CPU)") == 1  # the same note: once


def test_crosscheck_row_counts_every_checked_call_against_its_own_total():
    """The cross-check runs on decode and extend calls alike, so "equal to stock" is shown out
    of the calls checked (988 = 981 decode + 7 extend here), never beside decode calls alone."""
    from patchbench.suites.sync_probe import _crosscheck_lines

    got = {
        "processes": 1,
        "counts": {
            "calls": 988,
            "decode_calls": 981,
            "extend_calls": 7,
            "decode_multi_image_calls": 40,
            "max_decode_batch": 8,
            "crosscheck_decode_equal": 981,
            "crosscheck_extend_equal": 6,
            "crosscheck_extend_mismatch": 1,
        },
    }
    assert _crosscheck_lines("ours", got) == "| ours | 1 | 981 / 7 | 40 | 8 | 987 of 988 | 1 ⚠ |"


def test_a_crosscheck_over_zero_calls_reads_not_run():
    """A check over zero items is no pass: "not run", never "0 of 0 equal to stock"."""
    from patchbench.suites.sync_probe import _crosscheck_lines

    got = {"processes": 2, "counts": {"calls": 0, "decode_calls": 0, "extend_calls": 0}}
    assert (
        _crosscheck_lines("ours", got)
        == "| ours | 2 | 0 / 0 | 0 | 0 | not run (0 calls checked) | 0 |"
    )


_PROBE_ONCE = """
import json, sys
from pathlib import Path
from patchbench.suite import SuiteContext, get_suite
tmp, stock, variant = map(Path, sys.argv[1:4])
out = tmp / "out"
out.mkdir()
ctx = SuiteContext(server=None, out_dir=out, run_dir=tmp, cache_dir=tmp, variant="v", repeat=0,
    baseline="stock", sglang_version="x", python=sys.executable, stock_env={},
    variant_sglang_dir=variant, stock_sglang_dir=stock, device="cpu", log=lambda s: None)
suite = get_suite("sync_probe")
res = suite.run(ctx, suite.Params(batch_sizes=[1, 8, 32], image_share=0.5))
print(json.dumps({k: v for k, v in res.metrics.items() if k.endswith("_count")}))
"""


def test_counts_are_identical_in_two_processes(tmp_path):
    """The probe's counts are deterministic by construction (``MetricInfo.deterministic_by`` of
    the count metrics names this test): the variant's code on the same seeded batches, probed in
    two separate processes, gives identical counts (the upstream change: its reads depend on the
    text-only/image mix of the seeded batches)."""
    from patchbench.suites.sync_probe import BY_CONSTRUCTION, METRICS
    from tools.mrope_sources import stock_source

    assert BY_CONSTRUCTION.endswith("::test_counts_are_identical_in_two_processes")
    assert all(
        m.deterministic_by == BY_CONSTRUCTION
        for name, m in METRICS.items()
        if name != "sync_warnings_count" and m.kind == "deterministic"
    )
    stock = _pkg(tmp_path, "stock", release_sources("0.5.1.post3")["stock"])
    for name, src in (("upstream", stock_source("0.5.2rc2")),):
        variant = _pkg(tmp_path, name, src)
        got = []
        for i in range(2):
            d = tmp_path / f"{name}-{i}"
            d.mkdir()
            p = subprocess.run(
                [sys.executable, "-c", _PROBE_ONCE, str(d), str(stock), str(variant)],
                capture_output=True,
                text=True,
                cwd=REPO,
                env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
                timeout=300,
            )
            assert p.returncode == 0, p.stderr
            got.append(json.loads(p.stdout.strip().splitlines()[-1]))
        assert got[0] == got[1] and got[0]["host_syncs_per_call_count"] > 0, name
