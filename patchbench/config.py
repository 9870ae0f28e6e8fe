"""The experiment config: a YAML file validated by pydantic models.

Shape (every key documented in configs/demo-cpu.yaml)::

    name: demo-cpu                      # names the run folder
    sglang: 0.5.1.post3                 # the pinned release; the environment must hold exactly it
    model:
      path: .cache/models/tiny-qwen25vl # relative paths resolve against the repo root
      tiny: true                        # build the tiny random Qwen2.5-VL there when missing
      tokenizer: null                   # defaults to path
    server:
      host: 127.0.0.1
      port: 30100
      args: ["--device", "cpu", ...]    # passed to sglang.launch_server for every variant
      env: {SGLANG_USE_CPU_ENGINE: "1"}
      cpu_stand_ins: [sgl_kernel, vllm] # stand-ins from patchbench/shims/cpu (CPU configs only)
      ready_timeout_s: 300
      stop_grace_s: 20
      flush_retries: 5
      flush_pause_s: 1.0
    variants:                           # name -> what differs from the plain server
      baseline: []                      # short form: a list of patches
      mrope-sync-free: [mrope-sync-free]
      no-overlap:                       # long form
        patches: [mrope-sync-free, {diff: path/to/change.diff}]
        server_args: [--disable-overlap-schedule]   # appended to server.args
        env: {SGLANG_X: "1"}                        # added to server.env
    baseline: baseline                  # defaults to the first variant
    schedule:
      repeats: 2                        # or {min: 4, max: 12, step: 2}: sequential repeats
      order: interleaved                # interleaved (ABBA...) | sequential
    suites:                             # run in this order in every cell; params per suite
      sync_probe: {}
      mmmu: {rounds: first, ...}        # rounds (core key): all | first | [0, 2]
      serving: {...}
    compare: {...}                      # patchbench.comparison.CompareSettings
    nightly: {...}                      # patchbench.nightly.NightlySettings (gates)

A patch entry is the name of a folder in ``patches/`` or ``{diff: FILE}``: a unified diff (paths
``a/python/sglang/...`` as ``git diff`` in an sglang checkout writes them, or ``a/sglang/...``;
relative FILE paths resolve against the repo root). Such a diff is checked when the config is
loaded (files under ``sglang/`` only, no renames, new files, deletions, mode changes, symlinks or
binary parts) and turned into a patch with hashes for the config's release at run time
(:meth:`Config.overlay_patches`); the runner copies the file into the run folder
(:meth:`Config.files_to_copy`).

Validation beyond the models: duplicate keys are refused naming both lines; the file must be
UTF-8, at most ``MAX_CONFIG_BYTES``, with at most ``MAX_YAML_ALIASES`` aliases and
``MAX_YAML_NODES`` nodes once aliases are expanded; numbers and booleans are not converted into
each other (``repeats: true`` is refused); server arguments that the harness owns
(:data:`HARNESS_ARGS`) are refused in any spelling (``--port=1``, ``'--port 1'`` as one item, an
abbreviation argparse would accept); a flag given both in ``server.args`` and a variant's
``server_args`` (or an environment variable in both ``env``) is refused; environment names must be
POSIX names and values strings without NUL.

Errors: :class:`ConfigError` (exit 2), whose message names the file, the key path, the line where
the YAML parser knows it, what was found and what is allowed. A local model folder that does not
exist is :class:`patchbench.errors.EnvironmentNotReady` (exit 3) from :meth:`Config.require_model`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from patchbench import errors
from patchbench import schedule as _sched
from patchbench import suite as _suite
from patchbench.suite import suite_names

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES_DIR = REPO_ROOT / "patches"
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: a patch folder name (the same rule as variant names)
PATCH_NAME = VARIANT_NAME
#: POSIX environment variable name
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: server arguments the harness sets itself (from model.path, model.tokenizer, server.host/port)
HARNESS_ARGS = ("--model-path", "--model", "--tokenizer-path", "--host", "--port")
#: environment variables the harness sets itself (the overlay goes first on PYTHONPATH)
HARNESS_ENV = ("PYTHONPATH",)
HARNESS_ENV_PREFIX = "PATCHBENCH_"

#: bounds on a config (or patch manifest) file
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000


def is_hub_id(p: str) -> bool:
    """True for a model-hub id such as ``Qwen/Qwen2.5-VL-3B-Instruct`` (``org/name``, not a path
    that starts with ``.``, ``/``, ``~`` or ``$``)."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", p))


