"""Synthetic run folders with known values (docs/CONTRACTS.md, "Run folder"), for tests and scripts.

Used by the comparison, report, verdict, history and nightly tests and by tools/calibrate.py
(``--via-folders``, and tests/tools/test_calibrate.py's check that its in-memory shortcut gives the same
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


def declare_suite(monkeypatch: Any, name: str, metrics: dict[str, Any]) -> None:
    """Register, for one test, a suite ``name`` (a ``patchbench.suite.Suite`` with no hooks) that
    declares ``metrics`` ({metric: ``MetricInfo``}); the registry is as before afterwards."""
    from patchbench import suite

    cls = type("DeclaredSuite", (suite.Suite,), {"name": name, "metrics": metrics})
    monkeypatch.setitem(suite._REGISTRY, name, cls)
    monkeypatch.setitem(suite._INSTANCES, name, cls())


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
    meta: dict[tuple[str, int, str], dict] | None = None,
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
    builds: dict[str, dict] | None = None,
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
    meta[(variant, k, suite)]: the summary's ``meta`` (default {}).
    requests[(variant, k)]: serving requests.json content; mmmu_records[(variant, k)]: rows.
    schedule_repeats: the config's ``schedule.repeats`` (default ``repeats``; a mapping
    ``{min, max, step}`` for a sequential schedule; a count above ``repeats`` for a run that
    stopped before its planned rounds).
    builds: the manifest's ``builds`` ({variant: a ``Build.to_json()`` record}; default none).
    """
    variants = variants or {"baseline": [], "patched": ["p1"]}
    metrics = metrics or {}
    baseline = baseline or next(iter(variants))
    if repeats is None:
        lens = [len(vals) for m in metrics.values() for per in m.values() for vals in per.values()]
        repeats = max(lens) if lens else 1
    requests = requests or {}
    mmmu_records = mmmu_records or {}
    suites = _suites_of(metrics, requests, mmmu_records)
    run = Path(root) / run_id
    run.mkdir(parents=True, exist_ok=True)
    vnames = [baseline] + [v for v in variants if v != baseline]
    extras = {
        "suite_status": suite_status or {},
        "warnings": warnings or {},
        "bounds": bounds or {},
        "meta": meta or {},
        "requests": requests,
        "mmmu_records": mmmu_records,
    }
    cells = _write_cells(run, vnames, repeats, order, cell_status or {}, suites, metrics, extras)
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
    if builds is not None:
        manifest["builds"] = builds
    records.write_json(run / "manifest.json", manifest)
    return run


def _suites_of(metrics: dict, requests: dict, mmmu_records: dict) -> list[str]:
    """The run's suites: those with metrics, then serving (with ``requests``) and mmmu (with
    ``mmmu_records``) when not among them."""
    suites = list(metrics)
    if requests and "serving" not in suites:
        suites.append("serving")
    if mmmu_records and "mmmu" not in suites:
        suites.append("mmmu")
    return suites


def _write_cells(
    run: Path,
    vnames: list[str],
    repeats: int,
    order: str,
    cell_status: dict[tuple[str, int], str],
    suites: list[str],
    metrics: dict[str, dict[str, dict[str, list[float | None]]]],
    extras: dict[str, Any],
) -> list[dict[str, Any]]:
    """Every cell's folder in run order (interleaved: the variants reversed every other round;
    a cell whose status is "missing" gets none); returns the manifest's ``cells`` rows."""
    cells = []
    for k in range(repeats):
        names = vnames if (order == "sequential" or k % 2 == 0) else list(reversed(vnames))
        for v in names:
            st = cell_status.get((v, k), "ok")
            cells.append(
                {"variant": v, "repeat": k, "status": st, "dir": str(records.cell_dir(run, v, k))}
            )
            if st != "missing":
                _write_cell(run, v, k, st, suites, metrics, **extras)
    return cells


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
    meta: dict[tuple[str, int, str], dict],
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
                "meta": meta.get((v, k, suite), {}),
            },
        )
        if suite == "serving" and (v, k) in requests:
            records.write_json(cdir / suite / "requests.json", requests[(v, k)])
        if suite == "mmmu" and (v, k) in mmmu_records:
            records.write_jsonl(cdir / suite / "records.jsonl", mmmu_records[(v, k)])


