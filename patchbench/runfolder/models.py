"""The models of a run folder's files (:class:`CellRecord`, :class:`SuiteSummary`,
:class:`RunManifest`), their schema versions and format history. Every model declares every key
it writes; a field named in ``_when_set`` is written only once something set it (absent rather
than ``null``); a :class:`_Snapshot` writes exactly the keys it was given.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from patchbench.config import Config
from patchbench.run.gpu import GpuSummary

# Format history, one line per version (bump together with a step in
# patchbench.runfolder._MIGRATIONS):
#   manifest.json  1: "schema": 1 or no version key.
#                  2: "schema" renamed "schema_version".
#                  3: the keys of 2, each declared and typed (config snapshot, cell entries,
#                     timings, sequential record) and read strictly: a version-3 file with an
#                     undeclared key is unreadable; older files lose such keys on read.
#                  4: "config" holds the typed Config. A "builds" entry (free-form,
#                     Build.to_json()) of a git build may also hold "subject" and "changes"
#                     (no version bump: an entry without them reads as before, the report
#                     then names the commit alone and lists no files).
#                  5: "host" holds "cpu_usable" (the CPUs this process may run on); a
#                     version-4 file reads with it None.
#                  6: "machine" (MachineInfo: the identity the nightly compares nights by);
#                     a version-5 file reads without it (unknown).
#                  7: "machine" holds "driver" (NVML's driver version); a version-6 file reads
#                     with it None.
#   cell.json      1: no version key; the mrope probe's counts under "mrope_probe".
#                  2: "schema_version"; "instrumented" and "instrumentation" replace "mrope_probe".
#                  3: the keys of 2, each declared (runner_pid, instrumentation_args, liveness,
#                     gpu; the server's create_time, host, port, stop_breakdown_s) and read
#                     strictly; older files lose undeclared keys on read.
#                  4: "load_avg_1m" (the host's load average at the start and end of the
#                     cell's suites); a version-3 file reads without it.
#                  5: "gpu" holds "driver" and "devices" (the GPUs the cell used: UUID, name,
#                     clocks, power limit); "server_metrics" (each timed suite's fingerprint
#                     from the server's /metrics) and "server_config" (its /server_info); a
#                     version-4 file reads without them (gpu devices [], the rest None).
#   summary.json   1: no version key.  2: "schema_version" (every key declared, read strictly).
MANIFEST_SCHEMA = 7
CELL_SCHEMA = 5
SUMMARY_SCHEMA = 2

CellStatus = Literal["ok", "failed", "incomplete", "interrupted", "running", "unreadable"]
SuiteStatus = Literal["ok", "incomplete", "failed", "unreadable"]


class _Record(BaseModel):
    """Base of the run-folder models (module docstring)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    _when_set: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _written_when_set(self, handler):
        out = handler(self)
        for name in self._when_set:
            if name not in self.model_fields_set:
                out.pop(name, None)
                out.pop(type(self).model_fields[name].alias or name, None)
        return out


class _Snapshot(_Record):
    """A record that dumps back to exactly the keys it was given."""

    @model_serializer(mode="wrap")
    def _written_when_set(self, handler):
        out = handler(self)
        return {k: v for k, v in out.items() if k in self.model_fields_set}


# -- cell.json -------------------------------------------------------------------------------


class StopBreakdown(_Snapshot):
    """Seconds of a server stop per phase: ``exit`` (until every process is gone), ``port``
    (until it refused), ``gpu`` (until NVML listed none; None without NVML)."""

    exit: float | None = None
    port: float | None = None
    gpu: float | None = None


class ServerRecord(_Record):
    """The server of one cell: lifecycle ``events`` (``[{"t_s": seconds, "event": ...}]``);
    ``create_time`` (epoch s) tells a reused pid apart."""

    _when_set = ("create_time", "host", "port", "stop_breakdown_s")

    pid: int | None = None
    pgid: int | None = None
    events: list[dict[str, Any]] = Field(default_factory=list)
    command: list[str] | str | None = None
    create_time: float | None = None
    host: str | None = None
    port: int | None = None
    stop_breakdown_s: StopBreakdown | None = None


class WatchedProcess(_Record):
    """A process of the server the liveness watch followed (patchbench.run.liveness)."""

    pid: int
    role: str = ""
    name: str = ""


class ServerDeath(WatchedProcess):
    """The first server process seen dead during the cell (patchbench.run.liveness.Death)."""

    returncode: int | None = None
    detected_after_s: float | None = None


