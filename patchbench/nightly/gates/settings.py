"""The config's ``nightly:`` section: :class:`NightlySettings` and its :class:`Gate` list
(docs/nightly.md explains every key; patchbench/nightly/gates/__init__.py the rules they set).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_HISTORY = "~/.cache/patchbench/history.sqlite"
NIGHTS_PER_MONTH = 30.0


class Gate(BaseModel):
    """One gate of the ``nightly.gates`` list (docs/nightly.md)."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        description="suite.metric (e.g. serving.itl_median_ms) or a bare metric name; a load "
        "sweep's point or curve metric by its name (serving.output_throughput_tok_s@c16, "
        "serving.goodput_at_slo_req_s)"
    )
    direction: Literal["higher", "lower"] | None = Field(
        None, description="which way is better; default: compare.json / the suite's metrics"
    )
    threshold_pct: float = Field(gt=0, le=1000, description="smallest bad change that counts, %")
    consecutive_nights: int = Field(1, ge=1, le=60)
    against: Literal["same_run", "history", "both"] = "both"
    variants: list[str] | None = Field(None, description="only these variants (default: all)")
    detect_pct: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="the step the repeats target is for (%); default max(5, 5/3 threshold_pct)",
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
        """The step (%) the repeats target is for: ``detect_pct``, else
        ``max(5, 5/3 threshold_pct)`` (a 3 % threshold is for a 5 % step)."""
        return self.detect_pct or max(5.0, self.threshold_pct * 5.0 / 3.0)


class ConfirmSettings(BaseModel):
    """``nightly.confirm``: the confirmation run (docs/nightly.md, "Confirmation run"): when a
    night is red and its sglang release or patch state differs from the last green night's, last
    green's build and tonight's run interleaved in one run, ``repeats`` rounds (a number, or
    ``auto``: sized by ``power``, ``min_repeats``, ``max_repeats``), judged at ``alpha``.
    Raises pydantic's ValidationError (a ConfigError when loaded) for ``power`` outside (0, 1) or
    ``min_repeats`` > ``max_repeats``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="false: never run a confirmation")
    alpha: float = Field(
        0.001, gt=0, lt=0.5, description="level of the paired test that confirms a regression"
    )
    repeats: Annotated[int, Field(ge=2, le=100)] | Literal["auto"] = Field(
        "auto",
        description="interleaved rounds of the two builds; auto: the rounds that confirm "
        "tonight's observed change at alpha with power, given the learned paired noise "
        "(patchbench/nightly/confirm.py, plan_rounds), at least min_repeats, at most max_repeats",
    )
    power: float = Field(
        0.9, gt=0, lt=1, description="repeats: auto: chance of confirming tonight's change"
    )
    min_repeats: int = Field(3, ge=2, le=100, description="repeats: auto: at least this many")
    max_repeats: int = Field(12, ge=2, le=100, description="repeats: auto: at most this many")

    @model_validator(mode="after")
    def _bounds(self) -> ConfirmSettings:
        if self.max_repeats < self.min_repeats:
            raise ValueError(
                f"max_repeats ({self.max_repeats}) is smaller than min_repeats ({self.min_repeats})"
            )
        return self


class NightlySettings(BaseModel):
    """The config's ``nightly:`` section (docs/nightly.md has every key)."""

    model_config = ConfigDict(extra="forbid")

    history_path: str = Field(DEFAULT_HISTORY, description="SQLite file outside the checkout")
    window_nights: int = Field(7, ge=2, le=365, description="K: nights the history gate uses")
    min_history_nights: int = Field(3, ge=2, le=365)
    lock_timeout_s: float = Field(10.0, gt=0, le=3600)
    min_repeats: int = Field(
        3, ge=2, le=100, description="runs (pairs) per variant tonight before a gate judges"
    )
    false_red_nights_per_month: float = Field(
        1.0, gt=0, le=30, description="error budget: false red nights per 30 nights"
    )
    alpha: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="per-night family level (Holm across every gate test); "
        "default false_red_nights_per_month / 30",
    )
    pass_alpha: float = Field(
        0.05, gt=0, lt=0.5, description="one-sided level of the 'not regressed' claim"
    )
    history_test: Literal["nights", "welch"] = "nights"
    history_since: str | None = Field(
        None,
        description="ignore nights before this UTC time (ISO-8601, e.g. "
        "2026-03-01T00:00:00Z): accepts a new level after a known change",
    )
    run_cv_pct: float | None = Field(
        None,
        gt=0,
        le=100,
        description="run-to-run CV (%) from an A/A run: the prior noise, used until the history "
        "holds learn_min_nights nights (patchbench/nightly/noise.py)",
    )
    underpowered_on: Literal["noise", "bound"] = Field(
        "noise",
        description="noise: a night is underpowered only when its noise is clearly worse than "
        "the learned (or prior) noise, or that noise needs more repeats than it ran; bound: "
        "whenever a test's bound cannot exclude the threshold (also the rule while no noise "
        "is known)",
    )
    noise_alpha: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description="level of 'tonight is noisier than learned' (chi-square, Bonferroni "
        "across the night's tests)",
    )
    outlier_k: float = Field(
        3.0,
        ge=2,
        le=100,
        description="a run farther than k learned sigmas from its night's "
        "median is set aside (at most one a night)",
    )
    learn_min_nights: int = Field(
        7,
        ge=2,
        le=365,
        description="nights with 2+ runs before the learned noise replaces run_cv_pct",
    )
    detect_nights: int = Field(
        3,
        ge=1,
        le=60,
        description="target: a step of a gate's detect_pct turns a night red "
        "within this many nights ...",
    )
    detect_power: float = Field(0.9, gt=0, lt=1, description="... with this chance")
    max_repeats: int = Field(
        12,
        ge=2,
        le=100,
        description="schedule.repeats: auto runs the repeats the targets need at the learned "
        "noise (prior: run_cv_pct), at least min_repeats and at most this many",
    )
    gates: list[Gate] = Field(default_factory=list)
    confirm: ConfirmSettings = Field(default_factory=ConfirmSettings)

    @field_validator("history_since")
    @classmethod
    def _since(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from datetime import datetime, timezone

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
        """Per-night Holm level: ``alpha``, else ``false_red_nights_per_month / 30``."""
        return (
            self.alpha
            if self.alpha is not None
            else self.false_red_nights_per_month / NIGHTS_PER_MONTH
        )
