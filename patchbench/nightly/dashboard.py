"""The nightly history as a static site (``patchbench dashboard HISTORY --out DIR``,
:func:`build_site`): plain HTML pages from string templates, one plotly chart per (config,
metric), plotly's JavaScript once in ``assets/``; no server and no CDN at view time.

Layout of ``DIR``::

    index.html                     tonight's state per config (the landing view)
    configs/<config>.html          per gated metric a chart, then every night in a table
    nights/<run_id>/nightly.html   that night's nightly.md rendered (report.html: report.md,
                                   report-details.html), the .md files, nightly.json and
                                   plots/ copied beside
    assets/plotly.min.js           from the installed plotly package

Every link is relative and resolves inside ``DIR`` (the site can be published anywhere, e.g.
GitHub Pages); a night whose run folder is gone is named as such, without a link.
"""

from __future__ import annotations

import html
import json
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from patchbench import records
from patchbench.config.schema import run_id_problem
from patchbench.errors import EnvironmentNotReady, UsageError
from patchbench.nightly.history import (
    NightInfo,
    config_names,
    metrics_of,
    night_infos,
    open_history,
    read_change_points,
    series,
    variants_of,
)

#: outcome word -> colour of its badge (anything else: grey)
COLOURS = {
    "green": "#1a7f37",
    "red": "#cf222e",
    "underpowered": "#bf8700",
    "learning": "#0969da",
    "run failed": "#6e7781",
    "environment not ready": "#6e7781",
    "config error": "#6e7781",
}
GREY = "#8c959f"
#: a night's reports, copied and rendered (the first present is the one linked)
REPORTS = ("nightly.md", "report.md", "report-details.md")
#: the marker file of a site folder the dashboard wrote: JSON with every file it wrote there
#: (relative paths); only those are ever replaced or removed
MARKER = ".patchbench-dashboard"
#: what a folder the dashboard adopts without a marker may hold (a site written before markers)
LEGACY_ENTRIES = frozenset({"index.html", "configs", "assets", "nights"})
#: the largest file copied from a run folder into the site (a larger one is left out, noted)
MAX_COPY_BYTES = 8 << 20
#: the colours of the variants' traces, in order
TRACE_COLOURS = ("#0969da", "#8250df", "#1b7c83", "#bc4c00", "#57606a")

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.2em 2em;color:#1f2328}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #d0d7de;padding:.3em .6em;
text-align:left;vertical-align:top;white-space:nowrap}td.wrap{white-space:normal}th{background:#f6f8fa}
.badge{display:inline-block;padding:.1em .6em;border-radius:1em;color:#fff;font-weight:600}
.gone{color:#6e7781;font-style:italic}.chart{width:100%;max-width:1100px;height:420px}
.note{color:#57606a;font-size:.9em}pre{background:#f6f8fa;padding:.6em;overflow-x:auto}
"""


def _page(title: str, body: str, *, depth: int, plotly: bool = False) -> str:
    """A whole HTML page; ``depth``: folders below DIR (for the relative asset path)."""
    up = "../" * depth
    script = f'<script src="{up}assets/plotly.min.js"></script>\n' if plotly else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n{script}</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


def slug(name: str) -> str:
    """A file-name-safe form of a config name or run id (``@`` and ``/`` become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def _esc(x: Any) -> str:
    """``x`` as HTML text: terminal controls removed (:func:`patchbench.records.printable`),
    escaped."""
    return html.escape(records.printable("" if x is None else str(x)))


def _badge(outcome: str | None) -> str:
    word = outcome or "no report"
    return (
        f'<span class="badge" data-outcome="{_esc(word)}" '
        f'style="background:{COLOURS.get(word, GREY)}">{_esc(word)}</span>'
    )


def _x(night_utc: str) -> str:
    """A night's time as plotly reads dates: ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    return datetime.strptime(night_utc, "%Y-%m-%dT%H:%M:%SZ").strftime("%Y-%m-%d %H:%M:%S")


def _failing_text(n: NightInfo) -> str:
    parts = []
    for g in n.failing:
        chg = g.get("change_pct")
        num = f" {chg:+.1f} %" if isinstance(chg, (int, float)) else ""
        parts.append(
            f"{g.get('suite')}.{g.get('metric')} ({g.get('variant')}, {g.get('kind')}){num}"
        )
    return "; ".join(parts)


@dataclass
class SiteSummary:
    """What :func:`build_site` wrote: ``pages`` (paths relative to DIR), ``charts``: chart div id
    -> {trace name: number of points}; run ids: ``nights_copied`` (from their run folders),
    ``nights_kept`` (run folder gone, an earlier build's copy kept), ``nights_gone`` (neither);
    ``notes``: what was left out and why (a symbolic link, a file outside its run folder, a run
    id that cannot name a folder); ``written``: every file written (relative to DIR)."""

    out: Path
    pages: list[str] = field(default_factory=list)
    charts: dict[str, dict[str, int]] = field(default_factory=dict)
    nights_copied: list[str] = field(default_factory=list)
    nights_kept: list[str] = field(default_factory=list)
    nights_gone: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    written: set[str] = field(default_factory=set)


class SiteFolderRefused(UsageError):
    """``dashboard --out DIR`` names a folder the dashboard does not own: not empty and without
    its :data:`MARKER` (nothing was written; exit 2, "site folder refused")."""

    kind = "site folder refused"


@dataclass
class _Site:
    """The site folder being written: ``old`` the files an earlier build wrote (its marker),
    ``summary`` what this build wrote."""

    out: Path
    old: set[str]
    summary: SiteSummary

    def write(self, rel: str, data: str | bytes) -> None:
        """Write ``DIR/rel`` atomically (never through a link out of DIR) and note it."""
        path = self.out / rel
        root = self.out.resolve()
        parent = path.parent
        parent.mkdir(parents=True, exist_ok=True)
        if parent.resolve() != root and root not in parent.resolve().parents:
            raise SiteFolderRefused(f"{parent}: leads out of the site folder {self.out}")
        if path.is_symlink():
            path.unlink()
        records.write_bytes(path, data.encode() if isinstance(data, str) else data)
        self.summary.written.add(rel)

    def keep(self, prefix: str) -> None:
        """Keep the files an earlier build wrote under ``prefix`` (a night whose folder is gone)."""
        self.summary.written.update(r for r in self.old if r.startswith(prefix))

    def drop(self, prefix: str) -> None:
        """Remove the files an earlier build wrote under ``prefix`` (a night copied again)."""
        for rel in sorted(r for r in self.old if r.startswith(prefix)):
            _remove(self.out, rel)
            self.old.discard(rel)


def _remove(out: Path, rel: str) -> None:
    """Remove ``DIR/rel`` (a file or link, never followed) and the folders it leaves empty."""
    path = out / rel
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
    except OSError:
        return
    parent = path.parent
    while parent != out and out in parent.parents:
        try:
            parent.rmdir()  # only an empty one
        except OSError:
            break
        parent = parent.parent


def _open_site(out: Path) -> set[str]:
    """The files an earlier build wrote into ``out`` (its :data:`MARKER`); an empty set for a
    new or empty folder or a site written before markers. Raises :class:`SiteFolderRefused` for
    anything else that is not empty."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise SiteFolderRefused(f"{out}: not a folder; give a new or empty folder for the site")
    if not out.exists():
        return set()
    marker = out / MARKER
    if marker.is_file() and not marker.is_symlink():
        try:
            doc = json.loads(marker.read_text(encoding="utf-8"))
            files = doc["files"]
            if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
                raise ValueError("files is not a list of names")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SiteFolderRefused(
                f"{marker}: unreadable ({e}); remove the folder or give another --out"
            ) from None
        return {f for f in files if _inside_rel(f)}
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return set()
    if entries <= LEGACY_ENTRIES and (out / "assets" / "plotly.min.js").is_file():
        return set()  # a site written before markers: adopted, nothing of it removed
    shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
    raise SiteFolderRefused(
        f"{out} is not empty ({shown}) and holds no {MARKER}: it is not a site the dashboard "
        "wrote, and the build would replace what is there; give a new or empty folder (--out)"
    )


def _inside_rel(rel: str) -> bool:
    """``rel`` is a plain relative path below the site folder (no ``..``, not absolute)."""
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def _read_own(root: Path, rel: str, notes: list[str], what: str) -> bytes | None:
    """The bytes of ``root/rel`` when it is a regular file of the run folder ``root`` (resolved)
    itself, no larger than :data:`MAX_COPY_BYTES`; None when absent, and a note in ``notes``
    when it is a symbolic link, not a regular file, outside ``root`` or too large."""
    path = root / rel
    try:
        st = os.lstat(path)
    except OSError:
        return None
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "a symbolic link (never followed)"
    elif not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif root not in path.resolve().parents:
        why = "outside its run folder"
    elif st.st_size > MAX_COPY_BYTES:
        why = f"{st.st_size} bytes, over the {MAX_COPY_BYTES} a copied file may have"
    if why is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            why = f"unreadable ({e.strerror})"
        else:
            with os.fdopen(fd, "rb") as f:
                if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return f.read(MAX_COPY_BYTES + 1)[:MAX_COPY_BYTES]
            why = "not a regular file"
    notes.append(f"{what}: {path} left out: {why}")
    return None


# ---------------------------------------------------------------------------------------- nights


def _md_to_html(text: str, folder: Path) -> str:
    """Markdown rendered (markdown-it, CommonMark + tables); a relative link to ``X.md`` points
    at its rendered ``X.html``; a relative link or image whose target is not in ``folder``
    becomes its plain text."""
    from markdown_it import MarkdownIt

    # raw HTML in the markdown stays text: a report quotes model outputs and error messages
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(records.printable(text))
    root = folder.resolve()

    def inside(rel: str) -> bool:
        p = (folder / rel).resolve()
        return p.is_file() and root in p.parents

    def fix_link(m: re.Match) -> str:
        href, inner = html.unescape(m.group(1)), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", href):
            return m.group(0)
        target = re.sub(r"\.md$", ".html", href)
        if inside(target):
            return f'<a href="{html.escape(target)}">{inner}</a>'
        return inner

    def fix_img(m: re.Match) -> str:
        src = html.unescape(m.group(1))
        if re.match(r"^[a-z][a-z0-9+.-]*:", src) or inside(src):
            return m.group(0)
        return f'<span class="gone">[{m.group(2)}]</span>'

    body = re.sub(r'<a href="([^"]*)"[^>]*>(.*?)</a>', fix_link, body, flags=re.S)
    return re.sub(r'<img src="([^"]*)" alt="([^"]*)"[^>]*>', fix_img, body)


def _copy_night(n: NightInfo, site: _Site) -> str | None:
    """Copy night ``n``'s reports into ``out/nights/<run_id>/`` and render them; returns the
    page to link (relative to DIR). Only regular files of the run folder itself are copied: a
    symbolic link, or a file whose real path is outside the run folder, is left out with a note
    (:func:`_read_own`). When the run folder is gone, the copy an earlier build left in ``out``
    is kept and linked; None when there is none, or the folder has no report."""
    out, notes = site.out, site.summary.notes
    prefix = f"nights/{slug(n.run_id)}/"
    if not n.folder_present:
        site.keep(prefix)
        return _link(out, n)  # copied by an earlier build into the same DIR, else None
    src = Path(str(n.run_dir))
    if src.is_symlink():
        notes.append(f"night {n.run_id}: its run folder {src} is a symbolic link: not copied")
        return None
    root = src.resolve()
    site.drop(prefix)
    copied: dict[str, bytes] = {}
    for name in (*REPORTS, "nightly.json"):
        data = _read_own(root, name, notes, f"night {n.run_id}")
        if data is not None:
            copied[name] = data
    plots = root / "plots"
    if plots.is_symlink():
        notes.append(f"night {n.run_id}: {plots} left out: a symbolic link (never followed)")
    elif plots.is_dir():
        for png in sorted(p.name for p in plots.iterdir() if p.name.endswith(".png")):
            data = _read_own(root, f"plots/{png}", notes, f"night {n.run_id}")
            if data is not None:
                copied[f"plots/{png}"] = data
    for rel, data in copied.items():
        site.write(prefix + rel, data)
    dest = out / prefix
    # the .html names exist before any page is rendered, so the reports link each other
    mds = [m for m in REPORTS if m in copied]
    for m in mds:
        site.write(prefix + m.replace(".md", ".html"), b"")
    for m in mds:
        body = _md_to_html(copied[m].decode(errors="replace"), dest)
        back = (
            f'<p class="note"><a href="../../index.html">all configs</a> · '
            f'<a href="../../configs/{slug(n.config_name)}.html">{_esc(n.config_name)}</a> · '
            f'raw: <a href="{m}">{m}</a></p>'
        )
        page = _page(f"{n.run_id}: {m}", back + body, depth=2)
        site.write(prefix + m.replace(".md", ".html"), page)
    if not mds:
        return None
    return f"{prefix}{mds[0].replace('.md', '.html')}"


def _night_cell(n: NightInfo, links: dict[str, str | None], up: str, label: str = "") -> str:
    """The night's link (text: ``label`` or its run id), or why it has none."""
    link = links.get(n.run_id)
    if link:
        return f'<a href="{up}{link}" title="{_esc(n.run_id)}">{_esc(label or n.run_id)}</a>'
    why = "run folder gone" if not n.folder_present else "no report in its run folder"
    return f'{_esc(label or n.run_id)} <span class="gone">({why})</span>'


# ---------------------------------------------------------------------------------------- charts


def _chart(
    div_id: str,
    nights: list,
    infos: list[NightInfo],
    cps: list[dict],
    suite: str,
    metric: str,
    links: dict[str, str | None],
) -> tuple[str, dict[str, int]]:
    """One metric's chart: per variant the nightly medians with the repeats' range as error
    bars, red nights, change points and release changes; returns (HTML, {trace: points})."""
    import plotly.graph_objects as go

    unit = next(
        (n.units.get((suite, metric)) for n in reversed(nights) if n.units.get((suite, metric))), ""
    )
    fig = go.Figure()
    variants = variants_of(nights, suite, metric)
    counts, medians = _variant_traces(fig, nights, infos, suite, metric, unit, variants, links)
    counts.update(_red_night_trace(fig, infos, suite, metric, variants, medians, links))
    counts.update(_change_point_trace(fig, cps, suite, metric, unit))
    _release_lines(fig, infos)
    fig.update_layout(
        title={"text": f"{suite}.{metric}", "x": 0.01},
        xaxis={"title": {"text": "night (UTC)"}, "type": "date", "tickformat": "%b %d"},
        yaxis={"title": {"text": f"{metric} [{unit}]" if unit else metric}},
        legend={"orientation": "h", "y": -0.22},
        margin={"l": 70, "r": 20, "t": 50, "b": 80},
        hovermode="closest",
        template="plotly_white",
    )
    return _chart_html(div_id, fig, suite, metric), counts


def _variant_traces(
    fig: Any,
    nights: list,
    infos: list[NightInfo],
    suite: str,
    metric: str,
    unit: str,
    variants: list[str],
    links: dict[str, str | None],
) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
    """One trace per variant on ``fig``: its nightly medians with the repeats' range as error
    bars; returns ({variant: points}, {variant: {run id: median}})."""
    import plotly.graph_objects as go

    info = {i.run_id: i for i in infos}
    counts: dict[str, int] = {}
    medians: dict[str, dict[str, float]] = {}
    for k, variant in enumerate(variants):
        pts = series(nights, variant, suite, metric)
        medians[variant] = {p.run_id: p.median for p in pts}
        hover = [
            f"{p.run_id}<br>median {p.median:.4g} {unit} (n={p.n}, range {p.low:.4g}–{p.high:.4g})"
            f"<br>sglang {info[p.run_id].release if p.run_id in info else '?'}"
            f"<br>{(info[p.run_id].outcome if p.run_id in info else None) or 'no report'}"
            for p in pts
        ]
        fig.add_trace(
            go.Scatter(
                x=[_x(p.night_utc) for p in pts],
                y=[p.median for p in pts],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [p.high - p.median for p in pts],
                    "arrayminus": [p.median - p.low for p in pts],
                    "thickness": 1,
                    "width": 3,
                },
                mode="lines+markers",
                name=variant,
                line={"color": TRACE_COLOURS[k % len(TRACE_COLOURS)], "width": 1.5},
                marker={"size": 6},
                text=hover,
                hoverinfo="text",
                customdata=[links.get(p.run_id) or "" for p in pts],
            )
        )
        counts[variant] = len(pts)
    return counts, medians


def _red_night_trace(
    fig: Any,
    infos: list[NightInfo],
    suite: str,
    metric: str,
    variants: list[str],
    medians: dict[str, dict[str, float]],
    links: dict[str, str | None],
) -> dict[str, int]:
    """The red nights' marks on ``fig`` (:func:`_red_y`); returns {"red night": marks} (empty
    without one)."""
    import plotly.graph_objects as go

    reds = [(i, _red_y(i, suite, metric, variants, medians)) for i in infos if i.outcome == "red"]
    reds = [(i, y) for i, y in reds if y is not None]
    if not reds:
        return {}
    fig.add_trace(
        go.Scatter(
            x=[_x(i.night_utc) for i, _ in reds],
            y=[y for _, y in reds],
            mode="markers",
            name="red night",
            marker={"symbol": "x", "size": 14, "color": COLOURS["red"], "line": {"width": 2}},
            text=[f"{i.run_id}: RED<br>{_esc(_failing_text(i))}" for i, _ in reds],
            hoverinfo="text",
            customdata=[links.get(i.run_id) or "" for i, _ in reds],
        )
    )
    return {"red night": len(reds)}


def _change_point_trace(
    fig: Any, cps: list[dict], suite: str, metric: str, unit: str
) -> dict[str, int]:
    """The change points of (suite, metric) on ``fig``: a mark each and a shaded span; returns
    {"change point": marks} (empty without one)."""
    import plotly.graph_objects as go

    mine = [c for c in cps if (c["suite"], c["metric"]) == (suite, metric) and c.get("start_utc")]
    if not mine:
        return {}
    fig.add_trace(
        go.Scatter(
            x=[_x(c["start_utc"]) for c in mine],
            y=[c["after"] for c in mine],
            mode="markers",
            name="change point",
            marker={"symbol": "diamond", "size": 12, "color": "#fb8500"},
            text=[
                f"change point ({c['variant']}): {c['size_pct']:+.1f} % "
                f"({c['before']:.4g} → {c['after']:.4g} {unit}), {c['nights']} night(s) "
                f"from {c['run_id']}"
                + (" (worse)" if c.get("worse") else "")
                + (", new tonight, unconfirmed" if c.get("confirmed") == 0 else "")
                for c in mine
            ],
            hoverinfo="text",
        )
    )
    for c in mine:
        fig.add_vrect(
            x0=_x(c["start_utc"]),
            x1=_x(c.get("end_utc") or c["start_utc"]),
            line={"color": "#fb8500", "width": 2, "dash": "dash"},
            fillcolor="#fb8500",
            opacity=0.12,
        )
    return {"change point": len(mine)}


def _release_lines(fig: Any, infos: list[NightInfo]) -> None:
    """A dotted line on ``fig``, labelled with the release, where the sglang release changes."""
    prev = None
    for i in infos:
        if prev is not None and i.release != prev:
            fig.add_vline(x=_x(i.night_utc), line={"color": "#57606a", "width": 1, "dash": "dot"})
            fig.add_annotation(
                x=_x(i.night_utc),
                y=1.0,
                yref="paper",
                text=f"sglang {_esc(i.release)}",
                showarrow=False,
                xanchor="left",
                yanchor="bottom",
                font={"size": 11},
            )
        prev = i.release


def _chart_html(div_id: str, fig: Any, suite: str, metric: str) -> str:
    """The chart's ``<div>`` and the script that draws ``fig`` there (a click on a point opens
    its night's report)."""
    import plotly.io as pio

    fig_json = pio.to_json(fig, validate=False)
    return (
        f'<div id="{div_id}" class="chart" data-metric="{_esc(suite)}.{_esc(metric)}"></div>\n'
        f"<script>(function(){{var f={fig_json};"
        f'var d=document.getElementById("{div_id}");'
        "Plotly.newPlot(d,f.data,f.layout,{responsive:true,displaylogo:false});"
        "d.on('plotly_click',function(e){var u=e.points[0].customdata;"
        "if(u){window.location.href='../'+u;}});})();</script>\n"
    )


def _red_y(
    n: NightInfo, suite: str, metric: str, variants: list[str], medians: dict[str, dict[str, float]]
) -> float | None:
    """Where a red night's mark goes on (suite, metric)'s chart: the median of the variant whose
    gate on this metric failed, else the first variant's (the baseline); None without a value."""
    failed = [
        g.get("variant") for g in n.failing if (g.get("suite"), g.get("metric")) == (suite, metric)
    ]
    for v in [*failed, *variants]:
        if v in medians and n.run_id in medians[v]:
            return medians[v][n.run_id]
    return None


# ----------------------------------------------------------------------------------------- pages


def _config_page(h, config: str, infos: list[NightInfo], links, summary: SiteSummary) -> str:
    nights = [x for x in h.nights(config) if not run_id_problem(x.run_id)]
    cps = read_change_points(h, config)
    parts = [
        '<p class="note"><a href="../index.html">all configs</a></p>',
        f"<h1>{_esc(config)}</h1>",
        f'<p class="note">{len(infos)} night(s); change points as found by the latest night '
        "that looked (dashed, orange); red nights: red ×; a dotted line marks a new sglang "
        "release. Error bars: the range of the night's repeats. Click a point to open its "
        "night's report.</p>",
    ]
    if infos:
        parts.append(_blind_html(infos[-1]))
    for k, (suite, metric) in enumerate(metrics_of(nights, infos)):
        div_id = f"chart-{slug(config)}-{k}"
        chart, counts = _chart(div_id, nights, infos, cps, suite, metric, links)
        summary.charts[div_id] = counts
        parts.append(chart)
    rows = []
    for n in reversed(infos):
        rows.append(
            f"<tr><td>{_esc(_x(n.night_utc)[:16])}</td><td>{_night_cell(n, links, '../')}</td>"
            f"<td>{_badge(n.outcome)}</td><td>{_esc(n.release)}</td>"
            f'<td>{_esc(n.patch_state)}</td><td class="wrap">{_esc(_failing_text(n))}</td></tr>'
        )
    parts.append(
        "<h2>Nights</h2>\n<table><tr><th>night (UTC)</th><th>run (report)</th><th>outcome</th>"
        "<th>sglang</th><th>patch state</th><th>failing gates</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>"
    )
    return _page(f"patchbench nightly: {config}", "\n".join(parts), depth=1, plotly=True)


def stale_text(n: NightInfo, now: datetime) -> str:
    """ "stale: last night N days ago" when ``n`` (a config's latest night) is older than 1.5
    times its schedule (``nightly.schedule_hours``, default daily: 36 h), else ""."""
    every = n.schedule_hours or 24.0
    age_h = (now - datetime.strptime(n.night_utc, "%Y-%m-%dT%H:%M:%SZ")).total_seconds() / 3600
    if age_h <= 1.5 * every:
        return ""
    days = age_h / 24.0
    ago = f"{days:.0f} days" if days >= 1.95 else f"{age_h:.0f} h"
    return f"stale: last night {ago} ago (it runs every {every:g} h)"


def index_order(latest: dict[str, NightInfo]) -> list[str]:
    """The index's rows: configs whose latest night has a new problem first (the newest night
    first), then the other red ones, then the rest by name."""

    def rank(config: str) -> tuple:
        n = latest[config]
        red = (n.story or {}).get("red")
        group = 0 if red == "new" else (1 if n.outcome == "red" else 2)
        return (group, "" if group == 2 else _newest_first(n.night_utc), config)

    return sorted(latest, key=rank)


def _newest_first(night_utc: str) -> str:
    """A sort key that puts later nights first (digits complemented)."""
    return "".join(chr(ord("9") - ord(c) + ord("0")) if c.isdigit() else c for c in night_utc)


def _blind_html(n: NightInfo) -> str:
    """The latest night's story and what its gates can see (``mde_pct``, 80 % power)."""
    out = []
    summary = (n.story or {}).get("summary")
    if summary:
        out.append(f'<p class="note" data-story>Latest night: {_esc(summary)}</p>')
    rows = [
        f"<tr><td>{_esc(g.get('suite'))}.{_esc(g.get('metric'))} ({_esc(g.get('kind'))})</td>"
        f"<td>{_esc(g.get('variant'))}</td><td>{_esc(g.get('n'))}</td>"
        f"<td data-mde>{g['mde_pct']:.1f} %</td><td>{_esc(g.get('threshold_pct'))} %</td></tr>"
        for g in n.gates
        if isinstance(g.get("mde_pct"), (int, float))
    ]
    if rows:
        out.append(
            '<h2>What the gates can see</h2>\n<p class="note">The smallest change each gate\'s '
            "test shows with 80 % power at the latest night's noise and repeats; below it the "
            "gate is blind, whatever its threshold.</p>\n<table><tr><th>gate</th><th>variant</th>"
            "<th>repeats</th><th>smallest change seen</th><th>threshold</th></tr>\n"
            + "\n".join(rows)
            + "\n</table>"
        )
    return "\n".join(out)


def _index_page(latest: dict[str, NightInfo], links, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    rows = []
    for config in index_order(latest):
        n = latest[config]
        story = "; ".join(x for x in ((n.story or {}).get("summary"), stale_text(n, now)) if x)
        rows.append(
            f'<tr data-config="{_esc(config)}"><td><a href="configs/{slug(config)}.html">'
            f"{_esc(config)}</a></td><td>{_badge(n.outcome)}</td><td>{_esc(_x(n.night_utc)[:16])}</td>"
            f'<td class="wrap" data-story>{_esc(story)}</td>'
            f"<td>{_esc(n.release)}</td><td>{_esc(n.patch_state)}</td>"
            f'<td class="wrap">{_esc(_failing_text(n))}</td><td>{_night_cell(n, links, "", "nightly report")}</td></tr>'
        )
    body = (
        "<h1>patchbench nightly</h1>\n"
        '<p class="note">Tonight\'s state per config: its latest night. Colours: '
        + " ".join(_badge(w) for w in ("green", "red", "underpowered", "run failed"))
        + " (the newest new problem first)</p>\n<table><tr><th>config</th><th>outcome</th>"
        "<th>night (UTC)</th><th>since when</th><th>sglang</th>"
        "<th>patch state</th><th>failing gates</th><th>report</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>"
    )
    return _page("patchbench nightly", body, depth=0)


def build_site(history: str | Path, out: str | Path, *, now: datetime | None = None) -> SiteSummary:
    """Write the static site of a nightly history into ``out`` (module docstring).

    ``out`` must be new, empty, or a site the dashboard wrote (its :data:`MARKER` lists every
    file it wrote; a site written before markers, holding only the site's own entries, is
    adopted). The build writes ``index.html``, ``configs/``, ``assets/`` and ``nights/<run>/``
    for every night whose run folder is present, then removes only the files the earlier build
    wrote that this one did not; a night whose run folder is gone keeps the copy an earlier build
    left (so a site folder kept between nights, e.g. beside the history, keeps every report);
    nothing else in ``out`` is touched. A night whose run id cannot name a folder
    (:func:`patchbench.config.schema.run_id_problem`) is left out with a note.

    Raises UsageError (exit 2) for a missing history file, :class:`SiteFolderRefused` (exit 2)
    for an ``out`` that is not the dashboard's, :class:`patchbench.nightly.history.HistoryError`
    (exit 3) for an unusable history; EnvironmentNotReady (exit 3) without plotly or
    markdown-it-py. ``now`` (naive UTC; default the clock): when a config is stale."""
    try:
        import markdown_it  # noqa: F401
        import plotly.offline
    except ImportError as e:
        raise EnvironmentNotReady(
            f"the dashboard needs {e.name} (requirements/harness.txt): run make setup"
        ) from None

    out = Path(out)
    with open_history(history) as h:
        old = _open_site(out)
        out.mkdir(parents=True, exist_ok=True)
        summary = SiteSummary(out)
        site = _Site(out, set(old), summary)
        site.write("assets/plotly.min.js", plotly.offline.get_plotlyjs())
        latest: dict[str, NightInfo] = {}
        for config in config_names(h):
            infos = _valid(night_infos(h, config), summary.notes)
            links = {}
            for n in infos:
                links[n.run_id] = _copy_night(n, site)
                if links[n.run_id]:
                    summary.pages.append(links[n.run_id])
                    (summary.nights_copied if n.folder_present else summary.nights_kept).append(
                        n.run_id
                    )
                elif not n.folder_present:
                    summary.nights_gone.append(n.run_id)
            page = f"configs/{slug(config)}.html"
            site.write(page, _config_page(h, config, infos, links, summary))
            summary.pages.append(page)
            if infos:
                latest[config] = infos[-1]
        site.write(
            "index.html",
            _index_page(latest, {n.run_id: _link(out, n) for n in latest.values()}, now),
        )
        summary.pages.insert(0, "index.html")
        for stale in sorted(site.old - summary.written):  # written before, not now: ours to remove
            _remove(out, stale)
        marker = {"written_by": "patchbench dashboard", "files": sorted(summary.written)}
        records.write_json(out / MARKER, marker)
    return summary


def _valid(infos: list[NightInfo], notes: list[str]) -> list[NightInfo]:
    """The nights whose run id can name a folder of the site; a note for each other one."""
    keep = []
    for n in infos:
        problem = run_id_problem(n.run_id)
        if problem:
            notes.append(
                f"night {n.run_id!r} ({n.config_name}) left out: its run id cannot name a "
                f"folder: {problem}"
            )
        else:
            keep.append(n)
    return keep


def _link(out: Path, n: NightInfo) -> str | None:
    """The night's page already in ``out`` (relative to it), None when there is none."""
    for m in REPORTS:
        rel = f"nights/{slug(n.run_id)}/{m.replace('.md', '.html')}"
        if (out / rel).is_file():
            return rel
    return None


__all__ = ["COLOURS", "MARKER", "SiteFolderRefused", "SiteSummary", "build_site", "slug"]
