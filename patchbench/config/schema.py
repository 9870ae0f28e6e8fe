"""The experiment config's models (pydantic): :class:`Config` and its parts, each value checked
on its own; what needs the file or the repository is checked by :mod:`patchbench.config.load`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from patchbench import errors
from patchbench.config.args import ENV_NAME, check_args, check_env, split_args
from patchbench.config.nightly import NightlySettings
from patchbench.inputs import FOLDER_NAME, REPO_ROOT, is_hub_id, looks_local
from patchbench.redact import redact_env
from patchbench.shims import available_stand_ins


class Strict(BaseModel):
    """Base of the config's models: unknown keys refused; YAML's true is not 1, 1 is not "1"."""

    model_config = ConfigDict(extra="forbid", strict=True)


# --------------------------------------------------------------------------- settings sections
class CompareSettings(BaseModel):
    """The ``compare:`` section (all keys optional).

    confidence: family confidence of the primaries (Holm-adjusted), raw confidence of the
    secondaries. min_repeats: paired repeats a run-level verdict needs. margins: equivalence
    margin per ``metric`` or ``suite.metric`` (percent for run-level metrics, points for
    accuracy). bootstrap_* / seed: suites' within-cell intervals. identity_share_tolerance: read
    by suites' output-identity checks. assumed_cv: run-to-run CV (%) per run-level metric.
    """

    model_config = ConfigDict(extra="forbid")

    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    min_repeats: int = Field(3, ge=2)
    margins: dict[str, float] = Field(default_factory=dict)
    bootstrap_resamples: int = Field(2000, ge=100, le=200_000)
    bootstrap_method: Literal["BCa", "percentile", "basic"] = "BCa"
    seed: int = 0
    within_cell_intervals: bool = True
    identity_share_tolerance: float = Field(0.02, ge=0.0, le=1.0)
    assumed_cv: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "retokenized_change_share" in data:
            raise ValueError(
                "compare.retokenized_change_share was removed (no check read it); delete the key"
            )
        return data

    def margin_for(
        self, suite: str, metric: str, default: float | None, table: str = "margins"
    ) -> float | None:
        """``margins["suite.metric"]``, else ``margins[metric]``, else ``default`` (``table``:
        "assumed_cv" reads that one alike)."""
        values = getattr(self, table)
        for key in (f"{suite}.{metric}", metric):
            if key in values:
                return float(values[key])
        return default


def sections() -> dict[str, type[BaseModel]]:
    """The model of each settings section of a config: ``compare`` and ``nightly``."""
    return {"compare": CompareSettings, "nightly": NightlySettings}


#: server arguments and environment variables, checked by patchbench.config.args
ServerArgs = Annotated[list[str], AfterValidator(lambda v: check_args(v, "server.args"))]
ServerEnv = Annotated[dict[str, str], AfterValidator(lambda v: check_env(v, "server.env"))]
VariantArgs = Annotated[list[str], AfterValidator(lambda v: check_args(v, "server_args"))]
VariantVars = Annotated[dict[str, str], AfterValidator(lambda v: check_env(v, "env"))]


# --------------------------------------------------------------------------- model and server
class ModelSpec(Strict):
    """The served model: ``path`` a local folder (or a hub id), ``tiny`` builds the tiny random
    Qwen2.5-VL at ``path`` when missing, ``tokenizer`` (default: the model's)."""

    path: str
    tiny: bool = False
    tokenizer: str | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip() or "\x00" in v:  # "" would be the current folder (Path(""))
            raise ValueError("the model path is empty or holds a NUL character")
        return v


#: longest config name: it names the run folder after a 16-character time stamp
MAX_CONFIG_NAME = 100


class ServerSpec(Strict):
    """How to launch ``python -m sglang.launch_server`` for every variant (seconds for ``_s``).

    ``cpu_stand_ins``: import-time stand-ins from patchbench/shims/cpu for a machine without an
    NVIDIA GPU; ``stall_timeout_s``: how long the server may leave the heartbeat, a suite's
    replies or a flush unanswered before the cell fails (patchbench/run/liveness.py).
    """

    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1024, le=65535)
    args: ServerArgs = Field(default_factory=list)
    env: ServerEnv = Field(default_factory=dict)
    #: more names whose values are secrets (patchbench.redact: names holding TOKEN, KEY,
    #: SECRET or PASSWORD always are): redacted wherever patchbench writes or prints them
    secret_env: list[str] = Field(default_factory=list)
    cpu_stand_ins: list[str] = Field(default_factory=list)
    ready_timeout_s: float = Field(600.0, gt=0)
    stop_grace_s: float = Field(20.0, gt=0)
    port_close_timeout_s: float = Field(30.0, gt=0)
    flush_retries: int = Field(5, ge=1)
    flush_pause_s: float = Field(1.0, ge=0)
    stall_timeout_s: float = Field(60.0, gt=0)
    #: the most disk each cell's server.log may take, in MiB (patchbench/run/logcap.py); 0: no
    #: cap, else at least 1 so the kept tail holds the 64 KiB a failure's log tail shows
    log_max_mb: int = Field(64, ge=0)
    #: launch with ``--enable-metrics`` and fingerprint each timed suite from ``/metrics``
    #: (patchbench/run/server_metrics.py; docs/serving.md, "The server's own metrics")
    metrics: bool = True
    #: removed key: refused with what replaces it
    mrope_probe: Any = Field(None, exclude=True)

    @field_validator("mrope_probe", mode="plain")
    @classmethod
    def _removed_mrope_probe(cls, v):
        raise ValueError(
            "server.mrope_probe was removed: the mrope instrumentation now runs as "
            "the sync_probe suite's hook in correctness cells; delete the key and "
            "list `sync_probe: {}` under suites"
        )

    @field_validator("cpu_stand_ins")
    @classmethod
    def _stand_ins(cls, v: list[str]) -> list[str]:
        have = available_stand_ins()
        bad = [x for x in v if x not in have]
        if bad:
            raise ValueError(f"unknown stand-in(s) {bad}; available: {have}")
        return v

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if not ENV_NAME.match(x)]
        if bad:
            raise ValueError(
                f"server.secret_env: {bad} are not environment variable names (letters, digits "
                "and '_', not starting with a digit)"
            )
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not v or any(c.isspace() or c in "/\x00" for c in v):
            raise ValueError(
                "server.host is the address the server binds and readiness asks (127.0.0.1, "
                "0.0.0.0, a host name): not empty, no spaces, no scheme or path"
            )
        return v