class ServerStall(_Record):
    """The server (or the suite's client) stopped making progress during the cell
    (patchbench.run.liveness.Stall): kind heartbeat | replies | stopped (state T) |
    client_stopped | client_silent; seconds without progress and from the watch's start."""

    kind: str
    what: str = ""
    pid: int | None = None
    role: str = ""
    state: str = ""
    silent_s: float | None = None
    detected_after_s: float | None = None


class Liveness(_Record):
    """``cell.json`` ``liveness``: the watched processes, a ``death`` or ``stall``, and the
    client process groups killed because of it."""

    _when_set = ("death", "stall", "killed_clients")

    watched: list[WatchedProcess] = Field(default_factory=list)
    death: ServerDeath | None = None
    stall: ServerStall | None = None
    killed_clients: list[int] = Field(default_factory=list)


class LoadAverage(_Record):
    """The host's 1-minute load average (runnable processes of the whole machine, averaged over
    a minute; ``patchbench.envs.envinfo.load_avg_1m``) when the cell's first suite started and
    when its last suite ended; None: the system gave none."""

    start: float | None = None
    end: float | None = None


class ServerMetrics(_Record):
    """One suite's fingerprint from the server's ``/metrics`` (patchbench.run.server_metrics):
    ``counters`` {sglang's sample name: its increase over the suite}, ``gauges`` {name: [before,
    after]}, ``cache_hit_share`` cached / prompt tokens of the deltas (0-1; None: no prompt
    tokens), ``scrape_s`` the seconds both scrapes took; ``error``: why there is none."""

    cache_hit_share: float | None = None
    counters: dict[str, float] = Field(default_factory=dict)
    gauges: dict[str, list[float | None]] = Field(default_factory=dict)
    scrape_s: float | None = None
    error: str | None = None


