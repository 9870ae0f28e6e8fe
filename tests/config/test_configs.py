"""Every config in configs/ validates (suite parameters, compare and nightly sections, patches
exist), and its dry run prints a plan; plus the schedule and doctor."""

import re
from pathlib import Path

import pytest

from patchbench import cli, doctor
from patchbench.config import load_config
from patchbench.envs.builds import INDEX_URL_ENV
from patchbench.matrix.spec import is_matrix_file, load_matrix
from patchbench.run.plan import plan_cells

ALL = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
CONFIGS = [p for p in ALL if not is_matrix_file(p)]
MATRICES = [p for p in ALL if is_matrix_file(p)]
#: a recorded answer of the package index's JSON API (newest sglang: 0.5.23), so `sglang: latest`
#: resolves without the network
INDEX = Path(__file__).resolve().parent.parent / "data" / "pypi-index"


@pytest.fixture(autouse=True)
def _recorded_index(monkeypatch):
    monkeypatch.setenv(INDEX_URL_ENV, INDEX.as_uri())


def test_there_are_configs():
    names = {p.name for p in ALL}
    assert {
        "demo-cpu.yaml",
        "demo-cpu-0.5.23.yaml",
        "pr9460-h200.yaml",
        "aa-h200.yaml",
        "aa-cpu.yaml",
        "overlap-cpu.yaml",
        "overlap-h200.yaml",
        "nightly-h200.yaml",
        "nightly-cpu.yaml",
        "nightly-matrix-cpu.yaml",
    } <= names


def test_cpu_nightly_runs_the_newest_sglang_and_its_matrix_both_pins(capsys):
    """configs/nightly-cpu.yaml: `sglang: latest` (the recorded index says 0.5.23), gates and a
    confirmation section; configs/nightly-matrix-cpu.yaml: that config on both installed pins."""
    cfg = load_config(CONFIGS[0].parent / "nightly-cpu.yaml")
    assert cfg.sglang == "latest" and cfg.nightly.confirm.repeats == 2
    assert cli.main(["bench", str(CONFIGS[0].parent / "nightly-cpu.yaml"), "--dry-run"]) == 0
    assert ".venv-0.5.23/bin/python" in capsys.readouterr().out
    [m] = [load_matrix(p) for p in MATRICES if p.name == "nightly-matrix-cpu.yaml"]
    assert sorted(u.config.sglang for u in m.units) == ["0.5.1.post3", "0.5.23"]
    assert {u.config.name for u in m.units} == {"nightly-cpu"}


