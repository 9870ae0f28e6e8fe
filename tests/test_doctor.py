"""``patchbench doctor`` prints each GPU's persistence mode and application clocks (fake NVML)
and says "no NVIDIA GPU" without one."""

import io
import sys

from patchbench import doctor, envinfo
from patchbench.gpu import open_nvml
from tests.test_gpu import H200, FakeSettings

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
    import patchbench.gpu as gpu

    monkeypatch.setattr(gpu, "open_nvml", lambda module=None: None)
    code, text = _doctor(monkeypatch, "auto")
    assert "no NVIDIA GPU" in text
