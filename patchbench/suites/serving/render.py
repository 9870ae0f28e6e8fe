"""The serving suite's report: output identity and the TTFT / ITL ECDF (from the pairs
:mod:`.pairing` wrote), and a sweep's load curve: a section (one row per point, the curve sentence)
and three figures (docs/serving.md, "Figures"), from the comparison's per-point and curve rows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import patchbench.report.figtext as figtext
from patchbench.suite import comparison_get, suite_pairs, suite_refusals, suite_rows
from patchbench.suites import new_figure, save_titled

from .capacity import report_lines
from .capplot import plot_capacity
from .curve import frontier
from .sweep import POINT_SEP, point_of

SUITE = "serving"
#: the curve's per-point primaries, in the sentence's order
CURVE_METRICS = ("output_throughput_tok_s", "itl_median_ms")
_SHORT = {"output_throughput_tok_s": "output throughput", "itl_median_ms": "median ITL"}
_AXIS_WORD = {"c": "concurrency", "r": "request rate"}
_COLOURS = {
    "improved": "tab:green",
    "regressed": "tab:red",
    "equivalent": "tab:blue",
    "inconclusive": "tab:gray",
    "incomplete": "lightgray",
}
_MARKERS = ["o", "s", "^", "D"]


def identity_flags(comparison: Any) -> dict[str, dict[str, Any]]:
    """Per variant: ``{"share", "reference_share", "reference", "flag", "reason"}``: flagged when its
    identical share (over every point of a sweep: :func:`point_identities`) is below the
    reference (the smallest A/A share, else 100 %) by more than the comparison's
    ``identity_share_tolerance``."""
    pairs = suite_pairs(comparison, SUITE)
    aa = set(comparison_get(comparison, "aa_variants", []) or [])
    tol = float(comparison_get(comparison, "settings", {}).get("identity_share_tolerance", 0.02))
    share = {}
    for v, p in pairs.items():
        points = point_identities(p)
        share[v] = (_pooled(points) if points else p.get("identity") or {}).get("share")
    aa_shares = [share[v] for v in pairs if v in aa and share[v] is not None]
    out = {}
    for v in pairs:
        if v in aa or not aa_shares:
            ref, name = 1.0, "100% (deterministic engine)" if v not in aa else "100% (A/A)"
        else:
            ref, name = min(aa_shares), f"A/A share {min(aa_shares) * 100:.1f}%"
        s = share[v]
        flag = s is not None and s < ref - tol
        reason = f"{s * 100:.1f}% of requests identical (reference: {name})" if flag else None
        out[v] = {
            "share": s,
            "reference_share": ref,
            "reference": name,
            "flag": flag,
            "reason": reason,
        }
    return out


def report_section(comparison: Any) -> list[str]:
    """Markdown: a capacity search's section (:func:`.capacity.report_lines`) alone, else a sweep's
    "Load curve (serving)", then "Output identity (serving)": per variant
    the identical-output share with its Wilson interval, where the first difference starts, the
    reference and a flag; refusals and notes where pairing did not happen."""
    curve = curve_section(comparison)
    pairs = suite_pairs(comparison, SUITE)
    slo = {v: p["slo_definition"] for v, p in pairs.items() if "slo_definition" in p}
    if slo:
        return report_lines(comparison, slo)
    refusals = suite_refusals(comparison, SUITE)
    if not pairs and not refusals:
        return curve
    flags = identity_flags(comparison)
    lines = [
        "## Output identity (serving)",
        "",
        "Request i of the baseline and of a variant is the same prompt (checked: prompt length "
        "and hash where recorded); failed requests are left out.",
        "",
        "| variant | identical outputs | 95% CI | first difference (median char) | reference "
        "| flag |",
        "|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for v, p in pairs.items():
        ident = p.get("identity")
        f = flags.get(v) or {}
        points = point_identities(p)
        if points:  # a sweep: each load's own row, then every load's requests together
            lines += [_identity_row(f"{v} @ {k}", x, f) for k, x in points.items()]
            lines.append(_identity_row(f"{v}, all {len(points)} loads", _pooled(points), f))
        elif ident:
            lines.append(_identity_row(v, ident, f))
        else:
            lines.append(
                f"| {v} | n/a | n/a | n/a | n/a | not paired: "
                f"{(p.get('request_pairing') or {}).get('reason') or 'no data'} |"
            )
        used = [
            f"repeat {r['repeat_index']} requests {r['requests_compared'][0]}.."
            f"{r['requests_compared'][1]} ({r['paired']} paired)"
            for r in p.get("repeats") or []
            if r.get("requests_compared")
        ]
        if used:
            at = f" at {next(iter(p['points']))}" if p.get("points") else ""  # the lowest load's
            notes.append(f"{v}: compared{at} " + ", ".join(used))
        notes += [f"{v}: {n}" for n in p.get("notes") or []]
    for v, reason in refusals.items():
        lines.append(f"| {v} | refused | | | | {reason} |")
    lines.append("")
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    return curve + lines


def point_identities(pair: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{point key: its identity} of a sweep's pair entry (``points``), those with requests; {}
    for a single point."""
    return {
        k: x["identity"]
        for k, x in (pair.get("points") or {}).items()
        if isinstance(x, dict) and (x.get("identity") or {}).get("n")
    }


