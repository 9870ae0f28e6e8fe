"""A variant's models in the experiment config: its name (:func:`variant_name_problem`), its
patches (a name in ``patches/`` or :class:`DiffPatch`), its ``sglang:`` build (a release,
``latest``, :class:`GitSource`, :class:`WheelSource`) and :class:`VariantSpec` (patches, server
arguments, environment, own build).

See :mod:`patchbench.config` for the YAML shape; :mod:`patchbench.config.schema` holds the
:class:`~patchbench.config.schema.Config` that names the variants. A model error is a ValueError
(pydantic's ValidationError), which the loader turns into :class:`patchbench.errors.ConfigError`.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from patchbench.config.args import check_args, check_env
from patchbench.inputs import FOLDER_NAME


class _Strict(BaseModel):
    # strict: YAML's true is not 1, 1 is not "1" (quote environment values)
    model_config = ConfigDict(extra="forbid", strict=True)


#: names a run folder itself uses at its top level: a variant folder must not take one (compared
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


def variant_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a variant (its folder in the run folder), or None: characters
    other than letters, digits, '.', '_', '-' (or a first character that is not a letter or
    digit), more than :data:`MAX_VARIANT_NAME` characters, or a name the run folder uses itself
    (:data:`RUN_FOLDER_NAMES`)."""
    if not FOLDER_NAME.match(name):
        return "use letters, digits, '.', '_', '-' (starting with a letter or digit)"
    if len(name) > MAX_VARIANT_NAME:
        return f"{len(name)} characters; at most {MAX_VARIANT_NAME} (it names a folder and files)"
    if name.lower() in RUN_FOLDER_NAMES:
        return (
            f"the run folder uses '{name}' itself ({', '.join(sorted(RUN_FOLDER_NAMES))}); "
            "choose another name"
        )
    return None


class DiffPatch(_Strict):
    """A patch given as a diff file (``{diff: path/to/change.diff}``); relative paths resolve
    against the repo root."""

    diff: str

    @field_validator("diff")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip() or "\x00" in v:
            raise ValueError("name a diff file, e.g. {diff: patches/my-change.diff}")
        return v


PatchEntry = str | DiffPatch


class GitSource(_Strict):
    """An sglang build from a source checkout at a commit: ``{git: PATH, ref: REF}``.

    ``git``: the checkout or a bare repository (``~`` and ``$VARS`` expanded; relative paths
    against the repo root); ``ref``: anything ``git rev-parse`` takes (a branch, tag or commit;
    resolved to one commit when the run starts). Only committed files of ``python/sglang`` (and
    ``python/pyproject.toml`` for its dependencies) are read, never the work tree.
    """

    git: str
    ref: str = "HEAD"

    @field_validator("git", "ref")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip() or "\x00" in v or v.startswith("-"):
            raise ValueError("name a checkout and a ref, e.g. {git: ~/sglang, ref: my-branch}")
        return v

    def label(self) -> str:
        """``git:PATH@REF``."""
        return f"git:{self.git}@{self.ref}"


class WheelSource(_Strict):
    """An sglang build from a wheel file: ``{wheel: PATH}`` (relative paths against the repo
    root)."""

    wheel: str

    @field_validator("wheel")
    @classmethod
    def _is_wheel(cls, v: str) -> str:
        if not v.strip().endswith(".whl") or "\x00" in v:
            raise ValueError("name a wheel file, e.g. {wheel: dist/sglang-0.5.23-py3-none-any.whl}")
        return v

    def label(self) -> str:
        """``wheel:PATH``."""
        return f"wheel:{self.wheel}"


#: what ``sglang:`` may say (for the run, or for one variant): a release (``"0.5.23"``),
#: ``latest`` (the newest release on the package index, resolved once per run), a wheel file or
#: a source checkout at a commit; patchbench.envs.builds resolves it to an environment and an overlay
SglangSpec = str | GitSource | WheelSource


def sglang_label(spec: SglangSpec) -> str:
    """How an ``sglang:`` value is shown: the release, ``latest``, ``git:PATH@REF`` or
    ``wheel:PATH``."""
    return spec if isinstance(spec, str) else spec.label()


def check_release(v):
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


#: the ``sglang:`` value that names the newest release on the package index
LATEST = "latest"


def patch_label(p: PatchEntry) -> str:
    """How a patch entry is shown: its name, or ``diff:<path>``."""
    return p if isinstance(p, str) else f"diff:{p.diff}"


class VariantSpec(_Strict):
    """What a variant changes against the plain server: patches applied in order, arguments
    appended to ``server.args``, variables added to ``server.env``."""

    patches: list[PatchEntry] = Field(default_factory=list)
    server_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    sglang: SglangSpec | None = Field(
        None, description="this variant's own sglang build (default: the config's `sglang`)"
    )

    @field_validator("sglang", mode="before")
    @classmethod
    def _release(cls, v):
        return check_release(v)

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, v):
        if v is None:
            return {}
        if isinstance(v, list):
            return {"patches": v}
        return v

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

    @field_validator("server_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        check_args(v, "server_args")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        check_env(v, "env")
        return v

    def short(self) -> list | dict:
        """JSON form: the list of patches when the variant changes only patches, else a mapping
        (``sglang`` in it only when the variant names its own build)."""
        pats = [p if isinstance(p, str) else p.model_dump() for p in self.patches]
        if not self.server_args and not self.env and self.sglang is None:
            return pats
        out: dict = {"patches": pats, "server_args": list(self.server_args), "env": dict(self.env)}
        if self.sglang is not None:
            out["sglang"] = (
                self.sglang if isinstance(self.sglang, str) else self.sglang.model_dump()
            )
        return out
