"""The nightly history as a static site (``patchbench dashboard HISTORY --out DIR``,
:func:`build_site`): plain HTML pages from string templates, one plotly chart per (config,
metric), plotly's JavaScript once in ``assets/``; no server and no CDN at view time.

Layout of ``DIR``::

    index.html                     tonight's state per config (the landing view)
    configs/<config>.html          a table of contents, per metric a chart (primaries first),
                                   the latest nights in a table
    configs/<config>-nights-K.html older nights, 500 a page (page 1 the oldest)
    nights/<run_id>/nightly.html   that night's nightly.md rendered (report.html: report.md,
                                   report-details.html, figures.html: its plots), the .md
                                   files, nightly.json and plots/ copied beside
    assets/plotly.min.js           plotly.js's partial basic bundle (:func:`plotly_bundle`)

Every link is relative and resolves inside ``DIR`` (the site can be published anywhere, e.g.
GitHub Pages); a night whose run folder is gone is named as such, without a link.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import math
import os
import posixpath
import re
import stat
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from patchbench import records
from patchbench.config.schema import run_id_problem
from patchbench.errors import EnvironmentNotReady, UsageError
from patchbench.nightly import chartdata
from patchbench.nightly.gates import metric_unit
from patchbench.nightly.history import (
    Night,
    NightInfo,
    Point,
    config_names,
    night_infos,
    open_history,
    read_change_points,
    read_noise,
)
from patchbench.report.text import local_paths

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
#: the vendored partial plotly.js bundle (:func:`plotly_bundle`)
VENDOR = Path(__file__).resolve().parent / "vendor"
#: the version of a night's copy: a change of how nights are rendered copies every night again
NIGHT_FORMAT = 2
#: emoji a report may use -> coloured text (a browser without an emoji font shows boxes)
MARKS = {
    "✅": ("#1a7f37", "✓"), "❌": ("#cf222e", "✗"), "🔴": ("#cf222e", "●"),
    "🟢": ("#1a7f37", "●"), "🔵": ("#0969da", "●"), "⚪": ("#8c959f", "○"),
    "⚠️": ("#bf8700", "!"), "⚠": ("#bf8700", "!"),
}  # fmt: skip
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
.toc{font-size:.9em;columns:2;max-width:1100px}.toc ul{margin:.2em 0}img{max-width:100%}
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
    ``summary`` what this build wrote; ``fingerprints`` the earlier build's night copies
    (``nights/<run>/`` -> fingerprint), ``fingerprints_now`` this build's; ``history`` the
    history file's path (a page names it by its file name only)."""

    out: Path
    old: set[str]
    summary: SiteSummary
    fingerprints: dict[str, str] = field(default_factory=dict)
    history: str = ""
    fingerprints_now: dict[str, str] = field(default_factory=dict)
    checked: set[Path] = field(default_factory=set)  # folders known to lie inside ``out``
    by_night: dict[str, list[str]] | None = None  # ``old`` by ``nights/<run>/`` (old_under)

    def write(self, rel: str, data: str | bytes) -> None:
        """Write ``DIR/rel`` atomically (never through a link out of DIR) and note it; a file an
        earlier build wrote with the same bytes is left as it is."""
        path = self.out / rel
        parent = path.parent
        if parent not in self.checked:
            root = self.out.resolve()
            parent.mkdir(parents=True, exist_ok=True)
            if parent.resolve() != root and root not in parent.resolve().parents:
                raise SiteFolderRefused(f"{parent}: leads out of the site folder {self.out}")
            self.checked.add(parent)
        raw = data.encode() if isinstance(data, str) else data
        if rel in self.old and not path.is_symlink() and path.is_file():
            try:
                if path.stat().st_size == len(raw) and path.read_bytes() == raw:
                    self.summary.written.add(rel)
                    return
            except OSError:
                pass
        if path.is_symlink():
            path.unlink()
        records.write_bytes(path, raw, durable=False)  # rebuilt from the history if lost
        self.summary.written.add(rel)

    def old_under(self, prefix: str) -> list[str]:
        """The files an earlier build wrote under ``prefix`` (``nights/<run>/``)."""
        if self.by_night is None:
            self.by_night = {}
            for r in self.old:
                parts = r.split("/", 2)
                if len(parts) == 3 and parts[0] == "nights":
                    self.by_night.setdefault(f"nights/{parts[1]}/", []).append(r)
        return [r for r in self.by_night.get(prefix, []) if r in self.old]

    def keep(self, prefix: str) -> None:
        """Keep the files an earlier build wrote under ``prefix`` (a night whose folder is gone)."""
        self.summary.written.update(self.old_under(prefix))
        if prefix in self.fingerprints:
            self.fingerprints_now[prefix] = self.fingerprints[prefix]

    def drop(self, prefix: str) -> None:
        """Remove the files an earlier build wrote under ``prefix`` (a night copied again)."""
        for rel in sorted(self.old_under(prefix)):
            _remove(self.out, rel)
            self.old.discard(rel)
            self.checked.discard((self.out / rel).parent)

    def pages_of(self, n: NightInfo) -> dict[str, str]:
        """The pages of night ``n`` this build keeps (file name -> path relative to DIR)."""
        prefix = f"nights/{slug(n.run_id)}/"
        names = ("nightly.html", "report.html", "report-details.html", "figures.html")
        return {m: prefix + m for m in names if prefix + m in self.summary.written}


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


