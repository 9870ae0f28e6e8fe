"""Nightly gates: is tonight's run a regression, shown not to be one, or undecided?

The config's ``nightly:`` section is :class:`NightlySettings` (docs/nightly.md explains every key
and the error budget). Each gate names a metric and a threshold; for that metric it yields one
test per variant and kind:

- ``same_run`` (variants other than the baseline and its A/A copies): the paired log ratios
  ``log(variant / baseline)`` of tonight's repeats, paired by repeat index (interleaved rounds);
  a one-sided t-test in the metric's bad direction.
- ``history`` (every variant, the baseline included): tonight's per-run log values against the
  last ``window_nights`` recorded nights of the same config, UNPAIRED (those runs were not
  interleaved with tonight's); nights that were themselves off the nights before them, in either
  direction, are left out of the reference (symmetric, so drift does not bias it).
  ``history_test: nights`` (default) compares tonight's mean log value with the K per-night means
  (a prediction t-test with K - 1 degrees of freedom: it counts night-to-night drift as noise);
  ``history_test: welch`` runs Welch's t-test of tonight's runs against every run of the K nights
  (more power, but night-to-night drift makes it fire;
  tools/calibrate_nightly.py measures both).

Only run-level values count: never a request-level interval inside one cell. A test needs at
least ``min_repeats`` runs tonight (``min_repeats`` pairs for same_run); with fewer it is
``ungated`` (one run cannot separate a change from run-to-run noise).

Which step each gate is for: ``same_run`` sees the PATCH getting slower relative to stock (it
cannot see the machine, the driver or sglang slowing every variant alike); ``history`` sees STOCK
(or whatever variant it lists) getting slower from night to night.

Noise (patchbench/nightly/noise.py): each gated metric's run-to-run, paired and night-to-night noise is
learned from every earlier night (MAD-type estimates: a step or a slow decline does not inflate
them); the config's ``run_cv_pct`` is the prior until ``learn_min_nights`` nights exist. With a
noise known, each test rests on it (a t test with the noise's degrees of freedom), and:

- **one abnormal run never decides a gate**: a run (a pair, for same_run) farther than
  ``outlier_k`` (3) noise sigmas from the median of its night is set aside, at most one a night
  (patchbench.nightly.robust.outliers); the reference nights' levels are taken the
  same way;
- **tonight's noise is checked**: the chi-square test of tonight's spread against the noise
  (Bonferroni at ``noise_alpha`` across the night's tests); a night clearly noisier is judged on
  its own spread instead, and is underpowered unless it fails;
- the repeats the targets need (a step of ``detect_pct`` red within ``detect_nights`` nights with
  chance ``detect_power``, patchbench.nightly.robust.repeats_needed) are computed at that noise.

Per night, the one-sided p-values of every test that could be judged form ONE family, Holm-
adjusted at ``alpha`` (default: ``false_red_nights_per_month / 30``): the chance that a night
with no regression turns red is at most ``alpha`` (for valid tests), the error budget. A test's
outcome:

- ``fail``: significant at its Holm level AND the estimated change is worse than
  ``threshold_pct`` (a "regressed" run-level verdict beyond the threshold), and that held on
  ``consecutive_nights`` recorded nights in a row; ``warn`` when it held tonight only;
- ``pass``: the one-sided ``1 - pass_alpha`` bound excludes a change as bad as the threshold
  (tonight is shown not to have regressed by that much);
- ``quiet`` (a noise is known, ``underpowered_on: noise``, the default): no regression shown,
  tonight's noise is within the known noise, and tonight's repeats meet the targets at it: the
  night is green;
- ``underpowered`` (the same): tonight was clearly noisier than the known noise, or even the
  noise's lower 90 % bound needs more repeats than tonight ran (the job exits 5);
- ``inconclusive`` (no noise known, or ``underpowered_on: bound``): neither fail nor pass (the
  job exits 5, never silently green);
- ``ungated`` (too few repeats tonight), ``skipped`` (too few nights in the history: warming
  up), ``missing`` (the run lacks the gate's metric, or its direction is unknown: a config
  error).

The package's modules: ``settings`` (:class:`NightlySettings`, :class:`Gate`), ``results``
(:class:`GateResult`, :func:`night_outcome`), ``checks`` (the tests on log values and the
threshold rules), ``same_run`` and ``history_gate`` (each gate kind's check of one night, the
outlier set-aside included), ``learned`` (the noise check, Holm, the repeats needed and each
test's status), ``evaluation`` (:func:`evaluate`) and ``planning`` (the repeats
``schedule.repeats: auto`` runs: :func:`patchbench.nightly.gates.planning.plan_repeats`, imported from
its module). Every name below is importable from ``patchbench.nightly.gates``.
"""

from patchbench.nightly.gates.checks import (
    TestStat,
    beyond,
    nights_test,
    paired_test,
    shown_not_worse,
    welch_test,
)
from patchbench.nightly.gates.evaluation import evaluate, metric_unit
from patchbench.nightly.gates.results import OUTCOMES as OUTCOMES
from patchbench.nightly.gates.results import UNDERPOWERED, GateResult, night_outcome
from patchbench.nightly.gates.results import Status as Status
from patchbench.nightly.gates.settings import (
    DEFAULT_HISTORY,
    NIGHTS_PER_MONTH,
    Gate,
    NightlySettings,
)

__all__ = [
    "Gate",
    "NightlySettings",
    "GateResult",
    "TestStat",
    "evaluate",
    "paired_test",
    "nights_test",
    "welch_test",
    "beyond",
    "shown_not_worse",
    "night_outcome",
    "metric_unit",
    "UNDERPOWERED",
    "DEFAULT_HISTORY",
    "NIGHTS_PER_MONTH",
]
