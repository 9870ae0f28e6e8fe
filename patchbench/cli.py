"""The one command line, ``patchbench CMD ...``: one row of :data:`COMMANDS` per subcommand, each
ending through :func:`main` with its exit code (:mod:`patchbench.errors`). Modules are imported
when their command runs, so ``--help`` works in any environment."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from patchbench import errors
from patchbench.errors import EXIT_BUG, EXIT_ENV, EXIT_OK, EXIT_USAGE, exit_code_of
from patchbench.inputs import RESULTS_DIR
from patchbench.run.signals import restore_handlers, tolerate_closed_output

PROG = "patchbench"


def port_number(text: str) -> int:
    """argparse type of ``--port``: 1024-65535, the range ``server.port`` allows."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1024 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port}: a port between 1024 and 65535, as server.port")
    return port


def _sglang_versions(p: argparse.ArgumentParser, text: str, required: bool = False) -> None:
    p.add_argument(
        "--sglang", metavar="VERSION", nargs="+", action="extend", required=required, help=text
    )


def _patches_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patches-dir", type=Path, metavar="DIR", help="the patch folders (patches/)")


# ----------------------------------------------------------------------------------- commands
def _args_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config", nargs="?", help="the experiment config (YAML); with --resume: default the run's"
    )
    p.add_argument("--dry-run", action="store_true", help="print the resolved plan, launch nothing")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="run only the cells missing in RUN_DIR (its manifest holds the config)",
    )
    p.add_argument("--results", metavar="DIR", help="parent folder of the run folder (results/)")
    p.add_argument("--port", type=port_number, help="override server.port (1024-65535)")
    p.add_argument(
        "--kill-stale",
        action="store_true",
        help="first stop sglang servers orphaned by an earlier killed run",
    )
    p.add_argument(
        "--restart-variant",
        action="append",
        default=[],
        metavar="NAME",
        help="with --resume: run every cell of variant NAME again (its earlier cells are moved "
        "to RUN/.restarted/); needed when what the variant runs changed since those cells",
    )
    _make_env(p)
    p.add_argument(
        "-v", "--verbose", action="store_true", help="print the timing breakdown at the end"
    )


def _make_env(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--make-env",
        action="store_true",
        help="make the environment of an sglang build no environment here has, once, as a layer "
        "over the closest one (with --dry-run: say what it would install and download)",
    )


def _run_bench(a: argparse.Namespace) -> int:
    from patchbench.config import load_config
    from patchbench.run import bench
    from patchbench.run.preflight import config_of_run

    if not (a.config or a.resume):
        raise errors.UsageError(
            "give a CONFIG, or --resume RUN_DIR (its manifest holds the config)"
        )
    config = a.config or config_of_run(Path(a.resume))
    if a.dry_run:
        cfg = load_config(config) if a.config else config
        return _dry_run(cfg, a.port, a.resume, a.config, make_env=a.make_env)
    extra: dict = {k: True for k in ("kill_stale", "verbose", "make_env") if getattr(a, k)}
    if _PROCESS_T0 is not None:  # a process of its own: its start-up and imports count too
        extra["python_start_s"] = max(0.0, time.time() - _PROCESS_T0)
    if a.restart_variant:
        extra["restart_variants"] = list(a.restart_variant)
    root = a.results or RESULTS_DIR
    bench.run_bench(config, resume=a.resume, results_root=root, port=a.port, **extra)
    return EXIT_OK