def _open_site(out: Path) -> tuple[set[str], dict[str, str]]:
    """The files an earlier build wrote into ``out`` (its :data:`MARKER`) and its nights'
    fingerprints; empty for a new or empty folder or a site written before markers. Raises
    :class:`SiteFolderRefused` for anything else that is not empty."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise SiteFolderRefused(f"{out}: not a folder; give a new or empty folder for the site")
    if not out.exists():
        return set(), {}
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
        nights = doc.get("nights") if isinstance(doc.get("nights"), dict) else {}
        fps = {k: v for k, v in nights.items() if isinstance(v, str) and _inside_rel(k)}
        return {f for f in files if _inside_rel(f)}, fps
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return set(), {}
    if entries <= LEGACY_ENTRIES and (out / "assets" / "plotly.min.js").is_file():
        return set(), {}  # a site written before markers: adopted, nothing of it removed
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


@functools.cache
def _markdown():
    from markdown_it import MarkdownIt

    # raw HTML in the markdown stays text: a report quotes model outputs and error messages
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def _md_to_html(text: str, present: set[str]) -> str:
    """Markdown rendered (markdown-it, CommonMark + tables); a relative link to ``X.md`` points
    at its rendered ``X.html``; a relative link or image whose target is not one of the files
    ``present`` in the night's folder (paths relative to it) becomes its plain text."""
    body = _markdown().render(records.printable(text))

    def inside(rel: str) -> bool:
        return posixpath.normpath(rel) in present

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


def _fingerprint(root: Path) -> str:
    """What a night's copy depends on: the name, size and modification time of each file of
    the run folder it reads, and :data:`NIGHT_FORMAT`."""
    parts = [str(NIGHT_FORMAT)]
    names = [*REPORTS, "nightly.json"]
    plots = root / "plots"
    if plots.is_dir() and not plots.is_symlink():
        names += sorted(f"plots/{p.name}" for p in plots.iterdir() if p.name.endswith(".png"))
    for name in names:
        try:
            st = os.lstat(root / name)
        except OSError:
            continue
        parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}:{st.st_mode}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _marks(body: str) -> str:
    """The emoji of :data:`MARKS` as coloured text."""
    for emoji, (colour, text) in MARKS.items():
        body = body.replace(emoji, f'<span style="color:{colour};font-weight:700">{text}</span>')
    return body


def _copy_night(n: NightInfo, site: _Site) -> str | None:
    """Copy night ``n``'s reports into ``out/nights/<run_id>/`` and render them (each page with
    links to the night's other pages and a ``figures.html`` of its plots); returns the page to
    link (relative to DIR). Only regular files of the run folder itself are copied: a symbolic
    link, or a file whose real path is outside the run folder, is left out with a note
    (:func:`_read_own`). A run folder unchanged since the earlier build (its
    :func:`_fingerprint`) keeps its copy unread. When the run folder is gone, the copy an
    earlier build left in ``out`` is kept and linked; None when there is none, or the folder has
    no report. A runner's absolute paths become names relative to the site
    (:func:`patchbench.nightly.chartdata.site_text`)."""
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
    fp = _fingerprint(root)
    if site.fingerprints.get(prefix) == fp and all(
        (out / r).is_file() for r in site.old_under(prefix)
    ):
        site.keep(prefix)
        return _link(out, n)
    site.drop(prefix)
    site.fingerprints_now[prefix] = fp
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
    roots = {str(src): ".", str(root): ".", site.history: Path(site.history).name}
    if site.history:
        roots[str(Path(site.history).parent)] = "…"
    for rel, data in copied.items():
        if rel.endswith(".md"):
            data = local_paths(chartdata.site_text(data.decode(errors="replace"), roots)).encode()
            copied[rel] = data
        site.write(prefix + rel, data)
    mds = [m for m in REPORTS if m in copied]
    pngs = [r for r in copied if r.startswith("plots/")]
    present = {*copied, *(m.replace(".md", ".html") for m in mds)}
    nav = _night_nav(n, [m.replace(".md", ".html") for m in mds], bool(pngs))
    for m in mds:
        body = _marks(_md_to_html(copied[m].decode(errors="replace"), present))
        raw = f' · raw: <a href="{m}">{m}</a></p>'
        page = _page(f"{n.run_id}: {m}", nav.replace("</p>", raw, 1) + body, depth=2)
        site.write(prefix + m.replace(".md", ".html"), page)
    if pngs:
        figs = "\n".join(
            f'<h2>{_esc(p.removeprefix("plots/"))}</h2>\n<a href="{_esc(p)}">'
            f'<img src="{_esc(p)}" alt="{_esc(p)}"></a>'
            for p in pngs
        )
        site.write(prefix + "figures.html", _page(f"{n.run_id}: figures", nav + figs, depth=2))
    if not mds:
        return None
    return f"{prefix}{mds[0].replace('.md', '.html')}"


