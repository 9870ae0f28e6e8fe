"""The nightly's commands: ``patchbench nightly`` (see :mod:`patchbench.nightly`), ``patchbench
history HISTORY`` (the history without SQL) and ``patchbench dashboard HISTORY --out DIR`` (the
static site, :mod:`patchbench.nightly.dashboard`): their options and what each form runs.

Every form ends in an exit code (docs/nightly.md); errors the user can cause are reported on
stderr as one line with their code, never as a traceback.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patchbench.config import load_config
from patchbench.config.nightly import DEFAULT_HISTORY, NightlySettings
from patchbench.errors import (
    EXIT_ENV,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    ConfigError,
    EnvironmentNotReady,
    PatchbenchError,
    UsageError,
)
from patchbench.matrix.spec import is_matrix_file, load_matrix
from patchbench.nightly.history import (
    config_names,
    night_infos,
    open_history,
    read_nightly_json,
    series,
    variants_of,
)
from patchbench.nightly.job import (
    HISTORY_ENV,
    history_path,
    hold_finished_run,
    nightly_on_run,
    record_only,
    run_and_gate,
    settings_from_manifest,
)
from patchbench.nightly.matrix_night import (
    nightly_matrix,
    nightly_on_matrix_run,
    record_only_matrix,
)

# ---------------------------------------------------------------------------------------------
# patchbench nightly


def add_matrix_arguments(p: argparse.ArgumentParser) -> None:
    """The options ``patchbench nightly`` takes for a matrix file (as ``patchbench matrix``)."""
    p.add_argument(
        "--on",
        choices=("local", "ray"),
        help="a matrix: local runs the units one after another here (default); ray: one Ray "
        "task per unit",
    )
    p.add_argument("--address", help="a matrix on Ray: the cluster (default: RAY_ADDRESS or local)")
    p.add_argument(
        "--results",
        metavar="DIR",
        help="parent of the run folder (a matrix: of the matrix run folder; default results/)",
    )
    p.add_argument(
        "--build-envs",
        action="store_true",
        help="a matrix: build an environment a unit's pin lacks (as `patchbench matrix "
        "--build-envs`; without it such a matrix is refused before anything runs, exit 3)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``patchbench nightly`` (the one command line, patchbench/cli.py, uses
    these too)."""
    p.add_argument("config", nargs="?", help="the experiment config or a matrix file (YAML)")
    p.add_argument(
        "--history",
        help=f"SQLite history file (default: ${HISTORY_ENV}, else the "
        f"config's nightly.history_path, else {DEFAULT_HISTORY})",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from-run", metavar="RUN_DIR", help="gate a finished run folder; run nothing")
    g.add_argument(
        "--record-only", metavar="RUN_DIR", help="only append a finished run folder to the history"
    )
    add_matrix_arguments(p)


def cli(argv: list[str], *, run_bench: Callable[[Any], Path] | None = None) -> int:
    """``patchbench nightly ...`` from raw arguments (see :mod:`patchbench.nightly`), running
    configs with ``run_bench`` (default ``patchbench.run.bench.run_bench``); the exit code."""
    import patchbench.nightly

    doc = patchbench.nightly.__doc__ or ""
    p = argparse.ArgumentParser(prog="patchbench nightly", description=doc.split("\n")[0])
    add_arguments(p)
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    return run_args(a, run_bench=run_bench)


def run_args(a: argparse.Namespace, *, run_bench: Callable[[Any], Path] | None = None) -> int:
    """``patchbench nightly`` from parsed arguments (:func:`add_arguments`); the exit code.
    ``run_bench``: Config -> run folder (default: patchbench.run.bench.run_bench into results/;
    a matrix's units run through its executor)."""
    matrix_code = _matrix_cli(a, run_bench)
    if matrix_code is not None:
        return matrix_code
    cfg = None
    settings: NightlySettings | None = None
    if a.config:
        try:
            cfg = load_config(a.config)
            settings = NightlySettings.model_validate(cfg.nightly or {})
        except ConfigError as e:
            print(f"nightly: {e}", file=sys.stderr)
            return EXIT_USAGE
    folder = a.from_run or a.record_only
    if folder:
        if not Path(folder).is_dir():
            print(f"nightly: {folder}: no such run folder", file=sys.stderr)
            return EXIT_USAGE
        try:  # one writer: no run (or report) may write the folder while it is gated
            lock = hold_finished_run(Path(folder))
        except PatchbenchError as e:
            print(f"nightly: {e.kind} (exit {e.exit_code}): {e}", file=sys.stderr)
            return e.exit_code
        try:
            settings = settings or settings_from_manifest(Path(folder)) or NightlySettings()
            hpath = history_path(settings, a.history)
            if a.record_only:
                return record_only(folder, hpath, settings.lock_timeout_s)
            return nightly_on_run(
                folder, settings, history=hpath, compare_settings=cfg.compare if cfg else None
            ).exit_code
        finally:
            if lock is not None:
                lock.release()
    if not a.config:
        print(
            "patchbench nightly: give a CONFIG (or --from-run / --record-only RUN_DIR)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    assert settings is not None and cfg is not None
    runner = run_bench or functools.partial(_default_runner, results=a.results)
    return run_and_gate(cfg, history=history_path(settings, a.history), run_bench=runner)


def _default_runner(cfg: Any, results: str | None = None) -> Path:
    """``bench`` on ``cfg`` into ``results`` (``--results DIR``), else the repository's
    results/ folder."""
    from patchbench.inputs import RESULTS_DIR
    from patchbench.run.bench import run_bench

    return run_bench(cfg, results_root=Path(results) if results else RESULTS_DIR)


def _matrix_cli(a: argparse.Namespace, run_bench: Any) -> int | None:
    """The matrix forms of ``patchbench nightly`` (a matrix file, or ``--from-run`` /
    ``--record-only`` of a matrix run folder); None when the arguments are not about a matrix."""
    folder = a.from_run or a.record_only
    matrix_folder = bool(folder) and (Path(folder) / "matrix.json").is_file()
    try:
        is_matrix = bool(a.config) and is_matrix_file(a.config)
    except ConfigError as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_USAGE
    matrix_opts = [
        o
        for o, v in (
            ("--on", a.on),
            ("--address", a.address),
            ("--results", a.results),
            ("--build-envs", a.build_envs),
        )
        if v
    ]
    if not is_matrix and not matrix_folder:
        if a.config and not folder:  # a single config's run goes into --results DIR too
            matrix_opts = [o for o in matrix_opts if o != "--results"]
        if matrix_opts:
            print(
                f"nightly: {', '.join(matrix_opts)}: only for a matrix file (a config with "
                "axes/units/base, patchbench.matrix)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return None
    try:
        return _matrix_night(a, folder, is_matrix, matrix_folder, matrix_opts, run_bench)
    except UsageError as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentNotReady as e:
        print(f"nightly: environment not ready: {e}", file=sys.stderr)
        return EXIT_ENV
    except (OSError, ValueError) as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED


def _matrix_night(
    a: argparse.Namespace,
    folder: str | None,
    is_matrix: bool,
    matrix_folder: bool,
    matrix_opts: list[str],
    run_bench: Any,
) -> int:
    """Run and gate a matrix file, or gate / record a matrix run folder; the exit code. Raises
    ConfigError (a UsageError) for arguments that do not fit together."""
    m = load_matrix(a.config) if is_matrix else None
    if folder and matrix_opts:
        raise ConfigError(f"{', '.join(matrix_opts)}: not with --from-run / --record-only")
    if a.config and not is_matrix:
        raise ConfigError(
            f"{folder} is a matrix run folder: give its matrix file or no config, not {a.config}"
        )
    if matrix_folder and a.record_only:
        return record_only_matrix(folder, a.history)
    if matrix_folder:
        return nightly_on_matrix_run(
            folder,
            settings={u.id: u.config.nightly for u in m.units} if m else None,
            compare_settings={u.id: u.config.compare for u in m.units} if m else None,
            history=a.history,
        ).exit_code
    if folder:
        raise ConfigError(
            f"{a.config} is a matrix file, but {folder} is no matrix run folder (no matrix.json)"
        )
    kw = {"build_envs": True} if a.build_envs else {}
    return nightly_matrix(
        a.config,
        on=a.on or "local",
        address=a.address,
        results=a.results,
        history=a.history,
        run_bench=run_bench,
        **kw,
    ).exit_code


# ---------------------------------------------------------------------------------------------
# patchbench history


def add_history_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``patchbench history``."""
    p.add_argument("history", metavar="HISTORY", help="the nightly history (SQLite file)")
    p.add_argument("--config", metavar="NAME", help="only this config (history key)")
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--metric",
        metavar="SUITE.METRIC",
        help="one metric's nightly series, e.g. serving.output_throughput_tok_s",
    )
    what.add_argument("--night", metavar="RUN_ID", help="one night's gates (from its nightly.json)")
    p.add_argument("--variant", metavar="V", help="with --metric: only this variant")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table: columns padded to their widest cell, numbers to 4 significant digits."""
    cells = [header] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _pick_config(h, name: str | None) -> str:
    known = config_names(h)
    if name is None:
        if len(known) == 1:
            return known[0]
        raise UsageError(f"{h.path}: several configs, name one with --config: {', '.join(known)}")
    if name not in known:
        raise UsageError(
            f"{h.path}: no nights of config {name!r}; configs: {', '.join(known) or 'none'}"
        )
    return name


def list_nights(h, config: str | None) -> dict[str, Any]:
    """Every night (of ``config``), as rows for the table and the JSON."""
    if config is not None:
        config = _pick_config(h, config)
    infos = night_infos(h, config)
    latest: dict[str, Any] = {}
    for n in infos:
        latest[n.config_name] = n
    can_see = [
        {"config": c, "run_id": n.run_id, "story": (n.story or {}).get("summary") or "", **g}
        for c, n in sorted(latest.items())
        for g in _mde_rows(n.gates)
    ]
    nights = [n.to_json() for n in infos]
    return {"history": str(h.path), "config": config, "nights": nights, "can_see": can_see}


def _mde_rows(gates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gates with a minimum detectable change (``mde_pct``, 80 % power) as short rows."""
    keys = ("gate", "kind", "variant", "n", "mde_pct", "threshold_pct")
    return [{k: g.get(k) for k in keys} for g in gates if g.get("mde_pct") is not None]


def metric_series(h, config: str | None, metric: str, variant: str | None) -> dict[str, Any]:
    """The series of ``SUITE.METRIC`` per variant of a config
    (:func:`patchbench.nightly.history.series`). Raises UsageError naming the known metrics /
    variants."""
    config = _pick_config(h, config)
    nights = h.nights(config)
    suite, _, name = metric.partition(".")
    have = sorted({f"{s}.{m}" for n in nights for (_v, s, m) in n.values})
    if not name or metric not in have:
        raise UsageError(
            f"{h.path}: config {config!r} has no metric {metric!r} (SUITE.METRIC); "
            f"it has: {', '.join(have) or 'none'}"
        )
    variants = variants_of(nights, suite, name)
    if variant is not None:
        if variant not in variants:
            raise UsageError(
                f"{h.path}: {metric} of config {config!r} has no variant {variant!r}; "
                f"it has: {', '.join(variants)}"
            )
        variants = [variant]
    return {
        "history": str(h.path),
        "config": config,
        "metric": metric,
        "series": {v: [p.to_json() for p in series(nights, v, suite, name)] for v in variants},
    }


def night_gates(h, run_id: str) -> dict[str, Any]:
    """One night's gates from its run folder's nightly.json. Raises UsageError when the night is
    not recorded or its nightly.json is gone."""
    found = [n for n in night_infos(h) if n.run_id == run_id]
    if not found:
        raise UsageError(f"{h.path}: no night {run_id!r} (list them: patchbench history {h.path})")
    n = found[0]
    js = read_nightly_json(n.run_dir)
    if js is None:
        raise UsageError(
            f"night {run_id}: {Path(str(n.run_dir or '?')) / 'nightly.json'} is gone or unreadable "
            f"(its run folder was moved or deleted); the history keeps only its values"
        )
    return {
        "history": str(h.path),
        "run_id": run_id,
        "config": n.config_name,
        "night_utc": n.night_utc,
        "release": n.release,
        "machine": n.machine,
        "outcome": js.get("outcome"),
        "exit_code": js.get("exit_code"),
        "headline": js.get("headline"),
        "gates": list(js.get("gates") or []),
        "story": js.get("story"),
    }


def _pct(x: Any) -> str:
    return f"{x:+.2f} %" if isinstance(x, (int, float)) else "-"


def render(doc: dict[str, Any]) -> str:
    """The plain-text form of what :func:`run_history` computed."""
    if "nights" in doc:
        rows = [
            [
                n["night_utc"],
                n["config_name"],
                n["release"],
                n["machine"] or "unknown",
                n["status"],
                f"{n['outcome'] or '-'} ({_fmt(n['exit_code'])})",
                n["run_dir"] if n["run_folder_present"] else f"(gone) {n['run_dir']}",
            ]
            for n in doc["nights"]
        ]
        head = ["night (UTC)", "config", "sglang", "machine", "status", "outcome", "run folder"]
        out = table(head, rows)
        see = [
            [
                g["config"],
                g["gate"],
                g["kind"],
                g["variant"],
                g["n"],
                f"{g['mde_pct']:.1f} %",
                f"{_fmt(g['threshold_pct'])} %",
            ]
            for g in doc.get("can_see") or []
        ]
        if see:
            out += (
                "\n\nWhat the gates can see (each config's latest night: the smallest change "
                "its test shows with 80 % power at that night's noise and repeats)\n"
                + table(
                    ["config", "gate", "kind", "variant", "n", "smallest change", "threshold"], see
                )
            )
        return out
    if "series" in doc:
        out = []
        for v, pts in doc["series"].items():
            rows = [
                [
                    p["night_utc"],
                    p["run_id"],
                    p["median"],
                    p["min"],
                    p["max"],
                    _pct(p["spread_pct"]),
                    p["n"],
                ]
                for p in pts
            ]
            head = ["night (UTC)", "run", "median", "min", "max", "spread", "n"]
            out.append(f"{doc['config']}: {doc['metric']} [{v}]\n" + table(head, rows))
        return "\n\n".join(out)
    rows = [
        [
            g.get("gate"),
            g.get("kind"),
            g.get("variant"),
            g.get("status"),
            _pct(g.get("change_pct")),
            _pct(g.get("bound_pct")),
            f"{g['mde_pct']:.1f} %" if isinstance(g.get("mde_pct"), (int, float)) else "-",
            g.get("p_value"),
            g.get("level"),
            f"{_fmt(g.get('value'))} vs {_fmt(g.get('reference'))} {g.get('unit') or ''}".strip(),
            g.get("reason"),
        ]
        for g in doc["gates"]
    ]
    head = (
        f"{doc['run_id']} ({doc['config']}, sglang {doc['release']}, machine "
        f"{doc['machine'] or 'unknown'}): {doc['headline']} "
        f"(exit {_fmt(doc['exit_code'])})"
    )
    for x in (doc.get("story") or {}).get("lines") or []:
        head += f"\n  {x['text']}"
    return (
        head
        + "\n"
        + table(
            [
                "gate",
                "kind",
                "variant",
                "status",
                "change",
                "bound",
                "can see",
                "p",
                "level",
                "value vs ref",
                "reason",
            ],
            rows,
        )
    )


def run_history(a: argparse.Namespace) -> int:
    """``patchbench history``: print every night (of ``--config``), a metric's series per variant
    (``--metric SUITE.METRIC [--variant V]``: median, min, max, spread, n per night) or one
    night's gates from its nightly.json (``--night RUN_ID``); ``--json`` as one document. Bad
    input is a usage error (exit 2), an unusable history exit 3."""
    if a.variant and not a.metric:
        raise UsageError("--variant needs --metric")
    with open_history(a.history) as h:
        if a.metric:
            doc = metric_series(h, a.config, a.metric, a.variant)
        elif a.night:
            doc = night_gates(h, a.night)
        else:
            doc = list_nights(h, a.config)
    print(json.dumps(doc, indent=1) if a.json else render(doc), flush=True)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# patchbench dashboard


def add_dashboard_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``patchbench dashboard``."""
    p.add_argument("history", metavar="HISTORY", help="the nightly history (SQLite file)")
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="the site's folder (kept between nights, it keeps the reports of nights whose run "
        "folder is gone)",
    )


def run_dashboard(a: argparse.Namespace) -> int:
    """Build the site; prints what it wrote and what it left out (``note:`` lines). Exit 2 for
    a missing history or an ``--out`` folder the dashboard does not own, 3 for an unusable
    history."""
    from patchbench.nightly.dashboard import build_site

    s = build_site(a.history, a.out)
    print(
        f"dashboard: {s.out / 'index.html'}: {len(s.charts)} chart(s), "
        f"{len(s.nights_copied)} night report(s) copied"
        + (f", {len(s.nights_kept)} kept from an earlier build" if s.nights_kept else "")
        + (f", {len(s.nights_gone)} night(s) whose run folder is gone" if s.nights_gone else "")
    )
    for note in s.notes:
        print(f"dashboard: note: {note}")
    return EXIT_OK