def _looks_local(p: str) -> bool:
    """A path the user wrote as a local one: absolute, ``./``, ``../``, ``~`` or ``$VAR``."""
    return p.startswith(("/", "./", "../", "~", "$")) or p in (".", "..")


class ConfigError(errors.ConfigError):
    """A config that cannot be used; the message names file, key, line and what is allowed (exit 2)."""


# --------------------------------------------------------------------------- YAML reading
class _YamlLimit(yaml.YAMLError):
    pass


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (naming both lines) and bounds alias use."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise _YamlLimit(
                    f"line {mark.line + 1}: more than {MAX_YAML_ALIASES} aliases (*name); "
                    "write the values out"
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                try:
                    key = self.construct_object(key_node, deep=True)
                    hash(key)
                except TypeError:  # an unhashable key: the base constructor says so
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key '{key}' at lines {seen[key]} and {line}: YAML "
                        "would silently keep only the last one; remove one of them",
                        key_node.start_mark,
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_nodes(node, memo: dict) -> int:
    """Node count of a composed YAML graph with every alias expanded (linear time, memoised)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a cycle counts once (PyYAML builds recursive objects for them)
    if isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded_nodes(k, memo) + _expanded_nodes(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_nodes(v, memo) for v in node.value)
    else:
        n = 1
    memo[id(node)] = n
    return n


def parse_yaml(text: str) -> Any:
    """Parse one YAML document with :class:`_Loader`'s checks and the node bound.

    Raises yaml.YAMLError (its message says the line) for invalid YAML, duplicate keys, too many
    aliases or too many nodes once aliases are expanded.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded_nodes(node, {})
        if n > MAX_YAML_NODES:
            raise _YamlLimit(f"{n} YAML nodes once aliases are expanded (at most {MAX_YAML_NODES})")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_text_file(path: Path, error: type[Exception], what: str = "config file") -> str:
    """The UTF-8 text of a small input file (a config, a patch manifest).

    Raises ``error`` with one line naming the file when it does not exist, is a directory, cannot
    be read, is larger than MAX_CONFIG_BYTES or is not UTF-8 (with the offset and line of the
    first bad byte). A UTF-8 byte-order mark is accepted.
    """
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a directory, not a {what}")
    if not path.exists():
        raise error(f"{path}: no such {what}")
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise error(f"{path}: {size} bytes; a {what} may hold at most {MAX_CONFIG_BYTES}")
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
            f"{e.start}); save the file as UTF-8"
        ) from None


def read_yaml_mapping(path: Path, error: type[Exception], keys: str) -> tuple[str, dict]:
    """Text and parsed top-level mapping of a YAML file (configs, patch manifests).

    Raises ``error`` naming the file (see :func:`read_text_file`), and the line when it is not
    valid YAML, has a duplicate key or too many aliases or nodes, or its top level is not a mapping
    (``keys`` lists what the top level should hold).
    """
    text = read_text_file(path, error, "config file" if issubclass(error, ConfigError) else "file")
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        what = getattr(e, "problem", None) or str(e)
        if isinstance(e, _YamlLimit) or (what and "duplicate key" in what):
            raise error(f"{where}: {what}") from None
        raise error(f"{where}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise error(
            f"{path}: the top level must be a mapping with keys {keys} (got {type(raw).__name__})"
        )
    return text, raw


