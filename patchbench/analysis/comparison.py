"""The typed comparison of one run (``RUN/compare.json``), built by :mod:`patchbench.analysis.build`.
A row's change, interval and margin are in its ``change_unit``: "%", "pt" (accuracy points) or
the metric's own unit (deterministic rows)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from patchbench import records
from patchbench.config.schema import CompareSettings, changes_text, commit_name
from patchbench.runfolder import RunFolderError, SchemaTooNew, why_invalid
from patchbench.runfolder.models import PatchHash

COMPARISON_SCHEMA = 2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Row(_Model):
    """One (suite, metric, variant) comparison (its keys: docs/CONTRACTS.md, compare.json)."""

    suite: str
    metric: str
    variant: str
    label: str = ""
    unit: str = ""
    better: Literal["higher", "lower", "none"] = "none"
    kind: Literal["run", "accuracy", "deterministic", "descriptive"] = "run"
    primary: bool = False
    aa: bool = False
    baseline_repeats: list[float | None] = Field(default_factory=list)
    variant_repeats: list[float | None] = Field(default_factory=list)
    baseline_value: float | None = None
    variant_value: float | None = None
    baseline_bound: Literal["lower", "upper"] | None = None
    variant_bound: Literal["lower", "upper"] | None = None
    n_pairs: int = 0
    paired_repeats: list[int] = Field(default_factory=list)
    log_ratio_sd: float | None = None
    outlier_repeats: list[int] = Field(default_factory=list)
    change: float | None = None
    low: float | None = None
    high: float | None = None
    change_unit: str = "%"
    confidence: float | None = None
    p_value: float | None = None
    method: str | None = None
    margin: float | None = None
    within_margin: bool = False
    verdict: Literal["improved", "regressed", "equivalent", "inconclusive", "incomplete"] = (
        "inconclusive"
    )
    verdict_before_health: str | None = None
    decided_after: int | None = None
    exact_by: str | None = None
    descriptive: dict[str, Any] | None = None
    notes: list[str] = Field(default_factory=list)
    #: why the row may never decide (e.g. accuracy in one run per arm, with the rounds that
    #: would: patchbench.analysis.verdicts.accuracy_rule); written only when set
    undecided: str | None = None

    @model_serializer(mode="wrap")
    def _undecided_when_set(self, handler):
        out = handler(self)
        if self.undecided is None:
            out.pop("undecided", None)
        return out

    def name(self) -> str:
        """The label (else the metric) without its trailing colon."""
        return (self.label or self.metric).rstrip(":").strip()

    def short_label(self) -> str:
        """:meth:`name` without "(...)" or ", ..." at its end."""
        name = self.name()
        return re.split(r" \(|, ", name, maxsplit=1)[0].strip() or name


class DesignSummary(_Model):
    """How the primaries were decided ("fixed": Holm, or "sequential"), ``alpha`` two-sided over
    ``family`` primaries; ``partial``: why no verdict is decisive, ``resume``: how on."""

    kind: Literal["fixed", "sequential"] = "fixed"
    alpha: float = 0.05
    family: int = 0
    split: str = ""
    looks: list[int] = Field(default_factory=list)
    boundary: str | None = None
    stopped_after: int | None = None
    stop_reason: str = ""
    rounds: int = 0
    planned: int | None = None
    partial: str | None = None
    resume: str | None = None
    #: the deciding primaries (``suite.metric``) of ``schedule.repeats.decide_on``; [] every one
    decide_on: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _decide_on_when_set(self, handler):
        out = handler(self)
        if not self.decide_on:  # written only when the config names them: goldens unchanged
            out.pop("decide_on", None)
        return out


class AANoise(_Model):
    """An A/A variant's run-to-run CV on one run-level primary (sd of the paired log ratios over
    sqrt 2, percent, 95 % chi-square interval) beside ``compare.assumed_cv``."""

    variant: str
    suite: str
    metric: str
    label: str = ""
    n: int = 0
    cv_pct: float | None = None
    low_pct: float | None = None
    high_pct: float | None = None
    assumed_pct: float | None = None


class Drift(_Model):
    """The baseline's trend across rounds on one run-level primary: ``slope_pct`` per round with
    its 95 % interval; ``found`` = p < ``alpha``."""

    suite: str
    metric: str
    label: str = ""
    n: int = 0
    slope_pct: float = 0.0
    low_pct: float = 0.0
    high_pct: float = 0.0
    p: float = 1.0
    alpha: float = 0.01
    found: bool = False


class Health(_Model):
    """The A/A variants as a measurement; ``ok`` False when an A/A primary came out improved or
    regressed."""

    ok: bool = True
    aa_variants: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    noise: list[AANoise] = Field(default_factory=list)


class FileNames(_Model):
    """``count`` paths, ``files`` the first few of them (patchbench.config.CHANGES_SHOWN)."""

    count: int = 0
    files: list[str] = Field(default_factory=list)


class ChangedFiles(_Model):
    """The paths a git build changes against the baseline's commit ``base`` (``files``: the first
    CHANGES_SHOWN; ``uncompiled`` written only when set; docs/CONTRACTS.md)."""

    base: str = ""
    count: int = 0
    files: list[str] = Field(default_factory=list)
    outside: int = 0
    uncompiled: FileNames | None = None

    @model_serializer(mode="wrap")
    def _uncompiled_when_set(self, handler):
        out = handler(self)
        if self.uncompiled is None:
            out.pop("uncompiled", None)
        return out

    def describe(self) -> str:
        """``2 files: a.py, b.py (1 outside python/sglang/, not run)``, ``and N more`` past the
        files named (patchbench.config.changes_text)."""
        return changes_text(self.count, self.files, self.outside)


class BuildInfo(_Model):
    """A variant's resolved build as the manifest's ``builds`` entry records it (docs/CONTRACTS.md;
    ``uncommitted`` written only when set)."""

    kind: Literal["release", "git", "wheel"] = "release"
    version: str | None = None
    release: str | None = None
    commit: str | None = None
    subject: str | None = None
    changes: ChangedFiles | None = None
    uncommitted: FileNames | None = None

    @model_serializer(mode="wrap")
    def _uncommitted_when_set(self, handler):
        out = handler(self)
        if self.uncommitted is None:
            out.pop("uncommitted", None)
        return out

    def name(self) -> str | None:
        """A git build's ``8af4974fdfbe "its subject"`` (patchbench.config.commit_name); None
        for a release or a wheel."""
        return (
            commit_name(self.commit, self.subject) if self.kind == "git" and self.commit else None
        )


class VariantInfo(_Model):
    """What a variant ran (``build``: None for the config's release; ``from_source``: a checkout
    or wheel; ``built``: the manifest's ``builds`` entry, None without one, then not written)."""

    patches: list[PatchHash] = Field(default_factory=list)
    server_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    build: str | None = None
    from_source: bool = False
    built: BuildInfo | None = None

    @model_serializer(mode="wrap")
    def _built_when_set(self, handler):
        out = handler(self)
        if self.built is None:
            out.pop("built", None)
        return out


class CellLoad(_Model):
    """The host's 1-minute load average (runnable processes) as one timed cell's first suite
    started and as its last ended (None: not recorded)."""

    variant: str
    repeat: int
    start: float | None = None
    end: float | None = None


class HostLoad(_Model):
    """The host a run measured on and how busy it was (patchbench.analysis.hostload;
    docs/CONTRACTS.md, ``run.host``); ``gpu_warnings``: how the timed cells' GPUs differ
    (patchbench.analysis.health.gpu_warnings; written only when there is one)."""

    cpu_count: int | None = None
    cpu_usable: int | None = None
    memory_total_gib: float | None = None
    cells: list[CellLoad] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    gpu_warnings: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _gpu_warnings_when_set(self, handler):
        out = handler(self)
        if not self.gpu_warnings:
            out.pop("gpu_warnings", None)
        return out

    def cores(self) -> int | None:
        """The CPUs the run could use (``cpu_usable``, else ``cpu_count``)."""
        return self.cpu_usable or self.cpu_count

    def readings(self, variant: str | None = None) -> list[float]:
        """Every recorded load (start and end) of the timed cells of ``variant`` (None: all)."""
        return [
            x
            for c in self.cells
            if variant is None or c.variant == variant
            for x in (c.start, c.end)
            if x is not None
        ]


class ServerFingerprints(_Model):
    """The arms' server fingerprints (patchbench.analysis.fingerprints; docs/CONTRACTS.md,
    ``server``): {suite: {variant: mean hit share 0-1}}, {suite: {variant: {counter: mean
    increase per suite}}}, {variant: /server_info keys}; ``warnings`` for the answer,
    ``differences`` for report-details.md."""

    hit_share: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    counters: dict[str, dict[str, dict[str, float]]] = Field(default_factory=dict)
    config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    differences: list[str] = Field(default_factory=list)


class RunInfo(_Model):
    """The run as the report's header shows it (from the manifest; ``host`` None in a
    compare.json from before it was recorded)."""

    name: str = ""
    model: str = "?"
    tiny: bool = False
    sglang: str = "?"
    gpu: str | None = None
    commit: str = "?"
    started_at: str | None = None
    ended_at: str | None = None
    variants: dict[str, VariantInfo] = Field(default_factory=dict)
    host: HostLoad | None = None


class FailedCell(_Model):
    """A cell that failed, ended incomplete or was interrupted (``cell``: "variant/rep1")."""

    cell: str
    status: str
    reason: str


class Affected(_Model):
    """A primary of ``variant`` that failed ``cells`` affect (``no_value``: it has no row)."""

    variant: str
    suite: str
    metric: str
    cells: list[str] = Field(default_factory=list)
    no_value: bool = False


class Comparison(_Model):
    """``RUN/compare.json``: every variant of one run against its baseline (its keys:
    docs/CONTRACTS.md)."""

    schema_version: int = COMPARISON_SCHEMA
    run_id: str = ""
    baseline: str = ""
    variants: list[str] = Field(default_factory=list)
    aa_variants: list[str] = Field(default_factory=list)
    repeats: int = 0
    suites: list[str] = Field(default_factory=list)
    settings: CompareSettings = Field(default_factory=CompareSettings)
    rows: list[Row] = Field(default_factory=list)
    pairs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    refusals: dict[str, dict[str, str]] = Field(default_factory=dict)
    health: Health = Field(default_factory=Health)
    design: DesignSummary = Field(default_factory=DesignSummary)
    drift: list[Drift] = Field(default_factory=list)
    order: str = "interleaved"
    unbalanced_reason: str | None = None
    cells: list[dict[str, Any]] = Field(default_factory=list)
    schedule: list[dict[str, Any]] = Field(default_factory=list)
    cell_warnings: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    methods: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    correctness_cells: list[dict[str, Any]] = Field(default_factory=list)
    suite_rounds: dict[str, list[int] | str] = Field(default_factory=dict)
    run: RunInfo = Field(default_factory=RunInfo)
    failed_cells: list[FailedCell] = Field(default_factory=list)
    affected: list[Affected] = Field(default_factory=list)
    #: None (and absent from the file) when no cell recorded the server's /metrics
    server: ServerFingerprints | None = None

    @model_serializer(mode="wrap")
    def _server_when_set(self, handler):
        out = handler(self)
        if out.get("server") is None:
            out.pop("server", None)
        return out

    def rows_for(
        self, variant: str | None = None, *, primary: bool | None = None, suite: str | None = None
    ) -> list[Row]:
        """Rows filtered by variant, primary flag and suite (None: any)."""
        return [
            r
            for r in self.rows
            if (variant is None or r.variant == variant)
            and (primary is None or r.primary == primary)
            and (suite is None or r.suite == suite)
        ]

    def row(self, suite: str, metric: str, variant: str) -> Row | None:
        """The row of (suite, metric, variant), or None."""
        return next(
            (r for r in self.rows if (r.suite, r.metric, r.variant) == (suite, metric, variant)),
            None,
        )


def write_comparison(run_dir: str | os.PathLike, cmp: Comparison) -> Path:
    """Write ``RUN/compare.json`` atomically; returns its path."""
    return records.write_json(Path(run_dir) / "compare.json", cmp.model_dump(mode="json"))


def read_comparison(path: str | os.PathLike) -> Comparison:
    """Read ``compare.json`` (the run folder or the file). Raises SchemaTooNew, or RunFolderError
    for a missing, unreadable or mis-shaped file or schema 1."""
    p = Path(path)
    p = p / "compare.json" if p.is_dir() else p
    try:
        raw = records.read_json(p)
    except (OSError, ValueError) as e:
        raise RunFolderError(f"{p}: {e}") from None
    if not isinstance(raw, dict):
        raise RunFolderError(f"{p}: expected a JSON object")
    v = int(raw.get("schema_version", raw.get("schema", 1)) or 1)
    if v > COMPARISON_SCHEMA:
        raise SchemaTooNew(p, v, COMPARISON_SCHEMA)
    if v < COMPARISON_SCHEMA:
        raise RunFolderError(
            f"{p}: schema version {v} (before the typed comparison); rebuild it "
            "from the run folder with `patchbench report RUN_DIR`"
        )
    try:
        return Comparison.model_validate(raw)
    except ValidationError as e:
        raise RunFolderError(f"{p}: {why_invalid(e)}") from None
