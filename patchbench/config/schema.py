"""The experiment config's models (pydantic): :class:`Config`, :class:`ModelSpec` and
:class:`ServerSpec`; a variant's models are in :mod:`patchbench.config.variant`, the schedule's in
:mod:`patchbench.config.schedule`.

See :mod:`patchbench.config` for the YAML shape. The models check each value on its own (types,
names, harness-owned server arguments, a variant's flags against ``server.args``); what needs the
file or the repository (suite parameters, patches on disk, YAML lines in messages) is checked by
:func:`patchbench.config.load.load_config`. A model error is a ValueError (pydantic's
ValidationError), which the loader turns into :class:`patchbench.errors.ConfigError`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

import patchbench.config.schedule as _sched
from patchbench import errors
from patchbench.analysis.comparison import CompareSettings
from patchbench.config.args import check_args, check_env, split_args
from patchbench.config.schedule import ScheduleSpec
from patchbench.config.variant import (
    LATEST,
    DiffPatch,
    PatchEntry,
    SglangSpec,
    VariantSpec,
    check_release,
    patch_label,
    sglang_label,
    variant_name_problem,
)
from patchbench.inputs import FOLDER_NAME, REPO_ROOT, is_hub_id, looks_local, sha256_file
from patchbench.nightly.gates import NightlySettings
from patchbench.patches import apply, author
from patchbench.shims import available_stand_ins

#: the model of each settings section of a config
SECTIONS: dict[str, type[BaseModel]] = {"compare": CompareSettings, "nightly": NightlySettings}


# --------------------------------------------------------------------------- models
class _Strict(BaseModel):
    # strict: YAML's true is not 1, 1 is not "1" (quote environment values)
    model_config = ConfigDict(extra="forbid", strict=True)


class ModelSpec(_Strict):
    """The served model. ``path`` is a local folder (or a hub id where a hub is reachable)."""

    path: str
    tiny: bool = Field(False, description="build the tiny random Qwen2.5-VL at `path` if missing")
    tokenizer: str | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip() or "\x00" in v:  # "" would be the current folder (Path(""))
            raise ValueError("the model path is empty or holds a NUL character")
        return v


#: longest config name: it names the run folder after a 16-character time stamp
MAX_CONFIG_NAME = 100


class ServerSpec(_Strict):
    """How to launch ``python -m sglang.launch_server`` for every variant."""

    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1024, le=65535)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cpu_stand_ins: list[str] = Field(
        default_factory=list,
        description=(
            "import-time stand-ins put on the server's PYTHONPATH for a machine without an NVIDIA "
            "GPU (folders of patchbench/shims/cpu: sgl_kernel, vllm); any call into one fails the cell"
        ),
    )
    ready_timeout_s: float = Field(600.0, gt=0)
    stop_grace_s: float = Field(20.0, gt=0)
    port_close_timeout_s: float = Field(30.0, gt=0)
    flush_retries: int = Field(5, ge=1)
    flush_pause_s: float = Field(1.0, ge=0)
    stall_timeout_s: float = Field(
        60.0,
        gt=0,
        description=(
            "seconds the server may leave the scheduler heartbeat, a suite's replies or a flush "
            "unanswered before the cell fails with 'the server stopped answering' "
            "(patchbench/run/liveness.py); far below a suite's timeout_s"
        ),
    )

    mrope_probe: Any = Field(
        None,
        exclude=True,
        description=(
            "removed: always None (falsy); the sync_probe suite's instrumentation replaces it"
        ),
    )

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

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not v or any(c.isspace() or c in "/\x00" for c in v):
            raise ValueError(
                "server.host is the address the server binds and readiness asks (127.0.0.1, "
                "0.0.0.0, a host name): not empty, no spaces, no scheme or path"
            )
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        check_args(v, "server.args")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        check_env(v, "server.env")
        return v


class Config(_Strict):
    """A validated experiment config; see the module docstring for the YAML shape.

    ``compare`` is a :class:`patchbench.analysis.comparison.CompareSettings`, ``nightly`` a
    :class:`patchbench.nightly.gates.NightlySettings` (defaults when the section is absent).
    """

    name: str
    sglang: SglangSpec
    model: ModelSpec
    server: ServerSpec = Field(default_factory=ServerSpec)
    variants: dict[str, VariantSpec]
    baseline: str | None = None
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    suites: dict[str, dict[str, Any]] = Field(default_factory=dict)
    compare: Any = Field(
        None, validate_default=True, description="patchbench.analysis.comparison.CompareSettings"
    )
    nightly: Any = Field(
        None, validate_default=True, description="patchbench.nightly.gates.NightlySettings"
    )
    description: str = ""

    # filled by load_config
    source: Path | None = Field(None, exclude=True)
    suite_params: dict[str, Any] = Field(default_factory=dict, exclude=True)
    #: suite -> its ``rounds`` ("all", "first" or round indices; patchbench.config.schedule)
    suite_rounds: dict[str, Any] = Field(default_factory=dict, exclude=True)

    #: {variant: its resolved patchbench.envs.builds.Build}, filled when the run resolves its builds
    builds: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @field_validator("sglang", mode="before")
    @classmethod
    def _version(cls, v):
        return check_release(v)

    @field_serializer("sglang")
    def _dump_sglang(self, v):
        return v if isinstance(v, str) else v.model_dump()

    @field_validator("compare", "nightly", mode="plain")
    @classmethod
    def _section(cls, v, info):
        model = SECTIONS[info.field_name]
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
        for name in v:
            why = variant_name_problem(name)
            if why:
                raise ValueError(f"variant name '{name[:80]}': {why}")
        seen: dict[str, str] = {}
        for name in v:
            other = seen.setdefault(name.lower(), name)
            if other != name:
                raise ValueError(
                    f"variant names '{other}' and '{name}' differ only in case: one folder on "
                    "file systems that do not tell case apart"
                )
        return v

    @field_serializer("variants")
    def _dump_variants(self, v: dict[str, VariantSpec]) -> dict:
        # the short list form when a variant only changes patches (what run folders always held)
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

    # ------------------------------------------------------------------ schedule
    def rounds_of(self, suite: str, repeats: int | None = None) -> list[int]:
        """The 0-based timed rounds ``suite`` runs in (``suites.<suite>.rounds``), out of
        ``repeats`` rounds (default: the most the schedule may take)."""
        n = self.schedule.max_repeats if repeats is None else repeats
        return _sched.resolve_rounds(self.suite_rounds.get(suite, "all"), n)

    # ------------------------------------------------------------------ builds
    def sglang_of(self, variant: str) -> SglangSpec:
        """The ``sglang:`` of ``variant``: its own, else the config's."""
        own = self.variants[variant].sglang
        return self.sglang if own is None else own

    def release_of(self, variant: str) -> str | None:
        """The sglang release whose environment ``variant``'s server runs in: from its resolved
        build (:attr:`builds`), else the release its ``sglang:`` names; None for ``latest``, a
        wheel or a checkout that is not resolved yet (patchbench.envs.builds.resolve_builds)."""
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
        """The variant's patch entries in order (names, or :class:`DiffPatch`)."""
        return list(self.variants[variant].patches)

    def server_args_of(self, variant: str) -> list[str]:
        """``server.args`` followed by the variant's ``server_args``."""
        return list(self.server.args) + list(self.variants[variant].server_args)

    def server_env_of(self, variant: str) -> dict[str, str]:
        """``server.env`` plus the variant's ``env`` (the names never overlap)."""
        return {**self.server.env, **self.variants[variant].env}

    def is_aa(self, variant: str) -> bool:
        """True when ``variant`` is not the baseline but has the same patches (in order), server
        arguments, environment and ``sglang:`` build: an A/A copy that measures noise."""
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

    def variant_diff(
        self, variant: str, *, hashes: bool = True, cache_dir: Path | None = None
    ) -> dict:
        """What ``variant`` changes against the baseline, for the report and the run manifest::

            {"aa": bool,
             "patches": [{"name", "kind": "patch"|"diff", "path": diff file or None,
                          "sha256": sha256 of the diff for this release or None}, ...],
             "patches_added": [labels], "patches_removed": [labels],
             "server_args": {"added": [flags with values], "removed": [...],
                             "changed": {flag: [baseline value, variant value]}},
             "env": {"added": {name: value}, "removed": [names], "changed": {name: [b, v]}},
             "sglang": [baseline's build, variant's build]}   # only when they differ

        ``hashes``: compute each patch's sha256 for the variant's release (a derived patch needs
        its wheels, fetched once into ``cache_dir``; a hash that cannot be computed is None).
        """
        spec, base = self.variants[variant], self.variants[self.baseline]
        release = self.release_of(variant)
        pats = []
        for p in spec.patches:
            sha = None
            if isinstance(p, str):
                if hashes and release is not None:
                    try:
                        sha = apply.patch_sha256(p, release, cache_dir)
                    except errors.PatchError:
                        sha = None
                pats.append({"name": p, "kind": "patch", "path": None, "sha256": sha})
            else:
                f = self.resolve_path(p.diff)
                if hashes and f.is_file():
                    sha = sha256_file(f)
                pats.append({"name": patch_label(p), "kind": "diff", "path": str(f), "sha256": sha})
        labels = [patch_label(p) for p in spec.patches]
        blabels = [patch_label(p) for p in base.patches]

        def flags(args: list[str]) -> dict[str, str | None]:
            return {f or v: (v if f else None) for _, f, v in split_args(args)}

        fa, fb = flags(spec.server_args), flags(base.server_args)

        def show(f: str, v: str | None) -> str:
            return f if v is None else f"{f}={v}"

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

    def diff_files(self) -> dict[str, Path]:
        """{label (``diff:<path>``): resolved file} of every diff named directly in a variant."""
        out: dict[str, Path] = {}
        for spec in self.variants.values():
            for p in spec.patches:
                if isinstance(p, DiffPatch):
                    out[patch_label(p)] = self.resolve_path(p.diff)
        return out

    def files_to_copy(self) -> list[tuple[Path, str]]:
        """[(source file, destination relative to the run folder)] the runner copies so that the
        run can be reproduced: every diff named directly in a variant, as
        ``diffs/<sha256 first 12>-<file name>``."""
        out = []
        for f in self.diff_files().values():
            out.append((f, f"diffs/{sha256_file(f)[:12]}-{f.name}"))
        return out

    def overlay_patches(self, variant: str, *, cache_dir: Path | None = None) -> list[str | Path]:
        """The variant's patches as :func:`patchbench.patches.overlay.build_overlay` takes them: patch
        names, and for each diff named directly a patch folder made from it for the variant's
        release (:meth:`release_of`; hashes from the release's pristine files; cached under
        ``<cache_dir>/diff-patches/``).

        Raises :class:`patchbench.errors.PatchError` (or a subclass) naming the diff, file and
        hunk.
        """
        out: list[str | Path] = []
        release = self.release_of(variant)
        for p in self.variants[variant].patches:
            if isinstance(p, str):
                out.append(p)
            else:
                if release is None:
                    raise errors.PatchError(
                        f"variant '{variant}': its sglang build is not resolved yet"
                    )
                out.append(
                    author.patch_from_diff_file(
                        self.resolve_path(p.diff), release, cache_dir=cache_dir
                    )
                )
        return out

    # ------------------------------------------------------------------ model
    def resolve_path(self, p: str) -> Path:
        """A config path: ``~`` and ``$VARS`` expanded; relative paths against the repo root."""
        q = Path(os.path.expandvars(os.path.expanduser(p)))
        return q if q.is_absolute() else REPO_ROOT / q

    @property
    def model_dir(self) -> Path:
        return self.resolve_path(self.model.path)

    @property
    def tokenizer_dir(self) -> Path:
        return self.resolve_path(self.model.tokenizer or self.model.path)

    def _is_hub(self, p: str) -> bool:
        return (
            not self.model.tiny
            and not looks_local(p)
            and is_hub_id(p)
            and not self.resolve_path(p).exists()
        )

    def _ref(self, p: str) -> str:
        """A local folder as an absolute path; a hub id (``org/name``, no such local folder)
        unchanged, for sglang and transformers to find in the HF cache or on the hub."""
        return p if self._is_hub(p) else str(self.resolve_path(p))

    @property
    def model_is_hub(self) -> bool:
        """True when ``model.path`` is a hub id (``org/name``, no such local folder, not tiny)."""
        return self._is_hub(self.model.path)

    @property
    def model_ref(self) -> str:
        """What ``--model-path`` gets: a local folder (absolute) or a hub id."""
        return self._ref(self.model.path)

    @property
    def tokenizer_ref(self) -> str:
        """The tokenizer's folder or hub id (defaults to the model's)."""
        return self._ref(self.model.tokenizer or self.model.path)

    def require_model(self) -> None:
        """Check, before any launch, that a local model (and tokenizer) folder exists.

        A hub id and a ``tiny`` model (built when missing) pass. Raises
        :class:`patchbench.errors.EnvironmentNotReady` (exit 3) naming the folder otherwise.
        """
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
