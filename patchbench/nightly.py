"""The nightly regression job: run a config, append it to the history, evaluate the gates.

``runner.py nightly CONFIG [--history PATH]``        run the config, record, gate (CI's command)
``runner.py nightly --from-run RUN_DIR [CONFIG]``     the same on a finished run folder (no run)
``runner.py nightly --record-only RUN_DIR [CONFIG]``  only append a finished run (e.g. after the
                                                      history was locked or corrupt that night)

Exit codes (patchbench/__init__.py), worst first: 4 the run failed (an exception of the runner,
failed cells, no comparison), 3 the environment is not ready or the history cannot be used,
2 bad usage or config (including a gate whose metric the run does not produce), 1 a gate found a
regression, 0 nothing to report. The summary always lists every gate, so a night that exits 3 or
4 still shows the regressions it could see.

The config's ``nightly:`` section is :class:`NightlySettings`::

    nightly:
      history_path: ~/.cache/patchbench/history.sqlite   # PATCHBENCH_HISTORY / --history override
      window_nights: 7          # K: the history gate compares with the last K nights
      min_history_nights: 2     # fewer nights than this in the window: the history gate waits
      gates:
        - metric: serving.output_throughput_tok_s   # suite.metric, or a bare metric (any suite)
          threshold_pct: 5      # a change worse than 5 % ...
          require_ci_excludes_zero: true   # ... whose 95 % interval excludes zero (same-run)
          consecutive_nights: 1 # ... on this many nights in a row
          against: both         # same_run | history | both
          direction: higher     # which way is better; default from the suite's METRICS

Gates (docs/nightly.md has the worked definition):

- same_run: for each variant other than the baseline (A/A variants excluded), compare.json's
  change vs the baseline of the same run is worse than ``threshold_pct`` in the bad direction and
  (``require_ci_excludes_zero``) its interval lies entirely on the bad side of zero.
- history: for each variant, the baseline included, tonight's median over repeats vs the median
  of the per-night medians of the last K recorded nights of the same config: worse than
  ``threshold_pct`` and outside the band [min, max] of every repeat value of those K nights.
- ``consecutive_nights`` N: the condition must also hold on the N-1 previous recorded nights (for
  the history gate each of the N nights is judged against the K nights before the streak).
  Bad tonight but not yet on N nights: status "warn" (exit 0).

Outputs in the run folder: ``nightly.md`` (for $GITHUB_STEP_SUMMARY), ``nightly.json``
(dashboards), ``plots/nightly-<suite>.<metric>.png`` (trend per gated metric).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from patchbench import EXIT_ENV, EXIT_OK, EXIT_REGRESSION, EXIT_RUN_FAILED, EXIT_USAGE
from patchbench.history import (History, HistoryError, Key, Night, dump_json, night_from_run)
from patchbench.records import read_json, write_json, write_text

DEFAULT_HISTORY = "~/.cache/patchbench/history.sqlite"
HISTORY_ENV = "PATCHBENCH_HISTORY"
NIGHTLY_SCHEMA = 1

_UNIT_SUFFIXES = (("_tok_s", "tok/s"), ("_req_s", "req/s"), ("_ms", "ms"), ("_s", "s"),
                  ("_acc", "acc"), ("_count", "count"), ("_share", "share"), ("_pct", "%"))


# ---------------------------------------------------------------------------------------------
# settings


class Gate(BaseModel):
    """One gate of the ``nightly.gates`` list (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(description="suite.metric (e.g. serving.itl_p99_ms) or a bare metric name")
    direction: Literal["higher", "lower"] | None = Field(
        None, description="which way is better; default: the suite's METRICS / compare.json")
    threshold_pct: float = Field(gt=0, le=1000, description="smallest bad change that counts, %")
    require_ci_excludes_zero: bool = True
    consecutive_nights: int = Field(1, ge=1, le=60)
    against: Literal["same_run", "history", "both"] = "both"
    variants: list[str] | None = Field(None, description="only these variants (default: all)")

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if not re.fullmatch(r"([A-Za-z0-9_-]+\.)?[A-Za-z0-9_.%/-]+", v.strip()):
            raise ValueError("write suite.metric (e.g. serving.output_throughput_tok_s) or a "
                             "metric name")
        return v.strip()

    @property
    def suite(self) -> str | None:
        return self.metric.split(".", 1)[0] if "." in self.metric else None

    @property
    def metric_name(self) -> str:
        return self.metric.split(".", 1)[1] if "." in self.metric else self.metric


class NightlySettings(BaseModel):
    """The config's ``nightly:`` section (see the module docstring for every key)."""

    model_config = ConfigDict(extra="forbid")

    history_path: str = Field(DEFAULT_HISTORY, description="SQLite file outside the checkout")
    window_nights: int = Field(7, ge=1, le=365)
    min_history_nights: int = Field(2, ge=1, le=365)
    lock_timeout_s: float = Field(10.0, gt=0, le=3600)
    gates: list[Gate] = Field(default_factory=list)

    @model_validator(mode="after")
    def _window(self) -> "NightlySettings":
        if self.min_history_nights > self.window_nights:
            raise ValueError(f"min_history_nights ({self.min_history_nights}) is larger than "
                             f"window_nights ({self.window_nights})")
        return self


def history_path(settings: NightlySettings, cli_path: str | None = None) -> Path:
    """Where the history lives: ``--history`` > $PATCHBENCH_HISTORY > ``nightly.history_path``.

    ``~`` and ``$VARS`` are expanded; a relative path is taken from the current directory.
    """
    raw = cli_path or os.environ.get(HISTORY_ENV) or settings.history_path
    return Path(os.path.expandvars(os.path.expanduser(raw))).absolute()


# ---------------------------------------------------------------------------------------------
# gate evaluation


Status = Literal["pass", "warn", "fail", "skipped", "missing"]


@dataclass
class GateResult:
    """The outcome of one gate for one (kind, variant, suite, metric).

    kind: "same_run" (variant vs the baseline of this run) or "history" (tonight vs the last K
    nights). status: "fail" (a regression), "warn" (bad tonight, not yet on ``nights_needed``
    nights), "pass", "skipped" (not enough data to judge, e.g. too few nights, no interval),
    "missing" (the gate's metric or its direction is unknown: a config problem).
    value: tonight's median of the variant; reference: the baseline's median (same_run) or the
    median of the window's nightly medians (history); both in ``unit``. change_pct: percent,
    (value - reference) / |reference| * 100 (same_run: compare.json's change). ci_*_pct: the
    interval of the same-run change (percent); band_*: [min, max] of the window's repeat values.
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
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    ci_method: str | None = None
    band_low: float | None = None
    band_high: float | None = None
    n_history: int = 0
    window_run_ids: list[str] = field(default_factory=list)
    nights_held: int = 0
    nights_needed: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _suite_metric_info(suite: str, metric: str) -> Any:
    """The suite's MetricInfo for a metric, or None when the suite or the metric is unknown."""
    try:
        from patchbench.suite import load_suite
        return getattr(load_suite(suite), "METRICS", {}).get(metric)
    except Exception:  # a suite that does not import must not stop the gates
        return None


def metric_unit(suite: str, metric: str, nights: Sequence[Night] = ()) -> str:
    """Display unit: compare.json's / the history's, else the suite's METRICS, else the suffix."""
    for n in nights:
        if n.units.get((suite, metric)):
            return n.units[(suite, metric)]
    info = _suite_metric_info(suite, metric)
    if info is not None and getattr(info, "unit", None):
        return info.unit
    for suffix, unit in _UNIT_SUFFIXES:
        if metric.endswith(suffix):
            return unit
    return ""


def _better(gate: Gate, suite: str, metric: str, nights: Sequence[Night]) -> str | None:
    if gate.direction:
        return gate.direction
    for n in nights:
        b = n.better.get((suite, metric))
        if b in ("higher", "lower"):
            return b
    info = _suite_metric_info(suite, metric)
    b = getattr(info, "better", None)
    return b if b in ("higher", "lower") else None


def _worse(change_pct: float, better: str, threshold_pct: float) -> bool:
    """True when a change (percent) is at least ``threshold_pct`` in the bad direction."""
    return change_pct <= -threshold_pct if better == "higher" else change_pct >= threshold_pct


def _ci_bad(lo: float | None, hi: float | None, better: str) -> bool | None:
    """True when the interval lies entirely on the bad side of zero; None without an interval."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return hi < 0 if better == "higher" else lo > 0


def _fmt(x: float | None, nd: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}g}"


def _num(x: float | None, unit: str) -> str:
    """A value with its unit ("90 tok/s"), or "n/a"."""
    return f"{_fmt(x)} {unit}".rstrip() if x is not None else "n/a"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


def night_from_compare(compare: dict, *, config_name: str | None = None,
                       night_utc: str | None = None) -> Night:
    """A :class:`Night` from a compare.json dict alone (values = the repeats it lists)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / str(compare.get("run_id") or "run")
        run.mkdir()
        n = night_from_run(run, compare=compare)
    n.run_dir = None
    if config_name:
        n.config_name = config_name
    if night_utc:
        n.night_utc = night_utc
    return n


def _same_run_condition(night: Night, key: Key, better: str, gate: Gate) -> tuple[bool | None, str]:
    """(fired, why) for one night; fired None when the night has no usable effect."""
    c = night.comparisons.get(key)
    if c is None or c.change_pct is None:
        verdict = f" (verdict: {c.verdict})" if c is not None and c.verdict else ""
        return None, f"no same-run change in compare.json{verdict}"
    bad = _worse(c.change_pct, better, gate.threshold_pct)
    ci = _ci_bad(c.ci_low_pct, c.ci_high_pct, better)
    if not bad:
        return False, (f"change {_pct(c.change_pct)} is within the {gate.threshold_pct:g} % "
                       f"threshold")
    if gate.require_ci_excludes_zero:
        if ci is None:
            return None, (f"change {_pct(c.change_pct)} is beyond the threshold but has no "
                          f"interval (one repeat?); the gate requires one")
        if not ci:
            return False, (f"change {_pct(c.change_pct)} is beyond the threshold but its interval "
                           f"[{_pct(c.ci_low_pct)}, {_pct(c.ci_high_pct)}] includes zero (noise)")
    sign = "-" if better == "higher" else "+"
    ci_txt = (f", interval [{_pct(c.ci_low_pct)}, {_pct(c.ci_high_pct)}] excludes zero"
              if ci else "")
    return True, (f"change {_pct(c.change_pct)} beyond the {sign}{gate.threshold_pct:g} % "
                  f"threshold{ci_txt}")


@dataclass
class _HistCheck:
    fired: bool | None
    why: str
    reference: float | None = None
    change_pct: float | None = None
    band: tuple[float, float] | None = None
    window: list[Night] = field(default_factory=list)


def _history_condition(value: float | None, prior: Sequence[Night], key: Key, better: str,
                       gate: Gate, settings: NightlySettings) -> _HistCheck:
    """Is ``value`` a regression against the last K nights of ``prior`` (oldest first)?"""
    if value is None:
        return _HistCheck(None, "no value tonight")
    window = [n for n in prior if n.median(key) is not None][-settings.window_nights:]
    if len(window) < settings.min_history_nights:
        return _HistCheck(None, f"{len(window)} night(s) in the history, "
                                f"{settings.min_history_nights} needed", window=window)
    ref = statistics.median([n.median(key) for n in window])
    all_vals = [v for n in window for v in n.values.get(key, []) if v is not None]
    band = (min(all_vals), max(all_vals))
    if ref == 0:
        return _HistCheck(None, "the history's median is 0; no relative change", ref, None, band,
                          window)
    change = (value - ref) / abs(ref) * 100.0
    outside = value < band[0] if better == "higher" else value > band[1]
    if not _worse(change, better, gate.threshold_pct):
        return _HistCheck(False, f"{_pct(change)} vs the median of the last {len(window)} nights, "
                                 f"within the {gate.threshold_pct:g} % threshold", ref, change, band,
                          window)
    if not outside:
        return _HistCheck(False, f"{_pct(change)} vs the median of the last {len(window)} nights, "
                                 f"but inside their band [{_fmt(band[0])}, {_fmt(band[1])}] (noise)",
                          ref, change, band, window)
    return _HistCheck(True, f"{_pct(change)} vs the median {_fmt(ref)} of the last {len(window)} "
                            f"nights and outside their band [{_fmt(band[0])}, {_fmt(band[1])}]",
                      ref, change, band, window)


def _gate_keys(gate: Gate, tonight: Night) -> list[tuple[str, str]]:
    """(suite, metric) pairs of tonight's run that the gate names."""
    have = {(s, m) for (_v, s, m) in tonight.values} | {(s, m) for (_v, s, m) in tonight.comparisons}
    return sorted((s, m) for s, m in have
                  if m == gate.metric_name and (gate.suite is None or s == gate.suite))


def evaluate(history: History | Sequence[Night], run_compare: dict | Night,
             settings: NightlySettings) -> list[GateResult]:
    """Evaluate every gate of ``settings`` for tonight's run.

    history: an open :class:`History` (tonight's run itself, if already recorded, is left out) or
    the previous nights of the same config, oldest first. run_compare: tonight as a compare.json
    dict or a :class:`Night` (:func:`patchbench.history.night_from_run` reads one from a run
    folder, summaries included). Returns one :class:`GateResult` per (gate, kind, variant, suite,
    metric) that applies, or one "missing" result for a gate whose metric the run lacks. Reads
    only; raises :class:`HistoryError` when the history cannot be read.
    """
    tonight = run_compare if isinstance(run_compare, Night) else night_from_compare(run_compare)
    if isinstance(history, History):
        longest = max([g.consecutive_nights for g in settings.gates] or [1])
        # the consecutive checks judge earlier nights against their own windows: fetch enough
        prior = history.nights(tonight.config_name, before_utc=tonight.night_utc,
                               exclude_run_id=tonight.run_id,
                               limit=settings.window_nights + longest)
    else:
        prior = [n for n in history if n.run_id != tonight.run_id
                 and (not tonight.night_utc or not n.night_utc or n.night_utc < tonight.night_utc)]
        prior.sort(key=lambda n: (n.night_utc or "", n.run_id))
    nights_all = [tonight, *reversed(prior)]
    results: list[GateResult] = []
    for gate in settings.gates:
        kinds = ["same_run", "history"] if gate.against == "both" else [gate.against]
        keys = _gate_keys(gate, tonight)
        if not keys:
            have = sorted({f"{s}.{m}" for (_v, s, m) in tonight.values})
            for kind in kinds:
                results.append(GateResult(
                    gate.metric, kind, "*", gate.suite or "*", gate.metric_name, "missing",
                    f"metric '{gate.metric}' is not in this run; it has: "
                    f"{', '.join(have[:12]) or 'no metrics'}{' ...' if len(have) > 12 else ''}",
                    threshold_pct=gate.threshold_pct, nights_needed=gate.consecutive_nights))
            continue
        for suite, metric in keys:
            unit = metric_unit(suite, metric, nights_all)
            better = _better(gate, suite, metric, nights_all)
            variants = [v for v in tonight.variants
                        if gate.variants is None or v in gate.variants]
            if better is None:
                for kind in kinds:
                    results.append(GateResult(
                        gate.metric, kind, "*", suite, metric, "missing",
                        f"no direction known for {suite}.{metric} (descriptive metric?); set "
                        f"'direction: higher|lower' on the gate", unit=unit,
                        threshold_pct=gate.threshold_pct))
                continue
            common = dict(gate=gate.metric, suite=suite, metric=metric, unit=unit, better=better,
                          threshold_pct=gate.threshold_pct, nights_needed=gate.consecutive_nights)
            if "same_run" in kinds:
                for v in variants:
                    if v == tonight.baseline or v in tonight.aa_variants:
                        continue
                    results.append(_eval_same_run(gate, tonight, prior, (v, suite, metric),
                                                  better, common))
            if "history" in kinds:
                for v in variants:
                    results.append(_eval_history(gate, tonight, prior, (v, suite, metric), better,
                                                 settings, common))
    return results


def _eval_same_run(gate: Gate, tonight: Night, prior: Sequence[Night], key: Key, better: str,
                   common: dict) -> GateResult:
    c = tonight.comparisons.get(key)
    fired, why = _same_run_condition(tonight, key, better, gate)
    res = GateResult(kind="same_run", variant=key[0], status="pass", reason=why,
                     value=tonight.median(key), reference=tonight.median((tonight.baseline,) + key[1:]),
                     change_pct=c.change_pct if c else None, ci_low_pct=c.ci_low_pct if c else None,
                     ci_high_pct=c.ci_high_pct if c else None, ci_method=c.ci_method if c else None,
                     **common)
    if fired is None:
        res.status = "skipped"
        return res
    if not fired:
        return res
    held = 1
    for n in reversed(prior):
        if held >= gate.consecutive_nights:
            break
        ok, _ = _same_run_condition(n, key, better, gate)
        if not ok:
            break
        held += 1
    res.nights_held = held
    if held >= gate.consecutive_nights:
        res.status = "fail"
        if gate.consecutive_nights > 1:
            res.reason += f", on {held} nights in a row"
    else:
        res.status = "warn"
        res.reason += f"; held on {held} of the {gate.consecutive_nights} nights in a row needed"
    return res


def _eval_history(gate: Gate, tonight: Night, prior: Sequence[Night], key: Key, better: str,
                  settings: NightlySettings, common: dict) -> GateResult:
    """History gate. With ``consecutive_nights`` N > 1, tonight and the N-1 previous nights are
    each judged against the K nights BEFORE that streak (a streak's own bad nights would
    otherwise widen the band and hide the step)."""
    value = tonight.median(key)
    n_needed = gate.consecutive_nights
    having = [n for n in prior if n.median(key) is not None]
    streak = having[-(n_needed - 1):] if n_needed > 1 else []
    base = having[:len(having) - len(streak)]
    chk = _history_condition(value, base, key, better, gate, settings)
    res = GateResult(kind="history", variant=key[0], status="pass", reason=chk.why, value=value,
                     reference=chk.reference, change_pct=chk.change_pct,
                     band_low=chk.band[0] if chk.band else None,
                     band_high=chk.band[1] if chk.band else None, n_history=len(chk.window),
                     window_run_ids=[n.run_id for n in chk.window], **common)
    if chk.fired is None:
        res.status = "skipped"
        return res
    if not chk.fired:
        return res
    held = 1
    for night in reversed(streak):
        if not _history_condition(night.median(key), base, key, better, gate, settings).fired:
            break
        held += 1
    res.nights_held = held
    if held >= n_needed:
        res.status = "fail"
        if n_needed > 1:
            res.reason += f", on {held} nights in a row"
    else:
        res.status = "warn"
        res.reason += f"; held on {held} of the {n_needed} nights in a row needed"
    return res


# ---------------------------------------------------------------------------------------------
# outputs


def render_markdown(tonight: Night, results: list[GateResult], *, exit_code: int,
                    headline: str, history_info: dict, problems: list[str],
                    plots: list[str]) -> str:
    """nightly.md: the verdict first, failing gates with their numbers, then every gate."""
    failing = [r for r in results if r.status == "fail"]
    lines = [f"# Nightly {tonight.config_name}: {headline}", ""]
    lines.append(f"Run `{tonight.run_id}` · night {tonight.night_utc} · commit "
                 f"`{(tonight.git_sha or 'unknown')[:12]}` · sglang {tonight.sglang_version or '?'}"
                 f" · exit code {exit_code}")
    lines.append("")
    if problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in problems] + [""]
    if failing:
        lines += ["## Regressions", ""]
        for r in failing:
            lines.append(f"- **{r.suite}.{r.metric}** ({r.variant}, {r.kind.replace('_', '-')}): "
                         f"{_num(r.value, r.unit)} vs {_num(r.reference, r.unit)}; {r.reason}")
        lines.append("")
    if results:
        lines += ["## Gates", "",
                  "| gate | variant | tonight | reference | change | interval / band | "
                  "threshold | status |",
                  "|---|---|---:|---:|---:|---|---:|---|"]
        for r in results:
            if r.kind == "same_run":
                spread = (f"CI [{_pct(r.ci_low_pct)}, {_pct(r.ci_high_pct)}]"
                          if r.ci_low_pct is not None else "no CI")
            else:
                spread = (f"band [{_fmt(r.band_low)}, {_fmt(r.band_high)}] ({r.n_history} nights)"
                          if r.band_low is not None else f"{r.n_history} nights")
            mark = {"fail": "❌ fail", "warn": "⚠️ warn", "pass": "✅ pass"}.get(r.status, r.status)
            lines.append(f"| {r.suite}.{r.metric} ({r.kind.replace('_', '-')}) | {r.variant} | "
                         f"{_num(r.value, r.unit)} | {_num(r.reference, r.unit)} | {_pct(r.change_pct)} | "
                         f"{spread} | {_fmt(r.threshold_pct)} % | {mark} |")
        lines.append("")
        notes = [r for r in results if r.status in ("warn", "skipped", "missing")]
        if notes:
            lines += ["<details><summary>Notes on gates that did not pass cleanly</summary>", ""]
            lines += [f"- {r.suite}.{r.metric} ({r.variant}, {r.kind}): {r.status}: {r.reason}"
                      for r in notes]
            lines += ["", "</details>", ""]
    else:
        lines += ["No gates are configured (`nightly.gates` in the config).", ""]
    lines.append(f"History: `{history_info.get('path')}` · "
                 f"{'recorded' if history_info.get('recorded') else 'NOT recorded'} · "
                 f"{history_info.get('nights_before', 0)} earlier night(s) of this config")
    if history_info.get("error"):
        lines.append(f"\nHistory error: {history_info['error']}")
    if plots:
        lines += ["", "Trend plots (in the run artifact): " + ", ".join(f"`{p}`" for p in plots)]
    return "\n".join(lines) + "\n"