def _dry_run(
    cfg,
    port: int | None = None,
    resume: str | None = None,
    label: str | None = None,
    *,
    make_env: bool = False,
) -> int:
    """``bench --dry-run``: the plan of ``cfg`` (a patchbench.config.Config; ``label``: its file
    as given) and whether its patches apply to pristine copies; returns 0. Raises, after printing
    the whole plan, what the real run would stop with: EnvironmentNotReady (exit 3) when a build
    is not ready (the run stops there first), else PatchError (exit 2) when a patch does not
    apply."""
    from patchbench.envs import builds, envinfo
    from patchbench.run import variants
    from patchbench.run.plan import describe_plan
    from patchbench.run.variants import is_cpu

    if port:  # the plan shows the port the run would use
        cfg.server.port = port
    not_ready = None
    try:
        builds.resolve_builds(cfg, cpu=is_cpu(cfg), make="plan" if make_env else "no")
    except errors.EnvironmentNotReady as e:
        not_ready = e
    print(describe_plan(cfg, Path(resume) if resume else None))
    if not_ready is not None:
        print(f"note: a real run stops here (exit 3): {not_ready}")
    if not is_cpu(cfg) and envinfo.gpu_info() is None:
        target = label or cfg.source
        doctor = (
            f"`patchbench doctor {target}` lists what a run still needs"
            if target
            else "`patchbench doctor` lists what this machine has"  # ab: a config in memory
        )
        print(f"note: no NVIDIA GPU here, and the config does not run on --device cpu: {doctor}")
    problems = variants.check_patches(cfg)
    failed = any(not p.startswith(" ") and " not checked " not in p for p in problems)
    unchecked = sum(" not checked " in p for p in problems)
    if failed:
        head = "FAIL"
    elif unchecked:
        head = (
            f"{unchecked} variant(s) not checked (below; a real run downloads what is missing "
            "and checks them before any server starts); the others apply to a pristine copy of "
            "their release"
        )
    elif any(cfg.patches_of(v) for v in cfg.variants):
        head = "every patch applies to a pristine copy of its release"
    else:
        head = "(none)"
    print("\n".join([f"patches    {head}", *problems]))
    if not_ready is not None:
        raise not_ready
    if failed:
        raise errors.PatchError("a patch does not apply (see the lines under 'patches')")
    return EXIT_OK


def _args_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a run folder (holds manifest.json)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def _run_report(a: argparse.Namespace) -> int:
    """Render the run folder under its lock (patchbench/run/lock.py): a run writing it is exit 4,
    another report is waited for; a folder without a manifest is render_run's error (exit 2)."""
    from patchbench.analysis.comparison import read_comparison
    from patchbench.records import ResultsWriteError
    from patchbench.report import console_summary, render_run
    from patchbench.run.lock import REPORT_WAIT_S, acquire, holder_text

    lock = None
    if (Path(a.run_dir) / "manifest.json").is_file():
        lock = acquire(a.run_dir, purpose="report", wait_s=REPORT_WAIT_S)
        if lock.previous:
            print(
                f"run folder lock: {holder_text(lock.previous)} ended without releasing it "
                "(it died); taken over",
                file=sys.stderr,
            )
    try:
        path = render_run(a.run_dir, plots=not a.no_plots)
        console_summary(read_comparison(a.run_dir), path)
    except ResultsWriteError as e:  # the advice of a bench run (--resume) is not this command's
        raise e.with_hint(
            f"nothing measured is lost; free space (or make the folder writable), then run "
            f"`{PROG} report {a.run_dir}` again"
        ) from None
    finally:
        if lock is not None:
            lock.release()
    return EXIT_OK


def _args_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", type=Path, help="run folder whose baseline is compared")
    p.add_argument("run_b", type=Path, help="run folder whose variant is compared")
    p.add_argument("--variant", help="variant of RUN_B (default: its first non-baseline variant)")
    p.add_argument("--out", type=Path, help="also write the result as JSON to this file")


def _run_compare(a: argparse.Namespace) -> int:
    from patchbench import records
    from patchbench.analysis import two_runs

    res = two_runs.compare_runs(a.run_a, a.run_b, a.variant)
    print(two_runs.format_result(res))
    if a.out:
        records.write_json(a.out, res)
    return EXIT_OK


def _args_check_patch(p: argparse.ArgumentParser) -> None:
    _sglang_versions(
        p, "only these releases, e.g. --sglang 0.5.1.post3 0.5.23 (default: all in each manifest)"
    )
    p.add_argument("--patch", metavar="NAME", help="only this patch (a folder in patches/)")
    _patches_dir(p)
    p.add_argument("--cache-dir", type=Path, help="wheels and derived diffs (default: .cache)")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")


#: severity order when several (patch, release) checks fail: the last listed wins
_CHECK_ORDER = [EXIT_OK, EXIT_ENV, EXIT_USAGE]


