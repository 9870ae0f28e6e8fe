"""GPU hygiene against a fake NVML (no GPU here): the settings doctor prints, the NVML rename of
throttle reasons, processes that cannot be attributed, and the flags read back per cell."""

from patchbench.run import gpu
from patchbench.run.gpu import GpuSampler, Nvml, doctor_rows, open_nvml
from tests.envs.test_envinfo import FakeNvmlModule


class NotSupported(Exception):
    """What pynvml raises for a query the driver does not support (NVMLError_NotSupported)."""


class FakeSettings:
    """The pynvml settings queries for GPUs described by dicts (a missing key: NotSupported)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_FEATURE_ENABLED = 1, 2, 1

    def __init__(self, *gpus):
        self.gpus = gpus

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def _get(self, h, key):
        if key not in h:
            raise NotSupported(key)
        return h[key]

    def nvmlDeviceGetName(self, h):
        return self._get(h, "name")

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._get(h, "pm")

    def nvmlDeviceGetApplicationsClock(self, h, c):
        return self._get(h, "app")[c]

    def nvmlDeviceGetDefaultApplicationsClock(self, h, c):
        return self._get(h, "default")[c]

    def nvmlDeviceGetMaxClockInfo(self, h, c):
        return self._get(h, "max")[c]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._get(h, "limit_mw")

    def nvmlDeviceGetUUID(self, h):
        return self._get(h, "uuid")


H200 = {
    "name": b"NVIDIA H200",
    "pm": 1,
    "app": {1: 1980, 2: 3201},
    "default": {1: 1980, 2: 3201},
    "max": {1: 1980, 2: 3201},
    "limit_mw": 700000,
}


def test_settings_read_persistence_clocks_and_power_limit():
    off = dict(H200, pm=0, app={1: 1500, 2: 3201})
    nv = open_nvml(FakeSettings(H200, off))
    s0, s1 = nv.settings(0), nv.settings(1)
    assert s0 == {
        "index": 0,
        "name": "NVIDIA H200",
        "persistence_mode": True,
        "applications_clocks_mhz": {"sm": 1980, "mem": 3201},
        "default_applications_clocks_mhz": {"sm": 1980, "mem": 3201},
        "max_clocks_mhz": {"sm": 1980, "mem": 3201},
        "power_limit_w": 700.0,
    }
    assert s1["persistence_mode"] is False
    assert s1["applications_clocks_mhz"] == {"sm": 1500, "mem": 3201}


def test_doctor_rows_say_what_biases_a_timing_and_what_is_unknown():
    off = dict(H200, pm=0, app={1: 1500, 2: 3201})
    rows = dict(doctor_rows(open_nvml(FakeSettings(H200, off, {"name": "old"}))))
    assert rows["GPU 0 persistence"] == "on"
    assert rows["GPU 0 app clocks"] == (
        "SM 1980 MHz, memory 3201 MHz (default); max SM 1980 MHz, "
        "memory 3201 MHz; power limit 700.0 W"
    )
    assert (
        rows["GPU 1 persistence"].startswith("off (")
        and "nvidia-smi -pm 1" in rows["GPU 1 persistence"]
    )
    assert rows["GPU 1 app clocks"].startswith(
        "SM 1500 MHz, memory 3201 MHz (NOT the default SM 1980 MHz, memory 3201 MHz:"
    )
    assert "nvidia-smi -rac" in rows["GPU 1 app clocks"]
    # a driver that supports none of the queries: unknown, not a crash
    assert rows["GPU 2 persistence"] == "unknown (not reported)"
    assert rows["GPU 2 app clocks"] == "SM ? MHz, memory ? MHz"
    assert doctor_rows(None) == [("GPU settings", "no NVIDIA GPU (NVML not available)")]


def test_the_renamed_clocks_event_reasons_query_is_preferred():
    class Renamed(FakeNvmlModule):
        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            self.k += 1
            return 0x8  # hw_slowdown

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            raise AssertionError("deprecated query used")

    s = GpuSampler(open_nvml(Renamed([(1980, 3201, 50, 400000, 0, [7])])), ours=lambda: {7})
    s.sample_once()
    assert s.summary().flags == ["GPU 0: throttled (hw_slowdown) in 1 of 1 samples"]


def test_processes_never_matching_ours_are_unattributed_not_flagged():
    # NVML lists host pids inside a container: neither ours (41) nor provably foreign
    s = GpuSampler(
        Nvml(
            FakeNvmlModule(
                [(1980, 3201, 50, 400000, 0, [90001, 90002]), (1980, 3201, 50, 400000, 0, [90001])]
            )
        ),
        ours=lambda: {41},
    )
    s.sample_once()
    s.sample_once()
    out = s.summary()
    assert out.flags == []
    assert out.gpus[0].foreign_pids == [] and out.gpus[0].unattributed_pids == [
        90001,
        90002,
    ]
    assert out.notes == [
        "GPU 0: processes [90001, 90002] could not be matched to this cell's "
        "(NVML listed none of our pids: another pid namespace?)"
    ]
    # once one of ours is listed, the others are foreign
    s = GpuSampler(
        Nvml(
            FakeNvmlModule(
                [(1980, 3201, 50, 400000, 0, [41]), (1980, 3201, 50, 400000, 0, [41, 90001])]
            )
        ),
        ours=lambda: {41},
    )
    s.sample_once()
    s.sample_once()
    assert s.summary().flags == ["GPU 0: foreign process(es) [90001] used the GPU during the cell"]


def test_cell_flags_read_back_from_a_record():
    from patchbench.runfolder import CellRecord

    rec = CellRecord(
        variant="a", gpu={"flags": ["GPU 0: throttled (sw_power_cap) in 2 of 9 samples"]}
    )
    assert rec.gpu.flags == ["GPU 0: throttled (sw_power_cap) in 2 of 9 samples"]
    assert CellRecord(gpu={"flags": []}).gpu.flags == [] and CellRecord(status="ok").gpu is None
    assert gpu.BIASING == set(gpu.THROTTLE_BITS.values()) - {"applications_clocks_setting"}


# ----------------------------------------------------------------------------- report.md
def _run_with(tmp_path, monkeypatch, gpu_of: dict, scans: dict | None = None):
    """A synthetic run (baseline/patched x 2 repeats, suite "bench"); ``gpu_of[(v, k)]``: that
    cell's cell.json ``gpu`` summary; ``scans[(v, k)]``: its bench summary's server_log_scan."""
    from patchbench import records
    from patchbench.analysis import build as analysis
    from patchbench.suite import MetricInfo
    from tests.synthetic import make_run

    monkeypatch.setattr(
        analysis,
        "suite_declarations",
        lambda name, notes: (
            None,
            {"out_tok_s": MetricInfo("higher", "tok/s", primary=True, margin=5.0)},
        ),
    )
    run = make_run(
        tmp_path, metrics={"bench": {"out_tok_s": {"baseline": [100, 101], "patched": [100, 102]}}}
    )
    for (v, k), g in gpu_of.items():
        p = records.cell_dir(run, v, k) / "cell.json"
        rec = records.read_json(p)
        rec["gpu"] = g
        records.write_json(p, rec)
    for (v, k), scan in (scans or {}).items():
        p = records.suite_dir(run, v, k, "bench") / "summary.json"
        sm = records.read_json(p)
        sm["meta"]["server_log_scan"] = scan
        records.write_json(p, sm)
    return run


def _render(run):
    from patchbench import report
    from patchbench.analysis.build import build_comparison

    return report.render_markdown(build_comparison(run))


def test_report_lists_the_cells_whose_gpu_was_throttled_or_shared(tmp_path, monkeypatch):
    clean = {"samples_count": 30, "gpus": [], "flags": []}
    run = _run_with(
        tmp_path,
        monkeypatch,
        {
            ("baseline", 0): clean,
            ("patched", 0): clean,
            ("baseline", 1): clean,
            ("patched", 1): {
                "samples_count": 30,
                "gpus": [],
                "flags": [
                    "GPU 0: throttled (sw_thermal_slowdown) in 4 of 30 samples",
                    "GPU 0: foreign process(es) [4242] used the GPU during the cell",
                ],
            },
        },
    )
    text = _render(run)
    block = text.split("## GPU\n", 1)[1].split("\n## ", 1)[0]
    assert block.strip().splitlines() == [
        "**1 of 4 sampled cell(s) ran on a throttled or shared GPU**; their timings are biased "
        "(compare them with the other repeats):",
        "",
        "- patched/rep1: GPU 0: throttled (sw_thermal_slowdown) in 4 of 30 samples; GPU 0: "
        "foreign process(es) [4242] used the GPU during the cell",
    ]
    # all clean: one line; no GPU summary at all (CPU run): no block
    run2 = _run_with(tmp_path / "b", monkeypatch, {("baseline", 0): clean, ("patched", 1): clean})
    assert "## GPU\n\nno throttling and no foreign process in the 2 sampled cell(s)\n" in _render(
        run2
    )
    assert "## GPU" not in _render(_run_with(tmp_path / "c", monkeypatch, {}))


def test_report_shows_each_suites_server_log_taint_per_cell(tmp_path, monkeypatch):
    scan = {
        "retractions_count": 2,
        "retracted_requests_count": 7,
        "oom_count": 1,
        "first_lines": ["KV cache pool is full. Retract requests. #retracted_reqs: 3"],
    }
    quiet = {"retractions_count": 0, "retracted_requests_count": 0, "oom_count": 0}
    run = _run_with(tmp_path, monkeypatch, {}, {("patched", 0): scan, ("baseline", 0): quiet})
    block = _render(run).split("## Server log\n", 1)[1].split("\n## ", 1)[0]
    assert block.strip().splitlines()[-1] == (
        "- bench / patched/rep0: 2 retraction(s) of 7 request(s), 1 out-of-memory event(s) "
        "(first: KV cache pool is full. Retract requests. #retracted_reqs: 3)"
    )
    assert len([ln for ln in block.splitlines() if ln.startswith("- ")]) == 1
    assert "## Server log" not in _render(
        _run_with(tmp_path / "q", monkeypatch, {}, {("patched", 0): quiet})
    )


def test_the_machine_is_the_gpus_the_run_sees_else_the_cpu_and_its_host():
    from patchbench.envs.envinfo import cpu_model
    from patchbench.run.manifest import machine_info

    a, b = dict(H200, uuid="GPU-aaaa-1"), dict(H200, uuid=b"GPU-bbbb-2")
    nv = open_nvml(FakeSettings(a, b, {"name": "NVIDIA H200"}))  # the third: no UUID reported
    both = [(0, "NVIDIA H200", "GPU-aaaa-1"), (1, "NVIDIA H200", "GPU-bbbb-2")]
    assert nv.devices() == nv.devices("") == both
    assert nv.devices("1") == [both[1]] and nv.devices("GPU-bbbb, 0, 7") == [both[1], both[0]]
    m = machine_info(nv, "1", "node-7")
    assert (m.model, m.gpu_uuids, m.hostname) == ("NVIDIA H200", ["GPU-bbbb-2"], None)
    assert m.key == "NVIDIA H200 [GPU-bbbb-2]" and m.driver is None  # not reported
    nv.nv.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m = machine_info(nv, "1", "node-7")
    # the driver is recorded but not part of the key: an update keeps the machine's nights
    assert m.driver == "550.54.15" and m.key == "NVIDIA H200 [GPU-bbbb-2]"
    assert machine_info(nv, None, "node-7").key == "NVIDIA H200 [GPU-aaaa-1, GPU-bbbb-2]"
    cpu = machine_info(None, "1", "node-7")
    assert (cpu.model, cpu.gpu_uuids, cpu.hostname) == (cpu_model(), [], "node-7")
    assert cpu.key == f"{cpu_model()} on node-7"
    assert machine_info(nv, "5", "node-7").key == cpu.key  # NVML names none it sees


class FakeGpus(FakeSettings):
    """:class:`FakeSettings` that also samples: every reading the same, each GPU's processes
    its dict's ``pids``, the driver 550.54.15."""

    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, h, _):
        return 50

    def nvmlDeviceGetPowerUsage(self, h):
        return 400000

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [type("P", (), {"pid": p})() for p in h.get("pids", [])]

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"


