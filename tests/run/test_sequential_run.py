"""Sequential repeats in the run (``schedule.repeats: {min, max, step}``; patchbench.run.bench with
patchbench.analysis.sequential.decide): a clear effect stops at the first look, a clear null stops as
equivalent, an ambiguous one runs to ``max``, a resumed run continues where it stopped, and the
manifest records how many repeats ran and why it stopped.

The suite ``fake_seq`` needs no server (no server is launched): it reports the output throughput
the test wrote for (variant, repeat) into the file named by FAKE_SEQ_VALUES; FAKE_SEQ_INTERRUPT=
"<variant>/<repeat>" makes it raise KeyboardInterrupt there (a Ctrl-C)."""

import importlib.metadata
import json
import math
import os
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict
from scipy import stats

from patchbench.analysis.sequential import FUTILITY, nominal_levels
from patchbench.config import load_config
from patchbench.errors import ConfigError, Interrupted
from patchbench.records import read_json
from patchbench.run import bench
from patchbench.run.looks import sequential_design
from patchbench.run.plan import describe_plan
from patchbench.suite import MetricInfo, Suite, SuiteResult, register

SGLANG = importlib.metadata.version("sglang")


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


@register
class FakeSeqSuite(Suite):
    name = "fake_seq"
    Params = _Params
    needs_server = False
    metrics = {
        "output_tok_s": MetricInfo("higher", "tok/s", primary=True, margin=5.0),
        "steps_count": MetricInfo("none", "count"),
    }

    def run(self, ctx, params):
        if os.environ.get("FAKE_SEQ_INTERRUPT") == f"{ctx.variant}/{ctx.repeat}":
            raise KeyboardInterrupt
        values = json.loads(Path(os.environ["FAKE_SEQ_VALUES"]).read_text())
        return SuiteResult(
            metrics={"output_tok_s": values[ctx.variant][ctx.repeat], "steps_count": 1.0}
        )


BASELINE = 100.0


def _setup(
    tmp_path,
    monkeypatch,
    log_ratios: list[float],
    schedule="{min: 4, max: 8, step: 2}",
    aa: list[float] | None = None,
):
    """Config with baseline and patched (not an A/A copy: it sets an environment variable the
    fake suite ignores); patched's throughput at repeat k is 100 * exp(log_ratios[k]) (baseline
    100 in every repeat). ``aa``: also an A/A variant "stock-again" with these log ratios."""
    vals = tmp_path / "values.json"
    values = {
        "baseline": [BASELINE] * len(log_ratios),
        "patched": [BASELINE * math.exp(r) for r in log_ratios],
    }
    if aa is not None:
        values["stock-again"] = [BASELINE * math.exp(r) for r in aa]
    vals.write_text(json.dumps(values))
    monkeypatch.setenv("FAKE_SEQ_VALUES", str(vals))
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    aa_line = ", stock-again: []" if aa is not None else ""
    p = tmp_path / "cfg.yaml"
    p.write_text(
        textwrap.dedent(f"""\
        name: seq-test
        sglang: "{SGLANG}"
        model: {{path: "{model}"}}
        server: {{port: 31992}}
        variants: {{baseline: [], patched: {{env: {{FAKE_SEQ_ARM: patched}}}}{aa_line}}}
        schedule: {{repeats: {schedule}}}
        suites:
          fake_seq: {{}}
        """)
    )
    return p


def _timed(man: dict) -> list[tuple[str, int]]:
    return [(c["variant"], c["repeat"]) for c in man["cells"] if c["cell_kind"] == "timed"]


def _abba(n: int) -> list[tuple[str, int]]:
    out = []
    for k in range(n):
        out += [("baseline", k), ("patched", k)][:: 1 if k % 2 == 0 else -1]
    return out


