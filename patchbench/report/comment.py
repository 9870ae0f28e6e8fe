"""``patchbench comment RUN``: a pull-request comment from compare.json alone, within GitHub's
:data:`GITHUB_COMMENT_LIMIT`, and ``--post``: one sticky comment through GitHub's REST API
(``urllib.request``: a few synchronous calls; token ``GITHUB_TOKEN``, base ``GITHUB_API_URL``).

The comment, in order: a hidden marker; a heading naming what was compared (each git build by
commit and subject); the report's answer per variant (:func:`patchbench.report.text.answer`: a
lead sentence and its clauses as bullets); one caveats line (hardware, model, repeats, sglang);
output identity; a table of the primaries whose figures the answer does not give; then links,
only to URLs given (``--figure-url``, ``--report-url``, ``--publish-url``): a comment cannot
open a file of the runner, so without a URL it names none. Each fact is said once.

The posting itself (origin, pages, whose comment is edited, exit codes) is
:mod:`patchbench.report.github`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from patchbench.analysis.comparison import Comparison, Row, read_comparison
from patchbench.errors import UsageError
from patchbench.report.github import post_comment, resolve_target
from patchbench.report.text import (
    VERDICT_MARK,
    answer,
    build_names,
    esc,
    exactness,
    fmt_change,
    fmt_ci,
    host_warnings,
    identity_counts,
    identity_text,
    local_paths,
    partial_lines,
    shown_value,
)

#: the longest body GitHub accepts for an issue or pull-request comment, in characters
GITHUB_COMMENT_LIMIT = 65_536
#: the figure's file name inside a run folder's plots/ (patchbench.report.plots.make_plots)
PR_FIGURE = "plots/pr_figure.png"
DEFAULT_KEY = "patchbench"
#: the longest line of the answer (one clause) in a comment
ANSWER_LINE_MAX = 2000
#: units a value is shown without (a count is a number; accuracy is shown in percent)
_BARE_UNITS = ("", "count", "acc", "share")


def marker(key: str = DEFAULT_KEY) -> str:
    """The hidden HTML comment that marks the sticky comment of ``key`` (one per pull request)."""
    return f"<!-- patchbench-comment key={key} -->"


@dataclass
class Links:
    """The full report's URL and the PR figure's image URL; None: not in the comment."""

    report_url: str | None = None
    figure_url: str | None = None


def resolve_links(
    publish_url: str | None = None, report_url: str | None = None, figure_url: str | None = None
) -> Links:
    """The links: ``publish_url`` (where the run folder is published) gives both
    (``plots/pr_figure.png`` and ``report.md`` under it); ``report_url`` / ``figure_url``
    override it. Only URLs given: nothing is guessed."""
    base = publish_url.rstrip("/") if publish_url else None
    fig = figure_url or (f"{base}/{PR_FIGURE}" if base else None)
    rep = report_url or (f"{base}/report.md" if base else None)
    return Links(rep, fig)


def hardware_text(gpu: str | None, cores: int | None = None) -> str:
    """The hardware from ``RunInfo.gpu`` ("NAME", "NAME xN", "A, B"; None: no GPU) and the
    CPUs the run could use (``HostLoad.cores``): "CPU (no GPU)" or "CPU (2 cores, no GPU)",
    "1 GPU: NAME", "N GPUs: NAME"."""
    if gpu is None:
        return f"CPU ({cores} core{'s' if cores > 1 else ''}, no GPU)" if cores else "CPU (no GPU)"
    m = re.fullmatch(r"(.+) x(\d+)", gpu)
    name, n = (m.group(1), int(m.group(2))) if m else (gpu, len(gpu.split(", ")))
    return f"{n} GPU{'s' if n > 1 else ''}: {name}"


def model_text(cmp: Comparison) -> str:
    """The model's name (a local path's last part; a hub id as it is), with "tiny random
    weights" for the tiny test model (``RunInfo.tiny``)."""
    m = cmp.run.model
    name = Path(m).name if m.startswith(("/", "~", ".")) else m
    return f"`{name}`" + (" (tiny random weights)" if cmp.run.tiny else "")