def _pooled(points: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The identity counts of every point together: identical and n summed, the share's 95 %
    Wilson interval (Wilson 1927, :func:`patchbench.stats.wilson_interval`) over the sum."""
    from patchbench import stats

    n = sum(int(x["n"]) for x in points.values())
    same = sum(int(x["identical"]) for x in points.values())
    lo, hi = stats.wilson_interval(same, n, 0.95)
    return {"n": n, "identical": same, "share": same / n, "share_ci": [float(lo), float(hi)]}


def _identity_row(label: str, ident: dict[str, Any], f: dict[str, Any]) -> str:
    lo, hi = ident["share_ci"]
    fd = ident.get("first_diff_char_median")
    return (
        f"| {label} | {ident['identical']}/{ident['n']} ({ident['share'] * 100:.1f}%) | "
        f"[{lo * 100:.1f}%, {hi * 100:.1f}%] | {'n/a' if fd is None else f'{fd:g}'} | "
        f"{f.get('reference', 'n/a')} | {'⚠ outputs changed' if f.get('flag') else 'ok'} |"
    )


#: the headline metric whose paired change an ECDF field's one repeat is set against
ECDF_HEADLINE = {"ttft_ms": "ttft_median_ms", "itl_ms": "itl_median_ms"}


def _headline_row(comparison: Any, field: str, variant: str) -> dict[str, Any] | None:
    """The variant's row of the field's headline metric: the plain metric, else its lowest
    load's (``itl_median_ms@c1``: the ECDF is of a sweep's lowest load)."""
    metric = ECDF_HEADLINE[field]
    by = {r["metric"]: r for r in _rows(comparison) if r["variant"] == variant}
    keys = point_keys(comparison)
    return by.get(metric) or (by.get(f"{metric}{POINT_SEP}{keys[0]}") if keys else None)


def ecdf_opposite_notes(comparison: Any, field: str) -> list[str]:
    """Per variant whose one repeat's median shift (variant - baseline, of the values its ECDF
    draws) points opposite to the paired estimate of the headline metric's change: the note the
    figure carries (patchbench.report.figtext.repeat_shift_note)."""
    notes = []
    for v, p in suite_pairs(comparison, SUITE).items():
        e = p.get("ecdf") or {}
        mb = figtext.median((e.get("baseline") or {}).get(field) or [])
        mv = figtext.median((e.get("variant") or {}).get(field) or [])
        row = _headline_row(comparison, field, v)
        if mb is None or mv is None or row is None:
            continue
        if figtext.opposite(mv - mb, row.get("change")):
            notes.append(figtext.repeat_shift_note(v, mv - mb, "ms", row["change"]))
    return notes


def plot_ecdf(comparison: Any, field: str, out: Path) -> Path | None:
    """ECDF of per-request TTFT (``field="ttft_ms"``) or of all ITL values (``"itl_ms"``) of one
    paired repeat, the baseline then each variant, labelled "one repeat" and noting each variant
    whose shift there is opposite to the paired estimate (:func:`ecdf_opposite_notes`); None
    without data."""
    pairs = {v: p for v, p in suite_pairs(comparison, SUITE).items() if p.get("ecdf")}
    if not pairs:
        return None
    base = comparison_get(comparison, "baseline", "baseline")
    first = next(iter(pairs.values()))["ecdf"]
    curves = [(base, first["baseline"])]
    curves += [(v, p["ecdf"]["variant"]) for v, p in pairs.items()]
    curves = [(j, name, side) for j, (name, side) in enumerate(curves) if side.get(field)]
    if not curves:
        return None
    fig, (ax,) = new_figure(4.8)
    itl = field == "itl_ms"
    for j, name, side in curves:
        n = side.get("itl_ms_n", len(side[field])) if itl else len(side[field])
        ax.ecdf(side[field], label=f"{name} (n={n})", color=f"C{j}")
    what = "ITL" if itl else "TTFT"
    ax.set_xlabel(f"{what} (ms)")
    ax.set_ylabel("fraction of tokens <= x" if itl else "fraction of requests <= x")
    per = " (all tokens)" if itl else " per request"
    rep = first.get("repeat_index")
    which = f"one repeat (paired repeat {rep})" if rep is not None else "one repeat"
    ax.set_title(f"ECDF of {what}{per}, {which}: not the paired estimate", fontsize=9)
    notes = ecdf_opposite_notes(comparison, field)
    if notes:
        at = {"transform": ax.transAxes, "ha": "right", "va": "bottom", "fontsize": 7}
        box = {"facecolor": "white", "edgecolor": "tab:red", "alpha": 0.9}
        ax.text(0.99, 0.03, "\n".join(notes), **at, color="tab:red", bbox=box)
    ax.grid(alpha=0.3)
    ax.legend(title="variant", fontsize=8, loc="center right")
    return save_titled(fig, out, comparison, f"{what} distribution per variant, one repeat")


def plots(comparison: Any, out_dir: Path) -> list[Path]:
    """A capacity search's ``capacity.png`` (:func:`.capplot.plot_capacity`), a sweep's curve
    figures (``curve_latency.png``, ``curve_change.png``, ``curve_frontier.png``), then
    ``ecdf_ttft.png`` and ``ecdf_itl.png`` (of the lowest load of a sweep), those that have data,
    in ``out_dir``."""
    out_dir = Path(out_dir)
    got = [
        plot_capacity(comparison, out_dir / "capacity.png"),
        plot_latency(comparison, out_dir / "curve_latency.png"),
        plot_change(comparison, out_dir / "curve_change.png"),
        plot_frontier(comparison, out_dir / "curve_frontier.png"),
        plot_ecdf(comparison, "ttft_ms", out_dir / "ecdf_ttft.png"),
        plot_ecdf(comparison, "itl_ms", out_dir / "ecdf_itl.png"),
    ]
    return [p for p in got if p is not None]


# --- the load curve of a sweep -----------------------------------------------------------------


def _rows(comparison: Any) -> list[dict[str, Any]]:
    """The serving rows as dicts (a typed comparison or its JSON form)."""
    return suite_rows(comparison, SUITE)


def _load(key: str) -> float:
    """The load of a point key (``c16`` -> 16.0, ``r2.5`` -> 2.5)."""
    return float(key[1:])


def point_keys(comparison: Any) -> list[str]:
    """The sweep's point keys in the comparison, lowest load first ([] without a sweep)."""
    keys = {point_of(r["metric"]) for r in _rows(comparison) if POINT_SEP in r["metric"]}
    return sorted((k for k in keys if k and re.fullmatch(r"[cr][0-9.]+", k)), key=_load)


