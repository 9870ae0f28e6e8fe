"""The serving suite's report section (output identity) and plots (TTFT / ITL ECDF), rendered
only from the comparison's serving pairs (:mod:`.pairing` wrote them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench.suite import comparison_get, suite_pairs, suite_refusals

SUITE = "serving"


def identity_flags(comparison: Any) -> dict[str, dict[str, Any]]:
    """Per variant: ``{"share", "reference_share", "reference", "flag", "reason"}``: flagged when its
    identical share is below the reference (the smallest A/A share, else 100 %) by more than the
    comparison's ``identity_share_tolerance``."""
    pairs = suite_pairs(comparison, SUITE)
    aa = set(comparison_get(comparison, "aa_variants", []) or [])
    settings = comparison_get(comparison, "settings", {}) or {}
    tol = float(
        settings.get("identity_share_tolerance", 0.02)
        if isinstance(settings, dict)
        else getattr(settings, "identity_share_tolerance", 0.02)
    )
    share = {v: (p.get("identity") or {}).get("share") for v, p in pairs.items()}
    aa_shares = [share[v] for v in pairs if v in aa and share[v] is not None]
    out = {}
    for v in pairs:
        if v in aa or not aa_shares:
            ref, name = 1.0, "100% (deterministic engine)" if v not in aa else "100% (A/A)"
        else:
            ref, name = min(aa_shares), f"A/A share {min(aa_shares) * 100:.1f}%"
        s = share[v]
        flag = s is not None and s < ref - tol
        out[v] = {
            "share": s,
            "reference_share": ref,
            "reference": name,
            "flag": flag,
            "reason": (
                f"{s * 100:.1f}% of requests identical (reference: {name})" if flag else None
            ),
        }
    return out


def report_section(comparison: Any) -> list[str]:
    """Markdown "Output identity (serving)": per variant the identical-output share with its Wilson
    interval, where the first difference starts, the reference and a flag; refusals and notes
    where pairing did not happen."""
    from .curve_render import curve_section

    curve = curve_section(comparison)
    pairs = suite_pairs(comparison, SUITE)
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
        if ident:
            lo, hi = ident["share_ci"]
            fd = ident.get("first_diff_char_median")
            lines.append(
                f"| {v} | {ident['identical']}/{ident['n']} ({ident['share'] * 100:.1f}%) | "
                f"[{lo * 100:.1f}%, {hi * 100:.1f}%] | {'n/a' if fd is None else f'{fd:g}'} | "
                f"{f.get('reference', 'n/a')} | {'⚠ outputs changed' if f.get('flag') else 'ok'} |"
            )
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
            notes.append(f"{v}: compared " + ", ".join(used))
        notes += [f"{v}: {n}" for n in p.get("notes") or []]
    for v, reason in refusals.items():
        lines.append(f"| {v} | refused | | | | {reason} |")
    lines.append("")
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    return curve + lines


def plot_ecdf(comparison: Any, field: str, out: Path) -> Path | None:
    """ECDF of per-request TTFT (``field="ttft_ms"``) or of all ITL values (``"itl_ms"``) of the first
    paired repeat, the baseline then each variant; None without data."""
    from patchbench.suites import new_figure, save_png

    pairs = {v: p for v, p in suite_pairs(comparison, SUITE).items() if p.get("ecdf")}
    if not pairs:
        return None
    base = comparison_get(comparison, "baseline", "baseline")
    curves = [(base, next(iter(pairs.values()))["ecdf"]["baseline"], None)]
    curves += [(v, p["ecdf"]["variant"], p["ecdf"].get("repeat_index")) for v, p in pairs.items()]
    fig, (ax,) = new_figure(4.8)
    drawn = 0
    for j, (name, side, _k) in enumerate(curves):
        xs = side.get(field) or []
        if not xs:
            continue
        n = side.get("itl_ms_n", len(xs)) if field == "itl_ms" else len(xs)
        ax.ecdf(xs, label=f"{name} (n={n})", color=f"C{j}")
        drawn += 1
    if not drawn:
        import matplotlib.pyplot as plt

        plt.close(fig)
        return None
    what = "TTFT" if field == "ttft_ms" else "ITL"
    ax.set_xlabel(f"{what} (ms)")
    ax.set_ylabel("fraction of requests <= x" if field != "itl_ms" else "fraction of tokens <= x")
    ax.set_title(
        f"ECDF of {what}"
        + (" per request" if field != "itl_ms" else " (all tokens)")
        + ", first paired repeat",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(title="variant", fontsize=8)
    fig.suptitle(
        f"{what} distribution per variant   [{comparison_get(comparison, 'run_id', '')}]",
        fontsize=10,
    )
    fig.tight_layout()
    return save_png(fig, out)


def plots(comparison: Any, out_dir: Path) -> list[Path]:
    """``ecdf_ttft.png`` and ``ecdf_itl.png`` in ``out_dir`` (those that have data; of the
    lowest load of a sweep), and a sweep's curve figures (:mod:`.curve_render`)."""
    from .curve_render import curve_plots

    out = curve_plots(comparison, Path(out_dir))
    for field, name in (("ttft_ms", "ecdf_ttft.png"), ("itl_ms", "ecdf_itl.png")):
        p = plot_ecdf(comparison, field, Path(out_dir) / name)
        if p is not None:
            out.append(p)
    return out
