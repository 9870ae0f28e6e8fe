"""The experiment config: a leaf schema (:mod:`~patchbench.config.schema`), its builders from a
file, a mapping or another config (:mod:`~patchbench.config.load`) and the server argument checks
(:mod:`~patchbench.config.args`). configs/demo-cpu.yaml documents every key; relative paths
resolve against the repo root.

Errors: :class:`patchbench.errors.ConfigError` (exit 2) naming the file, key path and line; a
missing local model folder is :class:`patchbench.errors.EnvironmentNotReady` (exit 3, from
:meth:`Config.require_model`).
"""

from patchbench.config.load import config_from_mapping, derive, load_config
from patchbench.config.schema import (
    CHANGES_SHOWN,
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
    changes_text,
    commit_name,
    patch_label,
    sglang_label,
    uncommitted_text,
    uncompiled_text,
)

__all__ = [
    "CHANGES_SHOWN",
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
    "changes_text",
    "commit_name",
    "config_from_mapping",
    "derive",
    "load_config",
    "patch_label",
    "sglang_label",
    "uncommitted_text",
    "uncompiled_text",
]
