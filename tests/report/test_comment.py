"""``patchbench comment`` (patchbench.report.comment): the comment rendered from the golden demo run's
compare.json, its size limit, and ``--post`` against a fake GitHub REST API served here
(http.server on a free local port; never the network): create, then update the same comment,
a marker comment found on the second page of the comment list, and the errors for a missing
token (exit 2) and a refused token or permission (exit 3)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from patchbench import cli
from patchbench.analysis.comparison import BuildInfo, read_comparison
from patchbench.errors import UsageError
from patchbench.report.comment import (
    GITHUB_COMMENT_LIMIT,
    Links,
    hardware_text,
    identity_line,
    marker,
    render_comment,
    resolve_links,
)
from patchbench.report.github import GitHubError, GitHubRefused, post_comment, resolve_target

GOLDEN = Path(__file__).parent.parent / "data" / "golden" / "demo-cpu" / "expected"
TOKEN = "t0ken"


class FakeGitHub:
    """The issue-comment endpoints of one repository ``o/r``: comments live in ``self.comments``
    ({"id", "body", "html_url"}); pages of ``per_page`` with a Link header; requests without
    ``Bearer t0ken`` get 401; ``self.refuse`` {method: status} answers that method so;
    ``self.log`` records (method, path). The token is the user ``pb-bot`` (``GET /user``); the
    comments it makes carry that ``user``."""

    def __init__(self):
        self.comments: list[dict] = []
        self.refuse: dict[str, int] = {}
        self.log: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body, headers: dict | None = None):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str):
                url = urlparse(self.path)
                fake.log.append((method, url.path))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"message": "Bad credentials"})
                if method in fake.refuse:
                    msg = "Resource not accessible by integration"
                    return self._send(fake.refuse[method], {"message": msg})
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                if url.path == "/user" and method == "GET":
                    return self._send(200, {"login": "pb-bot", "type": "User"})
                m = re.fullmatch(r"/repos/o/r/issues/(\d+)/comments", url.path)
                if m and m.group(1) != "7":
                    return self._send(404, {"message": "Not Found"})
                if m and method == "GET":
                    q = parse_qs(url.query)
                    per, page = int(q["per_page"][0]), int(q.get("page", ["1"])[0])
                    got = fake.comments[(page - 1) * per : page * per]
                    more = page * per < len(fake.comments)
                    link = (
                        f"<{fake.url}/repos/o/r/issues/7/comments?per_page={per}&page={page + 1}>"
                    )
                    return self._send(200, got, {"Link": f'{link}; rel="next"'} if more else {})
                if m and method == "POST":
                    cid = 1000 + len(fake.comments)
                    c = {"id": cid, "body": body["body"], "html_url": f"https://gh/c/{cid}"}
                    c["user"] = {"login": "pb-bot", "type": "User"}
                    fake.comments.append(c)
                    return self._send(201, c)
                m = re.fullmatch(r"/repos/o/r/issues/comments/(\d+)", url.path)
                if m and method == "PATCH":
                    c = next(c for c in fake.comments if c["id"] == int(m.group(1)))
                    c["body"] = body["body"]
                    return self._send(200, c)
                return self._send(404, {"message": "Not Found"})

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PATCH(self):
                self._handle("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def env(self, **kw) -> dict[str, str]:
        return {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": self.url, **kw}


@pytest.fixture
def gh():
    fake = FakeGitHub()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def _lines(body: str) -> list[str]:
    return [ln for ln in body.splitlines() if ln]


def test_golden_comment_reads_in_order_and_says_each_thing_once():
    """The golden demo run (CPU, tiny random model, 2 repeats, two variants): heading, the
    report's answer as bullets (what both variants share once), one caveats line, output
    identity, the speed figures the answer does not give, and no link without a URL."""
    cmp = read_comparison(GOLDEN)
    body = render_comment(cmp)
    lines = _lines(body)
    assert lines[:3] == [
        marker(),
        "### patchbench: pr9460-upstream, mrope-sync-free vs baseline",
        "**Both variants vs baseline:**",
    ]
    # the report's answer, every clause but output identity, each once: the shared block, then
    # each variant's own (507 syncs -> 90 for the upstream change, -> 0 for ours)
    blocks = body.split("\n\n")
    both = blocks[1].splitlines()
    assert both[1:] == [  # the decided result first, an undecided accuracy after it
        "- median host syncs inside the mrope computation per decode step 4 -> 0 improved (one "
        "measurement per arm)",
        "- Overall accuracy +0.0 pt [-11.1, +11.1] inconclusive (more than 1260 questions to "
        "decide)",
    ]
    report = (GOLDEN / "report.md").read_text()
    answer = report.split("## Answer\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    for block, line in zip(blocks[2:4], answer, strict=True):
        head, *own = block.splitlines()
        variant = line[2:].split(" vs ")[0]
        assert head == f"**{variant} vs baseline:**"
        clauses = ["outputs identical 48/48"] + [b[2:] for b in both[1:] + own]
        # the report's line holds each clause, and nothing else: "- V vs baseline: " + clauses
        # joined by "; "
        assert all(c in line for c in clauses)
        assert len(line) == len(f"- {variant} vs baseline: ") + len("; ".join(clauses))
    assert "- host syncs per call 507 -> 90 improved (exact)" in blocks[2].splitlines()
    assert "- host syncs per call 507 -> 0 improved (exact)" in blocks[3].splitlines()
    assert blocks[4].splitlines() == [
        "Ran on CPU (2 cores, no GPU) · model `tiny-qwen25vl-tf4` (tiny random weights) · 2 paired "
        "repeats · sglang 0.5.1.post3",
        "Outputs identical to `baseline`: `pr9460-upstream` 48/48, `mrope-sync-free` 48/48.",
    ]
    # the speed rows: the baseline's value once; 258.4 / 236.9 = 1.0908 (+9.1%), 225.7 / 236.9
    # = 0.9527 (-4.7%); ITL 16.45 / 18.04 = 0.9119 (-8.8%), 21.27 / 18.04 = 1.1790 (+17.9%)
    table = blocks[6].splitlines()
    assert table[0] == "| metric | `baseline` | `pr9460-upstream` | `mrope-sync-free` |"
    assert table[2] == (
        "| Output token throughput | 236.9 tok/s | 258.4 tok/s (+9.1%) | 225.7 tok/s (-4.7%) |"
    )
    assert table[5] == "| Median ITL | 18.04 ms | 16.45 ms (-8.8%) | 21.27 ms (+17.9%) |"
    assert len(table) == 2 + 4 and len(blocks) == 7
    # no link, image or file a reviewer cannot open
    assert "](" not in body and "run folder" not in body and "report.md" not in body
    assert len(set(lines)) == len(lines)
    assert len(body) < 3000


def test_links_only_where_a_url_is_given():
    cmp = read_comparison(GOLDEN)
    links = resolve_links(report_url="https://ci.example/r", figure_url="https://ci.example/f.png")
    body = render_comment(cmp, links, key="pr-h200", title="A/B of #7")
    assert body.startswith("<!-- patchbench-comment key=pr-h200 -->\n### A/B of #7\n")
    assert body.count("![") == 1 and body.count("](") == 2
    assert body.endswith(
        "\n![PR figure](https://ci.example/f.png)\n\n[Full report](https://ci.example/r)\n"
    )
    lines = _lines(body)
    assert len(set(lines)) == len(lines)
    # a published run folder gives both; one URL gives only its own
    pub = resolve_links("https://ci.example/runs/x/")
    assert pub == Links(
        "https://ci.example/runs/x/report.md", "https://ci.example/runs/x/plots/pr_figure.png"
    )
    body = render_comment(cmp, Links(report_url="https://ci.example/r"))
    assert body.count("](") == 1 and "![" not in body


def test_caveats_name_the_gpu_the_builds_and_each_arms_sglang():
    """A run on GPUs whose arms were built from git: the heading names each build by commit and
    subject, the caveats line the GPUs and each arm's sglang, a hub model by its id."""
    cmp = read_comparison(GOLDEN)
    run = cmp.run.model_copy(deep=True)
    run.gpu, run.tiny, run.model = "NVIDIA H200 x2", False, "Qwen/Qwen2.5-VL-7B-Instruct"
    run.variants["baseline"].built = BuildInfo(kind="git", version="0.5.1", commit="a" * 40)
    run.variants["pr9460-upstream"].built = BuildInfo(
        kind="git", version="0.5.2", commit="8af4974fdfbe" + "0" * 28, subject="mrope: no sync"
    )
    body = render_comment(cmp.model_copy(update={"run": run}))
    lines = _lines(body)
    assert lines[1:4] == [
        "### patchbench: pr9460-upstream, mrope-sync-free vs baseline",
        "- baseline = aaaaaaaaaaaa",
        '- pr9460-upstream = 8af4974fdfbe "mrope: no sync"',
    ]
    assert (
        "Ran on 2 GPUs: NVIDIA H200 · model `Qwen/Qwen2.5-VL-7B-Instruct` · 2 paired repeats · "
        "sglang 0.5.1 (`baseline`), 0.5.2 (`pr9460-upstream`), 0.5.1.post3 (`mrope-sync-free`)"
    ) in lines
    assert hardware_text("NVIDIA H100") == "1 GPU: NVIDIA H100"
    assert hardware_text("A, B") == "2 GPUs: A, B"
    assert hardware_text(None, 2) == "CPU (2 cores, no GPU)"
    assert hardware_text(None, 1) == "CPU (1 core, no GPU)"
    assert hardware_text("NVIDIA H100", 16) == "1 GPU: NVIDIA H100"


