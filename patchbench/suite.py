"""The contract between the orchestrator and a suite (DESIGN.md, "Interfaces").

A suite is a package ``suites/<name>/`` whose ``__init__.py`` exposes:

- ``Params``: a pydantic model (``extra="forbid"``) of the suite's parameters in the YAML config,
  with the defaults the suite documents;
- ``run(ctx: SuiteContext, params: Params) -> SuiteResult``: runs against a ready server (or, for a
  suite that needs none, against the variant's sglang package), writes its per-item records into
  ``ctx.out_dir`` and returns the summary. It raises :class:`SuiteError` for a failure it
  understands (the cell is marked failed with that message); anything else is a bug and is also
  recorded as a failure with its traceback;
- ``METRICS``: ``{metric_name: MetricInfo}``, the metrics the suite reports, with the direction in
  which a change is an improvement, used by the comparison and the nightly gates;
- optionally ``NEEDS_SERVER = False`` when the suite does not talk to a server (sync_probe).

Every metric name carries its unit (``_ms``, ``_s``, ``_tok_s``, ``_req_s``, ``_acc``, ``_count``,
``_share``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Literal

from pydantic import BaseModel

#: suite name in the config -> importable module
SUITES: dict[str, str] = {
    "mmmu": "suites.mmmu",
    "serving": "suites.serving",
    "sync_probe": "suites.sync_probe",
}


class SuiteError(RuntimeError):
    """A suite failure the suite understood (server died, bench_serving exited non-zero, ...)."""


@dataclass(frozen=True)
class MetricInfo:
    """What a metric means for a comparison.

    better: "higher" (throughput, accuracy), "lower" (latencies), or "none" (descriptive only,
    never gets an improved/regressed verdict, e.g. a token count).
    unit: display unit ("ms", "s", "tok/s", "req/s", "acc", "count", "share").
    label: the label sglang.bench_serving (or the MMMU script) prints, when there is one.
    """

    better: Literal["higher", "lower", "none"]
    unit: str
    label: str = ""


@dataclass
class ServerInfo:
    """A ready sglang server as a suite sees it.

    base_url: e.g. "http://127.0.0.1:30000"; model_path: the --model-path given to the server
    (also the tokenizer unless tokenizer_path says otherwise); flush_cache(): POST /flush_cache with
    the config's retry budget, raises SuiteError when it is refused for the whole budget;
    log_path: the server.log of this cell; pid: the server's process-group leader;
    alive(): True while the server process lives.
    """

    base_url: str
    host: str
    port: int
    model_path: str
    tokenizer_path: str
    log_path: Path
    pid: int
    flush_cache: Callable[[], None]
    alive: Callable[[], bool]


@dataclass
class SuiteContext:
    """Everything a suite may use for one (variant, repeat) cell.

    server: None for suites with NEEDS_SERVER = False.
    out_dir: this suite's folder in the cell (exists, empty on a fresh run).
    run_dir: the run folder; cache_dir: a per-run cache shared by all cells (e.g. encoded images,
    so work is done once per run and not once per variant).
    variant / repeat / baseline: names of the cell and of the run's baseline variant.
    sglang_version: the installed (pinned) release; python: the interpreter of the environment
    (sys.executable of the runner).
    stock_env: environment for running the STOCK sglang package as a client (e.g.
    bench_serving): PYTHONPATH has the stand-ins (if any) but no overlay.
    variant_sglang_dir: the ``sglang`` package folder the variant's server imports (an overlay, or
    the installed package for a variant without patches); stock_sglang_dir: the installed one.
    device: "cuda" or "cpu" (what the server runs on).
    log: print a line to the console (prefixed with the cell name).
    """

    server: ServerInfo | None
    out_dir: Path
    run_dir: Path
    cache_dir: Path
    variant: str
    repeat: int
    baseline: str
    sglang_version: str
    python: str
    stock_env: dict[str, str]
    variant_sglang_dir: Path
    stock_sglang_dir: Path
    device: str
    log: Callable[[str], None] = print


@dataclass
class SuiteResult:
    """What a suite returns; written by the orchestrator to ``<suite>/summary.json``.

    status: "ok"; "incomplete" (ran, but e.g. completed < requested: no verdict later);
    "failed" is set by the orchestrator when run() raises.
    metrics: flat {name_with_unit: float}. errors / warnings: human-readable lines shown in the
    report next to the numbers they taint. meta: anything else worth keeping (protocol, seeds,
    command lines, dataset sizes).
    """

    status: Literal["ok", "incomplete", "failed"] = "ok"
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self, suite: str) -> dict[str, Any]:
        return {"suite": suite, "status": self.status, "metrics": self.metrics,
                "errors": self.errors, "warnings": self.warnings, "meta": self.meta}


def load_suite(name: str) -> ModuleType:
    """Import the suite package registered under ``name``.

    Raises KeyError naming the allowed suites when ``name`` is unknown.
    """
    if name not in SUITES:
        raise KeyError(f"unknown suite '{name}'; allowed: {', '.join(sorted(SUITES))}")
    return importlib.import_module(SUITES[name])


def suite_params_model(name: str) -> type[BaseModel]:
    """The suite's ``Params`` pydantic model (see module docstring)."""
    return load_suite(name).Params
