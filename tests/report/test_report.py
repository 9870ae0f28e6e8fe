"""report.md, plots and the report command, rendered only from the typed comparison."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patchbench import records, report, runfolder
from patchbench.analysis.build import build_comparison
from patchbench.analysis.comparison import Comparison, read_comparison
from patchbench.report.text import exactness, fmt_change, sentence_parts, verdict_text
from patchbench.suite import MetricInfo
from tests.synthetic import declare_suite, make_run

OLD_RUN = Path(__file__).parent.parent / "data" / "old-run"
DECL = {
    "output_throughput_tok_s": MetricInfo(
        "higher", "tok/s", label="Output throughput", primary=True, margin=5.0
    ),
    "mean_ttft_ms": MetricInfo("lower", "ms", label="Mean TTFT", primary=True, margin=5.0),
    "retokenized_count": MetricInfo("none", "count"),
}


@pytest.fixture(autouse=True)
def declared(monkeypatch):
    declare_suite(monkeypatch, "bench", DECL)


def _run(tmp_path):
    return make_run(
        tmp_path,
        variants={"baseline": [], "aa": [], "patched": ["p1"]},
        metrics={
            "bench": {
                "output_throughput_tok_s": {
                    "baseline": [100, 102, 98],
                    "aa": [100.5, 101.5, 98.4],
                    "patched": [110, 112.2, 107.8],
                },
                "mean_ttft_ms": {
                    "baseline": [50, 51, 49],
                    "aa": [50, 51, 49],
                    "patched": [50.2, 51.2, 49.2],
                },
                "retokenized_count": {
                    "baseline": [10, 10, 10],
                    "aa": [10, 10, 10],
                    "patched": [11, 11, 11],
                },
            }
        },
    )


def test_report_leads_with_sentences_then_primaries_and_links_the_secondaries(tmp_path):
    run = _run(tmp_path)
    text = report.render_run(run, plots=False).read_text()
    details = (run / "report-details.md").read_text()
    cmp = read_comparison(run)
    thr = cmp.row("bench", "output_throughput_tok_s", "patched")
    # +10 % in every repeat: the log ratio has zero spread; p = 0, interval the point
    assert thr.change == pytest.approx(10.0) and thr.verdict == "improved"
    want = (
        "patched vs baseline: Output throughput +10.0% [+10.0%, +10.0%] improved; Mean TTFT +0.4% "
    )
    assert want in text
    answer, primaries = text.index("## Answer"), text.index("## Primary metrics")
    link = text.index("[report-details.md](report-details.md): each primary's values per repeat")
    assert answer < primaries < link
    assert "Holm-adjusted level" in text and "| 97.50% |" in text  # first of 2 primaries: 0.05/2
    # the secondaries are in the details file, not in report.md
    assert "`retokenized_count`" not in text and "## Secondary metrics" not in text
    assert "## Secondary metrics" in details and "`retokenized_count`" in details
    assert "Exploratory: raw 95% intervals" in details
    sec = details[details.index("## Secondary metrics") :]
    # one table per suite, headed by the suite and its row count
    n = sum(1 for r in read_comparison(run).rows if not r.primary)
    assert (
        f"### bench ({n} row{'s' if n != 1 else ''})" in sec
        and "| variant | metric | baseline |" in sec
    )
    assert "🟢" not in sec and "🔴" not in sec and "🔵" not in sec  # no coloured verdicts there
    assert "aa (A/A) vs baseline" in text and "## A/A noise" in text and "run-to-run CV" in text


def test_console_ends_with_the_same_sentences(tmp_path, capsys):
    run = _run(tmp_path)
    path = report.render_run(run, plots=False)
    sents = report.console_summary(read_comparison(run), path)
    out = capsys.readouterr().out
    text = path.read_text()
    assert sents and all(f"- {s}" in text for s in sents)
    # the answer once: one line per variant, in variant order, last; nothing else repeats it
    head, parts = sentence_parts(read_comparison(run), "patched")
    assert sents[-1] == head + "; ".join(parts)
    lines = out.rstrip().splitlines()
    assert lines[-len(sents) :] == sents
    assert all(out.count(s) == 1 for s in sents)
    assert not any(line.startswith("  - ") for line in lines)


def test_refusal_shown_instead_of_numbers(tmp_path):
    run = _run(tmp_path)
    cmp = read_comparison(report.render_run(run, plots=False).parent)
    cmp.refusals = {"bench": {"patched": "different prompts at index 3"}}
    text = report.render_markdown(cmp)
    assert "bench / patched: not paired** - different prompts at index 3" in text
    assert "bench not paired: different prompts at index 3" in report.sentence(cmp, "patched")


def test_pr_figure_written(tmp_path):
    run = _run(tmp_path)
    report.render_run(run, plots=True)
    png = run / "plots" / "pr_figure.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![pr_figure](plots/pr_figure.png)" in (run / "report.md").read_text()


def test_cli_report_exit_codes(tmp_path):
    from patchbench import cli

    run = _run(tmp_path)
    assert cli.main(["report", str(run), "--no-plots"]) == 0
    assert cli.main(["report", str(tmp_path / "nothing")]) == 2
    records.write_json(run / "manifest.json", {"schema_version": 99})
    assert cli.main(["report", str(run)]) == 2


def test_committed_old_run_folder_still_renders(tmp_path):
    run = shutil.copytree(OLD_RUN, tmp_path / "old-run")
    text = report.render_run(run, plots=False).read_text()
    cmp = read_comparison(run)
    row = cmp.row("serving", "output_throughput_tok_s", "patched")
    # rep0 of the variant ran the old in-server probe: its timings feed no verdict, which leaves
    # 2 paired repeats, fewer than min_repeats 3
    assert row.verdict == "inconclusive" and row.n_pairs == 2
    assert any("rep0: an instrumented cell" in n for n in row.notes)
    assert "patched vs baseline" in text
    assert any("noise_floor_from" in n for n in cmp.notes)  # an old setting, dropped with a note
    man = runfolder.read_manifest(run)
    assert man.migrated_from == 1
    assert runfolder.read_cell(run / "patched" / "rep0").instrumented  # old mrope probe cell


def test_every_file_the_code_writes_validates(tmp_path):
    run = _run(tmp_path)
    report.render_run(run, plots=False)
    Comparison.model_validate(json.loads((run / "compare.json").read_text()))
    runfolder.write_manifest(run, runfolder.read_manifest(run))
    assert (
        json.loads((run / "manifest.json").read_text())["schema_version"]
        == runfolder.MANIFEST_SCHEMA
    )
    for cj in run.glob("*/rep*/cell.json"):
        runfolder.write_cell(cj.parent, runfolder.read_cell(cj))
        assert runfolder.read_cell(cj).status == "ok"
    for sj in run.glob("*/rep*/*/summary.json"):
        assert runfolder.read_summary(sj).status == "ok"


def test_future_comparison_schema_refused(tmp_path):
    records.write_json(tmp_path / "compare.json", {"schema_version": 7})
    with pytest.raises(runfolder.SchemaTooNew, match="version 7"):
        read_comparison(tmp_path)


def test_cli_compare_two_runs_is_unpaired_welch(tmp_path, capsys):
    """`patchbench compare RUN_A RUN_B`: RUN_A's baseline against RUN_B's variant, unpaired
    (their repeats were not interleaved): Welch's interval on the per-run log values, checked
    against scipy; the result is also written as JSON with --out."""
    import math

    from scipy import stats as sps

    from patchbench import cli

    run_a, run_b = _run(tmp_path / "a"), _run(tmp_path / "b")
    out = tmp_path / "cmp.json"
    rc = cli.main(["compare", str(run_a), str(run_b), "--variant", "patched", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "unpaired" in text.lower() and "welch" in text.lower()
    res = records.read_json(out)
    row = next(r for r in res["rows"] if r["metric"] == "output_throughput_tok_s")
    a = [math.log(x) for x in (100, 102, 98)]
    b = [math.log(x) for x in (110, 112.2, 107.8)]
    ci = sps.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    diff = sum(b) / 3 - sum(a) / 3
    assert row["change_pct"] == pytest.approx(100 * math.expm1(diff), rel=1e-6)
    assert row["low_pct"] == pytest.approx(100 * math.expm1(ci.low), rel=1e-6)
    assert row["high_pct"] == pytest.approx(100 * math.expm1(ci.high), rel=1e-6)


def test_verdict_text_of_an_equal_deterministic_count_names_no_empty_margin():
    """A deterministic count that did not change has no margin: "equivalent" (the verdict's own
    word, as in the table), never "equivalent within " with nothing after it; a run metric names
    its margin."""
    from patchbench.analysis.comparison import Row

    det = Row(suite="s", metric="x_count", variant="v", kind="deterministic", verdict="equivalent")
    assert verdict_text(det) == "equivalent"
    run = Row(suite="s", metric="t_tok_s", variant="v", verdict="equivalent", margin=5.0)
    assert verdict_text(run) == "equivalent within ±5%"


def test_a_change_that_rounds_to_zero_never_prints_minus_zero():
    assert fmt_change(-0.0001, "pt") == "+0.0 pt"
    assert fmt_change(-0.04, "%") == "+0.0%"
    assert fmt_change(-0.06, "%") == "-0.1%"
    assert fmt_change(-0.0, "count") == "+0 count"
    assert fmt_change(-0.04, "count") == "-0.04 count"  # counts keep their digits


def test_a_lower_bound_count_is_never_an_exact_verdict(tmp_path, monkeypatch):
    """The CPU sync probe of the upstream PR stops on a read it cannot answer, so its host-sync
    count (6) is only a lower bound: against stock's exact 507 the direction is unknown, and
    the report says "≥6" and "a bound", never "improved (exact)". A variant whose count is
    exact (0) in the same run is still improved."""
    run = make_run(
        tmp_path,
        variants={"stock": [], "upstream": ["u"], "ours": ["o"]},
        metrics={
            "probe": {
                "host_syncs_per_call_count": {
                    "stock": [507.0] * 3,
                    "upstream": [6.0] * 3,
                    "ours": [0.0] * 3,
                }
            }
        },
        bounds={("upstream", k, "probe"): {"host_syncs_per_call_count": "lower"} for k in range(3)},
    )
    decl = MetricInfo("lower", "count", label="host syncs", primary=True, kind="deterministic")
    declare_suite(monkeypatch, "probe", {"host_syncs_per_call_count": decl})
    cmp = build_comparison(run)
    up = cmp.row("probe", "host_syncs_per_call_count", "upstream")
    ours = cmp.row("probe", "host_syncs_per_call_count", "ours")
    assert (up.verdict, up.variant_bound, up.baseline_bound) == ("inconclusive", "lower", None)
    assert any("at least 6" in n and "[-501, inf]" in n for n in up.notes)
    assert (ours.verdict, ours.variant_bound) == ("improved", None)
    assert "host syncs 507 -> ≥6 inconclusive (a bound)" in report.sentence(cmp, "upstream")
    assert "host syncs 507 -> 0 improved (exact)" in report.sentence(cmp, "ours")
    table = report.render_markdown(cmp)
    assert "| upstream | " in table and "| 507 | ≥6 | -501 count |" in table


def test_console_table_of_a_log_does_not_wrap_long_names(tmp_path, capsys, monkeypatch):
    """Not a terminal (a CI log): the table is 120 columns wide, so a long metric name stays on
    its row; a deterministic row shows its two values and "exact" instead of "n/a"."""
    long = "host syncs inside the mrope computation per decode step (median)"
    decl = MetricInfo("lower", "count", label=long, primary=True, kind="deterministic")
    declare_suite(monkeypatch, "bench", {"syncs_count": decl})
    run = make_run(
        tmp_path,
        metrics={"bench": {"syncs_count": {"baseline": [4.0] * 3, "patched": [0.0] * 3}}},
    )
    report.console_summary(build_comparison(run))
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "│ patched" in line)
    assert "host syncs inside the mrope computation per decode step │ 4 -> 0 │ exact" in row
    assert "improved" in row and "(median)" not in row
    once = "patched vs baseline: host syncs inside the mrope computation per decode step 4 -> 0 "
    assert once + "improved (exact)" in out


def test_failed_and_incomplete_cells_have_a_section_and_their_primaries_read_incomplete(
    tmp_path,
):
    """A failed cell and an incomplete one: the report lists both with their reasons and marks
    every primary they affect incomplete, never silently missing."""
    run = _run(tmp_path)
    man = runfolder.read_manifest(run)
    for c in man.cells:
        if (c.variant, c.repeat) == ("patched", 1):
            c.status, c.error = (
                "failed",
                "the server stopped answering (scheduler pid 7 in state S)",
            )
            c.suites = {"bench": "failed"}
        if (c.variant, c.repeat) == ("baseline", 2):
            c.status, c.suites = "incomplete", {"bench": "incomplete"}
    runfolder.write_manifest(run, man)
    text = report.render_markdown(build_comparison(run))
    assert "## Failed and incomplete cells" in text
    assert "| patched/rep1 | failed | the server stopped answering (scheduler pid 7" in text
    assert "| baseline/rep2 | incomplete |" in text
    for v in ("aa", "patched"):  # a baseline cell affects every variant
        assert f"- `{v}` bench output_throughput_tok_s: incomplete" in text
        assert f"- `{v}` bench mean_ttft_ms: incomplete" in text
    assert "## Failed and incomplete cells" not in report.render_markdown(
        build_comparison(_run(tmp_path / "c"))
    )


def test_a_suite_whose_every_cell_failed_keeps_its_primaries_as_incomplete(tmp_path):
    """Every cell of the run failed (e.g. the server port held by another process): the suite's
    declared primaries are rows, incomplete, in the family; a count with no values says so
    instead of "one measurement per arm"."""
    cells = {(v, k): "failed" for v in ("baseline", "patched") for k in range(2)}
    run = make_run(
        tmp_path,
        metrics={"bench": {"retokenized_count": {"baseline": [None] * 2, "patched": [None] * 2}}},
        cell_status=cells,
    )
    report.render_run(run, plots=False)
    cmp = read_comparison(run)
    rows = {r.metric: r for r in cmp.rows}
    assert {"output_throughput_tok_s", "mean_ttft_ms"} <= set(rows)
    assert all(rows[m].primary and rows[m].verdict == "incomplete" for m in DECL if m in rows)
    text = (run / "report.md").read_text()
    assert "over the 0 primaries" not in text
    det = rows["output_throughput_tok_s"].model_copy(
        update={"kind": "deterministic", "baseline_value": None}
    )
    assert exactness(det) == "no values"


def test_a_checkout_build_without_patches_is_not_called_stock(tmp_path):
    """The header names an arm built from a git checkout (or a wheel) "no patches", never
    "stock": only a release is stock."""
    run = _run(tmp_path)
    man = json.loads((run / "manifest.json").read_text())
    man["builds"] = {
        "baseline": {"kind": "git", "describe": "git:/co@abc (commit abc, sglang 0.5.1.post3)"},
        "aa": {"kind": "release", "describe": "sglang 0.5.1.post3 in .venv"},
    }
    (run / "manifest.json").write_text(json.dumps(man))
    text = report.render_run(run, plots=False).read_text()
    assert "| variant `baseline` (baseline) | no patches; build git:/co@abc" in text
    assert "| variant `aa` (A/A) | stock; build sglang 0.5.1.post3 in .venv |" in text
    man["builds"] = {  # two releases: each arm's, no environment apart
        "baseline": {"kind": "release", "release": "0.5.1.post3", "describe": "x"},
        "aa": {"kind": "release", "release": "0.5.23", "describe": "y"},
    }
    (run / "manifest.json").write_text(json.dumps(man))
    text = report.render_run(run, plots=False).read_text()
    assert "| sglang | `baseline` `0.5.1.post3`, `aa` `0.5.23` |" in text


def test_git_builds_are_named_by_commit_and_subject_with_their_range_and_versions(tmp_path, capsys):
    """A run whose manifest records two git builds (as ``Build.to_json()`` writes them): the
    header names each arm by its short hash and subject, lists the files B's range changes
    (eight, then "and 2 more") and each arm's sglang version as built; the console and the PR
    comment name both arms the same way."""
    from patchbench.report.comment import render_comment

    a, b = "1a2b3c4d5e6f" + "0" * 28, "8af4974fdfbe" + "1" * 28
    files = [f"python/sglang/m{i}.py" for i in range(7)] + ["test/t.py"]
    common = {"kind": "git", "release": "0.5.1.post3", "venv": ".venv", "python": "python"}
    builds = {
        "A": {**common, "spec": "git:/co@main", "resolved": a, "version": "0.5.7.dev0",
              "subject": "sglang 0.5.7", "changes": None, "describe": "git:/co@main (...)"},
        "B": {**common, "spec": "git:/co@b", "resolved": b, "version": "0.5.7.dev1",
              "subject": "sampling: a | larger epsilon", "describe": "git:/co@b (...)",
              "changes": {"base": a, "count": 10, "files": files, "outside": 1}},
    }  # fmt: skip
    values = {"A": [100, 102, 98], "B": [110, 112.2, 107.8]}
    run = make_run(
        tmp_path,
        variants={"A": [], "B": []},
        metrics={"bench": {"output_throughput_tok_s": values}},
        builds=builds,
    )
    man = json.loads((run / "manifest.json").read_text())  # as `ab --git` writes the config
    man["config"]["sglang"] = {"git": "/co", "ref": a}
    man["config"]["variants"]["B"] = {"sglang": {"git": "/co", "ref": b}}
    (run / "manifest.json").write_text(json.dumps(man))
    text = report.render_run(run, plots=False).read_text()
    named = "`python/sglang/m0.py`, `python/sglang/m1.py`"
    # a git build's checkout path is this machine's: the commit names it (no "build git:/co")
    assert '| variant `A` (baseline) | 1a2b3c4d5e6f "sglang 0.5.7"; no patches |' in text
    assert "git:/co" not in text
    assert (
        '| variant `B` | 8af4974fdfbe "sampling: a \\| larger epsilon"; changes from `A`: '
        f"10 files: {named}, "
    ) in text
    assert "`test/t.py` and 2 more (1 outside python/sglang/, not run); no patches" in text
    assert (
        "| sglang | as built: `A` `0.5.7.dev0`, `B` `0.5.7.dev1` (over an environment whose own "
        "sglang is `0.5.1.post3`) |"
    ) in text
    cmp = read_comparison(run)
    assert cmp.run.variants["B"].built.subject == "sampling: a | larger epsilon"
    capsys.readouterr()
    report.console_summary(cmp)
    out = capsys.readouterr().out
    assert 'A = 1a2b3c4d5e6f "sglang 0.5.7"\n' in out
    assert 'B = 8af4974fdfbe "sampling: a | larger epsilon"; changes from A: 10 files: ' in out
    body = render_comment(cmp)
    assert '- A = 1a2b3c4d5e6f "sglang 0.5.7"\n' in body
    assert '- B = 8af4974fdfbe "sampling: a \\| larger epsilon"; changes from A: 10 ' in body


def _as_ab_writes_it(run: Path, a: str, b: str) -> None:
    """The manifest's config with A and B at commits ``a`` and ``b`` of /co, as ``ab --git``."""
    man = json.loads((run / "manifest.json").read_text())
    man["config"]["sglang"] = {"git": "/co", "ref": a}
    man["config"]["variants"]["B"] = {"sglang": {"git": "/co", "ref": b}}
    (run / "manifest.json").write_text(json.dumps(man))


