"""``run(ctx, params)``: one MMMU cell against a ready sglang server: prepare the questions (cached
per run in ``ctx.cache_dir``), send them, score the responses and write ``records.jsonl``,
``answer_sglang.json``, ``val_sglang.json`` and ``scores.json`` (docs/mmmu.md, docs/CONTRACTS.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import patchbench.suites.mmmu.client as client
import patchbench.suites.mmmu.load as load
import patchbench.suites.mmmu.scoring as scoring
from patchbench.inputs import CACHE_DIR, REPO_ROOT
from patchbench.records import read_jsonl, write_jsonl
from patchbench.suite import SuiteContext, SuiteError, SuiteResult
from patchbench.suites.mmmu.data import DOMAINS, load_questions
from patchbench.suites.mmmu.params import Params
from patchbench.suites.mmmu.prompts import (
    PromptError,
    build_messages,
    prompt_text,
    unreferenced_images,
)

PREPARED_VERSION = 2  # 2: images the text does not name are sent after it
#: ``dataset`` value that selects the generated demo questions (patchbench.suites.mmmu.demo_data)
DEMO_DATASET = "patchbench/mmmu-demo"


def resolve_dataset_path(p: str | None) -> Path | None:
    """``dataset_path`` with ``~`` expanded; a relative path resolves against the repo root."""
    return None if p is None else REPO_ROOT / Path(p).expanduser()


def dataset_folder(params: Params) -> Path | None:
    """The local folder to load from; for :data:`DEMO_DATASET` the demo questions at
    ``dataset_path`` (default ``.cache/data/mmmu-demo``), generated there first when missing."""
    dp = resolve_dataset_path(params.dataset_path)
    if params.dataset != DEMO_DATASET:
        return dp
    dp = dp or CACHE_DIR / "data" / "mmmu-demo"
    if not any(dp.glob(f"*/{params.split}-*.parquet")):
        from patchbench.suites.mmmu.demo_data import generate

        generate(dp)
    return dp


def prepare_key(params: Params) -> str:
    """sha256 (first 16 hex) of everything that shapes the prompts of a run."""
    dp = resolve_dataset_path(params.dataset_path)
    spec = {
        "v": PREPARED_VERSION,
        "dataset": params.dataset,
        "dataset_path": str(dp) if dp else None,
        "split": params.split,
        "subjects": params.subjects,
        "limit": params.limit,
        "protocol": params.protocol,
        "mc": params.mc_template,
        "open": params.open_template,
        "opt": params.option_format,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def prepare(params: Params, cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """The prepared questions in order: ``[{"id", "subject", "question_type", "gold",
    "index2ans", "messages", "prompt_sha256", "n_images_sent", "n_images",
    "images_unreferenced"}]``, read from or written to ``cache_dir/mmmu/prepared-<key>.jsonl``.
    Raises DatasetUnavailable / SuiteError naming the question for data that cannot be used."""
    cache = (
        Path(cache_dir) / "mmmu" / f"prepared-{prepare_key(params)}.jsonl" if cache_dir else None
    )
    if cache is not None and cache.exists():
        return read_jsonl(cache)
    questions = load_questions(
        params.dataset, dataset_folder(params), params.split, params.subjects, params.limit
    )
    rows = []
    for q in questions:
        try:
            messages, sha, n_sent = build_messages(
                q, params.protocol, params.mc_template, params.open_template, params.option_format
            )
        except PromptError as e:
            raise SuiteError(str(e)) from e
        unref = unreferenced_images(
            q, prompt_text(q, params.mc_template, params.open_template, params.option_format)
        )
        rows.append(
            {
                "id": q.id,
                "subject": q.subject,
                "question_type": q.question_type,
                "gold": q.answer,
                "index2ans": q.index2ans,
                "messages": messages,
                "prompt_sha256": sha,
                "n_images_sent": n_sent,
                "n_images": len(q.images),
                "images_unreferenced": unref,
            }
        )
    if cache is not None:
        write_jsonl(cache, rows)
    return rows


def score_records(
    prepared: list[dict[str, Any]], outcomes: list[client.Outcome], params: Params
) -> list[dict[str, Any]]:
    """One record per question (docs/CONTRACTS.md, docs/mmmu.md); the official parser's random
    fallback draws from one ``random.Random(params.seed)`` in question order."""
    rng = scoring.fallback_rng(params.parser, params.official_fallback, params.seed)
    return [
        scoring.scored_record(
            p,
            o.response,
            parser=params.parser,
            seed=params.seed,
            fallback=params.official_fallback,
            rng=rng,
            failed=o.error is not None,
            prompt_sha256=p["prompt_sha256"],
            latency_s=o.latency_s,
            prompt_tokens=o.prompt_tokens,
            completion_tokens=o.completion_tokens,
            error=o.error,
            protocol=params.protocol,
            sampling=params.sampling,
            n_images=p.get("n_images"),
            n_images_sent=p["n_images_sent"],
            images_unreferenced=p.get("images_unreferenced", []),
            attempts=o.attempts,
            finish_reason=o.finish_reason,
        )
        for p, o in zip(prepared, outcomes, strict=True)
    ]


def run(ctx: SuiteContext, params: Params) -> SuiteResult:
    """One cell; SuiteError without a server or when the questions cannot be loaded. Status
    "incomplete" when a request failed (counted wrong, listed in ``errors``). Several
    concurrencies: one pass each into ``c<N>/``, merged by :func:`.load.merge_passes`; the
    correctness cell of ``deterministic_control`` runs the highest one only."""
    if ctx.server is None:
        raise SuiteError("the mmmu suite needs a running server (ctx.server is None)")
    t0 = time.perf_counter()
    prepared = prepare(params, ctx.cache_dir)
    t_prep = time.perf_counter() - t0
    model = asyncio.run(client.served_model(ctx.server.base_url)) or "default"
    meta = {"prepare_s": t_prep, "model": model, "domains": list(DOMAINS)}
    control = load.is_control(ctx, params)
    if control or not params.loads:
        c = params.concurrencies[-1]
        result = one_pass(ctx, params, prepared, model, c, ctx.out_dir, meta)
        if control:
            result.meta["deterministic_control"] = {"concurrency": c, "flag": load.FLAG}
        return result
    passes = {}
    for key, c in zip(params.loads, params.concurrencies, strict=True):
        if passes:  # the cache the last pass left would turn prefills into cache hits
            ctx.server.flush_cache()
        passes[key] = one_pass(ctx, params, prepared, model, c, ctx.out_dir / key, meta)
    return load.merge_passes(passes, ctx.out_dir)


def one_pass(
    ctx: SuiteContext,
    params: Params,
    prepared: list[dict[str, Any]],
    model: str,
    concurrency: int,
    out_dir: Path,
    meta: dict[str, Any],
) -> SuiteResult:
    """Send every question at ``concurrency``, score, write the records into ``out_dir``."""
    bodies = [
        client.request_body(
            p["messages"],
            model=model,
            temperature=params.temperature,
            max_tokens=params.max_tokens,
            extra=params.extra_body,
        )
        for p in prepared
    ]
    ctx.log(
        f"mmmu: {len(prepared)} questions, protocol {params.protocol}, parser "
        f"{params.parser}, concurrency {concurrency}"
    )
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)  # a bar on a terminal only
    cols = (TextColumn("mmmu"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar = Progress(*cols, console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task("mmmu", total=len(bodies))
    meter = ctx.server.progress  # the liveness watch: replies that stop coming fail the cell
    t1 = time.perf_counter()

    def on_done() -> None:
        bar.advance(task)
        if meter is not None:
            meter.done()

    if meter is not None:
        meter.expect(len(bodies), "mmmu replies")
    try:
        with bar:
            outcomes = asyncio.run(
                client.send_all(
                    ctx.server.base_url,
                    bodies,
                    concurrency=concurrency,
                    request_timeout_s=params.request_timeout_s,
                    retries=params.retries,
                    on_done=on_done,
                )
            )
    finally:
        if meter is not None:
            meter.idle()
    duration = time.perf_counter() - t1
    records = score_records(prepared, outcomes, params)
    result, sc = scoring.summarize(records, params, duration_s=duration, extra_meta=meta)
    scoring.write_outputs(out_dir, records, sc)
    ctx.log(
        f"mmmu: overall {result.metrics['mmmu_overall_acc']:.3f} over "
        f"{int(result.metrics['mmmu_asked_count'])} asked "
        f"({int(result.metrics['mmmu_failed_count'])} failed, "
        f"{int(result.metrics['mmmu_unparsed_count'])} unparsed) in {duration:.1f} s"
    )
    return result
