"""The one command line: ``patchbench CMD ...`` (also ``python -m patchbench`` and ``runner.py``).

Every subcommand is one row of :data:`COMMANDS` (name, one-line help, its options, the function
that runs it); ``patchbench --help`` is generated from that table and from the exit-code table
:data:`patchbench.errors.EXIT_CODES`. Every command ends the same way (:func:`main`):

- it returns an exit code, or raises; an error deriving from
  :class:`patchbench.errors.PatchbenchError` becomes its documented exit code and a message on
  stderr that starts with ``patchbench CMD: <kind> (exit N):`` (the error's ``kind``);
- Ctrl-C (KeyboardInterrupt) exits 130 in every command; :class:`patchbench.errors.Interrupted`
  exits 130, or 143 for SIGTERM;
- anything else is a bug: exit 70 with the traceback.

Modules are imported only when their command runs, so ``--help`` works in any environment.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from patchbench import errors
from patchbench.errors import EXIT_BUG, EXIT_CODES, EXIT_ENV, EXIT_OK, EXIT_USAGE
from patchbench.run.closed_output import tolerate_closed_output
from patchbench.run.signals import restore_handlers

PROG = "patchbench"


# ------------------------------------------------------------------------------ exception table
def exit_code_of(exc: BaseException) -> int:
    """The documented exit code of ``exc``: :func:`patchbench.errors.exit_code_of`
    (KeyboardInterrupt -> 130, SystemExit -> its code, unknown -> 70)."""
    if isinstance(exc, SystemExit):
        return (
            exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
        )
    return errors.exit_code_of(exc)


def _report(cmd: str, exc: BaseException, code: int) -> None:
    """Print the error line (and, for a multi-line message, its detail lines) on stderr:
    ``patchbench CMD: <kind> (exit N): <message>`` (:func:`patchbench.errors.kind_of`)."""
    text = str(exc).strip()
    head = f"{PROG} {cmd}: {errors.kind_of(exc)} (exit {code})"
    print(f"{head}: {text}" if text else head, file=sys.stderr)


def port_number(text: str) -> int:
    """argparse type of ``--port``: the range ``server.port`` allows in a config (1024-65535),
    so the option cannot launch servers on a port the config would refuse."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1024 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port}: a port between 1024 and 65535, as server.port")
    return port


# ----------------------------------------------------------------------------------- commands
def _args_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the experiment config (YAML)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved plan, launch nothing")
    p.add_argument("--resume", metavar="RUN_DIR", help="run only the cells missing in RUN_DIR")
    p.add_argument(
        "--results", metavar="DIR", help="parent folder of the run folder (default results/)"
    )
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
    p.add_argument(
        "-v", "--verbose", action="store_true", help="print the timing breakdown at the end"
    )


def _run_bench(a: argparse.Namespace, _raw: list[str]) -> int:
    from patchbench.config import load_config
    from patchbench.envs import builds, envinfo
    from patchbench.run import bench, variants
    from patchbench.run.cell import is_cpu
    from patchbench.run.plan import describe_plan

    if a.dry_run:
        cfg = load_config(a.config)
        if a.port:  # the plan shows the port the run would use
            cfg.server.port = a.port
        note = None
        try:
            builds.resolve_builds(cfg, cpu=is_cpu(cfg))
        except errors.EnvironmentNotReady as e:
            note = f"note: a real run stops here (exit 3): {e}"
        print(describe_plan(cfg, Path(a.resume) if a.resume else None))
        if note:
            print(note)
        if not is_cpu(cfg) and envinfo.gpu_info() is None:
            print(
                "note: no NVIDIA GPU here, and the config does not run on --device cpu: "
                f"`patchbench doctor {a.config}` lists what a run still needs"
            )
        problems = variants.check_patches(cfg)
        failed = any(not p.startswith(" ") and " not checked " not in p for p in problems)
        unchecked = sum(" not checked " in p for p in problems)
        head = (
            "FAIL"
            if failed
            else f"{unchecked} variant(s) not checked (below; a real run downloads what is "
            "missing and checks them before any server starts); the others apply to a pristine "
            "copy of their release"
            if unchecked
            else "every patch applies to a pristine copy of its release"
            if any(cfg.patches_of(v) for v in cfg.variants)
            else "(none)"
        )
        print("\n".join([f"patches    {head}", *problems]))
        if failed:
            raise errors.PatchError("a patch does not apply (see the lines under 'patches')")
        return EXIT_OK
    extra: dict = {k: True for k in ("kill_stale", "verbose") if getattr(a, k)}
    if _PROCESS_T0 is not None:  # a process of its own: its start-up and imports count too
        extra["python_start_s"] = max(0.0, time.time() - _PROCESS_T0)
    if a.restart_variant:
        extra["restart_variants"] = list(a.restart_variant)
    bench.run_bench(a.config, resume=a.resume, results_root=a.results, port=a.port, **extra)
    return EXIT_OK


