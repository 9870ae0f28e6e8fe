"""Figures that cannot be misread: each rule's decision as a pure function of
:mod:`patchbench.report.figtext` checked on hand-made inputs, then every figure rendered (Agg)
from the golden demo comparison or a synthetic sweep, its texts read off the Figure and Axes
objects (no pixel goldens)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection

from patchbench.analysis.comparison import read_comparison
from patchbench.report import figtext, plots

GOLDEN = Path(__file__).parent.parent / "data" / "golden" / "demo-cpu" / "expected"
DEMO_SUBTITLE = "Qwen2.5-VL tiny (random weights) on CPU, sglang 0.5.1.post3, 2 paired repeats"
NOTE = "2 paired repeats: fewer than compare.min_repeats = 3 cannot separate the patch from noise"


# ------------------------------------------------------------------- rule 2: the subtitle


def test_model_name_is_the_last_part_or_the_tiny_model():
    assert figtext.model_name("Qwen/Qwen2.5-VL-7B-Instruct", False) == "Qwen2.5-VL-7B-Instruct"
    assert figtext.model_name("/models/llama-3-8b/", False) == "llama-3-8b"
    assert figtext.model_name(".cache/models/tiny-qwen25vl-tf4", True) == (
        "Qwen2.5-VL tiny (random weights)"
    )


def test_hardware_is_the_gpu_name_else_cpu():
    assert figtext.hardware(None) == "CPU"
    assert figtext.hardware("NVIDIA H200 x8") == "NVIDIA H200 x8"


def test_subtitle_counts_run_pairs_not_questions_nor_planned_rounds():
    """3 rounds planned, a failed cell left 2 pairs; the accuracy row's 63 questions are not
    repeats."""
    cmp = {
        "repeats": 3,
        "run": {"model": ".cache/models/x", "tiny": True, "gpu": None, "sglang": "0.5.1.post3"},
        "rows": [{"kind": "run", "n_pairs": 2}, {"kind": "accuracy", "n_pairs": 63}],
    }
    assert figtext.subtitle(cmp) == DEMO_SUBTITLE
    gpu = {
        "repeats": 1,
        "run": {"model": "meta/Llama-3-8B", "gpu": "NVIDIA H100 80GB HBM3", "sglang": "?"},
        "rows": [],
    }
    assert figtext.subtitle(gpu) == "Llama-3-8B on NVIDIA H100 80GB HBM3, 1 paired repeat"
    assert figtext.figure_title("T", {**gpu, "run_id": "R"}) == (
        "T\nLlama-3-8B on NVIDIA H100 80GB HBM3, 1 paired repeat   [R]"
    )


# ------------------------------------------------------------------- rule 1: bands, hollow points


def _row(**kw):
    return {"kind": "run", "n_pairs": 6, "margin": 5.0, "low": None, "high": None, **kw}


def test_only_points_with_an_interval_and_a_margin_get_a_band():
    rows = [
        (0, _row(low=-1.0, high=2.0)),
        (1, _row(change=9.1)),  # no interval: no band, whatever its margin
        (2, _row(low=-1.0, high=2.0, margin=None)),  # no margin: nothing to shade
        (3, _row(low=-3.0)),  # one end only
    ]
    assert figtext.band_points(rows) == [0]
    assert [figtext.has_interval(r) for _, r in rows] == [True, False, True, False]


def test_no_interval_reason_names_the_repeats_needed():
    assert figtext.no_interval_reason(_row(n_pairs=2, notes=[NOTE])) == "n < 3"
    assert figtext.no_interval_reason(_row(n_pairs=1), min_repeats=4) == "n < 4"
    other = _row(notes=["request bootstrap failed: 2 values"])
    assert figtext.no_interval_reason(other) == "request bootstrap failed"
    assert figtext.no_interval_reason(_row()) == "no interval"
    assert figtext.no_interval_label(_row(n_pairs=2, notes=[NOTE])) == "no interval: n < 3"
    assert figtext.no_interval_label(_row()) == "no interval"


# ------------------------------------------------------------------- rule 3: values


def test_values_text_shows_baseline_to_variant_with_the_unit():
    thr = _row(unit="tok/s", baseline_value=236.853, variant_value=258.411)
    assert figtext.values_text(thr) == "236.9 -> 258.4 tok/s"
    assert figtext.values_text(_row(unit="ms", baseline_value=1234.6, variant_value=18.04)) == (
        "1,235 -> 18.04 ms"
    )
    acc = _row(kind="accuracy", unit="acc", baseline_value=0.413, variant_value=0.44)
    assert figtext.values_text(acc) == "41.3% -> 44.0%"
    count = _row(kind="deterministic", unit="count", baseline_value=507.0, variant_value=6.0)
    assert figtext.values_text({**count, "variant_bound": "lower"}) == "507 -> ≥6"
    # a sweep's highest load beyond its last point in both arms: said once, as a bound
    both = _row(unit="req", baseline_value=8.0, variant_value=8.0)
    both |= {"baseline_bound": "lower", "variant_bound": "lower"}
    assert figtext.values_text(both) == "both ≥8 req: a bound"
    assert figtext.values_text(_row(unit="ms", baseline_value=1.0)) is None
    assert [figtext.unit_label(u, k) for u, k in [("tok/s", "run"), ("acc", "accuracy")]] == [
        "tok/s",
        "%",
    ]
    assert figtext.unit_label("count", "deterministic") == ""


# ------------------------------------------------------------------- rule 4: titles


def test_change_title_names_intervals_only_where_drawn():
    none = figtext.change_title(0, 4)
    assert "intervals" not in none and "Holm" not in none and "no interval" in none
    some = figtext.change_title(2, 4)
    assert "where there is one" in some
    assert figtext.change_title(4, 4) == "paired change with its interval (Holm-adjusted level)"


# ------------------------------------------------------------------- rule 5: one repeat


def test_median_and_opposite_direction():
    assert figtext.median([3.0, 1.0, 2.0]) == 2.0
    assert figtext.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert figtext.median([]) is None
    assert figtext.opposite(2.74, -8.8) is True
    assert figtext.opposite(-1.0, 3.0) is True
    assert figtext.opposite(2.0, 17.9) is False
    assert figtext.opposite(0.0, -3.0) is False and figtext.opposite(None, 1.0) is False
    assert figtext.repeat_shift_note("pr", 2.74, "ms", -8.83) == (
        "pr: this repeat's shift (+2.74 ms median) is opposite to the paired estimate (-8.8%)"
    )


def test_ecdf_notes_only_the_variant_whose_repeat_points_the_other_way():
    from patchbench.suites.serving.render import ecdf_opposite_notes

    base = {"ttft_ms": [10.0, 20.0, 30.0]}
    cmp = {
        "baseline": "baseline",
        "rows": [
            {"suite": "serving", "metric": "ttft_median_ms", "variant": v, "change": -5.0}
            for v in ("a", "b")
        ],
        "pairs": {
            "serving": {
                # medians 22 vs 20: +2 ms, while the paired estimate is -5 %
                "a": {"ecdf": {"baseline": base, "variant": {"ttft_ms": [12.0, 22.0, 32.0]}}},
                # medians 18 vs 20: -2 ms, as the estimate
                "b": {"ecdf": {"baseline": base, "variant": {"ttft_ms": [8.0, 18.0, 28.0]}}},
            }
        },
    }
    assert ecdf_opposite_notes(cmp, "ttft_ms") == [
        "a: this repeat's shift (+2 ms median) is opposite to the paired estimate (-5.0%)"
    ]


# ------------------------------------------------------------------- rules 6, 7


def test_timeline_title_says_profiled_untimed():
    t = figtext.timeline_title(4, "3", 3)
    assert t.startswith("4 consecutive decode steps, concurrency 3 (batch size 3)")
    assert "profiled, untimed" in t


def test_per_gpu_only_on_a_gpu():
    assert figtext.per_device({"run": {"gpu": None}}) == "per server"
    assert figtext.per_device({"run": {"gpu": "NVIDIA H200"}}) == "per GPU"


# ------------------------------------------------------------------- rendered figures


@pytest.fixture
def captured(monkeypatch):
    """The figures the suites' plots save (``patchbench.suites.save_png``), kept open."""
    import patchbench.suites as S

    got: list = []

    def keep(fig, path, dpi=100):
        got.append(fig)
        return Path(path)

    monkeypatch.setattr(S, "save_png", keep)
    yield got
    for fig in got:
        plt.close(fig)


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def _bands(ax) -> list:
    """The shaded regions on ``ax``: fill_between's polygons and axvspan's / axhspan's
    rectangles."""
    return [c for c in ax.collections if isinstance(c, PolyCollection)] + list(ax.patches)


