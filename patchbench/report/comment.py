"""``patchbench comment RUN``: a pull-request comment from compare.json alone (a hidden marker,
the title, the answer, the primaries table, the PR figure and a link to the full report, within
GitHub's :data:`GITHUB_COMMENT_LIMIT`), and ``--post``: one sticky comment through GitHub's REST
API (``urllib.request``: a few synchronous calls; token ``GITHUB_TOKEN``, base
``GITHUB_API_URL``). A comment cannot embed a runner's file, so the figure is an image only when
the run folder is published (``--publish-url`` or ``--figure-url``); otherwise the comment says
where it is (in Actions: the workflow run's artifact).

The posting itself (origin, pages, whose comment is edited, exit codes) is
:mod:`patchbench.report.github`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from patchbench.analysis.comparison import Comparison, Row, read_comparison
from patchbench.errors import UsageError
from patchbench.report.github import post_comment, resolve_target
from patchbench.report.text import (
    VERDICT_MARK,
    build_names,
    esc,
    exactness,
    fmt_bounded,
    fmt_change,
    fmt_ci,
    local_paths,
    sentence,
)

#: the longest body GitHub accepts for an issue or pull-request comment, in characters
GITHUB_COMMENT_LIMIT = 65_536
#: the figure's file name inside a run folder's plots/ (patchbench.report.plots.make_plots)
PR_FIGURE = "plots/pr_figure.png"
DEFAULT_KEY = "patchbench"
#: the longest answer line (one variant's sentence) in a comment
ANSWER_LINE_MAX = 2000


def marker(key: str = DEFAULT_KEY) -> str:
    """The hidden HTML comment that marks the sticky comment of ``key`` (one per pull request)."""
    return f"<!-- patchbench-comment key={key} -->"


def _table_row(r: Row) -> str:
    det = r.kind == "deterministic"
    interval = exactness(r) if det else fmt_ci(r.low, r.high, r.change_unit)
    verdict = VERDICT_MARK.get(r.verdict, r.verdict)
    return (
        f"| {esc(r.variant)} | {esc(r.name())} | "
        f"{fmt_bounded(r.baseline_value, r.baseline_bound)} | "
        f"{fmt_bounded(r.variant_value, r.variant_bound)} | "
        f"{fmt_change(r.change, r.change_unit)} | {interval} | {verdict} |"
    )


@dataclass
class Links:
    """The full report's URL (None: named only), the PR figure's image URL (None: not embedded)
    and, without it, where the figure is."""

    report_url: str | None = None
    figure_url: str | None = None
    figure_where: str = "the run folder"


def resolve_links(
    publish_url: str | None = None,
    report_url: str | None = None,
    figure_url: str | None = None,
    environ: dict[str, str] | None = None,
) -> Links:
    """The links: ``publish_url`` gives both (``plots/pr_figure.png``, ``report.md`` under it),
    ``report_url`` / ``figure_url`` override it; in Actions the report defaults to the run's page."""
    env = os.environ if environ is None else environ
    base = publish_url.rstrip("/") if publish_url else None
    fig = figure_url or (f"{base}/{PR_FIGURE}" if base else None)
    rep = report_url or (f"{base}/report.md" if base else None)
    where = ""
    if rep is None and env.get("GITHUB_RUN_ID") and env.get("GITHUB_REPOSITORY"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com").rstrip("/")
        rep = f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
        where = "the workflow run's artifact"
    if fig is None:
        where = where or ("the run folder linked below" if rep else "the run folder")
    return Links(rep, fig, where)


def render_comment(
    cmp: Comparison,
    links: Links | None = None,
    *,
    key: str = DEFAULT_KEY,
    title: str | None = None,
    limit: int = GITHUB_COMMENT_LIMIT,
) -> str:
    """The comment's Markdown, at most ``limit`` characters: answer lines cut at
    :data:`ANSWER_LINE_MAX` and at most half the limit; then table rows, then answer lines are
    left out from the end with a note; at last the text is cut. ``title`` defaults to
    "patchbench: <run id>". This machine's paths are made portable
    (:func:`patchbench.report.text.local_paths`). Raises ValueError for a ``limit`` under
    1,000."""
    if limit < 1000:
        raise ValueError(f"limit {limit} is too small for a comment (at least 1000)")
    links = links or Links()
    head = _head_lines(cmp, key, title)
    answer = [_cut(f"- {sentence(cmp, v)}", ANSWER_LINE_MAX) for v in cmp.variants]
    rows = [_table_row(r) for r in cmp.rows_for(primary=True)]
    table_head = [
        "",
        "| variant | metric | baseline | variant | change | interval | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    tail = _tail_lines(cmp, links, bool(rows))

    def text(n_answer: int, n_rows: int) -> str:
        ans = answer[:n_answer]
        if n_answer < len(answer):
            ans.append(f"- … {len(answer) - n_answer} more variant(s): see the full report")
        tab: list[str] = []
        if rows:
            tab = table_head + rows[:n_rows]
            if n_rows < len(rows):
                tab.append(
                    f"| … | {len(rows) - n_rows} more row(s): see the full report | | | | | |"
                )
        return local_paths("\n".join(head + ans + tab + tail) + "\n")

    n_answer, n_rows = len(answer), len(rows)
    # the answer takes at most half the comment, the table the rest
    while n_answer > 0 and sum(len(a) + 1 for a in answer[:n_answer]) > limit // 2:
        n_answer -= 1
    body = text(n_answer, n_rows)
    while len(body) > limit and n_rows > 0:
        # leave out as many rows as the excess needs at once (each row is one line)
        excess = len(body) - limit
        while n_rows > 0 and excess > 0:
            n_rows -= 1
            excess -= len(rows[n_rows]) + 1
        body = text(n_answer, n_rows)
    while len(body) > limit and n_answer > 0:
        n_answer -= 1
        body = text(n_answer, n_rows)
    if len(body) > limit:
        note = "\n\n… (cut to fit GitHub's comment limit: see the full report)\n"
        body = body[: limit - len(note)] + note
    return body


def _head_lines(cmp: Comparison, key: str, title: str | None) -> list[str]:
    """The marker, the heading, what was compared, failed cells and a failed A/A check."""
    tag = f" ({len(cmp.aa_variants)} A/A)" if cmp.aa_variants else ""
    head = [
        marker(key),
        f"### {title or 'patchbench: ' + cmp.run_id}",
        "",
        f"{len(cmp.variants)} variant(s){tag} against `{cmp.baseline}`, {cmp.repeats} "
        "interleaved repeat(s); intervals at the Holm-adjusted level each verdict used.",
        "",
    ]
    names = build_names(cmp)
    if names:
        head += [_cut(f"- {esc(n)}", ANSWER_LINE_MAX) for n in names] + [""]
    bad = [c for c in cmp.cells if c.get("status") != "ok"]
    if bad:
        head += [f"**{len(bad)} of {len(cmp.cells)} timed cells did not end ok.**", ""]
    if not cmp.health.ok:
        head += ["**A/A check failed**: " + esc(" ".join(cmp.health.notes)), ""]
    return head


def _tail_lines(cmp: Comparison, links: Links, has_rows: bool) -> list[str]:
    """The PR figure (or where it is) and the link to the full report."""
    tail = [""]
    if links.figure_url:
        tail += [f"![PR figure]({links.figure_url})", ""]
    elif has_rows:
        tail += [f"The PR figure is in {links.figure_where}.", ""]
    if links.report_url:
        tail.append(f"[Full report]({links.report_url}) · `{cmp.run_id}`")
    else:
        tail.append(f"Full report: `report.md` in the run folder `{cmp.run_id}`.")
    return tail


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
    p.add_argument("--report-url", metavar="URL", help="link to the full report")
    p.add_argument("--figure-url", metavar="URL", help="the PR figure's image URL")
    p.add_argument("--title", help="the comment's heading (default: patchbench: <run id>)")
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
