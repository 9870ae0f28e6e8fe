"""The report's words and numbers: verdict marks, values, changes and intervals as text.

Shared by report.md, report-details.md, the console summary and ``patchbench comment``; the
verdict words are those of :data:`VERDICT_MARK` in every place.
"""

from __future__ import annotations

from patchbench.analysis.comparison import Row

VERDICT_MARK = {
    "regressed": "🔴 regressed",
    "improved": "🟢 improved",
    "equivalent": "🔵 equivalent",
    "inconclusive": "⚪ inconclusive",
    "incomplete": "⚪ incomplete",
}
FOLD_LINES = 15


def fmt_value(x: float | None) -> str:
    """A number for a table: 4 significant digits, thousands grouped; "n/a" for None."""
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def fmt_bounded(x: float | None, bound: str | None) -> str:
    """:func:`fmt_value` with "≥" / "≤" in front when the value is only a lower / upper bound."""
    return {"lower": "≥", "upper": "≤"}.get(bound or "", "") + fmt_value(x)


def shown_value(r: Row, arm: str) -> str:
    """The value of ``arm`` ("baseline" or "variant") a table shows, from the estimator of the
    row's change (:class:`~patchbench.analysis.comparison.Row`: geometric means of paired repeats for run
    rows): accuracy in percent ("41.3%", so that the two values differ by the change in points),
    other rows by :func:`fmt_bounded`."""
    x = r.baseline_value if arm == "baseline" else r.variant_value
    if r.kind == "accuracy" and r.change_unit == "pt" and x is not None:
        return f"{100 * x:.1f}%"
    return fmt_bounded(x, r.baseline_bound if arm == "baseline" else r.variant_bound)


def values_txt(r: Row) -> str:
    """A deterministic row's two values, bounds marked: "507 -> 90", "507 -> ≥6"."""
    return f"{shown_value(r, 'baseline')} -> {shown_value(r, 'variant')}"


def exactness(r: Row) -> str:
    """How a deterministic row's values are known: "a bound" when either value is only a bound,
    "exact" when shown exact (every arm measured at least twice with no spread, or the suite's
    test proves the value deterministic: ``Row.exact_by``), else "one measurement per arm";
    "no values" when either arm has none (its cells failed)."""
    if r.baseline_value is None or r.variant_value is None:
        return "no values"
    if r.baseline_bound or r.variant_bound:
        return "a bound"
    return "exact" if r.exact_by else "one measurement per arm"


def fmt_change(x: float | None, unit: str) -> str:
    """A change in its unit: "+20.1%", "+0.1 pt", "-2 count"; "n/a" for None."""
    if x is None:
        return "n/a"
    if x == 0 or (unit in ("%", "pt") and round(x, 1) == 0):
        x = 0.0  # "+0.0", never "-0.0", for a change that rounds to zero
    if unit == "%":
        return f"{x:+.1f}%"
    if unit == "pt":
        return f"{x:+.1f} pt"
    return f"{x:+g}" + (f" {unit}" if unit else "")


def fmt_pct(x: float | None) -> str:
    """A percentage change: "+20.1%"."""
    return fmt_change(x, "%")


def fmt_ci(lo: float | None, hi: float | None, unit: str = "%") -> str:
    """An interval "[+18.3%, +21.9%]" (points: "[-0.9, +1.1]"); "n/a" when absent."""
    if lo is None or hi is None:
        return "n/a"
    if unit == "%":
        return f"[{lo:+.1f}%, {hi:+.1f}%]"
    return f"[{lo:+.1f}, {hi:+.1f}]"


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _code(text: str, summary: str) -> str:
    body = f"```\n{text.rstrip()}\n```"
    if text.count("\n") + 1 > FOLD_LINES:
        return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"
    return body


def _name(r: Row) -> str:
    return (r.label or r.metric).rstrip(":").strip()


def _margin_txt(r: Row) -> str:
    if r.margin is None:
        return ""
    return f"±{r.margin:g} pt" if r.change_unit == "pt" else f"±{r.margin:g}%"


def verdict_text(r: Row) -> str:
    """The verdict of a row in the words of :data:`VERDICT_MARK` (report, console and answer
    alike): "improved", "improved, within ±5%", "equivalent within ±2 pt", "equivalent" (an
    equal deterministic count), "inconclusive"."""
    if r.verdict in ("improved", "regressed") and r.within_margin:
        return f"{r.verdict}, within {_margin_txt(r)}"
    if r.verdict == "equivalent":
        margin = _margin_txt(r)
        # a deterministic count with no margin is equivalent only when it is exactly equal
        return f"equivalent within {margin}" if margin else "equivalent"
    return r.verdict


def short_name(r: Row) -> str:
    """A row's label without its parenthetical or trailing qualifier, for the one-line answer
    (:meth:`~patchbench.analysis.comparison.Row.short_label`)."""
    return r.short_label()
