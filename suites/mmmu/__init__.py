"""MMMU accuracy suite: the PR's "Accuracy Tests" protocol, a deterministic parser, the official
parser for comparison with published numbers, and question-by-question pairing of two cells.

Public surface (docs/CONTRACTS.md, "Suites"):

- :class:`Params` (pydantic, extra="forbid"), :func:`run` ``(ctx, params) -> SuiteResult``,
  :data:`METRICS`;
- :func:`pair` ``(records_a, records_b) -> dict``: flips, McNemar exact p, identical-response share;
- :func:`report_block` ``(summary_dir) -> str``: the PR-style block of one cell;
- :func:`cli` ``(argv) -> int``: ``runner.py score-mmmu``.

Modules: data (loading, subjects, domains), demo_data (generated questions), prompts (messages,
images, hashes), client (aiohttp), parsers (strict, official, open), scoring (verdicts, tallies,
file shapes), pairing, bench (run), cli.
"""
from __future__ import annotations

from pathlib import Path

from patchbench.records import read_json
from patchbench.suite import MetricInfo
from patchbench.suites.mmmu.bench import domain_metric, run
from patchbench.suites.mmmu.cli import cli
from patchbench.suites.mmmu.data import DOMAINS
from patchbench.suites.mmmu.pairing import PairingError, pair
from patchbench.suites.mmmu.params import Params
from patchbench.suites.mmmu.scoring import format_block

METRICS: dict[str, MetricInfo] = {
    "mmmu_overall_acc": MetricInfo("higher", "acc", "Overall accuracy"),
    "mmmu_answered_acc": MetricInfo("higher", "acc", "Accuracy over answered questions"),
    **{domain_metric(d): MetricInfo("higher", "acc", f"Overall-{d}") for d in DOMAINS},
    "mmmu_asked_count": MetricInfo("none", "count", "Questions asked"),
    "mmmu_answered_count": MetricInfo("none", "count", "Questions answered"),
    "mmmu_correct_count": MetricInfo("none", "count", "Correct answers"),
    "mmmu_failed_count": MetricInfo("lower", "count", "Failed requests"),
    "mmmu_unparsed_count": MetricInfo("none", "count", "Unparsed answers"),
    "mmmu_fallback_count": MetricInfo("none", "count", "Official parser random fallbacks"),
}


def report_block(summary_dir: str | Path) -> str:
    """The PR-style "Accuracy Tests" block of one cell, from its mmmu folder alone
    (``val_sglang.json``; ``summary.json`` for the benchmark time, protocol and parser).

    Raises FileNotFoundError naming the missing val_sglang.json.
    """
    d = Path(summary_dir)
    val = read_json(d / "val_sglang.json")
    meta: dict = {}
    if (d / "summary.json").exists():
        meta = read_json(d / "summary.json").get("meta", {})
    block = format_block(val, benchmark_time_s=meta.get("duration_s"))
    if meta:
        sc = meta.get("scores", {}).get("overall", {})
        seed = f", seed {meta.get('parser_seed')}" if meta.get("parser") == "official" else ""
        block += (f"\n(patchbench: protocol {meta.get('protocol')}, parser {meta.get('parser')}"
                  f"{seed}; asked {sc.get('asked')}, failed {sc.get('failed')}, "
                  f"unparsed {sc.get('unparsed')}; accuracy over asked)")
    return block


__all__ = ["Params", "run", "METRICS", "pair", "PairingError", "report_block", "cli"]
