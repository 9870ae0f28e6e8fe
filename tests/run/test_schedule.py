"""Cell order (patchbench.run.plan) and the progress estimate (patchbench.run.progress)."""

from pathlib import Path

import pytest

from patchbench.run.plan import plan_cells
from patchbench.run.progress import BenchProgress, fmt_duration


def test_interleaved_abba_and_correctness_cells_first():
    cells = plan_cells(["a", "b"], 2, correctness=True)
    assert [(c.index, c.variant, c.repeat, c.kind) for c in cells] == [
        (0, "a", 0, "correctness"),
        (1, "b", 0, "correctness"),
        (2, "a", 0, "timed"),
        (3, "b", 0, "timed"),
        (4, "b", 1, "timed"),
        (5, "a", 1, "timed"),
    ]
    assert [c.dirname for c in cells[:3]] == ["correctness", "correctness", "rep0"]
    assert cells[4].path("/r") == Path("/r/b/rep1") and cells[0].label == "a/correctness"
    assert [c.kind for c in plan_cells(["a"], 3)] == ["timed"] * 3


@pytest.mark.parametrize(
    "bad",
    [
        dict(variants=[], repeats=1),
        dict(variants=["a"], repeats=0),
        dict(variants=["a"], repeats=1, order="zigzag"),
    ],
)
def test_bad_plans_are_refused(bad):
    with pytest.raises(ValueError):
        plan_cells(**bad)


@pytest.mark.parametrize("variants", [["a", "b"], ["a", "b", "c"], list("abcde")])
def test_randomized_rounds_put_each_variant_once_in_each_position_per_block(variants):
    from patchbench.run.plan import randomized_rounds

    V = len(variants)
    orders = set()
    for seed in range(20):
        rounds = randomized_rounds(variants, 3 * V + 1, seed)
        assert all(sorted(r) == variants for r in rounds)
        for b in range(3):
            block = rounds[b * V : (b + 1) * V]
            assert all(sorted(col) == variants for col in zip(*block, strict=True))
        # a prefix is the same plan: a sequential run that stops early, a resume
        assert randomized_rounds(variants, 2, seed) == rounds[:2]
        orders.add(tuple(map(tuple, rounds)))
    assert len(orders) > 5  # the seed draws the order (V = 2, 7 rounds: 16 orders possible)
    # pinned: a resumed run must plan the order its first invocation planned
    assert randomized_rounds(["a", "b", "c"], 4, 5) == [
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
        ["a", "b", "c"],
    ]
    cells = plan_cells(["a", "b"], 2, "randomized", seed=0)
    assert [f"{c.variant}{c.repeat}" for c in cells] == ["a0", "b0", "b1", "a1"]


def test_eta_is_the_median_finished_cell_times_cells_left():
    from patchbench.run.progress import eta_by_suite

    assert eta_by_suite([], [[]] * 3) is None
    assert eta_by_suite([(10.0, {}), (30.0, {}), (12.0, {})], [[]] * 4) == 48.0  # 12 s x 4
    assert eta_by_suite([(5.0, {})], []) == 0.0
    assert [fmt_duration(x) for x in (None, 42.4, 185, 3720)] == ["?", "42s", "3m05s", "1h02m"]


def test_progress_counts_skipped_and_finished_cells():
    from rich.console import Console

    now = [0.0]
    con = Console(record=True, width=120, force_terminal=False)
    p = BenchProgress(4, console=con, live=False, clock=lambda: now[0])
    p.cell_skipped()
    p.cell_started("a/rep0")
    now[0] = 20.0
    p.cell_finished("ok")
    assert p.line() == "progress: 2/4 cells, elapsed 20s, ETA 40s"
    assert "progress: 2/4 cells, elapsed 20s, ETA 40s" in con.export_text()


def test_eta_by_suite_predicts_each_left_cell_from_its_own_suites():
    """The demo's shape: correctness cells (sync_probe, profile) first, then timed cells
    (sync_probe, mmmu, serving). Hand computation in the comments."""
    from patchbench.run.progress import eta_by_suite

    corr = ["sync_probe", "profile"]
    timed = ["sync_probe", "mmmu", "serving"]
    c1 = (24.0, {"suite:sync_probe": 2.0, "suite:profile": 6.0, "server_start": 15.0})
    # one correctness cell seen: fixed part 24 - 8 = 16; a correctness cell 16 + 2 + 6 = 24;
    # a timed cell has unseen suites: at least the median cell, 24
    assert eta_by_suite([c1], [corr, timed, timed]) == 24 + 24 + 24
    t1 = (36.0, {"suite:sync_probe": 0.0, "suite:mmmu": 7.0, "suite:serving": 13.0})
    # fixed parts 16 and 16; sync_probe median(2, 0) = 1; a timed cell 16 + 1 + 7 + 13 = 37, a
    # correctness cell 16 + 1 + 6 = 23; the running timed cell is 10 s in: 37 - 10 = 27
    assert eta_by_suite([c1, t1], [timed, timed, corr], in_current_s=10.0) == 27 + 37 + 23
    assert eta_by_suite([c1, t1], [timed], in_current_s=99.0) == 0.0  # over time: not negative
    assert eta_by_suite([], [timed]) is None and eta_by_suite([c1], []) == 0.0


