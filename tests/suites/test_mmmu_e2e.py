"""The MMMU suite end to end against the real sglang server on the CPU (tiny random Qwen2.5-VL).

The tiny model's answers are noise, so the test checks the pipeline, not accuracy: every question
asked and answered, images reached the model (server-side prompt token counts grow with the
number of images), files written, and two runs on the same server pair as identical (greedy).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbench.records import read_json, read_jsonl
from patchbench.suite import SuiteContext
from patchbench.suites.mmmu import Params, report_block, run
from patchbench.suites.mmmu.demo_data import generate
from patchbench.suites.mmmu.pairing import pair_records
from tests.helpers import suite_context

pytestmark = pytest.mark.e2e


def _ctx(server, out: Path, cache: Path) -> SuiteContext:
    return suite_context(server, out, cache)


def test_mmmu_suite_on_cpu_server(cpu_server, tmp_path):
    data = tmp_path / "demo"
    generate(data, n=63, seed=0)
    params = Params(dataset_path=str(data), limit=12, concurrency=4, request_timeout_s=120)
    res = run(_ctx(cpu_server, tmp_path / "a" / "mmmu", tmp_path / "cache"), params)
    assert res.status == "ok", res.errors
    assert res.metrics["mmmu_asked_count"] == 12 and res.metrics["mmmu_failed_count"] == 0
    recs = read_jsonl(tmp_path / "a" / "mmmu" / "records.jsonl")
    assert len(recs) == 12 and all(isinstance(r["response"], str) for r in recs)
    assert {r["subject"] for r in recs} == {
        "Art",
        "Basic_Medical_Science",
        "Math",
        "Computer_Science",
        "Accounting",
        "History",
        "Music",
    }
    # images reached the model: 224x224 -> 64 vision tokens each on Qwen2.5-VL
    tokens = {r["id"]: r["prompt_tokens"] for r in recs}
    assert tokens["validation_Art_1"] >= 64
    assert tokens["validation_Music_1"] >= tokens["validation_Art_1"] + 4 * 64
    assert all(r["completion_tokens"] and r["completion_tokens"] <= 30 for r in recs)
    val = read_json(tmp_path / "a" / "mmmu" / "val_sglang.json")
    assert val["Overall"]["num"] == 12

    res_b = run(_ctx(cpu_server, tmp_path / "b" / "mmmu", tmp_path / "cache"), params)
    recs_b = read_jsonl(tmp_path / "b" / "mmmu" / "records.jsonl")
    p = pair_records([recs], [recs_b])
    assert p["identical_share"] == 1.0 and p["flips"] == 0
    assert res_b.metrics["mmmu_overall_acc"] == res.metrics["mmmu_overall_acc"]
    assert "Overall accuracy:" in report_block(tmp_path / "a" / "mmmu")