def test_a_dry_run_that_predicts_exit_3_prints_the_whole_plan_and_exits_3(
    monkeypatch, tmp_path, capsys
):
    """`sglang: latest` with an index that is not there: the real run would stop at exit 3
    before any server starts, so its dry run prints the plan, the note and the patches, and
    exits 3 with the environment's error line."""
    monkeypatch.setenv(INDEX_URL_ENV, (tmp_path / "no-index").as_uri())
    assert cli.main(["bench", str(CONFIGS[0].parent / "nightly-cpu.yaml"), "--dry-run"]) == 3
    out, err = capsys.readouterr()
    assert "name       nightly-cpu" in out and "nothing is launched" in out
    assert "note: a real run stops here (exit 3): sglang: latest" in out
    assert "\npatches    " in out  # printed after the note: the whole plan
    assert err.startswith("patchbench bench: environment not ready (exit 3): sglang: latest")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates_and_dry_runs(path, capsys):
    cfg = load_config(path)
    assert cfg.baseline in cfg.variants
    assert set(cfg.suite_params) == set(cfg.suites)
    assert cli.main(["bench", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"name       {cfg.name}" in out and "nothing is launched" in out


PRESETS = sorted((CONFIGS[0].parent / "presets").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_generic_presets_are_text_only_serving_without_case_suites(path, capsys):
    """configs/presets/: valid configs whose suites are the generic ones (text-only serving of
    random token ids, MMMU optional): the mrope sync probe and the profiler stay in their
    case's configs."""
    assert {p.stem for p in PRESETS} >= {"cpu-demo", "pr-h200", "sweep-h200", "capacity-h200"}
    cfg = load_config(path)
    assert list(cfg.suites) == ["serving"]
    assert cfg.suite_params["serving"].dataset_name == "random-ids"
    assert cli.main(["bench", str(path), "--dry-run"]) == 0
    assert "nothing is launched" in capsys.readouterr().out


def test_sweep_preset_is_a_four_point_concurrency_curve_within_two_h200_hours():
    """configs/presets/sweep-h200.yaml: pr-h200's model and text-only serving, swept at
    concurrency 1, 4, 16 and 64 in a sequential schedule whose most rounds fit 2 H200-hours
    by the dry run's own estimate."""
    from patchbench.run.plan import describe_plan

    cfg = load_config(CONFIGS[0].parent / "presets" / "sweep-h200.yaml")
    pr = load_config(CONFIGS[0].parent / "presets" / "pr-h200.yaml")
    assert cfg.model == pr.model and list(cfg.variants) == ["baseline", "my-change"]
    sw = cfg.suite_params["serving"].sweep
    assert sw.axis == "max_concurrency" and sw.keys() == ["c1", "c4", "c16", "c64"]
    assert cfg.schedule.sequential is not None and cfg.schedule.max_repeats == 8
    text = describe_plan(cfg)
    assert "serving.output_throughput_tok_s@c64" in text
    per_repeat = float(text.split("a cell, ~")[1].split(" a repeat")[0])
    assert per_repeat * cfg.schedule.max_repeats <= 120


def test_capacity_preset_is_the_calibrated_pr_capacity_search_on_the_generic_model():
    """configs/presets/capacity-h200.yaml: pr-h200's model and text-only serving, with the
    capacity search, SLO and schedule of configs/pr9460-capacity-h200.yaml (the calibrated
    ones, docs/calibration.md "Capacity"), the capacity the one primary."""
    cfg = load_config(CONFIGS[0].parent / "presets" / "capacity-h200.yaml")
    pr = load_config(CONFIGS[0].parent / "pr9460-capacity-h200.yaml")
    generic = load_config(CONFIGS[0].parent / "presets" / "pr-h200.yaml")
    assert cfg.model == generic.model and list(cfg.variants) == ["baseline", "my-change"]
    cap = cfg.suite_params["serving"].capacity
    assert cap == pr.suite_params["serving"].capacity and cap.primary
    assert cfg.schedule == pr.schedule and cfg.schedule.max_repeats == 8


def test_cpu_dry_run_quotes_no_gpu_time():
    """The CPU demo's sweep lists its points and prompts but no H200 estimate (the cost model is
    an H200's); a GPU config of the same sweep keeps it."""
    from patchbench.run.plan import describe_plan

    cpu = describe_plan(load_config(CONFIGS[0].parent / "demo-cpu.yaml"))
    assert "c1: 4 prompts, c8: 24 prompts" in cpu
    assert "H200 GPU minutes" not in cpu and "no time estimate on the CPU engine" in cpu
    gpu = describe_plan(load_config(CONFIGS[0].parent / "presets" / "sweep-h200.yaml"))
    assert "estimated H200 GPU minutes" in gpu


def test_dry_run_with_an_unchecked_patch_does_not_claim_every_patch_applies(monkeypatch, capsys):
    """A variant whose release files are not here (wheels not downloaded) is counted as not
    checked in the head line, never under "every patch applies"."""
    from patchbench.run import variants

    line = (
        "variant 'pr9460-upstream': not checked on sglang 0.5.1.post3: sglang==0.5.2rc1: its "
        "wheel is not in .cache/wheels/sglang-0.5.2rc1 (not downloaded: offline check)"
    )
    monkeypatch.setattr(variants, "check_patches", lambda cfg: [line])
    assert cli.main(["bench", str(CONFIGS[0].parent / "demo-cpu.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "every patch applies" not in out
    assert "patches    1 variant(s) not checked (below" in out and line in out


@pytest.mark.parametrize("gpu", [None, {"gpus": [{"name": "H200"}], "driver": "1"}])
def test_dry_run_of_a_gpu_config_without_a_gpu_points_at_doctor(monkeypatch, capsys, gpu):
    """A GPU config's dry run on a machine without an NVIDIA GPU says so and names doctor; with
    a GPU, or for a CPU config, nothing is added."""
    from patchbench.envs import envinfo

    monkeypatch.setattr(envinfo, "gpu_info", lambda: gpu)
    note = "note: no NVIDIA GPU here, and the config does not run on --device cpu"
    for name, want in (("pr9460-h200.yaml", gpu is None), ("demo-cpu.yaml", False)):
        assert cli.main(["bench", str(CONFIGS[0].parent / name), "--dry-run"]) == 0
        assert (note in capsys.readouterr().out) is want


def test_demo_compares_stock_upstream_and_ours():
    cfg = load_config(CONFIGS[0].parent / "demo-cpu.yaml")
    assert {v: cfg.patches_of(v) for v in cfg.variants} == {
        "baseline": [],
        "pr9460-upstream": ["pr9460-upstream"],
        "mrope-sync-free": ["mrope-sync-free"],
    }
    # patch-only variants are recorded in the short list form run folders always held
    assert cfg.model_dump(mode="json")["variants"] == {
        "baseline": [],
        "pr9460-upstream": ["pr9460-upstream"],
        "mrope-sync-free": ["mrope-sync-free"],
    }
    assert cfg.sglang == "0.5.1.post3"


@pytest.mark.parametrize("name", ["overlap-cpu.yaml", "overlap-h200.yaml"])
def test_overlap_configs_cross_overlap_with_the_patch(name):
    """4 variants: {stock, mrope-sync-free} x {overlap on, --disable-overlap-schedule}; the flag
    is per variant only, so the baseline launches with sglang's default (overlap on)."""
    cfg = load_config(CONFIGS[0].parent / name)
    flag = "--disable-overlap-schedule"
    assert flag not in cfg.server.args
    got = {v: (cfg.patches_of(v), flag in cfg.server_args_of(v)) for v in cfg.variants}
    assert got == {
        "baseline": ([], False),
        "no-overlap": ([], True),
        "mrope-sync-free": (["mrope-sync-free"], False),
        "mrope-sync-free-no-overlap": (["mrope-sync-free"], True),
    }
    assert cfg.baseline == "baseline" and cfg.aa_variants() == []
    assert cfg.variant_diff("no-overlap")["server_args"]["added"] == [flag]


def test_pr9460_has_an_aa_control():
    cfg = load_config(CONFIGS[0].parent / "pr9460-h200.yaml")
    assert cfg.aa_variants() == ["baseline-aa"]
    assert cfg.patches_of("baseline-aa") == [] and cfg.variant_diff("baseline-aa")["aa"] is True


@pytest.mark.parametrize(
    "variants, repeats, order, expected",
    [
        (["A", "B"], 2, "interleaved", ["A0", "B0", "B1", "A1"]),
        (["A", "B"], 3, "interleaved", ["A0", "B0", "B1", "A1", "A2", "B2"]),
        (["A", "B", "C"], 2, "interleaved", ["A0", "B0", "C0", "C1", "B1", "A1"]),
        (["A", "B"], 2, "sequential", ["A0", "A1", "B0", "B1"]),
    ],
)
def test_schedule(variants, repeats, order, expected):
    cells = plan_cells(variants, repeats, order)
    assert [f"{c.variant}{c.repeat}" for c in cells] == expected
    assert [c.index for c in cells] == list(range(len(expected)))


def test_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        plan_cells(["A"], 0)
    with pytest.raises(ValueError, match="unknown order 'zigzag'"):
        plan_cells(["A"], 1, "zigzag")


def test_doctor_prints_environment_and_missing(capsys):
    rc = cli.main(["doctor", str(CONFIGS[0].parent / "pr9460-h200.yaml")])
    out = capsys.readouterr().out
    assert "sglang" in out and re.search(r"supported pins +0\.5\.1\.post3, 0\.5\.23", out)
    from patchbench.envs.envinfo import gpu_info

    if gpu_info() is None:  # the CI machines
        assert "MISSING NVIDIA GPU" in out and "run on a GPU machine" in out
        assert rc == 3
    else:
        assert "OK      NVIDIA GPU" in out


def test_hub_model_id_is_passed_through_and_local_folders_resolve(tmp_path):
    """`Qwen/Qwen2.5-VL-3B-Instruct` (no such local folder) reaches --model-path unchanged; a
    relative local folder resolves against the repo root; ./-paths are never hub ids."""
    from patchbench.inputs import REPO_ROOT, is_hub_id

    cfg = load_config(CONFIGS[0].parent / "pr9460-h200.yaml")
    assert cfg.model_ref == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert cfg.tokenizer_ref == "Qwen/Qwen2.5-VL-3B-Instruct"
    demo = load_config(CONFIGS[0].parent / "demo-cpu.yaml")
    assert demo.model_ref == str(REPO_ROOT / ".cache/models/tiny-qwen25vl-tf4")
    assert is_hub_id("Qwen/Qwen2.5-VL-3B-Instruct") and is_hub_id("org/name")
    assert not is_hub_id("./org/name") and not is_hub_id("/abs/path") and not is_hub_id("a/b/c")
    assert not is_hub_id("~/models/x") and not is_hub_id("model")


def test_doctor_finds_model_and_mmmu_in_a_filled_hf_cache_offline(tmp_path, monkeypatch):
    """Offline, with the weights and MMMU in the hub cache (the GPU runner's usual state), the
    model and dataset checks pass; with an empty cache they fail and say how to fix it."""
    import huggingface_hub.constants as hc

    cfg = load_config(CONFIGS[0].parent / "pr9460-h200.yaml")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    offline = {"hub_reachable": False, "sglang": cfg.sglang}
    rows = {what.split(" (")[0]: (ok, what) for what, ok, _ in doctor.checks_for(cfg, offline)}
    assert rows["model Qwen/Qwen2.5-VL-3B-Instruct"][0] is False
    assert rows["suite mmmu: dataset MMMU/MMMU"][0] is False
    (tmp_path / "models--Qwen--Qwen2.5-VL-3B-Instruct" / "snapshots" / "abc123").mkdir(parents=True)
    (tmp_path / "datasets--MMMU--MMMU" / "snapshots" / "def456").mkdir(parents=True)
    rows = {what.split(" (")[0]: (ok, what) for what, ok, _ in doctor.checks_for(cfg, offline)}
    assert rows["model Qwen/Qwen2.5-VL-3B-Instruct"] == (
        True,
        "model Qwen/Qwen2.5-VL-3B-Instruct (in the HF hub cache)",
    )
    assert rows["suite mmmu: dataset MMMU/MMMU"][0] is True
    assert rows["suite serving: dataset mmmu"][0] is True


def test_capacity_dry_run_estimates_h200_minutes():
    """The PR capacity config's dry run quotes its H200 minutes: 4 probes at concurrency 32
    (twice the start), each max(32, 4 x 32) = 128 prompts in 4 waves of 1024 decode steps at
    79 / (200 / 16 x 1024) x (1 + 32 / 64) / (1 + 16 / 64) s a step, plus 10 s, and 60 s of
    start-up: 4 x 40.34 + 60 = 221 s = 3.7 min a cell, 7.4 a round of 2; the CPU's quotes none."""
    from patchbench.run.plan import describe_plan

    step = 79 / (200 / 16 * 1024) * 1.5 / 1.25
    probe = 4 * 1024 * step + 10
    assert round(probe) == 40 and round((4 * probe + 60) / 60, 1) == 3.7
    gpu = describe_plan(load_config(CONFIGS[0].parent / "pr9460-capacity-h200.yaml"))
    assert "~3.7 a cell (4 probes of ~40 s at concurrency 32" in gpu and "~7.4 a repeat" in gpu
    cpu = describe_plan(load_config(CONFIGS[0].parent / "capacity-cpu.yaml"))
    assert "capacity search: concurrency 8 first" in cpu and "H200 GPU minutes" not in cpu
    assert "~4 probes a cell (at most 5)" in cpu


def test_too_few_repeats_says_what_the_run_can_show():
    """Two repeats cannot decide speed; the dry run says what the run shows instead: accuracy
    only where an mmmu suite runs (the capacity config has none)."""
    from patchbench.run.plan import too_few_repeats

    demo = too_few_repeats(load_config(CONFIGS[0].parent / "demo-cpu.yaml"))
    cap = too_few_repeats(load_config(CONFIGS[0].parent / "capacity-cpu.yaml"))
    assert demo is not None and "shows output identity, accuracy and the pipeline" in demo
    assert cap is not None and "shows output identity and the pipeline" in cap
