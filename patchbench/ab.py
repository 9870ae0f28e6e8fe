"""``patchbench ab``: one change (a checkout's range, a diff or server arguments) against its
baseline, in a config built in memory from a preset or ``--config FILE``. UsageError (exit 2) for
an unknown preset, a bad range or arguments."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench import inputs
from patchbench.config import Config, commit_name, config_from_mapping
from patchbench.config.load import file_where
from patchbench.config.schema import AB_NAME_PREFIX
from patchbench.errors import ConfigError, UsageError

PRESETS_DIR = inputs.REPO_ROOT / "configs" / "presets"


def presets() -> list[str]:
    """The names of ``configs/presets/*.yaml``."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """``configs/presets/<name>.yaml``; UsageError naming the presets for an unknown name."""
    p = PRESETS_DIR / f"{name}.yaml"
    if not p.is_file() or "/" in name:
        raise UsageError(f"unknown preset '{name}'; presets: {', '.join(presets())}")
    return p


@dataclass
class GitRange:
    """A checkout's two sides: ``base`` and ``head`` commits, the range as given, the files it
    changes outside ``python/sglang/`` (ignored, or for compiled code refused unless allowed)
    and each side's commit subject (None when git cannot read it)."""

    checkout: Path
    base: str
    head: str
    given: str
    ignored: list[str] = field(default_factory=list)
    base_subject: str | None = None
    head_subject: str | None = None


def git_range(
    checkout: str | Path, rng: str | None, base: str | None, head: str | None
) -> GitRange:
    """``--range A...B`` / ``A..B`` or ``--base``/``--head`` in ``checkout`` as two commits
    (docs/patches.md). Raises UsageError for a missing or ill-formed range, or one that changes
    nothing in ``python/sglang/``."""
    from patchbench.envs.builds import (
        changed_files,
        git,
        git_commit,
        git_subject,
        outside_source,
    )
    from patchbench.errors import PatchError
    from patchbench.patches.author import git_dir_of

    co = Path(checkout).expanduser().resolve()
    try:
        gd = git_dir_of(co)
    except PatchError as e:
        raise UsageError(str(e)) from None
    if rng is not None and (base or head):
        raise UsageError("give --range, or --base and --head, not both")
    if rng is not None:
        if "..." in rng:
            a, b = rng.split("...", 1)
            mb = git(gd, "merge-base", a or "HEAD", b or "HEAD")
            if mb.returncode != 0:
                raise UsageError(f"{co}: no merge base of '{a}' and '{b}': {mb.stderr.strip()}")
            base, head = mb.stdout.strip(), b or "HEAD"
        elif ".." in rng:
            base, head = rng.split("..", 1)
        else:
            raise UsageError(f"--range '{rng}': write A...B (from their merge base) or A..B")
    if not base or not head:
        raise UsageError("--git needs --range A...B, or --base REF and --head REF")
    try:
        b0, b1 = git_commit(gd, base), git_commit(gd, head)
        names = changed_files(gd, b0, b1)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    ignored = outside_source(names)
    if len(ignored) == len(names):
        raise UsageError(
            f"{co}: {rng or f'{base}..{head}'} changes nothing under python/sglang/"
            + (f" (only {', '.join(names[:10])})" if names else "")
        )
    given = rng or f"{base}..{head}"
    return GitRange(co, b0, b1, given, ignored, git_subject(gd, b0), git_subject(gd, b1))


def ab_config(
    template: dict[str, Any],
    *,
    git: GitRange | None = None,
    patch: Path | None = None,
    args_a: list[str] | None = None,
    args_b: list[str] | None = None,
    repeats: int | None = None,
    name: str | None = None,
    allow_uncompiled: bool = False,
) -> dict[str, Any]:
    """``template`` (a preset's or a config's mapping) with two variants, ``A`` (the baseline)
    and ``B``: the checkout at ``git.base`` / ``git.head`` (``allow_uncompiled``: B's range may
    leave compiled code out), stock / ``{diff: patch}``, and each side's server arguments.
    ``repeats`` replaces ``schedule.repeats``."""
    cfg = dict(template)
    a: dict[str, Any] = {"patches": [], "server_args": list(args_a or [])}
    b: dict[str, Any] = {"patches": [], "server_args": list(args_b or [])}
    if git is not None:
        cfg["sglang"] = {"git": str(git.checkout), "ref": git.base}
        b["sglang"] = {"git": str(git.checkout), "ref": git.head}
        if allow_uncompiled:
            b["sglang"]["allow_uncompiled"] = True
    if patch is not None:
        b["patches"] = [{"diff": str(Path(patch).expanduser().resolve())}]
    cfg["variants"] = {"A": a, "B": b}
    cfg["baseline"] = "A"
    if repeats is not None:
        cfg["schedule"] = {**dict(cfg.get("schedule") or {}), "repeats": repeats}
    if name:
        cfg["name"] = name
    return cfg


def describe(git: GitRange | None, patch: Path | None, args_a, args_b) -> list[str]:
    """What A and B are, one line each (and the ignored files: compiled code is left to
    :func:`patchbench.envs.builds.resolve_builds`, which refuses it or says it is left out),
    for the console."""
    from patchbench.envs.builds import compiled_files

    if git is not None:
        a_name = commit_name(git.base, git.base_subject)
        lines = [
            f"A: {git.checkout} at {a_name} (the merge base of {git.given})"
            if "..." in git.given
            else f"A: {git.checkout} at {a_name}",
            f"B: {git.checkout} at {commit_name(git.head, git.head_subject)}",
        ]
        deps = [f for f in git.ignored if f == "python/pyproject.toml"]
        compiled = set(compiled_files(git.ignored))
        rest = [f for f in git.ignored if f not in deps and f not in compiled]
        if rest:
            shown = ", ".join(rest[:10]) + (" ..." if len(rest) > 10 else "")
            lines.append(f"ignored (outside python/sglang/): {shown}")
        if deps:
            lines.append("python/pyproject.toml changes: its dependencies pick B's environment")
    else:
        lines = ["A: stock", f"B: stock + {patch}" if patch else "B: stock"]
    if args_a:
        lines[0] += f"; server args {shlex.join(args_a)}"
    if args_b:
        lines[1] += f"; server args {shlex.join(args_b)}"
    return lines


def prepare_ab(a: Any) -> Config:
    """The ``ab`` command's config (argparse namespace of ``patchbench ab``), built in memory:
    checks the arguments, prints what A and B are and returns the validated config (no
    ``source``: ``bench --resume RUN_DIR`` resumes it from its run folder)."""
    if not (a.git or a.patch or a.args_b):
        raise UsageError("say what B is: --git CHECKOUT --range A...B, --patch FILE or --args-b")
    if a.git and a.patch:
        raise UsageError("give --git or --patch, not both")
    if (a.range or a.base or a.head) and not a.git:
        raise UsageError("--range/--base/--head need --git CHECKOUT")
    git = git_range(a.git, a.range, a.base, a.head) if a.git else None
    src = Path(a.config) if a.config else preset_path(a.preset)
    text, template = inputs.read_yaml_mapping(
        src, ConfigError, "name, sglang, model, ...", "config"
    )
    args_a, args_b = shlex.split(a.args_a or ""), shlex.split(a.args_b or "")
    patch = Path(a.patch) if a.patch else None
    raw = ab_config(
        template,
        git=git,
        patch=patch,
        args_a=args_a,
        args_b=args_b,
        repeats=a.repeats,
        name=f"{AB_NAME_PREFIX}{src.stem}",
        allow_uncompiled=a.allow_uncompiled,
    )
    for line in describe(git, patch, args_a, args_b):
        print(f"ab: {line}", flush=True)
    cfg = config_from_mapping(raw, file_where(src, text))
    print(f"ab: config {cfg.name} from {src}", flush=True)
    return cfg