def _run_check_patch(a: argparse.Namespace) -> int:
    """One line per (patch, release): OK, SKIP (release not in the manifest, patch not named) or
    FAIL, and for a diff that does not apply its state and next step
    (:mod:`patchbench.patches.state`). Exit: the worst of 0, 3 (a wheel could not be fetched)
    and 2 (anything else)."""
    from patchbench.inputs import CACHE_DIR, PATCHES_DIR
    from patchbench.patches import apply, manifest, state

    cache, pdir = a.cache_dir or CACHE_DIR, a.patches_dir or PATCHES_DIR
    names = [a.patch] if a.patch else manifest.available_patches(pdir)
    if not names:
        raise errors.UsageError(f"no patches found under {pdir}")
    worst, failed, results = EXIT_OK, 0, []

    def fail(name: str, ver: str, e: errors.PatchError) -> None:
        nonlocal worst, failed
        print(f"{name:<20} {ver:<12} FAIL  {e}")
        worst, failed = max(worst, exit_code_of(e), key=_CHECK_ORDER.index), failed + 1

    for name in names:
        try:
            m = manifest.load_manifest(name, patches_dir=pdir)
        except errors.PatchError as e:
            fail(name, "-", e)
            continue
        for ver in a.sglang or list(m.releases):
            if ver not in m.releases and not a.patch:
                supports = ", ".join(m.releases)
                print(f"{name:<20} {ver:<12} SKIP  no diff for this release (supports {supports})")
                continue
            try:
                res = apply.check_patch(name, ver, cache_dir=cache, patches_dir=pdir)
            except errors.PatchError as e:
                fail(name, ver, e)
                if exit_code_of(e) == EXIT_USAGE:  # why it does not apply, and what to do
                    try:
                        st = state.patch_state(name, ver, cache_dir=cache, patches_dir=pdir)
                    except errors.PatchError:  # the FAIL line says why
                        continue
                    if st.state != "applies":
                        print(f"{'':<33} state: {st.summary}")
                        for line in st.lines()[1:]:
                            print(f"{'':<33} {line.strip()}")
                continue
            files = "  ".join(
                f"{Path(p).name} {h['before'][:8]}..->{h['after'][:8]}.."
                for p, h in res["files"].items()
            )
            print(
                f"{name:<20} {ver:<12} OK    {files}  (diff {res['patch_sha256'][:8]}.., "
                f"{res['source'].split()[0]}, compiles)"
            )
            results.append(res)
    if a.json:
        print(json.dumps(results, indent=1))
    if worst != EXIT_OK:
        print(
            f"{PROG} check-patch: {failed} check(s) failed (exit {worst}); see the FAIL lines "
            "above",
            file=sys.stderr,
        )
    return worst


def _args_new_patch(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the new folder in patches/")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-diff", metavar="FILE", help="a unified diff of python/sglang/ files")
    src.add_argument(
        "--from-git",
        nargs=2,
        metavar=("CHECKOUT", "REV_RANGE"),
        help="an sglang checkout and a range git diff takes (e.g. main...my-branch)",
    )
    _sglang_versions(
        p,
        "the releases the patch is for, e.g. --sglang 0.5.1.post3 0.5.23 (the flag may also be "
        "repeated)",
        required=True,
    )
    p.add_argument("--description", default="", help="one paragraph for the manifest")
    p.add_argument("--force", action="store_true", help="replace an existing patch folder")
    _patches_dir(p)


def _run_new_patch(a: argparse.Namespace) -> int:
    """Write patches/NAME (manifest with hashes, one diff per release it applies to); exit 2 when
    it applies to none of the releases asked for."""
    from patchbench.patches import author

    opts = {"description": a.description, "force": a.force, "patches_dir": a.patches_dir}
    if a.from_diff:
        res = author.new_patch_from_diff(a.name, a.from_diff, a.sglang, **opts)
    else:
        res = author.new_patch_from_git(a.name, *a.from_git, a.sglang, **opts)
    print(res.summary())
    return EXIT_OK


