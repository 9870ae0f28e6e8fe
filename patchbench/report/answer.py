"""The answer of report.md and the console: one sentence per variant, the primaries table
(at the level each verdict used) and what a partial run says."""

from __future__ import annotations

import re

from patchbench.analysis.comparison import Comparison, Row
from patchbench.report.decide import decide_note
from patchbench.report.fmt import (
    VERDICT_MARK,
    _esc,
    _margin_txt,
    _name,
    exactness,
    fmt_change,
    fmt_ci,
    short_name,
    shown_value,
    values_txt,
    verdict_text,
)


def outlier_text(r: Row) -> str | None:
    """ "outlier repeat: rep2" (descriptive, :data:`patchbench.analysis.build.OUTLIER_RULE`), or None."""
    if not r.outlier_repeats:
        return None
    reps = ", ".join(f"rep{k}" for k in r.outlier_repeats)
    return f"outlier repeat{'s' if len(r.outlier_repeats) > 1 else ''}: {reps} (descriptive)"


def _why_no_interval(r: Row) -> str:
    """A few words on why a row has no interval: the repeat count of its test's reason ("2
    paired repeats", "1 repeat"), else the start of its first note."""
    for n in r.notes:
        m = re.match(r"(\d+ paired repeats?|1 repeat|no paired repeats)\b", n)
        if m:
            return m.group(1)
    return (r.notes[0].split(":")[0] if r.notes else "no interval").strip()


def sentence(cmp: Comparison, variant: str) -> str:
    """One hyperfine-style sentence for ``variant``: each primary with its change, interval and
    verdict; a pairing refusal by its reason (:func:`sentence_parts` joined)."""
    head, parts = sentence_parts(cmp, variant)
    return head + ("; ".join(parts) if parts else "no primary metric")


def sentence_parts(cmp: Comparison, variant: str) -> tuple[str, list[str]]:
    """(``"<variant> vs <baseline>: "``, one clause per primary and pairing refusal)."""
    parts = []
    for r in cmp.rows_for(variant, primary=True):
        if r.kind == "deterministic":
            parts.append(f"{short_name(r)} {values_txt(r)} {verdict_text(r)} ({exactness(r)})")
            continue
        decide = decide_note(r, cmp.settings.min_repeats, short=True)
        if r.low is None or r.high is None:
            # no interval: say why in a few words instead of "n/a" (the table has the full note)
            why = "; ".join(x for x in (_why_no_interval(r), decide) if x)
            parts.append(
                f"{short_name(r)} {fmt_change(r.change, r.change_unit)} {verdict_text(r)} ({why})"
            )
            continue
        parts.append(
            f"{short_name(r)} {fmt_change(r.change, r.change_unit)} "
            f"{fmt_ci(r.low, r.high, r.change_unit)} {verdict_text(r)}"
            + (f" ({decide})" if decide else "")
        )
    for suite, per in cmp.refusals.items():
        if variant in per:
            parts.append(f"{suite} not paired: {per[variant]}")
    tag = " (A/A)" if variant in cmp.aa_variants else ""
    return f"{variant}{tag} vs {cmp.baseline}: ", parts


def _primaries(cmp: Comparison) -> list[str]:
    rows = [r for r in cmp.rows if r.primary]
    if not rows:
        return ["## Primary metrics", "", "(no suite of this run declares primary metrics)", ""]
    d = cmp.design
    fam = 100 * (1 - d.alpha)
    outside = (
        " Deterministic counts are compared exactly, outside the family."
        if any(r.kind == "deterministic" for r in rows)
        else ""
    )
    if d.kind == "sequential":
        intro = (
            f"Decided by the sequential rule ({d.boundary} boundary, looks after "
            f"{', '.join(str(n) for n in d.looks)} rounds; family confidence {fam:g}% over the "
            f"{d.family} primaries of the non-A/A variants): each interval is at the nominal "
            "level its decision used at its look; an equivalent one is the interval TOST checked."
        )
    else:
        intro = (
            f"Intervals are at the Holm-adjusted level each verdict used (family confidence "
            f"{fam:g}% over the {d.family} primaries of the non-A/A variants, one family per "
            "report); equivalence is TOST at the same level."
        )
    lines = [
        "## Primary metrics",
        "",
        intro + outside + " Baseline and variant are the geometric means of the paired repeats, "
        "so their ratio is the change (accuracy: the mean over the paired questions; counts: the "
        "value).",
        "",
        "| variant | metric | baseline | variant | change | interval | level | verdict | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        level = f"{100 * r.confidence:.2f}%" if r.confidence else exactness(r)
        lines.append(
            f"| {r.variant} | {_esc(_name(r))} | {shown_value(r, 'baseline')} | "
            f"{shown_value(r, 'variant')} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {level} | "
            f"{VERDICT_MARK.get(r.verdict, r.verdict)}"
            f"{', within ' + _margin_txt(r) if r.within_margin else ''} | "
            f"{_esc('; '.join(_primary_notes(r, cmp.settings.min_repeats)))} |"
        )
    return lines + [""]


def _primary_notes(r: Row, min_repeats: int) -> list[str]:
    """A primary's notes in the table: the row's own, its outlier repeats, and for an
    inconclusive row how many repeats would likely decide (:func:`decide_note`)."""
    extra = [outlier_text(r), decide_note(r, min_repeats)]
    return list(r.notes) + [x for x in extra if x]


def partial_lines(cmp: Comparison) -> list[str]:
    """What a partial run says (none for a finished one): that it is partial, where it stopped
    and the command that resumes it."""
    d = cmp.design
    if d.partial is None:
        return []
    out = [f"Partial run: {d.partial}; no primary verdict is decisive."]
    if d.resume:
        out.append(f"Resume with: {d.resume}")
    return out


def _partial(cmp: Comparison) -> list[str]:
    lines = partial_lines(cmp)
    if not lines:
        return []
    return [f"**{lines[0]}**"] + [f"`{x.split(': ', 1)[1]}`" for x in lines[1:2]] + [""]
