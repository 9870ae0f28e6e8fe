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
      args: ["--device", "cpu", ...]    # passed to sglang.launch_server unchanged
      env: {SGLANG_USE_CPU_ENGINE: "1"}
      cpu_stand_ins: [sgl_kernel, vllm] # stand-ins from patchbench/shims/cpu (CPU configs only)
      mrope_probe: false                # count/cross-check mrope computations in the server
      ready_timeout_s: 300
      stop_grace_s: 20
      flush_retries: 5
      flush_pause_s: 1.0
    variants:                           # name -> list of patches (folders in patches/)
      baseline: []
      mrope-sync-free: [mrope-sync-free]
    baseline: baseline                  # defaults to the first variant
    schedule:
      repeats: 2
      order: interleaved                # interleaved (ABBA...) | sequential
    suites:                             # run in this order in every cell; params per suite
      sync_probe: {}
      mmmu: {...}
      serving: {...}
    compare: {...}                      # patchbench.compare.CompareSettings
    nightly: {...}                      # patchbench.nightly.NightlySettings (gates)

Errors: :class:`ConfigError`, whose message names the file, the key path, the line where the
YAML parser knows it, what was found and what is allowed.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from patchbench.suite import SUITES, suite_params_model

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES_DIR = REPO_ROOT / "patches"
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_hub_id(p: str) -> bool:
    """True for a model-hub id such as ``Qwen/Qwen2.5-VL-3B-Instruct`` (``org/name``, not a path
    that starts with ``.``, ``/``, ``~`` or ``$``)."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", p))


class ConfigError(ValueError):
    """A config that cannot be used; the message names file, key, line and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    cpu_stand_ins: list[str] = Field(default_factory=list, description=(
        "import-time stand-ins put on the server's PYTHONPATH for a machine without an NVIDIA "
        "GPU (folders of patchbench/shims/cpu: sgl_kernel, vllm); any call into one fails the cell"))
    mrope_probe: bool = Field(False, description=(
        "count the server's mrope position computations per forward mode and cross-check each "
        "against the stock method (patchbench/shims/site/patchbench_mrope_instr.py)"))
    ready_timeout_s: float = Field(600.0, gt=0)
    stop_grace_s: float = Field(20.0, gt=0)
    port_close_timeout_s: float = Field(30.0, gt=0)
    flush_retries: int = Field(5, ge=1)
    flush_pause_s: float = Field(1.0, ge=0)

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
    def _no_owned_args(cls, v: list[str]) -> list[str]:
        owned = {"--model-path", "--model", "--host", "--port"}
        bad = [a.split("=", 1)[0] for a in v if a.split("=", 1)[0] in owned]
        if bad:
            raise ValueError(f"{', '.join(bad)} are set by the harness from model.path and "
                             "server.host/port; remove them from server.args")
        return v


class ScheduleSpec(_Strict):
    """Repeats of all variants; interleaved = ABBA, BAAB, ... (each variant once per round)."""

    repeats: int = Field(1, ge=1, le=100)
    order: Literal["interleaved", "sequential"] = "interleaved"


class Config(_Strict):
    """A validated experiment config; see the module docstring for the YAML shape."""

    name: str
    sglang: str
    model: ModelSpec
    server: ServerSpec = Field(default_factory=ServerSpec)
    variants: dict[str, list[str]]
    baseline: str | None = None
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    suites: dict[str, dict[str, Any]] = Field(default_factory=dict)
    compare: dict[str, Any] = Field(default_factory=dict)
    nightly: dict[str, Any] = Field(default_factory=dict)
    description: str = ""

    # filled by load_config
    source: Path | None = Field(None, exclude=True)
    suite_params: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not VARIANT_NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names the run folder)")
        return v

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        if not v:
            raise ValueError("at least one variant is needed, e.g. {baseline: []}")
        for name in v:
            if not VARIANT_NAME.match(name):
                raise ValueError(f"variant name '{name}': use letters, digits, '.', '_', '-'")
        return v

    @model_validator(mode="after")
    def _baseline(self) -> "Config":
        if self.baseline is None:
            self.baseline = next(iter(self.variants))
        elif self.baseline not in self.variants:
            raise ValueError(f"baseline '{self.baseline}' is not a variant; variants: "
                             f"{', '.join(self.variants)}")
        return self

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

    def _ref(self, p: str) -> str:
        """A local folder as an absolute path; a hub id (``org/name``, no such local folder)
        unchanged, for sglang and transformers to find in the HF cache or on the hub."""
        local = self.resolve_path(p)
        if local.exists() or not is_hub_id(p):
            return str(local)
        return p

    @property
    def model_ref(self) -> str:
        """What ``--model-path`` gets: a local folder (absolute) or a hub id."""
        return self._ref(self.model.path)

    @property
    def tokenizer_ref(self) -> str:
        """The tokenizer's folder or hub id (defaults to the model's)."""
        return self._ref(self.model.tokenizer or self.model.path)

    def patches_of(self, variant: str) -> list[str]:
        return self.variants[variant]


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