def test_pr_figure_of_the_demo_reads_as_the_verdicts():
    """The demo: 2 paired repeats, every run primary inconclusive without an interval, accuracy
    with one (63 questions)."""
    cmp = read_comparison(GOLDEN / "compare.json")
    fig = plots.plot_pr_figure(cmp)
    try:
        title = fig.get_suptitle()
        assert DEMO_SUBTITLE in title and "intervals" not in title
        by = {ax.get_title(): ax for ax in fig.axes if ax.axison}
        thr = by["Output token throughput"]
        # no band, no margin label: nothing around the hollow points says "equivalent"
        assert not _bands(thr)
        assert not any(t.startswith("margin") for t in _texts(thr))
        dots = [ln for ln in thr.lines if len(ln.get_xdata()) == 1]
        assert len(dots) == 2
        assert all(ln.get_markerfacecolor() == "white" for ln in dots)
        assert all(ln.get_color() == "tab:gray" for ln in dots)
        # baseline -> variant beside each change (compare.json: 236.85, 258.41 and 225.69 tok/s)
        assert "236.9 -> 258.4 tok/s" in _texts(thr) and "236.9 -> 225.7 tok/s" in _texts(thr)
        assert "456.9 -> 420.7 ms" in _texts(by["Median E2E Latency"])
        acc = by["Overall accuracy"]
        assert len(_bands(acc)) == 2
        assert "0.0% -> 0.0%" in _texts(acc)
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "no interval: n < 3" in legend and "no interval" not in legend
    finally:
        plt.close(fig)


