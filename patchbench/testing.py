"""Synthetic run folders with known values (docs/CONTRACTS.md, "Run folder"), for tests and scripts.

Used by the comparison, report, verdict, history and nightly tests and by scripts/calibrate.py
(``--via-folders``, and tests/test_calibrate.py's check that its in-memory shortcut gives the same
verdicts as a run folder). Nothing here starts a server: it writes manifest.json, cell.json,
summary.json and, on request, serving requests.json and mmmu records.jsonl, through
patchbench.records (atomic writes).

Example::

    run = make_run(tmp_path, variants={"baseline": [], "patched": ["p1"]},
                   metrics={"serving": {"output_throughput_tok_s":
                                        {"baseline": [100, 101, 99], "patched": [110, 111, 109]}}})
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench import records


def make_run(
    root: str | Path,
    *,
    variants: dict[str, list[str]] | None = None,
    metrics: dict[str, dict[str, dict[str, list[float | None]]]] | None = None,
    repeats: int | None = None,
    baseline: str | None = None,
    cell_status: dict[tuple[str, int], str] | None = None,
    suite_status: dict[tuple[str, int, str], str] | None = None,
    warnings: dict[tuple[str, int, str], list[str]] | None = None,
    bounds: dict[tuple[str, int, str], dict[str, str]] | None = None,
    requests: dict[tuple[str, int], dict] | None = None,
    mmmu_records: dict[tuple[str, int], list[dict]] | None = None,
    compare: dict | None = None,
    suites_params: dict[str, dict] | None = None,
    run_id: str = "20260101T000000Z-synthetic",
    name: str = "synthetic",
    sglang: str = "0.5.1.post3",
    model: str = ".cache/models/tiny-qwen25vl",
    server_args: list[str] | None = None,
    gpu: dict | None = None,
    patches_sha: dict[str, list[dict]] | None = None,
    order: str = "interleaved",
    write_cells_in_manifest: bool = True,
    schedule_repeats: int | dict | None = None,
) -> Path:
    """Write a run folder under ``root/run_id`` and return its path.

    variants: name -> patch list (baseline first unless ``baseline`` names it); a variant whose
    list equals the baseline's is an A/A variant.
    metrics: suite -> metric -> variant -> per-repeat values (``None`` leaves the metric out of
    that cell's summary). ``repeats`` defaults to the longest list.
    cell_status[(variant, k)] / suite_status[(variant, k, suite)]: "ok" (default), "failed",
    "incomplete"; a cell status "missing" writes no folder at all.
    warnings[(variant, k, suite)]: summary warnings lines.
    bounds[(variant, k, suite)]: the summary's ``bounds`` ({metric: "lower" | "upper"}).
    requests[(variant, k)]: serving requests.json content; mmmu_records[(variant, k)]: rows.
    schedule_repeats: the config's ``schedule.repeats`` (default ``repeats``; a mapping
    ``{min, max, step}`` for a sequential schedule; a count above ``repeats`` for a run that
    stopped before its planned rounds).
    """
    variants = variants or {"baseline": [], "patched": ["p1"]}
    metrics = metrics or {}
    baseline = baseline or next(iter(variants))
    if repeats is None:
        lens = [len(vals) for m in metrics.values() for per in m.values() for vals in per.values()]
        repeats = max(lens) if lens else 1
    requests = requests or {}
    mmmu_records = mmmu_records or {}
    suites = list(metrics)
    if requests and "serving" not in suites:
        suites.append("serving")
    if mmmu_records and "mmmu" not in suites:
        suites.append("mmmu")
    run = Path(root) / run_id
    run.mkdir(parents=True, exist_ok=True)
    vnames = [baseline] + [v for v in variants if v != baseline]
    extras = {
        "suite_status": suite_status or {},
        "warnings": warnings or {},
        "bounds": bounds or {},
        "requests": requests,
        "mmmu_records": mmmu_records,
    }
    cells = []
    for k in range(repeats):
        names = vnames if (order == "sequential" or k % 2 == 0) else list(reversed(vnames))
        for v in names:
            st = (cell_status or {}).get((v, k), "ok")
            cells.append(
                {"variant": v, "repeat": k, "status": st, "dir": str(records.cell_dir(run, v, k))}
            )
            if st != "missing":
                _write_cell(run, v, k, st, suites, metrics, **extras)
    config: dict[str, Any] = {
        "name": name,
        "sglang": sglang,
        "model": {"path": model, "tiny": True, "tokenizer": None},
        "server": {"args": server_args or ["--device", "cpu"]},
        "variants": variants,
        "baseline": baseline,
        "schedule": {
            "repeats": repeats if schedule_repeats is None else schedule_repeats,
            "order": order,
        },
        "suites": {s: (suites_params or {}).get(s, {}) for s in suites},
        "compare": compare or {},
    }
    patches = patches_sha or {
        v: [{"name": p, "sha256": "0" * 64} for p in ps] for v, ps in variants.items()
    }
    manifest = {
        "run_id": run_id,
        "config": config,
        "sglang_version": sglang,
        "patches": patches,
        "git_sha": "deadbeef" * 5,
        "host": {"hostname": "test", "cpus": 2},
        "gpu": gpu,
        "cells": cells if write_cells_in_manifest else [],
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T01:00:00Z",
        "timings_s": {},
    }
    records.write_json(run / "manifest.json", manifest)
    return run


def _write_cell(
    run: Path,
    v: str,
    k: int,
    status: str,
    suites: list[str],
    metrics: dict[str, dict[str, dict[str, list[float | None]]]],
    *,
    suite_status: dict[tuple[str, int, str], str],
    warnings: dict[tuple[str, int, str], list[str]],
    bounds: dict[tuple[str, int, str], dict[str, str]],
    requests: dict[tuple[str, int], dict],
    mmmu_records: dict[tuple[str, int], list[dict]],
) -> None:
    """One cell folder of :func:`make_run`: cell.json, each suite's summary.json (repeat k of
    every metric that has one) and the serving requests / MMMU records given for (v, k)."""
    cdir = records.cell_dir(run, v, k)
    records.write_json(
        cdir / "cell.json",
        {
            "variant": v,
            "repeat": k,
            "status": status,
            "error": None if status == "ok" else f"synthetic {status}",
            "timings_s": {},
            "server": {},
        },
    )
    for suite in suites:
        vals = {}
        for m, per in metrics.get(suite, {}).items():
            seq = per.get(v) or []
            if k < len(seq) and seq[k] is not None:
                vals[m] = float(seq[k])
        sstat = suite_status.get((v, k, suite), "ok")
        records.write_json(
            cdir / suite / "summary.json",
            {
                "suite": suite,
                "status": sstat,
                "metrics": vals,
                "errors": [] if sstat == "ok" else [f"synthetic {sstat}"],
                "warnings": warnings.get((v, k, suite), []),
                "bounds": bounds.get((v, k, suite), {}),
                "meta": {},
            },
        )
        if suite == "serving" and (v, k) in requests:
            records.write_json(cdir / suite / "requests.json", requests[(v, k)])
        if suite == "mmmu" and (v, k) in mmmu_records:
            records.write_jsonl(cdir / suite / "records.jsonl", mmmu_records[(v, k)])


def make_requests(
    ttft_ms: list[float],
    itl_ms: list[list[float]],
    texts: list[str] | None = None,
    errors: list[str] | None = None,
) -> dict:
    """A serving requests.json dict; e2e = ttft + sum(itl) (docs/FACTS.md section 2), output_len =
    1 + len(itl) tokens, input_len 10."""
    n = len(ttft_ms)
    return {
        "ttft_ms": list(ttft_ms),
        "itl_ms": [list(x) for x in itl_ms],
        "e2e_ms": [t + sum(i) for t, i in zip(ttft_ms, itl_ms, strict=True)],
        "input_len": [10] * n,
        "output_len": [1 + len(i) for i in itl_ms],
        "generated_text": list(texts) if texts is not None else [f"text {i}" for i in range(n)],
        "error": list(errors) if errors is not None else [""] * n,
    }


def mmmu_rows(
    verdicts: list[str], subjects: list[str] | None = None, responses: list[str] | None = None
) -> list[dict]:
    """MMMU records.jsonl rows with ids q0..q{n-1} and the given verdicts."""
    n = len(verdicts)
    subjects = subjects or ["Math"] * n
    responses = responses or [f"answer {i}" for i in range(n)]
    return [
        {
            "id": f"q{i}",
            "subject": subjects[i],
            "question_type": "multiple-choice",
            "prompt_sha256": "0" * 64,
            "response": responses[i],
            "parsed": "A",
            "verdict": verdicts[i],
            "latency_s": 1.0,
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "error": None,
        }
        for i in range(n)
    ]
