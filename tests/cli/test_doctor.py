"""``patchbench doctor`` prints each GPU's persistence mode and application clocks (fake NVML)
and says "no NVIDIA GPU" without one."""

import io
import sys

import pytest

from patchbench import doctor
from patchbench.envs import envinfo
from patchbench.run.gpu import open_nvml
from tests.run.test_gpu import H200, FakeSettings

INFO = {
    "python": "3.11",
    "executable": sys.executable,
    "gpu": None,
    "sglang": "0.5.1.post3",
    "hub_reachable": False,
    "disk_free_gib": 1.0,
}


def _doctor(monkeypatch, nvml) -> tuple[int, str]:
    monkeypatch.setattr(envinfo, "collect", lambda **_: INFO)
    monkeypatch.setattr(doctor, "_stale_server_checks", lambda *a: [])
    out = io.StringIO()
    return doctor.run_doctor(None, out=out, nvml=nvml), out.getvalue()


def test_doctor_prints_persistence_mode_and_application_clocks(monkeypatch):
    off = dict(H200, pm=0, app={1: 1500, 2: 3201})
    code, text = _doctor(monkeypatch, open_nvml(FakeSettings(H200, off)))
    lines = text.splitlines()
    assert "GPU 0 persistence  on" in lines
    assert any(ln.startswith("GPU 1 persistence  off (") for ln in lines)
    assert (
        "GPU 0 app clocks   SM 1980 MHz, memory 3201 MHz (default); max SM 1980 MHz, memory "
        "3201 MHz; power limit 700.0 W"
    ) in lines
    assert any(
        ln.startswith("GPU 1 app clocks   SM 1500 MHz, memory 3201 MHz (NOT the default")
        for ln in lines
    )
    assert code == 0  # settings are reported, not requirements


def test_doctor_without_nvml_says_no_nvidia_gpu(monkeypatch):
    code, text = _doctor(monkeypatch, None)
    assert "GPU settings       no NVIDIA GPU (NVML not available)" in text.splitlines()
    assert code == 0


def test_doctor_auto_finds_no_gpu_on_a_machine_without_a_driver(monkeypatch):
    import patchbench.run.gpu as gpu

    monkeypatch.setattr(gpu, "open_nvml", lambda module=None: None)
    code, text = _doctor(monkeypatch, "auto")
    assert "no NVIDIA GPU" in text


def test_doctor_checks_each_variants_build_against_this_machines_environments(tmp_path):
    """A config's sglang (for the run or a variant) is checked as ``bench`` resolves it: a
    release with an environment here is OK and named with its venv; a release without one is
    MISSING with the ``make setup SGLANG=...`` that makes it (docs: README, Environments)."""
    from patchbench.config import load_config
    from patchbench.inputs import REPO_ROOT

    text = (REPO_ROOT / "configs/presets/cpu-demo.yaml").read_text()
    have = envinfo.environments()[0].sglang
    ok_cfg = tmp_path / "ok.yaml"
    ok_cfg.write_text(text.replace("sglang: 0.5.1.post3", f'sglang: "{have}"', 1))
    [(what, ok, _)] = doctor._build_checks(load_config(ok_cfg))
    assert ok and what.startswith(f"sglang {have} in ")
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text(text.replace("sglang: 0.5.1.post3", 'sglang: "0.4.0"', 1))
    [(what, ok, fix)] = doctor._build_checks(load_config(bad_cfg))
    assert not ok and "0.4.0" in what and "make setup SGLANG=0.4.0" in fix


@pytest.mark.needs_sglang  # loads a release environment
def test_a_tiny_model_not_built_yet_is_not_a_missing_requirement(tmp_path):
    """``model.tiny``: the first run builds the model, so doctor lists a model not built yet as
    OK with how to build it now, never as MISSING (doctor would exit 3 on a fresh clone)."""
    import yaml

    from patchbench.config import load_config
    from patchbench.inputs import REPO_ROOT

    raw = yaml.safe_load((REPO_ROOT / "configs/demo-cpu.yaml").read_text())
    raw["model"]["path"] = str(tmp_path / "no-model-yet")
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(raw))
    info = {"sglang": None, "hub_reachable": False, "gpu": None}
    rows = [r for r in doctor.checks_for(load_config(path), info) if "tiny model" in r[0]]
    [(what, ok, _fix)] = rows
    assert ok and "not built yet: the first run builds it" in what
    assert f"patchbench make-tiny-model {tmp_path / 'no-model-yet'}" in what