def test_a_comment_too_long_leaves_rows_then_answers_out_with_a_note():
    cmp = read_comparison(GOLDEN)
    full = render_comment(cmp)
    # the limits below are the full length less: the table's last rows go first (ITL's, 65
    # characters with its newline, then TTFT's: the note takes a line), the answer stays whole
    body = render_comment(cmp, limit=len(full) - 23)
    assert len(body) <= len(full) - 23 and body.startswith(marker())
    n = len(re.findall(r"^\| Median", body, re.M))
    assert n == 2 and "| … 1 more row(s) left out |" in body
    body = render_comment(cmp, limit=len(full) - 73)
    assert len(re.findall(r"^\| Median", body, re.M)) == 1 and "| … 2 more row(s)" in body
    assert "**mrope-sync-free vs baseline:**" in body
    # no table at all still too long: the answer's last block goes, with a note
    short = len(full) - 773
    body = render_comment(cmp, limit=short)
    assert len(body) <= short and "… 1 more part(s) of the answer left out" in body
    assert "… the speed table (4 rows) left out" in body and "| metric |" not in body
    # with a report to see: the note points to it
    body = render_comment(cmp, Links(report_url="https://r"), limit=short)
    assert "left out: see the full report" in body
    # GitHub's limit itself: a run with many primaries still fits
    many = cmp.model_copy(update={"rows": cmp.rows_for(primary=True) * 400})
    assert len(render_comment(many)) <= GITHUB_COMMENT_LIMIT