# --------------------------------------------------------------------------- server arguments
def split_args(args: list[str]) -> list[tuple[int, str, str | None]]:
    """``server.args``-style list -> [(index of the flag item, flag, value or None)].

    ``--flag=value`` and ``--flag value`` (value: the next item when it does not start with ``-``,
    or is a negative number) both give (i, "--flag", "value"); a switch gives (i, "--flag", None).
    Items that are neither a flag nor a flag's value are returned as (i, "", item).
    """
    out: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and not _is_number(a):
            if "=" in a:
                flag, val = a.split("=", 1)
                out.append((i, flag, val))
            elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _is_number(args[i + 1])):
                out.append((i, a, args[i + 1]))
                i += 1
            else:
                out.append((i, a, None))
        else:
            out.append((i, "", a))
        i += 1
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _owned_flag(flag: str) -> str | None:
    """The harness-owned argument that ``flag`` means for argparse (exact, or an unambiguous
    prefix as argparse's allow_abbrev reads it), or None."""
    if not flag.startswith("--") or len(flag) < 3:
        return None
    if flag in HARNESS_ARGS:
        return flag
    hits = [o for o in HARNESS_ARGS if o.startswith(flag)]
    return hits[0] if hits else None


def check_args(args: list[str], where: str) -> None:
    """Refuse malformed or harness-owned server arguments; ``where`` names the key in messages.

    Raises ValueError naming the item: a flag and its value in one item (``'--port 31000'``),
    a harness-owned argument in any spelling, an empty item or one holding a NUL.
    """
    for i, a in enumerate(args):
        if not a.strip() or "\x00" in a:
            raise ValueError(f"{where}[{i}]: {a!r} is empty or holds a NUL character")
        first = a.split("=", 1)[0]
        if a.startswith("-") and any(c.isspace() for c in first):
            head = first.split()[0]
            owned = _owned_flag(head)
            if owned:
                raise ValueError(
                    f"{where}[{i}]: {a!r} sets {owned}, which the harness sets "
                    f"({_owner_hint(owned)}); remove it"
                )
            raise ValueError(
                f"{where}[{i}]: {a!r} holds a flag and its value in one item, which "
                f"sglang would not recognise; write them as two items "
                f"({head!r}, '...') or as {head}=VALUE"
            )
    for i, flag, _ in split_args(args):
        owned = _owned_flag(flag)
        if owned:
            shown = f"'{args[i]}'" + (f" (argparse reads it as {owned})" if flag != owned else "")
            raise ValueError(
                f"{where}[{i}]: {shown} is set by the harness ({_owner_hint(owned)}); remove it"
            )


def _owner_hint(flag: str) -> str:
    return {
        "--host": "from server.host",
        "--port": "from server.port or bench --port",
        "--tokenizer-path": "from model.tokenizer",
    }.get(flag, "from model.path")


def check_env(env: dict[str, str], where: str) -> None:
    """Refuse environment names that are not POSIX names, values with a NUL character, and the
    variables the harness sets (PYTHONPATH, PATCHBENCH_*). Raises ValueError naming the entry."""
    for k, v in env.items():
        if not ENV_NAME.match(k):
            raise ValueError(
                f"{where}: '{k}' is not an environment variable name (letters, digits "
                "and '_', not starting with a digit)"
            )
        if "\x00" in v:
            raise ValueError(f"{where}.{k}: the value holds a NUL character")
        if k in HARNESS_ENV or k.startswith(HARNESS_ENV_PREFIX):
            raise ValueError(
                f"{where}.{k}: set by the harness (the overlay and its checks); remove it"
            )


# --------------------------------------------------------------------------- models
class _Strict(BaseModel):
    # strict: YAML's true is not 1, 1 is not "1" (quote environment values)
    model_config = ConfigDict(extra="forbid", strict=True)


class ModelSpec(_Strict):
    """The served model. ``path`` is a local folder (or a hub id where a hub is reachable)."""

    path: str
    tiny: bool = Field(False, description="build the tiny random Qwen2.5-VL at `path` if missing")
    tokenizer: str | None = None


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
        from patchbench.shims import available_stand_ins

        have = available_stand_ins()
        bad = [x for x in v if x not in have]
        if bad:
            raise ValueError(f"unknown stand-in(s) {bad}; available: {have}")
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


