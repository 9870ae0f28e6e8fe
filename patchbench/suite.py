"""The suite contract (docs/design.md, "The suite contract"). Besides the built-in suites, one
registers on import from a module named in ``PATCHBENCH_SUITE_MODULES`` (comma-separated) or
through the ``patchbench.suites`` entry-point group.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from patchbench.errors import RunFailed
from patchbench.records import read_json

#: the package of the built-in suites: one folder (patchbench/suites/<name>/), one suite. It is
#: imported by this name, as each suite is, so the contract imports no suite
SUITES_PACKAGE = "patchbench.suites"
#: metric-name suffix -> display unit (the contract's naming rule; longest suffixes first)
UNIT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_tok_s", "tok/s"),
    ("_req_s", "req/s"),
    ("_ms", "ms"),
    ("_us", "us"),
    ("_s", "s"),
    ("_acc", "acc"),
    ("_count", "count"),
    ("_share", "share"),
    ("_pct", "%"),
)


def unit_of(metric: str) -> str:
    """The display unit a metric's name declares by its suffix ("" when it has none)."""
    return next((u for suf, u in UNIT_SUFFIXES if metric.endswith(suf)), "")


class SuiteError(RunFailed):
    """A failure the suite understood (e.g. bench_serving exited non-zero): the cell fails with
    this message (exit 4 if it ends a command)."""


@dataclass(frozen=True)
class MetricInfo:
    """What a metric means for a comparison (docs/CONTRACTS.md, "Suites"); without
    ``deterministic_by`` a deterministic value is exact only when every arm measured it twice
    with no spread."""

    better: Literal["higher", "lower", "none"]
    unit: str
    label: str = ""
    primary: bool = False
    kind: Literal["run", "accuracy", "deterministic", "descriptive"] = "run"
    margin: float | None = None
    deterministic_by: str | None = None


@dataclass
class Instrumentation:
    """What a suite's ``instrumentation`` hook asks of the server of a correctness cell
    (docs/CONTRACTS.md, "Suites"): ``out_dir`` is created by the core; ``collect(out_dir)`` runs
    once after the server stopped, its dict recorded in ``cell.json`` ``instrumentation``."""

    env: dict[str, str] = field(default_factory=dict)
    hooks: list[Path] = field(default_factory=list)
    out_dir: Path | None = None
    perturbs_timing: bool = True
    collect: Callable[[Path], dict] | None = None
    server_args: list[str] = field(default_factory=list)


@dataclass
class ServerInfo:
    """A ready sglang server as a suite sees it.

    model_path: the server's --model-path (the tokenizer too unless tokenizer_path differs);
    flush_cache(): POST /flush_cache within the config's retries (SuiteError when refused);
    log_path: this cell's server.log; pid: the process-group leader; alive(): the process lives;
    progress: the liveness watch's ``ProgressMeter`` or None: a suite awaiting replies calls
    ``progress.expect(n)`` and ``progress.done()`` per reply, so stopped replies fail the cell."""

    base_url: str
    host: str
    port: int
    model_path: str
    tokenizer_path: str
    log_path: Path
    pid: int
    flush_cache: Callable[[], None]
    alive: Callable[[], bool]
    progress: Any = None


@dataclass
class SuiteContext:
    """Everything a suite may use for one (variant, repeat) cell.

    server: None for a suite with ``needs_server = False``; out_dir: this suite's folder in the
    cell (exists); cache_dir: a per-run cache shared by all cells; python: the environment's
    interpreter; stock_env: the environment to run the STOCK sglang package as a client (no
    overlay on PYTHONPATH); variant_sglang_dir: the ``sglang`` folder the variant's server imports;
    stock_sglang_dir: the installed one; device: "cuda" or "cpu"; log: a console line."""

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
    """What a suite returns; written to ``<suite>/summary.json``.

    status: "ok", "incomplete" (ran, but no verdict later) or "failed" (set when run() raises);
    metrics: flat {name_with_unit: float}; errors / warnings: lines shown beside the numbers; meta:
    anything else worth keeping; bounds: {metric: "lower" | "upper"} for values that are only a
    bound (a deterministic comparison then concludes only what the bound allows)."""

    status: Literal["ok", "incomplete", "failed"] = "ok"
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    bounds: dict[str, Literal["lower", "upper"]] = field(default_factory=dict)

    def to_json(self, suite: str) -> dict[str, Any]:
        return {
            "suite": suite,
            "status": self.status,
            "metrics": self.metrics,
            "errors": self.errors,
            "warnings": self.warnings,
            "meta": self.meta,
            "bounds": self.bounds,
        }