def _night_nav(n: NightInfo, pages: list[str], figures: bool) -> str:
    """The links at the head of a night's page: back, and the night's pages."""
    words = {"nightly.html": "nightly", "report.html": "A/B report",
             "report-details.html": "details"}  # fmt: skip
    own = [f'<a href="{p}">{words[p]}</a>' for p in words if p in pages]
    if figures:
        own.append('<a href="figures.html">figures</a>')
    return (
        f'<p class="note"><a href="../../index.html">all configs</a> · '
        f'<a href="../../configs/{slug(n.config_name)}.html">{_esc(n.config_name)}</a> · '
        f"{_esc(n.run_id)}: {' · '.join(own)}</p>"
    )


def _night_cell(n: NightInfo, links: dict[str, str | None], up: str, label: str = "") -> str:
    """The night's link (text: ``label`` or its run id), or why it has none."""
    link = links.get(n.run_id)
    if link:
        return f'<a href="{up}{link}" title="{_esc(n.run_id)}">{_esc(label or n.run_id)}</a>'
    why = "run folder gone" if not n.folder_present else "no report in its run folder"
    return f'{_esc(label or n.run_id)} <span class="gone">({why})</span>'


# ---------------------------------------------------------------------------------------- charts


@dataclass
class _Series:
    """What a config page keeps of its recorded nights: per charted (variant, suite, metric)
    one :class:`patchbench.nightly.history.Point` per night, the newest nights whole (their
    units), the (suite, metric) pairs recorded, each metric's direction (the newest night's
    that states one) and the newest night's baseline."""

    points: dict[tuple[str, str, str], list[Point]] = field(default_factory=dict)
    recent: list[Night] = field(default_factory=list)
    have: set[tuple[str, str]] = field(default_factory=set)
    better: dict[tuple[str, str], str] = field(default_factory=dict)
    baseline: str = ""

    def variants(self, suite: str, metric: str) -> list[str]:
        """Variants with points of (suite, metric), the baseline first."""
        got = sorted({v for (v, s, m) in self.points if (s, m) == (suite, metric)})
        return ([self.baseline] if self.baseline in got else []) + [
            v for v in got if v != self.baseline
        ]


def _read_series(h, config: str, valid: set[str], gated: set[tuple[str, str]]) -> _Series:
    """The :class:`_Series` of a config's nights whose run id is in ``valid``, read one night at
    a time (memory grows with the charted points, not every repeat): the points of the
    ``gated`` metrics, or of every metric when no gated one was recorded."""

    def read(charted) -> _Series:
        out = _Series()
        for n in h.each_night(config):
            if n.run_id not in valid:
                continue
            out.recent = [*out.recent[-4:], n]
            out.baseline = n.baseline
            out.better.update(n.better)
            for key, vals in n.values.items():
                out.have.add(key[1:])
                got = [v for v in vals if v is not None]
                if got and charted(key[1:]):
                    out.points.setdefault(key, []).append(
                        Point(
                            n.run_id, n.night_utc, statistics.median(got), min(got), max(got),
                            len(got),
                        )
                    )  # fmt: skip
            n.values = {}  # only the newest nights' units and directions are read later
        return out

    got = read(lambda sm: sm in gated)
    return got if got.have & gated else read(lambda sm: True)


@dataclass
class _ChartCtx:
    """What every chart of a config page shares: the nights (their charted points and infos),
    the night axis, the links, the change points, the latest night's gates and learned noise."""

    nights: _Series
    infos: list[NightInfo]
    index: dict[str, int]
    links: dict[str, str | None]
    cps: list[dict]
    gates: list[dict]
    noise: list[dict]
    left_out: set[str]


def _num(x: float) -> str:
    return f"{x:.4g}"