class CellRecord(_Record):
    """``RUN/<variant>/rep<k>/cell.json``: one (variant, repeat) cell (its keys: docs/CONTRACTS.md)."""

    _when_set = (
        "runner_pid",
        "instrumentation_args",
        "liveness",
        "gpu",
        "migrated_from",
        "variant_identity",
        "load_avg_1m",
        "server_metrics",
        "server_config",
    )

    schema_version: int = CELL_SCHEMA
    variant: str = ""
    repeat: int = 0
    index: int | None = None
    status: CellStatus = "ok"
    error: str | None = None
    suites: dict[str, str] = Field(default_factory=dict)
    timings_s: dict[str, float | None] = Field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None
    server: ServerRecord = Field(default_factory=ServerRecord)
    instrumented: bool = False
    cell_kind: Literal["timed", "correctness"] = "timed"
    instrumentation: dict[str, dict[str, Any]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    runner_pid: int | None = None
    instrumentation_args: list[str] = Field(default_factory=list)
    liveness: Liveness | None = None
    gpu: GpuSummary | None = None
    migrated_from: int | None = None
    variant_identity: dict[str, str] | None = None
    load_avg_1m: LoadAverage | None = None
    #: {suite: its fingerprint} of the timed cell's server suites
    server_metrics: dict[str, ServerMetrics] = Field(default_factory=dict)
    #: the server's configuration as /server_info states it (run.server_metrics.CONFIG_KEYS)
    server_config: dict[str, Any] | None = None


# -- summary.json ----------------------------------------------------------------------------


class SuiteSummary(_Record):
    """``RUN/<variant>/rep<k>/<suite>/summary.json``: one suite's result in one cell; bounds:
    {metric: "lower" | "upper"} for values that only bound the truth (absent: exact)."""

    _when_set = ("migrated_from",)

    schema_version: int = SUMMARY_SCHEMA
    suite: str = ""
    status: SuiteStatus = "ok"
    metrics: dict[str, float | None] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)
    bounds: dict[str, Literal["lower", "upper"]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    migrated_from: int | None = None


# -- manifest.json ---------------------------------------------------------------------------


class PatchHash(_Record):
    """A patch of a variant as applied: its name and the sha256 of its diff for this release."""

    name: str
    sha256: str | None = None


class VariantPatch(_Record):
    """A patch of a variant in ``variants`` (name or ``diff:<path>``; sha256 None: unknown)."""

    name: str
    kind: Literal["patch", "diff"] = "patch"
    path: str | None = None
    sha256: str | None = None


class ArgsDiff(_Record):
    """Server arguments against the baseline (changed: {flag: [baseline's, variant's]})."""

    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: dict[str, list[str | None]] = Field(default_factory=dict)


class EnvDiff(_Record):
    """Environment against the baseline (changed: {name: [baseline's, variant's]})."""

    added: dict[str, str] = Field(default_factory=dict)
    removed: list[str] = Field(default_factory=list)
    changed: dict[str, list[str | None]] = Field(default_factory=dict)


class VariantDiff(_Record):
    """What a variant changes against the baseline (``Config.variant_diff``); ``sglang``
    (written when the builds differ): [the baseline's build, the variant's]."""

    _when_set = ("sglang",)

    sglang: list[str] = Field(default_factory=list)
    aa: bool = False
    patches: list[VariantPatch] = Field(default_factory=list)
    patches_added: list[str] = Field(default_factory=list)
    patches_removed: list[str] = Field(default_factory=list)
    server_args: ArgsDiff = Field(default_factory=ArgsDiff)
    env: EnvDiff = Field(default_factory=EnvDiff)


class HostInfo(_Record):
    """The machine the run ran on (patchbench.envs.envinfo): ``cpu_count`` logical CPUs,
    ``cpu_usable`` those this process may run on (its affinity; None before schema 5), memory
    in GiB."""

    hostname: str | None = None
    platform: str | None = None
    python: str | None = None
    cpu_count: int | None = None
    cpu_usable: int | None = None
    memory_total_gib: float | None = None
    transformers: str | None = None


class MachineInfo(_Record):
    """The machine a run ran on, as the nightly tells nights apart: ``model`` the GPUs' model
    (a GPU run) or the CPU's model name (a CPU run), ``gpu_uuids`` the NVML UUIDs of the GPUs
    the run could use (``CUDA_VISIBLE_DEVICES``, else every GPU), ``hostname`` (CPU runs only:
    a GPU's UUID names its machine already), ``driver`` (GPU runs: NVML's driver version; not
    in :attr:`key`, so a driver update keeps a machine's nights together)."""

    model: str | None = None
    gpu_uuids: list[str] = Field(default_factory=list)
    hostname: str | None = None
    driver: str | None = None

    @property
    def key(self) -> str:
        """One string naming it: ``MODEL [UUID, ...]`` or ``MODEL on HOSTNAME``."""
        if self.gpu_uuids:
            return f"{self.model or '?'} [{', '.join(self.gpu_uuids)}]"
        return f"{self.model or '?'} on {self.hostname or '?'}"


class GpuDevice(_Record):
    """One NVIDIA GPU as nvidia-smi names it; memory in MiB."""

    name: str | None = None
    memory_total_mib: int | None = None


class HostGpus(_Record):
    """The machine's NVIDIA GPUs and driver (``patchbench.envs.envinfo.gpu_info``)."""

    gpus: list[GpuDevice] = Field(default_factory=list)
    driver: str | None = None


class OverheadBreakdown(_Record):
    """Where the harness overhead went, in seconds (patchbench.run.bench)."""

    python_start: float = 0.0
    setup: float = 0.0
    server_stop: float = 0.0
    flush: float = 0.0
    report: float = 0.0
    other: float = 0.0


class RunTimings(_Snapshot):
    """``timings_s`` of one invocation in seconds, keys as the run gets to them:
    ``harness_overhead_share``: share of wall time outside server start-ups and suites (None:
    no cell ran); the breakdowns sum this invocation's cells."""

    setup: float | None = None
    python_start: float | None = None
    report: float | None = None
    total: float | None = None
    harness_overhead_share: float | None = None
    overhead_breakdown_s: OverheadBreakdown | None = None
    server_stop_breakdown_s: StopBreakdown | None = None


class ManifestCell(_Record):
    """One entry of ``manifest.cells`` (``error``: its first line; ``skipped``: done by an
    earlier invocation)."""

    _when_set = ("error", "skipped")

    variant: str
    repeat: int = 0
    cell_kind: Literal["timed", "correctness"] = "timed"
    instrumented: bool = False
    status: str = "ok"
    dir: str = ""
    suites: dict[str, str] = Field(default_factory=dict)
    timings_s: dict[str, float | None] = Field(default_factory=dict)
    error: str | None = None
    skipped: bool = False


class CopiedFile(_Record):
    """A file the config names, copied into the run folder (``path`` relative to it)."""

    source: str
    path: str


class ResumeRecord(_Record):
    """One ``--resume`` invocation: when it started and its own timings."""

    started_at: str
    timings_s: RunTimings = Field(default_factory=RunTimings)


class SequentialDesign(_Record):
    """The stopping rule of a sequential run: looks (rounds), alpha per report, boundary,
    primaries ("suite.metric"), how alpha is split, the futility threshold, A/A controls."""

    looks: list[int] = Field(default_factory=list)
    alpha: float | None = None
    boundary: str | None = None
    primaries: list[str] = Field(default_factory=list)
    alpha_split: str | None = None
    futility: float | None = None
    controls: list[str] = Field(default_factory=list)


class LookMetric(_Record):
    """One primary of one variant at one look (patchbench.analysis.sequential.MetricDecision)."""

    decision: str
    n: int = 0
    estimate: float | None = None
    change_pct: float | None = None
    p_value: float | None = None
    level: float | None = None
    look: int | None = None
    reason: str = ""


class SequentialLook(_Record):
    """One look (patchbench.analysis.sequential.LookDecision): {"variant/suite.metric": LookMetric}."""

    look_index: int
    n_repeats: int
    stop: bool = False
    reason: str = ""
    metrics: dict[str, LookMetric] = Field(default_factory=dict)


class SequentialRecord(_Record):
    """``manifest.sequential``: the design, each look, ``stopped_at`` (None while going on), why,
    and the latest decision per "variant/suite.metric"."""

    _when_set = ("decisions",)

    design: SequentialDesign = Field(default_factory=SequentialDesign)
    looks: list[SequentialLook] = Field(default_factory=list)
    repeats_run: int | None = None
    stopped_at: int | None = None
    stopped_early: bool = False
    reason: str | None = None
    decisions: dict[str, str] = Field(default_factory=dict)


class RunManifest(_Record):
    """``RUN/manifest.json``: the run as a whole (its keys: docs/CONTRACTS.md; ``machine``:
    :class:`MachineInfo`, None before schema 6); ``port``: the ``--port`` of the last
    invocation, written only when one was given."""

    _when_set = (
        "resumes",
        "sequential",
        "error",
        "report_error",
        "migrated_from",
        "builds",
        "port",
        "machine",
    )

    schema_version: int = MANIFEST_SCHEMA
    run_id: str = ""
    config_path: str | None = None
    config: Config | None = None
    port: int | None = None
    sglang_version: str | None = None
    model: str | None = None
    patches: dict[str, list[PatchHash]] = Field(default_factory=dict)
    overlays: dict[str, dict[str, Any]] = Field(default_factory=dict)
    builds: dict[str, dict[str, Any]] = Field(default_factory=dict)
    git_sha: str | None = None
    host: HostInfo = Field(default_factory=HostInfo)
    gpu: HostGpus | None = None
    machine: MachineInfo | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    cells: list[ManifestCell] = Field(default_factory=list)
    started_at: str | None = None
    ended_at: str | None = None
    interrupted: bool = False
    timings_s: RunTimings = Field(default_factory=RunTimings)
    variant_diffs: dict[str, VariantDiff] = Field(default_factory=dict, alias="variants")
    suite_rounds: dict[str, list[int] | Literal["correctness"]] = Field(default_factory=dict)
    copied_files: list[CopiedFile] = Field(default_factory=list)
    resumes: list[ResumeRecord] = Field(default_factory=list)
    sequential: SequentialRecord | None = None
    error: str | None = None
    report_error: str | None = None
    migrated_from: int | None = None
    #: {"compare" | "nightly": notes on settings of the stored config that were dropped on read}
    config_notes: dict[str, list[str]] = Field(default_factory=dict, exclude=True)

    # -- read-only views of ``config`` for the analysis ---------------------------------------
    @property
    def baseline(self) -> str:
        """The config's baseline variant ("baseline" without a config)."""
        return self.config.baseline if self.config is not None else "baseline"

    @property
    def repeats(self) -> int:
        """``schedule.repeats`` of the config (1 when absent; for a sequential schedule
        ``{min, max, step}`` its ``min``; the rounds that really ran are read from the cells)."""
        r = self.config.schedule.repeats if self.config is not None else 1
        return r if isinstance(r, int) else r.min

    @property
    def suites(self) -> list[str]:
        """Suite names of the config, in config order."""
        return list(self.config.suites) if self.config is not None else []
