"""End to end: two sglang releases in one interleaved run on the CPU (real servers).

The generic CPU preset (configs/presets/cpu-demo.yaml: text-only serving, the tiny model) with
the baseline on 0.5.1.post3 (.venv) and a variant on 0.5.23 (.venv-0.5.23), one repeat. Each
server starts from its own environment, the clients come from the baseline's, and the manifest
names each arm's build. Port 30150 (no other test or config uses it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from patchbench.records import read_json

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
PORT = 30150


def preset_config(tmp_path: Path, variants: dict, **suite_overrides) -> Path:
    """configs/presets/cpu-demo.yaml with ``variants``, one repeat, 8 prompts, port 30150."""
    cfg = yaml.safe_load((REPO / "configs" / "presets" / "cpu-demo.yaml").read_text())
    cfg["name"] = "builds-e2e"
    cfg["server"]["port"] = PORT
    cfg["variants"] = variants
    cfg["schedule"] = {"repeats": 1, "order": "interleaved"}
    cfg["suites"]["serving"].update(num_prompts=8, max_concurrency=4, **suite_overrides)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_bench(config: Path, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "runner.py"), "bench", str(config), "--results", str(results)],
        cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=1500,
    )


def test_two_releases_run_in_one_interleaved_run(tmp_path):
    if not (REPO / ".venv-0.5.23" / "bin" / "python").exists():
        pytest.fail(".venv-0.5.23 missing: run `make setup SGLANG=0.5.23` (make test does)")
    cfg = preset_config(tmp_path, {"baseline": [], "on-0.5.23": {"sglang": "0.5.23"}})
    p = run_bench(cfg, tmp_path / "results")
    print(p.stdout[-4000:], p.stderr[-4000:])
    # exit 4 only for what the tiny model does (below): an incomplete timed cell fails the run
    assert p.returncode in (0, 4), p.stderr[-3000:]
    (run,) = [d for d in (tmp_path / "results").iterdir() if (d / "manifest.json").is_file()]
    man = read_json(run / "manifest.json")
    b = man["builds"]
    assert (b["baseline"]["release"], b["on-0.5.23"]["release"]) == ("0.5.1.post3", "0.5.23")
    assert b["on-0.5.23"]["venv"].endswith(".venv-0.5.23")
    assert man["variants"]["on-0.5.23"]["sglang"] == ["0.5.1.post3", "0.5.23"]
    assert man["sglang_version"] == "0.5.1.post3"  # the clients' release
    assert "/.venv-0.5.23/" in man["overlays"]["on-0.5.23"]["sglang_dir"]
    statuses = []
    for v in ("baseline", "on-0.5.23"):
        # the tiny model's random text may decode to "" for a request (the suite then counts it
        # failed and the cell incomplete): what matters here is that every request was served
        summary = read_json(run / v / "rep0" / "serving" / "summary.json")
        assert summary["status"] in ("ok", "incomplete"), summary
        assert summary["metrics"]["tool_completed_count"] == 8
        statuses.append(summary["status"])
    assert (p.returncode == 4) == ("incomplete" in statuses), (p.returncode, statuses)
    assert "variant on-0.5.23: patches (none); build sglang 0.5.23 in .venv-0.5.23" in p.stdout
    report = (run / "report.md").read_text()
    assert "| variant `on-0.5.23` | stock; build sglang 0.5.23 in .venv-0.5.23" in report
