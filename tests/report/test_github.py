"""The comment bot's HTTP half (patchbench.report.github) against fake GitHub APIs served here
(http.server on port 0, never the network): a comment holding the marker that somebody else
wrote is never edited, a redirect to another origin is refused with no request sent there, a
redirected POST is refused, a Link loop and an endless list stop with an error, a body that is
not JSON is a named error with exit 4, and an installation token (403 on /user) edits only its
bot's comment."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from patchbench import cli
from patchbench.errors import UsageError
from patchbench.report.github import (
    MAX_PAGES,
    GitHubBadAnswer,
    GitHubUnsafe,
    post_comment,
    resolve_target,
)

TOKEN = "t0ken-never-elsewhere"
MARK = "<!-- patchbench-comment key=patchbench -->"
#: an answer: (status, headers, body bytes)
Answer = tuple[int, dict, bytes]


def js(status: int, body, **headers) -> Answer:
    """A JSON answer."""
    return status, {"Content-Type": "application/json", **headers}, json.dumps(body).encode()


class Fake:
    """A local HTTP server answering each request with ``self.route(method, path_with_query,
    body)``; ``self.log`` holds (method, path with query, Authorization header) of each."""

    def __init__(self, route: Callable[[str, str, dict | None], Answer]):
        self.route = route
        self.log: list[tuple[str, str, str | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                fake.log.append((self.command, self.path, self.headers.get("Authorization")))
                status, headers, data = fake.route(self.command, self.path, body)
                self.send_response(status)
                for k, v in {"Content-Length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    made: list[Fake] = []

    def make(route) -> Fake:
        made.append(Fake(route))
        return made[-1]

    yield make
    for f in made:
        f.close()


def target(api: str, **env):
    return resolve_target("o/r", 7, {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": api, **env})


def comment(cid: int, login: str, body: str, kind: str = "User") -> dict:
    return {
        "id": cid,
        "body": body,
        "html_url": f"https://gh/c/{cid}",
        "user": {"login": login, "type": kind},
    }


def test_a_marked_comment_by_somebody_else_is_never_edited(serve):
    # the marker is in a comment by "mallory" (quoted, or planted to be overwritten): the bot
    # ("pb-bot") leaves it alone and makes its own; the next post edits its own only
    comments = [comment(1, "mallory", f"{MARK}\nplanted")]

    def route(method, path, body):
        if path == "/user":
            return js(200, {"login": "pb-bot"})
        if method == "GET":
            return js(200, comments)
        if method == "POST":
            comments.append(comment(2, "PB-Bot", body["body"]))
            return js(201, comments[-1])
        cid = int(path.rsplit("/", 1)[1])
        c = next(c for c in comments if c["id"] == cid)
        c["body"] = body["body"]
        return js(200, c)

    api = serve(route)
    assert post_comment("one", target(api.url), MARK) == ("created", "https://gh/c/2")
    assert post_comment("two", target(api.url), MARK) == ("updated", "https://gh/c/2")
    assert comments[0]["body"] == f"{MARK}\nplanted" and comments[1]["body"] == f"{MARK}\ntwo"
    assert [m for m, p, _ in api.log if m == "PATCH"] == ["PATCH"]
    assert ("PATCH", "/repos/o/r/issues/comments/2", f"Bearer {TOKEN}") in api.log


def test_an_installation_token_edits_only_its_bots_comment(serve):
    # GET /user is 403 for Actions' GITHUB_TOKEN: the identity is github-actions[bot] (type
    # Bot); a user who named himself alike ("type": "User") is not it
    comments = [
        comment(1, "github-actions[bot]", f"{MARK}\nx", kind="User"),
        comment(2, "github-actions[bot]", f"{MARK}\nold", kind="Bot"),
        comment(3, "other-app[bot]", f"{MARK}\nold", kind="Bot"),
    ]

    def route(method, path, body):
        if path == "/user":
            return js(403, {"message": "Resource not accessible by integration"})
        if method == "GET":
            return js(200, comments)
        return js(200, {**comments[1], "body": body["body"]})

    api = serve(route)
    assert post_comment("new", target(api.url), MARK) == ("updated", "https://gh/c/2")
    assert [p for m, p, _ in api.log if m == "PATCH"] == ["/repos/o/r/issues/comments/2"]
    # another app: PATCHBENCH_COMMENT_BOT names its bot
    api.log.clear()
    t = target(api.url, PATCHBENCH_COMMENT_BOT="other-app[bot]")
    assert post_comment("new", t, MARK)[0] == "updated"
    assert [p for m, p, _ in api.log if m == "PATCH"] == ["/repos/o/r/issues/comments/3"]


def test_a_redirect_to_another_origin_is_refused_and_nothing_is_sent_there(
    serve, capsys, monkeypatch
):
    elsewhere = serve(lambda m, p, b: js(200, []))
    api = serve(
        lambda m, p, b: (
            js(200, {"login": "pb-bot"})
            if p == "/user"
            else (302, {"Location": f"{elsewhere.url}/steal"}, b"")
        )
    )
    with pytest.raises(GitHubUnsafe, match="redirected \\(302\\) to another origin") as ei:
        post_comment("x", target(api.url), MARK)
    assert ei.value.exit_code == 4 and TOKEN not in str(ei.value)
    assert elsewhere.log == []
    # the same from the command line: one line, exit 4, no traceback
    env = {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": api.url}
    code = _cli_post(monkeypatch, env)
    err = capsys.readouterr().err
    assert code == 4 and err.startswith("patchbench comment: run failed (exit 4): listing the")
    assert "Traceback" not in err and TOKEN not in err and elsewhere.log == []
    # a same-origin redirect of a GET (a renamed repository) is followed, with the token
    moved = {"n": 0}

    def route(m, p, b):
        if p == "/user":
            return js(200, {"login": "pb-bot"})
        if p.startswith("/repos/o/r/") and m == "GET":
            moved["n"] += 1
            return 301, {"Location": "/repositories/9/issues/7/comments?per_page=100"}, b""
        if p.startswith("/repositories/9/") and m == "GET":
            return js(200, [])
        return js(201, comment(5, "pb-bot", b["body"]))

    same = serve(route)
    assert post_comment("x", target(same.url), MARK) == ("created", "https://gh/c/5")
    assert moved["n"] == 1 and all(a == f"Bearer {TOKEN}" for _, _, a in same.log)


def test_a_redirected_post_is_refused_never_turned_into_a_get(serve):
    def route(method, path, body):
        if path == "/user":
            return js(200, {"login": "pb-bot"})
        if method == "GET" and "/comments" in path and "per_page" in path:
            return js(200, [])
        return 307, {"Location": "/repos/o/r/issues/7/comments-elsewhere"}, b""

    api = serve(route)
    with pytest.raises(GitHubUnsafe, match="answered POST with a redirect \\(307"):
        post_comment("x", target(api.url), MARK)
    assert [m for m, _, _ in api.log] == ["GET", "GET", "POST"]


def test_a_link_loop_and_an_endless_list_stop_with_an_error(serve):
    def looping(method, path, body):
        if path == "/user":
            return js(200, {"login": "pb-bot"})
        return js(200, [], Link=f'<{api.url}{path}>; rel="next"')

    api = serve(looping)
    with pytest.raises(GitHubUnsafe, match="was read already \\(a loop\\)"):
        post_comment("x", target(api.url), MARK)
    assert len(api.log) == 2  # /user and the page once: never read again

    def endless(method, path, body):
        if path == "/user":
            return js(200, {"login": "pb-bot"})
        page = int(path.rsplit("page=", 1)[1]) if "page=" in path else 1
        nxt = f"{endless_api.url}/repos/o/r/issues/7/comments?per_page=100&page={page + 1}"
        return js(200, [], Link=f'<{nxt}>; rel="next"')

    endless_api = serve(endless)
    with pytest.raises(GitHubUnsafe, match=f"more than {MAX_PAGES} pages"):
        post_comment("x", target(endless_api.url), MARK)
    assert len(endless_api.log) == 1 + 50 and MAX_PAGES == 50
    # a next page off the API's origin is refused before it is asked
    other = serve(lambda m, p, b: js(200, []))
    off = serve(
        lambda m, p, b: (
            js(200, {"login": "pb-bot"})
            if p == "/user"
            else js(200, [], Link=f'<{other.url}/repos/o/r/issues/7/comments?page=2>; rel="next"')
        )
    )
    with pytest.raises(GitHubUnsafe, match="is not this list on"):
        post_comment("x", target(off.url), MARK)
    assert other.log == []


@pytest.mark.parametrize(
    ("user", "listing", "why"),
    [
        ((200, {}, b"<html>rate limited</html>"), None, "something not JSON"),
        (js(200, ["pb-bot"]), None, "GET /user holds no login"),
        (js(200, {"login": "pb-bot"}), (200, {}, b"{not json"), "something not JSON"),
        (js(200, {"login": "pb-bot"}), js(200, {"message": "x"}), "not a list of comments"),
        (js(200, {"login": "pb-bot"}), js(200, [{"id": "7"}]), "not a list of comments"),
        (js(200, {"login": "pb-bot"}), js(502, {"message": "bad gateway"}), "failed \\(502"),
    ],
)
def test_garbage_answers_are_named_errors_with_exit_4(
    serve, capsys, monkeypatch, user, listing, why
):
    api = serve(lambda m, p, b: user if p == "/user" else listing)
    code = _cli_post(monkeypatch, {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": api.url})
    err = capsys.readouterr().err
    assert code == 4, err
    assert err.startswith("patchbench comment: run failed (exit 4): ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and re.search(why, err)
    # a created comment that is not a comment
    post_only = serve(
        lambda m, p, b: (
            js(200, {"login": "pb-bot"})
            if p == "/user"
            else js(200, [])
            if m == "GET"
            else js(201, [])
        )
    )
    with pytest.raises(GitHubBadAnswer, match="commenting on o/r#7: the answer is not a comment"):
        post_comment("x", target(post_only.url), MARK)


def test_the_token_goes_over_https_only_except_to_this_machine():
    with pytest.raises(UsageError, match="only over https"):
        target("http://api.example.com")
    assert target("https://ghe.example/api/v3").api == "https://ghe.example/api/v3"
    assert TOKEN not in repr(target("https://api.github.com"))


GOLDEN = Path(__file__).parent.parent / "data" / "golden" / "demo-cpu" / "expected"


def _cli_post(monkeypatch, env: dict[str, str]) -> int:
    """``patchbench comment GOLDEN --post --repo o/r --pr 7`` with ``env`` set."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    run = str(GOLDEN / "compare.json")
    return cli.main(["comment", run, "--post", "--repo", "o/r", "--pr", "7"])