def test_clear_effect_stops_at_the_first_look(tmp_path, monkeypatch):
    p = _setup(tmp_path, monkeypatch, [0.18, 0.19, 0.18, 0.19] + [0.0] * 4)  # +20 %
    run_dir = bench.run_bench(p, results_root=tmp_path / "results")
    man = read_json(run_dir / "manifest.json")
    assert _timed(man) == _abba(4)  # whole interleaved rounds, then the look
    assert not (run_dir / "patched" / "rep4").exists()
    seq = man["sequential"]
    assert seq["stopped_at"] == 4 and seq["repeats_run"] == 4 and seq["stopped_early"] is True
    assert seq["reason"] == "every primary decided after 4 repeats"
    assert seq["decisions"] == {"patched/fake_seq.output_tok_s": "improved"}
    assert seq["design"]["looks"] == [4, 6, 8] and seq["design"]["primaries"] == [
        "fake_seq.output_tok_s"
    ]
    look = seq["looks"][0]["metrics"]["patched/fake_seq.output_tok_s"]
    t = stats.ttest_1samp([0.18, 0.19, 0.18, 0.19], 0.0)
    assert look["p_value"] == pytest.approx(t.pvalue, rel=1e-6)
    assert look["p_value"] <= nominal_levels((4, 6, 8), 0.05)[0]
    report = (run_dir / "report.md").read_text()
    assert "| schedule | 4 timed repeat(s)" in report
    assert (
        "| sequential | 4 of at most 8 repeats; every primary decided after 4 repeats |" in report
    )
    # resuming a run that stopped runs nothing more
    bench.run_bench(p, resume=run_dir)
    man2 = read_json(run_dir / "manifest.json")
    assert all(c.get("skipped") for c in man2["cells"]) and _timed(man2) == _abba(4)
    assert man2["sequential"]["stopped_at"] == 4


def test_clear_null_stops_as_equivalent(tmp_path, monkeypatch):
    p = _setup(tmp_path, monkeypatch, [0.001, -0.001, 0.0005, -0.0005] + [0.0] * 4)
    run_dir = bench.run_bench(p, results_root=tmp_path / "results")
    seq = read_json(run_dir / "manifest.json")["sequential"]
    assert seq["stopped_at"] == 4
    assert seq["decisions"] == {"patched/fake_seq.output_tok_s": "equivalent"}


# a promising +5 % (sd 6 %) that never crosses the boundary: neither decided nor futile before 8
AMBIGUOUS = [0.13, -0.01, 0.11, 0.01, 0.10, 0.00, 0.08, 0.00]
# sd 27 % around -1 %: neither a change nor equivalence within 5 % reachable by 8 repeats
HOPELESS = [0.3, -0.25, 0.2, -0.3, 0.25, -0.2, 0.3, -0.3]


def test_ambiguous_effect_runs_to_max(tmp_path, monkeypatch):
    p = _setup(tmp_path, monkeypatch, AMBIGUOUS)
    run_dir = bench.run_bench(p, results_root=tmp_path / "results")
    man = read_json(run_dir / "manifest.json")
    assert _timed(man) == _abba(8)
    seq = man["sequential"]
    assert [x["n_repeats"] for x in seq["looks"]] == [4, 6, 8]
    assert seq["stopped_at"] == 8 and seq["stopped_early"] is False
    assert seq["reason"] == "maximum of 8 repeats reached; 1 primary metric(s) inconclusive"
    assert seq["decisions"] == {"patched/fake_seq.output_tok_s": "inconclusive"}
    last = seq["looks"][-1]["metrics"]["patched/fake_seq.output_tok_s"]
    assert last["p_value"] == pytest.approx(stats.ttest_1samp(AMBIGUOUS, 0.0).pvalue, rel=1e-6)


def test_resumed_sequential_run_continues_where_it_stopped(tmp_path, monkeypatch):
    p = _setup(tmp_path, monkeypatch, AMBIGUOUS)
    monkeypatch.setenv("FAKE_SEQ_INTERRUPT", "patched/5")  # after the first look (4 rounds)
    with pytest.raises(Interrupted):
        bench.run_bench(p, results_root=tmp_path / "results")
    run_dir = next((tmp_path / "results").iterdir())
    man = read_json(run_dir / "manifest.json")
    assert [x["n_repeats"] for x in man["sequential"]["looks"]] == [4]
    assert man["sequential"]["stopped_at"] is None
    first = {
        q: q.stat().st_mtime_ns
        for q in run_dir.glob("*/rep*/cell.json")
        if read_json(q)["status"] == "ok"
    }
    monkeypatch.delenv("FAKE_SEQ_INTERRUPT")
    bench.run_bench(p, resume=run_dir)
    man = read_json(run_dir / "manifest.json")
    assert {q: q.stat().st_mtime_ns for q in first} == first  # finished cells were not re-run
    ran = [(c["variant"], c["repeat"]) for c in man["cells"] if not c.get("skipped")]
    assert ran == [x for x in _abba(8) if x[1] >= 5]  # rep4 was done; patched/5 interrupted
    assert [x["n_repeats"] for x in man["sequential"]["looks"]] == [4, 6, 8]
    assert man["sequential"]["stopped_at"] == 8
    assert man["sequential"]["decisions"] == {"patched/fake_seq.output_tok_s": "inconclusive"}


