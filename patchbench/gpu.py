"""NVML where a GPU exists: is the GPU memory of a stopped server free, and what state was the GPU
in during a cell (clocks, temperature, power, throttle reasons, processes that are not ours).

Everything goes through :class:`Nvml`, which wraps the ``pynvml`` module (``nvidia-ml-py``) or any
object with the same functions (tests pass a fake). :func:`open_nvml` returns None where there is
no NVIDIA driver or GPU, and every caller then skips its check.
"""
from __future__ import annotations

import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

#: throttle reasons that mean the GPU ran slower than asked (NVML clocks-event reason bits)
THROTTLE_BITS = {
    0x0000000000000002: "applications_clocks_setting",
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}
#: reasons that bias a timing (idle and the application-clock setting do not)
BIASING = {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
           "hw_power_brake_slowdown"}


def open_nvml(module: Any = None) -> Nvml | None:
    """An initialised :class:`Nvml`, or None when NVML or a GPU is not there.

    ``module``: a pynvml-compatible object (tests); default: ``import pynvml``.
    """
    if module is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import pynvml as module
        except ImportError:
            return None
    try:
        module.nvmlInit()
        if module.nvmlDeviceGetCount() < 1:
            return None
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses for "no driver"
        return None
    return Nvml(module)


@dataclass
class Nvml:
    """A thin wrapper over an initialised pynvml-compatible module ``nv``."""

    nv: Any

    def count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    def _h(self, i: int):
        return self.nv.nvmlDeviceGetHandleByIndex(i)

    def pids(self, i: int) -> list[int]:
        """pids of the compute processes on GPU ``i``."""
        try:
            return [int(p.pid) for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self._h(i))]
        except Exception:  # noqa: BLE001 - some drivers refuse process queries in containers
            return []

    def holders(self, pids: list[int]) -> list[int]:
        """Those of ``pids`` that hold memory on any GPU."""
        want = set(pids)
        return sorted({p for i in range(self.count()) for p in self.pids(i) if p in want})

    def wait_released(self, pids: list[int], timeout_s: float = 30.0,
                      poll_s: float = 0.1) -> list[int]:
        """Wait until no GPU lists any of ``pids``; returns those still listed at the timeout
        ([] when released)."""
        deadline = time.monotonic() + timeout_s
        while True:
            held = self.holders(pids)
            if not held or time.monotonic() >= deadline:
                return held
            time.sleep(poll_s)

    def sample(self, i: int) -> dict:
        """One reading of GPU ``i``: ``sm_clock_mhz``, ``mem_clock_mhz``, ``temperature_c``,
        ``power_w``, ``throttle`` (names of the active reasons) and ``pids``."""
        nv, h = self.nv, self._h(i)
        reasons = int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return {"sm_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "mem_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                "temperature_c": int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                "power_w": round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1),
                "throttle": [n for b, n in THROTTLE_BITS.items() if reasons & b],
                "pids": self.pids(i)}


@dataclass
class GpuSampler:
    """Samples every GPU every ``interval_s`` seconds in a thread while a cell runs.

    ``ours``: a callable returning the pids that belong to the cell (server processes, clients);
    any other pid seen on a GPU is a foreign process. :meth:`summary` gives what cell.json keeps.
    """

    nvml: Nvml
    ours: Any = lambda: set()
    interval_s: float = 1.0
    samples: list[list[dict]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        self._thread = threading.Thread(target=self._loop, name="patchbench-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def sample_once(self) -> None:
        mine = set(self.ours())
        row = []
        for i in range(self.nvml.count()):
            try:
                s = self.nvml.sample(i)
            except Exception:  # noqa: BLE001 - a reading that fails is skipped, not fatal
                continue
            s["foreign_pids"] = sorted(set(s.pop("pids")) - mine)
            row.append(s)
        self.samples.append(row)

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> dict:
        """Stop sampling; returns :meth:`summary`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.summary()

    def summary(self) -> dict:
        """``{"samples_count", "gpus": [{"index", "sm_clock_mhz": {min, median, max},
        "mem_clock_mhz": {...}, "temperature_c": {...}, "power_w": {...}, "throttle": {reason:
        samples_count}, "foreign_pids": [...]}], "flags": [str]}``. A flag is raised for a biasing
        throttle reason seen in any sample and for any foreign process."""
        gpus, flags = [], []
        n_gpu = max((len(r) for r in self.samples), default=0)
        for i in range(n_gpu):
            rows = [r[i] for r in self.samples if len(r) > i]

            def stat(k, rows=rows):
                v = [x[k] for x in rows]
                return {"min": min(v), "median": statistics.median(v), "max": max(v)}
            thr: dict[str, int] = {}
            for x in rows:
                for n in x["throttle"]:
                    thr[n] = thr.get(n, 0) + 1
            foreign = sorted({p for x in rows for p in x["foreign_pids"]})
            gpus.append({"index": i, "sm_clock_mhz": stat("sm_clock_mhz"),
                         "mem_clock_mhz": stat("mem_clock_mhz"),
                         "temperature_c": stat("temperature_c"), "power_w": stat("power_w"),
                         "throttle": thr, "foreign_pids": foreign})
            for n, c in sorted(thr.items()):
                if n in BIASING:
                    flags.append(f"GPU {i}: throttled ({n}) in {c} of {len(rows)} samples")
            if foreign:
                flags.append(f"GPU {i}: foreign process(es) {foreign} used the GPU during the cell")
        return {"samples_count": len(self.samples), "gpus": gpus, "flags": flags}