def _chart(div_id: str, ctx: _ChartCtx, suite: str, metric: str) -> tuple[str, dict[str, int]]:
    """One metric's chart (plain plotly JSON, no plotly Python objects): per variant the change
    of its nightly medians against the reference in percent (:func:`chartdata.reference_of`;
    a log axis of the ratio where the range is wide) with the repeats' range, on the night axis
    (weekly medians before the last :data:`chartdata.FULL_NIGHTS`); the threshold line and the
    learned noise band; red nights as rings around the failing variant's point, change points
    and release changes. Returns (HTML, {trace: points})."""
    nights, infos = ctx.nights, ctx.infos
    unit = metric_unit(suite, metric, list(reversed(nights.recent)))
    better = nights.better.get((suite, metric)) or next(
        (g.get("better") for g in ctx.gates if g.get("metric") == metric), None
    )
    variants = nights.variants(suite, metric)
    base = variants[0] if variants else ""
    base_pts = nights.points.get((base, suite, metric), [])
    hist_gate = next(
        (
            g
            for g in ctx.gates
            if (g.get("kind"), g.get("variant"), g.get("suite"), g.get("metric"))
            == ("history", base, suite, metric)
        ),
        None,
    )
    ref, ref_runs = chartdata.reference_of(
        {p.run_id: p.median for p in base_pts},
        [p.run_id for p in base_pts],
        (hist_gate or {}).get("window_run_ids") or None,
        ctx.left_out,
    )
    if ref is None and base_pts:
        ref = base_pts[-1].median
    per_variant = {v: nights.points.get((v, suite, metric), []) for v in variants}
    pcts = [
        x
        for pts in per_variant.values()
        for p in pts
        if (x := chartdata.pct_change(p.median, ref)) is not None
    ]
    log = chartdata.log_axis(pcts)

    def ypct(c: float | None) -> float | None:
        """Where a change of ``c`` percent lies on the y axis (the ratio on a log axis)."""
        if c is None:
            return None
        return round(1 + c / 100, 5) if log else round(c, 3)

    def y(v: float) -> float | None:
        return ypct(chartdata.pct_change(v, ref))

    info = {i.run_id: i for i in infos}
    traces, counts = [], {}
    for k, variant in enumerate(variants):
        cps = chartdata.downsample(per_variant[variant], ctx.index)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": variant,
                "x": [round(c.x, 2) for c in cps],
                "y": [y(c.median) for c in cps],
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": [round(abs((y(c.high) or 0) - (y(c.median) or 0)), 4) for c in cps],
                    "arrayminus": [
                        round(abs((y(c.median) or 0) - (y(c.low) or 0)), 4) for c in cps
                    ],
                    "thickness": 1,
                    "width": 2,
                },
                "line": {"color": TRACE_COLOURS[k % len(TRACE_COLOURS)], "width": 1.5},
                "marker": {"size": 5},
                "text": [_hover(c, variant, unit, ref, info) for c in cps],
                "hoverinfo": "text",
                "customdata": [
                    (ctx.links.get(c.run_ids[0]) or "") if len(c.run_ids) == 1 else "" for c in cps
                ],
            }
        )
        counts[variant] = len(cps)
    medians = {v: {p.run_id: p.median for p in pts} for v, pts in per_variant.items()}
    red = _red_night_trace(ctx, suite, metric, variants, medians, y)
    if red:
        traces.append(red)
        counts["red night"] = len(red["x"])
    cp = _change_point_trace(ctx, suite, metric, unit, y)
    if cp:
        traces.append(cp)
        counts["change point"] = len(cp["x"])
    shapes, notes = _threshold_and_band(ctx, suite, metric, better, ypct)
    if log:  # plotly places an annotation on a log axis at the log10 of its value
        notes = [n | {"y": round(math.log10(n["y"]), 5)} for n in notes]
    rel_shapes, rel_notes = _release_lines(ctx)
    words = chartdata.metric_words(suite, metric)
    head = f"{words} [{unit}]" if unit else words
    way = f"{better} is better" if better in ("higher", "lower") else "direction unknown"
    older = len(ctx.index) > chartdata.FULL_NIGHTS
    sub = (
        f"change vs the reference {_num(ref)} {unit} (the {base} median over "
        f"{len(ref_runs) or 1} night(s){' the gate used' if hist_gate else ''})"
        if ref is not None
        else "no reference"
    ) + (f"; before the last {chartdata.FULL_NIGHTS} nights: weekly medians" if older else "")
    layout = {
        "title": {
            "text": f"<b>{_esc(head)}</b>: {way}<br><span style='font-size:11px'>{_esc(sub)}</span>",
            "x": 0.01,
            "font": {"size": 14},
        },
        "xaxis": {
            "title": {"text": "night (one point per recorded run; ticks: its date, UTC)"},
            "tickmode": "array",
            **_ticks(ctx),
            "zeroline": False,
            "gridcolor": "#eaeef2",
        },
        "yaxis": {
            "title": {"text": "change vs reference [%]" + (" (log scale)" if log else "")},
            "gridcolor": "#eaeef2",
            "zerolinecolor": "#8c959f",
            **(_log_ticks(pcts) if log else {"ticksuffix": " %"}),
        },
        "shapes": shapes + rel_shapes,
        "annotations": notes + rel_notes,
        "legend": {"orientation": "h", "y": -0.28},
        "margin": {"l": 70, "r": 20, "t": 60, "b": 90},
        "hovermode": "closest",
        "plot_bgcolor": "#fff",
        "paper_bgcolor": "#fff",
    }
    return _chart_html(div_id, {"data": traces, "layout": layout}, suite, metric), counts


