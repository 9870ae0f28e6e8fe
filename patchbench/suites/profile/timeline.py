"""The profile suite's timeline figure: a few consecutive decode steps, baseline above variant, each
a host lane (steps, mrope ranges, sync points) and, with GPU work, a GPU lane (merged busy
intervals), in ms from the first shown step; from the ``timeline_excerpt`` dicts ``pair`` stores."""

from __future__ import annotations

from pathlib import Path

from patchbench.report.figtext import timeline_title


def _lane(ax, y, tl: dict, label: str) -> list[str]:
    labels = []
    ms = 1e-3
    ax.broken_barh(
        [(s["ts"] * ms, s["dur"] * ms) for s in tl.get("steps", [])],
        (y + 0.55, 0.35),
        facecolors="#9ecae1",
        edgecolor="#3182bd",
        linewidth=0.5,
    )
    if tl.get("mrope"):
        ax.broken_barh(
            [(a * ms, d * ms) for a, d in tl["mrope"]], (y + 0.6, 0.25), facecolors="#fd8d3c"
        )
    syncs = tl.get("syncs") or []
    xs_in = [t * ms for t, inside in syncs if inside]
    xs_out = [t * ms for t, inside in syncs if not inside]
    if xs_out:
        ax.plot(xs_out, [y + 0.95] * len(xs_out), "|", color="#de2d26", markersize=8)
    if xs_in:
        ax.plot(xs_in, [y + 0.95] * len(xs_in), "v", color="#a50f15", markersize=5)
    labels.append((y + 0.72, f"{label}: host"))
    if tl.get("gpu"):
        ax.broken_barh(
            [(a * ms, d * ms) for a, d in tl["gpu"]], (y + 0.1, 0.3), facecolors="#31a354"
        )
        labels.append((y + 0.25, f"{label}: GPU"))
    return labels


def legend_labels(base: dict, var: dict) -> list[str]:
    """The legend entries for what either excerpt shows (the decode step always)."""
    both = (base, var)
    syncs = [s for tl in both for s in (tl.get("syncs") or [])]
    shown = ["decode step (host)"]
    if any(tl.get("mrope") for tl in both):
        shown.append("mrope")
    if any(tl.get("gpu") for tl in both):
        shown.append("GPU busy")
    if any(not inside for _, inside in syncs):
        shown.append("host sync")
    if any(inside for _, inside in syncs):
        shown.append("sync in mrope")
    return shown


def plot_timeline(
    base: dict,
    var: dict,
    base_name: str,
    var_name: str,
    out: Path,
    title: str = "",
    suptitle: str = "",
) -> Path:
    """Write one PNG (1200 x 480 px) comparing two timeline excerpts, ``title`` over the axes and
    ``suptitle`` (the run's subtitle) over the figure; returns its path."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from patchbench.suites import new_figure, save_png

    fig, (ax,) = new_figure(4.0, width_in=10.0)
    ticks = _lane(ax, 1.2, base, base_name) + _lane(ax, 0.0, var, var_name)
    ax.set_yticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=8)
    span = max(base.get("span_us", 0), var.get("span_us", 0)) * 1e-3
    ax.set_xlim(0, span * 1.02 if span else 1)
    ax.set_ylim(-0.1, 2.4)
    ax.set_xlabel("ms from the first shown decode step's start")
    ax.set_title(title, fontsize=10)
    handles = {
        "decode step (host)": Patch(color="#9ecae1", label="decode step (host)"),
        "mrope": Patch(color="#fd8d3c", label="mrope"),
        "GPU busy": Patch(color="#31a354", label="GPU busy"),
        "host sync": Line2D([], [], ls="", marker="|", color="#de2d26", label="host sync"),
        "sync in mrope": Line2D([], [], ls="", marker="v", color="#a50f15", label="sync in mrope"),
    }
    shown = legend_labels(base, var)
    ax.legend(
        handles=[handles[k] for k in shown],
        fontsize=7,
        loc="upper right",
        ncol=len(shown),
        framealpha=0.9,
    )
    ax.grid(axis="x", alpha=0.3)
    if suptitle:
        fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    return save_png(fig, out, dpi=120)


def plot_pairs(
    pairs: dict[str, dict], base_name: str, out_dir: Path, subtitle: str = ""
) -> list[Path]:
    """One ``profile_timeline_<variant>.png`` per variant whose pair holds timelines of both sides
    (the highest concurrency both have), titled "profiled, untimed"
    (patchbench.report.figtext.timeline_title) over ``subtitle``."""
    out = []
    for var, p in pairs.items():
        tls = (p or {}).get("timeline") or {}
        b, v = tls.get("baseline") or {}, tls.get("variant") or {}
        common = sorted(set(b) & set(v), key=int)
        if not common:
            continue
        c = common[-1]
        bs = ((b[c].get("steps") or [{}])[0]).get("batch_size")
        out.append(
            plot_timeline(
                b[c],
                v[c],
                base_name,
                var,
                Path(out_dir) / f"profile_timeline_{var}.png",
                title=timeline_title(len(b[c].get("steps", [])), c, bs),
                suptitle=subtitle,
            )
        )
    return out