def curve_sentence(comparison: Any, variant: str) -> str | None:
    """Where the change helps, per curve metric ("output throughput improved at concurrency 1-4,
    equivalent at 16-64"; runs of one verdict merged); None without a sweep."""
    keys = point_keys(comparison)
    if not keys:
        return None
    rows = {r["metric"]: r for r in _rows(comparison) if r["variant"] == variant}
    word = _AXIS_WORD[keys[0][0]]
    parts = []
    for m in CURVE_METRICS:
        runs: list[tuple[str, list[str]]] = []
        for k in keys:
            r = rows.get(f"{m}{POINT_SEP}{k}")
            v = r["verdict"] if r else "not delivered"
            if runs and runs[-1][0] == v:
                runs[-1][1].append(k)
            else:
                runs.append((v, [k]))
        said = [
            f"{v} at {word + ' ' if i == 0 else ''}"
            + "-".join(dict.fromkeys(f"{_load(k):g}" for k in (ks[0], ks[-1])))
            for i, (v, ks) in enumerate(runs)
        ]
        parts.append(f"{_SHORT[m]} " + ", ".join(said))
    return f"{variant}: " + "; ".join(parts)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _change(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not delivered"
    ch, lo, hi = r.get("change"), r.get("low"), r.get("high")
    iv = f" [{lo:+.1f}, {hi:+.1f}]" if lo is not None and hi is not None else ""
    return f"{'n/a' if ch is None else f'{ch:+.1f}%'}{iv} {r['verdict']}"


def _values(r: dict[str, Any] | None) -> str:
    return "n/a" if r is None else f"{_fmt(r['baseline_value'])} -> {_fmt(r['variant_value'])}"


def curve_section(comparison: Any) -> list[str]:
    """Markdown "Load curve (serving)": the curve sentence per variant, the curve metrics with
    their intervals, then one table row per (variant, point); [] without a sweep."""
    keys = point_keys(comparison)
    if not keys:
        return []
    rows = _rows(comparison)
    variants = list(comparison_get(comparison, "variants", []) or [])
    lines = ["## Load curve (serving)", ""]
    lines += [f"- {s}" for v in variants if (s := curve_sentence(comparison, v))]
    pairs = (comparison_get(comparison, "pairs", {}) or {}).get(SUITE) or {}
    slo = next((p["slo"] for p in pairs.values() if isinstance(p, dict) and p.get("slo")), None)
    if slo:
        lines.append(
            f"- SLO: TTFT <= {slo['ttft_ms']:g} ms and TPOT <= {slo['tpot_ms']:g} ms (a request "
            f"meets it when both hold; a load, when both hold at p{slo['percentile']:g})"
        )
    lines.append("")
    curve = [r for r in rows if r["primary"] and POINT_SEP not in r["metric"]]
    if curve:
        lines += [
            "| variant | curve metric | baseline | variant | change [interval] verdict |",
            "|---|---|---|---|---|",
        ]
        for r in curve:
            bb = " (lower bound)" if r.get("baseline_bound") == "lower" else ""
            vb = " (lower bound)" if r.get("variant_bound") == "lower" else ""
            lines.append(
                f"| {r['variant']} | `{r['metric']}` | {_fmt(r['baseline_value'])}{bb} | "
                f"{_fmt(r['variant_value'])}{vb} | {_change(r)} |"
            )
        lines.append("")
    by = {(r["variant"], r["metric"]): r for r in rows}
    lines += [
        f"| variant | {_AXIS_WORD[keys[0][0]]} | output tok/s (base -> var) | change | "
        "median ITL ms (base -> var) | change | goodput req/s (base -> var) |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in variants:
        for k in keys:
            t, i, g = (
                by.get((v, f"{m}{POINT_SEP}{k}"))
                for m in ("output_throughput_tok_s", "itl_median_ms", "goodput_req_s")
            )
            lines.append(
                f"| {v} | {_load(k):g} | {_values(t)} | {_change(t)} | {_values(i)} | "
                f"{_change(i)} | {_values(g)} |"
            )
    lines += [
        "",
        "- Sweep: every point ran against the cell's one server, in an order shuffled per cell "
        "(seed in the summary's `meta.sweep.order_seed`), the cache flushed between points, the "
        "same prompts per point for every variant. Primaries (one Holm family with the report's "
        "other primaries): goodput at the SLO (best point), the highest load meeting the SLO "
        "(interpolated between points; a lower bound when every point meets it), output "
        "throughput and median ITL at each point; every other per-point metric is secondary. "
        "A point whose client did not deliver the load asked is marked not delivered and never "
        "judged.",
        "",
    ]
    return lines


def _series(rows: list[dict[str, Any]], metric: str, keys: list[str], arm: str, variant: str):
    """Per point: the arm's repeats of ``metric@key`` in the row of ``variant`` (None where the
    point has no row)."""
    by = {r["metric"]: r for r in rows if r["variant"] == variant}
    out = []
    for k in keys:
        r = by.get(f"{metric}{POINT_SEP}{k}")
        out.append(None if r is None else [x for x in r[f"{arm}_repeats"] if x is not None] or None)
    return out


def _arms(comparison: Any) -> list[tuple[str, str, str]]:
    """(label, arm, variant row it comes from) for the baseline and every variant."""
    variants = list(comparison_get(comparison, "variants", []) or [])
    if not variants:
        return []
    base = comparison_get(comparison, "baseline", "baseline")
    return [(base, "baseline", variants[0])] + [(v, "variant", v) for v in variants]


def _center(xs: list[float]) -> float:
    """An arm's value at a point over its repeats: the geometric mean, as the report's tables
    print it (a median of two repeats would be their arithmetic mean)."""
    from scipy.stats import gmean

    return float(gmean(xs))


def plot_latency(comparison: Any, out: Path) -> Path | None:
    """``curve_latency.png`` (docs/serving.md, "Figures"); None without a sweep."""
    keys = point_keys(comparison)
    rows = _rows(comparison)
    if not keys:
        return None
    fig, (ax,) = new_figure(5.2)
    medians: list[tuple[str, float, float, int]] = []
    for j, (label, arm, src) in enumerate(_arms(comparison)):
        thr = _series(rows, "output_throughput_tok_s", keys, arm, src)
        for stat, ls in (("itl_median_ms", "-"), ("itl_p99_ms", "--")):
            lat = _series(rows, stat, keys, arm, src)
            pts = sorted(
                (_center(x), _center(y), min(y), max(y), k)
                for x, y, k in zip(lat, thr, keys, strict=True)
                if x and y
            )
            if not pts:
                continue
            xs = [p[0] for p in pts]
            which = "median" if ls == "-" else "p99"
            ax.plot(
                xs,
                [p[1] for p in pts],
                ls,
                marker="o",
                color=f"C{j}",
                label=f"{label} ({which} ITL)",
            )
            band = ([p[2] for p in pts], [p[3] for p in pts])
            ax.fill_between(xs, *band, color=f"C{j}", alpha=0.15, lw=0)
            if ls == "-":
                medians += [(k, x, y, j) for x, y, *_r, k in pts]
    ax.set_xscale("log")
    label_points(ax, medians)
    ax.set_xlabel("ITL (ms, log scale): median solid, p99 dashed")
    ax.set_ylabel("output throughput (tok/s)")
    ax.grid(alpha=0.3, which="both")
    handles, labels = ax.get_legend_handles_labels()
    # below the axes, never over a point; handles long enough to show p99's dashes
    fig.legend(handles, labels, loc="lower center", fontsize=7, ncol=3, handlelength=4)
    ax.set_title("Throughput against latency per load (band: range over repeats)", fontsize=9)
    rows_of_legend = -(-len(labels) // 3)
    rect = (0, 0.04 + 0.035 * rows_of_legend, 1, 1)
    return save_titled(fig, out, comparison, "Load curve per variant", rect=rect)


#: points of one load closer than this (display pixels) share one label
NEAR_PX = 28.0


def label_points(ax: Any, points: list[tuple[str, float, float, int]]) -> list[Any]:
    """Write each load's key by its points ``(key, x, y, variant index)`` on ``ax`` as
    docs/serving.md, "Figures", says (crowded: within :data:`NEAR_PX`); the annotations in order."""
    import numpy as np

    ax.autoscale_view()
    by: dict[str, list[tuple[np.ndarray, float, float, int]]] = {}
    for k, x, y, j in points:
        by.setdefault(k, []).append((ax.transData.transform((x, y)), x, y, j))
    out = []
    for k, members in by.items():
        groups: list[list[tuple[np.ndarray, float, float, int]]] = []
        for m in members:
            near = [g for g in groups if any(np.hypot(*(m[0] - o[0])) < NEAR_PX for o in g)]
            groups = [g for g in groups if not any(g is h for h in near)]
            groups.append([m] + [o for g in near for o in g])
        centre = float(np.mean([m[0][0] for m in members]))
        for g in groups:
            if len(g) > 1:
                top = max(g, key=lambda o: o[0][1])
                xy, colour, off, ha = (top[1], top[2]), "0.25", (0, 6), "center"
            else:
                ((px, x, y, j),) = g
                right = len(groups) == 1 or px[0] >= centre
                xy, colour = (x, y), f"C{j}"
                off, ha = ((6, 3), "left") if right else ((-6, 3), "right")
            kw = {"textcoords": "offset points", "va": "bottom", "fontsize": 7}
            out.append(ax.annotate(k, xy, xytext=off, ha=ha, color=colour, **kw))
    return out


def plot_change(comparison: Any, out: Path) -> Path | None:
    """``curve_change.png`` (docs/serving.md, "Figures"); None without a sweep."""
    from matplotlib.lines import Line2D

    keys = point_keys(comparison)
    if not keys:
        return None
    by = {(r["variant"], r["metric"]): r for r in _rows(comparison)}
    variants = list(comparison_get(comparison, "variants", []) or [])
    fig, axes = new_figure(3.8, ncols=2)
    width = 0.6 / max(1, len(variants))
    undelivered = False
    shown: list[dict[str, Any]] = []
    for ax, m in zip(axes, CURVE_METRICS, strict=True):
        placed: list[tuple[float, dict[str, Any]]] = []
        for j, v in enumerate(variants):
            for i, k in enumerate(keys):
                r = by.get((v, f"{m}{POINT_SEP}{k}"))
                x = i + (j - (len(variants) - 1) / 2) * width
                if r is None:
                    ax.plot([x], [0], "x", color="black")
                    undelivered = True
                    continue
                placed.append((x, r))
                c = _COLOURS.get(r["verdict"], "tab:gray")
                if figtext.has_interval(r):
                    ax.plot([x, x], [r["low"], r["high"]], color=c, lw=3, solid_capstyle="butt")
                    face = c
                else:  # hollow grey: nothing was decided around it
                    c, face = "tab:gray", "white"
                if r.get("change") is not None:
                    ax.plot([x], [r["change"]], _MARKERS[j % 4], color=c, mfc=face, ms=5)
                    shown.append(r)
        for x in figtext.band_points(placed):  # the margin only behind a point with an interval
            margin = dict(placed)[x]["margin"]
            band = ([x - width / 2, x + width / 2], -margin, margin)
            ax.fill_between(*band, color="tab:blue", alpha=0.08, lw=0)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(keys)), [f"{_load(k):g}" for k in keys])
        ax.set_xlabel(_AXIS_WORD[keys[0][0]])
        ax.set_ylabel("change vs baseline (%)")
        better = "higher" if m == "output_throughput_tok_s" else "lower"
        ax.set_title(f"{_SHORT[m]} ({better} is better)", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    handles = [Line2D([], [], color=c, lw=3, label=v) for v, c in _COLOURS.items()]
    handles += [
        Line2D([], [], ls="", marker=_MARKERS[j % 4], color="black", label=v)
        for j, v in enumerate(variants)
    ]
    hollow = {"ls": "", "marker": "o", "color": "tab:gray", "mfc": "white"}
    reasons = [figtext.no_interval_label(r) for r in shown if not figtext.has_interval(r)]
    handles += [Line2D([], [], **hollow, label=t) for t in dict.fromkeys(reasons)]
    if undelivered:
        handles.append(Line2D([], [], ls="", marker="x", color="black", label="not delivered"))
    fig.legend(
        handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=7, frameon=False
    )
    drawn = sum(figtext.has_interval(r) for r in shown)
    words = figtext.change_title(drawn, len(shown))
    title = f"{words[0].upper()}{words[1:]} per load"
    return save_titled(fig, out, comparison, title, rect=(0, 0.12, 1, 0.94))


def plot_frontier(comparison: Any, out: Path) -> Path | None:
    """``curve_frontier.png`` (docs/serving.md, "Figures"; per device:
    patchbench.report.figtext.per_device); None without a sweep or the frontier metrics."""
    keys = point_keys(comparison)
    rows = _rows(comparison)
    if not keys:
        return None
    drawn = []
    for j, (label, arm, src) in enumerate(_arms(comparison)):
        gpu = _series(rows, "output_per_gpu_tok_s", keys, arm, src)
        user = _series(rows, "output_per_user_tok_s", keys, arm, src)
        pts = [
            (_center(g), _center(u), k) for g, u, k in zip(gpu, user, keys, strict=True) if g and u
        ]
        if pts:
            drawn.append((j, label, pts))
    if not drawn:
        return None
    fig, (ax,) = new_figure(5.0)
    for j, label, pts in drawn:
        idx = frontier([(g, u) for g, u, _ in pts])
        ax.scatter([p[1] for p in pts], [p[0] for p in pts], color=f"C{j}", s=18, alpha=0.5)
        front = ([pts[i][1] for i in idx], [pts[i][0] for i in idx])
        ax.plot(*front, "-o", color=f"C{j}", label=f"{label} (frontier)")
        for g, u, k in pts:
            kw = {"textcoords": "offset points", "fontsize": 7, "color": f"C{j}"}
            ax.annotate(k, (u, g), xytext=(5, 4 - 12 * j), **kw)
    xs = [x for line in ax.get_lines() for x in line.get_xdata()]
    if xs and min(xs) > 0 and max(xs) / min(xs) > 20:  # a wide range (e.g. the CPU engine's)
        ax.set_xscale("log")
    scale = ", log scale" if ax.get_xscale() == "log" else ""
    ax.set_xlabel(f"tokens/s per user (1000 / median TPOT{scale})")
    per = figtext.per_device(comparison)
    ax.set_ylabel(f"output tokens/s {per}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Throughput {per} against speed per user (up and right is better)", fontsize=9)
    return save_titled(fig, out, comparison, "Pareto frontier per variant")