def sglang_text(cmp: Comparison) -> str:
    """ "sglang 0.5.1.post3", or each arm's version as built where they differ (an arm without
    a build record: the run's release)."""
    versions = {}
    for v in [cmp.baseline] + cmp.variants:
        info = cmp.run.variants.get(v)
        b = info.built if info is not None else None
        versions[v] = (b.version if b is not None else None) or cmp.run.sglang
    if len(set(versions.values())) > 1:
        return "sglang " + ", ".join(f"{ver} (`{v}`)" for v, ver in versions.items())
    return f"sglang {cmp.run.sglang if not versions else next(iter(versions.values()))}"


def caveats_line(cmp: Comparison) -> str:
    """What the numbers hold for, in one line: hardware, model, repeats, sglang."""
    n = cmp.repeats
    parts = [
        f"Ran on {hardware_text(cmp.run.gpu, cmp.run.host.cores() if cmp.run.host else None)}",
        f"model {model_text(cmp)}",
        f"{n} paired repeat{'s' if n != 1 else ''}",
        sglang_text(cmp),
    ]
    return " · ".join(parts)


def identity_line(cmp: Comparison) -> str:
    """ "Outputs identical to `baseline`: `B` 48/48, `C` 47/48" (:func:`identity_counts`)."""
    got = {v: identity_counts(cmp, v) for v in cmp.variants}
    shown = [f"`{v}` " + identity_text(counts) for v, counts in got.items() if counts]
    if not shown:
        if any(c.get("status") != "ok" for c in cmp.cells):
            return "Output identity: not known (the cells that compare outputs did not end ok)."
        return "Output identity: not measured by this run's suites."
    missing = [f"`{v}` not measured" for v, counts in got.items() if not counts]
    sep = "; " if any(len(c) > 1 for c in got.values()) else ", "
    return f"Outputs identical to `{cmp.baseline}`: " + sep.join(shown + missing) + "."


def _with_unit(r: Row, arm: str) -> str:
    """An arm's value as the report's table shows it, with the row's unit."""
    x = shown_value(r, arm)
    return x if r.unit in _BARE_UNITS or x == "n/a" else f"{x} {r.unit}"


def _cell(r: Row) -> str:
    """A variant's cell: its value with unit, the change, the interval where there is one, and
    the verdict where it is not inconclusive."""
    out = f"{_with_unit(r, 'variant')} ({fmt_change(r.change, r.change_unit)}"
    interval = exactness(r) if r.kind == "deterministic" else fmt_ci(r.low, r.high, r.change_unit)
    out += f" {interval})" if interval != "n/a" else ")"
    return out + (
        f" {VERDICT_MARK.get(r.verdict, r.verdict)}" if r.verdict != "inconclusive" else ""
    )


