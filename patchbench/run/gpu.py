"""NVML where a GPU exists (:func:`open_nvml` None without one): freed memory, a cell's GPU state
(:class:`GpuSampler`), the settings that bias timings (:func:`doctor_rows`)."""

from __future__ import annotations

import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: throttle reasons that mean the GPU ran slower than asked (NVML clocks-event reason bits)
THROTTLE_BITS = {
    0x0000000000000002: "applications_clocks_setting",
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}
#: reasons that bias a timing (the application-clock setting holds for both arms)
BIASING = set(THROTTLE_BITS.values()) - {"applications_clocks_setting"}


def open_nvml(module: Any = None) -> Nvml | None:
    """An :class:`Nvml` over ``module`` (default pynvml); None without a GPU."""
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

    def wait_released(
        self, pids: list[int], timeout_s: float = 30.0, poll_s: float = 0.1
    ) -> list[int]:
        """Wait until no GPU lists any of ``pids``; returns those still listed at the timeout."""
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
        # NVML renamed "clocks throttle reasons" to "clocks event reasons" (same bits)
        query = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = int(query(h))
        return {
            "sm_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "mem_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            "temperature_c": int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "power_w": round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1),
            "throttle": [n for b, n in THROTTLE_BITS.items() if reasons & b],
            "pids": self.pids(i),
        }

    def _ask(self, fn: str, *args) -> Any:
        """``nv.<fn>(*args)``, or None when the driver does not support it (or it is missing)."""
        f = getattr(self.nv, fn, None)
        if f is None:
            return None
        try:
            return f(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: not known here
            return None

    def driver(self) -> str | None:
        """The driver's version ("550.54.15"), None when not reported."""
        v = self._ask("nvmlSystemGetDriverVersion")
        return v.decode(errors="replace") if isinstance(v, bytes) else v

    def devices(self, visible: str | None = None) -> list[tuple[int, str, str]]:
        """(NVML index, model name, NVML UUID) of the GPUs a process sees: ``visible`` is
        ``CUDA_VISIBLE_DEVICES`` (indices in NVML's order, which is CUDA's on a machine of one GPU
        model; or UUIDs or their prefixes; None or "": every GPU); a GPU whose UUID is not
        reported, or an index NVML does not know, is left out."""
        found = []
        for i in range(self.count()):
            got = [self._ask(f, self._h(i)) for f in ("nvmlDeviceGetName", "nvmlDeviceGetUUID")]
            name, uuid = (x.decode(errors="replace") if isinstance(x, bytes) else x for x in got)
            if uuid:
                found.append((str(i), str(name or "?"), str(uuid)))
        if not visible:
            return [(int(i), n, u) for i, n, u in found]
        want = [w.strip() for w in visible.split(",") if w.strip()]
        return [
            (int(i), n, u)
            for w in want
            for i, n, u in found
            if w == i or (not w.isdigit() and u.startswith(w))
        ]

    def settings(self, i: int) -> dict:
        """The settings of GPU ``i`` that change a timing (clocks ``{"sm", "mem"}`` MHz, power
        limit W; None where unknown)."""
        nv, h = self.nv, self._h(i)
        name = self._ask("nvmlDeviceGetName", h)
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        pm = self._ask("nvmlDeviceGetPersistenceMode", h)
        enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)

        def clocks(fn: str) -> dict:
            return {
                k: self._ask(fn, h, c)
                for k, c in (("sm", nv.NVML_CLOCK_SM), ("mem", nv.NVML_CLOCK_MEM))
            }

        limit = self._ask("nvmlDeviceGetEnforcedPowerLimit", h)
        return {
            "index": i,
            "name": name,
            "persistence_mode": None if pm is None else int(pm) == int(enabled),
            "applications_clocks_mhz": clocks("nvmlDeviceGetApplicationsClock"),
            "default_applications_clocks_mhz": clocks("nvmlDeviceGetDefaultApplicationsClock"),
            "max_clocks_mhz": clocks("nvmlDeviceGetMaxClockInfo"),
            "power_limit_w": None if limit is None else round(limit / 1000.0, 1),
        }

    def identity(self, i: int) -> GpuIdentity:
        """GPU ``i`` as a cell records it (:class:`GpuIdentity`)."""
        uuid = self._ask("nvmlDeviceGetUUID", self._h(i))
        s = self.settings(i)
        return GpuIdentity(
            uuid=uuid.decode(errors="replace") if isinstance(uuid, bytes) else uuid,
            **{k: s[k] for k in GpuIdentity.model_fields if k in s},
        )


def _mhz(c: dict) -> str:
    return (
        f"SM {c.get('sm') if c.get('sm') is not None else '?'} MHz, "
        f"memory {c.get('mem') if c.get('mem') is not None else '?'} MHz"
    )