def plot_trend(prior: Sequence[Night], tonight: Night, suite: str, metric: str,
               results: list[GateResult], settings: NightlySettings):
    """A matplotlib Figure: per variant, the nightly medians of the history, the band of the last
    K nights, and tonight's point (red edge when a gate failed). x: night (UTC), y: the metric in
    its unit. Returns the Figure (the caller saves and closes it)."""
    import matplotlib
    matplotlib.use("Agg")
    from datetime import datetime

    import matplotlib.pyplot as plt

    def _dt(s: str):
        return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")

    unit = metric_unit(suite, metric, [tonight, *prior])
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, variant in enumerate(tonight.variants):
        key = (variant, suite, metric)
        col = colors[i % len(colors)]
        hist = [n for n in prior if n.median(key) is not None]
        if hist:
            ax.plot([_dt(n.night_utc) for n in hist], [n.median(key) for n in hist], "o-",
                    color=col, ms=4, lw=1, alpha=0.8, label=f"{variant}: nightly median")
        window = hist[-settings.window_nights:]
        vals = [v for n in window for v in n.values.get(key, []) if v is not None]
        if len(window) >= 1 and vals:
            x0, x1 = _dt(window[0].night_utc), _dt(tonight.night_utc)
            ax.fill_between([x0, x1], [min(vals)] * 2, [max(vals)] * 2, color=col, alpha=0.15,
                            label=f"{variant}: band of last {len(window)} nights")
        value = tonight.median(key)
        if value is not None:
            failed = any(r.status == "fail" and r.variant == variant and r.suite == suite
                         and r.metric == metric for r in results)
            ax.plot([_dt(tonight.night_utc)], [value], marker="*", ms=14, color=col,
                    markeredgecolor="red" if failed else "black", linestyle="none",
                    label=f"{variant}: tonight{' (REGRESSION)' if failed else ''}")
    ax.set_title(f"{suite}.{metric}: nightly trend ({tonight.config_name})")
    ax.set_xlabel("night (UTC)")
    ax.set_ylabel(f"{metric} [{unit}]" if unit else metric)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    import matplotlib.dates as mdates
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
    fig.autofmt_xdate()
    fig.text(0.99, 0.01, f"run {tonight.run_id}", ha="right", va="bottom", fontsize=7,
             color="gray")
    fig.tight_layout()
    return fig