def test_ecdf_of_the_demo_says_one_repeat_and_the_opposite_shift(captured):
    """ITL of the demo: pr9460-upstream's paired estimate is -8.8 % (compare.json) while its
    repeat-0 ECDF lies right of the baseline's; mrope-sync-free's +17.9 % agrees with its curve."""
    from patchbench.suites.serving.render import plot_ecdf

    cmp = read_comparison(GOLDEN / "compare.json")
    assert plot_ecdf(cmp, "itl_ms", Path("ecdf_itl.png")) is not None
    (fig,) = captured
    (ax,) = fig.axes
    assert "one repeat" in ax.get_title() and "one repeat" in fig.get_suptitle()
    assert DEMO_SUBTITLE in fig.get_suptitle()
    (note,) = _texts(ax)
    assert note.startswith("pr9460-upstream: this repeat's shift (+")
    assert note.endswith("is opposite to the paired estimate (-8.8%)")
    assert "mrope-sync-free" not in note


def test_timeline_of_the_demo_is_captioned_profiled_untimed(captured):
    from patchbench.suites.profile import ProfileSuite

    cmp = read_comparison(GOLDEN / "compare.json")
    paths = ProfileSuite().plots(cmp, Path("plots"))
    assert [p.name for p in paths] == [
        "profile_timeline_pr9460-upstream.png",
        "profile_timeline_mrope-sync-free.png",
    ]
    for fig in captured:
        assert "profiled, untimed" in fig.axes[0].get_title()
        assert DEMO_SUBTITLE in fig.get_suptitle()


def _sweep(tmp_path, n):
    from patchbench.analysis.build import build_comparison
    from tests.synthetic import make_sweep_run

    return build_comparison(make_sweep_run(tmp_path, gains={"c1": 1.15}, n=n))


def test_curve_change_without_intervals_names_none(tmp_path, captured):
    from patchbench.suites.serving.render import plot_change

    plot_change(_sweep(tmp_path, 2), Path("curve_change.png"))
    (fig,) = captured
    title = fig.get_suptitle()
    assert "intervals" not in title and "Holm" not in title
    assert "2 paired repeats" in title and " on CPU" in title
    for ax in fig.axes:  # 4 points x 1 variant, all hollow grey, no band
        assert not _bands(ax)
        dots = [ln for ln in ax.lines if len(ln.get_xdata()) == 1]
        assert len(dots) == 4 and all(ln.get_markerfacecolor() == "white" for ln in dots)
    assert "no interval: n < 3" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_curve_change_with_intervals_bands_each_point(tmp_path, captured):
    from patchbench.suites.serving.render import plot_change

    plot_change(_sweep(tmp_path, 6), Path("curve_change.png"))
    (fig,) = captured
    assert "Holm-adjusted" in fig.get_suptitle()
    for ax in fig.axes:  # one band behind each of the 4 points
        assert len(_bands(ax)) == 4


def test_frontier_says_per_gpu_only_on_a_gpu(tmp_path, captured):
    from patchbench.suites.serving.render import plot_frontier

    cmp = _sweep(tmp_path, 2)
    plot_frontier(cmp, Path("curve_frontier.png"))
    on_gpu = cmp.model_dump(mode="json")
    on_gpu["run"]["gpu"] = "NVIDIA H200"
    plot_frontier(on_gpu, Path("curve_frontier.png"))
    cpu, gpu = captured
    assert "per GPU" not in cpu.axes[0].get_ylabel() + cpu.axes[0].get_title()
    assert cpu.axes[0].get_ylabel() == "output tokens/s per server"
    assert gpu.axes[0].get_ylabel() == "output tokens/s per GPU"
    assert "on NVIDIA H200" in gpu.get_suptitle()


def test_curve_latency_points_are_the_geometric_means_the_tables_print(tmp_path, captured):
    """Each point of curve_latency.png is (median ITL, output throughput) at the geometric mean
    of the arm's repeats, the value report.md prints (a median of two repeats is their
    arithmetic mean, which the figure once drew)."""
    import math

    from patchbench.suites.serving.render import plot_latency

    cmp = _sweep(tmp_path, 2)
    plot_latency(cmp, Path("curve_latency.png"))
    (fig,) = captured

    def gm(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    row = {r.metric: r for r in cmp.rows if r.variant == "patched"}
    want = sorted(
        (
            gm(row[f"itl_median_ms@{k}"].baseline_repeats),
            gm(row[f"output_throughput_tok_s@{k}"].baseline_repeats),
        )
        for k in ("c1", "c4", "c16", "c64")
    )
    solid = next(ln for ln in fig.axes[0].lines if ln.get_label() == "baseline (median ITL)")
    got = sorted(zip(solid.get_xdata(), solid.get_ydata(), strict=True))
    assert got == [pytest.approx(p, rel=1e-12) for p in want]
