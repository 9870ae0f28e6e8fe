"""The suite contract: what a suite declares and which hooks the core calls (docs/design.md).

A suite is a subclass of :class:`Suite` registered with :func:`register`; the core never names a
suite, it asks :func:`get_suite` and calls the hooks. A built-in suite is one folder
``patchbench/suites/<name>/``, found by that folder and imported on first use; others register on
import from a module named in ``PATCHBENCH_SUITE_MODULES`` (comma-separated) or through the
``patchbench.suites`` entry-point group.
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
    """What a metric means for a comparison.

    better: "higher", "lower", or "none" (descriptive only, never improved/regressed).
    unit: display unit (:data:`UNIT_SUFFIXES`). label: what bench_serving prints, if anything.
    primary: a primary metric (verdicts Holm-adjusted across a variant's primaries, shown in the
    headline); every other metric is secondary (exploratory, raw intervals, folded table).
    kind: "run": paired repeats, t-interval on log ratios; "accuracy": a proportion over items
    paired across cells (the ``pair`` hook's ``accuracy``); "deterministic": the same in every run,
    compared exactly; "descriptive": shown, never judged.
    margin: practical-equivalence margin; for kind "run" in percent of the baseline (5.0 = +-5 %),
    for kind "accuracy" in points of accuracy (2.0 = +-2 points), None: no equivalence verdict.
    Configs may override it per metric (``compare.margins``).
    deterministic_by: kind "deterministic" only: the test (``tests/<file>.py::<name>``) proving
    the value is the same in every run, so one measurement per arm is exact; without it a value
    is exact only when every arm measured it at least twice with no spread.
    """

    better: Literal["higher", "lower", "none"]
    unit: str
    label: str = ""
    primary: bool = False
    kind: Literal["run", "accuracy", "deterministic", "descriptive"] = "run"
    margin: float | None = None
    deterministic_by: str | None = None


@dataclass
class Instrumentation:
    """What a suite's ``instrumentation`` hook asks of the server of a correctness cell.

    env: variables added to the server's environment; hooks: Python files imported in every
    process of the server at interpreter start, before sglang, by the site hook
    (patchbench/shims/site/sitecustomize.py, through the ``PATCHBENCH_SERVER_HOOKS`` variable),
    each as a top-level module named after its file (so the name must be unique, e.g.
    ``patchbench_<suite>_instr.py``); a hook uses only the standard library, torch and
    ``patchbench_import_hook`` (``wrap_on_import(module_name, fn)`` patches a module when it is
    imported), and is switched and configured by ``env``. out_dir: the folder the
    instrumentation writes into (created by the core); perturbs_timing: True for anything that may
    change timing (such cells are never timed cells). ``collect(out_dir) -> dict`` (optional) is
    called once after the server stopped and its result is recorded in ``cell.json`` under
    ``instrumentation[<suite>]``. server_args: extra server arguments the instrumentation needs in
    the correctness cell (e.g. the profiler's ``--disable-overlap-schedule``: torch's profiler
    records CPU ops only of the thread that started it, and the overlap scheduler runs the forward
    pass in a thread that exists before profiling starts); refused if the config already sets the
    same flag differently.
    """

    env: dict[str, str] = field(default_factory=dict)
    hooks: list[Path] = field(default_factory=list)
    out_dir: Path | None = None
    perturbs_timing: bool = True
    collect: Callable[[Path], dict] | None = None
    server_args: list[str] = field(default_factory=list)


@dataclass
class ServerInfo:
    """A ready sglang server as a suite sees it.

    base_url: e.g. "http://127.0.0.1:30000"; model_path: the --model-path given to the server
    (also the tokenizer unless tokenizer_path says otherwise); flush_cache(): POST /flush_cache with
    the config's retry budget, raises SuiteError when it is refused for the whole budget;
    log_path: the server.log of this cell; pid: the server's process-group leader;
    alive(): True while the server process lives; progress: the liveness watch's
    :class:`patchbench.run.activity.ProgressMeter` (None without a watch): a suite that waits for
    replies calls ``progress.expect(n)`` and ``progress.done()`` per reply, so replies that stop
    coming fail the cell after ``server.stall_timeout_s``.
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
    progress: Any = None


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
    command lines, dataset sizes). bounds: {metric: "lower" | "upper"} for values that are only
    a bound of the true value (e.g. a count whose probe was stopped early is at least that
    many); a deterministic comparison then concludes only what the bounds allow.
    """

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
    """Base class of every suite; one instance per process (:func:`get_suite`), no state kept.

    Required: ``name``, ``Params`` (pydantic, ``extra="forbid"``: the config's ``suites.<name>``),
    ``metrics`` ``{name: MetricInfo}`` (each name ends in its unit, :data:`UNIT_SUFFIXES`) and
    :meth:`run`. ``needs_server`` False: runs against the variant's sglang package, no server;
    ``timed`` False: perturbs timing (e.g. a profiler), runs only in the untimed correctness cells.
    The other hooks are optional and do nothing by default.
    """

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
        """The metric declarations of a run with ``params`` (the config's section, validated;
        a raw dict when it does not validate): :attr:`metrics` unless the parameters add
        metrics (e.g. the serving suite's per-point metrics of a load sweep)."""
        return dict(self.metrics)

    def plan_lines(
        self, params: BaseModel, cells_per_round: int = 1, cpu: bool = False
    ) -> list[str]:
        """Lines ``bench --dry-run`` prints under the suite's parameters (e.g. a load sweep's
        points and its estimated GPU time; ``cells_per_round``: the timed cells of a round, one
        per variant; ``cpu``: the servers run on sglang's CPU engine); [] by default."""
        return []

    def instrumentation(self, ctx: SuiteContext, params: BaseModel) -> Instrumentation | None:
        """In-server instrumentation for this suite's correctness cell (None: none)."""
        return None

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: BaseModel
    ) -> dict | None:
        """Paired analysis of the baseline's and one variant's cells of this suite.

        ``baseline_dirs[k]`` and ``variant_dirs[k]`` are this suite's folders in repeat k of each
        (only repeats where both cells are ok; order = repeat index). Returns a JSON-able dict that
        the comparison stores under ``pairs[<suite>][<variant>]`` and that this suite's own
        ``report_section`` / ``plots`` read back; None when the suite has no paired analysis.
        Keys the analysis reads besides the suite's own: ``"accuracy": {metric: {"ids",
        "baseline", "variant"}}`` (per-item correctness in [0, 1] averaged over the repeats, for
        metrics of kind "accuracy"), ``"descriptive": {metric: {"change_pct", "low_pct",
        "high_pct", "method"}}`` (request-level intervals, never a verdict), ``"request_pairing":
        {"ok", "reason"}``. Raise :class:`PairingRefused` when the cells must not be paired (the
        reason is shown in the report instead of numbers)."""
        return None

    def report_section(self, comparison: Any) -> list[str]:
        """Markdown lines for report.md, rendered only from the typed comparison (its
        ``pairs[self.name]``: {variant: what :meth:`pair` returned} and its metric rows)."""
        return []

    def plots(self, comparison: Any, out_dir: Path) -> list[Path]:
        """PNG files written into ``out_dir`` from the typed comparison; returns their paths."""
        return []

    def report_block(self, suite_dir: Path) -> str | None:
        """The PR-style text block of one cell (None: the suite has none)."""
        return None

    def doctor_checks(self, cfg: Any, params: BaseModel) -> list[tuple[str, bool, str]]:
        """(what, ok, detail) lines for ``patchbench doctor CONFIG``."""
        return []


class PairingRefused(RuntimeError):
    """Two cells must not be paired (different prompts, parser, seed, question list ...).

    The comparison stores ``str(exc)`` under ``refusals[<suite>][<variant>]`` instead of a pair
    dict, and the suite's ``report_section`` shows that reason instead of numbers (see
    :func:`suite_refusals`)."""


def comparison_get(comparison: Any, key: str, default: Any = None) -> Any:
    """``comparison.<key>`` of a typed comparison (a pydantic model or any object), or
    ``comparison[key]`` of its JSON form (a dict, e.g. compare.json read back); ``default`` when
    absent or None. Hooks use it so they render the same from either form."""
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


def suite_refusals(comparison: Any, suite: str) -> dict[str, str]:
    """``{variant: reason}`` where ``suite`` refused to pair (``refusals[suite]``), {} if none."""
    return {v: str(r) for v, r in _suite_part(comparison, "refusals", suite).items() if r}


_REGISTRY: dict[str, type[Suite]] = {}
_INSTANCES: dict[str, Suite] = {}


def register(cls: type[Suite]) -> type[Suite]:
    """Class decorator: register a :class:`Suite` subclass under ``cls.name``.

    Raises ValueError for an empty name, a name without the form ``[a-z][a-z0-9_]*``, or a name
    already registered by another class.
    """
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
    """The folders under patchbench/suites/: one folder, one suite."""
    import patchbench.suites

    return {m.name for m in pkgutil.iter_modules(patchbench.suites.__path__) if m.ispkg}


def suite_names() -> list[str]:
    """Every suite name known: built-ins plus registered plugins, sorted."""
    _load_plugins()
    return sorted(_builtin_names() | set(_REGISTRY))


def get_suite(name: str) -> Suite:
    """The registered suite ``name`` (imported on first use).

    Raises KeyError naming the allowed suites when ``name`` is unknown.
    """
    if name in _INSTANCES:
        return _INSTANCES[name]
    if name not in _REGISTRY and name in _builtin_names():
        importlib.import_module(f"patchbench.suites.{name}")
    if name not in _REGISTRY:
        _load_plugins()
    if name not in _REGISTRY:
        raise KeyError(f"unknown suite '{name}'; allowed: {', '.join(suite_names())}")
    _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]


def suite_params_model(name: str) -> type[BaseModel]:
    """The suite's ``Params`` pydantic model."""
    return get_suite(name).Params