def test_what_a_range_left_out_and_uncommitted_edits_reach_compare_json_report_and_comment(
    tmp_path,
):
    """Issue 34: a kernel change run with ``ab --allow-uncompiled`` read as "equivalent" with no
    word of the kernel. The manifest's builds (as ``Build.to_json()`` writes them: B's range
    left 3 compiled files out, the checkout had 2 uncommitted edits) reach compare.json, whose
    answer, header and PR comment say both; a run without them writes neither key."""
    from patchbench.report.comment import render_comment
    from patchbench.report.text import sentence

    a, b = "1a2b3c4d5e6f" + "0" * 28, "8af4974fdfbe" + "1" * 28
    kernel = ["sgl-kernel/csrc/a.cu", "sgl-kernel/csrc/b.cu", "sgl-kernel/CMakeLists.txt"]
    edits = {"count": 2, "files": ["python/sglang/x.py", "python/sglang/new.py"]}
    common = {"kind": "git", "release": "0.5.1.post3", "venv": ".venv", "python": "python"}
    builds = {
        "A": {**common, "spec": "git:/co@main", "resolved": a, "subject": "base",
              "changes": None, "uncommitted": edits, "describe": "x"},
        "B": {**common, "spec": "git:/co@b", "resolved": b, "subject": "kernel: faster",
              "describe": "y", "uncommitted": edits,
              "changes": {"base": a, "count": 4, "files": ["python/sglang/k.py", *kernel],
                          "outside": 3, "uncompiled": {"count": 3, "files": kernel}}},
    }  # fmt: skip
    values = {"A": [100, 102, 98], "B": [100.2, 101.8, 98.1]}
    run = make_run(
        tmp_path,
        variants={"A": [], "B": []},
        metrics={"bench": {"output_throughput_tok_s": values}},
        builds=builds,
    )
    _as_ab_writes_it(run, a, b)
    text = report.render_run(run, plots=False).read_text()
    raw = json.loads((run / "compare.json").read_text())["run"]["variants"]
    assert raw["B"]["built"]["changes"]["uncompiled"] == {"count": 3, "files": kernel}
    assert raw["A"]["built"]["uncommitted"] == edits and raw["B"]["built"]["uncommitted"] == edits
    assert "uncompiled" not in raw["A"]["built"]
    left = (
        "left out: 3 compiled files (sgl-kernel/csrc/a.cu, sgl-kernel/csrc/b.cu, "
        "sgl-kernel/CMakeLists.txt): not built here, this measures the Python part only"
    )
    cmp = read_comparison(run)
    assert sentence(cmp, "B").startswith(f"B vs A: {left}; ")
    assert f"- B vs A: {left}; " in text
    assert (
        "| uncommitted edits | `A`, `B`: the checkout has uncommitted edits (2 files: "
        "python/sglang/x.py, python/sglang/new.py); they are not measured: the builds are the "
        "commits |"
    ) in text
    assert f"(3 outside python/sglang/, not run); {left}; no patches" in text
    assert f"- {left}\n" in render_comment(cmp)

    builds["B"]["changes"].pop("uncompiled")
    for v in builds.values():
        v.pop("uncommitted")
    again = make_run(
        tmp_path / "clean",
        variants={"A": [], "B": []},
        metrics={"bench": {"output_throughput_tok_s": values}},
        builds=builds,
    )
    _as_ab_writes_it(again, a, b)
    text = report.render_run(again, plots=False).read_text()
    raw = (again / "compare.json").read_text()
    assert "uncompiled" not in raw and "uncommitted" not in raw
    assert "left out" not in text and "uncommitted" not in text