def _write_plots(run_dir: Path, prior: Sequence[Night], tonight: Night,
                 results: list[GateResult], settings: NightlySettings) -> tuple[list[str], list[str]]:
    import matplotlib
    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    from patchbench.records import write_bytes

    done, problems = [], []
    for suite, metric in sorted({(r.suite, r.metric) for r in results if r.status != "missing"}):
        rel = f"plots/nightly-{suite}.{metric}.png"
        try:
            fig = plot_trend(prior, tonight, suite, metric, results, settings)
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            plt.close(fig)
            write_bytes(run_dir / rel, buf.getvalue())
            done.append(rel)
        except Exception as e:  # a plot must never hide the verdict
            problems.append(f"trend plot {rel} failed: {type(e).__name__}: {e}")
    return done, problems


# ---------------------------------------------------------------------------------------------
# the job


@dataclass
class NightlyOutcome:
    """What :func:`nightly_on_run` did: exit code, gate results, the files it wrote."""

    exit_code: int
    results: list[GateResult]
    night: Night | None
    summary_path: Path | None = None
    json_path: Path | None = None
    problems: list[str] = field(default_factory=list)


def _settings_from_manifest(run_dir: Path) -> NightlySettings | None:
    try:
        m = read_json(run_dir / "manifest.json")
    except (OSError, ValueError):
        return None
    cfg = m.get("config") if isinstance(m, dict) else None
    if isinstance(cfg, dict) and isinstance(cfg.get("nightly"), dict):
        return NightlySettings.model_validate(cfg["nightly"])
    return None