def patch_label(p: PatchEntry) -> str:
    """How a patch entry is shown: its name, or ``diff:<path>``."""
    return p if isinstance(p, str) else f"diff:{p.diff}"


class VariantSpec(_Strict):
    """What a variant changes against the plain server: patches applied in order, arguments
    appended to ``server.args``, variables added to ``server.env``."""

    patches: list[PatchEntry] = Field(default_factory=list)
    server_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

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
            if isinstance(p, str) and not PATCH_NAME.match(p):
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
        """JSON form: the list of patches when the variant changes only patches, else a mapping."""
        pats = [p if isinstance(p, str) else p.model_dump() for p in self.patches]
        if not self.server_args and not self.env:
            return pats
        return {"patches": pats, "server_args": list(self.server_args), "env": dict(self.env)}


class SequentialRepeats(_Strict):
    """``schedule.repeats: {min, max, step}``: group-sequential repeats (patchbench.sequential).

    The run looks at its primary metrics after ``min`` whole interleaved rounds, then after every
    ``step`` more, up to ``max``, and stops once every primary of every non-A/A variant is
    decided or futile (conditional power of deciding it by ``max`` below ``futility``;
    patchbench/sequential.py). ``boundary``: the group-sequential boundary (``pocock``: the same
    nominal level at every look; ``obrien-fleming``: strict early, near the fixed-sample level at
    the last look). ``futility``: the non-binding futility threshold (0.2 by default,
    ``patchbench.sequential.FUTILITY``; 0 turns the futility stop off; it never changes the
    chance of a false improved/regressed, only how long an undecidable run goes on).
    """

    min: int = Field(le=100)
    max: int = Field(le=100)
    step: int = Field(2, le=100)
    boundary: Literal["pocock", "obrien-fleming"] = "pocock"
    futility: float = Field(0.2, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _looks(self) -> SequentialRepeats:
        from patchbench.sequential import looks_from_schedule

        looks_from_schedule(self.min, self.max, self.step)  # ValueError naming the key
        return self

    @property
    def looks(self) -> tuple[int, ...]:
        """The repeat counts at which the run looks: ``min, min+step, ..., max``."""
        from patchbench.sequential import looks_from_schedule

        return looks_from_schedule(self.min, self.max, self.step)


class ScheduleSpec(_Strict):
    """Repeats of all variants; interleaved = ABBA, BAAB, ... (each variant once per round).

    ``repeats``: an integer (that many rounds, fixed) or a mapping ``{min, max, step, boundary}``
    (:class:`SequentialRepeats`: stop early once every primary is decided).
    """

    repeats: int | SequentialRepeats = 1
    order: Literal["interleaved", "sequential"] = "interleaved"

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
                where = f"{key}: " if key else ""
                raise ValueError(
                    f"{where}{msg} (a sequential schedule is {{min: 4, max: 12, step: 2}})"
                ) from None
        if isinstance(v, bool):
            raise PydanticCustomError("int_type", "Input should be a valid integer")
        if not isinstance(v, int):
            raise PydanticCustomError(
                "int_type",
                "Input should be a valid integer (a fixed number of repeats) or a mapping "
                "{min: 4, max: 12, step: 2} (sequential repeats)",
            )
        if not 1 <= v <= 100:
            raise ValueError(f"repeats must be between 1 and 100, got {v}")
        return v

    @field_serializer("repeats")
    def _dump_repeats(self, v):
        return v.model_dump(mode="json") if isinstance(v, SequentialRepeats) else v

    @model_validator(mode="after")
    def _order(self) -> ScheduleSpec:
        if self.sequential is not None and self.order != "interleaved":
            raise ValueError(
                "schedule.order: sequential repeats ({min, max, step}) look after whole "
                "interleaved rounds; use order: interleaved (or a fixed number of repeats)"
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
        """``"3 repeat(s)"`` or ``"sequential 4..12 repeats, step 2 (pocock)"``."""
        s = self.sequential
        if s is None:
            return f"{self.repeats} repeat(s)"
        looks = ", ".join(str(n) for n in s.looks)
        return f"sequential {s.min}..{s.max} repeats, looks after {looks} ({s.boundary} boundary)"


def _params_model(name: str) -> type[BaseModel]:
    """The ``Params`` model of the registered suite ``name``. KeyError when unknown."""
    return _suite.suite_params_model(name)


def _suite_is_timed(name: str) -> bool:
    """False for a suite that runs only in the untimed correctness cells (``Suite.timed``)."""
    return bool(_suite.get_suite(name).timed)


def _section_model(section: str) -> type[BaseModel]:
    """The model of the ``compare`` or ``nightly`` section, imported on first use (those modules
    read configs too, so a top-level import would be a cycle)."""
    if section == "compare":
        from patchbench.comparison import CompareSettings

        return CompareSettings
    from patchbench.nightly import NightlySettings

    return NightlySettings


class Config(_Strict):
    """A validated experiment config; see the module docstring for the YAML shape.

    ``compare`` is a :class:`patchbench.comparison.CompareSettings`, ``nightly`` a
    :class:`patchbench.nightly.NightlySettings` (defaults when the section is absent).
    """

    name: str
    sglang: str
    model: ModelSpec
    server: ServerSpec = Field(default_factory=ServerSpec)
    variants: dict[str, VariantSpec]
    baseline: str | None = None
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    suites: dict[str, dict[str, Any]] = Field(default_factory=dict)
    compare: Any = Field(
        None, validate_default=True, description="patchbench.comparison.CompareSettings"
    )
    nightly: Any = Field(
        None, validate_default=True, description="patchbench.nightly.NightlySettings"
    )
    description: str = ""

    # filled by load_config
    source: Path | None = Field(None, exclude=True)
    suite_params: dict[str, Any] = Field(default_factory=dict, exclude=True)
    #: suite -> its ``rounds`` ("all", "first" or round indices; patchbench.schedule)
    suite_rounds: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @field_validator("sglang", mode="before")
    @classmethod
    def _version(cls, v):
        if isinstance(v, float):  # `sglang: 0.5` reads as a number
            raise ValueError('quote the release, e.g. sglang: "0.5.1.post3"')
        return v

    @field_validator("compare", "nightly", mode="plain")
    @classmethod
    def _section(cls, v, info):
        model = _section_model(info.field_name)
        if isinstance(v, model):
            return v
        if v is not None and not isinstance(v, dict):
            raise ValueError(f"must be a mapping (keys: {', '.join(model.model_fields)})")
        return model.model_validate(v or {})

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not VARIANT_NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names the run folder)")
        return v

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: dict[str, VariantSpec]) -> dict[str, VariantSpec]:
        if not v:
            raise ValueError("at least one variant is needed, e.g. {baseline: []}")
        for name in v:
            if not VARIANT_NAME.match(name):
                raise ValueError(f"variant name '{name}': use letters, digits, '.', '_', '-'")
        return v

    @field_serializer("variants")
    def _dump_variants(self, v: dict[str, VariantSpec]) -> dict:
        # the short list form when a variant only changes patches (what run folders always held)
        return {k: spec.short() for k, spec in v.items()}

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
        from patchbench.schedule import resolve_rounds

        n = self.schedule.max_repeats if repeats is None else repeats
        return resolve_rounds(self.suite_rounds.get(suite, "all"), n)

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
        arguments and environment: an A/A copy that measures noise."""
        if variant == self.baseline:
            return False
        a, b = self.variants[variant], self.variants[self.baseline]
        return (
            [patch_label(p) for p in a.patches] == [patch_label(p) for p in b.patches]
            and a.server_args == b.server_args
            and a.env == b.env
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
             "env": {"added": {name: value}, "removed": [names], "changed": {name: [b, v]}}}

        ``hashes``: compute each patch's sha256 (a derived patch needs its wheels, fetched once
        into ``cache_dir``; a hash that cannot be computed is None).
        """
        from patchbench import patchset

        spec, base = self.variants[variant], self.variants[self.baseline]
        pats = []
        for p in spec.patches:
            sha = None
            if isinstance(p, str):
                if hashes:
                    try:
                        sha = patchset.patch_sha256(p, self.sglang, cache_dir)
                    except patchset.PatchError:
                        sha = None
                pats.append({"name": p, "kind": "patch", "path": None, "sha256": sha})
            else:
                f = self.resolve_path(p.diff)
                if hashes and f.is_file():
                    sha = patchset.sha256_file(f)
                pats.append({"name": patch_label(p), "kind": "diff", "path": str(f), "sha256": sha})
        labels = [patch_label(p) for p in spec.patches]
        blabels = [patch_label(p) for p in base.patches]

        def flags(args: list[str]) -> dict[str, str | None]:
            return {f or v: (v if f else None) for _, f, v in split_args(args)}

        fa, fb = flags(spec.server_args), flags(base.server_args)

        def show(f: str, v: str | None) -> str:
            return f if v is None else f"{f}={v}"

        return {
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
        from patchbench.patchset import sha256_file

        out = []
        for f in self.diff_files().values():
            out.append((f, f"diffs/{sha256_file(f)[:12]}-{f.name}"))
        return out

    def overlay_patches(self, variant: str, *, cache_dir: Path | None = None) -> list[str | Path]:
        """The variant's patches as :func:`patchbench.overlay.build_overlay` takes them: patch
        names, and for each diff named directly a patch folder made from it for ``self.sglang``
        (hashes from the release's pristine files; cached under ``<cache_dir>/diff-patches/``).

        Raises the :class:`patchbench.patchset.PatchError` family naming the diff, file and hunk.
        """
        from patchbench import patchset

        out: list[str | Path] = []
        for p in self.variants[variant].patches:
            if isinstance(p, str):
                out.append(p)
            else:
                out.append(
                    patchset.patch_from_diff_file(
                        self.resolve_path(p.diff), self.sglang, cache_dir=cache_dir
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
            and not _looks_local(p)
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


def _line_of(text: str, loc: tuple) -> int | None:
    """Best-effort YAML line (1-based) of a key path, from PyYAML's node marks."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in loc:
        if node is None:
            break
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, val in node.value:
                if k.value == str(key):
                    line, nxt = k.start_mark.line + 1, val
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


#: location items pydantic adds for the members of a union (not keys of the YAML)
_UNION_TAGS = {"str", "DiffPatch", "function-plain[_section()]"}


def _clean_loc(loc: tuple) -> tuple:
    return tuple(x for x in loc if not (isinstance(x, str) and (x in _UNION_TAGS or "[" in x)))


_KEY_IN_MESSAGE = re.compile(r"^((?:variants|server|baseline)(?:\.[\w.-]+?)*(?:\[\d+\])?)(?::| is)")


def _loc_of_message(msg: str) -> tuple:
    """The key path a model-level message starts with (``variants.v.server_args[2]: ...``)."""
    m = _KEY_IN_MESSAGE.match(msg)
    if not m:
        return ()
    out: list = []
    for part in m.group(1).split("."):
        idx = re.fullmatch(r"(.*)\[(\d+)\]", part)
        out += [idx.group(1), int(idx.group(2))] if idx else [part]
    return tuple(out)


def _format_errors(path: Path, text: str, err: ValidationError, prefix: tuple = ()) -> str:
    lines = []
    seen = set()
    for e in err.errors():
        raw_loc = tuple(e["loc"])
        got = e.get("input")
        # a union member that does not fit the input's kind says nothing useful
        if raw_loc[-1:] == ("str",) and isinstance(got, dict):
            continue
        if raw_loc[-1:] == ("DiffPatch",) and not isinstance(got, dict):
            continue
        loc = prefix + _clean_loc(raw_loc)
        text_ = e["msg"].removeprefix("Value error, ")
        if not loc and e["type"] == "value_error":
            mloc = _loc_of_message(text_)
            where = _line_of(text, mloc) if mloc else None
            msg = f"{path}:{where}: {text_}" if where else f"{path}: {text_}"
            if msg not in seen:
                seen.add(msg)
                lines.append(msg)
            continue
        key = ".".join(str(x) for x in loc) or "(top level)"
        where = _line_of(text, loc)
        at = f"{path}:{where}" if where else f"{path}"
        if e["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            allowed = f"; allowed keys: {', '.join(parent)}" if parent else ""
            msg = f"{at}: unknown key '{key}'{allowed}"
        elif e["type"] == "missing":
            msg = f"{at}: missing required key '{key}'"
        else:
            got_s = _short_repr(got) if not isinstance(got, dict) else "a mapping"
            hint = ""
            if e["type"] == "string_type" and isinstance(got, (int, float, bool)):
                hint = f'; quote it: "{str(got).lower() if isinstance(got, bool) else got}"'
            elif e["type"] in ("int_type", "float_type") and isinstance(got, bool):
                hint = "; a boolean is not a number"
            # a message that already quotes the value ("..., got 0") does not repeat it
            said = f"got {got!r}" in text_ or f"got {got}" in text_
            tail = f" (got {got_s}{hint})" if not said or hint else ""
            msg = f"{at}: key '{key}': {text_}{tail}"
        if msg not in seen:  # a union reports one problem per member
            seen.add(msg)
            lines.append(msg)
    return "\n".join(lines)


def _short_repr(value: Any) -> str:
    """``repr`` cut to about 80 characters the way :mod:`reprlib` cuts it: lists keep their
    first items and their closing bracket (``['--port=1234', '--x', ...]``)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlist = r.maxtuple = 4
    r.maxstring = r.maxother = 60
    return r.repr(value)


def _model_at(loc: tuple) -> list[str]:
    """Allowed keys of the model at a key path (for 'unknown key' messages)."""
    import typing

    if loc[:1] == ("suites",):
        rest = [k for k in loc[1:] if not isinstance(k, int)]
        if not rest:
            return suite_names()
        if rest[0] not in suite_names():
            return []
        model: Any = _params_model(rest[0])
        for k in rest[1:]:
            f = model.model_fields.get(k)
            ann = f.annotation if f else None
            if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                return []
            model = ann
        core = [_sched.ROUNDS_KEY] if len(rest) == 1 else []
        return [k for k in model.model_fields] + core
    model = Config
    keys = list(loc)
    while keys:
        key = keys.pop(0)
        if isinstance(key, int):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or key not in fields:
            return []
        if model is Config and key in ("compare", "nightly"):
            model = _section_model(key)
            continue
        ann = fields[key].annotation
        if typing.get_origin(ann) is dict:  # name -> model: skip the name
            ann = typing.get_args(ann)[1]
            if keys:
                keys.pop(0)
            elif not keys:
                return []
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if model is None:
            return []
    return [k for k, f in model.model_fields.items() if not f.exclude]


def load_config(path: str | os.PathLike, *, check_files: bool = True) -> Config:
    """Load and validate a YAML config.

    Validates the file (see :func:`read_yaml_mapping`), the top level, every suite's parameters
    against the suite's ``Params``, the ``compare`` and ``nightly`` sections against their models,
    and (``check_files``) that every named patch exists as ``patches/<name>/`` with a valid manifest
    that supports the config's release, and that every diff named directly exists and changes
    only what a patch may (:func:`patchbench.patchset.inspect_diff`).

    Returns a :class:`Config` whose ``suite_params`` holds the validated suite models.
    Raises :class:`ConfigError` naming the file, key and line for any problem.
    """
    path = Path(path)
    text, raw = read_yaml_mapping(path, ConfigError, "name, sglang, model, variants, suites, ...")
    problems: list[str] = []
    # the two sections first, so that their errors keep their full key path
    for section in ("compare", "nightly"):
        if section in raw and isinstance(raw[section], dict):
            try:
                raw[section] = _section_model(section).model_validate(raw[section])
            except ValidationError as e:
                problems.append(_format_errors(path, text, e, (section,)))
                raw[section] = None
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        problems.append(_format_errors(path, text, e))
        raise ConfigError("\n".join(problems)) from None
    cfg.source = path.resolve()
    known = suite_names()
    for name, params in cfg.suites.items():
        if name not in known:
            where = _line_of(text, ("suites", name))
            problems.append(
                f"{path}:{where or ''}: unknown suite '{name}' under suites; "
                f"allowed: {', '.join(known)}"
            )
            continue
        model = _params_model(name)
        own = dict(params or {})
        if _sched.ROUNDS_KEY in own:  # a core key, not one of the suite's parameters
            rounds = own.pop(_sched.ROUNDS_KEY)
            key = f"suites.{name}.{_sched.ROUNDS_KEY}"
            where = _line_of(text, ("suites", name, _sched.ROUNDS_KEY))
            try:
                cfg.suite_rounds[name] = _sched.parse_rounds(rounds, cfg.schedule.max_repeats, key)
                if cfg.suite_rounds[name] != "all" and not _suite_is_timed(name):
                    raise ValueError(
                        f"{key}: suite '{name}' runs only in the untimed correctness cells "
                        "(one per variant), never in timed rounds; remove the key"
                    )
            except ValueError as e:
                problems.append(f"{path}:{where or ''}: {e}")
        try:
            cfg.suite_params[name] = model.model_validate(own)
        except ValidationError as e:
            msg = _format_errors(path, text, e, ("suites", name))
            allowed = ", ".join([*model.model_fields, _sched.ROUNDS_KEY])
            problems.append(
                msg
                if "allowed keys:" in msg  # an unknown key lists them already
                else f"{msg}\n  (suite '{name}' accepts: {allowed})"
            )
    if check_files:
        problems += _check_patches(cfg, path, text)
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


def _check_patches(cfg: Config, path: Path, text: str) -> list[str]:
    """Problems with the patches the variants name (missing, invalid manifest, no diff for the
    config's release, a diff file that is missing or changes what no patch may)."""
    from patchbench import patchset

    problems = []
    for variant, spec in cfg.variants.items():
        key = (
            ("variants", variant, "patches")
            if _line_of(text, ("variants", variant, "patches"))
            else ("variants", variant)
        )
        for i, p in enumerate(spec.patches):
            where = _line_of(text, key + (i,)) or _line_of(text, ("variants", variant))
            at = f"{path}:{where or ''}: variants.{variant}.patches[{i}]"
            if isinstance(p, str):
                d = PATCHES_DIR / p
                if not (d / "manifest.yaml").is_file():
                    have = patchset.available_patches()
                    problems.append(
                        f"{at}: patch '{p}' not found (expected {d}/manifest.yaml); "
                        f"available: {', '.join(have) or 'none'}"
                    )
                    continue
                try:
                    patchset.load_manifest(p).release(cfg.sglang)
                except patchset.PatchError as e:
                    problems.append(f"{at}: {e}")
            else:
                f = cfg.resolve_path(p.diff)
                if f.is_dir():
                    problems.append(f"{at}: diff {f} is a directory, not a diff file")
                elif not f.is_file():
                    problems.append(
                        f"{at}: diff file {f} does not exist (relative paths resolve "
                        f"against {REPO_ROOT})"
                    )
                else:
                    try:
                        patchset.inspect_diff(
                            read_text_file(f, patchset.PatchError, "diff file"), source=str(f)
                        )
                    except patchset.PatchError as e:
                        problems.append(f"{at}: {e}")
    return problems