# --------------------------------------------------------------------------- variants
#: names a run folder uses at its top level: no variant folder may take one (compared
#: case-insensitively: some file systems do not tell case apart)
RUN_FOLDER_NAMES = frozenset(
    {
        "manifest.json",
        "compare.json",
        "report.md",
        "plots",
        "diffs",
        "nightly.json",
        "nightly.md",
        "pr_figure.png",
    }
)
#: longest variant name: it names a folder and is part of plot and diff file names
MAX_VARIANT_NAME = 64
#: the ``sglang:`` value that names the newest release on the package index
LATEST = "latest"


#: longest run id a nightly history records: ``<UTC stamp>-<config name>[-k]``, with
#: ``@<unit id>`` for a matrix unit (it names a folder of the dashboard's site)
MAX_RUN_ID = 256


def folder_name_problem(name: str, limit: int) -> str | None:
    """Why ``name`` cannot name a folder patchbench makes (a variant's, a night's), or None:
    letters, digits, '.', '_', '-', starting with a letter or digit (so never ``.``, ``..``,
    a path or an empty name), at most ``limit`` characters."""
    if not FOLDER_NAME.match(name):
        return "use letters, digits, '.', '_', '-' (starting with a letter or digit)"
    if len(name) > limit:
        return f"{len(name)} characters; at most {limit} (it names a folder and files)"
    return None