def _hover(c: chartdata.ChartPoint, variant: str, unit: str, ref, info: dict) -> str:
    """A point's hover text: its night(s), value and change, release and outcome as coloured
    text."""
    chg = chartdata.pct_change(c.median, ref)
    val = f"{variant}: {_num(c.median)} {unit}" + (f" ({chg:+.1f} %)" if chg is not None else "")
    if len(c.run_ids) > 1:
        return f"{_esc(c.label)}<br>{_esc(val)}<br>range {_num(c.low)}–{_num(c.high)}"
    i = info.get(c.run_ids[0])
    word = (i.outcome if i else None) or "no report"
    when = _x(i.night_utc)[:16] if i else ""
    return (
        f"{_esc(c.run_ids[0])} ({when})<br>{_esc(val)}<br>repeats {_num(c.low)}–{_num(c.high)}"
        f"<br>sglang {_esc(i.release if i else '?')} · "
        f"<span style='color:{COLOURS.get(word, GREY)}'><b>{_esc(word)}</b></span>"
    )


def _ticks(ctx: _ChartCtx) -> dict[str, Any]:
    """About eight ticks on the night axis, each labelled with its night's date."""
    infos = ctx.infos
    if not infos:
        return {"tickvals": [], "ticktext": []}
    step = max(1, len(infos) // 8)
    picks = list(range(0, len(infos), step))
    if picks[-1] != len(infos) - 1:  # the newest night's tick replaces one too close to it
        picks = picks[:-1] if len(infos) - 1 - picks[-1] < step else picks
        picks.append(len(infos) - 1)
    return {
        "tickvals": picks,
        "ticktext": [_x(infos[i].night_utc)[:10] for i in picks],
        "range": [-0.8, len(infos) - 0.2],
    }


def _log_ticks(pcts: list[float]) -> dict[str, Any]:
    """A log axis of the ratio, its ticks labelled as changes in percent."""
    lo, hi = min(1 + p / 100 for p in pcts), max(1 + p / 100 for p in pcts)
    nice = [0.1, 0.2, 0.25, 0.4, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 4, 5, 10, 20]
    vals = [v for v in nice if lo / 1.3 <= v <= hi * 1.3]
    return {
        "type": "log",
        "tickvals": vals,
        "ticktext": [f"{100 * (v - 1):+.0f} %" if v != 1 else "0 %" for v in vals],
    }


def _red_night_trace(ctx, suite, metric, variants, medians, y) -> dict | None:
    """The red nights' marks: an open red ring around the point of the variant whose gate on
    this metric failed (else the baseline's), so the point stays visible inside it."""
    xs, ys, texts, urls = [], [], [], []
    for i in ctx.infos:
        if i.outcome != "red" or i.run_id not in ctx.index:
            continue
        v = _red_y(i, suite, metric, variants, medians)
        if v is None:
            continue
        xs.append(ctx.index[i.run_id])
        ys.append(y(v))
        texts.append(
            f"{_esc(i.run_id)}: <span style='color:{COLOURS['red']}'><b>red</b></span>"
            f"<br>{_esc(_failing_text(i))}"
        )
        urls.append(ctx.links.get(i.run_id) or "")
    if not xs:
        return None
    return {
        "type": "scatter",
        "mode": "markers",
        "name": "red night",
        "x": xs,
        "y": ys,
        "marker": {
            "symbol": "circle-open",
            "size": 16,
            "color": COLOURS["red"],
            "line": {"width": 2.5},
        },
        "text": texts,
        "hoverinfo": "text",
        "customdata": urls,
    }


def _night_at(ctx: _ChartCtx, utc: str) -> int | None:
    """The place on the night axis of the first night at or after ``utc``."""
    for i in ctx.infos:
        if i.night_utc >= utc and i.run_id in ctx.index:
            return ctx.index[i.run_id]
    return None


def _change_point_trace(ctx, suite, metric, unit, y) -> dict | None:
    """The change points of (suite, metric): a mark each (its span is a shaded band)."""
    mine = [
        c
        for c in ctx.cps
        if (c["suite"], c["metric"]) == (suite, metric)
        and c.get("start_utc")
        and _night_at(ctx, c["start_utc"]) is not None
    ]
    if not mine:
        return None
    return {
        "type": "scatter",
        "mode": "markers",
        "name": "change point",
        "x": [_night_at(ctx, c["start_utc"]) for c in mine],
        "y": [y(c["after"]) for c in mine],
        "marker": {"symbol": "diamond", "size": 11, "color": "#fb8500"},
        "text": [
            f"change point ({_esc(c['variant'])}): {c['size_pct']:+.1f} % "
            f"({c['before']:.4g} → {c['after']:.4g} {_esc(unit)}), {c['nights']} night(s) "
            f"from {_esc(c['run_id'])}"
            + (" (worse)" if c.get("worse") else "")
            + (", new tonight, unconfirmed" if c.get("confirmed") == 0 else "")
            for c in mine
        ],
        "hoverinfo": "text",
    }


def _threshold_and_band(ctx, suite, metric, better, ypct) -> tuple[list[dict], list[dict]]:
    """The gate's threshold as a red dashed line on the bad side of the reference, and the
    learned noise band (±2 sigma of a night's median, night-to-night) around it; each with its
    label. Change-point spans are shaded too."""
    shapes: list[dict] = []
    notes: list[dict] = []
    thr = next(
        (
            g.get("threshold_pct")
            for g in ctx.gates
            if (g.get("suite"), g.get("metric")) == (suite, metric) and g.get("threshold_pct")
        ),
        None,
    )
    if thr and better in ("higher", "lower"):
        yy = ypct(thr if better == "lower" else -thr)
        shapes.append(_hline(yy, {"color": COLOURS["red"], "width": 1.5, "dash": "dash"}))
        notes.append(_label(yy, f"threshold {'+' if better == 'lower' else '−'}{thr:g} %"))
    row = next((r for r in ctx.noise if (r.get("suite"), r.get("metric")) == (suite, metric)), None)
    cv = (row or {}).get("night_cv_pct") or (row or {}).get("run_cv_pct")
    if cv:
        lo, hi = ypct(-2 * cv), ypct(2 * cv)
        shapes.append(
            {"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": lo, "y1": hi,
             "fillcolor": "#8c959f", "opacity": 0.15, "line": {"width": 0}, "layer": "below"}
        )  # fmt: skip
        notes.append(_label(hi, f"noise ±2σ ({(row or {}).get('source') or 'learned'})"))
    for c in ctx.cps:
        if (c["suite"], c["metric"]) != (suite, metric) or not c.get("start_utc"):
            continue
        x0 = _night_at(ctx, c["start_utc"])
        x1 = _night_at(ctx, c.get("end_utc") or c["start_utc"])
        if x0 is not None:
            shapes.append(
                {"type": "rect", "xref": "x", "x0": x0 - 0.5, "x1": (x1 if x1 is not None else x0) + 0.5,
                 "yref": "paper", "y0": 0, "y1": 1, "fillcolor": "#fb8500", "opacity": 0.12,
                 "line": {"color": "#fb8500", "width": 1, "dash": "dash"}}
            )  # fmt: skip
    return shapes, notes


def _hline(yy, line: dict) -> dict:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": yy, "y1": yy,
            "line": line}  # fmt: skip