def test_sequential_schedule_in_the_plan_and_its_errors(tmp_path, monkeypatch):
    p = _setup(tmp_path, monkeypatch, [0.0] * 8)
    plan = describe_plan(load_config(p))
    assert "schedule   sequential 4..8 repeats, looks after 4, 6, 8 (pocock boundary)" in plan
    assert "primaries: fake_seq.output_tok_s (±5%)" in plan
    assert "8 to 16 server launches (sequential)" in plan
    cases = {
        "{min: 2, max: 8, step: 2}": "schedule.repeats.min is 2; at least 3 paired repeats",
        "{min: 6, max: 4}": r"schedule.repeats.max \(4\) is smaller than min \(6\)",
        "{min: 4, max: 8, stride: 2}": "stride: Extra inputs are not permitted",
        "{min: 4, max: 8, boundary: haybittle}": "boundary: Input should be 'pocock' or",
        "{min: 4, max: 8, futility: 1.5}": "futility: Input should be less than 1",
    }
    for sched, msg in cases.items():
        bad = _setup(tmp_path, monkeypatch, [0.0] * 8, schedule=sched)
        with pytest.raises(ConfigError, match=r"cfg.yaml:\d+: key 'schedule.repeats': " + msg):
            load_config(bad)
    bad = _setup(tmp_path, monkeypatch, [0.0] * 8, schedule="{min: 4, max: 8}, order: sequential")
    with pytest.raises(ConfigError, match="sequential repeats .* use order: interleaved"):
        load_config(bad)


def test_futility_threshold_comes_from_the_config(tmp_path, monkeypatch):
    """Default: patchbench.analysis.sequential.FUTILITY; ``futility: 0`` turns the stop off, and the
    HOPELESS sequence (futile at the first look by default) then runs to max."""
    from patchbench.analysis.sequential import FUTILITY

    p = _setup(tmp_path, monkeypatch, [0.0] * 8)
    assert sequential_design(load_config(p)).futility == FUTILITY == 0.2
    p = _setup(tmp_path, monkeypatch, HOPELESS, schedule="{min: 4, max: 8, futility: 0}")
    assert sequential_design(load_config(p)).futility == 0.0
    assert "conditional power < 0 at max" in describe_plan(load_config(p))
    run_dir = bench.run_bench(p, results_root=tmp_path / "results")
    seq = read_json(run_dir / "manifest.json")["sequential"]
    assert seq["stopped_at"] == 8 and seq["stopped_early"] is False


def test_hopeless_sequence_stops_for_futility(tmp_path, monkeypatch):
    p = _setup(tmp_path, monkeypatch, HOPELESS)
    run_dir = bench.run_bench(p, results_root=tmp_path / "results")
    man = read_json(run_dir / "manifest.json")
    assert _timed(man) == _abba(4)
    seq = man["sequential"]
    assert seq["stopped_at"] == 4 and seq["stopped_early"] is True
    assert seq["reason"].startswith("every primary decided or futile after 4 repeats")
    assert seq["decisions"] == {"patched/fake_seq.output_tok_s": "inconclusive"}
    assert seq["design"]["futility"] == FUTILITY
    why = seq["looks"][0]["metrics"]["patched/fake_seq.output_tok_s"]["reason"]
    assert why.startswith("futile: conditional power at 8 repeats")


def test_an_aa_variant_never_holds_the_run_open(tmp_path, monkeypatch):
    # patched is clearly +20 %; the A/A copy is ambiguous but, a control, is not waited for
    p = _setup(tmp_path, monkeypatch, [0.18, 0.19, 0.18, 0.19] + [0.0] * 4, aa=AMBIGUOUS)
    run_dir = bench.run_bench(p, results_root=tmp_path / "results")
    man = read_json(run_dir / "manifest.json")
    seq = man["sequential"]
    assert seq["stopped_at"] == 4 and seq["design"]["controls"] == ["stock-again"]
    assert seq["decisions"] == {
        "patched/fake_seq.output_tok_s": "improved",
        "stock-again/fake_seq.output_tok_s": "inconclusive",
    }
    assert "A/A variants do not hold the run open" in seq["reason"]
    assert not (run_dir / "stock-again" / "rep4").exists()
