"""What a night found: per run folder (:class:`NightlyOutcome`), per unit (:class:`UnitNightly`),
per matrix (:class:`MatrixNightlyOutcome`), what a ``nightly.md`` shows (:class:`NightSummary`),
and the exit-code order of a night over several units."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.errors import (
    EXIT_ENV,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_UNDERPOWERED,
    EXIT_USAGE,
)
from patchbench.nightly.gates import GateResult, NightlySettings
from patchbench.nightly.history import Night

EXIT_ORDER: tuple[int, ...] = (
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_ENV,
    EXIT_USAGE,
    EXIT_UNDERPOWERED,
    EXIT_OK,
)
"""Worst first: the exit code of a matrix night is the first of these that any unit has. A
regression in one unit comes before a run failure in another: the units are independent runs, so
one lost node or flaky cell must not turn a night that found a regression into a runner
problem (the summary still lists the failed units). The rest keep the single-config order."""

OUTCOME_OF_EXIT: dict[int, str] = {
    EXIT_REGRESSION: "red",
    EXIT_RUN_FAILED: "run failed",
    EXIT_ENV: "environment not ready",
    EXIT_USAGE: "config error",
    EXIT_UNDERPOWERED: "underpowered",
    EXIT_OK: "green",
}


def worst_exit(codes: Sequence[int]) -> int:
    """The worst of ``codes`` in :data:`EXIT_ORDER` (0 for none); a code not in it counts as 4."""
    known = [c if c in EXIT_ORDER else EXIT_RUN_FAILED for c in codes]
    return min(known, key=EXIT_ORDER.index) if known else EXIT_OK


@dataclass
class NightlyOutcome:
    """What gating one run folder found: exit code, gate results, the night read from the folder,
    the files written, problems, the night outcome (red / underpowered / green, or "failed" when
    the folder could not be read), the headline, the history's state (``history_info``: path,
    recorded, nights_before, error, already_recorded), the trend plots written (relative to the
    run folder), the settings gated with, the noise each gated metric was judged with
    (:func:`patchbench.nightly.job.noise_table`), the change points over the whole history
    (:func:`patchbench.nightly.job.change_points`), what each variant ran (``builds``: rows of
    :class:`patchbench.nightly.builds.BuildRow` as dicts), the release changes named as likely
    causes of a step (``causes``), the variants whose patch could not run (``blocked``, one line
    each) and the confirmation run (``confirmation``: :meth:`patchbench.nightly.confirm.
    Confirmation.to_json`, None when none was due) and the ``schedule.repeats: auto`` choice
    (``repeats``)."""

    exit_code: int
    results: list[GateResult]
    night: Night | None
    summary_path: Path | None = None
    json_path: Path | None = None
    problems: list[str] = field(default_factory=list)
    outcome: str = "green"
    headline: str = ""
    history_info: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    settings: NightlySettings | None = None
    noise: list[dict[str, Any]] = field(default_factory=list)
    change_points: list[dict[str, Any]] = field(default_factory=list)
    builds: list[dict[str, Any]] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    confirmation: dict[str, Any] | None = None
    repeats: dict[str, Any] | None = None


@dataclass
class UnitNightly:
    """One unit of a night (a row of the matrix nightly.md, ``units[]`` of its json).

    ``status``/``run_exit_code``/``message``: the unit's run, from matrix.json; ``exit_code``:
    the unit's nightly exit code (what its own nightly.md says; for a unit that did not run, 4,
    or 3 / 2 when its bench ended so); ``outcome``: red when any gate of the unit failed,
    otherwise the word of ``exit_code`` (:data:`OUTCOME_OF_EXIT`); ``key``: its history key;
    ``failing``: its failing gate results; ``summary``/``report``: paths relative to the matrix
    run folder, None when absent; ``gated``: what gating its run folder found (None when it was
    not gated); ``confirmation``: its confirmation run
    (:meth:`patchbench.nightly.confirm.Confirmation.to_json`; None when the unit was not red)."""

    id: str
    key: str | None
    labels: dict[str, Any]
    gpu_type: str | None
    status: str
    run_exit_code: int | None
    exit_code: int
    outcome: str
    headline: str
    message: str = ""
    failing: list[GateResult] = field(default_factory=list)
    summary: str | None = None
    report: str | None = None
    gated: NightlyOutcome | None = None
    confirmation: dict[str, Any] | None = None

    @property
    def rank_code(self) -> int:
        """The code this unit adds to the matrix's: 1 when a gate failed, else ``exit_code``."""
        return EXIT_REGRESSION if self.outcome == "red" else self.exit_code

    def to_json(self) -> dict[str, Any]:
        """The unit's entry in the matrix nightly.json (``failing``: GateResult.to_json())."""
        return {
            "id": self.id,
            "key": self.key,
            "labels": self.labels,
            "gpu_type": self.gpu_type,
            "status": self.status,
            "run_exit_code": self.run_exit_code,
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "headline": self.headline,
            "message": self.message,
            "failing": [r.to_json() for r in self.failing],
            "summary": self.summary,
            "report": self.report,
            "confirmation": self.confirmation,
        }


@dataclass
class MatrixNightlyOutcome:
    """What :func:`nightly_on_matrix_run` did: the matrix exit code (:func:`worst_exit` over
    the units), its outcome word, headline, every unit, and the files it wrote."""

    exit_code: int
    outcome: str
    headline: str
    matrix_dir: Path
    units: list[UnitNightly]
    summary_path: Path | None = None
    json_path: Path | None = None


@dataclass
class NightSummary:
    """What one ``nightly.md`` shows: the night's ``name`` (config or matrix), ``exit_code`` and
    ``headline``, its ``units``, and ``matrix_dir``: None for a run folder's page (one unit,
    its gates in full), the matrix run folder for a matrix's page (one row per unit)."""

    name: str
    exit_code: int
    headline: str
    units: list[UnitNightly]
    matrix_dir: Path | None = None