def _args_ab(p: argparse.ArgumentParser) -> None:
    from patchbench import ab

    g = p.add_argument_group("B: what the change is (one of)")
    g.add_argument("--git", metavar="CHECKOUT", help="an sglang checkout (bare or not)")
    g.add_argument("--range", metavar="A...B", help="main...my-branch: merge base vs branch head")
    g.add_argument("--base", metavar="REF", help="the baseline's commit (with --head)")
    g.add_argument("--head", metavar="REF", help="the variant's commit (with --base)")
    g.add_argument("--patch", metavar="FILE", help="a unified diff of python/sglang/ files")
    g.add_argument("--args-b", metavar='"ARGS"', help="server arguments of B (quoted)")
    p.add_argument("--args-a", metavar='"ARGS"', help="server arguments of A, the baseline")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--preset",
        default="cpu-demo",
        help=f"configs/presets/NAME.yaml: {', '.join(ab.presets())} (default cpu-demo)",
    )
    src.add_argument("--config", metavar="FILE", help="a config whose variants are replaced")
    p.add_argument("--repeats", type=int, help="override schedule.repeats")
    p.add_argument("--results", metavar="DIR", help="parent folder of the run folder")
    p.add_argument("--port", type=port_number, help="override server.port (1024-65535)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, launch nothing")
    p.add_argument(
        "--allow-uncompiled",
        action="store_true",
        help="run a range that changes compiled code no build here compiles (sgl-kernel/, "
        "csrc/, *.cu, *.cpp, CMake, the Rust router; on the CPU preset also such files under "
        "python/sglang/), measuring its Python part only; the manifest, report, compare.json "
        "and PR comment say what was left out (without it such a range is refused, exit 2)",
    )
    _make_env(p)


def _run_ab(a: argparse.Namespace) -> int:
    """Build the A/B config (:func:`patchbench.ab.prepare_ab`), then its dry run or the run; the
    bench prints the answer, then the report's path."""
    from patchbench import ab
    from patchbench.run import bench

    cfg = ab.prepare_ab(a)
    if a.dry_run:
        return _dry_run(cfg, a.port, make_env=a.make_env)
    run_dir = bench.run_bench(
        cfg, results_root=a.results or RESULTS_DIR, port=a.port, make_env=a.make_env
    )
    print(f"ab: report {run_dir / 'report.md'}")
    return EXIT_OK


def _args_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", nargs="?", help="folder (default: .cache/models/tiny-qwen25vl-tf<N>)")
    p.add_argument("--force", action="store_true", help="rebuild even when complete")


def _run_tiny(a: argparse.Namespace) -> int:
    from patchbench.envs.tinymodel import build_tiny_qwen25vl, default_model_dir

    out = Path(a.out) if a.out else default_model_dir()
    build_tiny_qwen25vl(out, force=a.force)
    print(out)
    return EXIT_OK


def _args_doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="also check what this config needs")


def _run_doctor(a: argparse.Namespace) -> int:
    from patchbench import doctor

    return doctor.run_doctor(a.config)


@dataclass(frozen=True)
class Command:
    """One subcommand: ``add_args(parser)`` declares its options, ``run(args)`` returns its exit
    code."""

    name: str
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def lazy(name: str, text: str, module: str, add: str = "add_arguments", run: str = "run"):
    """The :class:`Command` whose ``module.<add>(parser)`` and ``module.<run>(args)`` are
    imported only when it is used."""
    return Command(
        name,
        text,
        lambda p: getattr(importlib.import_module(module), add)(p),
        lambda a: int(getattr(importlib.import_module(module), run)(a)),
    )


