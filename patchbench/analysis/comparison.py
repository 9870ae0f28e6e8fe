"""The typed comparison of one run (``RUN/compare.json``); its settings are the config's
``compare:`` section (:class:`patchbench.config.CompareSettings`).

Built by :mod:`patchbench.analysis.build`; :mod:`patchbench.report`, :mod:`patchbench.report.plots`, the
console summary and the nightly gates render or judge only from it. Units: every change, interval
and margin of a row is in the row's ``change_unit``: "%" (relative change of a run-level metric,
+5.0 = 5 % higher), "pt" (accuracy points, +1.0 = one point of accuracy) or the metric's own unit
(deterministic metrics: exact difference).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from patchbench import records
from patchbench.config.schema import CompareSettings
from patchbench.runfolder import RunFolderError, SchemaTooNew, why_invalid

COMPARISON_SCHEMA = 2


class Row(BaseModel):
    """One (suite, metric, variant) comparison.

    baseline_repeats / variant_repeats: the metric per repeat (None where the cell is not ok);
    baseline_value / variant_value: the values shown, from the estimator of the change: run rows
    the geometric mean of each arm over the paired repeats (their ratio is 1 + change / 100),
    accuracy the mean correctness over the paired questions, other rows (and run rows without
    a paired repeat or with a value <= 0) the median over repeats;
    paired_repeats: the repeat numbers k whose (baseline, variant) pair fed the row's test;
    log_ratio_sd: sample standard deviation (n - 1) of the paired log ratios (run rows with at
    least 2 pairs; natural-log units, 0.05 ~ 5 %);
    outlier_repeats: paired repeats whose log ratio is an outlier by
    :data:`patchbench.analysis.build.OUTLIER_RULE` (descriptive; never changes a verdict);
    change / low / high: the change and its interval at ``confidence`` (the level the verdict
    used: Holm-adjusted for primaries) in ``change_unit``; p_value: two-sided p of "no change";
    margin: practical-equivalence margin in ``change_unit`` (None: no equivalence verdict);
    within_margin: the interval lies inside +-margin (a significant change may still be within);
    descriptive: request-level interval inside one cell from the suite's pair hook
    ({"change_pct", "low_pct", "high_pct", "method"}), never a verdict.
    baseline_bound / variant_bound: "lower" / "upper" when that arm's value is only a bound of
    the true value (the suite said so; deterministic rows), None when exact.
    exact_by: a deterministic row shown exact: "repeats" (every arm measured at least twice, no
    spread) or the test the suite names (``MetricInfo.deterministic_by``); None: not shown exact
    (one measurement in an arm).
    decided_after: a sequential design's primaries: the rounds after which its rule decided
    (None: not decided by the rule, or a fixed design).
    """

    model_config = ConfigDict(extra="forbid")

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

    def short_label(self) -> str:
        """The label without its parenthetical or trailing qualifier (the metric name without a
        label): "Output token throughput (tok/s)" -> "Output token throughput", "host syncs per
        call (device-to-host reads + ...), summed over batch sizes" -> "host syncs per call"."""
        name = (self.label or self.metric).rstrip(":").strip()
        return re.split(r" \(|, ", name, maxsplit=1)[0].strip() or name


class DesignSummary(BaseModel):
    """How the primaries were decided (:func:`patchbench.analysis.family.primary_family` and the design).

    kind: "fixed" (every planned round, Holm over the family) or "sequential" (the
    group-sequential rule of :mod:`patchbench.analysis.sequential`, replayed on the rounds on disk);
    alpha: two-sided error per report; family: the primaries it covers (every primary of every
    non-A/A variant tested with a sampling error; incomplete ones included); split: how alpha is
    shared over them, in words. Sequential: looks (rounds), boundary, stopped_after (the rounds
    after which the rule stopped; None: it had not), stop_reason. rounds: the complete rounds
    the rule used; planned: the rounds the config plans (fixed) or its maximum (sequential).
    partial: why the run gives no decisive verdict (None: it is finished); resume: the command
    that continues it.
    """

    model_config = ConfigDict(extra="forbid")

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


class AANoise(BaseModel):
    """The run-to-run noise an A/A variant measured on one run-level primary: ``cv_pct`` the
    coefficient of variation of one run (percent: the sd of the paired log ratios over sqrt 2),
    ``low_pct`` / ``high_pct`` its 95 % chi-square interval, ``n`` the pairs, ``assumed_pct`` the
    config's ``compare.assumed_cv`` for the metric (None: not stated)."""

    model_config = ConfigDict(extra="forbid")

    variant: str
    suite: str
    metric: str
    label: str = ""
    n: int = 0
    cv_pct: float | None = None
    low_pct: float | None = None
    high_pct: float | None = None
    assumed_pct: float | None = None


class Drift(BaseModel):
    """A trend of the baseline arm's values across rounds for one run-level primary (the log
    value on the round index, least-squares slope with its t test at ``alpha``):
    ``slope_pct`` the change per round in percent (``100 (exp(slope) - 1)``), ``low_pct`` /
    ``high_pct`` its 95 % interval, ``p`` the two-sided p-value, ``n`` the rounds, ``found``
    p < alpha."""

    model_config = ConfigDict(extra="forbid")

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


class Health(BaseModel):
    """The A/A variants as a measurement: ``noise`` per A/A primary; ``ok`` False when an A/A
    primary came out improved or regressed (which happens by chance in about alpha of healthy
    runs); no verdict is ever changed by it (``notes`` say what was seen)."""

    model_config = ConfigDict(extra="forbid")

    ok: bool = True
    aa_variants: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    noise: list[AANoise] = Field(default_factory=list)


class Comparison(BaseModel):
    """``RUN/compare.json``: every variant of one run against its baseline.

    rows: see :class:`Row`; pairs: {suite: {variant: what the suite's pair hook returned}};
    refusals: {suite: {variant: reason}} where a suite refused to pair (the report shows the
    reason instead of numbers); cells: [{"variant", "repeat", "status", "error", "suites",
    "cell_kind", "instrumented"}] (the timed cells); schedule: [{"variant", "repeat",
    "position", "status"}] (the timed cells in the order they ran); cell_warnings: {suite:
    {variant: ["rep<k>: line"]}}; methods: the methods used with their sources;
    correctness_cells: [{"variant", "dir", "status", "error", "suites", "instrumented",
    "instrumentation"}] (the untimed correctness cells that ran); suite_rounds: {suite: the
    timed rounds it ran in, or "correctness" for a suite that runs only in correctness cells};
    design: :class:`DesignSummary` (the rule that decided the primaries, and whether the run is
    finished); drift: :class:`Drift` per run-level primary (the baseline's trend across rounds);
    order / unbalanced_reason: the schedule's order of a round and, when it is the unbalanced
    "sequential", the config's reason.
    """

    model_config = ConfigDict(extra="forbid")

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
    """Read ``compare.json`` (``path``: the run folder or the file).

    Raises SchemaTooNew for a newer schema, RunFolderError for a missing / unreadable file, one
    that does not have the shape of :class:`Comparison` (every key declared), or a compare.json
    of schema 1 (written before the typed comparison; re-run ``patchbench report`` to rebuild it
    from the run folder)."""
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
