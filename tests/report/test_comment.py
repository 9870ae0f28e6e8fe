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
from patchbench.analysis.comparison import read_comparison
from patchbench.errors import UsageError
from patchbench.report.comment import (
    GITHUB_COMMENT_LIMIT,
    Links,
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


def test_golden_comment_holds_the_answer_the_primaries_and_the_links():
    cmp = read_comparison(GOLDEN)
    body = render_comment(cmp)
    report = (GOLDEN / "report.md").read_text()
    answer = report.split("## Answer\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert body.startswith(marker() + "\n### patchbench: 20261201T212402Z-demo-cpu\n")
    assert all(line in body.splitlines() for line in answer) and len(answer) == 2
    rows = [ln for ln in body.splitlines() if ln.startswith("| pr9460") or ln.startswith("| mrope")]
    assert len(rows) == len(cmp.rows_for(primary=True)) == 14
    # the comment shows what the report's table shows (geometric means of the paired repeats:
    # 258.4 / 236.9 = 1.0908, the +9.1% change)
    shown = "| pr9460-upstream | Output token throughput (tok/s) | 236.9 | 258.4 | +9.1% |"
    assert shown in body and any(ln.startswith(shown) for ln in report.splitlines())
    assert "The PR figure is in the run folder." in body and "![" not in body
    print(f"\ngolden demo-cpu comment: {len(body)} characters")
    assert len(body) < 4000
    # published: the figure is an image, the report a link
    links = resolve_links("https://ci.example/runs/x/", environ={})
    body = render_comment(cmp, links, key="pr-h200", title="A/B of #7")
    assert body.startswith("<!-- patchbench-comment key=pr-h200 -->\n### A/B of #7\n")
    assert "![PR figure](https://ci.example/runs/x/plots/pr_figure.png)" in body
    assert "[Full report](https://ci.example/runs/x/report.md)" in body
    # in GitHub Actions without a published folder: the workflow run's page (its artifact)
    env = {"GITHUB_RUN_ID": "42", "GITHUB_REPOSITORY": "o/r"}
    assert resolve_links(environ=env) == Links(
        "https://github.com/o/r/actions/runs/42", None, "the workflow run's artifact"
    )


def test_a_comment_too_long_leaves_rows_then_answers_out_with_a_note():
    cmp = read_comparison(GOLDEN)
    full = render_comment(cmp)
    body = render_comment(cmp, limit=2000)
    assert len(body) <= 2000 and body.startswith(marker())
    n = len(re.findall(r"^\| (pr9460|mrope)", body, re.M))
    assert 0 < n < 14 and f"| … | {14 - n} more row(s): see the full report |" in body
    body = render_comment(cmp, limit=1000)
    assert len(body) <= 1000 and "more variant(s): see the full report" in body
    assert len(full) <= GITHUB_COMMENT_LIMIT
    # GitHub's limit itself: a run with many primaries is cut to fit
    many = cmp.model_copy(update={"rows": cmp.rows_for(primary=True) * 400})
    body = render_comment(many)
    assert GITHUB_COMMENT_LIMIT - 200 < len(body) <= GITHUB_COMMENT_LIMIT
    assert "more row(s): see the full report" in body
    assert sum(len(ln) for ln in body.splitlines() if ln.startswith("- ")) == 2 * 2000


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
    assert "[Full report](https://github.com/o/r/actions/runs/42)" in body
    assert "The PR figure is in the workflow run's artifact." in body
    env["PUBLISH_URL"] = "https://ci.example/runs/{run}"
    r = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("updated the comment on o/r#7"), r.stderr
    fig = "https://ci.example/runs/20261201T212402Z-demo-cpu/plots/pr_figure.png"
    assert len(gh.comments) == 1 and f"![PR figure]({fig})" in gh.comments[0]["body"]