def _ensure_compare(run_dir: Path, compare_settings: Any) -> tuple[dict | None, str | None]:
    """compare.json of the run, made by patchbench.compare.compare_run when missing."""
    path = run_dir / "compare.json"
    if not path.is_file():
        try:
            from patchbench import compare as cmp
        except ImportError as e:
            return None, f"no compare.json and patchbench.compare cannot be imported ({e})"
        try:
            settings = compare_settings  # None: the run's own compare: section
            if isinstance(settings, dict):
                model = getattr(cmp, "CompareSettings", None)
                settings = model.model_validate(settings) if model else None
            cmp.compare_run(run_dir, settings)
        except Exception as e:
            return None, (f"no compare.json, and compare_run failed: {type(e).__name__}: {e}\n"
                          + traceback.format_exc(limit=3))
        if not path.is_file():
            return None, "compare_run did not write compare.json"
    try:
        return read_json(path), None
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable: {e}"


def nightly_on_run(run_dir: str | os.PathLike, settings: NightlySettings, *,
                   history: str | os.PathLike | None = None, compare_settings: Any = None,
                   record: bool = True, run_problems: Sequence[str] = (),
                   out: Any = None) -> NightlyOutcome:
    """Record a finished run folder in the history, evaluate the gates, write the outputs.

    run_dir: the run folder (CONTRACTS.md); history: the SQLite path (default
    :func:`history_path`); compare_settings: for compare_run when compare.json is missing;
    run_problems: failures the runner reported (they make the exit code 4).
    Writes RUN/nightly.md, RUN/nightly.json, RUN/plots/nightly-*.png. Never raises for a history
    problem: the night stays in the folder and ``--record-only RUN_DIR`` appends it later.
    """
    out = out or sys.stdout
    run = Path(run_dir)
    problems = list(run_problems)
    hpath = Path(history) if history else history_path(settings)
    compare, cmp_err = _ensure_compare(run, compare_settings)
    if cmp_err:
        problems.append(cmp_err)
    try:
        tonight = night_from_run(run, compare=compare)
    except (OSError, ValueError) as e:
        print(f"nightly: cannot read the run folder: {e}", file=sys.stderr)
        return NightlyOutcome(EXIT_RUN_FAILED, [], None, problems=problems + [str(e)])
    problems += tonight.problems
    if not tonight.values:
        problems.append(f"{run}: no metrics in the run folder (no summary.json with status ok)")
    hinfo: dict[str, Any] = {"path": str(hpath), "recorded": False, "nights_before": 0,
                             "error": None}
    prior: list[Night] = []
    results: list[GateResult] = []
    history_failed = False
    try:
        with History(hpath, timeout_s=settings.lock_timeout_s) as h:
            if record and tonight.values:
                added = h.record(tonight)
                hinfo["recorded"] = True
                hinfo["already_recorded"] = not added
            longest = max([g.consecutive_nights for g in settings.gates] or [1])
            prior = h.nights(tonight.config_name, before_utc=tonight.night_utc,
                             exclude_run_id=tonight.run_id,
                             limit=max(settings.window_nights + longest, 60))
            hinfo["nights_before"] = len(prior)
    except HistoryError as e:
        history_failed = True
        hinfo["error"] = str(e)
        problems.append(f"history unavailable: {e}. Tonight's results are kept in {run}; append "
                        f"them later with: runner.py nightly --record-only {run} --history {hpath}")
    # gates: with no history, the same-run gates still run (history gates are then skipped)
    results = evaluate(prior, tonight, settings)
    if history_failed:
        for r in results:
            if r.kind == "history" and r.status == "skipped":
                r.reason = "history unavailable (see problems)"
    plots, plot_problems = _write_plots(run, prior, tonight, results, settings) if results else ([], [])
    problems += plot_problems
    failing = [r for r in results if r.status == "fail"]
    missing = [r for r in results if r.status == "missing"]
    run_failed = bool(run_problems) or bool(tonight.problems) or bool(cmp_err) or not tonight.values
    if run_failed:
        code, headline = EXIT_RUN_FAILED, "RUN FAILED"
    elif history_failed:
        code, headline = EXIT_ENV, "HISTORY UNAVAILABLE"
    elif missing:
        code, headline = EXIT_USAGE, "GATE CONFIG ERROR"
    elif failing:
        code, headline = EXIT_REGRESSION, f"REGRESSION ({len(failing)} gate result(s) failed)"
    else:
        code, headline = EXIT_OK, "no regression"
    if failing and code != EXIT_REGRESSION:
        headline += f", and {len(failing)} regression(s)"
    md = render_markdown(tonight, results, exit_code=code, headline=headline, history_info=hinfo,
                         problems=problems, plots=plots)
    summary_path = write_text(run / "nightly.md", md)
    json_path = write_json(run / "nightly.json", {
        "schema": NIGHTLY_SCHEMA, "run_id": tonight.run_id, "night_utc": tonight.night_utc,
        "config_name": tonight.config_name, "git_sha": tonight.git_sha,
        "exit_code": code, "headline": headline, "history": hinfo,
        "settings": settings.model_dump(mode="json"),
        "failing": [r.to_json() for r in failing], "gates": [r.to_json() for r in results],
        "problems": problems, "plots": plots, "night": dump_json(tonight)})
    print(f"nightly: {headline} (exit {code}); summary {summary_path}", file=out)
    for r in failing:
        print(f"  REGRESSION {r.suite}.{r.metric} [{r.variant}, {r.kind}]: {_fmt(r.value)} {r.unit}"
              f" vs {_fmt(r.reference)} {r.unit}: {r.reason}", file=out)
    for p in problems:
        print(f"  problem: {p.splitlines()[0]}", file=out)
    return NightlyOutcome(code, results, tonight, summary_path, json_path, problems)


