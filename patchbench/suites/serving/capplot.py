"""The capacity figure (docs/serving.md, "Capacity at the SLO"): attainment against concurrency per
arm, every probe of every round, the target and each arm's capacity with its interval; drawn
from the comparison alone (the capacity rows and the pair entries of
:func:`.capacity.pair_capacity`), as ``plots/capacity.png`` and as a panel of the PR figure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from patchbench.suite import comparison_get, suite_pairs, suite_rows
from patchbench.suites import new_figure, save_titled

from .capacity import CAPACITY, CapacityPair, arm_interval


def _capacity_rows(comparison: Any) -> dict[str, dict[str, Any]]:
    """{variant: its capacity row as a dict}."""
    return {r["variant"]: r for r in suite_rows(comparison, "serving") if r["metric"] == CAPACITY}


def _arms(comparison: Any) -> tuple[float, list[tuple[str, list, list[float]]]] | None:
    """(target, [(arm name, its rounds, its capacities over rounds)]): the baseline (from the
    first variant's pair entry) then each variant; None without a capacity pair entry."""
    pairs = {
        v: CapacityPair.model_validate(p)
        for v, p in suite_pairs(comparison, "serving").items()
        if "target" in p
    }
    if not pairs:
        return None
    rows = _capacity_rows(comparison)
    first = next(iter(pairs))

    def values(v: str, key: str) -> list[float]:
        return [x for x in (rows.get(v) or {}).get(key, []) if x is not None]

    base = comparison_get(comparison, "baseline", "baseline")
    arms = [(base, pairs[first].baseline, values(first, "baseline_repeats"))]
    arms += [(v, p.variant, values(v, "variant_repeats")) for v, p in pairs.items()]
    return pairs[first].target, arms


def draw_capacity(ax: Any, comparison: Any) -> bool:
    """Draw the capacity panel on ``ax``: per arm (colour) each round's probes joined in load
    order (filled: met the target, hollow: failed; a cross on the target line: a client-bound
    probe, not judged), the target share dashed, each arm's capacity
    (geometric mean over its rounds) as a vertical line with its t interval on the logs as a
    band, or with one round its bracket; False (nothing drawn) without capacity probes."""
    from matplotlib.ticker import FuncFormatter

    got = _arms(comparison)
    if got is None:
        return False
    target, arms = got
    conf = float((comparison_get(comparison, "settings", {}) or {}).get("confidence", 0.95))
    bound_seen = False
    for j, (name, rounds, caps) in enumerate(arms):
        colour = f"C{j}"
        for r in rounds:
            pts = sorted(r.probes)
            if pts:
                ax.plot(*zip(*pts, strict=True), "-", color=colour, lw=0.8, alpha=0.5)
            for load, score in pts:
                face = colour if score >= target else "white"
                ax.plot([load], [score], "o", color=colour, mfc=face, ms=5)
            if r.client_bound is not None:  # not judged: drawn on the target line
                ax.plot([r.client_bound], [target], "x", color=colour, ms=8, mew=2)
                bound_seen = True
        label = f"{name}: no capacity"
        if caps:
            gm, lo, hi = arm_interval(caps, conf)
            if lo is None and len(rounds) == 1 and None not in (rounds[0].lo, rounds[0].hi):
                lo, hi = rounds[0].lo, rounds[0].hi
            ax.axvline(gm, color=colour, lw=1.5)
            band = "" if lo is None else f" [{lo:.3g}, {hi:.3g}]"
            if lo is not None:
                ax.axvspan(lo, hi, color=colour, alpha=0.12, lw=0)
            label = f"{name}: capacity {gm:.3g}{band}, {len(caps)} rounds"
        ax.plot([], [], "o-", color=colour, label=label)
    ax.axhline(target, color="black", ls="--", lw=1, label=f"target {target * 100:g} %")
    if bound_seen:
        ax.plot([], [], "x", color="black", label="client-bound probe (not judged)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    loads = [c for _n, rounds, _c in arms for r in rounds for c, _s in r.probes]
    loads += [r.client_bound for _n, rounds, _c in arms for r in rounds if r.client_bound]
    if loads:  # the probes' range: a wide interval (2 rounds: t(0.975, 1) = 12.7) runs off it
        ax.set_xlim(min(loads) / 1.5, max(loads) * 1.5)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("concurrency (log scale)", fontsize=8)
    ax.set_ylabel("share of requests meeting the SLO", fontsize=8)
    ax.set_title("Attainment against load (hollow: below target)", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower left")
    return True


def plot_capacity(comparison: Any, out: Path) -> Path | None:
    """``capacity.png``: :func:`draw_capacity` alone; None without capacity probes."""
    if _arms(comparison) is None:
        return None
    fig, (ax,) = new_figure(4.8)
    draw_capacity(ax, comparison)
    return save_titled(fig, out, comparison, "Capacity at the SLO per arm, every probe")


def pr_panels(comparison: Any) -> list[Callable[[Any], Any]]:
    """The PR figure's capacity panel (:func:`draw_capacity`) when a capacity row is a primary."""
    primary = any(r["primary"] for r in _capacity_rows(comparison).values())
    return [lambda ax: draw_capacity(ax, comparison)] if primary else []