def test_progress_eta_uses_the_plan_and_skips_seen_cells():
    from rich.console import Console

    now = [0.0]
    plan = {"a/corr": ["p"], "a/rep0": ["s"], "b/rep0": ["s"], "a/rep1": ["s"]}
    con = Console(record=True, width=120, force_terminal=False)
    p = BenchProgress(4, console=con, live=False, clock=lambda: now[0], plan=plan)
    p.cell_skipped("a/corr")
    p.cell_started("a/rep0")
    now[0] = 30.0
    p.cell_finished("ok", {"suite:s": 20.0, "server_start": 9.0})
    # b/rep0 and a/rep1 left, each 10 s fixed + 20 s of s
    assert p.eta() == 60.0
    p.cell_started("b/rep0")
    now[0] = 45.0
    assert p.eta() == 15.0 + 30.0


# ---------------------------------------------------------------------------------- per-suite rounds
import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import shutil  # noqa: E402
import textwrap  # noqa: E402

import tests.fake_server.fake_suites  # noqa: E402,F401 - registers the fake suites
from patchbench.config import load_config  # noqa: E402
from patchbench.config.schema import parse_rounds, resolve_rounds  # noqa: E402
from patchbench.errors import ConfigError  # noqa: E402
from patchbench.records import read_json  # noqa: E402
from patchbench.run import bench  # noqa: E402
from patchbench.run.plan import describe_plan, randomized_rounds  # noqa: E402
from patchbench.suite import MetricInfo, Suite, SuiteResult, register  # noqa: E402
from tests.fake_server.fake_suites import InstrParams  # noqa: E402

FAKE = Path(__file__).parent.parent / "fake_server"


@register
class FakeRoundsSuite(Suite):
    """A timed suite with one run-level metric (1 ms in every cell)."""

    name = "fake_rounds"
    Params = InstrParams
    metrics = {"x_ms": MetricInfo("lower", "ms", primary=True, margin=5.0)}

    def run(self, ctx, params):
        return SuiteResult(metrics={"x_ms": 1.0})


def test_rounds_values_by_hand():
    assert resolve_rounds("all", 3) == [0, 1, 2] and resolve_rounds(None, 2) == [0, 1]
    assert resolve_rounds("first", 5) == [0] and resolve_rounds([0, 2], 2) == [0]
    assert parse_rounds([2, 0], 3, "k") == [0, 2] and parse_rounds("first", 1, "k") == "first"


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "[3]",
            r"suites.fake_rounds.rounds: round\(s\) \[3\] do not exist: this run has at most 3 "
            r"round\(s\), indices 0 to 2; a suite must run in at least one round that exists",
        ),
        ("[]", r"suites.fake_rounds.rounds: \[\] puts the suite in no round"),
        ("sometimes", r"suites.fake_rounds.rounds: 'sometimes' is not a round list"),
        ("[0, 0]", r"suites.fake_rounds.rounds: \[0, 0\] lists a round twice"),
        ("[true]", r"suites.fake_rounds.rounds: \[True\] is not a round list"),
    ],
)
@pytest.mark.needs_sglang  # loads a release environment / torch
def test_a_suite_in_no_round_is_an_error_naming_the_key(tmp_path, value, message):
    p = _config(tmp_path, f"fake_rounds: {{rounds: {value}}}")
    with pytest.raises(ConfigError, match=r"cfg.yaml:\d+: " + message):
        load_config(p)


@pytest.mark.needs_sglang  # loads a release environment / torch
def test_an_untimed_suite_cannot_be_scheduled_in_rounds(tmp_path):
    p = _config(tmp_path, "fake_untimed: {rounds: first}")
    with pytest.raises(
        ConfigError,
        match=r"suites.fake_untimed.rounds: suite 'fake_untimed' runs "
        r"only in the untimed correctness cells",
    ):
        load_config(p)


def _config(tmp_path, suites: str, repeats: str = "3") -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    p = tmp_path / "cfg.yaml"
    p.write_text(
        textwrap.dedent(f"""\
        name: rounds-test
        sglang: "{importlib.metadata.version("sglang")}"
        model: {{path: "{model}"}}
        server: {{port: 31993, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2,
                  flush_pause_s: 0.1}}
        variants: {{baseline: [], other: []}}
        schedule: {{repeats: {repeats}}}
        suites:
          fake: {{n: 1}}
          {suites}
        """)
    )
    return p


