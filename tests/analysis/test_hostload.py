"""The host in the report (patchbench.analysis.hostload): each timed cell's load average, the
rule that warns when the load or the noise made the speed rows unreliable, and how report.md,
compare.json and the console show them. Every expected number is computed by hand in the
comments."""

from __future__ import annotations

import pytest

from patchbench import runfolder
from patchbench.analysis.build import build_comparison
from patchbench.analysis.comparison import (
    CellLoad,
    Comparison,
    HostLoad,
    Row,
    RunInfo,
    read_comparison,
    write_comparison,
)
from patchbench.analysis.hostload import load_warnings
from patchbench.report.markdown import render_markdown
from patchbench.report.text import console_summary, host_text
from patchbench.runfolder.models import HostInfo, LoadAverage
from patchbench.suite import MetricInfo
from tests.synthetic import declare_suite, make_run


def _cells(loads: dict[str, list[tuple[float, float]]]) -> list[CellLoad]:
    """{variant: [(start, end) per repeat]} as CellLoads."""
    return [
        CellLoad(variant=v, repeat=k, start=a, end=b)
        for v, pairs in loads.items()
        for k, (a, b) in enumerate(pairs)
    ]


def _cmp(sd: float = 0.02, n_pairs: int = 3) -> Comparison:
    """A run of baseline and patched whose one speed row has ``sd`` of paired log ratios over
    ``n_pairs`` pairs and a 5 % margin (compare.min_repeats 3 by default)."""
    row = Row(
        suite="serving",
        metric="ttft_median_ms",
        variant="patched",
        kind="run",
        primary=True,
        change_unit="%",
        log_ratio_sd=sd,
        margin=5.0,
        n_pairs=n_pairs,
    )
    return Comparison(baseline="baseline", variants=["patched"], rows=[row])


def test_a_quiet_host_with_even_arms_and_low_noise_gives_no_warning():
    # 2 CPUs: busy above 2 x 2 = 4 (highest here 1.8); arms: baseline mean
    # (1.0 + 1.2 + 0.8 + 1.0) / 4 = 1.0, patched (1.4 + 1.6 + 1.2 + 1.8) / 4 = 1.5, 0.5 apart
    # (limit 0.5 x 2 = 1.0); noise: CV 100 x 0.02 / sqrt 2 = 1.41 % below the 5 % margin
    host = HostLoad(
        cpu_count=2,
        cpu_usable=2,
        cells=_cells({"baseline": [(1.0, 1.2), (0.8, 1.0)], "patched": [(1.4, 1.6), (1.2, 1.8)]}),
    )
    assert load_warnings(host, _cmp()) == []


def test_an_oversubscribed_host_warns_once_naming_its_highest_load():
    # 2 usable CPUs: limit 4; the highest reading 6.8 is above it. The arms' means are equal
    # ((1.2 + 6.8) / 2 = 4.0 and (6.0 + 2.0) / 2 = 4.0), so no bias warning besides.
    host = HostLoad(
        cpu_count=2,
        cpu_usable=2,
        cells=_cells({"baseline": [(1.2, 6.8)], "patched": [(6.0, 2.0)]}),
    )
    assert load_warnings(host, _cmp()) == [
        "the host was oversubscribed during timed cells (1-minute load average up to 6.8 on 2 "
        "usable CPUs): speed rows measure the other work as much as the change; rerun on an "
        "idle host"
    ]


def test_arms_under_different_loads_warn_of_a_bias():
    # 4 usable CPUs (of 8): busy above 8 (highest 6.0: no); baseline mean
    # (1.0 + 1.4 + 1.2 + 1.2) / 4 = 1.2, patched (5.0 + 6.0 + 5.5 + 5.5) / 4 = 5.5: 4.3 apart,
    # above 0.5 x 4 = 2, and 5.5 is above the 4 usable CPUs
    host = HostLoad(
        cpu_count=8,
        cpu_usable=4,
        cells=_cells({"baseline": [(1.0, 1.4), (1.2, 1.2)], "patched": [(5.0, 6.0), (5.5, 5.5)]}),
    )
    assert load_warnings(host, _cmp()) == [
        "baseline's timed cells ran under a load of 1.2, patched's under 5.5 (mean 1-minute "
        "load average, 4 usable CPUs): speed rows compare a busy host with a quiet one; rerun "
        "on an idle host"
    ]


def test_arms_apart_on_a_host_with_cpus_to_spare_do_not_warn():
    # 16 CPUs: baseline 1.0, patched 9.5: 8.5 apart (above 0.5 x 16 = 8) but the busier arm's
    # 9.5 never exceeded the 16 CPUs (no cell waited for one); highest 9.5 below 32
    host = HostLoad(cpu_count=16, cells=_cells({"baseline": [(1.0, 1.0)], "patched": [(9.5, 9.5)]}))
    assert load_warnings(host, _cmp()) == []


def test_without_the_usable_cpus_the_logical_count_is_the_limit():
    # an older manifest: cpu_usable None, cpu_count 2: limit 2 x 2 = 4, reading 4.5 above it
    host = HostLoad(cpu_count=2, cells=_cells({"baseline": [(4.5, 1.0)]}))
    assert host.cores() == 2
    assert len(load_warnings(host, _cmp())) == 1
    assert load_warnings(HostLoad(cells=host.cells), _cmp()) == []  # no CPU count: no rule