def _args_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a run folder (holds manifest.json)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def _args_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", type=Path, help="run folder whose baseline is compared")
    p.add_argument("run_b", type=Path, help="run folder whose variant is compared")
    p.add_argument("--variant", help="variant of RUN_B (default: its first non-baseline variant)")
    p.add_argument("--out", type=Path, help="also write the result as JSON to this file")


def _run_report(a: argparse.Namespace, _raw: list[str]) -> int:
    """Render the run folder under its lock (patchbench/run/lock.py): a run writing it is named
    at once (exit 4), another report is waited for up to ``REPORT_WAIT_S``. A folder without a
    manifest is left to render_run's own error (exit 2) and gets no lock file."""
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


def _run_compare(a: argparse.Namespace, _raw: list[str]) -> int:
    from patchbench import records
    from patchbench.analysis import two_runs

    res = two_runs.compare_runs(a.run_a, a.run_b, a.variant)
    print(two_runs.format_result(res))
    if a.out:
        records.write_json(a.out, res)
    return EXIT_OK


def _args_check_patch(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sglang",
        metavar="VERSION",
        nargs="+",
        action="extend",
        help="only these releases, e.g. --sglang 0.5.1.post3 0.5.23 (default: all in each "
        "manifest)",
    )
    p.add_argument("--patch", metavar="NAME", help="only this patch (a folder in patches/)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="wheels and derived diffs (default: .cache/patches)",
    )
    p.add_argument("--json", action="store_true", help="also print the results as JSON")


#: severity order when several (patch, release) checks fail: the last listed wins
_CHECK_ORDER = [EXIT_OK, EXIT_ENV, EXIT_USAGE]


def _run_check_patch(a: argparse.Namespace, _raw: list[str]) -> int:
    """Apply each patch (or ``--patch``) to a pristine copy of each release in its manifest (or
    ``--sglang``); one line per (patch, release). Exit 0 all OK; 2 a diff that does not apply,
    does not compile, an invalid manifest or an unknown patch/release; 3 a wheel could not be
    fetched. A patch without the ``--sglang`` release is SKIP unless it was named. A diff that
    does not apply is followed by its state (:mod:`patchbench.patches.state`: already contained
    in the release, or conflicts at FILE hunk N) and the next step."""
    import json

    from patchbench.patches import apply, manifest, state

    cache = a.cache_dir or manifest.DEFAULT_CACHE_DIR
    names = [a.patch] if a.patch else manifest.available_patches()
    if not names:
        raise errors.UsageError("no patches found under patches/")
    worst, failed, results = EXIT_OK, 0, []
    for name in names:
        try:
            m = manifest.load_manifest(name)
        except errors.PatchError as e:
            print(f"{name:<20} {'-':<12} FAIL  {e}")
            worst, failed = max(worst, exit_code_of(e), key=_CHECK_ORDER.index), failed + 1
            continue
        for ver in a.sglang or list(m.releases):
            if ver not in m.releases and not a.patch:
                print(
                    f"{name:<20} {ver:<12} SKIP  no diff for this release (supports "
                    f"{', '.join(m.releases)})"
                )
                continue
            try:
                res = apply.check_patch(name, ver, cache_dir=cache)
            except errors.PatchError as e:
                print(f"{name:<20} {ver:<12} FAIL  {e}")
                worst, failed = max(worst, exit_code_of(e), key=_CHECK_ORDER.index), failed + 1
                if exit_code_of(e) == EXIT_USAGE:  # why it does not apply, and what to do
                    st = _patch_state_or_none(state, name, ver, cache)
                    if st is not None:
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


def _patch_state_or_none(state, name: str, ver: str, cache: Path):
    """:func:`patchbench.patches.state.patch_state`, or None when it cannot be had (the FAIL line
    above already says why)."""
    try:
        st = state.patch_state(name, ver, cache_dir=cache)
    except errors.PatchError:
        return None
    return None if st.state == "applies" else st


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
    p.add_argument(
        "--sglang",
        metavar="VERSION",
        nargs="+",
        action="extend",
        required=True,
        help="the releases the patch is for, e.g. --sglang 0.5.1.post3 0.5.23 (the flag may "
        "also be repeated)",
    )
    p.add_argument("--description", default="", help="one paragraph for the manifest")
    p.add_argument("--force", action="store_true", help="replace an existing patch folder")


