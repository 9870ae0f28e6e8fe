"""The config's ``nightly:`` section (docs/nightly.md); the rules it drives:
:mod:`patchbench.nightly.gates`."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_HISTORY = "~/.cache/patchbench/history.sqlite"
NIGHTS_PER_MONTH = 30.0


class Gate(BaseModel):
    """One gate of ``nightly.gates``. Raises pydantic's ValidationError for a bad metric name,
    a threshold outside (0, 1000] or the removed ``require_ci_excludes_zero``."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        description="suite.metric (e.g. serving.itl_median_ms) or a bare metric name; a load "
        "sweep's point or curve metric by its name (serving.output_throughput_tok_s@c16)"
    )
    direction: Literal["higher", "lower"] | None = Field(
        None, description="which way is better; default: compare.json / the suite's metrics"
    )
    threshold_pct: float = Field(gt=0, le=1000, description="smallest bad change that counts, %")
    consecutive_nights: int = Field(1, ge=1, le=60)
    against: Literal["same_run", "history", "both"] = "both"
    variants: list[str] | None = Field(None, description="only these variants (default: all)")
    detect_pct: float | None = Field(
        None, gt=0, le=1000, description="the step the repeats target is for (%)"
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "require_ci_excludes_zero" in data:
            raise ValueError(
                "require_ci_excludes_zero was removed: a gate fails only on a "
                "significant run-level regression (at least min_repeats paired "
                "repeats); delete the key"
            )
        return data

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if not re.fullmatch(r"([A-Za-z0-9_-]+\.)?[A-Za-z0-9_.%/@-]+", v.strip()):
            raise ValueError(
                "write suite.metric (e.g. serving.output_throughput_tok_s) or a metric name"
            )
        return v.strip()

    @property
    def suite(self) -> str | None:
        return self.metric.split(".", 1)[0] if self._has_suite else None

    @property
    def metric_name(self) -> str:
        return self.metric.split(".", 1)[1] if self._has_suite else self.metric

    @property
    def _has_suite(self) -> bool:
        """A "." before any point ("@r2.5" is a point's key, not a suite)."""
        return "." in self.metric.split("@", 1)[0]

    @property
    def step_pct(self) -> float:
        """The step (%) the repeats target: ``detect_pct``, else ``max(5, 5/3 threshold_pct)``."""
        return self.detect_pct or max(5.0, self.threshold_pct * 5.0 / 3.0)

    def kinds(self) -> list[str]:
        return ["same_run", "history"] if self.against == "both" else [self.against]


class ConfirmSettings(BaseModel):
    """``nightly.confirm``: the confirmation run of a red night on a new build
    (:mod:`patchbench.nightly.confirm`). Raises pydantic's ValidationError for ``power`` outside
    (0, 1) or ``min_repeats`` > ``max_repeats``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="false: never run a confirmation")
    alpha: float = Field(0.001, gt=0, lt=0.5, description="level of the confirming paired test")
    repeats: Annotated[int, Field(ge=2, le=100)] | Literal["auto"] = Field(
        "auto", description="interleaved rounds; auto: sized by power, min_repeats, max_repeats"
    )
    power: float = Field(0.9, gt=0, lt=1, description="auto: chance of confirming tonight's change")
    min_repeats: int = Field(3, ge=2, le=100)
    max_repeats: int = Field(12, ge=2, le=100)

    @model_validator(mode="after")
    def _bounds(self) -> ConfirmSettings:
        if self.max_repeats < self.min_repeats:
            raise ValueError(
                f"max_repeats ({self.max_repeats}) is smaller than min_repeats ({self.min_repeats})"
            )
        return self


class NightlySettings(BaseModel):
    """The config's ``nightly:`` section (docs/nightly.md has every key). Raises pydantic's
    ValidationError for a bad value (the config loader names the key, exit 2)."""

    model_config = ConfigDict(extra="forbid")

    history_path: str = Field(DEFAULT_HISTORY, description="SQLite file outside the checkout")
    window_nights: int = Field(7, ge=2, le=365, description="K: nights the history gate uses")
    min_history_nights: int = Field(3, ge=2, le=365)
    lock_timeout_s: float = Field(10.0, gt=0, le=3600)
    min_repeats: int = Field(3, ge=2, le=100, description="runs (pairs) before a gate judges")
    false_red_nights_per_month: float = Field(
        1.0, gt=0, le=30, description="the history gates' budget: false red nights per 30"
    )
    alpha: float | None = Field(
        None, gt=0, lt=1, description="Holm level of the night's history tests"
    )
    pass_alpha: float = Field(0.05, gt=0, lt=0.5, description="history: 'not regressed' level")
    history_test: Literal["nights", "welch"] = "nights"
    history_since: str | None = Field(None, description="ignore nights before this UTC time")
    run_cv_pct: float | None = Field(
        None, gt=0, le=100, description="prior run-to-run CV (%) until the noise is learned"
    )
    underpowered_on: Literal["noise", "bound"] = "noise"
    noise_alpha: float = Field(0.01, gt=0, lt=0.5)
    outlier_k: float = Field(3.0, ge=2, le=100)
    learn_min_nights: int = Field(7, ge=2, le=365)
    detect_nights: int = Field(3, ge=1, le=60)
    detect_power: float = Field(0.9, gt=0, lt=1)
    max_repeats: int = Field(12, ge=2, le=100, description="schedule.repeats: auto at most")
    hold_while_learning: bool = Field(
        True,
        description="while the noise is learned (fewer than learn_min_nights nights), a failing "
        "gate says 'learning' instead of red unless the change is beyond doubt",
    )
    beyond_doubt_pct: float = Field(
        50.0, gt=0, le=1000, description="while learning: red only for a change at least this large"
    )
    beyond_doubt_alpha: float = Field(
        0.001,
        gt=0,
        lt=0.5,
        description="while learning: red only when the test's p is at most this",
    )
    schedule_hours: float = Field(
        24.0,
        gt=0,
        le=24 * 366,
        description="how often the config runs; the page says 'stale' "
        "when its last night is older than 1.5 times this",
    )
    gates: list[Gate] = Field(default_factory=list)
    confirm: ConfirmSettings = Field(default_factory=ConfirmSettings)

    @field_validator("history_since")
    @classmethod
    def _since(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            dt = datetime.fromisoformat(str(v).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{v!r} is not an ISO-8601 time (e.g. 2026-03-01T00:00:00Z)") from None
        dt = dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
        return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    @model_validator(mode="after")
    def _window(self) -> NightlySettings:
        if self.max_repeats < self.min_repeats:
            raise ValueError(
                f"max_repeats ({self.max_repeats}) is smaller than min_repeats ({self.min_repeats})"
            )
        if self.min_history_nights > self.window_nights:
            raise ValueError(
                f"min_history_nights ({self.min_history_nights}) is larger than "
                f"window_nights ({self.window_nights})"
            )
        return self

    @property
    def family_alpha(self) -> float:
        """The history tests' Holm level: ``alpha``, else ``false_red_nights_per_month / 30``."""
        return (
            self.alpha
            if self.alpha is not None
            else self.false_red_nights_per_month / NIGHTS_PER_MONTH
        )