def test_noise_above_the_margin_warns_and_too_few_pairs_do_not_count():
    # three speed rows, sd 0.1, 0.2, 0.3: median 0.2, CV 100 x 0.2 / sqrt 2 = 14.14 %, above
    # the 5 % margin; no load recorded
    cmp = _cmp(0.2)
    cmp.rows += [cmp.rows[0].model_copy(update={"log_ratio_sd": sd}) for sd in (0.1, 0.3)]
    assert load_warnings(HostLoad(cpu_count=2), cmp) == [
        "the speed rows' run-to-run CV (14.1%) is above their margin (5%): this run cannot tell "
        "a change of that size from noise; rerun on an idle host or with more repeats"
    ]
    # 2 pairs, fewer than the 3 a verdict needs: the answer already calls speed undecidable
    assert load_warnings(HostLoad(cpu_count=2), _cmp(0.2, n_pairs=2)) == []


DECL = {"ttft_median_ms": MetricInfo("lower", "ms", label="Median TTFT", primary=True, margin=5.0)}


@pytest.fixture
def busy_run(tmp_path, monkeypatch):
    """A synthetic run (baseline, patched; 3 interleaved repeats) on 4 CPUs of which 2 are
    usable, whose patched cells ran under a load of 5 and the baseline's under 1."""
    declare_suite(monkeypatch, "bench", DECL)
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "ttft_median_ms": {"baseline": [50, 51, 49], "patched": [55, 56.1, 53.9]},
            }
        },
    )
    m = runfolder.read_manifest(run)
    m.host = HostInfo(cpu_count=4, cpu_usable=2, memory_total_gib=7.5)
    runfolder.write_manifest(run, m)
    for v, load in (("baseline", 1.0), ("patched", 5.0)):
        for k in range(3):
            rec = runfolder.read_cell(run / v / f"rep{k}")
            rec.load_avg_1m = LoadAverage(start=load - 0.5 + k * 0.1, end=load)
            runfolder.write_cell(run / v / f"rep{k}", rec)
    return run


def test_the_report_names_the_host_and_warns_in_the_answer(busy_run, capsys):
    cmp = build_comparison(busy_run)
    h = cmp.run.host
    assert (h.cpu_count, h.cpu_usable, h.memory_total_gib) == (4, 2, 7.5)
    # cells in the order they ran (interleaved: round 1 reversed)
    assert [(c.variant, c.repeat) for c in h.cells] == [
        ("baseline", 0),
        ("patched", 0),
        ("patched", 1),
        ("baseline", 1),
        ("baseline", 2),
        ("patched", 2),
    ]
    # readings 0.5-1.0 (baseline) and 4.5-5.0 (patched): highest 5.0 above 2 x 2 = 4 (busy);
    # means: baseline (0.5 + 0.6 + 0.7 + 3 x 1.0) / 6 = 0.8, patched (4.5 + 4.6 + 4.7 + 15) / 6
    # = 4.8; 4.0 apart, above 0.5 x 2 = 1 (uneven)
    assert [w.split(" (")[0] for w in h.warnings] == [
        "the host was oversubscribed during timed cells",
        "baseline's timed cells ran under a load of 0.8, patched's under 4.8",
    ]
    text = render_markdown(cmp)
    assert (
        "| host | 4 CPUs (2 usable), 7.5 GiB; 1-minute load average 0.5-5.0 (timed cells, "
        "start and end) |" in text
    )
    answer = text.split("## Answer", 1)[1].split("## What ran", 1)[0]
    assert answer.index("**Warning (host): the host was oversubscribed") < answer.index(
        "- patched vs baseline"
    )
    assert "rerun on an idle host.**" in answer
    console_summary(cmp)
    out = capsys.readouterr().out
    assert "host: 4 CPUs (2 usable), 7.5 GiB, no GPU; 1-minute load average 0.5-5.0" in out
    assert "Warning (host): baseline's timed cells ran under a load of 0.8" in out


def test_compare_json_carries_the_host_and_an_old_one_reads_without_it(busy_run):
    cmp = build_comparison(busy_run)
    write_comparison(busy_run, cmp)
    back = read_comparison(busy_run)
    assert back.run.host == cmp.run.host and len(back.run.host.warnings) == 2
    # a compare.json from before the host was recorded: no host row, no warning
    old = Comparison(baseline="baseline", variants=["patched"], run=RunInfo(name="old"))
    assert old.run.host is None and host_text(old) is None
    assert "| host |" not in render_markdown(old) and "Warning (host)" not in render_markdown(old)


def test_a_run_from_before_the_loads_says_they_were_not_recorded(busy_run):
    for v in ("baseline", "patched"):
        for k in range(3):
            rec = runfolder.read_cell(busy_run / v / f"rep{k}")
            rec.load_avg_1m = None
            runfolder.write_cell(busy_run / v / f"rep{k}", rec)
    cmp = build_comparison(busy_run)
    assert cmp.run.host.cells == [] and cmp.run.host.warnings == []
    assert host_text(cmp) == "4 CPUs (2 usable), 7.5 GiB, no GPU; load average not recorded"
