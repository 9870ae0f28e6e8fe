"""The confirmation run (as Chromium's Pinpoint confirms a bisect): a red night whose sglang release
or patch state differs from the last green night's is re-measured in ONE run, last green's build
and tonight's interleaved, and each failing metric judged on its paired rounds.

Rule (:func:`should_confirm`): ``nightly.confirm.enabled``, the night is red, a last green night
exists (:func:`last_green`) and the builds differ (:func:`build_signature`). The variant of the
first failing gate runs twice: :data:`OLD` (its patches on last green's release) and :data:`NEW`
(on tonight's; the baseline, so the clients come from tonight's release), only the suites of the
failing metrics (:func:`confirm_config`, a copy of tonight's config). Rounds: :func:`plan_rounds`.
Verdict: :func:`paired_result`, a one-sided paired t test at ``confirm.alpha``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.analysis.power import detectable_effect, n_needed
from patchbench.config.nightly import NightlySettings
from patchbench.nightly.history import Night, night_from_run, utc_iso
from patchbench.stats import paired_t

OLD, NEW = "last-green", "tonight"


def last_green(prior: Sequence[Night]) -> Night | None:
    """The newest of ``prior`` (oldest first) whose ``nightly.json`` in its run folder says
    outcome green; None when none does (or no folder can be read)."""
    for n in reversed(prior):
        if not n.run_dir:
            continue
        try:
            js = json.loads((Path(n.run_dir) / "nightly.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(js, dict) and js.get("outcome") == "green":
            return n
    return None


def build_signature(rows: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """{(variant, release, patch, state)} of a night's build rows (detail left out)."""
    return {
        (str(r["variant"]), str(r.get("sglang_release")), str(r.get("patch") or ""),
         str(r.get("state") or ""))
        for r in rows
    }  # fmt: skip


def should_confirm(
    outcome: str,
    tonight_rows: Iterable[Mapping[str, Any]],
    green: Night | None,
    green_rows: Iterable[Mapping[str, Any]],
    enabled: bool = True,
) -> tuple[bool, str]:
    """(run a confirmation?, why / why not) by the rule of the module docstring."""
    if not enabled:
        return False, "confirmation runs are off (nightly.confirm.enabled: false)"
    if outcome != "red":
        return False, f"the night is {outcome}, not red"
    if green is None:
        return False, "no earlier green night to confirm against"
    if build_signature(tonight_rows) == build_signature(green_rows):
        return False, (
            f"tonight ran the same sglang release and patch state as the last green night "
            f"({green.run_id}): nothing to bisect"
        )
    return True, f"tonight's build differs from the last green night's ({green.run_id})"


def release_of(rows: Iterable[Mapping[str, Any]], variant: str) -> str | None:
    """The release ``variant`` ran in ``rows`` (None when it has no row)."""
    return next((r.get("sglang_release") for r in rows if r["variant"] == variant), None)


def confirm_config(
    cfg: Any, variant: str, old_release: str, new_release: str, suites: Iterable[str], repeats: int
) -> Any:
    """The confirmation's config, a copy of tonight's :class:`patchbench.config.Config` (built in
    memory): two variants, :data:`OLD` (``variant``'s patches, arguments and environment on
    ``old_release``) and :data:`NEW` (the same on ``new_release``; the baseline), ``repeats``
    interleaved rounds, only ``suites``, default nightly settings, name ``<name>-confirm``.
    Raises KeyError when ``variant`` is not in the config."""
    spec = cfg.variants[variant]
    want = set(suites)
    schedule = type(cfg.schedule).model_validate({"repeats": int(repeats), "order": "interleaved"})
    return cfg.model_copy(
        update={
            "name": f"{cfg.name}-confirm",
            "sglang": new_release,
            "variants": {
                NEW: spec.model_copy(update={"sglang": new_release}),
                OLD: spec.model_copy(update={"sglang": old_release}),
            },
            "baseline": NEW,
            "schedule": schedule,
            "suites": {k: v for k, v in cfg.suites.items() if k in want},
            "suite_params": {k: v for k, v in cfg.suite_params.items() if k in want},
            "suite_rounds": {k: v for k, v in cfg.suite_rounds.items() if k in want},
            "nightly": NightlySettings(),
            "builds": {},
        }
    )


