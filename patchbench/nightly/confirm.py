"""The confirmation run (as Chromium's Pinpoint confirms a bisect): when a night is red and its
sglang release or patch state differs from the last green night's, last green's build and
tonight's run interleaved in ONE run and the failing metrics judged on its paired rounds.

Rule (:func:`should_confirm`): ``nightly.confirm.enabled``, the night is red, a last green night
exists (the newest earlier night whose nightly.json says green, :func:`last_green`), and the
builds differ (:func:`build_signature`: each variant's release, patches and their states). Only
the variant of the first failing gate is confirmed (one run of two variants): ``last-green``
(that variant's patches on last green's release) and ``tonight`` (the same patches on tonight's
release; the baseline, so the clients come from tonight's release, which knows both servers:
0.5.1.post3's clients against a 0.5.23 CPU server lost requests that 0.5.23's served),
``confirm.repeats`` interleaved rounds, the suites of the failing metrics only
(:func:`confirm_config`). Its cost is stated before it starts
(:func:`estimate_minutes`: its cells times tonight's measured minutes per cell).

Rounds (:func:`plan_rounds`): ``confirm.repeats: auto`` (the default) runs the rounds at which a
change the size of tonight's observed one is confirmed at ``alpha`` with ``confirm.power``, given
the metric's learned paired noise (:func:`rounds_needed`: the noncentral-t power of the one-sided
paired t test), at least ``confirm.min_repeats`` and at most ``confirm.max_repeats``; a number
runs that many.

Verdict (:func:`paired_result`): per failing metric, the paired log ratios tonight / last green
by round; a one-sided paired t test in the metric's worse direction at ``confirm.alpha``;
"confirmed" when p < alpha, with the change and its two-sided ``1 - 2 alpha`` interval (the
interval that excludes 0 exactly when the one-sided test rejects).
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

from patchbench.nightly.history import Night, night_from_run
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
    raw: Mapping[str, Any],
    variant: str,
    old_release: str,
    new_release: str,
    suites: Iterable[str],
    repeats: int,
    dest: Path | None = None,
) -> Path:
    """Write the confirmation's config to ``dest`` (by default kept beside the run folders by
    :func:`patchbench.nightly.builds.keep_config`): ``raw`` (tonight's config as loaded YAML)
    with two variants, :data:`OLD` (``variant``'s patches, server arguments and environment on
    ``old_release``) and :data:`NEW` (the same on ``new_release``; the baseline, whose release
    runs the clients), ``repeats`` interleaved rounds, only ``suites``, no ``nightly`` section,
    name ``<name>-confirm``.
    Raises KeyError when ``variant`` is not in the config."""
    import yaml

    spec = (raw.get("variants") or {})[variant]
    spec = {"patches": list(spec or [])} if not isinstance(spec, dict) else dict(spec)
    cfg = {k: v for k, v in raw.items() if k != "nightly"}
    cfg["name"] = f"{raw.get('name', 'nightly')}-confirm"
    cfg["sglang"] = new_release
    cfg["variants"] = {NEW: {**spec, "sglang": new_release}, OLD: {**spec, "sglang": old_release}}
    cfg["baseline"] = NEW
    cfg["schedule"] = {"repeats": int(repeats), "order": "interleaved"}
    want = set(suites)
    cfg["suites"] = {s: v for s, v in (raw.get("suites") or {}).items() if s in want}
    text = yaml.safe_dump(cfg, sort_keys=False)
    if dest is None:
        from patchbench.nightly.builds import keep_config

        return keep_config(str(cfg["name"]), "confirm", text)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text, encoding="utf-8")
    return dest


def minutes_per_cell(run_dir: str | os.PathLike) -> float | None:
    """Tonight's measured minutes per cell: (ended_at - started_at) over its cells (manifest);
    None when unknown."""
    from patchbench.nightly.history import _utc_iso
    from patchbench.runfolder import RunFolderError, read_manifest

    try:
        m = read_manifest(Path(run_dir))
    except RunFolderError:
        return None
    start, end = _utc_iso(m.started_at or ""), _utc_iso(m.ended_at or "")
    if not (start and end and m.cells):
        return None
    from datetime import datetime

    fmt = "%Y-%m-%dT%H:%M:%SZ"
    secs = (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
    return max(secs, 0.0) / 60.0 / len(m.cells)


def estimate_minutes(cells: int, per_cell_min: float | None) -> float | None:
    """The confirmation's machine minutes: ``cells`` times tonight's minutes per cell."""
    return None if per_cell_min is None else cells * per_cell_min


#: rounds_needed searches no further (a change this hard to confirm is reported as "more than")
MAX_SEARCH = 100_000


def paired_t_power(n: int, effect: float, sigma: float, alpha: float) -> float:
    """Power of the one-sided paired t test of ``n`` pairs at level ``alpha`` against a true mean
    paired difference ``effect`` (> 0, in the test's direction) with pair sd ``sigma`` (> 0; both
    log scale): ``P(T > t_{1-alpha, n-1})`` for T noncentral t with ``n - 1`` degrees of freedom
    and noncentrality ``effect / sigma * sqrt(n)`` (Cohen 1988, *Statistical Power Analysis for
    the Behavioral Sciences*, ch. 2: the exact noncentral-t power of the one-sample / paired t
    test), by scipy.stats.nct. A probability in [0, 1]. Raises ValueError for ``n`` < 2."""
    from scipy import stats

    if n < 2:
        raise ValueError(f"a paired t test needs 2 or more pairs, not {n}")
    df = n - 1
    crit = stats.t.ppf(1.0 - alpha, df)
    return float(stats.nct.sf(crit, df, effect / sigma * math.sqrt(n)))


def rounds_needed(effect: float, sigma: float, alpha: float, power: float) -> int | None:
    """The fewest pairs n (>= 2) with :func:`paired_t_power` ``(n, |effect|, sigma, alpha) >=
    power`` (log scale; the power grows with n); None when even :data:`MAX_SEARCH` pairs do not
    reach it (e.g. ``effect`` 0)."""
    effect = abs(effect)
    if effect == 0 or not math.isfinite(effect / sigma):
        return None
    hi = 2
    while paired_t_power(hi, effect, sigma, alpha) < power:
        if hi >= MAX_SEARCH:
            return None
        hi = min(2 * hi, MAX_SEARCH)
    lo = max(2, hi // 2)
    if paired_t_power(lo, effect, sigma, alpha) >= power:
        return lo
    while hi - lo > 1:  # power(lo) < power <= power(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if paired_t_power(mid, effect, sigma, alpha) >= power else (mid, hi)
    return hi


def detectable_effect(n: int, sigma: float, alpha: float, power: float) -> float:
    """The smallest paired effect (log scale, > 0) that ``n`` pairs (>= 2) confirm at ``alpha``
    with ``power`` (the root of :func:`paired_t_power` = ``power``, by scipy.optimize.brentq)."""
    from scipy.optimize import brentq

    hi = sigma
    while paired_t_power(n, hi, sigma, alpha) < power:
        hi *= 2
    return float(brentq(lambda e: paired_t_power(n, e, sigma, alpha) - power, 0.0, hi))


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
    """The confirmation's rounds under ``cs`` (:class:`patchbench.nightly.gates.settings.ConfirmSettings`).

    A number in ``cs.repeats`` is run as it is. ``auto``: per failing (suite, metric,
    change_pct) of ``changes`` (tonight's observed change, %), its pair noise: ``pair_cv_pct`` of
    its row in ``noise`` (the night's noise table, :func:`patchbench.nightly.job.noise_table`),
    else ``prior_run_cv_pct * sqrt(2)`` (log scale, as patchbench/nightly/noise.py's prior); the rounds
    :func:`rounds_needed` gives for ``|log(1 + change)|`` at ``cs.alpha`` and ``cs.power``. The
    metric that needs the most rounds sizes the run (at equal noise: the smallest change),
    bounded by ``cs.min_repeats`` and ``cs.max_repeats``. No change with a known noise:
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
        need = rounds_needed(effect, sigma, cs.alpha, cs.power)
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
    config_path: str | os.PathLike,
    res: Any,
    run_bench: Callable[[str], Any] | None,
    out: Any = None,
    not_here: str = "",
) -> Confirmation | None:
    """Run the confirmation of a gated night ``res`` (:class:`patchbench.nightly.outcome.
    NightlyOutcome` of the config at ``config_path``) when :func:`should_confirm` says so, with
    ``run_bench`` (``patchbench.run.bench.run_bench``: config path -> run folder); the cost is
    printed to ``out`` before it starts. None for a night that is not red; a red night that
    needs none gets a Confirmation with ``skipped`` (why). ``run_bench`` None: the confirmation
    is planned (its config written, its cost printed) but not run here, ``skipped`` says why
    (``not_here``) and the command that runs it. Never raises for the confirmation's own
    failure (``error``)."""
    import yaml

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
    raw = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
    try:
        path = confirm_config(
            raw, variant, conf.old_release, conf.new_release, {m[0] for m in metrics},
            conf.repeats,
        )  # fmt: skip
    except OSError as e:  # the results root cannot hold its config
        conf.error = f"cannot write the confirmation's config: {e}"
        return conf
    conf.cells = _cells(path, conf.repeats)
    conf.minutes = estimate_minutes(conf.cells, minutes_per_cell(night.run_dir or ""))
    print(f"nightly: {conf.plan_line()}", file=out, flush=True)
    if run_bench is None:
        conf.skipped = (
            f"planned, not run here ({not_here or 'no runner'}): run it with "
            f"`patchbench bench {path}` and compare its two variants"
        )
        print(f"nightly: confirmation: {conf.skipped}", file=out)
        return conf
    from patchbench.errors import PatchbenchError

    try:
        run_dir = run_bench(str(path))
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


def _cells(path: Path, repeats: int) -> int:
    """The confirmation's cells as its plan has them (two variants x ``repeats`` when the config
    cannot be planned here)."""
    try:
        from patchbench.config import load_config
        from patchbench.run.plan import plan

        return len(plan(load_config(path)))
    except Exception:  # noqa: BLE001 (an estimate only)
        return 2 * repeats


def rounds_table(
    changes_pct: Sequence[float] = (5.0, 10.0),
    pair_cv_pct: Sequence[float] = (2.0, 4.0),
    alpha: float = 0.001,
    power: float = 0.9,
) -> str:
    """A markdown table of :func:`rounds_needed`: one row per paired noise (CV, %) of
    ``pair_cv_pct``, one column per change (%) of ``changes_pct``, at ``alpha`` and ``power``
    (uncapped; "more than MAX_SEARCH" where unreachable)."""
    head = "| pair noise | " + " | ".join(f"{c:g} % change" for c in changes_pct) + " |"
    out = [head, "|---" * (len(changes_pct) + 1) + "|"]
    for cv in pair_cv_pct:
        sigma = math.log1p(cv / 100.0)
        cells = []
        for c in changes_pct:
            n = rounds_needed(math.log1p(c / 100.0), sigma, alpha, power)
            cells.append(f"> {MAX_SEARCH}" if n is None else str(n))
        out.append(f"| {cv:g} % | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m patchbench.nightly.confirm --table [--changes 5 10] [--noise 2 4] [--alpha
    0.001] [--power 0.9]``: print :func:`rounds_table` (docs/nightly.md, "Confirmation run")."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m patchbench.nightly.confirm",
        description="rounds a confirmation run needs (one-sided paired t test, noncentral t)",
    )
    ap.add_argument("--table", action="store_true", required=True)
    ap.add_argument(
        "--changes", type=float, nargs="+", default=[5.0, 10.0], help="changes, %% (- a drop)"
    )
    ap.add_argument("--noise", type=float, nargs="+", default=[2.0, 4.0], help="pair CV, %%")
    ap.add_argument("--alpha", type=float, default=0.001)
    ap.add_argument("--power", type=float, default=0.9)
    a = ap.parse_args(argv)
    if not (0 < a.alpha < 0.5 and 0 < a.power < 1):
        ap.error("--alpha must be in (0, 0.5) and --power in (0, 1)")
    if any(x <= 0 for x in a.noise) or any(x == 0 or x <= -100 for x in a.changes):
        ap.error("--noise must be positive and --changes non-zero and above -100")
    print(rounds_table(a.changes, a.noise, a.alpha, a.power))
    return 0


__all__ = [
    "NEW",
    "OLD",
    "Confirmation",
    "RoundsPlan",
    "build_signature",
    "confirm_config",
    "detectable_effect",
    "estimate_minutes",
    "judge",
    "last_green",
    "lines",
    "main",
    "maybe_confirm",
    "minutes_per_cell",
    "paired_result",
    "paired_t_power",
    "plan_rounds",
    "release_of",
    "rounds_needed",
    "rounds_table",
    "should_confirm",
]

if __name__ == "__main__":
    sys.exit(main())