class Suite:
    """Base class of every suite (docs/CONTRACTS.md, "Suites"); one instance per process
    (:func:`get_suite`), no state kept; the optional hooks do nothing by default."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]]
    metrics: ClassVar[dict[str, MetricInfo]] = {}
    needs_server: ClassVar[bool] = True
    timed: ClassVar[bool] = True

    def run(self, ctx: SuiteContext, params: BaseModel) -> SuiteResult:
        """Run against ``ctx.server`` (or the variant's package), write records into
        ``ctx.out_dir``, return the summary; raise :class:`SuiteError` for an understood failure."""
        raise NotImplementedError

    def declarations(self, params: Any) -> dict[str, MetricInfo]:
        """The metric declarations of a run with ``params`` (validated, or a raw dict when it does not
        validate): :attr:`metrics` unless the parameters add some (a load sweep's per-point metrics)."""
        return dict(self.metrics)

    def plan_lines(
        self, params: BaseModel, cells_per_round: int = 1, cpu: bool = False
    ) -> list[str]:
        """Lines ``bench --dry-run`` prints under the suite's parameters (``cells_per_round``: the timed
        cells of a round; ``cpu``: sglang's CPU engine)."""
        return []

    def instrumentation(self, ctx: SuiteContext, params: BaseModel) -> Instrumentation | None:
        """In-server instrumentation for this suite's correctness cell (None: none)."""
        return None

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: BaseModel
    ) -> dict | None:
        """Paired analysis of repeat k's folders (``baseline_dirs[k]``, ``variant_dirs[k]``: repeats
        where both cells are ok): a JSON-able dict stored under ``pairs[<suite>][<variant>]`` (the
        keys the core reads: docs/CONTRACTS.md, "Pair hook keys"), None for none; raise
        :class:`PairingRefused` when the cells must not be paired."""
        return None

    def report_section(self, comparison: Any) -> list[str]:
        """Markdown lines for report.md, rendered only from the typed comparison (its
        ``pairs[self.name]``: {variant: what :meth:`pair` returned} and its metric rows)."""
        return []

    def plots(self, comparison: Any, out_dir: Path) -> list[Path]:
        """PNG files written into ``out_dir`` from the typed comparison; returns their paths."""
        return []

    def pr_panels(self, comparison: Any) -> list[Callable[[Any], Any]]:
        """Panels this suite adds to the PR figure, first: each a callable drawing one matplotlib
        axes from the typed comparison (title and legend included); none by default."""
        return []

    def report_block(self, suite_dir: Path) -> str | None:
        """The PR-style text block of one cell (None: the suite has none)."""
        return None

    def check_release(self, params: BaseModel, stock_sglang_dir: Path, release: str) -> None:
        """Before any server starts: raise :class:`SuiteError` when the clients' sglang ``release``
        (its package folder ``stock_sglang_dir``) cannot run ``params``; nothing by default."""

    def hf_datasets(self, params: BaseModel) -> list[tuple[str, str, str | None]]:
        """The Hugging Face datasets these parameters read, as (what, repo id, local path or
        None) for ``patchbench doctor CONFIG`` to find (e.g. ("suite mmmu: dataset MMMU/MMMU",
        "MMMU/MMMU", None)); none by default."""
        return []


class PairingRefused(RuntimeError):
    """Two cells must not be paired; ``str(exc)`` is stored under ``refusals[<suite>][<variant>]``
    and shown instead of numbers (:func:`suite_refusals`)."""


def comparison_get(comparison: Any, key: str, default: Any = None) -> Any:
    """``comparison.<key>`` of a typed comparison, or ``comparison[key]`` of its JSON form;
    ``default`` when absent or None."""
    if isinstance(comparison, dict):
        val = comparison.get(key)
    else:
        val = getattr(comparison, key, None)
    if hasattr(val, "model_dump"):
        val = val.model_dump()
    return default if val is None else val


def _suite_part(comparison: Any, key: str, suite: str) -> dict[str, Any]:
    part = comparison_get(comparison, key, {}) or {}
    mine = part.get(suite) if isinstance(part, dict) else getattr(part, suite, None)
    if hasattr(mine, "model_dump"):
        mine = mine.model_dump()
    return {v: (d.model_dump() if hasattr(d, "model_dump") else d) for v, d in (mine or {}).items()}


def suite_pairs(comparison: Any, suite: str) -> dict[str, dict]:
    """``{variant: pair dict}``: what :meth:`Suite.pair` returned per variant, as the comparison
    holds it (``pairs[suite]``); {} when there is none."""
    return {v: d for v, d in _suite_part(comparison, "pairs", suite).items() if isinstance(d, dict)}


def suite_rows(comparison: Any, suite: str) -> list[dict[str, Any]]:
    """The comparison's metric rows of ``suite``, each as a dict (a typed comparison's rows or its
    JSON form's), in the comparison's order."""
    rows = comparison_get(comparison, "rows", []) or []
    out = [r.model_dump() if hasattr(r, "model_dump") else dict(r) for r in rows]
    return [r for r in out if r.get("suite") == suite]


def suite_refusals(comparison: Any, suite: str) -> dict[str, str]:
    """``{variant: reason}`` where ``suite`` refused to pair (``refusals[suite]``), {} if none."""
    return {v: str(r) for v, r in _suite_part(comparison, "refusals", suite).items() if r}


def read_file(path: Path, reader: Callable[[Path], Any] = read_json) -> tuple[Any, str | None]:
    """A suite reading its own file back for a pair or a report: (what ``reader`` read, None), or
    (None, why not: "<path>: missing" or "<path>: unreadable (<error>)")."""
    path = Path(path)
    if not path.is_file():
        return None, f"{path}: missing"
    try:
        return reader(path), None
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable ({e})"


def read_or(path: Path, default: Any = None, reader: Callable[[Path], Any] = read_json) -> Any:
    """:func:`read_file`'s data, or ``default`` when the file is missing or unreadable."""
    got, why = read_file(path, reader)
    return default if why else got


_REGISTRY: dict[str, type[Suite]] = {}
_INSTANCES: dict[str, Suite] = {}


def register(cls: type[Suite]) -> type[Suite]:
    """Class decorator registering a :class:`Suite` under ``cls.name``; ValueError for a name not
    ``[a-z][a-z0-9_]*`` or already registered by another class."""
    if not cls.name or not re.fullmatch(r"[a-z][a-z0-9_]*", cls.name):
        raise ValueError(
            f"suite class {cls.__qualname__}: name must match [a-z][a-z0-9_]*, got {cls.name!r}"
        )
    prev = _REGISTRY.get(cls.name)
    if prev is not None and prev.__qualname__ != cls.__qualname__:
        raise ValueError(f"suite '{cls.name}' is already registered by {prev.__qualname__}")
    _REGISTRY[cls.name] = cls
    _INSTANCES.pop(cls.name, None)
    return cls


def _load_plugins() -> None:
    for mod in filter(
        None, (m.strip() for m in os.environ.get("PATCHBENCH_SUITE_MODULES", "").split(","))
    ):
        importlib.import_module(mod)
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="patchbench.suites"):
            ep.load()
    except Exception:  # noqa: BLE001 - a broken third-party entry point must not hide built-ins
        pass


def _builtin_names() -> set[str]:
    """The folders of :data:`SUITES_PACKAGE` (its ``__path__``): one folder, one suite."""
    package = importlib.import_module(SUITES_PACKAGE)
    return {m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg}


def suite_names() -> list[str]:
    """Every suite name known: built-ins plus registered plugins, sorted."""
    _load_plugins()
    return sorted(_builtin_names() | set(_REGISTRY))


def get_suite(name: str) -> Suite:
    """The registered suite ``name`` (imported on first use); KeyError naming the allowed suites."""
    if name in _INSTANCES:
        return _INSTANCES[name]
    if name not in _REGISTRY and name in _builtin_names():
        importlib.import_module(f"{SUITES_PACKAGE}.{name}")
    if name not in _REGISTRY:
        _load_plugins()
    if name not in _REGISTRY:
        raise KeyError(f"unknown suite '{name}'; allowed: {', '.join(suite_names())}")
    _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]


def suite_params_model(name: str) -> type[BaseModel]:
    """The suite's ``Params`` pydantic model."""
    return get_suite(name).Params
