"""The run's cells in order (:func:`plan`; docs/design.md step 4), what each runs
(:func:`cell_suites`) and the plan as text (:func:`describe_plan`, ``--dry-run``)."""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from patchbench import runfolder
from patchbench.config import Config, patch_label, sglang_label
from patchbench.config.args import check_args, split_args
from patchbench.envs import envinfo
from patchbench.errors import ConfigError
from patchbench.run.looks import sequential_primaries
from patchbench.run.server import launch_command
from patchbench.run.variants import (
    client_python,
    client_release,
    is_cpu,
    pythonpath,
    stand_in_dirs,
)
from patchbench.shims import SITE_DIR
from patchbench.suite import SuiteContext, SuiteError, get_suite

CellKind = Literal["timed", "correctness"]


@dataclass(frozen=True)
class Cell:
    """One server lifetime: ``variant`` at round ``repeat`` (0-based; 0 for a correctness cell);
    ``index``: its position in the run order."""

    index: int
    variant: str
    repeat: int
    kind: CellKind = "timed"

    @property
    def dirname(self) -> str:
        return "correctness" if self.kind == "correctness" else f"rep{self.repeat}"

    @property
    def label(self) -> str:
        """``variant/rep<k>`` or ``variant/correctness`` (log lines, progress, markers)."""
        return f"{self.variant}/{self.dirname}"

    def path(self, run_dir: str | Path) -> Path:
        return Path(run_dir) / self.variant / self.dirname