def test_post_creates_then_updates_one_sticky_comment_across_pages(gh, tmp_path):
    target = resolve_target("o/r", 7, gh.env())
    gh.comments += [{"id": i, "body": f"other {i}", "html_url": "x"} for i in range(150)]
    assert post_comment("first", target, marker()) == ("created", "https://gh/c/1150")
    assert gh.comments[-1]["body"] == marker() + "\nfirst"
    # the marker comment is on the second page (100 a page): found and edited in place
    assert post_comment(marker() + "\nsecond", target, marker()) == ("updated", "https://gh/c/1150")
    assert post_comment(marker() + "\nsecond", target, marker())[0] == "unchanged"
    assert [c["body"] for c in gh.comments if marker() in c["body"]] == [marker() + "\nsecond"]
    assert len(gh.comments) == 151
    gets = [p for m, p in gh.log if m == "GET"]
    assert len(gets) == 9  # the token's identity, then two pages per post
    # another key is another comment
    assert post_comment("x", target, marker("sweep"))[0] == "created" and len(gh.comments) == 152


def test_cli_posts_from_the_actions_environment_and_names_what_was_refused(
    gh, tmp_path, monkeypatch, capsys
):
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"issue": {"number": 7, "pull_request": {"url": "u"}}}))
    for k, v in gh.env(GITHUB_REPOSITORY="o/r", GITHUB_EVENT_PATH=str(event)).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("GITHUB_RUN_ID", raising=False)
    run = str(GOLDEN / "compare.json")
    assert cli.main(["comment", run, "--post", "--out", str(tmp_path / "c.md")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("created the comment on o/r#7: https://gh/c/1000 (")
    assert gh.comments[0]["body"] == (tmp_path / "c.md").read_text()
    assert cli.main(["comment", run, "--post", "--title", "again"]) == 0
    assert capsys.readouterr().out.startswith("updated the comment on o/r#7")
    assert len(gh.comments) == 1 and "### again" in gh.comments[0]["body"]
    # 403 on the edit: exit 3, naming the request and the permission
    gh.refuse["PATCH"] = 403
    assert cli.main(["comment", run, "--post"]) == 3
    err = capsys.readouterr().err
    assert err.startswith(
        "patchbench comment: environment not ready (exit 3): updating comment 1000 on o/r "
        "refused (403)"
    )
    assert "pull-requests: write" in err and "Resource not accessible" in err
    # 401: a bad token; 404: another pull request
    monkeypatch.setenv("GITHUB_TOKEN", "wrong")
    with pytest.raises(GitHubRefused, match=r"reading the token.s identity refused \(401\)"):
        post_comment("x", resolve_target(), marker())
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    assert cli.main(["comment", run, "--post", "--pr", "8"]) == 3
    assert "o/r or its pull request #8 was not found" in capsys.readouterr().err
    # no token: exit 2 before anything is read or sent
    monkeypatch.delenv("GITHUB_TOKEN")
    n = len(gh.log)
    assert cli.main(["comment", run, "--post"]) == 2
    assert "--post needs a token in GITHUB_TOKEN" in capsys.readouterr().err
    assert len(gh.log) == n
    with pytest.raises(UsageError, match="--post needs the pull request's number"):
        resolve_target("o/r", None, {"GITHUB_TOKEN": TOKEN})
    # an API nobody answers: exit 4
    down = resolve_target("o/r", 7, {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": "http://127.0.0.1:9"})
    with pytest.raises(GitHubError, match=r"reading the token.s identity: cannot reach") as ei:
        post_comment("x", down, marker())
    assert ei.value.exit_code == 4


def test_action_comment_step_posts_and_the_example_runs_only_on_demand(gh, tmp_path):
    """The composite action's comment step, run as the runner would (bash, inputs in env) against
    the fake API; the action runs `patchbench ab` with the agreed spelling (the example
    workflow's jobs: tests/cli/test_workflows.py)."""
    import os
    import shutil
    import subprocess
    import sys

    import yaml

    repo = Path(__file__).resolve().parents[2]
    action = yaml.safe_load((repo / ".github/actions/patchbench-ab/action.yml").read_text())
    steps = {s["name"]: s for s in action["runs"]["steps"]}
    assert action["runs"]["using"] == "composite"
    ab = steps["patchbench ab"]["run"]
    assert '-m patchbench ab --git "$checkout" --range "$AB_RANGE" --preset "$AB_PRESET"' in ab
    assert all("${{" not in s.get("run", "") for s in steps.values())  # inputs only via env
    run_dir = tmp_path / "results" / "20261201T212402Z-demo-cpu"
    run_dir.mkdir(parents=True)
    shutil.copy(GOLDEN / "compare.json", run_dir)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 7}}))
    env = {
        **os.environ,
        **gh.env(GITHUB_REPOSITORY="o/r", GITHUB_EVENT_PATH=str(event), GITHUB_RUN_ID="42"),
        "PB_DIR": str(repo),
        "PB_PYTHON": sys.executable,
        "RUN_DIR": str(run_dir),
        "AB_RANGE": "origin/main...HEAD",
        "AB_PRESET": "pr-h200",
        "AB_KEY": "pr-h200",
        "PUBLISH_URL": "",
    }
    script = steps["Comment on the pull request"]["run"]
    r = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    body = gh.comments[0]["body"]
    assert body.startswith("<!-- patchbench-comment key=pr-h200 -->\n")
    assert "### patchbench A/B (pr-h200): origin/main...HEAD" in body
    assert "[Full report](https://github.com/o/r/actions/runs/42)" in body and "![" not in body
    env["PUBLISH_URL"] = "https://ci.example/runs/{run}"
    r = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("updated the comment on o/r#7"), r.stderr
    fig = "https://ci.example/runs/20261201T212402Z-demo-cpu/plots/pr_figure.png"
    assert len(gh.comments) == 1 and f"![PR figure]({fig})" in gh.comments[0]["body"]


def test_the_comment_carries_the_host_warning_and_says_why_identity_is_unknown():
    """A reviewer reads the comment, not report.md: the host warning that opens the report's
    answer is in it too; with cells that did not end ok, output identity is "not known", not
    "not measured" (fresh-user trial)."""
    cmp = read_comparison(GOLDEN)
    host = cmp.run.host.model_copy(update={"warnings": ["the host was oversubscribed"]})
    busy = cmp.model_copy(update={"run": cmp.run.model_copy(update={"host": host})})
    assert "**Warning (host): the host was oversubscribed.**" in render_comment(busy).splitlines()
    failed = cmp.model_copy(
        update={"cells": [{**c, "status": "failed"} for c in cmp.cells], "pairs": {}}
    )
    assert identity_line(failed) == (
        "Output identity: not known (the cells that compare outputs did not end ok)."
    )
