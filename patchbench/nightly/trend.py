"""Nightly trend plots: per gated metric, each variant's nightly medians and tonight's point.

``plots/nightly-<suite>.<metric>.png`` in the run folder (written by patchbench.nightly.job).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from patchbench.config.nightly import NightlySettings
from patchbench.nightly.gates import GateResult, metric_unit
from patchbench.nightly.history import Key, Night


def _dt(s: str) -> datetime:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")


def plot_trend(
    prior: Sequence[Night],
    tonight: Night,
    suite: str,
    metric: str,
    results: list[GateResult],
    settings: NightlySettings,
):
    """A matplotlib Figure: per variant, the nightly medians of the history, the range of the
    runs of the nights the history gate used (:func:`gate_window`: red and off nights it left
    out are not in the band; without a history gate the last K nights), and tonight's point (red edge when a gate
    failed). x: night (UTC; concise dates, the year or month once at the axis' end), y: the
    metric in its unit; the legend below the axes. The caller saves and closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    unit = metric_unit(suite, metric, [tonight, *prior])
    fig, ax = plt.subplots(figsize=(8, 5.2), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, variant in enumerate(tonight.variants):
        failed = any(
            r.status == "fail" and r.variant == variant and r.suite == suite and r.metric == metric
            for r in results
        )
        col = colors[i % len(colors)]
        used = gate_window(results, (variant, suite, metric))
        _plot_variant(ax, prior, tonight, (variant, suite, metric), col, failed, settings, used)
    ax.set_title(f"{suite}.{metric}: nightly trend ({tonight.config_name})")
    ax.set_xlabel("night (UTC)")
    ax.set_ylabel(f"{metric} [{unit}]" if unit else metric)
    # the legend below the axes, one column per variant, so it never covers a point
    ax.legend(
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=max(1, len(tonight.variants)),
        frameon=False,
    )
    ax.grid(alpha=0.3)
    locator = mdates.AutoDateLocator(minticks=4, maxticks=9)
    ax.xaxis.set_major_locator(locator)
    # day ticks as "Jan 08"; the year once, at the axis' end
    ax.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(
            locator,
            formats=["%Y", "%b", "%b %d", "%H:%M", "%H:%M", "%S.%f"],
            zero_formats=["", "%Y", "%b %d", "%b %d", "%H:%M", "%H:%M"],
            offset_formats=["", "%Y", "%Y", "%Y-%m-%d", "%Y-%m-%d", "%Y-%m-%d %H:%M"],
        )
    )
    ax.tick_params(axis="x", labelrotation=30)
    fig.text(0.99, 0.01, f"run {tonight.run_id}", ha="right", va="bottom", fontsize=7, color="gray")
    fig.tight_layout()
    return fig


def gate_window(results: Sequence[GateResult], key: Key) -> list[str] | None:
    """The run ids of the nights the history gate of ``key`` (variant, suite, metric) compared
    tonight with (its ``window_run_ids``: the clean nights, red or off nights left out); None
    when no history gate tested ``key``."""
    variant, suite, metric = key
    for r in results:
        if (r.kind, r.variant, r.suite, r.metric) == ("history", variant, suite, metric):
            return list(r.window_run_ids)
    return None


def band_nights(
    prior: Sequence[Night], key: Key, used: list[str] | None, window_nights: int
) -> list[Night]:
    """The nights whose runs make ``key``'s band: those the gate used (``used``, from
    :func:`gate_window`), else (no history gate) the last ``window_nights`` nights with a
    value."""
    hist = [n for n in prior if n.median(key) is not None]
    if used is None:
        return hist[-window_nights:]
    ids = set(used)
    return [n for n in hist if n.run_id in ids]


def _plot_variant(
    ax,
    prior: Sequence[Night],
    tonight: Night,
    key: Key,
    col: str,
    failed: bool,
    settings: NightlySettings,
    used: list[str] | None = None,
) -> None:
    """One variant on ``ax``: its nightly medians, the range of the band's runs
    (:func:`band_nights`), tonight."""
    variant = key[0]
    hist = [n for n in prior if n.median(key) is not None]
    if hist:
        ax.plot(
            [_dt(n.night_utc) for n in hist],
            [n.median(key) for n in hist],
            "o-",
            color=col,
            ms=4,
            lw=1,
            alpha=0.8,
            label=f"{variant}: nightly median",
        )
    window = band_nights(prior, key, used, settings.window_nights)
    vals = [v for n in window for v in n.values.get(key, []) if v is not None]
    if window and vals:
        x0, x1 = _dt(window[0].night_utc), _dt(tonight.night_utc)
        ax.fill_between(
            [x0, x1],
            [min(vals)] * 2,
            [max(vals)] * 2,
            color=col,
            alpha=0.15,
            label=f"{variant}: runs of the {len(window)} nights "
            + ("the gate used" if used is not None else "before"),
        )
    value = tonight.median(key)
    if value is not None:
        ax.plot(
            [_dt(tonight.night_utc)],
            [value],
            marker="*",
            ms=14,
            color=col,
            markeredgecolor="red" if failed else "black",
            linestyle="none",
            label=f"{variant}: tonight{' (REGRESSION)' if failed else ''}",
        )


def write_plots(
    run_dir: Path,
    prior: Sequence[Night],
    tonight: Night,
    results: list[GateResult],
    settings: NightlySettings,
) -> tuple[list[str], list[str]]:
    """Write one trend plot per gated (suite, metric); returns (written paths relative to
    ``run_dir``, problems). A failing plot never hides the verdict: it becomes a problem line."""
    import io

    import matplotlib

    matplotlib.use("Agg")
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
        except Exception as e:  # noqa: BLE001 (reported, never hides the verdict)
            problems.append(f"trend plot {rel} failed: {type(e).__name__}: {e}")
    return done, problems


__all__ = ["band_nights", "gate_window", "plot_trend", "write_plots"]