def randomized_rounds(variants: list[str], repeats: int, seed: int) -> list[list[str]]:
    """The variants' order in each of ``repeats`` rounds under ``order: randomized``: the rounds
    come in blocks of V = len(variants); block b is a Latin square drawn from ``seed`` and b (the
    variants in a random order, its V rotations in a random order), so every variant runs once in
    every position of a round in each whole block. Only ``random.random`` draws it (its sequence
    for a seed is stable across Python versions), so a resumed run plans the same order."""
    out: list[list[str]] = []
    for b in range(-(-repeats // len(variants))):
        rng = random.Random(f"{seed}:{b}")
        perm = sorted(variants, key=lambda _v: rng.random())
        for s in sorted(range(len(perm)), key=lambda _s: rng.random()):
            out.append(perm[s:] + perm[:s])
    return out[:repeats]


def plan_cells(
    variants: list[str],
    repeats: int,
    order: Literal["interleaved", "sequential", "randomized"] = "interleaved",
    *,
    correctness: bool = False,
    seed: int = 0,
) -> list[Cell]:
    """The run order of ``variants`` over ``repeats`` rounds, after one correctness cell per
    variant with ``correctness``; ``seed`` draws a randomized order (:func:`randomized_rounds`).
    ValueError for no variants, repeats < 1 or an unknown order."""
    if not variants:
        raise ValueError("no variants to schedule")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if order == "interleaved":
        pairs = [
            (v, r) for r in range(repeats) for v in (variants if r % 2 == 0 else variants[::-1])
        ]
    elif order == "sequential":
        pairs = [(v, r) for v in variants for r in range(repeats)]
    elif order == "randomized":
        rounds = randomized_rounds(variants, repeats, seed)
        pairs = [(v, r) for r, vs in enumerate(rounds) for v in vs]
    else:
        raise ValueError(f"unknown order '{order}'; allowed: interleaved, sequential, randomized")
    first = [Cell(i, v, 0, "correctness") for i, v in enumerate(variants)] if correctness else []
    return first + [Cell(len(first) + i, v, r) for i, (v, r) in enumerate(pairs)]


def _placeholder_ctx(cfg: Config, suite: str, variant: str | None = None) -> SuiteContext:
    """The context a suite's ``instrumentation`` hook is asked with before any cell exists."""
    site = envinfo.stock_site_dir()
    stock = (site / "sglang") if site else Path("sglang")
    root = Path("/nonexistent-run")
    return SuiteContext(
        server=None,
        out_dir=root / suite,
        run_dir=root,
        cache_dir=root / ".cache",
        variant=variant or cfg.baseline,
        repeat=0,
        baseline=cfg.baseline,
        sglang_version=client_release(cfg),
        python=client_python(cfg),
        stock_env={},
        variant_sglang_dir=stock,
        stock_sglang_dir=stock,
        device="cpu" if is_cpu(cfg) else "cuda",
    )


def _correctness_suites(cfg: Config) -> list[str]:
    """The suites that need a correctness cell: untimed or instrumented ones, config order."""
    return [
        s
        for s in cfg.suites
        if not get_suite(s).timed
        or get_suite(s).instrumentation(_placeholder_ctx(cfg, s), cfg.suite_params[s]) is not None
    ]


def plan(cfg: Config) -> list[Cell]:
    """The correctness cells when needed, then every round the schedule may take."""
    return plan_cells(
        list(cfg.variants),
        cfg.schedule.max_repeats,
        cfg.schedule.order,
        correctness=bool(_correctness_suites(cfg)),
        seed=cfg.schedule.seed or 0,
    )


def cell_suites(cfg: Config, cell: Cell) -> list[str]:
    """The suites ``cell`` runs, config order: a correctness cell the untimed and instrumented
    ones (plus the timed server suites when none of those talks to the server), a timed cell of
    round k the timed suites whose ``rounds`` include k."""
    if cell.kind == "correctness":
        picked = _correctness_suites(cfg)
        if not any(get_suite(s).needs_server for s in picked):
            picked = [s for s in cfg.suites if s in picked or get_suite(s).needs_server]
        return picked
    return [s for s in cfg.suites if get_suite(s).timed and cell.repeat in cfg.rounds_of(s)]


def suite_done(path: Path) -> bool:
    """True when ``path/summary.json`` says ok or incomplete."""
    s = runfolder.read_summary(path)
    return s is not None and s.status in ("ok", "incomplete")


def cell_done(run_dir: Path, cell: Cell, cfg: Config) -> bool:
    """True when every suite of ``cell`` has a summary with status ok or incomplete."""
    return all(suite_done(cell.path(run_dir) / s) for s in cell_suites(cfg, cell))


def _show(flag: str, value: str | None) -> str:
    return flag if value is None else f"{flag} {value}"


def instrumentation_args(
    cfg: Config, variant: str, wanted: list[tuple[str, list[str]]]
) -> list[str]:
    """The server arguments a correctness cell of ``variant`` appends for ``wanted`` ([(suite,
    its instrumentation's server_args)]), each flag once. ConfigError naming both sides when
    ``server.args``, the variant or another suite sets a flag differently, or for an argument
    the harness owns."""
    have: dict[str, tuple[str | None, str]] = {}
    for key, args in (
        ("server.args", cfg.server.args),
        (f"variants.{variant}.server_args", cfg.variants[variant].server_args),
    ):
        for _, flag, val in split_args(list(args)):
            if flag:
                have[flag] = (val, key)
    out: list[str] = []
    for suite, args in wanted:
        where = f"the {suite} suite's instrumentation"
        try:
            check_args(list(args), f"{where} (server_args)")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for i, flag, val in split_args(list(args)):
            if not flag:
                out.append(val or "")  # not a flag (sglang has no positional arguments)
                continue
            if flag in have:
                old, by = have[flag]
                if old != val:
                    raise ConfigError(
                        f"{where} needs {_show(flag, val)} in the correctness cell of variant "
                        f"'{variant}', but {by} sets {_show(flag, old)}; remove one of them "
                        f"(suites.{suite} or {by})"
                    )
                continue
            have[flag] = (val, where)
            out += [args[i]] if (val is None or "=" in args[i]) else [args[i], val]
    return out


def check_instrumentation(cfg: Config) -> dict[str, list[str]]:
    """{variant: what its correctness cell adds}, before any launch."""
    out: dict[str, list[str]] = {}
    for v in cfg.variants:
        wanted = []
        for name in cfg.suites:
            ins = get_suite(name).instrumentation(
                _placeholder_ctx(cfg, name, v), cfg.suite_params[name]
            )
            if ins is not None and ins.server_args:
                wanted.append((name, list(ins.server_args)))
        out[v] = instrumentation_args(cfg, v, wanted)
    return out


def check_releases(cfg: Config) -> None:
    """Every suite's ``check_release`` with the clients' release (the baseline's build, resolved),
    before any launch (``bench`` and its dry run): ConfigError (exit 2) naming the suite and
    the release when one refuses."""
    base = cfg.builds.get(cfg.baseline)
    site = base.env.site_dir if base is not None else envinfo.stock_site_dir()
    stock = (site or Path(".")) / "sglang"
    release = client_release(cfg)
    for name in cfg.suites:
        try:
            get_suite(name).check_release(cfg.suite_params[name], stock, release)
        except SuiteError as e:
            raise ConfigError(f"suites.{name}: sglang {release} cannot run it: {e}") from None


# ------------------------------------------------------------------------- the plan as text
def describe_plan(cfg: Config, resume: Path | None = None) -> str:
    """The resolved plan as text (``--dry-run``); with ``resume`` (a run folder) the cells done
    there are marked ``(done)``. Raises ConfigError for an instrumentation conflict."""
    cells = plan(cfg)
    extra_args = check_instrumentation(cfg)
    check_releases(cfg)
    done: set[Cell] = set()
    if resume is not None:
        from patchbench.run.preflight import resume_manifest

        resume_manifest(cfg, resume)
        done = {c for c in cells if cell_done(resume, c, cfg)}
    lines = [
        f"config     {cfg.source or '(built in memory: its manifest keeps it)'}",
        f"name       {cfg.name}",
        f"sglang     {sglang_label(cfg.sglang)}",
        *_build_lines(cfg),
        f"model      {cfg.model_ref}" + ("  (tiny, built when missing)" if cfg.model.tiny else ""),
        f"baseline   {cfg.baseline}",
        "variants:",
        *_variant_lines(cfg, extra_args),
        *_cell_lines(cfg, cells, done, resume),
        *_suite_lines(cfg, cells),
        *_server_lines(cfg),
        _launches_line(cfg, cells, done),
    ]
    return "\n".join(lines)


def _build_lines(cfg: Config) -> list[str]:
    """Each variant's build when they are not all the config's one release; the clients'."""
    if not cfg.builds or not cfg.has_own_builds():
        return []
    lines = ["builds:"]
    for v, b in cfg.builds.items():
        lines.append(f"  {v:<24} {b.describe()}")
        if b.changes is not None and v != cfg.baseline:
            lines.append(f"  {'':<24} changes from {cfg.baseline}: {b.changes.describe()}")
    base = cfg.builds[cfg.baseline]
    lines.append(f"  {'(clients)':<24} {base.python} (the baseline's build)")
    return lines


def _variant_lines(cfg: Config, extra_args: dict[str, list[str]]) -> list[str]:
    lines = []
    for v, spec in cfg.variants.items():
        tag = " (baseline)" if v == cfg.baseline else (" (A/A)" if cfg.is_aa(v) else "")
        names = [patch_label(p) for p in spec.patches]
        what = f"patches: {', '.join(names) or '(stock)'}"
        source = _source_name(cfg, v)
        if source is not None:
            what = f"{source}, patches: {', '.join(names) or 'none'}"
        lines.append(f"  {v:<24} {what}{tag}")
        if spec.server_args:
            lines.append(f"  {'':<24} server args: {shlex.join(spec.server_args)}")
        if spec.env:
            lines.append(f"  {'':<24} env: " + _env_words(cfg.shown_env(spec.env)))
        if extra_args.get(v):
            lines.append(
                f"  {'':<24} correctness cell adds: {shlex.join(extra_args[v])} (instrumentation)"
            )
    return lines


def _source_name(cfg: Config, variant: str) -> str | None:
    """A source build's name (a git build's commit and subject, a wheel's sha256), its
    ``sglang:`` as written while not resolved; None for a release."""
    b = cfg.builds.get(variant)
    if b is not None:
        if b.kind == "release":
            return None
        return b.name() or f"wheel sha256 {b.resolved[:12]}"
    spec = cfg.sglang_of(variant)
    return None if isinstance(spec, str) else sglang_label(spec)


def _cell_lines(cfg: Config, cells: list[Cell], done: set[Cell], resume: Path | None) -> list[str]:
    """The correctness cells, the timed cells in order, the stopping rule, what a resume runs."""

    def name(c: Cell) -> str:
        return (
            f"{c.variant}#correctness" if c.kind == "correctness" else f"{c.variant}#{c.repeat}"
        ) + (" (done)" if c in done else "")

    lines = []
    corr = [c for c in cells if c.kind == "correctness"]
    if corr:
        lines.append(
            "correctness "
            + " ".join(name(c) for c in corr)
            + "  (untimed: instrumented and untimed suites; feed no timing verdict)"
        )
    lines.append(
        f"schedule   {cfg.schedule.describe()}, {cfg.schedule.order_text()}: "
        + " ".join(name(c) for c in cells if c.kind == "timed")
    )
    if cfg.schedule.sequential is not None:
        lines.append(_stopping_rule(cfg))
    short = too_few_repeats(cfg)
    if short:
        lines.append(f"speed      {short}")
    if resume is not None:
        lines.append(
            f"resume     {resume}: {len(done)} of {len(cells)} cells done, "
            f"{len(cells) - len(done)} to run"
        )
    return lines


def too_few_repeats(cfg: Config) -> str | None:
    """What a fixed schedule of fewer paired repeats than ``compare.min_repeats`` cannot decide,
    said before the run (None when it has enough, or is sequential or has no variant to compare).
    """
    n, need = cfg.schedule.repeats, cfg.compare.min_repeats
    if not isinstance(n, int) or cfg.schedule.auto or n >= need:
        return None
    if len(cfg.variants) < 2 or "serving" not in cfg.suite_params:
        return None
    shows = ["output identity"] + (["accuracy"] if "mmmu" in cfg.suite_params else [])
    return (
        f"{n} paired repeat(s) cannot decide a speed change (a verdict needs "
        f"compare.min_repeats = {need}); this run shows {', '.join(shows)} and the "
        f"pipeline; speed needs schedule.repeats: {need} or more (ab: --repeats {need}), the report says how many"
    )


def _stopping_rule(cfg: Config) -> str:
    """The ``sequential`` line: when a sequential schedule stops, and on which primaries."""
    seq = cfg.schedule.sequential
    prim = sequential_primaries(cfg)
    which = (
        f"the deciding primaries ({', '.join(seq.decide_on)}) of every non-A/A variant are"
        if seq.decide_on
        else "every primary of every non-A/A variant is"
    )
    return (
        f"sequential stop when {which} decided or futile "
        f"(improved/regressed at the {seq.boundary} boundary, or equivalent within "
        f"its margin; futile: conditional power < {seq.futility:g} at max), else after {seq.max} rounds; "
        f"primaries: "
        + (
            ", ".join(f"{s}.{m} (±{pct:g}%)" for s, m, _, pct in prim)
            or "none (stops at the first look)"
        )
        + " (accuracy and exact-count primaries, and suites not in every round, are judged "
        "on the rounds they ran in and do not hold the run open)"
    )


def _suite_lines(cfg: Config, cells: list[Cell]) -> list[str]:
    """Each suite's parameters, then the suites of each kind of cell and round."""
    lines = ["suites (in this order, cache flushed between them):"]
    for sname, params in cfg.suite_params.items():
        r = cfg.suite_rounds.get(sname, "all")
        when = "" if r == "all" else f"  [rounds: {r}]"
        lines.append(f"  {sname}: {params.model_dump(mode='json')}{when}")
        suite_lines = get_suite(sname).plan_lines(params, len(cfg.variants), cpu=is_cpu(cfg))
        lines += [f"    {x}" for x in suite_lines]
    lines.append("suites per round:")
    corr = [c for c in cells if c.kind == "correctness"]
    if corr:
        lines.append(f"  correctness: {', '.join(cell_suites(cfg, corr[0])) or '(none)'}")
    groups: list[tuple[list[int], list[str]]] = []
    for k in range(cfg.schedule.max_repeats):
        here = cell_suites(cfg, Cell(0, cfg.baseline, k))
        if groups and groups[-1][1] == here:
            groups[-1][0].append(k)
        else:
            groups.append(([k], here))
    for ks, here in groups:
        which = f"round {ks[0]}" if len(ks) == 1 else f"rounds {ks[0]}-{ks[-1]}"
        lines.append(f"  {which}: {', '.join(here) or '(none)'}")
    return lines


def _env_words(env: dict[str, str]) -> str:
    """``NAME=value`` words a shell reads back as they are (each value shell-quoted)."""
    return " ".join(f"{k}={shlex.quote(x)}" for k, x in env.items())


def _server_lines(cfg: Config) -> list[str]:
    """Each variant's server command, then the server environment."""
    lines = []
    for v in cfg.variants:
        b = cfg.builds.get(v)
        python = b.python if b is not None and cfg.has_own_builds() else "python"
        s = cfg.server
        cmd = launch_command(python, cfg.model_ref, s.host, s.port, cfg.server_args_of(v))
        lines.append(f"server     {v}: " + shlex.join(cmd))
    env = cfg.shown_env(cfg.server.env)
    if cfg.server.cpu_stand_ins:
        env["PATCHBENCH_CPU_STAND_INS"] = "1"
    env["PYTHONPATH"] = "<overlay>:" + pythonpath(SITE_DIR, *stand_in_dirs(cfg))
    lines.append(
        "server env " + _env_words(env) + "  (plus each variant's own env, when it sets one)"
    )
    return lines


def _launches_line(cfg: Config, cells: list[Cell], done: set[Cell]) -> str:
    """How many servers the run launches (a range for a sequential schedule)."""
    todo = len(cells) - len(done)
    seq = cfg.schedule.sequential
    if seq is None:
        return f"{todo} server launches; nothing is launched in a dry run"
    least = len([c for c in cells if c.kind == "correctness" or c.repeat < seq.min])
    least -= len([c for c in done if c.kind == "correctness" or c.repeat < seq.min])
    return f"{least} to {todo} server launches (sequential); nothing is launched in a dry run"