def record_only(run_dir: str | os.PathLike, history: str | os.PathLike,
                timeout_s: float = 10.0, out: Any = None) -> int:
    """Append a finished run folder to the history (no gates). Exit 0, or 3 (history error),
    4 (the folder holds no metrics)."""
    out = out or sys.stdout
    try:
        night = night_from_run(run_dir)
    except (OSError, ValueError) as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    if not night.values:
        print(f"nightly: {run_dir}: no metrics to record (no summary.json with status ok)",
              file=sys.stderr)
        return EXIT_RUN_FAILED
    try:
        with History(history, timeout_s=timeout_s) as h:
            added = h.record(night)
    except HistoryError as e:
        print(f"nightly: history unavailable: {e}", file=sys.stderr)
        return EXIT_ENV
    print(f"nightly: {'recorded' if added else 'already recorded'} {night.run_id} "
          f"({len(night.values)} metric series) in {history}", file=out)
    return EXIT_OK


def _load(config: str) -> tuple[Any, NightlySettings]:
    from patchbench.config import load_config
    cfg = load_config(config)
    return cfg, NightlySettings.model_validate(cfg.nightly or {})


def cli(argv: list[str]) -> int:
    """``runner.py nightly ...`` (see the module docstring). Returns the exit code."""
    p = argparse.ArgumentParser(prog="runner.py nightly", description=__doc__.split("\n")[0])
    p.add_argument("config", nargs="?", help="the experiment config (YAML)")
    p.add_argument("--history", help=f"SQLite history file (default: ${HISTORY_ENV}, else the "
                                     f"config's nightly.history_path, else {DEFAULT_HISTORY})")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from-run", metavar="RUN_DIR", help="gate a finished run folder; run nothing")
    g.add_argument("--record-only", metavar="RUN_DIR",
                   help="only append a finished run folder to the history")
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    from patchbench.config import ConfigError

    cfg = None
    settings: NightlySettings | None = None
    if a.config:
        try:
            cfg, settings = _load(a.config)
        except ConfigError as e:
            print(f"nightly: {e}", file=sys.stderr)
            return EXIT_USAGE
    folder = a.from_run or a.record_only
    if folder:
        if not Path(folder).is_dir():
            print(f"nightly: {folder}: no such run folder", file=sys.stderr)
            return EXIT_USAGE
        settings = settings or _settings_from_manifest(Path(folder)) or NightlySettings()
        hpath = history_path(settings, a.history)
        if a.record_only:
            return record_only(folder, hpath, settings.lock_timeout_s)
        return nightly_on_run(folder, settings, history=hpath,
                              compare_settings=cfg.compare if cfg else None).exit_code
    if not a.config:
        p.print_usage(sys.stderr)
        print("runner.py nightly: give a CONFIG (or --from-run / --record-only RUN_DIR)",
              file=sys.stderr)
        return EXIT_USAGE
    assert settings is not None and cfg is not None
    hpath = history_path(settings, a.history)
    try:
        from patchbench import bench
    except ImportError as e:
        print(f"nightly: the runner (patchbench.bench) cannot be imported: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    env_error = getattr(bench, "EnvironmentNotReady", None)
    run_error = getattr(bench, "RunFailed", None)
    run_problems: list[str] = []
    try:
        run_dir = bench.run_bench(a.config)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # sorted below: environment (3) or run failure (4)
        if env_error is not None and isinstance(e, env_error):
            print(f"nightly: environment not ready: {e}", file=sys.stderr)
            return EXIT_ENV
        patch_error = getattr(bench, "PatchProblem", None)
        if isinstance(e, ConfigError) or (patch_error is not None and isinstance(e, patch_error)):
            print(f"nightly: {e}", file=sys.stderr)
            return EXIT_USAGE
        known = run_error is not None and isinstance(e, run_error)
        print(f"nightly: the run failed: {type(e).__name__}: {e}", file=sys.stderr)
        if not known:
            traceback.print_exc()
        run_dir = getattr(e, "run_dir", None)
        if not run_dir or not Path(run_dir).is_dir():
            return EXIT_RUN_FAILED
        run_problems.append(f"the run failed: {type(e).__name__}: {e}")
    outcome = nightly_on_run(run_dir, settings, history=hpath, compare_settings=cfg.compare,
                             run_problems=run_problems)
    return outcome.exit_code


__all__ = ["NightlySettings", "Gate", "GateResult", "NightlyOutcome", "evaluate",
           "nightly_on_run", "record_only", "history_path", "plot_trend", "render_markdown",
           "night_from_compare", "cli", "DEFAULT_HISTORY", "HISTORY_ENV"]
