"""End to end on the CPU engine: a two-point load sweep (concurrency 2 and 8), stock vs the
sync-free patch, one repeat each, the serving suite only: per-point records, per-point and curve
metrics in the summaries and compare.json, the load-curve report section and the curve plots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from patchbench.ports import free_port
from patchbench.records import read_json

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sweep")
    cfg = yaml.safe_load((REPO / "configs" / "demo-cpu.yaml").read_text())
    cfg["name"] = "demo-cpu-sweep"
    cfg["server"]["port"] = free_port()
    cfg["variants"] = {"baseline": [], "mrope-sync-free": ["mrope-sync-free"]}
    cfg["schedule"] = {"repeats": 1, "order": "interleaved"}
    serving = dict(cfg["suites"]["serving"])  # its own sweep replaces the demo's
    serving["sweep"] = {"points": [2, 8], "prompts_per_load": 3, "min_prompts": 8}
    cfg["suites"] = {"serving": serving}
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    results = tmp / "results"
    p = subprocess.run(
        [sys.executable, str(REPO / "runner.py"), "bench", str(path), "--results", str(results)],
        cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(p.stdout[-3000:], p.stderr[-3000:])
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = [d for d in results.iterdir() if (d / "manifest.json").exists()]
    return run


def test_sweep_points_metrics_report_and_plots(sweep_run):
    for v in ("baseline", "mrope-sync-free"):
        sdir = sweep_run / v / "rep0" / "serving"
        summary = read_json(sdir / "summary.json")
        assert summary["status"] == "ok", summary["errors"]
        sweep = summary["meta"]["sweep"]
        assert sorted(sweep["order"]) == ["c2", "c8"] and isinstance(sweep["order_seed"], int)
        for k, n in (("c2", 8), ("c8", 24)):
            req = read_json(sdir / "points" / k / "requests.json")
            assert len(req["status"]) == n and set(req["status"]) == {"ok"}
            assert summary["metrics"][f"output_throughput_tok_s@{k}"] > 0
            assert summary["metrics"][f"goodput_req_s@{k}"] >= 0
        assert "goodput_at_slo_req_s" in summary["metrics"]
        assert sweep["max_load_at_slo"]["answer"] in ("within the sweep", "beyond the sweep")
    # the same prompts per point in both variants
    for k in ("c2", "c8"):
        texts = [
            read_json(sweep_run / v / "rep0" / "serving" / "points" / k / "requests.json")
            for v in ("baseline", "mrope-sync-free")
        ]
        assert len(texts[0]["status"]) == len(texts[1]["status"])
    cmp = read_json(sweep_run / "compare.json")
    prim = {r["metric"] for r in cmp["rows"] if r["primary"]}
    assert {"output_throughput_tok_s@c2", "itl_median_ms@c8", "goodput_at_slo_req_s"} <= prim
    report = (sweep_run / "report.md").read_text()
    details = (sweep_run / "report-details.md").read_text()
    assert "## Load curve (serving)" in report and "[point c2]" in details
    for png in ("curve_latency.png", "curve_change.png", "curve_frontier.png", "pr_figure.png"):
        assert (sweep_run / "plots" / png).stat().st_size > 10_000