@pytest.mark.needs_sglang  # loads a release environment / torch
def test_per_suite_rounds_in_plan_cells_manifest_and_comparison(fake_env, tmp_path):
    p = _config(tmp_path, "fake_rounds: {rounds: [0, 2]}")
    cfg = load_config(p)
    assert cfg.rounds_of("fake_rounds") == [0, 2] and cfg.rounds_of("fake") == [0, 1, 2]
    assert cfg.suite_params["fake_rounds"].model_dump() == {}  # the core key is not a param
    assert cfg.model_dump(mode="json")["suites"]["fake_rounds"] == {"rounds": [0, 2]}  # recorded
    plan = describe_plan(cfg)
    assert "  fake_rounds: {}  [rounds: [0, 2]]" in plan
    assert (
        "suites per round:\n  round 0: fake, fake_rounds\n  round 1: fake\n"
        "  round 2: fake, fake_rounds\n" in plan
    )
    run_dir = bench.run_bench(p, results_root=tmp_path / "results", launch_spec=fake_env)
    man = read_json(run_dir / "manifest.json")
    assert man["suite_rounds"] == {"fake": [0, 1, 2], "fake_rounds": [0, 2]}
    ran = {(c["variant"], c["repeat"]): sorted(c["suites"]) for c in man["cells"]}
    assert ran == {
        (v, k): (["fake", "fake_rounds"] if k != 1 else ["fake"])
        for v in ("baseline", "other")
        for k in range(3)
    }
    assert not (run_dir / "other" / "rep1" / "fake_rounds").exists()
    cmp = read_json(run_dir / "compare.json")
    assert cmp["suite_rounds"] == {"fake": [0, 1, 2], "fake_rounds": [0, 2]}
    rep1 = next(c for c in cmp["cells"] if (c["variant"], c["repeat"]) == ("other", 1))
    assert rep1["suites"] == {"fake": "ok", "fake_rounds": "not scheduled"}
    row = next(r for r in cmp["rows"] if r["metric"] == "x_ms")
    # the two scheduled rounds, both ok: the row is complete (identical values: no change)
    assert row["baseline_repeats"] == [1.0, 1.0] and row["n_pairs"] == 2
    assert row["verdict"] != "incomplete"
    assert "fake_rounds" not in cmp["cell_warnings"]
    # a resume finds every scheduled suite done and launches nothing
    before = {q: q.stat().st_mtime_ns for q in run_dir.glob("*/rep*/cell.json")}
    bench.run_bench(p, resume=run_dir, launch_spec=fake_env)
    assert {q: q.stat().st_mtime_ns for q in run_dir.glob("*/rep*/cell.json")} == before


def test_progress_log_lines_are_not_wrapped_in_a_log():
    from rich.console import Console

    con = Console(record=True, width=40, force_terminal=False)
    p = BenchProgress(1, console=con, live=False)
    msg = (
        "[patchbench 16:43:12] baseline/correctness/sync_probe: CPU probes (the run is on the CPU)"
    )
    p.log(msg)
    assert con.export_text().splitlines() == [msg]


@pytest.mark.needs_sglang  # loads a release environment / torch
def test_a_randomized_run_records_its_seed_runs_the_plan_and_resumes_it(fake_env, tmp_path):
    from patchbench.run.plan import plan

    model = tmp_path / "model"
    model.mkdir()
    p = tmp_path / "cfg.yaml"
    p.write_text(
        textwrap.dedent(f"""\
        name: random-test
        sglang: "{importlib.metadata.version("sglang")}"
        model: {{path: "{model}"}}
        server: {{port: 31993, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2,
                  flush_pause_s: 0.1}}
        variants: {{baseline: [], b: [], c: []}}
        schedule: {{repeats: 3, order: randomized}}
        suites: {{fake: {{n: 1}}}}
        """)
    )
    cfg = load_config(p)
    seed = cfg.schedule.seed  # derived from the name and the variants
    assert seed == int(hashlib.sha256(b"random-test\0baseline\0b\0c").hexdigest()[:8], 16)
    order = [(c.variant, c.repeat) for c in plan(cfg)]
    assert order == [
        (v, k) for k, r in enumerate(randomized_rounds(["baseline", "b", "c"], 3, seed)) for v in r
    ]
    assert f"schedule   3 repeat(s), randomized (seed {seed}): " in describe_plan(cfg)
    run_dir = bench.run_bench(p, results_root=tmp_path / "results", launch_spec=fake_env)
    man = read_json(run_dir / "manifest.json")
    assert man["config"]["schedule"]["seed"] == seed
    assert [(c["variant"], c["repeat"]) for c in man["cells"]] == order
    assert list(fake_env.seen) == [f"{v}/rep{k}" for v, k in order]
    assert read_json(run_dir / "compare.json")["order"] == "randomized"
    # a resume runs only the missing cell, under the same seed
    v, k = order[4]
    shutil.rmtree(run_dir / v / f"rep{k}")
    fake_env.seen.clear()
    bench.run_bench(p, resume=run_dir, launch_spec=fake_env)
    assert list(fake_env.seen) == [f"{v}/rep{k}"]