def table_lines(cmp: Comparison) -> list[str]:
    """The primaries the answer gives no figures for (``Answer.unstated``: the speed it cannot
    decide here), one row per metric: the baseline's value once, then each variant's value,
    change and interval; [] when the answer states every primary's figures."""
    by_metric: dict[tuple[str, str], dict[str, Row]] = {}
    for v in cmp.variants:
        for r in answer(cmp, v).unstated:
            by_metric.setdefault((r.suite, r.metric), {})[v] = r
    if not by_metric:
        return []
    arms = [v for v in cmp.variants if any(v in per for per in by_metric.values())]
    lines = [
        f"Speed, not decided here (geometric means of the paired repeats; change vs "
        f"`{esc(cmp.baseline)}`):",
        "",
        "| metric | "
        + " | ".join([f"`{esc(cmp.baseline)}`"] + [f"`{esc(v)}`" for v in arms])
        + " |",
        "|" + "---|" * (len(arms) + 2),
    ]
    for per in by_metric.values():
        first = next(iter(per.values()))
        cells = [esc(first.short_label()), _with_unit(first, "baseline")]
        cells += [_cell(per[v]) if v in per else "" for v in arms]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_comment(
    cmp: Comparison,
    links: Links | None = None,
    *,
    key: str = DEFAULT_KEY,
    title: str | None = None,
    limit: int = GITHUB_COMMENT_LIMIT,
) -> str:
    """The comment's Markdown (the module's order), at most ``limit`` characters: answer lines
    cut at :data:`ANSWER_LINE_MAX`; past the limit the table's rows, then the answer's blocks
    are left out from the end with a note; at last the text is cut. ``title`` defaults to
    "patchbench: <variants> vs <baseline>". This machine's paths are made portable
    (:func:`patchbench.report.text.local_paths`). Raises ValueError for a ``limit`` under
    1,000."""
    if limit < 1000:
        raise ValueError(f"limit {limit} is too small for a comment (at least 1000)")
    links = links or Links()
    head = _head_lines(cmp, key, title)
    blocks = _answer_blocks(cmp)
    table = table_lines(cmp)
    rows, table_head = table[4:], table[:4]
    more = ": see the full report" if links.report_url else ""
    tail = _link_lines(links)

    def text(n_blocks: int, n_rows: int) -> str:
        ans = [line for b in blocks[:n_blocks] for line in b]
        if n_blocks < len(blocks):
            ans += [f"… {len(blocks) - n_blocks} more part(s) of the answer left out{more}", ""]
        notes = [caveats_line(cmp), identity_line(cmp), ""] + _warning_lines(cmp)
        tab: list[str] = []
        if rows and n_rows == 0:
            tab = [f"… the speed table ({len(rows)} rows) left out{more}", ""]
        elif rows:
            tab = table_head + rows[:n_rows]
            if n_rows < len(rows):
                tab.append(f"| … {len(rows) - n_rows} more row(s) left out{more} |")
            tab.append("")
        return local_paths("\n".join(head + ans + notes + tab + tail).rstrip("\n") + "\n")

    n_blocks, n_rows = len(blocks), len(rows)
    body = text(n_blocks, n_rows)
    while len(body) > limit and n_rows > 0:
        # leave out as many rows as the excess needs at once (each row is one line)
        excess = len(body) - limit
        while n_rows > 0 and excess > 0:
            n_rows -= 1
            excess -= len(rows[n_rows]) + 1
        body = text(n_blocks, n_rows)
    while len(body) > limit and n_blocks > 0:
        n_blocks -= 1
        body = text(n_blocks, n_rows)
    if len(body) > limit:
        note = "\n\n… (cut to fit GitHub's comment limit)\n"
        body = body[: limit - len(note)] + note
    return body


def _head_lines(cmp: Comparison, key: str, title: str | None) -> list[str]:
    """The marker, the heading (what was compared), each git build's commit and subject, and a
    partial run's state."""
    compared = f"{', '.join(cmp.variants) or 'no variant'} vs {cmp.baseline}"
    head = [marker(key), f"### {title or 'patchbench: ' + compared}", ""]
    names = build_names(cmp)
    if names:
        head += [_cut(f"- {esc(n)}", ANSWER_LINE_MAX) for n in names] + [""]
    partial = partial_lines(cmp)
    if partial:
        head += [f"**{partial[0]}**"] + [f"`{x.split(': ', 1)[1]}`" for x in partial[1:]] + [""]
    return head


def _answer_blocks(cmp: Comparison) -> list[list[str]]:
    """The answer (:func:`patchbench.report.text.answer`) as blocks: a lead sentence and
    bullets. With several variants the clauses every one of them has, word for word, come once
    in a block of their own ("Both variants vs baseline"): first when one of them is a decided
    result, else after each variant's own. The output-identity clauses are the identity line's."""
    per, leading = {}, set()
    for v in cmp.variants:
        a = answer(cmp, v)
        per[a.head.strip()] = a.clauses[len(a.identity) :]
        leading.update(a.clauses[len(a.identity) : a.decided])
    common: list[str] = []
    if len(per) > 1:
        lists = list(per.values())
        common = [c for c in lists[0] if all(c in other for other in lists[1:])]
    blocks = []
    for lead, clauses in per.items():
        own = [c for c in clauses if c not in common]
        if own or not common:
            blocks.append(_block(lead, own or ["no primary metric"]))
    if common:
        who = "Both variants" if len(per) == 2 else f"All {len(per)} variants"
        shared = _block(f"{who} vs {cmp.baseline}:", common)
        # shared decided results lead; shared undecided ones follow each variant's own
        blocks.insert(0, shared) if leading & set(common) else blocks.append(shared)
    return blocks


