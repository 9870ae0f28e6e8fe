"""What the manifest records of the environment."""

import pytest


@pytest.mark.needs_sglang  # loads a release environment / torch
def test_torch_build_info_without_import_matches_torch():
    """The manifest's torch version is read from torch/version.py; it must be what torch says."""
    import subprocess
    import sys

    from patchbench.envs.envinfo import torch_build_info

    got = torch_build_info()
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [got["torch"], str(got["cuda_build"])] == out


class FakeNvmlModule:
    """The pynvml functions patchbench.run.gpu calls, for one GPU. Each sample starts with the
    throttle-reason query (patchbench.run.gpu.Nvml.sample), which moves to the next reading:
    (sm MHz, mem MHz, temperature C, power mW, throttle bits, pids)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, readings):
        self.readings, self.k = readings, -1

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        self.k += 1
        return self.readings[self.k][4]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self.readings[self.k][0 if kind == self.NVML_CLOCK_SM else 1]

    def nvmlDeviceGetTemperature(self, h, _):
        return self.readings[self.k][2]

    def nvmlDeviceGetPowerUsage(self, h):
        return self.readings[self.k][3]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        class P:
            def __init__(self, pid):
                self.pid = pid

        return [P(p) for p in self.readings[self.k][5]]


def test_gpu_sampler_flags_throttling_and_foreign_processes():
    from patchbench.run.gpu import GpuSampler, open_nvml

    nv = FakeNvmlModule(
        [
            (1980, 2619, 40, 300000, 0, [100]),  # pid 100 is ours
            (1980, 2619, 41, 310000, 0x1, [100]),  # 0x1 = idle: not a throttle
            (1500, 2619, 85, 700000, 0x40 | 0x4, [100, 999]),
        ]
    )  # hw thermal + power cap
    s = GpuSampler(open_nvml(nv), ours=lambda: {100})
    for _ in range(3):
        s.sample_once()
    out = s.summary().model_dump()
    g = out["gpus"][0]
    assert out["samples_count"] == 3
    assert g["sm_clock_mhz"] == {"min": 1500, "median": 1980, "max": 1980}
    assert g["temperature_c"] == {"min": 40, "median": 41, "max": 85}
    assert g["power_w"] == {"min": 300.0, "median": 310.0, "max": 700.0}
    assert g["throttle"] == {"sw_power_cap": 1, "hw_thermal_slowdown": 1}
    assert g["foreign_pids"] == [999]
    assert out["flags"] == [
        "GPU 0: throttled (hw_thermal_slowdown) in 1 of 3 samples",
        "GPU 0: throttled (sw_power_cap) in 1 of 3 samples",
        "GPU 0: foreign process(es) [999] used the GPU during the cell",
    ]


def test_no_nvml_means_no_gpu_checks():
    from patchbench.run.gpu import open_nvml

    class NoDriver:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    assert open_nvml(NoDriver()) is None


def _fake_venv(root, version: str, requires: list[str]):
    """A venv folder holding an installed sglang ``version`` (its package and dist-info only)."""
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    meta = [f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").write_text("")
    return site


def test_environments_lists_each_venv_with_its_sglang_and_requirements(tmp_path, monkeypatch):
    """Every venv of PATCHBENCH_VENVS holding sglang is an environment (its python, release,
    site-packages and declared requirements); the running interpreter's comes first; a venv
    without sglang is left out; environment_for finds a release's environment."""
    from patchbench.envs import envinfo

    site = _fake_venv(tmp_path / ".venv-9.9", "9.9", ["torch==2.0", "numpy"])
    (tmp_path / "empty" / "bin").mkdir(parents=True)
    monkeypatch.setenv(envinfo.VENVS_ENV, f"{tmp_path / '.venv-9.9'}:{tmp_path / 'empty'}")
    envs = envinfo.environments()
    running = envinfo.installed_version("sglang")
    assert [e.sglang for e in envs] == ([running] if running else []) + ["9.9"]
    fake = envs[-1]
    assert fake.site_dir == site and fake.python == str(tmp_path / ".venv-9.9" / "bin" / "python")
    assert fake.requires == ("torch==2.0", "numpy") and not fake.current
    assert envinfo.environment_for("9.9") == fake and envinfo.environment_for("0.0") is None
    assert envinfo.venv_dir("9.9", tmp_path) == tmp_path / ".venv-9.9"
    assert envinfo.venv_dir("0.5.1.post3", tmp_path) == tmp_path / ".venv"
    # the venvs asked about, without the running interpreter
    assert envinfo.environment_for("9.9", venvs=[tmp_path / "empty"]) is None
    assert envinfo.environment_for("9.9", venvs=[tmp_path / ".venv-9.9"], current=False) == fake
    assert envinfo.environment_for(running, current=False, venvs=[]) is None
    assert envinfo.environment_for(None, requires=["numpy", "torch==2.0"]) == fake
    assert envinfo.setup_command("9.9") == "make setup SGLANG=9.9"