def doctor_rows(nvml: Nvml | None) -> list[tuple[str, str]]:
    """(label, value) lines for ``patchbench doctor``: per GPU its persistence mode and
    application clocks (against default and max), with what to do when they bias a timing."""
    if nvml is None:
        return [("GPU settings", "no NVIDIA GPU (NVML not available)")]
    rows = []
    for i in range(nvml.count()):
        s = nvml.settings(i)
        pm = s["persistence_mode"]
        rows.append(
            (
                f"GPU {i} persistence",
                "unknown (not reported)"
                if pm is None
                else "on"
                if pm
                else "off (the driver may unload between runs and the first "
                "launch pays for it: `sudo nvidia-smi -pm 1`)",
            )
        )
        app, dflt = s["applications_clocks_mhz"], s["default_applications_clocks_mhz"]
        text = _mhz(app)
        if None not in app.values() and None not in dflt.values() and app != dflt:
            text += (
                f" (NOT the default {_mhz(dflt)}: both arms run at these clocks; reset with "
                "`sudo nvidia-smi -rac`)"
            )
        elif None not in app.values() and app == dflt:
            text += " (default)"
        mx = s["max_clocks_mhz"]
        if None not in mx.values():
            text += f"; max {_mhz(mx)}"
        if s["power_limit_w"] is not None:
            text += f"; power limit {s['power_limit_w']} W"
        rows.append((f"GPU {i} app clocks", text))
    return rows


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Spread(_Strict):
    """Minimum, median and maximum of one reading over a cell's samples (the reading's unit)."""

    min: int | float
    median: int | float
    max: int | float


class GpuStats(_Strict):
    """One GPU over a cell (MHz, C, W); ``throttle``: {reason: samples}; ``unattributed_pids``:
    processes not told apart from the cell's (NVML listed none of the cell's)."""

    index: int
    sm_clock_mhz: Spread
    mem_clock_mhz: Spread
    temperature_c: Spread
    power_w: Spread
    throttle: dict[str, int] = Field(default_factory=dict)
    foreign_pids: list[int] = Field(default_factory=list)
    unattributed_pids: list[int] = Field(default_factory=list)


class GpuIdentity(_Strict):
    """One GPU a cell used: NVML ``index`` and ``uuid``, model ``name``, application and max
    clocks ``{"sm", "mem"}`` MHz, enforced power limit W (None: not reported)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    applications_clocks_mhz: dict[str, int | None] = Field(default_factory=dict)
    max_clocks_mhz: dict[str, int | None] = Field(default_factory=dict)
    power_limit_w: float | None = None

    def settings(self) -> str:
        """The settings that change a timing, as text ("700.0 W, SM 1980 MHz, memory 3201 MHz";
        "?" where not reported)."""
        w = "? W" if self.power_limit_w is None else f"{self.power_limit_w:g} W"
        return f"{w}, {_mhz(self.applications_clocks_mhz)}"


class GpuSummary(_Strict):
    """``cell.json`` ``gpu``; ``flags``: a line per biasing throttle reason or foreign process;
    ``driver`` and ``devices``: the driver and the GPUs the cell used (:meth:`GpuSampler.summary`;
    empty in a cell.json from before they were recorded)."""

    samples_count: int = 0
    gpus: list[GpuStats] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    driver: str | None = None
    devices: list[GpuIdentity] = Field(default_factory=list)


@dataclass
class GpuSampler:
    """Samples every GPU every ``interval_s`` s; ``ours()``: the cell's pids; ``visible``: the
    server's ``CUDA_VISIBLE_DEVICES``."""

    nvml: Nvml
    ours: Any = lambda: set()
    interval_s: float = 1.0
    visible: str | None = None
    samples: list[list[dict]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        self._thread = threading.Thread(
            target=self._loop, name="patchbench-gpu-sampler", daemon=True
        )
        self._thread.start()
        return self

    def sample_once(self) -> None:
        """Take one reading of every GPU (a GPU whose reading fails is skipped)."""
        mine = set(self.ours())
        row = []
        for i in range(self.nvml.count()):
            try:
                s = self.nvml.sample(i)
            except Exception:  # noqa: BLE001 - a reading that fails is skipped, not fatal
                continue
            pids = set(s.pop("pids"))
            s["foreign_pids"] = sorted(pids - mine)
            s["ours_seen"] = bool(pids & mine)
            row.append(s)
        self.samples.append(row)

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> GpuSummary:
        """Stop sampling; returns :meth:`summary`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.summary()

    def summary(self) -> GpuSummary:
        """The samples so far; when NVML never listed one of ours (another pid namespace) the
        other processes are ``unattributed_pids`` with a note, not a flag. ``devices``: the GPUs
        NVML listed one of ours on, else those ``visible`` names (:meth:`Nvml.devices`)."""
        gpus, flags, notes = [], [], []
        any_ours = any(x.get("ours_seen", True) for r in self.samples for x in r)
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
            unattributed: list[int] = []
            if foreign and not any_ours:
                foreign, unattributed = [], foreign
                notes.append(
                    f"GPU {i}: processes {unattributed} could not be matched to this "
                    "cell's (NVML listed none of our pids: another pid namespace?)"
                )
            gpus.append(
                {
                    "index": i,
                    "sm_clock_mhz": stat("sm_clock_mhz"),
                    "mem_clock_mhz": stat("mem_clock_mhz"),
                    "temperature_c": stat("temperature_c"),
                    "power_w": stat("power_w"),
                    "throttle": thr,
                    "foreign_pids": foreign,
                    "unattributed_pids": unattributed,
                }
            )
            for n, c in sorted(thr.items()):
                if n in BIASING:
                    flags.append(f"GPU {i}: throttled ({n}) in {c} of {len(rows)} samples")
            if foreign:
                flags.append(f"GPU {i}: foreign process(es) {foreign} used the GPU during the cell")
        used = sorted({i for r in self.samples for i, x in enumerate(r) if x.get("ours_seen")})
        used = used or [i for i, _n, _u in self.nvml.devices(self.visible)]
        return GpuSummary(
            samples_count=len(self.samples),
            gpus=gpus,
            flags=flags,
            notes=notes,
            driver=self.nvml.driver(),
            devices=[self.nvml.identity(i) for i in used],
        )