def _run_new_patch(a: argparse.Namespace, _raw: list[str]) -> int:
    """Write patches/NAME (manifest with hashes, one diff per release it applies to); exit 2 when
    it applies to none of the releases asked for."""
    from patchbench.patches import author

    opts = {"description": a.description, "force": a.force}
    if a.from_diff:
        res = author.new_patch_from_diff(a.name, a.from_diff, a.sglang, **opts)
    else:
        res = author.new_patch_from_git(a.name, a.from_git[0], a.from_git[1], a.sglang, **opts)
    print(res.summary())
    if not res.applies:
        raise errors.PatchError(f"patch '{a.name}' applies to none of {', '.join(a.sglang)}")
    return EXIT_OK


def _args_ab(p: argparse.ArgumentParser) -> None:
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
        help="configs/presets/NAME.yaml: cpu-demo (default), pr-h200, sweep-h200 (a load curve)",
    )
    src.add_argument("--config", metavar="FILE", help="a config whose variants are replaced")
    p.add_argument("--repeats", type=int, help="override schedule.repeats")
    p.add_argument("--results", metavar="DIR", help="parent folder of the run folder")
    p.add_argument("--port", type=port_number, help="override server.port (1024-65535)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, launch nothing")


def _run_ab(a: argparse.Namespace, _raw: list[str]) -> int:
    """Write the A/B config (:func:`patchbench.ab.prepare_ab`), then its dry run or the run; the
    bench prints the answer, then the report's path."""
    from patchbench import ab
    from patchbench.run import bench

    path = ab.prepare_ab(a)
    if a.dry_run:
        return main(["bench", str(path), "--dry-run", *(["--port", str(a.port)] if a.port else [])])
    run_dir = bench.run_bench(path, results_root=a.results, port=a.port)
    print(f"ab: report {run_dir / 'report.md'}")
    return EXIT_OK


def _args_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", nargs="?", help="folder (default: .cache/models/tiny-qwen25vl-tf<N>)")
    p.add_argument("--force", action="store_true", help="rebuild even when complete")


def _run_tiny(a: argparse.Namespace, _raw: list[str]) -> int:
    from patchbench.envs.tinymodel import build_tiny_qwen25vl, default_model_dir

    out = Path(a.out) if a.out else default_model_dir()
    build_tiny_qwen25vl(out, force=a.force)
    print(out)
    return EXIT_OK


def _args_doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="also check what this config needs")


def _run_doctor(a: argparse.Namespace, _raw: list[str]) -> int:
    from patchbench import doctor

    return doctor.run_doctor(a.config)


@dataclass(frozen=True)
class Command:
    """One subcommand: ``name``, one-line ``help``, ``add_args(parser)`` declaring its options and
    ``run(args, raw_argv) -> exit code`` (raw_argv: the arguments after the command name)."""

    name: str
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], int]


def _lazy(
    module: str, add: str = "add_arguments", run: str = "run"
) -> tuple[
    Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace, list[str]], int]
]:
    """A command's (add_args, run) from ``module``, imported only when the command is used:
    ``module.<add>(parser)`` declares its options, ``module.<run>(args)`` returns its exit code."""

    def add_args(p: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(module), add)(p)

    def run_command(a: argparse.Namespace, _raw: list[str]) -> int:
        return int(getattr(importlib.import_module(module), run)(a))

    return add_args, run_command