def minutes_per_cell(run_dir: str | os.PathLike) -> float | None:
    """Tonight's measured minutes per cell: (ended_at - started_at) over its cells (manifest);
    None when unknown."""
    from patchbench.runfolder import RunFolderError, read_manifest

    try:
        m = read_manifest(Path(run_dir))
    except RunFolderError:
        return None
    start, end = utc_iso(m.started_at or ""), utc_iso(m.ended_at or "")
    if not (start and end and m.cells):
        return None
    from datetime import datetime

    fmt = "%Y-%m-%dT%H:%M:%SZ"
    secs = (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
    return max(secs, 0.0) / 60.0 / len(m.cells)


def estimate_minutes(cells: int, per_cell_min: float | None) -> float | None:
    """The confirmation's machine minutes: ``cells`` times tonight's minutes per cell."""
    return None if per_cell_min is None else cells * per_cell_min


#: the confirmation's rounds are searched no further (a change this hard is "more than")
MAX_SEARCH = 100_000


@dataclass
class RoundsPlan:
    """How many rounds a confirmation runs and why (:func:`plan_rounds`).

    rounds: the rounds it runs; auto: chosen by ``repeats: auto``; needed: the rounds the target
    needs (None: unknown, or more than :data:`MAX_SEARCH`); capped: the target needs more than
    ``max_repeats``; detectable_pct: the smallest change (%, magnitude on the log scale) that
    ``rounds`` confirm at ``alpha`` with ``power`` at that noise; metric / change_pct /
    pair_cv_pct: the failing metric that sized it, its observed change (%) and its paired noise
    (CV, %); noise_source: "noise row" (the night's noise table) or "run_cv_pct" (the prior
    ``run_cv_pct * sqrt(2)``); text: the plan line's sentence."""

    rounds: int
    auto: bool
    power: float
    alpha: float
    needed: int | None = None
    capped: bool = False
    detectable_pct: float | None = None
    metric: str | None = None
    change_pct: float | None = None
    pair_cv_pct: float | None = None
    noise_source: str | None = None
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        """nightly.json's ``confirmation`` keys: rounds, rounds_auto, needed, capped,
        detectable_pct, power, rounds_metric, rounds_change_pct, rounds_pair_cv_pct,
        rounds_noise_source, rounds_text."""
        return {
            "rounds": self.rounds,
            "rounds_auto": self.auto,
            "needed": self.needed,
            "capped": self.capped,
            "detectable_pct": self.detectable_pct,
            "power": self.power,
            "rounds_metric": self.metric,
            "rounds_change_pct": self.change_pct,
            "rounds_pair_cv_pct": self.pair_cv_pct,
            "rounds_noise_source": self.noise_source,
            "rounds_text": self.text,
        }


def plan_rounds(
    cs: Any,
    changes: Iterable[tuple[str, str, float | None]],
    noise: Iterable[Mapping[str, Any]] = (),
    prior_run_cv_pct: float | None = None,
) -> RoundsPlan:
    """The confirmation's rounds under ``cs`` (:class:`patchbench.nightly.gates.ConfirmSettings`).

    A number in ``cs.repeats`` runs as it is. ``auto``: per failing (suite, metric, change_pct)
    of ``changes``, its paired noise (``pair_cv_pct`` of its row in ``noise``, the night's noise
    table; else ``sqrt(2)`` times ``prior_run_cv_pct``) and the fewest rounds whose one-sided
    paired t test confirms ``|log(1 + change)|`` at ``cs.alpha`` with ``cs.power``
    (:func:`patchbench.analysis.power.n_needed`, exact noncentral t). The metric needing the
    most sizes the run, within ``cs.min_repeats`` .. ``cs.max_repeats``; nothing known:
    ``cs.max_repeats``. Never raises for missing data."""
    if cs.repeats != "auto":
        r = int(cs.repeats)
        return RoundsPlan(r, False, cs.power, cs.alpha, text=f"{r} rounds (confirm.repeats)")
    rows = {(str(r.get("suite")), str(r.get("metric"))): r for r in noise}
    best: tuple[float, float, str, float, float, str, int | None] | None = None
    for suite, metric, change in changes:
        if change is None or not math.isfinite(change) or change <= -100:
            continue
        cv = (rows.get((suite, metric)) or {}).get("pair_cv_pct")
        if cv is not None and cv > 0:
            sigma, src = math.log1p(cv / 100.0), "noise row"
        elif prior_run_cv_pct:
            sigma, src = math.sqrt(2.0) * math.log1p(prior_run_cv_pct / 100.0), "run_cv_pct"
        else:
            continue
        effect = abs(math.log1p(change / 100.0))
        need = n_needed(effect, sigma, cs.alpha, cs.power, alternative="larger", cap=MAX_SEARCH)
        key = (math.inf if need is None else float(need), -effect)
        if best is None or key > best[:2]:
            best = (*key, f"{suite}.{metric}", change, sigma, src, need)
    if best is None:
        return RoundsPlan(
            cs.max_repeats, True, cs.power, cs.alpha,
            text=f"{cs.max_repeats} rounds (max_repeats): no observed change with a known "
            "paired noise (no noise row, no nightly.run_cv_pct) to size them",
        )  # fmt: skip
    _, _, name, change, sigma, src, need = best
    capped = need is None or need > cs.max_repeats
    rounds = cs.max_repeats if capped else max(cs.min_repeats, need or 0)
    det = 100.0 * math.expm1(detectable_effect(rounds, sigma, cs.alpha, cs.power))
    cv = 100.0 * math.expm1(sigma)
    lvl = f"p < {cs.alpha:g} with {100 * cs.power:g} % power"
    if capped:
        text = (
            f"needs {'more than ' + str(MAX_SEARCH) if need is None else need}, capped at "
            f"{rounds}: a change smaller than {det:.1f} % cannot be confirmed at this level "
            f"({lvl}; {name} changed {change:+.1f} % at a paired noise of {cv:.1f} %)"
        )
    else:
        text = (
            f"{rounds} rounds: a {change:+.1f} % change at a paired noise of {cv:.1f} % is "
            f"confirmed at {lvl} ({name})"
        )
    return RoundsPlan(
        rounds, True, cs.power, cs.alpha, need, capped, det, name, change, cv, src, text
    )


@dataclass
class Confirmation:
    """One confirmation run: the variant confirmed, last green's night and release, tonight's
    release, its settings (alpha, repeats: the rounds it runs), how the rounds were
    chosen (``rounds``: :func:`plan_rounds`; None before), the stated cost (cells, minutes; None when unknown),
    its run folder, the paired result of each failing metric (:func:`paired_result`), and why it
    did not run or failed (``skipped`` / ``error``)."""

    variant: str
    last_green_run_id: str | None
    old_release: str | None
    new_release: str | None
    alpha: float
    repeats: int
    rounds: RoundsPlan | None = None
    cells: int = 0
    minutes: float | None = None
    run_dir: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field, as nightly.json's ``confirmation`` (``rounds``' keys at the top level:
        :meth:`RoundsPlan.to_json`)."""
        return {
            "variant": self.variant,
            "last_green_run_id": self.last_green_run_id,
            "old_release": self.old_release,
            "new_release": self.new_release,
            "alpha": self.alpha,
            "repeats": self.repeats,
            **(self.rounds.to_json() if self.rounds else {}),
            "cells": self.cells,
            "minutes": self.minutes,
            "run_dir": self.run_dir,
            "results": self.results,
            "skipped": self.skipped,
            "error": self.error,
        }

    def rows(self) -> list[dict[str, Any]]:
        """The history's ``confirmations`` rows (patchbench.nightly.history.CONFIRM_COLUMNS)."""
        return [
            {
                "variant": self.variant,
                "suite": r["suite"],
                "metric": r["metric"],
                "last_green_run_id": self.last_green_run_id,
                "old_release": self.old_release,
                "new_release": self.new_release,
                "change_pct": r.get("change_pct"),
                "ci_low_pct": r.get("ci_low_pct"),
                "ci_high_pct": r.get("ci_high_pct"),
                "p_value": r.get("p_value"),
                "alpha": self.alpha,
                "repeats": self.repeats,
                "verdict": r["verdict"],
                "confirm_run_dir": self.run_dir,
            }
            for r in self.results
        ]

    def plan_line(self) -> str:
        """What it will run and cost, stated before it starts."""
        cost = "n/a" if self.minutes is None else f"{self.minutes:.1f}"
        return (
            f"confirmation run: variant '{self.variant}' on sglang {self.old_release} (last "
            f"green, {self.last_green_run_id}) vs {self.new_release} (tonight), {self.repeats} "
            f"interleaved rounds, {self.cells} cells, about {cost} machine (GPU) minutes; "
            + (
                self.rounds.text
                if self.rounds and self.rounds.auto
                else f"confirmed at p < {self.alpha:g}"
            )
        )


