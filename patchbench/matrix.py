"""A matrix of whole A/B runs ("units"), run one after another here or as Ray tasks on a cluster.

The unit of work is one whole ``bench`` run (every variant and repeat of one config, interleaved,
on one node): the arms of one comparison are never split across machines. Different models, pins,
server arguments or GPU types are different units.

Matrix file (YAML, validated like a config: every error names the file, the key and the line)::

    name: qwen-sizes                      # names the matrix run folder
    base: configs/pr9460-h200.yaml        # relative paths resolve against the repo root
    axes:                                 # dotted config keys -> values; every combination is a unit
      model.path: [Qwen/Qwen2.5-VL-3B-Instruct, Qwen/Qwen2.5-VL-7B-Instruct]
      sglang: ["0.5.1.post3", "0.5.23"]
      gpu_type: [H100, H200]              # not a config key: routes the unit (Ray accelerator_type)
    set: {schedule.repeats: 3}            # dotted keys set in every unit
    exclude:                              # combinations to leave out (every key given must match)
      - {model.path: Qwen/Qwen2.5-VL-7B-Instruct, gpu_type: H100}
    resources: {num_gpus: node, num_cpus: node}   # per unit; "node": every GPU/CPU of the node

or an explicit list instead of ``base``/``axes``::

    units:
      - {config: configs/pr9460-h200.yaml, gpu_type: H200}
      - {config: configs/aa-h200.yaml, gpu_type: H200, set: {schedule.repeats: 4}}

Each unit has a stable id: a readable slug of what distinguishes it plus 8 hex digits of the
sha256 of those values (``qwen2.5-vl-3b-instruct_h200-1a2b3c4d``); the same matrix gives the same
ids on every run. Every unit's merged config is validated through :func:`patchbench.config.
load_config`; an error names the unit and points at the matrix line that set the key, or at the
base config's line.

Matrix run folder::

    results/<UTC stamp>-<name>/
      matrix.json                 units (id, labels, gpu type, status, exit code, message, node,
                                  timings), the matrix file, executor, start/end
      configs/<unit id>.yaml      each unit's merged config (what its bench ran)
      <unit id>/                  that unit's bench run folder (manifest.json, compare.json, report.md, ...)
      report.md  plots/matrix-effect.png   (patchbench.matrix_report)

Executors (:class:`Executor`): :class:`LocalExecutor` runs the units one after another (no Ray);
:class:`RayExecutor` submits one Ray task per unit (``num_gpus``, ``accelerator_type:<T>``
resource, ``max_retries=0``). Both run the same :func:`execute_unit`: set up the pin's
environment, run ``patchbench bench`` in a subprocess in its own session, stop the server's
process group whatever happens, and hand back the run folder (moved into place locally, a
gzip'd tar through the object store on Ray). Ray is imported only by :class:`RayExecutor`.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import fcntl
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from patchbench.config import load_config
from patchbench.errors import ConfigError, EnvironmentNotReady, Interrupted, RunFailed, UsageError
from patchbench.inputs import FOLDER_NAME, REPO_ROOT, RESULTS_DIR, line_of, read_yaml_mapping
from patchbench.records import read_json, write_json, write_text

MATRIX_SCHEMA = 1
#: the special axis that routes a unit instead of setting a config key
GPU_AXIS = "gpu_type"
#: what ``runtime_env.working_dir`` leaves out when the repo is shipped to Ray nodes
SHIP_EXCLUDES = [
    ".venv",
    ".venv-*",
    "results",
    ".cache",
    ".git",
    "*.egg-info",
    "__pycache__",
    "build",
]
#: where nodes keep one environment per pin, reused across units and jobs
DEFAULT_ENV_ROOT = "~/.cache/patchbench/envs"
#: the bench command a unit runs; {python}, {config}, {results} are filled in
DEFAULT_COMMAND = ("{python}", "-m", "patchbench", "bench", "{config}", "--results", "{results}")
RAY_HINT = "install it with `pip install .[ray]` or `make setup RAY=1`"

Status = Literal[
    "pending", "ok", "failed", "error", "lost", "cancelled", "interrupted", "unschedulable"
]


def _log(msg: str) -> None:
    print(f"[patchbench matrix {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


# --------------------------------------------------------------------------- the matrix file
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Resources(_Strict):
    """What one unit asks of a node: ``num_gpus``/``num_cpus`` a count, or "node" (every GPU/CPU
    of the smallest node that can take the unit: a timing run owns its node)."""

    num_gpus: int | float | Literal["node"] = "node"
    num_cpus: int | float | Literal["node"] = "node"

    @field_validator("num_gpus", "num_cpus")
    @classmethod
    def _positive(cls, v):
        if not isinstance(v, str) and v < 0:
            raise ValueError('must be >= 0 or "node"')
        return v


class UnitEntry(_Strict):
    """One explicit unit: a config file, the GPU type it runs on, dotted keys set on top."""

    config: str
    gpu_type: str | None = None
    set: dict[str, Any] = Field(default_factory=dict)


class MatrixSpec(_Strict):
    """The validated matrix file (see the module docstring)."""

    name: str
    description: str = ""
    base: str | None = None
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    set: dict[str, Any] = Field(default_factory=dict)
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    units: list[UnitEntry] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not FOLDER_NAME.match(v):
            raise ValueError(
                "use letters, digits, '.', '_' and '-' (it names the matrix run folder)"
            )
        return v


@dataclass
class Unit:
    """One expanded unit.

    ``id``: stable id; ``labels``: what distinguishes it ({axis or "config": value}, shown in the
    report); ``gpu_type``: the Ray ``accelerator_type`` it needs (None: any node);
    ``overrides``: {dotted key: value} set on its config (axes and ``set``); ``config_path``:
    the base or listed config; ``config_text``: the merged YAML; ``sglang``: its pin;
    ``config``: the validated :class:`patchbench.config.Config`.
    """

    id: str
    labels: dict[str, Any]
    gpu_type: str | None
    overrides: dict[str, Any]
    config_path: Path
    config_text: str
    sglang: str
    config: Any = field(repr=False, default=None)


@dataclass
class Matrix:
    """A loaded matrix: ``path`` (the file), ``spec`` (:class:`MatrixSpec`), ``units``."""

    path: Path
    spec: MatrixSpec
    units: list[Unit]


def _slug_part(v: Any) -> str:
    if isinstance(v, str):
        s = v.rstrip("/").rsplit("/", 1)[-1] if ("/" in v and not v.startswith("-")) else v
    elif isinstance(v, (list, tuple)):
        s = "-".join(_slug_part(x) for x in v) or "none"
    elif isinstance(v, dict):
        s = "-".join(f"{k}-{_slug_part(x)}" for k, x in v.items()) or "none"
    elif v is None:
        s = "none"
    else:
        s = str(v).lower()
    s = re.sub(r"[^a-z0-9.]+", "-", s.lower()).strip("-.")
    return s[:24].strip("-.") or "x"


def unit_id(labels: dict[str, Any]) -> str:
    """The stable id of a unit from what distinguishes it: ``<slug>-<8 hex>``.

    ``labels``: {axis or "config": value} (JSON values). The slug (at most 60 characters) is made
    of the values in the order given; the hash is the sha256 of the canonical JSON of ``labels``
    (sorted keys), so the id changes exactly when a distinguishing value changes.
    """
    canon = json.dumps(
        labels, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str
    )
    h = hashlib.sha256(canon.encode()).hexdigest()[:8]
    slug = "_".join(_slug_part(v) for v in labels.values())[:60].strip("_-.") or "unit"
    return f"{slug}-{h}"


def _split_key(key: str) -> list[str]:
    return key.split(".")


def set_dotted(raw: dict, key: str, value: Any) -> None:
    """Set ``key`` (``a.b.c``) in the nested mapping ``raw``, creating mappings on the way.

    Raises ValueError when a part on the way holds something other than a mapping.
    """
    parts = _split_key(key)
    if any(not p for p in parts):
        raise ValueError(f"'{key}' is not a dotted key (empty part)")
    node = raw
    for i, p in enumerate(parts[:-1]):
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        elif not isinstance(nxt, dict):
            raise ValueError(
                f"'{'.'.join(parts[: i + 1])}' holds {type(nxt).__name__}, not a "
                f"mapping, so '{key}' cannot be set"
            )
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)


def _resolve(p: str) -> Path:
    q = Path(os.path.expanduser(p))
    return q if q.is_absolute() else REPO_ROOT / q


def _key_at_line(text: str, line: int) -> tuple:
    """The key path whose key (or list item) starts on ``line`` (1-based) of a YAML text."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return ()
    best: tuple = ()

    def walk(node, path):
        nonlocal best
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                p = path + (k.value,)
                if k.start_mark.line + 1 == line and len(p) > len(best):
                    best = p
                walk(v, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                p = path + (i,)
                if v.start_mark.line + 1 == line and len(p) > len(best):
                    best = p
                walk(v, p)

    walk(root, ())
    return best


def is_matrix_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is a YAML mapping with ``axes``, ``units`` or ``base`` at the top and no
    ``variants`` (a matrix file rather than a config: how ``nightly`` can tell them apart).
    Raises ConfigError for an unreadable or invalid YAML file (naming it)."""
    _, raw = read_yaml_mapping(Path(path), ConfigError, "a config or a matrix", "config file")
    return "variants" not in raw and any(k in raw for k in ("axes", "units", "base"))


def load_matrix(path: str | os.PathLike) -> Matrix:
    """Load, expand and validate a matrix file.

    Returns a :class:`Matrix` whose units are in file order (axes: the first axis varies
    slowest). Raises :class:`patchbench.errors.ConfigError` (exit 2) naming the file, key and
    line for a bad matrix file (unknown key, wrong type, empty or duplicate axis values, both or
    neither of ``axes``/``units``, an ``exclude`` entry that matches nothing, a key that cannot be
    set), and naming the unit plus the matrix or base config line for a unit whose merged config
    does not validate (every problem of every unit is listed).
    """
    path = Path(path)
    text, raw = read_yaml_mapping(path, ConfigError, "name, base, axes, set, units, ...")
    where = lambda *loc: f"{path}:{line_of(text, loc) or ''}"  # noqa: E731
    try:
        spec = MatrixSpec.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and "[" in x))
            key = ".".join(str(x) for x in loc) or "(top level)"
            if err["type"] == "extra_forbidden":
                model = (
                    MatrixSpec
                    if len(loc) == 1
                    else (UnitEntry if loc[:1] == ("units",) else Resources)
                )
                lines.append(
                    f"{where(*loc)}: unknown key '{key}'; allowed keys: "
                    f"{', '.join(model.model_fields)}"
                )
            elif err["type"] == "missing":
                lines.append(f"{where(*loc)}: missing required key '{key}'")
            else:
                got = err.get("input")
                lines.append(
                    f"{where(*loc)}: key '{key}': {err['msg'].removeprefix('Value error, ')}"
                    f" (got {repr(got)[:80] if not isinstance(got, dict) else 'a mapping'})"
                )
        raise ConfigError("\n".join(dict.fromkeys(lines))) from None
    problems: list[str] = []
    if spec.units and (spec.base or spec.axes):
        problems.append(f"{where('units')}: give either base/axes or units, not both")
    if not spec.units and not spec.base:
        problems.append(
            f"{path}: give a base config with axes, or a list of units "
            "(see `units:` / `base:` in docs/scale-out.md)"
        )
    if spec.axes and not spec.base:
        problems.append(f"{where('axes')}: axes need a base config (base: configs/....yaml)")
    for key, values in spec.axes.items():
        if not values:
            problems.append(f"{where('axes', key)}: axes.{key}: give at least one value")
        canon = [json.dumps(v, sort_keys=True, default=str) for v in values]
        for i, c in enumerate(canon):
            if c in canon[:i]:
                problems.append(
                    f"{where('axes', key, i)}: axes.{key}[{i}]: {values[i]!r} is listed twice"
                )
        if key == GPU_AXIS and not all(isinstance(v, str) and v for v in values):
            problems.append(
                f"{where('axes', key)}: axes.{key}: GPU types are names such as H200 "
                "(Ray's accelerator_type)"
            )
    if GPU_AXIS in spec.set:
        problems.append(
            f"{where('set', GPU_AXIS)}: set.{GPU_AXIS}: the GPU type is an axis or a "
            "unit's gpu_type, not a config key"
        )
    for i, ex in enumerate(spec.exclude):
        for k, v in ex.items():
            if k not in spec.axes:
                problems.append(
                    f"{where('exclude', i, k)}: exclude[{i}].{k}: not an axis "
                    f"(axes: {', '.join(spec.axes) or 'none'})"
                )
            elif v not in spec.axes[k]:
                problems.append(
                    f"{where('exclude', i, k)}: exclude[{i}].{k}: {v!r} is not one of "
                    f"axes.{k}'s values"
                )
    if problems:
        raise ConfigError("\n".join(problems))

    # expand: (config path, labels, gpu_type, overrides, {dotted key: matrix line})
    plans: list[tuple[Path, dict, str | None, dict, dict]] = []
    set_lines = {k: where("set", k) for k in spec.set}
    if spec.base:
        base = _resolve(spec.base)
        keys = list(spec.axes)
        used_ex = set()
        for combo in itertools.product(*(range(len(spec.axes[k])) for k in keys)):
            labels = {k: spec.axes[k][i] for k, i in zip(keys, combo, strict=True)}
            hit = [
                j
                for j, ex in enumerate(spec.exclude)
                if all(labels.get(k) == v for k, v in ex.items())
            ]
            if hit:
                used_ex.update(hit)
                continue
            overrides = {**spec.set, **{k: v for k, v in labels.items() if k != GPU_AXIS}}
            lines = {
                **set_lines,
                **{k: where("axes", k, i) for k, i in zip(keys, combo, strict=True)},
            }
            plans.append((base, labels, labels.get(GPU_AXIS), overrides, lines))
        for j in range(len(spec.exclude)):
            if j not in used_ex:
                problems.append(f"{where('exclude', j)}: exclude[{j}] matches no combination")
        if problems:
            raise ConfigError("\n".join(problems))
    else:
        for i, u in enumerate(spec.units):
            labels: dict[str, Any] = {"config": u.config}
            if u.gpu_type:
                labels[GPU_AXIS] = u.gpu_type
            if u.set:
                labels["set"] = u.set
            lines = {**set_lines, **{k: where("units", i, "set", k) for k in u.set}}
            plans.append((_resolve(u.config), labels, u.gpu_type, {**spec.set, **u.set}, lines))

    units: list[Unit] = []
    seen: dict[str, int] = {}
    base_cache: dict[Path, tuple[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="patchbench-matrix-") as tmp:
        for n, (cfg_path, labels, gpu, overrides, lines) in enumerate(plans):
            uid = unit_id(labels)
            if uid in seen:
                problems.append(
                    f"{path}: units {seen[uid] + 1} and {n + 1} are the same "
                    f"({uid}); list each combination once"
                )
                continue
            seen[uid] = n
            if cfg_path not in base_cache:
                try:
                    base_cache[cfg_path] = read_yaml_mapping(
                        cfg_path,
                        ConfigError,
                        "name, sglang, model, variants, suites, ...",
                        "config file",
                    )
                except ConfigError as e:
                    key = ("base",) if spec.base else ("units", n, "config")
                    problems.append(f"{where(*key)}: {e}")
                    base_cache[cfg_path] = ("", {})
                    continue
            base_text, base_raw = base_cache[cfg_path]
            if not base_raw:
                continue
            merged = copy.deepcopy(base_raw)
            bad = False
            for k, v in overrides.items():
                try:
                    set_dotted(merged, k, v)
                except ValueError as e:
                    problems.append(f"{lines.get(k, path)}: unit {uid}: {e}")
                    bad = True
            if bad:
                continue
            unit_text = (
                f"# patchbench matrix unit {uid}: {cfg_path} with "
                f"{json.dumps(overrides, default=str)}\n"
                + yaml.safe_dump(
                    merged, sort_keys=False, allow_unicode=True, default_flow_style=False
                )
            )
            tmp_cfg = Path(tmp) / f"{uid}.yaml"
            tmp_cfg.write_text(unit_text, encoding="utf-8")
            try:
                cfg = load_config(tmp_cfg)
            except ConfigError as e:
                problems.append(
                    _unit_problem(
                        str(e),
                        tmp_cfg,
                        unit_text,
                        uid,
                        labels,
                        overrides,
                        lines,
                        cfg_path,
                        base_text,
                    )
                )
                continue
            units.append(Unit(uid, labels, gpu, overrides, cfg_path, unit_text, cfg.sglang, cfg))
    if problems:
        raise ConfigError("\n".join(problems))
    if not units:
        raise ConfigError(f"{path}: the matrix has no units")
    return Matrix(path, spec, units)


def _unit_problem(
    msg: str,
    tmp_cfg: Path,
    unit_text: str,
    uid: str,
    labels: dict,
    overrides: dict,
    lines: dict,
    cfg_path: Path,
    base_text: str,
) -> str:
    """Rewrite load_config's message about a merged unit config: each ``TMP:LINE:`` prefix
    becomes the matrix line that set the key (axes/set) or the base config's line."""
    shown = ", ".join(f"{k}={v}" for k, v in labels.items())
    out = []
    pat = re.compile(re.escape(str(tmp_cfg)) + r":(\d*):?\s*")
    for line in msg.splitlines():
        m = pat.match(line)
        if not m:
            quoted = next(
                (
                    k
                    for k in sorted(overrides, key=len, reverse=True)
                    if f"'{k}'" in line or f"'{k.split('.')[0]}'" in line
                ),
                None,
            )
            text = line.replace(str(tmp_cfg), str(cfg_path))
            if quoted is not None:
                text = f"{lines.get(quoted, '')} (set by the matrix: {quoted}): " + text
            out.append("  " + text)
            continue
        rest = line[m.end() :]
        loc = _key_at_line(unit_text, int(m.group(1))) if m.group(1) else ()
        dotted = ".".join(str(x) for x in loc)
        src = next(
            (
                k
                for k in sorted(overrides, key=len, reverse=True)
                if dotted == k
                or dotted.startswith(k + ".")
                or (dotted and k.startswith(dotted + "."))
            ),
            None,
        )
        if src is None and not loc:
            # a message without a line (e.g. an unknown top-level key): the key it quotes
            src = next(
                (
                    k
                    for k in sorted(overrides, key=len, reverse=True)
                    if f"'{k}'" in rest or f"'{k.split('.')[0]}'" in rest
                ),
                None,
            )
        if src is not None:
            at = f"{lines.get(src, '')} (set by the matrix: {src})"
        else:
            bl = line_of(base_text, loc) if loc else None
            at = f"{cfg_path}:{bl or ''}"
        out.append(f"  {at}: {rest}")
    return f"unit {uid} ({shown}): its config does not validate:\n" + "\n".join(out)


def describe_matrix(m: Matrix, resume: str | os.PathLike | None = None) -> str:
    """The units of a matrix, one line each (id, GPU type, pin, what is set), for ``--dry-run``;
    with ``resume`` (a matrix run folder) each unit says whether it is done."""
    done = _done_units(Path(resume)) if resume else set()
    res = m.spec.resources
    lines = [
        f"matrix     {m.path}",
        f"name       {m.spec.name}",
        f"units      {len(m.units)} (resources per unit: num_gpus={res.num_gpus}, "
        f"num_cpus={res.num_cpus})",
    ]
    for u in m.units:
        mark = " (done)" if u.id in done else ""
        sets = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in u.overrides.items())
        lines.append(
            f"  {u.id}{mark}: gpu_type={u.gpu_type or 'any'} sglang={u.sglang} "
            f"config={u.config_path.name}{' ' + sets if sets else ''}"
        )
    if resume:
        lines.append(
            f"{sum(u.id in done for u in m.units)} of {len(m.units)} units done, "
            f"{sum(u.id not in done for u in m.units)} to run"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- one unit, anywhere
def _node_name() -> str:
    return socket.gethostname()


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to send SIGTERM to this process when its parent (the unit's worker) dies, so a
    force-killed Ray worker still makes bench stop its server."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def pin_venv(workdir: Path, pin: str) -> Path:
    """The venv ``make setup SGLANG=<pin>`` makes inside a checkout (the Makefile's VENV rule:
    ``.venv`` for 0.5.1.post3, ``.venv-<pin>`` otherwise)."""
    return workdir / (".venv" if pin == "0.5.1.post3" else f".venv-{pin}")


def _installed_sglang(python: str) -> str | None:
    try:
        out = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def prepare_python(spec: dict, workdir: Path, log_file) -> str:
    """The python that runs a unit's bench, setting up its pin's environment first.

    ``spec["env_setup"]``: "current" (this interpreter), "auto" (this interpreter when its sglang
    is the unit's pin, else ``make setup SGLANG=<pin>`` into the checkout's venv for the pin),
    "make" (``make setup SGLANG=<pin> VENV=<env_root>/sglang-<pin>``: a persistent venv per pin on
    the node, outside the shipped working directory, reused by every unit and job; then this
    checkout is installed into it when it is not the one installed). ``make setup`` is idempotent;
    a file lock keeps two units on one node from setting up the same venv at once. Raises
    EnvironmentNotReady with the setup output's tail when setup fails.
    """
    mode, pin = spec.get("env_setup", "current"), spec["sglang"]
    if mode == "current":
        return sys.executable
    if mode == "auto":
        if _installed_sglang(sys.executable) == pin:
            return sys.executable
        venv = pin_venv(workdir, pin)
    elif mode == "make":
        root = Path(os.path.expanduser(spec.get("env_root") or DEFAULT_ENV_ROOT))
        venv = root / f"sglang-{pin}"
    else:
        raise UsageError(f"env_setup must be current, auto or make, not {mode!r}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock = venv.parent / f".lock-sglang-{pin}"
    with open(lock, "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        cmd = ["make", "-C", str(workdir), "setup", f"SGLANG={pin}", f"VENV={venv}"]
        log_file.write(f"$ {' '.join(cmd)}\n")
        log_file.flush()
        r = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        python = str(venv / "bin" / "python")
        if r.returncode == 0 and mode == "make":
            where = subprocess.run(
                [
                    python,
                    "-c",
                    "import patchbench, pathlib; "
                    "print(pathlib.Path(patchbench.__file__).resolve().parent.parent)",
                ],
                capture_output=True,
                text=True,
            )
            if where.stdout.strip() != str(workdir.resolve()):
                r = subprocess.run(
                    [
                        python,
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "--progress-bar",
                        "off",
                        "--no-deps",
                        "-e",
                        str(workdir),
                    ],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
    if r.returncode != 0:
        log_file.flush()
        raise EnvironmentNotReady(
            f"setting up sglang {pin} on {_node_name()} failed "
            f"(exit {r.returncode}): " + _tail(Path(log_file.name), 5).replace("\n", " | ")
        )
    return python


def _tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop_leftover_servers(run_dir: Path | None) -> list[int]:
    """Stop any server group a cell of ``run_dir`` still records as running whose runner is gone
    (patchbench.stale); returns the pgids stopped."""
    if run_dir is None or not run_dir.is_dir():
        return []
    from patchbench import stale

    found = stale.find_stale_servers(run_dir)
    if found:
        stale.kill_stale(found)
    return [s.pgid for s in found]


def _stop_bench(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to bench's group (bench stops its server and exits 143), SIGKILL after
    ``grace_s``."""
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _run_folder(results: Path, resume_dir: Path | None) -> Path | None:
    if resume_dir is not None:
        return resume_dir if resume_dir.is_dir() else None
    found = sorted(d for d in results.glob("*") if d.is_dir()) if results.is_dir() else []
    return found[-1] if found else None


def pack_folder(folder: Path) -> bytes:
    """A gzip'd tar of ``folder``'s contents (member names relative to it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        tar.add(str(folder), arcname=".")
    return buf.getvalue()


def unpack_folder(data: bytes, dest: Path) -> None:
    """Unpack :func:`pack_folder`'s bytes into ``dest`` (replaced as a whole: unpacked next to it,
    then renamed into place). Members that would land outside ``dest``, links and devices are
    refused (tarfile's "data" filter)."""
    dest = Path(dest)
    tmp = dest.parent / f".{dest.name}.unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(tmp, filter="data")
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def execute_unit(spec: dict) -> dict:
    """Run one unit's bench here; the body of both executors (a Ray task calls it on its node).

    ``spec``: {"id", "config_text", "sglang", "env_setup", "env_root", "command" (list with
    {python}/{config}/{results}), "workdir" (None: this checkout; "cwd": Ray's shipped working
    directory), "resume_dir" (local) or "resume_archive" (bytes) to continue a unit's run folder,
    "out_dir" (local: move the run folder there) or none (return it as ``archive``),
    "stop_grace_s", "env" (extra environment for bench)}.

    Returns {"exit_code", "message" (bench's last error line), "log_tail", "node", "archive"
    (bytes or None), "archive_bytes", "has_folder", "timings_s": {"env", "bench", "pack"},
    "started_at"/"ended_at" (epoch s)}. Bench runs in its own session; when this function is
    interrupted (Ctrl-C, a Ray cancellation) it sends bench SIGTERM (bench stops its server's
    group and keeps its cells), SIGKILLs it after ``stop_grace_s``, stops any server group left
    behind, moves a local run folder into place, then re-raises. A server group left by a bench
    that ended any other way is stopped too.
    """
    started = time.time()
    workdir = (
        Path.cwd()
        if spec.get("workdir") == "cwd"
        else Path(spec["workdir"])
        if spec.get("workdir")
        else REPO_ROOT
    )
    tmp = Path(tempfile.mkdtemp(prefix=f"patchbench-unit-{spec['id']}-"))
    out: dict[str, Any] = {
        "node": _node_name(),
        "archive": None,
        "archive_bytes": 0,
        "has_folder": False,
        "started_at": started,
        "timings_s": {},
    }
    log_path = tmp / "bench.log"
    run_dir: Path | None = None
    try:
        cfg = tmp / f"{spec['id']}.yaml"
        cfg.write_text(spec["config_text"], encoding="utf-8")
        results = tmp / "results"
        results.mkdir()
        resume_dir = Path(spec["resume_dir"]) if spec.get("resume_dir") else None
        if spec.get("resume_archive"):
            resume_dir = tmp / "resume" / spec["id"]
            resume_dir.parent.mkdir()
            unpack_folder(spec["resume_archive"], resume_dir)
        with open(log_path, "w") as log:
            t0 = time.monotonic()
            try:
                python = prepare_python(spec, workdir, log)
            except EnvironmentNotReady as e:
                out.update(exit_code=e.exit_code, message=str(e), log_tail=_tail(log_path))
                return out
            out["timings_s"]["env"] = round(time.monotonic() - t0, 3)
            fill = {"python": python, "config": str(cfg), "results": str(results)}
            cmd = [a.format(**fill) for a in spec.get("command") or DEFAULT_COMMAND]
            if resume_dir is not None:
                cmd += ["--resume", str(resume_dir)]
            env = {**os.environ, **(spec.get("env") or {})}
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            t0 = time.monotonic()
            proc = subprocess.Popen(
                cmd,
                cwd=str(workdir),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_pdeathsig,
            )
            try:
                while proc.poll() is None:  # short waits: a Ray cancellation lands between them
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.2)
            except BaseException:
                _stop_bench(proc, float(spec.get("stop_grace_s", 60)))
                run_dir = _run_folder(results, resume_dir)
                _stop_leftover_servers(run_dir)
                if spec.get("out_dir") and run_dir is not None:
                    _move_into(run_dir, Path(spec["out_dir"]))
                raise
            out["timings_s"]["bench"] = round(time.monotonic() - t0, 3)
        run_dir = _run_folder(results, resume_dir)
        _stop_leftover_servers(run_dir)
        out["exit_code"] = proc.returncode
        out["log_tail"] = _tail(log_path)
        out["message"] = _error_line(out["log_tail"]) if proc.returncode else ""
        if run_dir is not None and (run_dir / "manifest.json").exists():
            out["has_folder"] = True
            t0 = time.monotonic()
            if spec.get("out_dir"):
                _move_into(run_dir, Path(spec["out_dir"]))
            else:
                out["archive"] = pack_folder(run_dir)
                out["archive_bytes"] = len(out["archive"])
            out["timings_s"]["pack"] = round(time.monotonic() - t0, 3)
        return out
    finally:
        out["ended_at"] = time.time()
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into(run_dir: Path, dest: Path) -> None:
    if run_dir.resolve() == dest.resolve():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.move(str(run_dir), str(dest))


def _error_line(tail: str) -> str:
    """bench's one-line error (``patchbench bench: ...``), else the last non-empty line."""
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("patchbench", "error")):
            return ln[:500]
    return lines[-1][:500] if lines else ""


# --------------------------------------------------------------------------- executors
@dataclass
class UnitResult:
    """What the driver records for one unit (``matrix.json``'s ``units[]``)."""

    id: str
    status: Status = "pending"
    exit_code: int | None = None
    message: str = ""
    node: str | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    archive_bytes: int = 0


class Executor:
    """Runs units. ``run(units, matrix_dir, record)`` calls ``record(UnitResult)`` as each unit
    ends (the driver writes matrix.json there) and returns when all have ended; on Ctrl-C it stops
    what runs, records it, and re-raises KeyboardInterrupt. ``check(units)`` -> {unit id: why
    no node can take it} before anything runs. ``name``: "local" or "ray"."""

    name = "?"

    def check(self, units: list[Unit]) -> dict[str, str]:
        return {}

    def run(
        self,
        units: list[Unit],
        matrix_dir: Path,
        record: Callable[[UnitResult], None],
        resume: set[str],
    ) -> None:
        raise NotImplementedError


def _unit_spec(u: Unit, matrix_dir: Path, opts: dict) -> dict:
    return {
        "id": u.id,
        "config_text": u.config_text,
        "sglang": u.sglang,
        "env_setup": opts.get("env_setup"),
        "env_root": opts.get("env_root"),
        "command": list(opts["command"]) if opts.get("command") else None,
        "stop_grace_s": opts.get("stop_grace_s", 60),
        "env": opts.get("env") or {},
    }


def _result_of(uid: str, out: dict) -> UnitResult:
    code = out.get("exit_code")
    status: Status = (
        "ok"
        if code == 0
        else (
            "failed"
            if code == 4 and out.get("has_folder")
            else "interrupted"
            if code in (130, 143)
            else "error"
        )
    )
    t = dict(out.get("timings_s") or {})
    if out.get("ended_at") and out.get("started_at"):
        t["task"] = round(out["ended_at"] - out["started_at"], 3)
    return UnitResult(
        uid,
        status,
        code,
        out.get("message") or "",
        out.get("node"),
        t,
        int(out.get("archive_bytes") or 0),
    )


class LocalExecutor(Executor):
    """Runs the units one after another on this machine (no Ray). ``env_setup``: see
    :func:`prepare_python` ("auto" by default); ``command``: the bench command template
    (:data:`DEFAULT_COMMAND`); ``env``: extra environment for bench."""

    name = "local"

    def __init__(
        self,
        *,
        env_setup: str = "auto",
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        stop_grace_s: float = 60,
    ):
        self.opts = {
            "env_setup": env_setup,
            "command": command,
            "env": env,
            "stop_grace_s": stop_grace_s,
        }

    def run(self, units, matrix_dir, record, resume):
        for u in units:
            spec = _unit_spec(u, matrix_dir, self.opts)
            dest = matrix_dir / u.id
            spec["out_dir"] = str(dest)
            if u.id in resume:
                spec["resume_dir"] = str(dest)
            _log(f"unit {u.id}: running{' (resumed)' if u.id in resume else ''}")
            try:
                out = execute_unit(spec)
            except KeyboardInterrupt:
                record(
                    UnitResult(
                        u.id, "interrupted", 130, "interrupted; finished cells kept", _node_name()
                    )
                )
                raise
            res = _result_of(u.id, out)
            record(res)
            _log(f"unit {u.id}: {res.status}{': ' + res.message if res.message else ''}")


def _ray():
    try:
        import ray
    except ImportError:
        raise EnvironmentNotReady(
            f"--on ray needs the Ray package, which is not installed; {RAY_HINT}"
        ) from None
    return ray


def _ray_unit_task(spec: dict) -> dict:
    """The Ray task: :func:`execute_unit` on the node Ray picked; the node id is added."""
    import ray

    out = execute_unit(spec)
    out["node_id"] = ray.get_runtime_context().get_node_id()
    return out


class RayExecutor(Executor):
    """One Ray task per unit (``max_retries=0``: a benchmark is never silently re-run).

    ``address``: the cluster (None: Ray's default, RAY_ADDRESS or a local one); ``ship_code``:
    send this checkout as the job's ``working_dir`` (without venvs, results, caches; leave it
    False when every node already holds this checkout at the same path, as in a local cluster);
    ``env_setup``/``env_root``: see :func:`prepare_python` ("make" by default: a persistent venv
    per pin on each node); ``command``/``env``/``stop_grace_s``: as :class:`LocalExecutor`;
    ``cancel_wait_s``: how long Ctrl-C waits for cancelled units to stop their servers.
    Resources per unit come from the matrix (``resources``) and the unit's GPU type
    (``accelerator_type:<T>`` custom resource, which Ray sets on GPU nodes it recognises and
    ``ray start --resources`` can set by hand).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        resources: Resources | None = None,
        ship_code: bool = True,
        env_setup: str = "make",
        env_root: str | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        stop_grace_s: float = 60,
        cancel_wait_s: float = 90,
        log=_log,
    ):
        self.address = address
        self.resources = resources or Resources()
        self.ship_code = ship_code
        self.opts = {
            "env_setup": env_setup,
            "env_root": env_root,
            "command": command,
            "env": env,
            "stop_grace_s": stop_grace_s,
        }
        self.cancel_wait_s = cancel_wait_s
        self.log = log
        self._started = False

    def connect(self):
        """Connect to the cluster (once); returns the ray module."""
        ray = _ray()
        if not ray.is_initialized():
            kw: dict[str, Any] = {"address": self.address, "log_to_driver": False}
            if self.ship_code:
                kw["runtime_env"] = {"working_dir": str(REPO_ROOT), "excludes": SHIP_EXCLUDES}
            ray.init(**kw)
            self._started = True
        return ray

    def close(self) -> None:
        if self._started:
            _ray().shutdown()
            self._started = False

    def _requests(self, units: list[Unit]) -> tuple[dict[str, dict], dict[str, str]]:
        """{unit id: Ray options} for units some alive node can take, {unit id: why not} else."""
        ray = self.connect()
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        have = sorted(
            {k.split(":", 1)[1] for r in nodes for k in r if k.startswith("accelerator_type:")}
        )
        opts, bad = {}, {}
        for u in units:
            key = f"accelerator_type:{u.gpu_type}" if u.gpu_type else None
            cands = [r for r in nodes if key is None or r.get(key, 0) > 0]
            if not cands:
                bad[u.id] = (
                    f"no node of the cluster has GPU type {u.gpu_type} (resource {key}); "
                    f"types present: {', '.join(have) or 'none'}; start a node of that "
                    f"type or pass `--resources '{{\"{key}\": 1}}'` to its `ray start`"
                )
                continue
            want = {}
            for res, rkey in (("num_gpus", "GPU"), ("num_cpus", "CPU")):
                v = getattr(self.resources, res)
                if v == "node":
                    v = min(r.get(rkey, 0) for r in cands)
                want[res] = v
            fits = [
                r
                for r in cands
                if r.get("GPU", 0) >= want["num_gpus"] and r.get("CPU", 0) >= want["num_cpus"]
            ]
            if not fits:
                bad[u.id] = (
                    f"no node{' of type ' + u.gpu_type if u.gpu_type else ''} has "
                    f"{want['num_gpus']} GPUs and {want['num_cpus']} CPUs (nodes: "
                    + "; ".join(f"GPU {r.get('GPU', 0):g} CPU {r.get('CPU', 0):g}" for r in cands)
                    + ")"
                )
                continue
            o = {
                **want,
                "max_retries": 0,
                "retry_exceptions": False,
                "name": f"patchbench-unit-{u.id}",
            }
            if key:
                o["resources"] = {key: 0.001}
            opts[u.id] = o
        return opts, bad

    def check(self, units):
        return self._requests(units)[1]

    def run(self, units, matrix_dir, record, resume):
        ray = self.connect()
        opts, bad = self._requests(units)
        for uid, why in bad.items():
            record(UnitResult(uid, "unschedulable", None, why))
        task = ray.remote(_ray_unit_task)
        pending: dict[Any, tuple[Unit, float]] = {}
        for u in units:
            if u.id not in opts:
                continue
            spec = _unit_spec(u, matrix_dir, self.opts)
            spec["workdir"] = "cwd" if self.ship_code else None
            if u.id in resume and (matrix_dir / u.id / "manifest.json").exists():
                spec["resume_archive"] = pack_folder(matrix_dir / u.id)
            t0 = time.time()
            ref = task.options(**opts[u.id]).remote(spec)
            pending[ref] = (u, t0)
            self.log(
                f"unit {u.id}: submitted (gpu_type={u.gpu_type or 'any'}, "
                f"num_gpus={opts[u.id]['num_gpus']:g}, num_cpus={opts[u.id]['num_cpus']:g})"
            )
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    self._collect(ray, ref, *pending.pop(ref), matrix_dir, record)
        except KeyboardInterrupt:
            self.log(f"interrupted: cancelling {len(pending)} unit(s); finished units are kept")
            for ref in pending:
                ray.cancel(ref, force=False)
            deadline = time.time() + self.cancel_wait_s
            while pending and time.time() < deadline:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.5)
                for ref in ready:
                    self._collect(ray, ref, *pending.pop(ref), matrix_dir, record)
            for u, _ in pending.values():
                record(UnitResult(u.id, "cancelled", None, "cancelled before it ended"))
            raise

    def _collect(self, ray, ref, u: Unit, submitted: float, matrix_dir: Path, record) -> None:
        ready_at = time.time()
        t0 = time.monotonic()
        try:
            out = ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            record(UnitResult(u.id, "cancelled", None, "cancelled"))
            self.log(f"unit {u.id}: cancelled")
            return
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
            if isinstance(cause, (ray.exceptions.TaskCancelledError, KeyboardInterrupt)):
                record(UnitResult(u.id, "cancelled", None, "cancelled"))
                self.log(f"unit {u.id}: cancelled")
                return
            msg = f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
            record(UnitResult(u.id, "error", getattr(cause, "exit_code", None), msg))
            self.log(f"unit {u.id}: error: {msg}")
            return
        except ray.exceptions.RayError as e:  # worker or node died, object lost
            record(UnitResult(u.id, "lost", None, f"{type(e).__name__}: {str(e).splitlines()[0]}"))
            self.log(f"unit {u.id}: lost ({type(e).__name__})")
            return
        get_s = time.monotonic() - t0
        res = _result_of(u.id, out)
        t1 = time.monotonic()
        if out.get("archive"):
            unpack_folder(out["archive"], matrix_dir / u.id)
        res.timings_s.update(
            get=round(get_s, 3),
            unpack=round(time.monotonic() - t1, 3),
            start_delay=round(out["started_at"] - submitted, 3),
            return_delay=round(max(0.0, ready_at - out["ended_at"]), 3),
            wall=round(time.time() - submitted, 3),
        )
        res.node = f"{out.get('node')} ({str(out.get('node_id', ''))[:12]})"
        record(res)
        self.log(
            f"unit {u.id}: {res.status} on {res.node}{': ' + res.message if res.message else ''}"
        )


# --------------------------------------------------------------------------- the driver
def _done_units(matrix_dir: Path) -> set[str]:
    try:
        man = read_json(matrix_dir / "matrix.json")
    except (OSError, ValueError):
        return set()
    return {
        u["id"]
        for u in man.get("units", [])
        if u.get("status") == "ok" and (matrix_dir / u["id"] / "manifest.json").exists()
    }


def _check_resume(m: Matrix, matrix_dir: Path) -> dict:
    mf = matrix_dir / "matrix.json"
    if not matrix_dir.is_dir():
        raise ConfigError(
            f"--resume {matrix_dir}: no such folder (give a matrix run folder, "
            "results/<stamp>-<name>/)"
        )
    try:
        old = read_json(mf)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"--resume {matrix_dir}: no readable matrix.json there ({e}); give a matrix run folder"
        ) from None
    changed = []
    for u in m.units:
        p = matrix_dir / "configs" / f"{u.id}.yaml"
        if p.exists() and yaml.safe_load(p.read_text()) != yaml.safe_load(u.config_text):
            changed.append(u.id)
    if changed:
        raise ConfigError(
            f"--resume {matrix_dir}: the config of unit(s) {', '.join(changed)} "
            f"differs from what ran there ({matrix_dir}/configs/<unit>.yaml); a "
            "resumed matrix must measure the same thing: start a new matrix run"
        )
    return old


def make_executor(
    on: str, *, address: str | None = None, resources: Resources | None = None, **kw
) -> Executor:
    """ "local" -> :class:`LocalExecutor`, "ray" -> :class:`RayExecutor` (``kw`` passed on).
    Raises UsageError for another name, EnvironmentNotReady for "ray" without Ray installed."""
    if on == "local":
        if address:
            raise UsageError("--address is for --on ray")
        return LocalExecutor(
            **{k: v for k, v in kw.items() if k in ("env_setup", "command", "env", "stop_grace_s")}
        )
    if on == "ray":
        _ray()
        return RayExecutor(address, resources=resources, **kw)
    raise UsageError(f"--on must be local or ray, not {on!r}")


def run_matrix(
    path: str | os.PathLike,
    on: str = "local",
    address: str | None = None,
    *,
    resume: str | os.PathLike | None = None,
    results: str | os.PathLike | None = None,
    executor: Executor | None = None,
    log=_log,
    **executor_kw,
) -> Path:
    """Run every unit of a matrix; returns the matrix run folder.

    ``on``: "local" (one after another here, no Ray) or "ray" (one task per unit on the cluster
    at ``address``); ``executor`` overrides both (tests, other engines); ``executor_kw`` go to
    :func:`make_executor`. ``resume``: a matrix run folder: only units not ``ok`` there run (a
    unit with a run folder continues it through ``bench --resume``); a unit whose config changed
    is refused. ``results``: the parent of the matrix run folder (default results/).

    Each unit's run folder lands in ``<matrix run>/<unit id>/`` as it ends; matrix.json is
    rewritten after every unit; the matrix report is written at the end, also after failures and
    Ctrl-C. Raises ConfigError (exit 2) for a bad matrix, EnvironmentNotReady (3) for Ray missing,
    RunFailed (4) when any unit did not end ok (everything else kept), Interrupted (130/143) after
    Ctrl-C/SIGTERM (finished units kept; ``--resume`` runs the rest).
    """
    from patchbench.signals import signum_of, terminate_like_ctrl_c

    m = load_matrix(path)
    if executor is None:
        executor = make_executor(on, address=address, resources=m.spec.resources, **executor_kw)
    if resume:
        matrix_dir = Path(resume)
        old = _check_resume(m, matrix_dir)
        done = _done_units(matrix_dir)
        prev = {u["id"]: u for u in old.get("units", [])}
    else:
        root = Path(results) if results else RESULTS_DIR
        matrix_dir = root / f"{_utc_stamp()}-{m.spec.name}"
        matrix_dir.mkdir(parents=True, exist_ok=False)
        done, prev = set(), {}
    for u in m.units:
        write_text(matrix_dir / "configs" / f"{u.id}.yaml", u.config_text)
    todo = [u for u in m.units if u.id not in done]
    partial = {u.id for u in todo if (matrix_dir / u.id / "manifest.json").exists()}
    state: dict[str, dict] = {}
    for u in m.units:
        base = {
            "id": u.id,
            "labels": u.labels,
            "gpu_type": u.gpu_type,
            "sglang": u.sglang,
            "config": f"configs/{u.id}.yaml",
            "config_name": u.config.name,
            "status": "pending",
            "exit_code": None,
            "message": "",
            "node": None,
            "timings_s": {},
            "archive_bytes": 0,
        }
        state[u.id] = {**base, **prev.get(u.id, {})} if u.id in done else base
    manifest = {
        "schema_version": MATRIX_SCHEMA,
        "name": m.spec.name,
        "matrix": str(m.path.resolve()),
        "description": m.spec.description,
        "executor": executor.name,
        "address": address,
        "axes": list(m.spec.axes) or ["config"],
        "started_at": _utc_stamp(),
        "ended_at": None,
        "units": list(state.values()),
    }
    if resume:
        manifest["started_at"] = old.get("started_at") or manifest["started_at"]
        manifest["resumes"] = old.get("resumes", []) + [_utc_stamp()]

    def save() -> None:
        manifest["units"] = [state[u.id] for u in m.units]
        write_json(matrix_dir / "matrix.json", manifest)

    def record(r: UnitResult) -> None:
        state[r.id].update(
            status=r.status,
            exit_code=r.exit_code,
            message=r.message,
            node=r.node,
            timings_s=r.timings_s,
            archive_bytes=r.archive_bytes,
        )
        save()

    save()
    log(
        f"matrix run folder {matrix_dir}: {len(todo)} of {len(m.units)} units to run on "
        f"{executor.name}"
    )
    interrupted: BaseException | None = None
    try:
        with terminate_like_ctrl_c(log=log):
            try:
                executor.run(todo, matrix_dir, record, partial)
            except KeyboardInterrupt as e:
                interrupted = e
    finally:
        close = getattr(executor, "close", None)
        if close:
            close()
        manifest["ended_at"] = _utc_stamp()
        if interrupted is not None:
            manifest["interrupted"] = True
        save()
        try:
            from patchbench.matrix_report import write_matrix_report

            write_matrix_report(matrix_dir)
        except Exception as e:  # noqa: BLE001 - a report problem must not hide the units' results
            log(f"matrix report failed: {type(e).__name__}: {e}")
    if interrupted is not None:
        sig = signum_of(interrupted)
        cmd = f"{sys.executable} -m patchbench matrix {path} --on {executor.name} --resume {matrix_dir}"
        raise Interrupted(
            f"interrupted; finished units are kept in {matrix_dir}; resume with `{cmd}`",
            signum=sig,
            run_dir=matrix_dir,
        )
    bad = [s for s in state.values() if s["status"] != "ok"]
    if bad:
        raise RunFailed(
            f"{len(bad)} of {len(m.units)} units did not end ok ("
            + "; ".join(f"{s['id']}: {s['status']}" for s in bad[:5])
            + f"); see {matrix_dir}/matrix.json and report.md",
            matrix_dir,
        )
    log(f"done: {len(m.units)} units in {matrix_dir}")
    return matrix_dir


# --------------------------------------------------------------------------- command line
def add_cli_arguments(p) -> None:
    """The options of ``patchbench matrix`` (an argparse parser)."""
    p.add_argument("matrix", help="the matrix file (YAML): a base config with axes, or units")
    p.add_argument(
        "--on",
        choices=("local", "ray"),
        default="local",
        help="local: one unit after another here (default); ray: one Ray task per unit",
    )
    p.add_argument(
        "--address",
        help="the Ray cluster (default: RAY_ADDRESS, a running local cluster, or a new local one)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the units, run nothing")
    p.add_argument(
        "--resume",
        metavar="MATRIX_RUN_DIR",
        help="run only the units not finished ok in MATRIX_RUN_DIR",
    )
    p.add_argument(
        "--results", metavar="DIR", help="parent of the matrix run folder (default results/)"
    )
    p.add_argument(
        "--env-setup",
        choices=("auto", "make", "current"),
        help="how a unit gets its pin's environment (default: auto locally, make on "
        "Ray: `make setup SGLANG=<pin>` into a persistent venv per pin on each node)",
    )
    p.add_argument(
        "--env-root",
        metavar="DIR",
        help=f"where nodes keep those venvs (default {DEFAULT_ENV_ROOT})",
    )
    p.add_argument(
        "--no-ship-code",
        action="store_true",
        help="Ray: do not send this checkout "
        "as the job's working_dir (every node has it at the same path)",
    )


def run_cli(a) -> int:
    """``patchbench matrix`` from parsed arguments; returns 0 or raises a PatchbenchError."""
    if a.dry_run:
        print(describe_matrix(load_matrix(a.matrix), a.resume))
        return 0
    kw: dict[str, Any] = {}
    if a.env_setup:
        kw["env_setup"] = a.env_setup
    if a.on == "ray":
        kw.update(env_root=a.env_root, ship_code=not a.no_ship_code)
    elif a.env_root or a.no_ship_code:
        raise UsageError("--env-root and --no-ship-code are for --on ray")
    run_matrix(a.matrix, a.on, a.address, resume=a.resume, results=a.results, **kw)
    return 0