def test_a_cell_records_the_gpus_it_used_with_driver_clocks_and_power_limit():
    a = dict(H200, uuid="GPU-aaaa-1", pids=[90001])
    b = dict(H200, uuid="GPU-bbbb-2", pids=[41], app={1: 1500, 2: 3201}, limit_mw=500000)
    c = {"name": "NVIDIA H200", "uuid": "GPU-cccc-3"}  # reports neither clocks nor power limit
    s = GpuSampler(open_nvml(FakeGpus(a, b, c)), ours=lambda: {41})
    s.sample_once()
    out = s.summary()
    assert out.driver == "550.54.15"
    assert [d.model_dump() for d in out.devices] == [
        {
            "index": 1,
            "uuid": "GPU-bbbb-2",
            "name": "NVIDIA H200",
            "applications_clocks_mhz": {"sm": 1500, "mem": 3201},
            "max_clocks_mhz": {"sm": 1980, "mem": 3201},
            "power_limit_w": 500.0,
        }
    ]
    assert out.devices[0].settings() == "500 W, SM 1500 MHz, memory 3201 MHz"
    # NVML never lists one of ours (another pid namespace): the GPUs the server sees
    s = GpuSampler(open_nvml(FakeGpus(a, b, c)), ours=lambda: {7}, visible="GPU-cccc")
    s.sample_once()
    (d,) = s.summary().devices
    assert (d.index, d.uuid, d.power_limit_w) == (2, "GPU-cccc-3", None)
    assert d.settings() == "? W, SM ? MHz, memory ? MHz"
    s.visible = None
    assert [d.index for d in s.summary().devices] == [0, 1, 2]