def paired_result(
    night: Night,
    suite: str,
    metric: str,
    better: str | None,
    alpha: float,
    old_release: str | None,
    new_release: str | None,
) -> dict[str, Any]:
    """The paired result of one metric of a confirmation run's night (variants :data:`OLD` and
    :data:`NEW`): ``change_pct`` (geometric mean of tonight / last green, %), ``ci_low_pct`` /
    ``ci_high_pct`` (two-sided ``1 - 2 alpha``), ``p_value`` (one-sided, worse direction),
    ``n`` pairs, ``verdict`` (confirmed / not confirmed / no data) and ``text``."""
    old = night.values.get((OLD, suite, metric), [])
    new = night.values.get((NEW, suite, metric), [])
    d = [
        math.log(b / a)
        for a, b in zip(old, new, strict=False)
        if a is not None and b is not None and a > 0 and b > 0
    ]
    out: dict[str, Any] = {"suite": suite, "metric": metric, "n": len(d), "better": better}
    if len(d) < 2:
        out.update(verdict="no data", text=f"{suite}.{metric}: not judged ({len(d)} pair(s))")
        return out
    t = paired_t(d)
    worse = "greater" if better == "lower" else "less"
    p = t.p_value(worse)
    lo, hi = t.interval(2 * alpha)
    pct = [100 * math.expm1(x) for x in (t.mean, lo, hi)]
    ok = p < alpha
    out.update(
        change_pct=pct[0],
        ci_low_pct=pct[1],
        ci_high_pct=pct[2],
        p_value=p,
        verdict="confirmed" if ok else "not confirmed",
    )
    out["text"] = (
        f"{suite}.{metric}: {'confirmed' if ok else 'not confirmed'}: tonight's "
        f"{new_release} is {pct[0]:+.1f}% [{pct[1]:+.1f}, {pct[2]:+.1f}] vs last green "
        f"{old_release}, p={p:.2g} ({len(d)} pairs, one-sided, level {alpha:g})"
    )
    return out


