"""What the gates yield: one :class:`GateResult` per test, and the night's outcome
(:func:`night_outcome`; the statuses are explained in patchbench/nightly/gates/__init__.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal[
    "fail", "warn", "pass", "quiet", "inconclusive", "underpowered", "ungated", "skipped", "missing"
]


@dataclass
class GateResult:
    """The outcome of one gate test for one (kind, variant, suite, metric).

    status: see patchbench/nightly/gates/__init__.py's docstring. value: tonight's median of the variant (metric unit);
    reference: the baseline's median tonight (same_run) or the median of the window's nightly
    medians (history). change_pct: the estimated change, percent, from the mean log value
    (``100 * (exp(mean log ratio) - 1)``). bound_pct: the one-sided ``1 - pass_alpha`` bound of
    the change in the bad direction (the worst change tonight's data allows). p_value: one-sided
    in the bad direction; level: its Holm level tonight (None when not judged); n: runs tonight
    (pairs for same_run); n_history: nights in the window.

    Noise (patchbench/nightly/noise.py): noise_source "learned" / "prior" (None: unknown, the test used
    tonight's own spread); noise_cv_pct: the noise the test assumed, as a CV in % (one paired
    ratio for same_run, one run for history); tonight_cv_pct: tonight's own spread the same way;
    noise_p: the chi-square p-value of "tonight is no noisier"; set_aside: runs (pairs) the
    outlier rule left out; repeats_needed: the repeats the targets need at that noise (None: no
    affordable number does).
    """

    gate: str
    kind: Literal["same_run", "history"]
    variant: str
    suite: str
    metric: str
    status: Status
    reason: str
    unit: str = ""
    better: str | None = None
    threshold_pct: float | None = None
    value: float | None = None
    reference: float | None = None
    change_pct: float | None = None
    bound_pct: float | None = None
    p_value: float | None = None
    level: float | None = None
    test: str | None = None
    n: int = 0
    n_history: int = 0
    window_run_ids: list[str] = field(default_factory=list)
    nights_held: int = 0
    nights_needed: int = 1
    noise_source: str | None = None
    noise_cv_pct: float | None = None
    tonight_cv_pct: float | None = None
    noise_p: float | None = None
    set_aside: int = 0
    repeats_needed: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: statuses that make a night underpowered (exit 5)
UNDERPOWERED = ("inconclusive", "underpowered", "ungated")

#: night outcomes, worst first (the exit code follows the first that applies)
OUTCOMES = ("red", "underpowered", "green")


def night_outcome(results: Sequence[GateResult]) -> str:
    """ "red" (a gate failed), "underpowered" (nothing failed but a test is inconclusive,
    underpowered or ungated: the night could not show that nothing regressed), or "green"."""
    if any(r.status == "fail" for r in results):
        return "red"
    if any(r.status in UNDERPOWERED for r in results):
        return "underpowered"
    return "green"
