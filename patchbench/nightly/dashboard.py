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
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from patchbench.errors import EnvironmentNotReady
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
    "run failed": "#6e7781",
    "environment not ready": "#6e7781",
    "config error": "#6e7781",
}
GREY = "#8c959f"
#: a night's reports, copied and rendered (the first present is the one linked)
REPORTS = ("nightly.md", "report.md", "report-details.md")
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
    return html.escape("" if x is None else str(x))


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
    ``nights_kept`` (run folder gone, an earlier build's copy kept), ``nights_gone`` (neither)."""

    out: Path
    pages: list[str] = field(default_factory=list)
    charts: dict[str, dict[str, int]] = field(default_factory=dict)
    nights_copied: list[str] = field(default_factory=list)
    nights_kept: list[str] = field(default_factory=list)
    nights_gone: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- nights


def _md_to_html(text: str, folder: Path) -> str:
    """Markdown rendered (markdown-it, CommonMark + tables); a relative link to ``X.md`` points
    at its rendered ``X.html``; a relative link or image whose target is not in ``folder``
    becomes its plain text."""
    from markdown_it import MarkdownIt

    # raw HTML in the markdown stays text: a report quotes model outputs and error messages
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
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


def _copy_night(n: NightInfo, out: Path) -> str | None:
    """Copy night ``n``'s reports into ``out/nights/<run_id>/`` and render them; returns the
    page to link (relative to DIR). When the run folder is gone, the copy an earlier build left
    in ``out`` is kept and linked; None when there is none, or the folder has no report."""
    dest = out / "nights" / slug(n.run_id)
    if not n.folder_present:
        return _link(out, n)  # copied by an earlier build into the same DIR, else None
    src = Path(str(n.run_dir))
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*REPORTS, "nightly.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
    if (src / "plots").is_dir():
        (dest / "plots").mkdir(exist_ok=True)
        for png in sorted((src / "plots").glob("*.png")):
            shutil.copy2(png, dest / "plots" / png.name)
    # the .html names exist before any page is rendered, so the reports link each other
    mds = [m for m in REPORTS if (dest / m).is_file()]
    for m in mds:
        (dest / m.replace(".md", ".html")).touch()
    for m in mds:
        body = _md_to_html((dest / m).read_text(errors="replace"), dest)
        back = (
            f'<p class="note"><a href="../../index.html">all configs</a> · '
            f'<a href="../../configs/{slug(n.config_name)}.html">{_esc(n.config_name)}</a> · '
            f'raw: <a href="{m}">{m}</a></p>'
        )
        page = _page(f"{n.run_id}: {m}", back + body, depth=2)
        (dest / m.replace(".md", ".html")).write_text(page)
    if not mds:
        return None
    return f"nights/{slug(n.run_id)}/{mds[0].replace('.md', '.html')}"


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
                f"from {c['run_id']}" + (" (worse)" if c.get("worse") else "")
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
    nights = h.nights(config)
    cps = read_change_points(h, config)
    parts = [
        '<p class="note"><a href="../index.html">all configs</a></p>',
        f"<h1>{_esc(config)}</h1>",
        f'<p class="note">{len(infos)} night(s); change points as found by the latest night '
        "that looked (dashed, orange); red nights: red ×; a dotted line marks a new sglang "
        "release. Error bars: the range of the night's repeats. Click a point to open its "
        "night's report.</p>",
    ]
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


def _index_page(latest: dict[str, NightInfo], links) -> str:
    rows = []
    for config, n in latest.items():
        rows.append(
            f'<tr data-config="{_esc(config)}"><td><a href="configs/{slug(config)}.html">'
            f"{_esc(config)}</a></td><td>{_badge(n.outcome)}</td><td>{_esc(_x(n.night_utc)[:16])}</td>"
            f"<td>{_esc(n.release)}</td><td>{_esc(n.patch_state)}</td>"
            f'<td class="wrap">{_esc(_failing_text(n))}</td><td>{_night_cell(n, links, "", "nightly report")}</td></tr>'
        )
    body = (
        "<h1>patchbench nightly</h1>\n"
        '<p class="note">Tonight\'s state per config: its latest night. Colours: '
        + " ".join(_badge(w) for w in ("green", "red", "underpowered", "run failed"))
        + "</p>\n<table><tr><th>config</th><th>outcome</th><th>night (UTC)</th><th>sglang</th>"
        "<th>patch state</th><th>failing gates</th><th>report</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>"
    )
    return _page("patchbench nightly", body, depth=0)


def build_site(history: str | Path, out: str | Path) -> SiteSummary:
    """Write the static site of a nightly history into ``out`` (module docstring).

    ``out``'s ``index.html``, ``configs/`` and ``assets/`` are replaced, and ``nights/<run>/``
    for every night whose run folder is present; a night whose run folder is gone keeps the copy
    an earlier build left in ``out`` (so a site folder kept between nights, e.g. beside the
    history, keeps every report); nothing else in ``out`` is touched.

    Raises UsageError (exit 2) for a missing history file, :class:`patchbench.nightly.history.HistoryError`
    (exit 3) for an unusable one; EnvironmentNotReady (exit 3) without plotly or markdown-it-py."""
    try:
        import markdown_it  # noqa: F401
        import plotly.offline
    except ImportError as e:
        raise EnvironmentNotReady(
            f"the dashboard needs {e.name} (requirements/harness.txt): run make setup"
        ) from None

    out = Path(out)
    with open_history(history) as h:
        out.mkdir(parents=True, exist_ok=True)
        for sub in ("configs", "assets"):
            shutil.rmtree(out / sub, ignore_errors=True)
        for sub in ("configs", "assets", "nights"):
            (out / sub).mkdir(exist_ok=True)
        (out / "assets" / "plotly.min.js").write_text(plotly.offline.get_plotlyjs())
        summary = SiteSummary(out)
        latest: dict[str, NightInfo] = {}
        known: set[str] = set()
        for config in config_names(h):
            infos = night_infos(h, config)
            links = {}
            for n in infos:
                links[n.run_id] = _copy_night(n, out)
                if links[n.run_id]:
                    summary.pages.append(links[n.run_id])
                    (summary.nights_copied if n.folder_present else summary.nights_kept).append(
                        n.run_id
                    )
                elif not n.folder_present:
                    summary.nights_gone.append(n.run_id)
                known.add(slug(n.run_id))
            page = f"configs/{slug(config)}.html"
            (out / page).write_text(_config_page(h, config, infos, links, summary))
            summary.pages.append(page)
            if infos:
                latest[config] = infos[-1]
        (out / "index.html").write_text(
            _index_page(latest, {n.run_id: _link(out, n) for n in latest.values()})
        )
        summary.pages.insert(0, "index.html")
        for stale in (out / "nights").iterdir():
            if stale.name not in known:  # a night no longer in the history
                shutil.rmtree(stale, ignore_errors=True)
    return summary


def _link(out: Path, n: NightInfo) -> str | None:
    """The night's page already in ``out`` (relative to it), None when there is none."""
    for m in REPORTS:
        rel = f"nights/{slug(n.run_id)}/{m.replace('.md', '.html')}"
        if (out / rel).is_file():
            return rel
    return None


__all__ = ["COLOURS", "SiteSummary", "build_site", "slug"]
