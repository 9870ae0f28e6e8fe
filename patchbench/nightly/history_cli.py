"""``patchbench history HISTORY``: the nightly history without SQL.

- ``patchbench history HISTORY [--config NAME]``: every night (oldest first): night, config,
  sglang release, history status, the nightly outcome and exit code, the run folder;
- ``--metric SUITE.METRIC [--variant V] [--config NAME]``: that metric's series per variant: night,
  median, min, max, spread (max - min in % of the median), repeats (n);
- ``--night RUN_ID``: that night's gates from its run folder's ``nightly.json``: status, change,
  one-sided bound, p-value, level, value vs reference, reason.

``--json`` prints the same as one JSON document. Bad input (no such file, config, metric or night;
a night whose nightly.json is gone) is a usage error (exit 2); an unusable history exit 3.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from patchbench.errors import EXIT_OK, UsageError
from patchbench.nightly.dashboard.data import (
    config_names,
    night_infos,
    open_history,
    read_nightly_json,
    series,
    variants_of,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    nights = [n.to_json() for n in night_infos(h, config)]
    return {"history": str(h.path), "config": config, "nights": nights}


def metric_series(h, config: str | None, metric: str, variant: str | None) -> dict[str, Any]:
    """The series of ``SUITE.METRIC`` per variant of a config (:func:`patchbench.nightly.dashboard.data
    .series`). Raises UsageError naming the known metrics / variants."""
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
        "outcome": js.get("outcome"),
        "exit_code": js.get("exit_code"),
        "headline": js.get("headline"),
        "gates": list(js.get("gates") or []),
    }


def _pct(x: Any) -> str:
    return f"{x:+.2f} %" if isinstance(x, (int, float)) else "-"


def render(doc: dict[str, Any]) -> str:
    """The plain-text form of what :func:`run` computed."""
    if "nights" in doc:
        rows = [
            [
                n["night_utc"],
                n["config_name"],
                n["release"],
                n["status"],
                f"{n['outcome'] or '-'} ({_fmt(n['exit_code'])})",
                n["run_dir"] if n["run_folder_present"] else f"(gone) {n['run_dir']}",
            ]
            for n in doc["nights"]
        ]
        return table(["night (UTC)", "config", "sglang", "status", "outcome", "run folder"], rows)
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
            g.get("p_value"),
            g.get("level"),
            f"{_fmt(g.get('value'))} vs {_fmt(g.get('reference'))} {g.get('unit') or ''}".strip(),
            g.get("reason"),
        ]
        for g in doc["gates"]
    ]
    head = (
        f"{doc['run_id']} ({doc['config']}, sglang {doc['release']}): {doc['headline']} "
        f"(exit {_fmt(doc['exit_code'])})"
    )
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
                "p",
                "level",
                "value vs ref",
                "reason",
            ],
            rows,
        )
    )


def run(a: argparse.Namespace) -> int:
    """The command: print the nights, a metric's series or a night's gates (module docstring)."""
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


__all__ = ["add_arguments", "list_nights", "metric_series", "night_gates", "render", "run", "table"]