def judge(
    conf: Confirmation, run_dir: Path, metrics: Sequence[tuple[str, str, str | None]]
) -> None:
    """Fill ``conf.results`` from the confirmation's run folder, one per (suite, metric,
    better) of ``metrics``; a folder that cannot be read sets ``conf.error``."""
    conf.run_dir = str(run_dir)
    try:
        night = night_from_run(run_dir)
    except (OSError, ValueError) as e:
        conf.error = f"the confirmation's run folder cannot be read: {e}"
        return
    conf.results = [
        paired_result(night, s, m, b, conf.alpha, conf.old_release, conf.new_release)
        for s, m, b in metrics
    ]


def lines(conf: Mapping[str, Any]) -> list[str]:
    """The confirmation as markdown lines (from :meth:`Confirmation.to_json`)."""
    out = ["## Confirmation run", ""]
    if conf.get("skipped"):
        return out + [f"Not run: {conf['skipped']}", ""]
    cost = "n/a" if conf.get("minutes") is None else f"{conf['minutes']:.1f}"
    out.append(
        f"Variant `{conf['variant']}`: sglang {conf['old_release']} (last green night "
        f"`{conf['last_green_run_id']}`) vs {conf['new_release']} (tonight), interleaved in one "
        f"run: {conf['repeats']} rounds, {conf['cells']} cells, about {cost} machine (GPU) "
        f"minutes; confirmed when the one-sided paired t test gives p < {conf['alpha']:g}."
    )
    out.append("")
    if conf.get("rounds_text"):
        out += [f"Rounds: {conf['rounds_text']}.", ""]
    if conf.get("run_dir"):
        out += [f"Run folder: [{Path(conf['run_dir']).name}]({conf['run_dir']})", ""]
    if conf.get("error"):
        out += [f"Failed: {conf['error']}", ""]
    out += [f"- {r['text']}" for r in conf.get("results") or []]
    return out + [""]