def _label(yy, text: str) -> dict:
    return {"xref": "paper", "x": 1, "xanchor": "right", "yref": "y", "y": yy, "yanchor": "bottom",
            "text": _esc(text), "showarrow": False, "font": {"size": 10, "color": "#57606a"}}  # fmt: skip


def _release_lines(ctx: _ChartCtx) -> tuple[list[dict], list[dict]]:
    """A dotted line where the sglang release changes, labelled with the release."""
    shapes, notes = [], []
    prev = None
    for i in ctx.infos:
        if prev is not None and i.release != prev and i.run_id in ctx.index:
            x = ctx.index[i.run_id] - 0.5
            shapes.append(
                {"type": "line", "xref": "x", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1,
                 "line": {"color": "#57606a", "width": 1, "dash": "dot"}}
            )  # fmt: skip
            notes.append(
                {"x": x, "y": 1.0, "yref": "paper", "text": f"sglang {_esc(i.release)}",
                 "showarrow": False, "xanchor": "left", "yanchor": "bottom", "font": {"size": 10}}
            )  # fmt: skip
        prev = i.release
    return shapes, notes


def _chart_html(div_id: str, fig: dict, suite: str, metric: str) -> str:
    """The chart's ``<div>`` and the script that draws ``fig`` there (a click on a point opens
    its night's report)."""
    fig_json = json.dumps(fig, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
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


def _primaries(suite: str) -> set[str]:
    """The suite's primary metrics (none when it does not import)."""
    try:
        from patchbench.suite import get_suite

        return {m for m, i in get_suite(suite).metrics.items() if getattr(i, "primary", False)}
    except Exception:  # noqa: BLE001 (a suite that does not import has no primaries)
        return set()


def _night_row(n: NightInfo, links, pages: dict[str, dict[str, str]], up: str) -> str:
    """One row of a nights table: time, the night's pages (nightly, A/B report, figures),
    outcome, release, the patch state short (full on hover), failing gates."""
    full = n.patch_state
    return (
        f"<tr><td>{_esc(_x(n.night_utc)[:16])}</td><td>{_night_cell(n, links, up)}"
        f"{_evidence(pages.get(n.run_id, {}), up)}</td>"
        f"<td>{_badge(n.outcome)}</td><td>{_esc(n.release)}</td>"
        f'<td title="{_esc(n.machine or "unknown")}">{_esc(short_machine(n.machine))}</td>'
        f'<td title="{_esc(full)}">{_esc(chartdata.short_patch(n.builds))}</td>'
        f'<td class="wrap">{_esc(_failing_text(n))}</td></tr>'
    )


def short_machine(key: str | None) -> str:
    """A machine's identity (:attr:`patchbench.runfolder.models.MachineInfo.key`) short enough
    for a table cell: the model and the first GPU's UUID cut to 12 characters (``+k`` more
    GPUs), or the CPU model and host; "unknown" for None."""
    if not key:
        return "unknown"
    model, _, rest = key.partition(" [")
    if rest:
        uuids = rest.rstrip("]").split(", ")
        more = f" +{len(uuids) - 1}" if len(uuids) > 1 else ""
        return f"{model} [{uuids[0][:12]}…{more}]"
    return key if len(key) <= 48 else key[:47] + "…"


def _evidence(pages: dict[str, str], up: str) -> str:
    """The links to a night's A/B report, its details and its figures (those it has)."""
    words = (("report.html", "A/B report"), ("report-details.html", "details"),
             ("figures.html", "figures"))  # fmt: skip
    got = [f'<a href="{up}{pages[k]}">{w}</a>' for k, w in words if k in pages]
    return f'<br><span class="note">{" · ".join(got)}</span>' if got else ""


_NIGHTS_HEAD = (
    "<table><tr><th>night (UTC)</th><th>run (reports)</th><th>outcome</th><th>sglang</th>"
    "<th>machine</th><th>patch state</th><th>failing gates</th></tr>\n"
)


def _config_page(h, config: str, infos: list[NightInfo], links, pages, site: _Site) -> None:
    """Write the config's page (a table of contents, primaries first, then a chart per metric
    and its latest nights) and the pages of its older nights."""
    summary = site.summary
    latest = infos[-1] if infos else None
    gated = {pair for i in infos for pair in i.gated}
    nights = _read_series(h, config, {i.run_id for i in infos}, gated)
    metrics = sorted(nights.have & gated) or sorted(nights.have)
    primary = {(s, m) for s, m in metrics if m.split("@", 1)[0] in _primaries(s)}
    ordered = chartdata.metric_order(metrics, gated, primary)
    ctx = _ChartCtx(
        nights=nights,
        infos=infos,
        index=chartdata.night_index([(i.run_id, i.night_utc) for i in infos]),
        links=links,
        cps=read_change_points(h, config),
        gates=latest.gates if latest else [],
        noise=read_noise(h, config, latest.run_id) if latest else [],
        left_out={
            i.run_id for i in infos if i.outcome in ("red", "run failed") or i.status != "ok"
        },
    )
    me = f"{slug(config)}.html"
    toc, charts = [], []
    group = None
    for k, (grp, (suite, metric)) in enumerate(ordered):
        div_id = f"chart-{slug(config)}-{k}"
        chart, counts = _chart(div_id, ctx, suite, metric)
        summary.charts[div_id] = counts
        charts.append(chart)
        if grp != group:
            toc.append(f"{'</ul>' if group else ''}<li><b>{grp}</b><ul>")
            group = grp
        toc.append(
            f'<li><a href="{me}#{div_id}">{_esc(chartdata.metric_words(suite, metric))}</a> '
            f'<span class="note">{_esc(suite)}.{_esc(metric)}</span></li>'
        )
    shown, older = chartdata.night_pages(len(infos))
    older_links = " · ".join(
        f'<a href="{slug(config)}-nights-{k + 1}.html">{_esc(_x(infos[r[0]].night_utc)[:10])} to '
        f"{_esc(_x(infos[r[-1]].night_utc)[:10])}</a>"
        for k, r in reversed(list(enumerate(older)))
    )
    parts = [
        '<p class="note"><a href="../index.html">all configs</a></p>',
        f"<h1>{_esc(config)}</h1>",
        f'<p class="note">{len(infos)} night(s). Each chart: the change of every variant\'s '
        "nightly median against the reference (the baseline's median over the nights the gate "
        "used) in percent, the gate's threshold (red, dashed), the learned noise band (grey), "
        "red nights (red ring around the failing variant), change points (orange), a new "
        "sglang release (dotted). Error bars: the range of the night's repeats. One point per "
        "recorded run (a rerun is its own point); before the last "
        f"{chartdata.FULL_NIGHTS} nights weekly medians. Click a point to open its night.</p>",
        *([_blind_html(infos[-1])] if infos else []),
        f'<nav class="toc"><b>Metrics</b><ul>{"".join(toc)}{"</ul></li>" if toc else ""}'
        f'</ul><a href="{me}#nights">nights</a></nav>',
        *charts,
        f'<h2 id="nights">Nights (latest {len(shown)}, tonight first)</h2>',
        _NIGHTS_HEAD
        + "\n".join(_night_row(infos[i], links, pages, "../") for i in reversed(shown))
        + "\n</table>",
    ]
    if older_links:
        parts.append(f"<p>Older nights: {older_links}</p>")
    page = f"configs/{me}"
    site.write(page, _page(f"patchbench nightly: {config}", "\n".join(parts), depth=1, plotly=True))
    summary.pages.append(page)
    for k, r in enumerate(older):
        rel = f"configs/{slug(config)}-nights-{k + 1}.html"
        body = (
            f'<p class="note"><a href="../index.html">all configs</a> · <a href="{me}">{_esc(config)}</a></p>'
            f"<h1>{_esc(config)}: nights {r[0] + 1} to {r[-1] + 1} (newest first)</h1>\n"
            + _NIGHTS_HEAD
            + "\n".join(_night_row(infos[i], links, pages, "../") for i in reversed(r))
            + "\n</table>"
        )
        site.write(rel, _page(f"{config}: older nights", body, depth=1))
        summary.pages.append(rel)


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


def _index_page(latest: dict[str, NightInfo], links, pages, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    rows = []
    for config in index_order(latest):
        n = latest[config]
        story = "; ".join(x for x in ((n.story or {}).get("summary"), stale_text(n, now)) if x)
        rows.append(
            f'<tr data-config="{_esc(config)}"><td><a href="configs/{slug(config)}.html">'
            f"{_esc(config)}</a></td><td>{_badge(n.outcome)}</td><td>{_esc(_x(n.night_utc)[:16])}</td>"
            f'<td class="wrap" data-story>{_esc(story)}</td>'
            f'<td>{_esc(n.release)}</td><td title="{_esc(n.patch_state)}">'
            f"{_esc(chartdata.short_patch(n.builds))}</td>"
            f'<td class="wrap">{_esc(_failing_text(n))}</td>'
            f"<td>{_night_cell(n, links, '', 'nightly report')}{_evidence(pages.get(n.run_id, {}), '')}</td></tr>"
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


def plotly_bundle() -> tuple[bytes, str]:
    """The plotly.js the site loads and which: the partial bundle ``plotly-basic`` (scatter,
    bar, pie: all the charts draw; vendored under patchbench/nightly/vendor/) when it is the
    version of the installed plotly's full bundle, else that full bundle."""
    import plotly.offline

    full = plotly.offline.get_plotlyjs()
    want = re.search(r"plotly\.js v(\S+)", full[:300])
    basic = VENDOR / "plotly-basic.min.js"
    if want and basic.is_file():
        data = basic.read_bytes()
        got = re.search(rb"plotly\.js \(basic - minified\) v(\S+)", data[:300])
        if got and got.group(1).decode() == want.group(1):
            return data, "basic"
    return full.encode(), "full"


def build_site(history: str | Path, out: str | Path, *, now: datetime | None = None) -> SiteSummary:
    """Write the static site of a nightly history into ``out`` (module docstring).

    ``out`` must be new, empty, or a site the dashboard wrote (its :data:`MARKER` lists every
    file it wrote and a fingerprint of each night's copy; a site written before markers, holding
    only the site's own entries, is adopted). The build writes ``index.html``, ``configs/``,
    ``assets/`` and ``nights/<run>/`` for every night whose run folder is present (a night whose
    run folder is unchanged since the earlier build, by its fingerprint, keeps its copy without
    being read again; a file whose bytes are unchanged is not rewritten), then removes only the
    files the earlier build wrote that this one did not; a night whose run folder is gone keeps
    the copy an earlier build left (so a site folder kept between nights, e.g. beside the
    history, keeps every report); nothing else in ``out`` is touched. A night whose run id
    cannot name a folder (:func:`patchbench.config.schema.run_id_problem`) is left out with a
    note.

    Raises UsageError (exit 2) for a missing history file, :class:`SiteFolderRefused` (exit 2)
    for an ``out`` that is not the dashboard's, :class:`patchbench.nightly.history.HistoryError`
    (exit 3) for an unusable history; EnvironmentNotReady (exit 3) without plotly or
    markdown-it-py. ``now`` (naive UTC; default the clock): when a config is stale."""
    try:
        import markdown_it  # noqa: F401
        import plotly.offline  # noqa: F401
    except ImportError as e:
        raise EnvironmentNotReady(
            f"the dashboard needs {e.name} (requirements/harness.txt): run make setup"
        ) from None

    out = Path(out)
    with open_history(history) as h:
        old, fingerprints = _open_site(out)
        out.mkdir(parents=True, exist_ok=True)
        summary = SiteSummary(out)
        site = _Site(out, set(old), summary, fingerprints, history=str(Path(history).resolve()))
        site.write("assets/plotly.min.js", plotly_bundle()[0])
        latest: dict[str, NightInfo] = {}
        pages: dict[str, dict[str, str]] = {}
        for config in config_names(h):
            infos = _valid(night_infos(h, config, slim=True), summary.notes)
            links = {}
            for n in infos:
                links[n.run_id] = _copy_night(n, site)
                pages[n.run_id] = site.pages_of(n)
                if links[n.run_id]:
                    summary.pages.append(links[n.run_id])
                    (summary.nights_copied if n.folder_present else summary.nights_kept).append(
                        n.run_id
                    )
                elif not n.folder_present:
                    summary.nights_gone.append(n.run_id)
            _config_page(h, config, infos, links, pages, site)
            if infos:
                latest[config] = infos[-1]
        site.write(
            "index.html",
            _index_page(latest, {n.run_id: _link(out, n) for n in latest.values()}, pages, now),
        )
        summary.pages.insert(0, "index.html")
        for stale in sorted(site.old - summary.written):  # written before, not now: ours to remove
            _remove(out, stale)
        marker = {
            "written_by": "patchbench dashboard",
            "files": sorted(summary.written),
            "nights": dict(sorted(site.fingerprints_now.items())),
        }
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
