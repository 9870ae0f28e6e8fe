"""Plots of a comparison (issue 6): PNGs legible at a PR's width (900 px), matplotlib Agg.

Every function takes the compare.json dict (and, for per-request plots, the run view), returns the
matplotlib ``Figure`` (or None when there is nothing to plot) and does not save it;
:func:`make_plots` saves them all under ``RUN/plots/``. Each figure has a title, axis labels with
units, a legend and the run id in its super-title.

- :func:`plot_throughput`: median throughput per variant, repeats as dots, 95 % interval whiskers;
- :func:`plot_latency`: TTFT / ITL / E2E statistics per variant with whiskers (log scale);
- :func:`plot_ecdf`: ECDF overlays of per-request TTFT or of all ITL values (first repeat);
- :func:`plot_mmmu_subjects`: per-subject MMMU accuracy difference with flips;
- :func:`plot_timeline`: value of a metric per cell in schedule order (drift).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from patchbench import records  # noqa: E402

if TYPE_CHECKING:
    from patchbench.compare import RunView

WIDTH_IN, DPI = 9.0, 100  # 900 px wide

__all__ = ["plot_throughput", "plot_latency", "plot_ecdf", "plot_mmmu_subjects", "plot_timeline",
           "make_plots", "save_png"]


def _fig(h: float = 5.0, ncols: int = 1) -> tuple[Figure, list]:
    fig, axes = plt.subplots(1, ncols, figsize=(WIDTH_IN, h), dpi=DPI, squeeze=False)
    return fig, list(axes[0])


def _suptitle(fig: Figure, title: str, run_id: str) -> None:
    fig.suptitle(f"{title}\nrun {run_id}", fontsize=11)


def _label(metric: str, unit: str) -> str:
    base = metric
    for suf in ("_tok_s", "_req_s", "_ms", "_s", "_acc", "_count", "_share"):
        if base.endswith(suf):
            base = base[: -len(suf)]
            break
    return f"{base.replace('_', ' ')} ({unit})" if unit else base.replace("_", " ")


def _rows(cmp: dict, pred) -> dict[str, list[dict]]:
    """metric -> rows (one per variant), for rows that satisfy pred."""
    out: dict[str, list[dict]] = {}
    for r in cmp.get("metrics", []):
        if pred(r):
            out.setdefault(r["metric"], []).append(r)
    return out


def _limit_to_data(ax, values: list[float], *, log: bool = False) -> None:
    """Fit the y axis to the measured values (repeats and medians), not to the whiskers: with
    few repeats an interval can span orders of magnitude and would flatten every point onto the
    axis. Whiskers cut by the limits get a note in the corner saying so."""
    vals = [v for v in values if v is not None and (v > 0 if log else True)]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    if log:
        new = (lo / 2.0, hi * 2.0)
    else:
        pad = max((hi - lo) * 0.5, abs(hi) * 0.15, 1e-9)
        new = (max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)
    old = ax.get_ylim()
    if old[0] < new[0] - 1e-12 or old[1] > new[1] + 1e-12:
        ax.text(0.99, 0.01, "some intervals extend beyond the axis", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="C3")
    ax.set_ylim(*new)


def _whiskers(ax, x: float, r: dict, color, label: str | None) -> None:
    """Variant median with the change interval applied to the baseline median as whiskers."""
    b = r.get("baseline_median")
    if r.get("variant_median") is None:
        return
    y = r["variant_median"]
    if b is not None and r.get("ci_low_pct") is not None and r.get("ci_high_pct") is not None:
        lo = b * (1 + r["ci_low_pct"] / 100)
        hi = b * (1 + r["ci_high_pct"] / 100)
        # whiskers around the change estimate on the baseline scale
        c = b * (1 + (r["change_pct"] or 0) / 100)
        ax.errorbar([x], [c], yerr=[[max(c - lo, 0)], [max(hi - c, 0)]], fmt="o", color=color,
                    capsize=6, lw=2, label=label)
    else:
        ax.plot([x], [y], "o", color=color, label=label)


def plot_throughput(cmp: dict) -> Figure | None:
    """Median throughput per variant (one panel per tok/s or req/s metric), repeats as dots.

    Whiskers: the 95 % interval of the change, applied to the baseline median (so they show where
    the variant's value lies with 95 % confidence, relative to the baseline). None if no
    throughput metric.
    """
    rows = _rows(cmp, lambda r: r.get("unit") in ("tok/s", "req/s"))
    if not rows:
        return None
    names = list(rows)[:3]
    fig, axes = _fig(4.8, len(names))
    base = cmp.get("baseline", "baseline")
    for ax, m in zip(axes, names):
        rs = rows[m]
        variants = [base] + [r["variant"] for r in rs]
        xs = range(len(variants))
        b = rs[0]
        brep = [v for v in b.get("baseline_repeats", []) if v is not None]
        ax.plot([0] * len(brep), brep, ".", color="0.5", alpha=0.7, label="repeats")
        if b.get("baseline_median") is not None:
            ax.plot([0], [b["baseline_median"]], "s", color="C0", ms=8, label="median")
        for i, r in enumerate(rs, start=1):
            rep = [v for v in r.get("variant_repeats", []) if v is not None]
            ax.plot([i] * len(rep), rep, ".", color="0.5", alpha=0.7)
            if r.get("variant_median") is not None:
                ax.plot([i], [r["variant_median"]], "s", color="C0", ms=8)
            _whiskers(ax, i + 0.15, r, "C3", "95% CI of change" if i == 1 else None)
        _limit_to_data(ax, brep + [b.get("baseline_median")] + [
            v for r in rs for v in (r.get("variant_repeats") or []) + [r.get("variant_median")]])
        ax.set_xticks(list(xs), variants, rotation=15)
        ax.set_xlabel("variant")
        ax.set_ylabel(_label(m, rs[0].get("unit", "")))
        ax.set_title(m, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    _suptitle(fig, "Throughput per variant (median over repeats, 95% interval of the change)",
              cmp.get("run_id", ""))
    fig.tight_layout()
    return fig


_LAT_PREF = ("ttft", "itl", "e2e")


def plot_latency(cmp: dict) -> Figure | None:
    """TTFT / ITL / E2E latency statistics (ms) per variant, grouped by metric, log y axis.

    Markers: medians over repeats (repeats as small dots); whiskers on variant markers: the 95 %
    interval of the change applied to the baseline median, i.e. where the variant's value lies
    with 95 % confidence. None if no latency metric.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator
    rows = _rows(cmp, lambda r: r.get("unit") == "ms" and any(k in r["metric"] for k in _LAT_PREF))
    if not rows:
        return None
    names = list(rows)[:10]
    base = cmp.get("baseline", "baseline")
    variants = [base] + list(dict.fromkeys(r["variant"] for m in names for r in rows[m]))
    fig, (ax,) = _fig(5.2)
    w = 0.7 / max(len(variants), 1)
    for j, v in enumerate(variants):
        xs, ys, lo_e, hi_e = [], [], [], []
        for i, m in enumerate(names):
            r = next((r for r in rows[m] if r["variant"] == v), rows[m][0])
            y = r["baseline_median"] if v == base else r["variant_median"]
            reps = r["baseline_repeats"] if v == base else r["variant_repeats"]
            if y is None or y <= 0:
                continue
            x = i + (j - (len(variants) - 1) / 2) * w
            reps = [q for q in (reps or []) if q is not None and q > 0]
            ax.plot([x] * len(reps), reps, ".", color="0.55", alpha=0.7,
                    label="repeats" if (j == 0 and i == 0) else None)
            xs.append(x)
            ys.append(y)
            b = r.get("baseline_median")
            if v != base and b and r.get("ci_low_pct") is not None:
                lo_e.append(max(y - b * (1 + r["ci_low_pct"] / 100), 0))
                hi_e.append(max(b * (1 + r["ci_high_pct"] / 100) - y, 0))
            else:
                lo_e.append(0.0)
                hi_e.append(0.0)
        ax.errorbar(xs, ys, yerr=[lo_e, hi_e] if v != base else None, fmt="o", ms=7, capsize=5,
                    color=f"C{j}", label=v)
    ax.set_yscale("log")
    _limit_to_data(ax, [v for m in names for r in rows[m]
                        for v in (r.get("baseline_repeats") or []) + (r.get("variant_repeats") or [])
                        + [r.get("baseline_median"), r.get("variant_median")]], log=True)
    plain = FuncFormatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xticks(range(len(names)), [n.replace("_ms", "") for n in names], rotation=25,
                  ha="right", fontsize=8)
    ax.set_xlabel("metric")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("median over repeats; whiskers: 95% interval of the change", fontsize=9)
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(title="variant", fontsize=8)
    _suptitle(fig, "Latency per variant", cmp.get("run_id", ""))
    fig.tight_layout()
    return fig


def plot_ecdf(view: "RunView", field: str = "ttft_ms", suite: str = "serving") -> Figure | None:
    """ECDF of per-request TTFT (``field="ttft_ms"``) or of all ITL values (``"itl_ms"``), one
    curve per variant, from the first repeat that has serving's requests.json. None if none has."""
    from patchbench.compare import read_requests, request_ok
    fig, (ax,) = _fig(4.8)
    drawn = 0
    for j, v in enumerate(view.variants):
        for k in range(view.repeats):
            req = read_requests(view.cell(v, k).suite_dir(suite))
            if req is None:
                continue
            vals = req.get(field) or []
            ok = [i for i in range(len(vals)) if request_ok(req, i)]
            if field == "itl_ms":
                xs = [x for i in ok for x in (vals[i] or [])]
            else:
                xs = [vals[i] for i in ok if vals[i] is not None]
            if xs:
                ax.ecdf(xs, label=f"{v} (rep{k}, n={len(xs)})", color=f"C{j}")
                drawn += 1
            break
    if not drawn:
        plt.close(fig)
        return None
    what = "TTFT" if field == "ttft_ms" else ("ITL" if field == "itl_ms" else field)
    ax.set_xlabel(f"{what} (ms)")
    ax.set_ylabel("fraction of requests <= x" if field != "itl_ms" else "fraction of tokens <= x")
    ax.set_title(f"ECDF of {what}" + (" per request" if field != "itl_ms" else " (all tokens)"),
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(title="variant", fontsize=8)
    _suptitle(fig, f"{what} distribution per variant", view.run_id)
    fig.tight_layout()
    return fig


def plot_mmmu_subjects(cmp: dict, variant: str | None = None) -> Figure | None:
    """Per-subject MMMU accuracy difference (variant - baseline, percentage points) with the
    number of wrong->right and right->wrong flips per subject: one panel per variant that is not
    A/A (side by side, subjects shared), or only ``variant`` when given. None without MMMU
    pairs."""
    pairs = cmp.get("mmmu_pairs") or {}
    if variant is not None:
        variants = [variant]
    else:
        variants = [v for v in pairs if v not in cmp.get("aa_variants", [])] or list(pairs)
    variants = [v for v in variants if ((pairs.get(v) or {}).get("subjects"))]
    if not variants:
        return None
    names = list(dict.fromkeys(s for v in variants for s in pairs[v]["subjects"]))
    fig, axes = _fig(max(3.0, 0.28 * len(names) + 1.5), ncols=len(variants))
    for k, (v, ax) in enumerate(zip(variants, axes)):
        p = pairs[v]
        subj = p["subjects"]
        diffs = [100 * (subj[s]["acc_b"] - subj[s]["acc_a"]) if s in subj else 0.0 for s in names]
        colors = ["C2" if d > 0 else ("C3" if d < 0 else "0.6") for d in diffs]
        ax.barh(range(len(names)), diffs, color=colors, label=f"{v} - {cmp.get('baseline')}")
        for i, s in enumerate(names):
            st = subj.get(s) or {}
            w2r, r2w = st.get("wrong_to_right", 0), st.get("right_to_wrong", 0)
            if w2r or r2w:
                ax.annotate(f"+{w2r}/-{r2w}", (diffs[i], i), xytext=(4 if diffs[i] >= 0 else -4, 0),
                            textcoords="offset points", va="center",
                            ha="left" if diffs[i] >= 0 else "right", fontsize=7)
        lim = max(5.0, 1.3 * max(abs(d) for d in diffs))  # all zero: a readable +-5 pp axis
        ax.set_xlim(-lim, lim)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(names)), names if k == 0 else [""] * len(names), fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("accuracy change (percentage points)")
        if k == 0:
            ax.set_ylabel("MMMU subject")
        ax.plot([], [], " ", label="+a/-b: wrong->right / right->wrong flips")
        ax.legend(fontsize=7, loc="best")
        ax.set_title(f"{v}: flips {p.get('flips')}, McNemar p = {_fmt_p(p.get('mcnemar_p'))}",
                     fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    _suptitle(fig, f"MMMU accuracy per subject: {', '.join(variants)} vs {cmp.get('baseline')}",
              cmp.get("run_id", ""))
    fig.tight_layout()
    return fig


def _fmt_p(p) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def plot_timeline(cmp: dict, metric: str | None = None) -> Figure | None:
    """A metric's value per cell in schedule order, one series per variant (drift shows as a
    trend shared by all variants). ``metric``: default the first tok/s metric, else the first
    metric. None without values."""
    rows = cmp.get("metrics") or []
    if not rows:
        return None
    if metric is None:
        metric = next((r["metric"] for r in rows if r.get("unit") == "tok/s"), rows[0]["metric"])
    mrows = [r for r in rows if r["metric"] == metric]
    if not mrows:
        return None
    values: dict[tuple[str, int], float] = {}
    base = cmp.get("baseline")
    for r in mrows:
        for k, v in enumerate(r.get("baseline_repeats") or []):
            if v is not None:
                values[(base, k)] = v
        for k, v in enumerate(r.get("variant_repeats") or []):
            if v is not None:
                values[(r["variant"], k)] = v
    if not values:
        return None
    sched = cmp.get("schedule") or []
    pos = {(c["variant"], c["repeat"]): c["position"] for c in sched}
    fig, (ax,) = _fig(4.5)
    variants = [base] + list(cmp.get("variants") or [])
    for j, v in enumerate(variants):
        pts = sorted((pos.get((vv, k), k), val) for (vv, k), val in values.items() if vv == v)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=f"C{j}", label=v)
    ax.set_xlabel("position in the schedule (cell number, execution order)")
    ax.set_ylabel(_label(metric, mrows[0].get("unit", "")))
    ax.set_title(f"{metric} per cell (drift shows as a trend shared by all variants)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(title="variant", fontsize=8)
    _suptitle(fig, "Repeat-by-repeat timeline", cmp.get("run_id", ""))
    fig.tight_layout()
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Save a figure as PNG (900 px wide at the figure's size) atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return records.write_bytes(path, buf.getvalue())


def make_plots(view: "RunView", cmp: dict, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Build and save every plot that has data into ``out_dir`` (usually RUN/plots).

    Returns (saved paths, notes about plots that failed). A failing plot does not stop the others.
    """
    out_dir = Path(out_dir)
    saved, notes = [], []
    jobs = [("throughput.png", lambda: plot_throughput(cmp)),
            ("latency.png", lambda: plot_latency(cmp)),
            ("ecdf_ttft.png", lambda: plot_ecdf(view, "ttft_ms")),
            ("ecdf_itl.png", lambda: plot_ecdf(view, "itl_ms")),
            ("mmmu_subjects.png", lambda: plot_mmmu_subjects(cmp)),
            ("timeline.png", lambda: plot_timeline(cmp))]
    for name, make in jobs:
        try:
            fig = make()
        except Exception as e:  # a plot must never cost the report
            notes.append(f"plot {name} failed: {type(e).__name__}: {e}")
            continue
        if fig is not None:
            saved.append(save_png(fig, out_dir / name))
    return saved, notes
