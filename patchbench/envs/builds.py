"""Each variant's sglang build: the environment its server runs in and, for a source checkout or a
wheel, the ``sglang`` tree that runs as an overlay on that environment.

A wheel or checkout runs as an overlay on the environment whose sglang declares the same
dependencies (docs/guide.md). A variant checkout whose range from the baseline's changes compiled
code (:func:`uncompiled_files`) is refused before any environment is looked for unless its
``sglang:`` says ``allow_uncompiled: true``. A checkout's uncommitted edits are named, never
measured: the builds are the commits.

Errors: EnvironmentNotReady (exit 3) for a build no environment here can run, or an index that
cannot be read; ConfigError (exit 2) for an unknown ref, a checkout without ``python/sglang``, a
bad wheel, patches on a source build, or a refused range.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from patchbench.config import (
    CHANGES_SHOWN,
    LATEST,
    Config,
    GitSource,
    WheelSource,
    changes_text,
    commit_name,
    sglang_label,
    uncommitted_text,
    uncompiled_text,
)
from patchbench.envs import envinfo, layers
from patchbench.errors import ConfigError, EnvironmentNotReady, PatchError
from patchbench.inputs import CACHE_DIR

#: what resolving does for a build no environment here has: refuse it (exit 3), plan the layer
#: it would make (a dry run) or make it
MakeMode = Literal["no", "plan", "yes"]
#: the package index's JSON API (``<url>/sglang/json``) that resolves ``latest``
INDEX_URL_ENV = "PATCHBENCH_INDEX_URL"
DEFAULT_INDEX_URL = "https://pypi.org/pypi"

#: paths whose change needs a compiled build: the kernel package, C/C++/CUDA sources, CMake, the
#: Rust router (sgl-router, later sgl-model-gateway) and its Cargo files
_COMPILED = re.compile(
    r"(^|/)(sgl-kernel|csrc|sgl-router|sgl-model-gateway)/"
    r"|\.(cu|cuh|cpp|cc|cxx|c|h|hpp|rs|cmake)$|(^|/)(CMakeLists\.txt|Cargo\.(toml|lock))$"
)
#: the folder of a checkout a source build runs (a range's other paths are not run)
SOURCE_DIR = "python/sglang/"


@dataclass
class RangeChanges:
    """The paths (``files``, in git's order) that a git build changes against the baseline's
    commit ``base`` of the same checkout (``git diff --name-only``); ``uncompiled``: those no
    build here compiles, left out of the run (empty unless the variant allows them)."""

    base: str
    files: list[str]
    uncompiled: list[str] = field(default_factory=list)

    @property
    def outside(self) -> list[str]:
        """The paths outside ``python/sglang/`` (:func:`outside_source`)."""
        return outside_source(self.files)

    def describe(self) -> str:
        """``2 files: a.py, b.py (1 outside python/sglang/, not run)`` (at most
        :data:`~patchbench.config.CHANGES_SHOWN` named, then ``and N more``)."""
        return changes_text(len(self.files), self.files, len(self.outside))

    def to_json(self) -> dict:
        """The manifest's ``changes`` of a git build (docs/CONTRACTS.md, ``builds``)."""
        out = {
            "base": self.base,
            "count": len(self.files),
            "files": self.files[:CHANGES_SHOWN],
            "outside": len(self.outside),
        }
        if self.uncompiled:
            out["uncompiled"] = _names_json(self.uncompiled)
        return out


def _names_json(paths: list[str]) -> dict:
    """``{"count": n, "files": the first CHANGES_SHOWN}``."""
    return {"count": len(paths), "files": paths[:CHANGES_SHOWN]}


@dataclass
class Build:
    """One resolved ``sglang:`` (``spec`` as written): ``resolved``: the release, commit or the
    wheel's sha256; ``version``: a source's own sglang version and ``tree`` the folder holding
    its ``sglang/`` (None for a release); for a git build ``subject``: the commit's first line,
    ``changes``: what it changes against the baseline's commit (None for the baseline, a
    build at its commit or of another checkout) and ``uncommitted``: the checkout's
    uncommitted edits (:func:`uncommitted_edits`; not measured)."""

    spec: str
    kind: Literal["release", "git", "wheel"]
    env: envinfo.Environment
    resolved: str
    version: str | None = None
    tree: Path | None = None
    plan: layers.LayerPlan | None = None
    subject: str | None = None
    changes: RangeChanges | None = None
    uncommitted: list[str] = field(default_factory=list)

    @property
    def release(self) -> str:
        """The installed sglang release of the environment the server runs in."""
        return self.env.sglang

    @property
    def python(self) -> str:
        """The interpreter the server (and, for the baseline, the clients) run with."""
        return self.env.python

    def name(self) -> str | None:
        """A git build as a reader names it (``8af4974fdfbe "its subject"``,
        :func:`~patchbench.config.commit_name`); None for a release or a wheel."""
        return commit_name(self.resolved, self.subject) if self.kind == "git" else None

    @property
    def built_version(self) -> str:
        """The sglang version as built: a source's own (else "?"), a release's number."""
        return self.release if self.kind == "release" else (self.version or "?")

    def describe(self) -> str:
        """``sglang 0.5.23 (.venv-0.5.23)`` or ``git:PATH@REF (commit 1a2b3c4d5e6f "its
        subject", sglang 0.5.24.dev0) on .venv-0.5.23 (sglang 0.5.23)``."""
        where = self.env.describe()
        if self.plan is not None:
            where = f"an environment a real run makes first ({self.plan.describe()})"
        if self.kind == "release":
            latest = " (latest)" if self.spec == LATEST else ""
            return f"sglang {self.release}{latest} in {where}"
        what = f"commit {self.name()}" if self.kind == "git" else f"sha256 {self.resolved[:12]}"
        own = f", sglang {self.version}" if self.version else ""
        return f"{self.spec} ({what}{own}) on {where}"

    def to_json(self) -> dict:
        """The run manifest's ``builds`` entry (docs/CONTRACTS.md, ``builds``)."""
        out = {
            "spec": self.spec,
            "kind": self.kind,
            "resolved": self.resolved,
            "version": self.version,
            "release": self.release,
            "venv": str(self.env.venv),
            "python": self.python,
            "describe": self.describe(),
        }
        if self.kind == "git":
            out["subject"] = self.subject
            out["changes"] = self.changes.to_json() if self.changes is not None else None
            if self.uncommitted:
                out["uncommitted"] = _names_json(self.uncommitted)
        return out


# ------------------------------------------------------------------------------- releases
def resolve_latest(index_url: str | None = None, *, timeout_s: float = 20) -> str:
    """``info.version`` of ``<index_url>/sglang/json`` (default ``$PATCHBENCH_INDEX_URL``, else
    PyPI); EnvironmentNotReady when the index cannot be read."""
    url = (index_url or os.environ.get(INDEX_URL_ENV) or DEFAULT_INDEX_URL).rstrip("/")
    try:
        with urllib.request.urlopen(f"{url}/sglang/json", timeout=timeout_s) as r:
            version = json.load(r)["info"]["version"]
    except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as e:
        raise EnvironmentNotReady(
            f"sglang: latest: cannot read the newest release from {url}/sglang/json ({e}); "
            f"name a release instead, or set {INDEX_URL_ENV} to a reachable index"
        ) from None
    return str(version)


@dataclass
class Making:
    """How resolving treats a build no environment has (:data:`MakeMode`, on the CPU or not;
    ``log`` shows a make's progress)."""

    mode: MakeMode = "no"
    cpu: bool = False
    log: Callable[[str], None] = print

    def environment(
        self, what: str, reqs: list[str] | None, version: str | None, *, release: bool
    ) -> tuple[envinfo.Environment, layers.LayerPlan | None]:
        """(the environment, the plan while it is still to be made) for a release (``release``:
        ``version`` is installed into it) or a dependency set ``reqs``. Raises
        EnvironmentNotReady (mode "no": the ``make setup`` or how the closest differs)."""
        env = envinfo.environment_for(version, requires=None if release else reqs)
        if env is not None:
            return env, None
        if self.mode == "no":
            raise envinfo.missing_environment(what, version, requires=None if release else reqs)
        if reqs is None:
            reqs = layers.release_requires(str(version), sys.executable)
        plan = layers.plan_layer(what, reqs, version if release else None, cpu=self.cpu)
        if self.mode == "plan":
            return plan.base, plan
        return layers.make_layer(plan, log=self.log), None


def _release_build(spec: str, release: str, making: Making) -> Build:
    env, plan = making.environment(f"sglang {release}", None, release, release=True)
    return Build(spec=spec, kind="release", env=env, resolved=release, plan=plan)


# ------------------------------------------------------------------------------- requirements
def pyproject_requirements(text: str) -> list[str]:
    """The requirement strings of a ``pyproject.toml``, optional ones marked with their extra (as
    Requires-Dist is)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the parser pip vendors
        from pip._vendor import tomli as tomllib
    project = tomllib.loads(text).get("project", {})
    out = list(project.get("dependencies", []))
    for extra, reqs in project.get("optional-dependencies", {}).items():
        out += [f'{r}; extra == "{extra}"' if ";" not in r else f'{r} and extra == "{extra}"'
                for r in reqs]  # fmt: skip
    return out


# ------------------------------------------------------------------------------- git
def git(git_dir: Path, *args: str, text: bool = True) -> subprocess.CompletedProcess:
    """``git --git-dir=GIT_DIR ARGS``, output captured."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, text=text, env=env
    )