#: every subcommand, in the order ``--help`` lists them
COMMANDS: list[Command] = [
    Command("bench", "run every variant of CONFIG through its suites; write results/<run>/",
            _args_bench, _run_bench),
    Command("report", "re-render a run folder's compare.json, report.md and plots",
            _args_report, _run_report),
    Command("compare", "compare the baseline of RUN_A with a variant of RUN_B (two runs)",
            _args_compare, _run_compare),
    lazy("nightly", "run a config (or a matrix), append it to the history and apply the "
         "regression gates", "patchbench.nightly.commands", run="run_args"),
    lazy("history", "list the nightly history's nights, a metric's series (--metric) or a "
         "night's gates (--night)", "patchbench.nightly.commands",
         add="add_history_arguments", run="run_history"),
    lazy("dashboard", "write the nightly history as a static site (charts, change points, "
         "reports) into --out", "patchbench.nightly.commands",
         add="add_dashboard_arguments", run="run_dashboard"),
    Command("check-patch", "apply every patch to a pristine copy of each release it supports",
            _args_check_patch, _run_check_patch),
    Command("new-patch", "make patches/NAME from a diff or a git range, with hashes for each "
            "release", _args_new_patch, _run_new_patch),
    Command("ab", "your change against its baseline in one command: a branch (--git CHECKOUT "
            "--range main...my-branch), a diff (--patch) or server arguments (--args-b), with a "
            "preset", _args_ab, _run_ab),
    lazy("score-mmmu", "re-score saved MMMU responses against an answer key",
         "patchbench.suites.mmmu.scoring", run="run_args"),
    lazy("matrix", "run a matrix of configs (models, pins, GPU types) here or on a Ray cluster; "
         "one report", "patchbench.matrix.driver", add="add_cli_arguments", run="run_cli"),
    lazy("comment", "a pull-request comment from RUN's compare.json; --post keeps one sticky "
         "comment", "patchbench.report.comment"),
    Command("make-tiny-model", "build the tiny random Qwen2.5-VL the CPU configs use",
            _args_tiny, _run_tiny),
    Command("doctor", "what this environment is, and what it lacks for CONFIG",
            _args_doctor, _run_doctor),
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every command, generated from :data:`COMMANDS`."""
    raw = argparse.RawDescriptionHelpFormatter
    codes = errors.exit_code_table()
    ap = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=raw,
        description="A/B benchmarking and accuracy-regression suite for sglang patches.",
        epilog=f"{codes}\n\n`{PROG} CMD --help` shows the options of one command.",
    )
    sub = ap.add_subparsers(dest="command", metavar="CMD", title="commands")
    for c in COMMANDS:
        p = sub.add_parser(
            c.name, help=c.help, description=c.help, epilog=codes, formatter_class=raw
        )
        c.add_args(p)
        p.set_defaults(_command=c)
    return ap


#: when this process was created (epoch seconds), set by :func:`main` when it reads sys.argv
_PROCESS_T0: float | None = None

#: options whose value is itself a command line (``ab --args-b "--disable-overlap-schedule"``)
DASH_VALUE_OPTIONS = ("--args-a", "--args-b")


def glue_dash_values(argv: list[str]) -> list[str]:
    """``argv`` with each :data:`DASH_VALUE_OPTIONS` option joined to its value
    (``["--args-b", "--x 1"]`` -> ``["--args-b=--x 1"]``): argparse reads a separate value that
    starts with ``-`` as another option."""
    out: list[str] = []
    it = iter(argv)
    for tok in it:
        nxt = next(it, None) if tok in DASH_VALUE_OPTIONS else None
        out.append(tok if nxt is None else f"{tok}={nxt}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (:data:`patchbench.errors.EXIT_CODES`), never
    raises."""
    # torch.cuda imports the deprecated pynvml shim that sglang's dependencies install
    warnings.filterwarnings(
        "ignore", message="The pynvml package is deprecated", category=FutureWarning
    )
    global _PROCESS_T0
    own_process = argv is None
    if own_process:  # the command line of a process of its own (not a call from a test)
        import psutil

        _PROCESS_T0 = psutil.Process().create_time()
        tolerate_closed_output(sys)  # `patchbench CMD | head -1` ends quietly with CMD's code
    argv = glue_dash_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (argparse printed it: 2)
        return exit_code_of(e)
    cmd: Command | None = getattr(args, "_command", None)
    if cmd is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(cmd.run(args) or 0)
    except SystemExit as e:  # sys.exit inside a command
        return exit_code_of(e)
    except BaseException as e:  # noqa: BLE001 - every way out gets its documented code
        code, text = exit_code_of(e), str(e).strip()
        if code == EXIT_BUG:
            traceback.print_exc()
            text = (
                f"{type(e).__name__}: {e} (a bug in patchbench: please report the traceback above)"
            )
        head = f"{PROG} {cmd.name}: {errors.kind_of(e)} (exit {code})"
        print(f"{head}: {text}" if text else head, file=sys.stderr)
        return code
    finally:
        restore_handlers(exiting=own_process)  # a second signal is ignored until here
