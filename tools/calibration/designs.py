"""The calibration's rows and designs: what one invocation of tools/calibrate.py counts.

- CV rows (run CV x repeats): both scenarios (``null``: no variant changes anything;
  ``effect``: ``patch-a`` makes every time 10 % shorter and removes its host syncs) at each
  ``--cvs`` and ``--repeats``, and at ``--target-cv`` with the config's repeats;
- the repeat search (:func:`cv_rows`): when the config's repeats miss the power target at
  ``--target-cv``, the next repeat counts are screened with ``--screen-trials`` +10 % trials
  each; a count whose screen is not clearly below the target (upper 95 % Wilson bound >= target)
  gets a full row, until one meets the target;
- the design table at ``--target-cv`` (:func:`design_rows`): fixed 5, the config's and
  ``--design-repeats`` repeats, and the ``--sequential`` designs (and the config's, when it ships
  one), with their H200 cost (:class:`Cost`). With MMMU in the first round only (``--mmmu-rounds
  first``, the config's ``suites.mmmu.rounds`` by default) every row but the reference "fixed 5,
  every suite in every cell" runs MMMU in round 0 only and judges it on repeat 0, as the
  runner's analysis judges such a run. A sequential row runs the runner's own stopping rule
  (:mod:`tools.calibration.stopping`) on trials drawn with ``max`` repeats (the same trials
  as the fixed row of that many), keeps the rounds that ran, and judges them with the comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from patchbench.analysis.comparison import CompareSettings
from patchbench.stats import wilson_interval
from tools.calibration.model import Model
from tools.calibration.stopping import SeqSpec, sequential_plan
from tools.calibration.trials import Counts, run_row


def config_schedule(path: Path) -> tuple[int, int]:
    """(MMMU runs in the first N rounds only: N, 0 for every round; number of untimed correctness
    cells) of a config, read
    as the runner reads it (patchbench.config.load_config: ``suites.mmmu.rounds`` resolved by
    ``Config.rounds_of``; the cells of ``patchbench.run.bench.plan``: one correctness cell per
    variant when a suite is instrumented or untimed, else none). Raises ConfigError."""
    from patchbench.config import load_config
    from patchbench.run import bench

    cfg = load_config(path)
    got, every = cfg.rounds_of("mmmu"), cfg.schedule.max_repeats
    first = len(got) if got == list(range(len(got))) and len(got) < every else 0
    return first, sum(c.kind != "timed" for c in bench.plan(cfg))


def mmmu_label(first: int) -> str:
    """ ", MMMU in the first round only" / ", MMMU in the first N rounds" / "" (every round)."""
    if not first:
        return ""
    return ", MMMU in the first round only" if first == 1 else f", MMMU in the first {first} rounds"


def config_repeats(path: Path) -> tuple[int | None, SeqSpec | None, CompareSettings]:
    """(fixed schedule.repeats or None, the sequential schedule or None, compare settings) of a
    config file (a plain YAML read; patchbench.config validates it when the plan is built)."""
    import yaml

    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    reps = (raw.get("schedule") or {}).get("repeats") or 1
    settings = CompareSettings.model_validate(raw.get("compare") or {})
    if isinstance(reps, dict):
        spec = SeqSpec(
            int(reps["min"]),
            int(reps["max"]),
            int(reps.get("step", 2)),
            str(reps.get("boundary", "pocock")),
            futility=float(reps["futility"]) if "futility" in reps else None,
        )
        return None, spec, settings
    return int(reps), None, settings


@dataclass(frozen=True)
class Cost:
    """H200 seconds of one report: ``cells`` timed cells a round, each ``startup_s`` +
    ``serving_s`` (+ ``mmmu_s`` in the rounds MMMU runs in), plus ``correctness_cells`` untimed
    correctness cells (``startup_s`` + ``correctness_s`` each, the same in every design)."""

    cells: int
    startup_s: float
    serving_s: float
    mmmu_s: float
    correctness_s: float
    correctness_cells: int = 0

    def hours(self, rounds: float, mmmu_first: int) -> float:
        """H200 hours of a report with ``rounds`` timed rounds (a mean is fine: linear), MMMU in
        the first ``mmmu_first`` of them (0: every round)."""
        mmmu_rounds = min(float(mmmu_first), rounds) if mmmu_first else rounds
        timed = self.cells * (
            rounds * (self.startup_s + self.serving_s) + mmmu_rounds * self.mmmu_s
        )
        corr = self.correctness_cells * (self.startup_s + self.correctness_s)
        return (timed + corr) / 3600.0


@dataclass
class Calibration:
    """One invocation: the options, what the config ships, and the rows counted so far
    (``rows``: the CV table's (cv, repeats, counts); ``at``: the fixed rows at ``--target-cv`` by
    repeat count; ``screens``: the search's screens, (repeats, +10 % called improved, trials);
    ``shipped_sequential``: the config's own sequential design there)."""

    a: argparse.Namespace
    settings: CompareSettings
    fixed_cfg: int | None
    seq_cfg: SeqSpec | None
    n_corr: int
    mmmu_first: int
    base: Model
    rows: list[tuple[float, int, Counts]] = field(default_factory=list)
    at: dict[int, Counts] = field(default_factory=dict)
    screens: list[tuple[int, int, int]] = field(default_factory=list)
    shipped_sequential: Counts | None = None

    @property
    def reps_cfg(self) -> int:
        """The fixed repeats of the target and CV rows: the config's, or 5 (the reference point
        of the targets) when the config ships a sequential design."""
        return self.fixed_cfg or 5

    def model(self, cv: float) -> Model:
        return dataclasses.replace(self.base, run_cv=cv)

    def run(self, cv: float, n: int, label: str, trials: int | None = None, **kw) -> Counts:
        """:func:`run_row` at run CV ``cv`` and ``n`` repeats with the options' trials (or
        ``trials``), seed and settings; its time goes to stderr under ``label``."""
        a = self.a
        small = a.small_effect if a.small_effect is not None else 0.05
        kw = dict(via_folders=a.via_folders, secondaries=a.secondaries, small_effect=small) | kw
        t1 = time.time()
        c = run_row(self.model(cv), n, trials or a.trials, a.seed, self.settings, **kw)
        print(f"  CV {100 * cv:g}% {label}: {time.time() - t1:.0f} s", file=sys.stderr, flush=True)
        return c

    def row(self, cv: float, n: int, scenarios=("null", "effect"), into: Counts | None = None):
        """A CV-table row (added to ``rows`` unless it adds scenarios to ``into``)."""
        c = self.run(
            cv, n, f"x {n} repeats, {'+'.join(scenarios)}", scenarios=scenarios, counts=into
        )
        if into is None:
            self.rows.append((cv, n, c))
        return c


def load(a: argparse.Namespace) -> Calibration:
    """The calibration of the parsed options (tools/calibrate.py): the config's schedule and
    settings (defaults, 5 repeats, when the file does not exist); ``a.mmmu_rounds`` resolved to
    "all", "first" or a number of first rounds; ``a.noise_fields`` (tools/calibrate.py's parsed
    ``--noise``, :func:`tools.calibration.model.parse_noise`; absent: Gaussian) set the run
    noise of the model. Raises ConfigError (patchbench.errors) when the config does not load."""
    n_corr, fixed_cfg, seq_cfg, settings = 0, 5, None, CompareSettings()
    if a.config.is_file():
        fixed_cfg, seq_cfg, settings = config_repeats(a.config)
        cfg_mmmu_first, n_corr = config_schedule(a.config)
        a.mmmu_rounds = a.mmmu_rounds or (
            {0: "all", 1: "first"}.get(cfg_mmmu_first, str(cfg_mmmu_first))
        )
    a.mmmu_rounds = a.mmmu_rounds or "all"
    first = {"all": 0, "first": 1}.get(a.mmmu_rounds)
    first = int(a.mmmu_rounds) if first is None else first
    base = Model(
        req_cv=a.req_cv,
        step_share=a.step_share,
        fragile=a.fragile,
        questions=a.questions,
        **getattr(a, "noise_fields", {}),
    )
    return Calibration(a, settings, fixed_cfg, seq_cfg, n_corr, first, base)


def cv_rows(cal: Calibration) -> None:
    """The CV table's rows and the target row, then the search for the repeats reaching the
    power target: each further count is screened with --screen-trials +10 % trials; one whose
    screen is not clearly below the target (upper Wilson bound >= target) gets the full trials
    (+10 %; no-effect too at the first that meets the target)."""
    a = cal.a
    for cv in a.cvs:
        for n in a.repeats or [cal.reps_cfg]:
            cal.row(cv, n)
    cal.at.update({n: c for cv, n, c in cal.rows if cv == a.target_cv})
    if cal.reps_cfg not in cal.at:
        cal.at[cal.reps_cfg] = cal.row(a.target_cv, cal.reps_cfg)
    n, c = cal.reps_cfg, cal.at[cal.reps_cfg]
    while c.new_power < a.power_target * c.effect and n < a.search_max:
        n += 1
        if n in cal.at:
            c = cal.at[n]
            continue
        if 0 < a.screen_trials < a.trials:
            sc = cal.run(
                a.target_cv,
                n,
                f"x {n} repeats, screen",
                scenarios=("effect",),
                trials=a.screen_trials,
            )
            cal.screens.append((n, sc.new_power, sc.effect))
            if wilson_interval(sc.new_power, sc.effect, 0.95)[1] < a.power_target:
                continue  # clearly below the target
        c = cal.at[n] = cal.row(a.target_cv, n, ("effect",))
    if c.new_power >= a.power_target * c.effect and not c.null:
        cal.row(a.target_cv, n, ("null",), into=c)


def design_rows(cal: Calibration) -> list[tuple[str, Counts, bool]]:
    """The design table's entries at --target-cv: (label, counts, MMMU in the first round only)
    for the fixed counts (both scenarios; with MMMU in the first round only, every fixed row but
    the reference 'fixed 5, every suite in every cell' again with that schedule, on the same
    trials) and the sequential designs."""
    a, first = cal.a, mmmu_label(cal.mmmu_first)
    fixed = sorted({5, cal.reps_cfg, *a.design_repeats})
    scen = ("null", "effect") + (("small",) if a.small_effect is not None else ())
    for n in fixed:
        have = cal.at.get(n)
        todo = tuple(s for s in scen if have is None or not getattr(have, s))
        if have is None:
            cal.at[n] = cal.row(a.target_cv, n, scen)
        elif todo:
            cal.row(a.target_cv, n, todo, into=have)
    entries = [
        (f"fixed {n}" + (" (today: every suite in every cell)" if n == 5 else ""), cal.at[n], False)
        for n in fixed
        if n == 5 or not cal.mmmu_first
    ]
    for n in fixed if cal.mmmu_first else []:
        c = cal.run(
            a.target_cv,
            n,
            f"x {n} repeats, MMMU first {cal.mmmu_first} round(s)",
            scenarios=scen,
            mmmu_first=cal.mmmu_first,
        )
        entries.append((f"fixed {n}{first}", c, True))
    seqs = list(dict.fromkeys([*([cal.seq_cfg] if cal.seq_cfg else []), *a.sequential]))
    if seqs and not a.config.is_file():
        print(f"  no config file {a.config}: no sequential rows", file=sys.stderr)
        seqs = []
    for spec in seqs:
        c = cal.run(
            a.target_cv,
            spec.max,
            spec.label,
            scenarios=scen,
            plan=sequential_plan(a.config, spec),
            mmmu_first=cal.mmmu_first,
        )
        entries.append((spec.label + first, c, cal.mmmu_first))
        if spec == cal.seq_cfg:
            cal.shipped_sequential = c
    return entries