def test_local_paths_relative_to_the_repository_and_from_home():
    """A path inside the repository becomes relative to it, one under home starts with ``~``;
    a root inside a longer path, the root alone and a home of ``/`` are left alone."""
    from patchbench.report.text import local_paths

    text = "see /r/results/x, `/h/me/m`, /mnt/r/results/y, /h/med/z and /r alone"
    assert local_paths(text, repo=Path("/r"), home="/h/me") == (
        "see results/x, `~/m`, /mnt/r/results/y, /h/med/z and /r alone"
    )
    inside = "/h/me/repo/results/x /h/me/other"
    assert local_paths(inside, repo=Path("/h/me/repo"), home="/h/me") == "results/x ~/other"
    assert local_paths("/h/x", repo=Path("/r"), home="/") == "/h/x"


def test_report_and_comment_show_no_absolute_path_of_this_machine(tmp_path, monkeypatch):
    """A run folder under the user's home: report.md, report-details.md and the PR comment name
    its files from ``~`` (the golden schema-1 run's refusals name its requests.json files; the
    comment's sentence is given one); compare.json keeps them whole."""
    from patchbench.report.comment import render_comment

    home = tmp_path / "home"
    run = home / "runs" / "r1"
    shutil.copytree(Path(__file__).parent.parent / "data" / "golden" / "schema1" / "run", run)
    monkeypatch.setenv("HOME", str(home))
    report.render_run(run, plots=False)
    texts = {n: (run / n).read_text() for n in ("report.md", "report-details.md")}
    cmp = read_comparison(run)
    cmp.refusals = {"serving": {"patched": f"{run}/patched/rep0/serving/requests.json: missing"}}
    texts["comment"] = render_comment(cmp)
    assert "~/runs/r1/baseline/rep0/serving/requests.json: missing" in texts["report.md"]
    assert "serving not paired: ~/runs/r1/patched/rep0/serving/requests.json" in texts["comment"]
    for name, text in texts.items():
        assert str(tmp_path) not in text, name
    assert f"{run}/baseline/rep0/serving/requests.json" in (run / "compare.json").read_text()