def _block(lead: str, clauses: list[str]) -> list[str]:
    return [f"**{esc(lead)}**"] + [_cut(f"- {c}", ANSWER_LINE_MAX) for c in clauses] + [""]


def _warning_lines(cmp: Comparison) -> list[str]:
    """Failed cells, a failed A/A check and the host's warnings (report.md's), one bold line
    each ([] when none)."""
    out = []
    bad = [c for c in cmp.cells if c.get("status") != "ok"]
    if bad:
        out += [f"**{len(bad)} of {len(cmp.cells)} timed cells did not end ok.**", ""]
    if not cmp.health.ok:
        out += ["**A/A check failed**: " + esc(" ".join(cmp.health.notes)), ""]
    out += [x for w in host_warnings(cmp) for x in (f"**{esc(w)}**", "")]
    return out


def _link_lines(links: Links) -> list[str]:
    """The PR figure as an image and the full report as a link, each only with its URL."""
    out = []
    if links.figure_url:
        out += [f"![PR figure]({links.figure_url})", ""]
    if links.report_url:
        out += [f"[Full report]({links.report_url})", ""]
    return out


def _cut(line: str, n: int) -> str:
    """``line`` cut to ``n`` characters with a closing "…"."""
    return line if len(line) <= n else line[: n - 1].rstrip() + "…"


# ------------------------------------------------------------------------------------ command
def add_arguments(p) -> None:
    """The options of ``patchbench comment``."""
    p.add_argument("run", type=Path, help="a run folder, or its compare.json")
    p.add_argument(
        "--publish-url",
        metavar="URL",
        help="where the run folder is published (a browser can fetch URL/plots/pr_figure.png "
        "and URL/report.md): embeds the PR figure and links the report",
    )
    p.add_argument(
        "--report-url",
        metavar="URL",
        help="link the full report at URL (without it, or --publish-url, the comment names no "
        "report)",
    )
    p.add_argument(
        "--figure-url",
        metavar="URL",
        help="embed the PR figure from URL as an image (without it, or --publish-url, no figure)",
    )
    p.add_argument(
        "--title",
        help="the comment's heading (default: patchbench: <variants> vs <baseline>)",
    )
    p.add_argument(
        "--key",
        default=DEFAULT_KEY,
        help="the sticky comment's key: one comment per key and pull request (default "
        f"{DEFAULT_KEY})",
    )
    p.add_argument("--out", type=Path, help="also write the comment to this file")
    p.add_argument(
        "--post",
        action="store_true",
        help="create or update the sticky comment on the pull request (token: GITHUB_TOKEN; "
        "exit 2 without it, 3 when GitHub refuses)",
    )
    p.add_argument("--repo", metavar="OWNER/NAME", help="default: GITHUB_REPOSITORY")
    p.add_argument("--pr", type=int, metavar="N", help="default: from GITHUB_EVENT_PATH")
    p.add_argument(
        "--max-chars",
        type=int,
        default=GITHUB_COMMENT_LIMIT,
        help=f"longest comment (default {GITHUB_COMMENT_LIMIT}, GitHub's limit)",
    )


def run(a) -> int:
    """``patchbench comment`` from parsed arguments: print (or post) the comment; returns 0."""
    if a.max_chars < 1000 or a.max_chars > GITHUB_COMMENT_LIMIT:
        raise UsageError(f"--max-chars must be 1000 to {GITHUB_COMMENT_LIMIT}, not {a.max_chars}")
    target = resolve_target(a.repo, a.pr) if a.post else None
    cmp = read_comparison(a.run)
    links = resolve_links(a.publish_url, a.report_url, a.figure_url)
    body = render_comment(cmp, links, key=a.key, title=a.title, limit=a.max_chars)
    if a.out:
        a.out.write_text(body)
    if target is None:
        print(body, end="")
        return 0
    what, url = post_comment(body, target, marker(a.key))
    print(f"{what} the comment on {target.repo}#{target.pr}: {url} ({len(body)} characters)")
    return 0