def make_sweep_run(
    root: str | Path,
    *,
    gains: dict[str, float] | None = None,
    n: int = 6,
    seed: int = 5,
    points: tuple[int, ...] = (1, 4, 16, 64),
    undelivered: dict[tuple[str, int], list[str]] | None = None,
    **kw: Any,
) -> Path:
    """A synthetic serving load sweep over ``max_concurrency`` ``points`` (:func:`make_run`;
    ``kw`` go to it): per point (key ``c<p>``) output throughput, per-GPU and per-user tok/s,
    median / p99 ITL and goodput, and the curve metrics, ``n`` repeats of lognormal noise (2 %
    run, 1 % more for the variant) from ``seed``. ``gains[key]``: the variant's throughput
    factor at that point (1 / it for ITL). ``undelivered[(variant, k)]``: point keys the client
    did not deliver in that cell: their metrics are left out and named in the summary's
    ``meta.not_judged``, as the serving suite does."""
    import numpy as np

    rng = np.random.default_rng(seed)
    gains = gains or {}
    metrics: dict[str, dict[str, list[float | None]]] = {}
    keys = [f"c{p}" for p in points]

    def put(name: str, base: float, factor: float) -> None:
        b = base * np.exp(rng.normal(0, 0.02, n))
        metrics[name] = {
            "baseline": [float(x) for x in b],
            "patched": [float(x) for x in b * factor * np.exp(rng.normal(0, 0.01, n))],
        }

    for p, k in zip(points, keys, strict=True):
        g = gains.get(k, 1.0)
        thr = 30.0 * p / (1 + p / 24)
        put(f"output_throughput_tok_s@{k}", thr, g)
        put(f"output_per_gpu_tok_s@{k}", thr, g)
        put(f"itl_median_ms@{k}", 30.0 * (1 + p / 24), 1 / g)
        put(f"itl_p99_ms@{k}", 60.0 * (1 + p / 24), 1 / g)
        put(f"output_per_user_tok_s@{k}", 1000 / (30.0 * (1 + p / 24)), g)
        put(f"goodput_req_s@{k}", thr / 64, g)
    put("goodput_at_slo_req_s", 30.0 * 16 / (1 + 16 / 24) / 64, 1.0)
    put("max_concurrency_at_slo_count", 40.0, 1.0)
    meta: dict[tuple[str, int, str], dict] = {}
    for (v, k), gone in (undelivered or {}).items():
        why = {}
        for name, per in metrics.items():
            if "@" in name and name.split("@", 1)[1] in gone:
                per[v][k] = None
                why[name] = "the client reached 1 of the 64 asked (max_concurrency): not delivered"
        meta[(v, k, "serving")] = {"not_judged": why}
    params = dict(kw.pop("suites_params", None) or {})
    params.setdefault("serving", {"sweep": {"points": list(points)}})
    return make_run(root, metrics={"serving": metrics}, suites_params=params, meta=meta, **kw)


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


def make_throughput_night(
    root: str | Path,
    run_id: str,
    started_at: str,
    base: list[float],
    var: list[float],
    *,
    name: str,
    metrics: dict[str, dict[str, dict[str, list[float | None]]]] | None = None,
    sglang: str = "0.5.1.post3",
) -> Path:
    """A nightly run folder (:func:`make_run`) started at ``started_at`` (UTC ISO), with the
    serving output throughput per repeat of ``baseline`` (``base``, tok/s) and ``patched``
    (``var``), and its report's compare.json (``compare_run``); ``metrics``: every suite's values
    (default: that throughput only). Returns the run folder."""
    from patchbench.analysis.build import compare_run

    tput = "output_throughput_tok_s"
    run = make_run(
        root,
        run_id=run_id,
        name=name,
        sglang=sglang,
        metrics=metrics or {"serving": {tput: {"baseline": base, "patched": var}}},
    )
    m = records.read_json(run / "manifest.json")
    m["started_at"] = started_at
    records.write_json(run / "manifest.json", m)
    compare_run(run)
    return run