def git_commit(git_dir: Path, ref: str) -> str:
    """The commit ``ref`` names in ``git_dir``. Raises ConfigError for an unknown ref."""
    r = git(git_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if r.returncode != 0 or not r.stdout.strip():
        raise ConfigError(f"{git_dir}: '{ref}' names no commit")
    return r.stdout.strip()


def git_show(git_dir: Path, commit: str, path: str) -> str | None:
    """The text of ``path`` at ``commit`` (None when the commit has no such file)."""
    r = git(git_dir, "show", f"{commit}:{path}")
    return r.stdout if r.returncode == 0 else None


def changed_files(git_dir: Path, base: str, head: str) -> list[str]:
    """The paths that differ between commits ``base`` and ``head`` (``git diff --name-only``)."""
    r = git(git_dir, "diff", "--no-renames", "--name-only", base, head, "--")
    if r.returncode != 0:
        raise ConfigError(f"{git_dir}: git cannot diff {base} {head}: {r.stderr.strip()[:300]}")
    return [ln for ln in r.stdout.splitlines() if ln.strip()]


def outside_source(paths: list[str]) -> list[str]:
    """The paths outside :data:`SOURCE_DIR` (``python/sglang/``): a source build does not run
    them."""
    return [p for p in paths if not p.startswith(SOURCE_DIR)]


def git_subject(git_dir: Path, commit: str) -> str | None:
    """The first line of ``commit``'s message (``git log -1 --format=%s``); None when git
    cannot read it."""
    r = git(git_dir, "log", "-1", "--format=%s", commit, "--")
    return r.stdout.strip() if r.returncode == 0 else None


def compiled_files(paths: list[str]) -> list[str]:
    """The paths that need a compiled build (``sgl-kernel/``, ``csrc/``, C/C++/CUDA files,
    CMake, the Rust router)."""
    return [p for p in paths if _COMPILED.search(p)]


def uncompiled_files(paths: list[str], *, cpu: bool) -> list[str]:
    """The paths of a range that no build here compiles, so a run leaves them out: compiled code
    outside ``python/sglang/`` (a source build runs that folder only; nothing builds sgl-kernel
    or the router) and, on the CPU (``cpu``), compiled code inside it too (the CPU engine runs
    no kernel)."""
    return [p for p in compiled_files(paths) if cpu or not p.startswith(SOURCE_DIR)]


def uncommitted_edits(checkout: Path) -> list[str]:
    """The checkout's uncommitted edits (``git status --porcelain``): tracked files changed,
    staged or not, anywhere, and untracked files under ``python/``; [] for a bare repository or
    when git cannot tell."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    r = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "-z", "--no-renames"]
        + ["--untracked-files=all"],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode != 0:
        return []
    out = []
    for entry in r.stdout.split("\0"):
        state, path = entry[:2], entry[3:]
        if path and (state != "??" or path.startswith("python/")):
            out.append(path)
    return out


def _extract_git_tree(git_dir: Path, commit: str, cache_dir: Path) -> Path:
    """``python/sglang`` of ``commit`` extracted once into ``<cache_dir>/builds/git-<commit>/``;
    ConfigError when it has none."""
    dest = cache_dir / "builds" / f"git-{commit}"
    if (dest / "sglang" / "__init__.py").is_file():
        return dest
    r = git(git_dir, "archive", "--format=tar", commit, "python/sglang", text=False)
    if r.returncode != 0:
        raise ConfigError(
            f"{git_dir}: commit {commit[:12]} has no python/sglang "
            f"({r.stderr.decode(errors='replace').strip()[:200]})"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".git-{commit[:12]}-", dir=dest.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tf:
            tf.extractall(tmp, filter="data")
        (tmp / "python" / "sglang").rename(tmp / "sglang")
        shutil.rmtree(tmp / "python")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if (dest / "sglang" / "__init__.py").is_file():  # another process finished it first
            return dest
        raise
    return dest


def _source_version(tree: Path) -> str | None:
    """``__version__`` of ``tree/sglang/version.py`` (None when absent)."""
    f = tree / "sglang" / "version.py"
    m = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", f.read_text()) if f.is_file() else None
    return m.group(1) if m else None


def git_build(
    cfg: Config, spec: GitSource, *, cache_dir: Path = CACHE_DIR, making: Making | None = None
) -> Build:
    """The build of a checkout at a commit, on the environment with its dependencies."""
    from patchbench.patches.author import git_dir_of

    label = sglang_label(spec)
    try:
        gd = git_dir_of(cfg.resolve_path(spec.git))
    except PatchError as e:
        raise ConfigError(f"sglang: {label}: {e}") from None
    commit = git_commit(gd, spec.ref)
    pyproject = git_show(gd, commit, "python/pyproject.toml")
    if pyproject is None:
        raise ConfigError(
            f"sglang: {label}: commit {commit[:12]} has no python/pyproject.toml (the "
            "dependencies that pick the environment)"
        )
    tree = _extract_git_tree(gd, commit, cache_dir)
    version = _source_version(tree)
    env, plan = (making or Making()).environment(
        f"sglang: {label}", pyproject_requirements(pyproject), version, release=False
    )
    subject = git_subject(gd, commit)
    b = Build(label, "git", env, commit, version=version, tree=tree, plan=plan, subject=subject)
    b.uncommitted = uncommitted_edits(cfg.resolve_path(spec.git))
    return b


# ------------------------------------------------------------------------------- wheels
def wheel_build(
    cfg: Config, spec: WheelSource, *, cache_dir: Path = CACHE_DIR, making: Making | None = None
) -> Build:
    """The build of a wheel file (extracted once under ``<cache_dir>/builds/``), on the
    environment with its Requires-Dist."""
    label = sglang_label(spec)
    path = cfg.resolve_path(spec.wheel)
    if not path.is_file():
        raise ConfigError(f"sglang: {label}: no such file {path}")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    dest = cache_dir / "builds" / f"wheel-{sha[:16]}"
    try:
        with zipfile.ZipFile(path) as z:
            meta_name = next(
                (n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), None
            )
            if meta_name is None:
                raise ConfigError(f"sglang: {label}: not a wheel (no *.dist-info/METADATA)")
            meta = z.read(meta_name).decode()
            if not (dest / "sglang" / "__init__.py").is_file():
                tmp = Path(tempfile.mkdtemp(prefix=".wheel-", dir=_mkdir(dest.parent)))
                z.extractall(tmp, [n for n in z.namelist() if n.startswith("sglang/")])
                shutil.rmtree(dest, ignore_errors=True)
                os.rename(tmp, dest)
    except (zipfile.BadZipFile, OSError) as e:
        raise ConfigError(f"sglang: {label}: cannot read the wheel: {e}") from None
    reqs = [
        ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")
    ]
    version = next(
        (ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Version:")), None
    )
    env, plan = (making or Making()).environment(f"sglang: {label}", reqs, version, release=False)
    return Build(label, "wheel", env, sha, version=version, tree=dest, plan=plan)


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


# ------------------------------------------------------------------------------- a config
def resolve_builds(
    cfg: Config,
    *,
    cpu: bool = False,
    index_url: str | None = None,
    cache_dir: Path = CACHE_DIR,
    make: MakeMode = "no",
    log=print,
) -> dict[str, Build]:
    """{variant: its :class:`Build`}, each distinct ``sglang:`` resolved once; also stored in
    ``cfg.builds`` (what :meth:`Config.release_of` reads). ``cpu``: the CPU engine (compiled code
    under ``python/sglang/`` is left out too, :func:`uncompiled_files`) and CUDA-only packages
    left out of a made environment; ``make``: what to do for a build no environment has
    (:data:`MakeMode`; ``log`` shows a make's progress, what a range leaves out and a checkout's
    uncommitted edits). Raises the errors of the module docstring."""
    ranges = _ranges(cfg, cpu)
    making = Making(make, cpu, log)
    by_label: dict[str, Build] = {}
    latest: str | None = None
    out: dict[str, Build] = {}
    for v in cfg.variants:
        spec = cfg.sglang_of(v)
        label = sglang_label(spec)
        if label not in by_label:
            if isinstance(spec, GitSource):
                by_label[label] = git_build(cfg, spec, cache_dir=cache_dir, making=making)
            elif isinstance(spec, WheelSource):
                by_label[label] = wheel_build(cfg, spec, cache_dir=cache_dir, making=making)
            elif spec == LATEST:
                latest = latest or resolve_latest(index_url)
                by_label[label] = _release_build(LATEST, latest, making)
            else:
                by_label[label] = _release_build(spec, spec, making)
        out[v] = by_label[label]
        if out[v].kind != "release" and cfg.patches_of(v):
            raise ConfigError(
                f"{cfg.source}: variant '{v}' runs {label} and names patches; a source build "
                "takes none (commit the change to the branch instead)"
            )
        if v in ranges and out[v].changes is None:
            out[v].changes = ranges[v]
    named: set[str] = set()
    for v, b in out.items():
        if b.changes is not None and b.changes.uncompiled and v in ranges:
            c = b.changes.uncompiled
            log(f"sglang: variant '{v}' ({b.spec}): {uncompiled_text(len(c), c)}")
        where = str(cfg.resolve_path(cfg.sglang_of(v).git)) if b.kind == "git" else ""
        if b.uncommitted and where not in named:
            named.add(where)
            text = uncommitted_text(len(b.uncommitted), b.uncommitted)
            log(f"sglang: {where}: {text}")
    cfg.builds = dict(out)
    return out


def _ranges(cfg: Config, cpu: bool) -> dict[str, RangeChanges]:
    """{variant: what it changes} for each git build of the baseline's checkout at another
    commit, from the commits alone (before any environment). Raises ConfigError for a range
    with compiled code no build here compiles (:func:`uncompiled_files`) unless the variant's
    ``sglang:`` allows it (``allow_uncompiled``), naming the files and the flag; ConfigError
    (an unknown ref) as :func:`git_commit`."""
    base_spec = cfg.sglang_of(cfg.baseline)
    if not isinstance(base_spec, GitSource):
        return {}
    from patchbench.patches.author import git_dir_of

    try:
        gd = git_dir_of(cfg.resolve_path(base_spec.git))
    except PatchError as e:
        raise ConfigError(f"sglang: {sglang_label(base_spec)}: {e}") from None
    base = git_commit(gd, base_spec.ref)
    out: dict[str, RangeChanges] = {}
    for v in cfg.variants:
        spec = cfg.sglang_of(v)
        if not isinstance(spec, GitSource):
            continue
        try:
            same = git_dir_of(cfg.resolve_path(spec.git)) == gd
        except PatchError:
            continue  # git_build names it
        commit = git_commit(gd, spec.ref) if same else base
        if commit == base:
            continue
        files = changed_files(gd, base, commit)
        left = uncompiled_files(files, cpu=cpu)
        if left and not spec.allow_uncompiled:
            shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
            inside = any(f.startswith(SOURCE_DIR) for f in left)
            where = " (the CPU engine runs no kernel, not even one under python/sglang/)"
            where = where if inside else ""
            raise ConfigError(
                f"variant '{v}' ({sglang_label(spec)}): its range from the baseline "
                f"({base[:12]}..{commit[:12]}) changes compiled code that no build here "
                f"compiles{where}: {shown}. A source build runs python/sglang/ only, so a run "
                "would measure the Python part and read as the whole change. To measure the "
                "Python part anyway, stating what is left out: `patchbench ab ... "
                "--allow-uncompiled` (in a config: `allow_uncompiled: true` in the variant's "
                "sglang: {git: ..., ref: ...})"
            )
        out[v] = RangeChanges(base, files, left)
    return out


def overlay_patches(
    cfg: Config, variant: str, release: str | None, *, cache_dir: Path | None = None
) -> list[str | Path]:
    """``variant``'s patches for ``release`` as the overlay takes them: patch names, and a patch
    folder made from each diff file. Raises :class:`patchbench.errors.PatchError` naming the
    diff, file and hunk, or when a diff needs a release not resolved yet (None)."""
    from patchbench.patches.author import patch_from_diff_file

    out: list[str | Path] = []
    for p in cfg.variants[variant].patches:
        if isinstance(p, str):
            out.append(p)
        elif release is None:
            raise PatchError(f"variant '{variant}': its sglang build is not resolved yet")
        else:
            out.append(patch_from_diff_file(cfg.resolve_path(p.diff), release, cache_dir=cache_dir))
    return out