def _devices(uuid="GPU-aaaa-1", watts=700.0, sm=1980):
    return {
        "samples_count": 3,
        "driver": "550.54.15",
        "devices": [
            {
                "index": 0,
                "uuid": uuid,
                "name": "NVIDIA H200",
                "applications_clocks_mhz": {"sm": sm, "mem": 3201},
                "max_clocks_mhz": {"sm": 1980, "mem": 3201},
                "power_limit_w": watts,
            }
        ],
    }


def test_report_flags_cells_on_different_gpus_or_gpu_settings(tmp_path, monkeypatch):
    from patchbench.analysis.build import build_comparison

    same = {(v, k): _devices() for v in ("baseline", "patched") for k in (0, 1)}
    cmp = build_comparison(_run_with(tmp_path / "same", monkeypatch, same))
    assert cmp.run.host.gpu_warnings == []
    assert "gpu_warnings" not in cmp.model_dump(mode="json")["run"]["host"]
    moved = dict(same)
    moved[("patched", 1)] = _devices(uuid="GPU-bbbb-2")
    moved[("baseline", 1)] = _devices(watts=500.0, sm=1500)
    cmp = build_comparison(_run_with(tmp_path / "moved", monkeypatch, moved))
    assert cmp.run.host.gpu_warnings == [
        "the timed cells ran on different GPUs (baseline/rep0, patched/rep0, baseline/rep1 on "
        "GPU-aaaa-1; patched/rep1 on GPU-bbbb-2): GPUs of one model differ by several percent, "
        "so speed rows compare GPUs as much as the change; pin the run to one GPU "
        "(CUDA_VISIBLE_DEVICES)",
        "GPU-aaaa-1 ran with different power limits or application clocks (700 W, SM 1980 MHz, "
        "memory 3201 MHz in baseline/rep0, patched/rep0; 500 W, SM 1500 MHz, memory 3201 MHz in "
        "baseline/rep1): speed rows compare the settings as much as the change; keep them fixed "
        "during a run",
    ]
    text = _render(_run_with(tmp_path / "moved2", monkeypatch, moved))
    answer = text.split("## Answer\n", 1)[1].split("\n## ", 1)[0]
    assert "**Warning (GPU): the timed cells ran on different GPUs (baseline/rep0," in answer
    assert "**Warning (GPU): GPU-aaaa-1 ran with different power limits" in answer
    block = text.split("## GPU\n", 1)[1].split("\n## ", 1)[0]
    assert (
        block.strip().splitlines()[0]
        == "no throttling and no foreign process in the 4 sampled cell(s)"
    )
    assert "**The timed cells ran on different GPUs (" in block
    assert "**GPU-aaaa-1 ran with different power limits" in block