def _format_errors(path: Path, text: str, err: ValidationError, prefix: tuple = ()) -> str:
    lines = []
    for e in err.errors():
        loc = prefix + tuple(e["loc"])
        key = ".".join(str(x) for x in loc) or "(top level)"
        where = _line_of(text, loc)
        at = f"{path}:{where}" if where else f"{path}"
        if e["type"] == "extra_forbidden":
            parent = _model_at(prefix + tuple(e["loc"][:-1]))
            allowed = f"; allowed keys: {', '.join(parent)}" if parent else ""
            lines.append(f"{at}: unknown key '{key}'{allowed}")
        elif e["type"] == "missing":
            lines.append(f"{at}: missing required key '{key}'")
        else:
            got = e.get("input")
            got_s = repr(got) if not isinstance(got, dict) else "a mapping"
            lines.append(f"{at}: key '{key}': {e['msg']} (got {got_s[:80]})")
    return "\n".join(lines)


def _model_at(loc: tuple) -> list[str]:
    """Allowed keys of the model at a key path (for 'unknown key' messages)."""
    model: Any = Config
    for key in loc:
        if isinstance(key, int):
            continue
        if model is Config and key == "suites":
            rest = [k for k in loc[1:] if not isinstance(k, int)]
            if not rest:
                return sorted(SUITES)
            if rest[0] not in SUITES:
                return []
            model = suite_params_model(rest[0])
            for k in rest[1:]:
                f = model.model_fields.get(k)
                ann = f.annotation if f else None
                if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                    return []
                model = ann
            return [k for k in model.model_fields]
        fields = getattr(model, "model_fields", None)
        if not fields or key not in fields:
            return []
        ann = fields[key].annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if model is None:
            return []
    return [k for k, f in model.model_fields.items() if not f.exclude]


def read_yaml_mapping(path: Path, error: type[Exception], keys: str) -> tuple[str, dict]:
    """Text and parsed top-level mapping of a YAML file (configs, patch manifests).

    Raises ``error`` naming the file when it is not valid YAML or its top level is not a mapping
    (``keys`` lists what the top level should hold).
    """
    text = path.read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: the top level must be a mapping with keys {keys} "
                    f"(got {type(raw).__name__})")
    return text, raw


def load_config(path: str | os.PathLike, *, check_files: bool = True) -> Config:
    """Load and validate a YAML config.

    Validates the top level, every suite's parameters against the suite's ``Params``, the
    ``compare`` and ``nightly`` sections against their models, and (``check_files``) that every
    named patch exists as ``patches/<name>/`` with a manifest.

    Returns a :class:`Config` whose ``suite_params`` holds the validated suite models.
    Raises :class:`ConfigError` naming the file, key and line for any problem.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    text, raw = read_yaml_mapping(path, ConfigError, "name, sglang, model, variants, suites, ...")
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_errors(path, text, e)) from None
    cfg.source = path.resolve()
    problems: list[str] = []
    for name, params in cfg.suites.items():
        if name not in SUITES:
            where = _line_of(text, ("suites", name))
            problems.append(f"{path}:{where or ''}: unknown suite '{name}' under suites; "
                            f"allowed: {', '.join(sorted(SUITES))}")
            continue
        model = suite_params_model(name)
        try:
            cfg.suite_params[name] = model.model_validate(params or {})
        except ValidationError as e:
            msg = _format_errors(path, text, e, ("suites", name))
            allowed = ", ".join(model.model_fields)
            problems.append(msg if "allowed keys:" in msg  # an unknown key lists them already
                            else f"{msg}\n  (suite '{name}' accepts: {allowed})")
    for section, modname, clsname in (("compare", "patchbench.compare", "CompareSettings"),
                                      ("nightly", "patchbench.nightly", "NightlySettings")):
        model = _optional_model(modname, clsname)
        if model is None:
            continue
        try:
            model.model_validate(getattr(cfg, section) or {})
        except ValidationError as e:
            problems.append(_format_errors(path, text, e, (section,)))
    if check_files:
        for variant, patches in cfg.variants.items():
            for i, p in enumerate(patches):
                d = PATCHES_DIR / p
                if not (d / "manifest.yaml").is_file():
                    where = _line_of(text, ("variants", variant, i))
                    have = sorted(x.name for x in PATCHES_DIR.iterdir() if (x / "manifest.yaml").is_file()) \
                        if PATCHES_DIR.is_dir() else []
                    problems.append(f"{path}:{where or ''}: variants.{variant}[{i}]: patch '{p}' not "
                                    f"found (expected {d}/manifest.yaml); available: "
                                    f"{', '.join(have) or 'none'}")
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


def _optional_model(modname: str, clsname: str) -> type[BaseModel] | None:
    import importlib
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name == modname:
            return None
        raise
    return getattr(mod, clsname, None)
