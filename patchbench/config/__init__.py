"""The experiment config (configs/demo-cpu.yaml documents every key; relative paths resolve
against the repo root). Errors: ConfigError (exit 2) naming the file, key path and line."""

from patchbench.config.load import config_from_mapping, derive, load_config
from patchbench.config.schema import (
    CHANGES_SHOWN,
    LATEST,
    CompareSettings,
    Config,
    DiffPatch,
    GitSource,
    ScheduleSpec,
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
    "ScheduleSpec",
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