def variant_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a variant (its folder in the run folder), or None."""
    problem = folder_name_problem(name, MAX_VARIANT_NAME)
    if problem:
        return problem
    if name.lower() in RUN_FOLDER_NAMES:
        return (
            f"the run folder uses '{name}' itself ({', '.join(sorted(RUN_FOLDER_NAMES))}); "
            "choose another name"
        )
    return None


class DiffPatch(Strict):
    """A patch given as a diff file: ``{diff: FILE}`` (relative to the repo root)."""

    diff: str

    @field_validator("diff")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip() or "\x00" in v:
            raise ValueError("name a diff file, e.g. {diff: patches/my-change.diff}")
        return v


#: a patch entry of a variant: a folder name of patches/, or a diff file
PatchEntry = str | DiffPatch


class GitSource(Strict):
    """An sglang build from a source checkout or bare repository at a commit: ``{git: PATH,
    ref: REF}`` (``ref``: anything ``git rev-parse`` takes, resolved once per run). Only
    committed files of ``python/sglang`` and ``python/pyproject.toml`` are read.
    ``allow_uncompiled``: measure the Python part of a range that changes compiled code
    (patchbench.envs.builds.uncompiled_files), else refused; written only when true."""

    git: str
    ref: str = "HEAD"
    allow_uncompiled: bool = False

    @model_serializer(mode="wrap")
    def _allow_when_set(self, handler):
        out = handler(self)
        if not self.allow_uncompiled:
            out.pop("allow_uncompiled", None)
        return out

    @field_validator("git", "ref")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip() or "\x00" in v or v.startswith("-"):
            raise ValueError("name a checkout and a ref, e.g. {git: ~/sglang, ref: my-branch}")
        return v

    def label(self) -> str:
        return f"git:{self.git}@{self.ref}"


class WheelSource(Strict):
    """An sglang build from a wheel file: ``{wheel: PATH}``."""

    wheel: str

    @field_validator("wheel")
    @classmethod
    def _is_wheel(cls, v: str) -> str:
        if not v.strip().endswith(".whl") or "\x00" in v:
            raise ValueError("name a wheel file, e.g. {wheel: dist/sglang-0.5.23-py3-none-any.whl}")
        return v

    def label(self) -> str:
        return f"wheel:{self.wheel}"


#: what ``sglang:`` may say (for the run or one variant): a release, ``latest``, a wheel, a
#: checkout at a commit; patchbench.envs.builds resolves it to an environment and an overlay
SglangSpec = str | GitSource | WheelSource


def sglang_label(spec: SglangSpec) -> str:
    """An ``sglang:`` value as shown: the release, ``latest``, ``git:PATH@REF``, ``wheel:PATH``."""
    return spec if isinstance(spec, str) else spec.label()


#: how many of the paths a range changes are named (the count says the rest)
CHANGES_SHOWN = 8


#: the name ``patchbench ab`` gives the config it builds in memory: ``ab-<preset or file stem>``
AB_NAME_PREFIX = "ab-"


def run_id_problem(run_id: str) -> str | None:
    """Why ``run_id`` cannot be a night's run id in the nightly history (it names the night's
    folder in the dashboard's site), or None: the variant names' rule
    (:func:`folder_name_problem`) for each ``@``-separated part (a matrix unit's night is
    ``<run id>@<unit id>``), :data:`MAX_RUN_ID` characters in all."""
    if not isinstance(run_id, str) or not run_id:
        return "empty"
    if len(run_id) > MAX_RUN_ID:
        return f"{len(run_id)} characters; at most {MAX_RUN_ID}"
    for part in run_id.split("@"):
        problem = folder_name_problem(part, MAX_RUN_ID)
        if problem:
            return problem + (" in each '@'-separated part" if "@" in run_id else "")
    return None


def commit_name(commit: str, subject: str | None) -> str:
    """A git build as a reader names it: the commit's first 12 hex digits and its subject (the
    message's first line) in quotes, ``8af4974fdfbe "sampling: a larger epsilon"``; the hash
    alone when the subject is None."""
    return commit[:12] + (f' "{subject}"' if subject is not None else "")


def changes_text(count: int, files: list[str], outside: int = 0) -> str:
    """What a range changes, on one line: ``2 files: a.py, b.py``, at most
    :data:`CHANGES_SHOWN` of ``files`` named and ``and N more`` for the rest of ``count``;
    ``outside``: how many lie outside ``python/sglang/`` (not run)."""
    shown = files[:CHANGES_SHOWN]
    text = f"{count} file{'s' if count != 1 else ''}" + (": " + ", ".join(shown) if shown else "")
    if count > len(shown) and shown:
        text += f" and {count - len(shown)} more"
    if outside:
        text += f" ({outside} outside python/sglang/, not run)"
    return text


def uncompiled_text(count: int, files: list[str]) -> str:
    """What a variant's range left out, as its answer says it: ``left out: 3 compiled files
    (sgl-kernel/csrc/a.cu, ...): not built here, this measures the Python part only`` (at most
    :data:`CHANGES_SHOWN` of ``files`` named, ``and N more`` for the rest of ``count``)."""
    shown = files[:CHANGES_SHOWN]
    more = f" and {count - len(shown)} more" if count > len(shown) and shown else ""
    named = f" ({', '.join(shown)}{more})" if shown else ""
    return (
        f"left out: {count} compiled file{'s' if count != 1 else ''}{named}: not built here, "
        "this measures the Python part only"
    )


def uncommitted_text(count: int, files: list[str]) -> str:
    """A checkout's uncommitted edits, as the console and the report's header say them: ``the
    checkout has uncommitted edits (2 files: a.py, b.py); they are not measured: the builds are
    the commits`` (:func:`changes_text` names the files)."""
    return (
        f"the checkout has uncommitted edits ({changes_text(count, files)}); they are not "
        "measured: the builds are the commits"
    )


def patch_label(p: PatchEntry) -> str:
    """A patch entry as shown: its name, or ``diff:<path>``."""
    return p if isinstance(p, str) else f"diff:{p.diff}"


def _check_release(v):
    """A release string (or ``latest``) as written; ValueError for anything else."""
    if isinstance(v, float):  # `sglang: 0.5` reads as a number
        raise ValueError('quote the release, e.g. sglang: "0.5.1.post3"')
    if isinstance(v, str) and v != LATEST:
        try:
            Version(v)
        except InvalidVersion:
            raise ValueError(
                f"'{v}' is not an sglang release; write a release (\"0.5.23\"), latest, "
                "{wheel: FILE} or {git: CHECKOUT, ref: REF}"
            ) from None
    return v


def _dump_sglang(v: SglangSpec | None):
    return v if v is None or isinstance(v, str) else v.model_dump()


class VariantSpec(Strict):
    """What a variant changes against the plain server: patches applied in order, arguments
    appended to ``server.args``, variables added to ``server.env``, its own ``sglang:`` build.
    A bare list is the short form of ``{patches: [...]}``."""

    patches: list[PatchEntry] = Field(default_factory=list)
    server_args: VariantArgs = Field(default_factory=list)
    env: VariantVars = Field(default_factory=dict)
    sglang: SglangSpec | None = None

    @field_validator("sglang", mode="before")
    @classmethod
    def _release(cls, v):
        return _check_release(v)

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, v):
        if v is None:
            return {}
        return {"patches": v} if isinstance(v, list) else v

    @field_validator("patches")
    @classmethod
    def _patches(cls, v: list[PatchEntry]) -> list[PatchEntry]:
        seen: set[str] = set()
        for i, p in enumerate(v):
            if isinstance(p, str) and not FOLDER_NAME.match(p):
                raise ValueError(
                    f"patches[{i}]: '{p}' is not a patch name (a folder in patches/: "
                    "letters, digits, '.', '_', '-'); a diff file is written "
                    "{diff: path/to/change.diff}"
                )
            label = patch_label(p)
            if label in seen:
                raise ValueError(f"patches[{i}]: '{label}' is listed twice; a patch applies once")
            seen.add(label)
        return v

    def short(self) -> list | dict:
        """JSON form: the list of patches when only patches change, else the mapping (with
        ``sglang`` only when the variant names its own build)."""
        pats = [p if isinstance(p, str) else p.model_dump() for p in self.patches]
        if not self.server_args and not self.env and self.sglang is None:
            return pats
        out: dict = {"patches": pats, "server_args": list(self.server_args), "env": dict(self.env)}
        if self.sglang is not None:
            out["sglang"] = _dump_sglang(self.sglang)
        return out


# --------------------------------------------------------------------------- schedule
class SequentialRepeats(Strict):
    """``schedule.repeats: {min, max, step, boundary, futility, decide_on}``: group-sequential
    repeats (docs/design.md step 5). ``futility`` 0 turns that stop off; ``decide_on``: the
    deciding primaries (``metric`` or ``suite.metric``; checked by patchbench.config.load), empty:
    every run-level primary measured in every round."""

    min: int = Field(le=100)
    max: int = Field(le=100)
    step: int = Field(2, le=100)
    boundary: Literal["pocock", "obrien-fleming"] = "pocock"
    futility: float = Field(0.2, ge=0.0, lt=1.0)
    decide_on: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _decide_on_when_set(self, handler):
        out = handler(self)
        if not self.decide_on:  # older manifests and goldens stay byte for byte
            out.pop("decide_on", None)
        return out

    @model_validator(mode="after")
    def _looks(self) -> SequentialRepeats:
        _ = self.looks  # raises ValueError naming the key when min, max, step do not fit
        return self

    @property
    def looks(self) -> tuple[int, ...]:
        """The repeat counts at which the run looks: ``min, min+step, ..., max``."""
        # imported here: scipy.stats takes seconds, only a sequential schedule pays it
        from patchbench.analysis.sequential import looks_from_schedule

        return looks_from_schedule(self.min, self.max, self.step)


class ScheduleSpec(Strict):
    """Rounds of all variants (interleaved: ABBA, BAAB, ...; sequential: the same order every
    round; randomized: each round's order drawn from ``seed``, balanced over blocks of rounds,
    :func:`patchbench.run.plan.randomized_rounds`). ``repeats``: a count, a
    :class:`SequentialRepeats` mapping, or ``auto`` (a nightly config: ``patchbench nightly``
    runs what its gates need; ``repeats`` then holds the floor, ``nightly.min_repeats``).
    ``unbalanced_reason``: why ``order: sequential`` is wanted (a config with timed suites needs
    one for that order). ``seed``: a randomized order's (absent: derived from the config's name
    and variants, :meth:`Config._seed`; written only when set)."""

    repeats: int | SequentialRepeats = 1
    order: Literal["interleaved", "sequential", "randomized"] = "interleaved"
    unbalanced_reason: str | None = None
    seed: int | None = Field(None, ge=0)
    _auto: bool = PrivateAttr(False)

    @model_serializer(mode="wrap")
    def _seed_when_set(self, handler):
        out = handler(self)
        if self.seed is None:
            out.pop("seed", None)
        return out

    def order_text(self) -> str:
        """``"interleaved"``, ``"sequential"`` or ``"randomized (seed N)"``."""
        return self.order + (f" (seed {self.seed})" if self.order == "randomized" else "")

    @model_validator(mode="wrap")
    @classmethod
    def _auto_repeats(cls, data, handler):
        auto = isinstance(data, dict) and data.get("repeats") == "auto"
        m = handler({**data, "repeats": 1} if auto else data)
        if auto:
            m._auto = True
        return m

    @property
    def auto(self) -> bool:
        """``repeats: auto`` (docs/nightly.md)."""
        return self._auto

    @field_validator("repeats", mode="plain")
    @classmethod
    def _repeats(cls, v):
        if isinstance(v, SequentialRepeats):
            return v
        if isinstance(v, dict):
            try:
                return SequentialRepeats.model_validate(v)
            except ValidationError as e:
                err = e.errors()[0]
                key = ".".join(str(x) for x in err["loc"])
                msg = err["msg"].removeprefix("Value error, ")
                raise ValueError(
                    f"{key + ': ' if key else ''}{msg} (a sequential schedule is "
                    "{min: 4, max: 12, step: 2})"
                ) from None
        if isinstance(v, bool):
            raise PydanticCustomError("int_type", "Input should be a valid integer")
        if not isinstance(v, int):
            raise PydanticCustomError(
                "int_type",
                "Input should be a valid integer (a fixed number of repeats), a mapping "
                "{min: 4, max: 12, step: 2} (sequential repeats) or auto (a nightly config: "
                "the repeats its gates need)",
            )
        if not 1 <= v <= 100:
            raise ValueError(f"repeats must be between 1 and 100, got {v}")
        return v

    @field_serializer("repeats")
    def _dump_repeats(self, v):
        return v.model_dump(mode="json") if isinstance(v, SequentialRepeats) else v

    @model_validator(mode="after")
    def _order(self) -> ScheduleSpec:
        if self.sequential is not None and self.order == "sequential":
            raise ValueError(
                "schedule.order: sequential repeats ({min, max, step}) look after whole "
                "rounds of every variant; use order: interleaved or randomized (or a fixed "
                "number of repeats)"
            )
        return self

    @property
    def sequential(self) -> SequentialRepeats | None:
        """The sequential design, or None for a fixed number of repeats."""
        return self.repeats if isinstance(self.repeats, SequentialRepeats) else None

    @property
    def max_repeats(self) -> int:
        """The most rounds the run may take (the fixed count, or ``max``)."""
        return self.repeats.max if self.sequential is not None else int(self.repeats)

    def describe(self) -> str:
        """``"3 repeat(s)"``, the sequential looks, or what ``auto`` means."""
        s = self.sequential
        if self.auto:
            return (
                f"auto: patchbench nightly runs what its gates need at the learned noise "
                f"({self.repeats} repeat(s) outside the nightly)"
            )
        if s is None:
            return f"{self.repeats} repeat(s)"
        looks = ", ".join(str(n) for n in s.looks)
        return f"sequential {s.min}..{s.max} repeats, looks after {looks} ({s.boundary} boundary)"


# --------------------------------------------------------------------------- the config
class Config(Strict):
    """A validated experiment config (configs/demo-cpu.yaml documents every key). ``source``: the
    file it was loaded from (None: built in memory); ``suite_params`` / ``suite_rounds``: {suite:
    its validated ``Params`` / ``rounds``}, filled by :func:`patchbench.config.load.config_from_mapping`.
    """

    name: str
    sglang: SglangSpec
    model: ModelSpec
    server: ServerSpec = Field(default_factory=ServerSpec)
    variants: dict[str, VariantSpec]
    baseline: str | None = None
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    suites: dict[str, dict[str, Any]] = Field(default_factory=dict)
    compare: Any = Field(None, validate_default=True)
    nightly: Any = Field(None, validate_default=True)
    description: str = ""

    source: Path | None = Field(None, exclude=True)
    suite_params: dict[str, Any] = Field(default_factory=dict, exclude=True)
    suite_rounds: dict[str, Any] = Field(default_factory=dict, exclude=True)
    #: {variant: its resolved patchbench.envs.builds.Build}, filled when the run resolves its builds
    builds: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @field_validator("sglang", mode="before")
    @classmethod
    def _release(cls, v):
        return _check_release(v)

    @field_serializer("sglang")
    def _dump_sglang(self, v):
        return _dump_sglang(v)

    @field_validator("compare", "nightly", mode="plain")
    @classmethod
    def _section(cls, v, info):
        model = sections()[info.field_name]
        if isinstance(v, model):
            return v
        if v is not None and not isinstance(v, dict):
            raise ValueError(f"must be a mapping (keys: {', '.join(model.model_fields)})")
        return model.model_validate(v or {})

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not FOLDER_NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names the run folder)")
        if len(v) > MAX_CONFIG_NAME:
            raise ValueError(
                f"{len(v)} characters; at most {MAX_CONFIG_NAME} (it names the run folder, "
                "after a time stamp)"
            )
        return v

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: dict[str, VariantSpec]) -> dict[str, VariantSpec]:
        if not v:
            raise ValueError("at least one variant is needed, e.g. {baseline: []}")
        seen: dict[str, str] = {}
        for name in v:
            why = variant_name_problem(name)
            if why:
                raise ValueError(f"variant name '{name[:80]}': {why}")
            other = seen.setdefault(name.lower(), name)
            if other != name:
                raise ValueError(
                    f"variant names '{other}' and '{name}' differ only in case: one folder on "
                    "file systems that do not tell case apart"
                )
        return v

    @field_serializer("variants")
    def _dump_variants(self, v: dict[str, VariantSpec]) -> dict:
        return {k: spec.short() for k, spec in v.items()}

    @model_validator(mode="after")
    def _auto_repeats(self) -> Config:
        if self.schedule.auto:
            if self.nightly.run_cv_pct is None:
                raise ValueError(
                    "schedule.repeats: auto needs nightly.run_cv_pct (the prior run-to-run CV in "
                    "%, used to compute the repeats until the history has learned the noise)"
                )
            self.schedule.repeats = self.nightly.min_repeats
        return self

    @model_validator(mode="after")
    def _seed(self) -> Config:
        """A randomized order without ``schedule.seed`` gets one from the config's name and
        variants (the same config plans the same order; the manifest's config keeps it)."""
        if self.schedule.order == "randomized" and self.schedule.seed is None:
            text = "\0".join([self.name, *self.variants])
            self.schedule.seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
        return self

    @model_validator(mode="after")
    def _baseline(self) -> Config:
        if self.baseline is None:
            self.baseline = next(iter(self.variants))
        elif self.baseline not in self.variants:
            raise ValueError(
                f"baseline: '{self.baseline}' is not a variant; variants: "
                f"{', '.join(self.variants)}"
            )
        base_flags = {f: i for i, f, _ in split_args(self.server.args) if f}
        for name, spec in self.variants.items():
            for i, flag, _ in split_args(spec.server_args):
                if flag and flag in base_flags:
                    raise ValueError(
                        f"variants.{name}.server_args[{i}]: {flag} is also in server.args "
                        f"[{base_flags[flag]}]; a variant's arguments are appended, not overridden: "
                        f"move {flag} out of server.args into the variants that need it"
                    )
            for k in spec.env:
                if k in self.server.env:
                    raise ValueError(
                        f"variants.{name}.env.{k}: also set in server.env; set it "
                        "in one place (per variant when variants differ)"
                    )
        return self

    def rounds_of(self, suite: str, repeats: int | None = None) -> list[int]:
        """The 0-based timed rounds ``suite`` runs in, out of ``repeats`` rounds (default: the
        most the schedule may take)."""
        n = self.schedule.max_repeats if repeats is None else repeats
        return resolve_rounds(self.suite_rounds.get(suite, "all"), n)

    # ------------------------------------------------------------------ builds
    def sglang_of(self, variant: str) -> SglangSpec:
        """The ``sglang:`` of ``variant``: its own, else the config's."""
        own = self.variants[variant].sglang
        return self.sglang if own is None else own

    def release_of(self, variant: str) -> str | None:
        """The sglang release ``variant``'s server runs in: its resolved build's
        (:attr:`builds`), else the release its ``sglang:`` names; None for ``latest``, a wheel or
        a checkout not resolved yet."""
        b = self.builds.get(variant)
        if b is not None:
            return b.release
        spec = self.sglang_of(variant)
        return spec if isinstance(spec, str) and spec != LATEST else None

    def has_own_builds(self) -> bool:
        """True when a variant names its own ``sglang:`` or the config's is not a release."""
        return any(s.sglang is not None for s in self.variants.values()) or not (
            isinstance(self.sglang, str) and self.sglang != LATEST
        )

    # ------------------------------------------------------------------ variants
    def patches_of(self, variant: str) -> list[PatchEntry]:
        """The variant's patch entries in order."""
        return list(self.variants[variant].patches)

    def server_args_of(self, variant: str) -> list[str]:
        """``--enable-metrics`` (with ``server.metrics``, unless named), ``server.args``, then
        the variant's ``server_args``."""
        args = list(self.server.args) + list(self.variants[variant].server_args)
        return ["--enable-metrics"] * (
            self.server.metrics and "--enable-metrics" not in args
        ) + args

    def server_env_of(self, variant: str) -> dict[str, str]:
        """``server.env`` plus the variant's ``env``."""
        return {**self.server.env, **self.variants[variant].env}

    def shown_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` as it may be written or printed: secret values redacted
        (:func:`patchbench.redact.redact_env` with ``server.secret_env``)."""
        return redact_env(env, self.server.secret_env)

    def redacted(self) -> Config:
        """A copy of this config whose ``server.env`` and variants' ``env`` have their secret
        values redacted (:meth:`shown_env`): what a run folder keeps. Its builds are kept; two
        configs with the same values give the same copy (a resume compares them)."""
        server = self.server.model_copy(update={"env": self.shown_env(self.server.env)})
        variants = {
            name: spec.model_copy(update={"env": self.shown_env(spec.env)})
            for name, spec in self.variants.items()
        }
        return self.model_copy(update={"server": server, "variants": variants})

    def is_aa(self, variant: str) -> bool:
        """True when ``variant`` is not the baseline but has its patches (in order), server
        arguments, environment and build: an A/A copy that measures noise."""
        if variant == self.baseline:
            return False
        a, b = self.variants[variant], self.variants[self.baseline]
        return (
            [patch_label(p) for p in a.patches] == [patch_label(p) for p in b.patches]
            and a.server_args == b.server_args
            and a.env == b.env
            and sglang_label(self.sglang_of(variant)) == sglang_label(self.sglang_of(self.baseline))
        )

    def aa_variants(self) -> list[str]:
        """The A/A variants, in config order."""
        return [v for v in self.variants if self.is_aa(v)]

    def variant_diff(self, variant: str) -> dict:
        """What ``variant`` changes against the baseline (the manifest's ``variants``,
        patchbench.runfolder.models.VariantDiff; ``sha256`` of each patch None here)::

            {"sglang": [baseline's build, variant's]   # only when they differ
             "aa": bool, "patches": [{"name", "kind": "patch"|"diff", "path", "sha256"}],
             "patches_added": [labels], "patches_removed": [labels],
             "server_args": {"added": [...], "removed": [...], "changed": {flag: [b, v]}},
             "env": {"added": {name: value}, "removed": [names], "changed": {name: [b, v]}}}
        """
        spec, base = self.variants[variant], self.variants[self.baseline]
        pats = [
            {"name": p, "kind": "patch", "path": None, "sha256": None}
            if isinstance(p, str)
            else {
                "name": patch_label(p),
                "kind": "diff",
                "path": str(self.resolve_path(p.diff)),
                "sha256": None,
            }
            for p in spec.patches
        ]
        labels = [patch_label(p) for p in spec.patches]
        blabels = [patch_label(p) for p in base.patches]

        def flags(args: list[str]) -> dict[str, str | None]:
            return {f or v: (v if f else None) for _, f, v in split_args(args)}

        def show(f: str, v: str | None) -> str:
            return f if v is None else f"{f}={v}"

        fa, fb = flags(spec.server_args), flags(base.server_args)
        mine, theirs = (sglang_label(self.sglang_of(v)) for v in (variant, self.baseline))
        return {
            **({"sglang": [theirs, mine]} if mine != theirs else {}),
            "aa": self.is_aa(variant),
            "patches": pats,
            "patches_added": [x for x in labels if x not in blabels],
            "patches_removed": [x for x in blabels if x not in labels],
            "server_args": {
                "added": [show(f, v) for f, v in fa.items() if f not in fb],
                "removed": [show(f, v) for f, v in fb.items() if f not in fa],
                "changed": {f: [fb[f], v] for f, v in fa.items() if f in fb and fb[f] != v},
            },
            "env": {
                "added": {k: v for k, v in spec.env.items() if k not in base.env},
                "removed": [k for k in base.env if k not in spec.env],
                "changed": {
                    k: [base.env[k], v]
                    for k, v in spec.env.items()
                    if k in base.env and base.env[k] != v
                },
            },
        }

    # ------------------------------------------------------------------ paths and the model
    def resolve_path(self, p: str) -> Path:
        """A config path: ``~`` and ``$VARS`` expanded; relative paths against the repo root."""
        q = Path(os.path.expandvars(os.path.expanduser(p)))
        return q if q.is_absolute() else REPO_ROOT / q

    @property
    def model_dir(self) -> Path:
        return self.resolve_path(self.model.path)

    def _is_hub(self, p: str) -> bool:
        return (
            not self.model.tiny
            and not looks_local(p)
            and is_hub_id(p)
            and not self.resolve_path(p).exists()
        )

    @property
    def model_ref(self) -> str:
        """What ``--model-path`` gets: a local folder (absolute) or a hub id."""
        p = self.model.path
        return p if self._is_hub(p) else str(self.resolve_path(p))

    @property
    def tokenizer_ref(self) -> str:
        """The tokenizer's folder or hub id (defaults to the model's)."""
        p = self.model.tokenizer or self.model.path
        return p if self._is_hub(p) else str(self.resolve_path(p))

    def require_model(self) -> None:
        """Before any launch: a local model (and tokenizer) folder exists; a hub id and a
        ``tiny`` model (built when missing) pass. Raises
        :class:`patchbench.errors.EnvironmentNotReady` (exit 3) naming the folder."""
        if self.model.tiny:
            return
        for key, p in (("model.path", self.model.path), ("model.tokenizer", self.model.tokenizer)):
            if p is None or self._is_hub(p):
                continue
            d = self.resolve_path(p)
            if not d.exists():
                raise errors.EnvironmentNotReady(
                    f"{self.source or 'config'}: {key} {d} does not exist: a local model folder "
                    "is missing (give an existing folder, a hub id such as "
                    "Qwen/Qwen2.5-VL-3B-Instruct, or tiny: true)"
                )


#: the core key of a suite's section that is not one of the suite's own parameters
ROUNDS_KEY = "rounds"


def parse_rounds(
    value: Any, max_repeats: int, where: str, *, floor: int | None = None
) -> str | list[int]:
    """Check a ``suites.<name>.rounds`` value for a run of at most ``max_repeats`` rounds
    (``floor``: ``schedule.repeats: auto``'s ``nightly.min_repeats``, the rounds a night may
    have). Returns "all", "first" or the sorted 0-based round indices; raises ValueError naming
    ``where`` for anything else, an empty list, a repeated index or a round the run never reaches.
    """
    if value in ("all", "first"):
        return value
    if not isinstance(value, list) or any(
        isinstance(x, bool) or not isinstance(x, int) for x in value
    ):
        raise ValueError(
            f"{where}: {value!r} is not a round list; use all, first or a list of "
            f"round indices counted from 0 (e.g. [0, 2])"
        )
    if not value:
        raise ValueError(
            f"{where}: [] puts the suite in no round; use all, first or a "
            f"list of round indices from 0 to {max_repeats - 1}"
        )
    if len(set(value)) != len(value):
        raise ValueError(f"{where}: {value} lists a round twice")
    bad = [x for x in value if not 0 <= x < max_repeats]
    if bad and floor is not None:
        raise ValueError(
            f"{where}: round(s) {bad} with schedule.repeats: auto: a night may run only "
            f"nightly.min_repeats = {floor} round(s), indices 0 to {floor - 1}; list rounds "
            f"below {floor}, or use first or all"
        )
    if bad:
        raise ValueError(
            f"{where}: round(s) {bad} do not exist: this run has at most "
            f"{max_repeats} round(s), indices 0 to {max_repeats - 1}; a suite "
            "must run in at least one round that exists"
        )
    return sorted(value)


def resolve_rounds(value: Any, repeats: int) -> list[int]:
    """The 0-based rounds (``< repeats``) of a ``rounds`` value from :func:`parse_rounds` (None:
    "all")."""
    if value in (None, "all"):
        return list(range(repeats))
    if value == "first":
        return [0] if repeats > 0 else []
    return [int(x) for x in value if 0 <= int(x) < repeats]
