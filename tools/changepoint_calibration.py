#!/usr/bin/env python3
"""Calibrate the nightly change points (patchbench/nightly/changepoints.py) on seeded synthetic
histories, and compare them with plain PELT (``--detector legacy``: no outlier rule, means).

A history is 90 nights (a quarter) of nightly levels (log), lognormal noise of ``noise`` (the
sigma of one night's level: 1.5 % and 3 %; 5 runs of 1.5 % run noise give 0.67 %, so this is the
harder case), and, by scenario:

- step: one step of 3, 5, 10, 20, 35 or 50 % (up or down) on a night drawn uniformly from
  10 .. 87, or (15 % each) on the second-newest or the newest night, plus 0-2 one-night spikes
  (x2 .. x6, up or down) anywhere but the step's night and the newest night;
- quiet: no step, 0-3 one-night spikes (x2 .. x6);
- drift: a decline of 0.3 % a night over the last 30 nights, 0-2 spikes.

The detector runs once on the whole history (tonight's view). A step counts as found when a
change starts within one night of it and its size (percent) is within a third of the true
step's. False change points per quarter: confirmed changes on a quiet history (tonight's view),
and, with ``--nightly``, the distinct confirmed changes over every night's run of the quarter
(as the job records them; a change within one night of one already counted is the same) plus
the "new tonight" alerts on nights that were neither a step nor a spike, and how many of those
false changes were first seen on a history of at most :data:`EARLY` nights.

    .venv/bin/python tools/changepoint_calibration.py [--series 200] [--seed 35]
        [--detector new|legacy|both] [--nightly] [--beta B] [--noise 1.5 3]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from patchbench.nightly import changepoints as cp  # noqa: E402

NIGHTS = 90
SIZES_PCT = (3, 5, 10, 20, 35, 50)
NOISES = (0.015, 0.03)
SPIKES = (2.0, 3.0, 4.0, 5.0, 6.0)
#: a false change first seen on a history this short or shorter counts as early
EARLY = 20


@dataclass
class History:
    """One synthetic history: ``levels`` (log, oldest first), the step's night ``at`` and size
    ``step_pct`` (None: no step), ``spikes`` (nights of one-night excursions)."""

    levels: np.ndarray
    at: int | None
    step_pct: float | None
    spikes: list[int]


def make_history(
    rng: np.random.Generator,
    noise: float,
    *,
    step_pct: float | None = None,
    spikes: int = 0,
    drift: float = 0.0,
    n: int = NIGHTS,
) -> History:
    """A history (module docstring). step_pct: signed percent; its night is drawn here."""
    x = rng.normal(0.0, noise, n)
    at = None
    if step_pct is not None:
        u = rng.random()
        at = n - 1 if u < 0.15 else n - 2 if u < 0.3 else int(rng.integers(10, n - 2))
        x[at:] += math.log1p(step_pct / 100.0)
    if drift:
        x[n - 30 :] -= drift * np.arange(1, 31)
    free = [i for i in range(n - 1) if i != at]
    where = sorted(int(i) for i in rng.choice(free, size=spikes, replace=False)) if spikes else []
    for i in where:
        x[i] += math.log(float(rng.choice(SPIKES))) * float(rng.choice([-1.0, 1.0]))
    return History(x, at, step_pct, where)


def legacy_changes(levels: np.ndarray, sigma: float) -> list[cp.Change]:
    """Plain PELT, the nightly detector's first form, for comparison: PELT (l2) with penalty
    ``8 log n``, segments of 3+ nights, same-direction breakpoints under 10 nights apart merged,
    sizes from the segments' means."""
    import ruptures as rpt

    x = np.asarray(levels, dtype=float)
    if x.size < 10 or not (math.isfinite(sigma) and sigma > 0):
        return []
    z = ((x - np.median(x)) / sigma).reshape(-1, 1)
    bk = [int(b) for b in rpt.KernelCPD(kernel="linear", min_size=3).fit(z).predict(
        pen=8.0 * math.log(x.size))[:-1]]  # fmt: skip
    edges = [0, *bk, x.size]
    means = [float(x[a:b].mean()) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    out: list[cp.Change] = []
    for i, b in enumerate(bk):
        up = means[i + 1] > means[i]
        last = out[-1] if out else None
        if last is not None and b - last.end < 10 and (last.after > last.before) == up:
            last.end, last.after = b, means[i + 1]
        else:
            out.append(cp.Change(b, b, means[i], means[i + 1]))
    return out


def detect(levels: np.ndarray, detector: str, beta: float | None = None) -> list[cp.Change]:
    """The changes of a history by ``detector`` ("new": the shipped one; "legacy")."""
    sigma = cp.series_sigma(levels)
    if detector == "legacy":
        return legacy_changes(levels, sigma)
    return cp.changes(levels, sigma, cp.BETA if beta is None else beta)


def found(h: History, changes: list[cp.Change]) -> bool:
    """The step was found: a change starts within one night of it, its size within a third."""
    assert h.at is not None and h.step_pct is not None
    return any(
        abs(c.start - h.at) <= 1 and abs(c.size_pct - h.step_pct) <= abs(h.step_pct) / 3
        for c in changes
    )


@dataclass
class Row:
    """One noise level's results: ``found[size]``, the share of steps of that size found (both
    signs, every position); ``found_all``; ``found_last``: of steps on the newest night, and the
    share of those reported unconfirmed; ``false_quiet``: confirmed changes per quiet quarter;
    ``false_nightly``: distinct confirmed changes over every night's run of a quiet quarter;
    ``early``: the share of those first seen on a history of at most :data:`EARLY` nights;
    ``alerts``: "new tonight" alerts per quiet quarter on nights with no spike; ``drift``: share
    of drifting histories with a change starting in the drift (None where not run)."""

    noise: float
    found: dict[float, float]
    found_all: float
    found_last: float
    last_unconfirmed: float
    false_quiet: float
    false_nightly: float | None
    early: float | None
    alerts: float | None
    drift: float


def calibrate(
    noise: float,
    series: int,
    seed: int,
    detector: str = "new",
    *,
    nightly: bool = False,
    beta: float | None = None,
    sizes: tuple[float, ...] = SIZES_PCT,
) -> Row:
    """``series`` step histories per size (percent) and ``series`` quiet and drift histories at
    ``noise``."""
    rng = np.random.default_rng(seed)
    hits: dict[float, list[bool]] = {s: [] for s in sizes}
    last, last_unc = [], []
    for size in sizes:
        for _ in range(series):
            sign = float(rng.choice([-1.0, 1.0]))
            h = make_history(rng, noise, step_pct=sign * size, spikes=int(rng.integers(0, 3)))
            ch = detect(h.levels, detector, beta)
            hits[size].append(found(h, ch))
            if h.at == NIGHTS - 1:
                last.append(hits[size][-1])
                last_unc.append(any(c.start == h.at and not c.confirmed for c in ch))
    false_q, false_n, first, alerts, drift = [], [], [], [], []
    for _ in range(series):
        h = make_history(rng, noise, spikes=int(rng.integers(0, 4)))
        false_q.append(sum(c.confirmed for c in detect(h.levels, detector, beta)))
        if nightly:
            seen: list[int] = []
            alert = 0
            for t in range(cp.MIN_NIGHTS, NIGHTS + 1):
                for c in detect(h.levels[:t], detector, beta):
                    if not c.confirmed:
                        alert += c.start == t - 1 and c.start not in h.spikes
                    elif not any(abs(c.start - s) <= 1 for s in seen):
                        seen.append(c.start)
                        first.append(t)
            false_n.append(len(seen))
            alerts.append(alert)
        d = make_history(rng, noise, drift=0.003, spikes=int(rng.integers(0, 3)))
        drift.append(any(c.end >= NIGHTS - 31 for c in detect(d.levels, detector, beta)))
    every = [v for s in sizes for v in hits[s]]
    return Row(
        noise,
        {s: float(np.mean(v)) for s, v in hits.items()},
        float(np.mean(every)),
        float(np.mean(last)) if last else math.nan,
        float(np.mean(last_unc)) if last_unc else math.nan,
        float(np.mean(false_q)),
        float(np.mean(false_n)) if nightly else None,
        float(np.mean(np.array(first) <= EARLY)) if first else None,
        float(np.mean(alerts)) if nightly else None,
        float(np.mean(drift)),
    )


def table(rows: list[tuple[str, Row]]) -> str:
    """The markdown table of ``rows`` ((detector, Row))."""
    head = (
        "| detector | noise | "
        + " | ".join(f"{s:g} %" for s in rows[0][1].found)
        + " | all steps | newest night (unconfirmed) | false / quiet quarter | "
        "false / quarter, every night | new-tonight alerts / quarter | drift flagged |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in rows:
        opt = (
            ("n/a", "n/a")
            if r.false_nightly is None
            else (f"{r.false_nightly:.3f}", f"{r.alerts:.3f}")
        )
        lines.append(
            f"| {name} | {100 * r.noise:g} % | "
            + " | ".join(f"{100 * v:.0f} %" for v in r.found.values())
            + f" | {100 * r.found_all:.1f} % | {100 * r.found_last:.0f} % "
            f"({100 * r.last_unconfirmed:.0f} %) | {r.false_quiet:.3f} | {opt[0]} | {opt[1]} | "
            f"{100 * r.drift:.0f} % |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=200, help="histories per step size and kind")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--detector", choices=("new", "legacy", "both"), default="both")
    ap.add_argument("--nightly", action="store_true", help="also run every night of quiet quarters")
    ap.add_argument("--beta", type=float, default=None, help="penalty factor (default: shipped)")
    ap.add_argument(
        "--sizes", type=float, nargs="+", default=SIZES_PCT, help="step sizes, %% (both signs)"
    )
    ap.add_argument(
        "--noise", type=float, nargs="+", default=[100 * v for v in NOISES], help="level noise, %%"
    )
    a = ap.parse_args(argv)
    names = ("legacy", "new") if a.detector == "both" else (a.detector,)
    rows = [
        (
            name,
            calibrate(
                noise, a.series, a.seed, name, nightly=a.nightly, beta=a.beta, sizes=tuple(a.sizes)
            ),
        )
        for name in names
        for noise in [v / 100 for v in a.noise]
    ]
    print(
        f"steps found (start within one night, size within a third); {a.series} histories "
        f"per size and kind, seed {a.seed}, beta {cp.BETA if a.beta is None else a.beta}\n"
    )
    print(table(rows))
    for noise in a.noise:
        steps = ", ".join(f"{s:g} % = {math.log1p(s / 100) / noise * 100:.1f}" for s in a.sizes)
        print(f"\nthe steps in night sigmas at {noise:g} %: {steps}")
    for name, r in rows:
        if r.early is not None:
            print(
                f"\n{name}, {100 * r.noise:g} %: {100 * r.early:.0f} % of the every-night false "
                f"changes were first seen on a history of at most {EARLY} nights"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
