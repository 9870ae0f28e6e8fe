"""The experiment config: a leaf schema (pydantic models) and the builders that validate it.

configs/demo-cpu.yaml documents every key. A patch entry is a folder name of ``patches/`` or
``{diff: FILE}``; ``sglang:`` (for the run or one variant) a release, ``latest``, ``{wheel: FILE}``
or ``{git: CHECKOUT, ref: REF}`` (resolved by patchbench.envs.builds). Relative paths resolve
against the repo root.

Validation beyond the models: duplicate YAML keys, size, alias and node bounds
(:mod:`patchbench.inputs`); numbers and booleans are not converted into each other; server
arguments the harness owns (:data:`patchbench.config.args.HARNESS_ARGS`) are refused in any
spelling; a flag in both ``server.args`` and a variant's ``server_args`` (or a variable in both
``env``) is refused; suite parameters, patches and diff files are checked on load.

Errors: :class:`patchbench.errors.ConfigError` (exit 2) naming the file, key path and line; a
missing local model folder is :class:`patchbench.errors.EnvironmentNotReady` (exit 3, from
:meth:`Config.require_model`).

Modules: :mod:`~patchbench.config.schema` (the models), :mod:`~patchbench.config.load` (building
a config from a file, a mapping or another config), :mod:`~patchbench.config.args` (server
argument and environment checks).
"""

from patchbench.config.load import config_from_mapping, derive, load_config
from patchbench.config.schema import (
    LATEST,
    CompareSettings,
    Config,
    DiffPatch,
    GitSource,
    ModelSpec,
    PatchEntry,
    ScheduleSpec,
    SequentialRepeats,
    ServerSpec,
    VariantSpec,
    WheelSource,
    patch_label,
    sglang_label,
)

__all__ = [
    "LATEST",
    "CompareSettings",
    "Config",
    "DiffPatch",
    "GitSource",
    "ModelSpec",
    "PatchEntry",
    "ScheduleSpec",
    "SequentialRepeats",
    "ServerSpec",
    "VariantSpec",
    "WheelSource",
    "config_from_mapping",
    "derive",
    "load_config",
    "patch_label",
    "sglang_label",
]