#: every subcommand, in the order ``--help`` lists them
COMMANDS: list[Command] = [
    Command(
        "bench",
        "run every variant of CONFIG through its suites; write results/<run>/",
        _args_bench,
        _run_bench,
    ),
    Command(
        "report",
        "re-render a run folder's compare.json, report.md and plots",
        _args_report,
        _run_report,
    ),
    Command(
        "compare",
        "compare the baseline of RUN_A with a variant of RUN_B (two runs)",
        _args_compare,
        _run_compare,
    ),
    Command(
        "nightly",
        "run a config (or a matrix), append it to the history and apply the regression gates",
        *_lazy("patchbench.nightly.commands", run="run_args"),
    ),
    Command(
        "history",
        "list the nightly history's nights, a metric's series (--metric) or a night's gates (--night)",
        *_lazy("patchbench.nightly.commands", "add_history_arguments", "run_history"),
    ),
    Command(
        "dashboard",
        "write the nightly history as a static site (charts, change points, reports) into --out",
        *_lazy("patchbench.nightly.commands", "add_dashboard_arguments", "run_dashboard"),
    ),
    Command(
        "check-patch",
        "apply every patch to a pristine copy of each release it supports",
        _args_check_patch,
        _run_check_patch,
    ),
    Command(
        "new-patch",
        "make patches/NAME from a diff or a git range, with hashes for each release",
        _args_new_patch,
        _run_new_patch,
    ),
    Command(
        "ab",
        "your change against its baseline in one command: a branch (--git CHECKOUT --range "
        "main...my-branch), a diff (--patch) or server arguments (--args-b), with a preset",
        _args_ab,
        _run_ab,
    ),
    Command(
        "score-mmmu",
        "re-score saved MMMU responses against an answer key",
        *_lazy("patchbench.suites.mmmu.cli", run="run_args"),
    ),
    Command(
        "matrix",
        "run a matrix of configs (models, pins, GPU types) here or on a Ray cluster; one report",
        *_lazy("patchbench.matrix.cli", add="add_cli_arguments", run="run_cli"),
    ),
    Command(
        "comment",
        "a pull-request comment from RUN's compare.json; --post keeps one sticky comment",
        *_lazy("patchbench.report.comment"),
    ),
    Command(
        "make-tiny-model",
        "build the tiny random Qwen2.5-VL the CPU configs use",
        _args_tiny,
        _run_tiny,
    ),
    Command(
        "doctor",
        "what this environment is, and what it lacks for CONFIG",
        _args_doctor,
        _run_doctor,
    ),
]


def exit_code_table() -> str:
    """The exit codes as help text, one line per code (from patchbench.errors.EXIT_CODES)."""
    return (
        "exit codes:\n"
        + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())
        + f"\n  {EXIT_BUG:>3}  internal error (a bug: the traceback is printed)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every command, generated from :data:`COMMANDS`."""
    ap = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A/B benchmarking and accuracy-regression suite for sglang patches.",
        epilog=exit_code_table() + f"\n\n`{PROG} CMD --help` shows the options of one command.",
    )
    sub = ap.add_subparsers(dest="command", metavar="CMD", title="commands")
    for c in COMMANDS:
        p = sub.add_parser(
            c.name,
            help=c.help,
            description=c.help,
            epilog=exit_code_table(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        c.add_args(p)
        p.set_defaults(_command=c)
    return ap


#: when this process was created (epoch seconds), set by :func:`main` when it reads sys.argv
_PROCESS_T0: float | None = None


def _process_created() -> float | None:
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - the start-up figure is a courtesy
        return None


#: options whose value is itself a command line (``ab --args-b "--disable-overlap-schedule"``)
DASH_VALUE_OPTIONS = ("--args-a", "--args-b")


def glue_dash_values(argv: list[str]) -> list[str]:
    """``argv`` with each :data:`DASH_VALUE_OPTIONS` option joined to its value
    (``["--args-b", "--x 1"]`` -> ``["--args-b=--x 1"]``): argparse reads a separate value that
    starts with ``-`` as another option."""
    out: list[str] = []
    it = iter(argv)
    for tok in it:
        if tok in DASH_VALUE_OPTIONS:
            nxt = next(it, None)
            out.append(tok if nxt is None else f"{tok}={nxt}")
        else:
            out.append(tok)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (see :func:`exit_code_table`), never raises."""
    # torch.cuda imports the deprecated pynvml shim that sglang's dependencies install
    warnings.filterwarnings(
        "ignore", message="The pynvml package is deprecated", category=FutureWarning
    )
    global _PROCESS_T0
    own_process = argv is None
    if own_process:  # the command line of a process of its own (not a call from a test)
        _PROCESS_T0 = _process_created()
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
    raw = argv[argv.index(cmd.name) + 1 :]
    try:
        return _run_command(cmd, args, raw)
    finally:
        restore_handlers(exiting=own_process)  # a second signal is ignored until here


def _run_command(cmd: Command, args: argparse.Namespace, raw: list[str]) -> int:
    """``cmd.run`` turned into its exit code (see :func:`main`)."""
    try:
        return int(cmd.run(args, raw) or 0)
    except SystemExit as e:  # sys.exit inside a command
        return exit_code_of(e)
    except BaseException as e:  # noqa: BLE001 - every way out gets its documented code
        code = exit_code_of(e)
        if code == EXIT_BUG:
            traceback.print_exc()
            print(
                f"{PROG} {cmd.name}: internal error (exit {code}): {type(e).__name__}: {e} "
                "(a bug in patchbench: please report the traceback above)",
                file=sys.stderr,
            )
        else:
            _report(cmd.name, e, code)
        return code


__all__ = [
    "COMMANDS",
    "Command",
    "build_parser",
    "exit_code_of",
    "exit_code_table",
    "main",
]