def maybe_confirm(
    cfg: Any,
    res: Any,
    run_bench: Callable[[Any], Any] | None,
    out: Any = None,
    not_here: str = "",
) -> Confirmation | None:
    """The confirmation of a gated night ``res`` (:class:`patchbench.nightly.render.
    NightlyOutcome` of the :class:`patchbench.config.Config` ``cfg``) when :func:`should_confirm`
    says so, run with ``run_bench`` (Config -> run folder) after printing its cost to ``out``.
    None for a night that is not red; a red night that needs none gets ``skipped`` (why).
    ``run_bench`` None: planned and not run (``skipped`` says why, ``not_here``, and what to run).
    Never raises for the confirmation's own failure (``error``)."""
    out = out or sys.stdout
    night, settings = res.night, res.settings
    if night is None or settings is None or res.outcome != "red":
        return None
    cs = settings.confirm
    failing = [r for r in res.results if r.status == "fail"]
    variant = next((r.variant for r in failing if r.variant != "*"), night.baseline)
    conf = Confirmation(
        variant, None, None, release_of(res.builds, variant), cs.alpha,
        cs.repeats if cs.repeats != "auto" else cs.max_repeats,
    )  # fmt: skip
    green, green_rows, unreadable = _last_green_night(res)
    if unreadable:
        conf.skipped = unreadable
        return conf
    ok, why = should_confirm(res.outcome, res.builds, green, green_rows, cs.enabled)
    if not ok:
        conf.skipped = why
        return conf
    assert green is not None
    conf.last_green_run_id = green.run_id
    conf.old_release = release_of(green_rows, variant) or green.sglang_version
    if not conf.old_release or not conf.new_release:
        conf.skipped = f"the releases of variant '{variant}' are not known for both nights"
        return conf
    metrics, changes = _failing_metrics(failing, variant)
    conf.rounds = plan_rounds(cs, changes, res.noise, settings.run_cv_pct)
    conf.repeats = conf.rounds.rounds
    suites = {m[0] for m in metrics}
    ccfg = confirm_config(cfg, variant, conf.old_release, conf.new_release, suites, conf.repeats)
    conf.cells = _cells(ccfg, conf.repeats)
    conf.minutes = estimate_minutes(conf.cells, minutes_per_cell(night.run_dir or ""))
    print(f"nightly: {conf.plan_line()}", file=out, flush=True)
    if run_bench is None:
        conf.skipped = (
            f"planned, not run here ({not_here or 'no runner'}): run `patchbench bench "
            f"{cfg.source}` with variants {NEW} (sglang {conf.new_release}, the baseline) and "
            f"{OLD} (sglang {conf.old_release}), both with variant '{variant}''s patches, "
            f"{conf.repeats} interleaved rounds of suites {', '.join(sorted(suites))}, and compare "
            "its two variants"
        )
        print(f"nightly: confirmation: {conf.skipped}", file=out)
        return conf
    from patchbench.errors import PatchbenchError

    try:
        run_dir = run_bench(ccfg)
    except PatchbenchError as e:
        conf.error = f"{type(e).__name__}: {e}"
        run_dir = getattr(e, "run_dir", None)
        if not run_dir:
            return conf
    judge(conf, Path(run_dir), metrics)
    for r in conf.results:
        print(f"nightly: confirmation: {r['text']}", file=out)
    return conf


def _last_green_night(res: Any) -> tuple[Any, list[dict[str, Any]], str | None]:
    """The last green night before the gated night ``res`` in its history (None without one),
    its builds' rows (from the history, else from its run folder) and None; (None, [], why)
    when the history cannot be read."""
    from patchbench.nightly.builds import rows_of_run
    from patchbench.nightly.history import History, HistoryError, read_night_builds

    night, settings = res.night, res.settings
    green, green_rows = None, []
    try:
        with History(res.history_info["path"], timeout_s=settings.lock_timeout_s) as h:
            prior = h.nights(
                night.config_name, before_utc=night.night_utc, exclude_run_id=night.run_id
            )
            green = last_green(prior)
            if green is not None:
                green_rows = read_night_builds(h, run_id=green.run_id)
    except (HistoryError, KeyError) as e:
        return None, [], f"the history cannot be read: {e}"
    if green is not None and not green_rows and green.run_dir:
        green_rows = [r.to_json() for r in rows_of_run(green.run_dir)]
    return green, green_rows, None


def _failing_metrics(
    failing: list[Any], variant: str
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, float | None]]]:
    """What the confirmation measures: the failing gates' (suite, metric, better) of
    ``variant`` (else of any variant), and their (suite, metric, change %)."""
    metrics = list(
        dict.fromkeys((r.suite, r.metric, r.better) for r in failing if r.variant == variant)
    ) or list(dict.fromkeys((r.suite, r.metric, r.better) for r in failing))
    want = {(s, m) for s, m, _ in metrics}
    changes = [
        (r.suite, r.metric, r.change_pct)
        for r in failing
        if (r.suite, r.metric) in want and r.variant == variant
    ] or [(r.suite, r.metric, r.change_pct) for r in failing if (r.suite, r.metric) in want]
    return metrics, changes


def _cells(cfg: Any, repeats: int) -> int:
    """The confirmation's cells as its plan has them (two variants x ``repeats`` when it cannot
    be planned here)."""
    try:
        from patchbench.run.plan import plan

        return len(plan(cfg))
    except Exception:  # noqa: BLE001 (an estimate only)
        return 2 * repeats
