"""The run's cells in order (:func:`plan`) and the resolved plan as text (:func:`describe_plan`,
what ``bench --dry-run`` prints): variants, cells, suites per round, the stopping rule of a
sequential schedule, the server commands and environment, the number of launches."""

from __future__ import annotations

from pathlib import Path

from patchbench.config import Config, patch_label, sglang_label
from patchbench.run.cell import (
    cell_done,
    cell_suites,
    check_instrumentation,
    is_cpu,
    needs_correctness_cells,
)
from patchbench.run.looks import sequential_primaries
from patchbench.run.order import Cell, plan_cells
from patchbench.run.preflight import resume_manifest
from patchbench.run.variants import _pythonpath, stand_in_dirs
from patchbench.shims import SITE_DIR
from patchbench.suite import get_suite


def plan(cfg: Config) -> list[Cell]:
    """The run's cells: one correctness cell per variant first when a suite is instrumented or
    untimed (patchbench.run.cell.needs_correctness_cells), then the timed rounds (as many as the
    schedule may take: a sequential schedule's ``max``; it may stop earlier)."""
    return plan_cells(
        list(cfg.variants),
        cfg.schedule.max_repeats,
        cfg.schedule.order,
        correctness=needs_correctness_cells(cfg),
    )


def describe_plan(cfg: Config, resume: Path | None = None) -> str:
    """The resolved plan as text (``--dry-run``): variants (patches, server arguments,
    environment), cells in order, the suites of each round, the stopping rule of a sequential
    schedule, commands.

    With ``resume`` (a run folder, checked by :func:`patchbench.run.preflight.resume_manifest`),
    cells already done there are marked ``(done)`` and only the rest count as launches. Raises
    ConfigError for a conflict between an instrumentation's server arguments and the config's.
    """
    cells = plan(cfg)
    extra_args = check_instrumentation(cfg)
    done: set[Cell] = set()
    if resume is not None:
        resume_manifest(cfg, resume)
        done = {c for c in cells if cell_done(resume, c, cfg)}
    lines = [
        f"config     {cfg.source}",
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
    """Each variant's build (environment, interpreter) when the run resolved builds and they are
    not all the config's one release; the clients' environment."""
    if not cfg.builds or not cfg.has_own_builds():
        return []
    lines = ["builds:"]
    lines += [f"  {v:<24} {b.describe()}" for v, b in cfg.builds.items()]
    base = cfg.builds[cfg.baseline]
    lines.append(f"  {'(clients)':<24} {base.python} (the baseline's build)")
    return lines


def _variant_lines(cfg: Config, extra_args: dict[str, list[str]]) -> list[str]:
    lines = []
    for v, spec in cfg.variants.items():
        tag = " (baseline)" if v == cfg.baseline else (" (A/A)" if cfg.is_aa(v) else "")
        names = [patch_label(p) for p in spec.patches]
        lines.append(f"  {v:<24} patches: {', '.join(names) or '(stock)'}{tag}")
        if spec.server_args:
            lines.append(f"  {'':<24} server args: {' '.join(spec.server_args)}")
        if spec.env:
            lines.append(f"  {'':<24} env: " + " ".join(f"{k}={x}" for k, x in spec.env.items()))
        if extra_args.get(v):
            lines.append(
                f"  {'':<24} correctness cell adds: {' '.join(extra_args[v])} (instrumentation)"
            )
    return lines


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
        f"schedule   {cfg.schedule.describe()}, {cfg.schedule.order}: "
        + " ".join(name(c) for c in cells if c.kind == "timed")
    )
    if cfg.schedule.sequential is not None:
        lines.append(_stopping_rule(cfg))
    if resume is not None:
        lines.append(
            f"resume     {resume}: {len(done)} of {len(cells)} cells done, "
            f"{len(cells) - len(done)} to run"
        )
    return lines


def _stopping_rule(cfg: Config) -> str:
    """The ``sequential`` line: when a sequential schedule stops, and on which primaries."""
    seq = cfg.schedule.sequential
    prim = sequential_primaries(cfg)
    return (
        f"sequential stop when every primary of every non-A/A variant is decided or futile "
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


def _round_groups(cfg: Config, rounds: int) -> list[tuple[list[int], list[str]]]:
    """[(consecutive round indices, the timed suites they run)]."""
    out: list[tuple[list[int], list[str]]] = []
    for k in range(rounds):
        here = cell_suites(cfg, Cell(0, cfg.baseline, k))
        if out and out[-1][1] == here:
            out[-1][0].append(k)
        else:
            out.append(([k], here))
    return out


def _suite_lines(cfg: Config, cells: list[Cell]) -> list[str]:
    """Each suite's parameters (and rounds), then the suites of the correctness cells and of
    each group of rounds."""
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
    for ks, here in _round_groups(cfg, cfg.schedule.max_repeats):
        which = f"round {ks[0]}" if len(ks) == 1 else f"rounds {ks[0]}-{ks[-1]}"
        lines.append(f"  {which}: {', '.join(here) or '(none)'}")
    return lines


def _server_lines(cfg: Config) -> list[str]:
    """Each variant's server command, then the server environment."""
    lines = []
    for v in cfg.variants:
        b = cfg.builds.get(v)
        cmd = [
            b.python if b is not None and cfg.has_own_builds() else "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            cfg.model_ref,
            "--host",
            cfg.server.host,
            "--port",
            str(cfg.server.port),
            *cfg.server_args_of(v),
        ]
        lines.append(f"server     {v}: " + " ".join(cmd))
    env = dict(cfg.server.env)
    if cfg.server.cpu_stand_ins:
        env["PATCHBENCH_CPU_STAND_INS"] = "1"
        env["PYTHONPATH"] = "<overlay>:" + _pythonpath(SITE_DIR, *stand_in_dirs(cfg))
    else:
        env["PYTHONPATH"] = "<overlay>:" + str(SITE_DIR)
    lines.append(
        "server env "
        + " ".join(f"{k}={v}" for k, v in env.items())
        + "  (plus each variant's own env, when it sets one)"
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
