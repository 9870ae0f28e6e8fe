"""The HTTP half of ``patchbench comment --post``: one sticky comment on a pull request through
GitHub's REST API (``urllib.request``: a few synchronous calls; token ``GITHUB_TOKEN``, base
``GITHUB_API_URL``), with the token kept to the API's own origin.

What it will and will not do with the token (docs/faults.md, "Security"):

- **Origin**: every request goes to the origin (scheme, host, port) of ``GITHUB_API_URL``
  (``https://``, or ``http://`` to this machine only). A redirect is never followed by urllib
  (it would carry the Authorization header to wherever ``Location`` points, and turn a POST
  into a GET): a 3xx to a GET is followed by hand only to the same origin, at most
  :data:`MAX_REDIRECTS` times; a 3xx to another origin, or any 3xx to a POST or PATCH, is
  :class:`GitHubUnsafe` (exit 4) and nothing is sent there.
- **Pages**: a ``Link: rel="next"`` URL must be on the API's origin and the same comment list
  (path); at most :data:`MAX_PAGES` pages are read, a URL already read is a loop: both
  :class:`GitHubUnsafe`.
- **Whose comment**: the comment edited is the first whose body holds the marker **and** whose
  author is the token's own identity; one by anybody else holding the marker (quoted, or planted
  to be overwritten) is left alone and a new comment is made. The identity is ``GET /user``'s
  ``login`` for a personal or OAuth token; an installation token (Actions' ``GITHUB_TOKEN``, a
  GitHub App) cannot read ``/user`` (403), and its comments are written by the app's bot
  account: the identity is then :data:`DEFAULT_BOT` ("github-actions[bot]"), or
  ``PATCHBENCH_COMMENT_BOT`` for another app (its slug + "[bot]"), and the author must also be
  of type "Bot". (``GET /app`` would need the app's private key, which a workflow does not hold;
  a configured login is the honest choice.)
- **Answers**: every answer is checked before use: HTTP 401/403/404 is :class:`GitHubRefused`
  (exit 3); another HTTP error or an unreachable API :class:`GitHubError` (exit 4); a body that
  is not JSON or not of the expected shape :class:`GitHubBadAnswer` (exit 4). Messages name
  the request and the URL, never the token.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from patchbench.errors import EnvironmentNotReady, RunFailed, UsageError

DEFAULT_API = "https://api.github.com"
#: seconds one API request may take
HTTP_TIMEOUT_S = 30
#: most pages of the comment list read (100 comments a page: 5,000 comments)
MAX_PAGES = 50
#: most same-origin redirects followed for one GET
MAX_REDIRECTS = 3
#: the author of comments made with Actions' GITHUB_TOKEN (an installation token)
DEFAULT_BOT = "github-actions[bot]"
#: the variable naming another GitHub App's bot login ("<app slug>[bot]")
BOT_ENV = "PATCHBENCH_COMMENT_BOT"
#: hosts a token may be sent to over plain http (a local fake or proxy), never the network
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class GitHubRefused(EnvironmentNotReady):
    """GitHub answered 401, 403 or 404 (``status``): the token or its permissions (exit 3)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class GitHubError(RunFailed):
    """Another HTTP error or an unreachable API (exit 4)."""


class GitHubBadAnswer(GitHubError):
    """An answer that is not JSON, or not of the shape the request returns (exit 4)."""


class GitHubUnsafe(GitHubError):
    """An answer that would send the token elsewhere or never end: a redirect to another origin,
    a redirect of a POST or PATCH, a next page off the API, a page loop or too many pages
    (exit 4)."""


@dataclass
class Target:
    """The pull request: ``repo`` "owner/name", ``pr`` number, ``api`` base, ``token``;
    ``bot``: the bot login an installation token's comments carry."""

    repo: str
    pr: int
    api: str
    token: str
    bot: str = DEFAULT_BOT

    def __repr__(self) -> str:  # never the token, in a log or a traceback
        return f"Target(repo={self.repo!r}, pr={self.pr}, api={self.api!r}, bot={self.bot!r})"


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``, the port made explicit (443 for https, 80 for http)."""
    u = urllib.parse.urlsplit(url)
    scheme = (u.scheme or "").lower()
    try:
        port = u.port
    except ValueError:
        port = -1
    return scheme, (u.hostname or "").lower(), port or {"https": 443, "http": 80}.get(scheme, 0)


def event_pr(path: str) -> int | None:
    """The pull request of the Actions event payload at ``path`` (pull_request or issue_comment
    events), None when it names none."""
    try:
        ev = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(ev, dict):
        return None
    pr = ev.get("pull_request")
    if isinstance(pr, dict) and isinstance(pr.get("number"), int):
        return pr["number"]
    issue = ev.get("issue")
    if (
        isinstance(issue, dict)
        and issue.get("pull_request")
        and isinstance(issue.get("number"), int)
    ):
        return issue["number"]
    return ev["number"] if isinstance(ev.get("number"), int) else None


def resolve_target(
    repo: str | None = None, pr: int | None = None, environ: dict[str, str] | None = None
) -> Target:
    """The pull request and token for ``--post`` (options, else ``GITHUB_REPOSITORY`` and the
    event at ``GITHUB_EVENT_PATH``). Raises UsageError (exit 2) naming what is missing, or an
    API URL a token must not be sent to (not https, except to this machine)."""
    env = os.environ if environ is None else environ
    token = env.get("GITHUB_TOKEN", "").strip()
    if not token:
        raise UsageError(
            "--post needs a token in GITHUB_TOKEN (in a workflow: `env: GITHUB_TOKEN: "
            "${{ github.token }}` with `pull-requests: write`)"
        )
    repo = repo or env.get("GITHUB_REPOSITORY") or None
    if not repo or not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise UsageError(
            f"--post needs the repository as OWNER/NAME (--repo or GITHUB_REPOSITORY), got {repo!r}"
            if repo
            else "--post needs the repository: --repo OWNER/NAME (or GITHUB_REPOSITORY)"
        )
    if pr is None and env.get("GITHUB_EVENT_PATH"):
        pr = event_pr(env["GITHUB_EVENT_PATH"])
    if pr is None:
        raise UsageError(
            "--post needs the pull request's number: --pr N (or a pull_request / issue_comment "
            "event at GITHUB_EVENT_PATH)"
        )
    api = (env.get("GITHUB_API_URL") or DEFAULT_API).rstrip("/")
    scheme, host, _ = origin(api)
    if not host or not (scheme == "https" or (scheme == "http" and host in LOCAL_HOSTS)):
        raise UsageError(
            f"GITHUB_API_URL {api!r}: the token is sent only over https (or plain http to this "
            "machine)"
        )
    bot = (env.get(BOT_ENV) or DEFAULT_BOT).strip()
    return Target(repo, int(pr), api, token, bot)


def next_link(link: str | None) -> str | None:
    """The ``rel="next"`` URL of a Link header, or None."""
    for part in (link or "").split(","):
        m = re.match(r"\s*<([^>]+)>\s*;(.*)", part)
        if m and re.search(r'rel="?next"?', m.group(2)):
            return m.group(1)
    return None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib follows no redirect: a 3xx comes back as an HTTPError, decided by
    :meth:`GitHubClient.request`."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class GitHubClient:
    """The few REST calls a sticky comment needs, with the token of ``target`` (module
    docstring: origin, pages, answers)."""

    def __init__(self, target: Target):
        self.t = target
        self.origin = origin(target.api)
        self.opener = urllib.request.build_opener(_NoRedirect)

    def request(self, method: str, url: str, what: str, body: dict | None = None):
        """(decoded JSON, the Link header) of one request; ``what`` names it in errors."""
        data = json.dumps(body).encode() if body is not None else None
        for _ in range(MAX_REDIRECTS + 1):
            if origin(url) != self.origin:
                raise GitHubUnsafe(
                    f"{what}: {url} is not on {self.t.api}; the token is sent to no other origin"
                )
            req = urllib.request.Request(url, data=data, method=method)
            req.add_header("Accept", "application/vnd.github+json")
            req.add_header("Authorization", f"Bearer {self.t.token}")
            req.add_header("X-GitHub-Api-Version", "2022-11-28")
            req.add_header("User-Agent", "patchbench")
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with self.opener.open(req, timeout=HTTP_TIMEOUT_S) as resp:
                    raw, link = resp.read(), resp.headers.get("Link")
                    status = resp.status
            except urllib.error.HTTPError as e:
                if 300 <= e.code < 400:
                    url = self._redirect(e, method, url, what)
                    continue
                raise self._refused(e, what) from None
            except (urllib.error.URLError, OSError, ValueError) as e:
                reason = getattr(e, "reason", e)
                raise GitHubError(f"{what}: cannot reach {self.t.api} ({reason})") from None
            if 300 <= status < 400:  # a 304 or an unfollowed 3xx handed back as an answer
                raise GitHubBadAnswer(f"{what}: {self.t.api} answered {status} with no content")
            try:
                return (json.loads(raw) if raw else None), link
            except ValueError:
                raise GitHubBadAnswer(
                    f"{what}: {self.t.api} answered with something not JSON "
                    f"({len(raw)} bytes starting {raw[:40]!r})"
                ) from None
        raise GitHubUnsafe(f"{what}: more than {MAX_REDIRECTS} redirects; not followed")

    def _redirect(self, e: urllib.error.HTTPError, method: str, url: str, what: str) -> str:
        """The URL a 3xx answer to ``url`` points at, when it may be followed (a GET to the same
        origin); else GitHubUnsafe."""
        where = e.headers.get("Location") if e.headers is not None else None
        if method != "GET":
            raise GitHubUnsafe(
                f"{what}: {self.t.api} answered {method} with a redirect ({e.code} to "
                f"{where or 'nowhere'}); a {method} is never re-sent elsewhere or turned into a GET"
            )
        if not where:
            raise GitHubBadAnswer(f"{what}: {e.code} redirect without a Location")
        new = urllib.parse.urljoin(url, where)
        if origin(new) != self.origin:
            raise GitHubUnsafe(
                f"{what}: {self.t.api} redirected ({e.code}) to another origin, {new}; not "
                "followed, the token is sent to no other origin"
            )
        return new

    def _refused(self, e: urllib.error.HTTPError, what: str) -> Exception:
        try:
            got = json.loads(e.read() or b"{}")
            msg = got.get("message", "") if isinstance(got, dict) else ""
        except (ValueError, AttributeError, OSError):
            msg = ""
        said = f": GitHub says {str(msg)[:300]!r}" if msg else ""
        why = {
            401: "the token in GITHUB_TOKEN was not accepted (invalid or expired)",
            403: "the token may not do this (it needs `pull-requests: write`, or a rate "
            "limit was hit)",
            404: f"{self.t.repo} or its pull request #{self.t.pr} was not found (or the token "
            "cannot see the repository)",
        }.get(e.code)
        if why:
            return GitHubRefused(f"{what} refused ({e.code}): {why}{said}", e.code)
        return GitHubError(f"{what} failed ({e.code} {e.reason}){said}")

    def identity(self) -> tuple[str, bool]:
        """(login, is a bot) of the token: ``GET /user``; an installation token (403 there) is
        the bot :attr:`Target.bot`."""
        try:
            got, _ = self.request("GET", f"{self.t.api}/user", "reading the token's identity")
        except GitHubRefused as e:
            if e.status == 403:
                return self.t.bot, True
            raise
        if not isinstance(got, dict) or not isinstance(got.get("login"), str):
            raise GitHubBadAnswer("reading the token's identity: GET /user holds no login")
        return got["login"], False

    def comments(self) -> list[dict]:
        """Every comment of the pull request's conversation (100 a page, at most
        :data:`MAX_PAGES` pages), each checked to be an object with an integer ``id``."""
        first = f"{self.t.api}/repos/{self.t.repo}/issues/{self.t.pr}/comments?per_page=100"
        path = urllib.parse.urlsplit(first).path
        what = f"listing the comments of {self.t.repo}#{self.t.pr}"
        out: list[dict] = []
        url: str | None = first
        seen: set[str] = set()
        while url:
            if len(seen) >= MAX_PAGES:
                raise GitHubUnsafe(f"{what}: more than {MAX_PAGES} pages; stopped")
            seen.add(url)
            got, link = self.request("GET", url, what)
            if not isinstance(got, list) or not all(
                isinstance(c, dict) and isinstance(c.get("id"), int) for c in got
            ):
                raise GitHubBadAnswer(f"{what}: the answer is not a list of comments")
            out += got
            url = next_link(link)
            if url is None:
                break
            if origin(url) != self.origin or urllib.parse.urlsplit(url).path != path:
                raise GitHubUnsafe(f"{what}: the next page {url} is not this list on {self.t.api}")
            if url in seen:
                raise GitHubUnsafe(f"{what}: the next page {url} was read already (a loop)")
        return out

    def _comment(self, method: str, url: str, what: str, body: str) -> dict:
        got, _ = self.request(method, url, what, {"body": body})
        if not isinstance(got, dict) or not isinstance(got.get("id"), int):
            raise GitHubBadAnswer(f"{what}: the answer is not a comment")
        return got

    def create(self, body: str) -> dict:
        """POST a new comment; the comment GitHub answers."""
        url = f"{self.t.api}/repos/{self.t.repo}/issues/{self.t.pr}/comments"
        return self._comment("POST", url, f"commenting on {self.t.repo}#{self.t.pr}", body)

    def update(self, comment_id: int, body: str) -> dict:
        """PATCH comment ``comment_id``; the comment GitHub answers."""
        url = f"{self.t.api}/repos/{self.t.repo}/issues/comments/{comment_id}"
        what = f"updating comment {comment_id} on {self.t.repo}"
        return self._comment("PATCH", url, what, body)


def authored_by(comment: dict, login: str, bot: bool) -> bool:
    """True when ``comment``'s author is ``login`` (case-insensitive, as GitHub logins are),
    and of type "Bot" when ``bot``."""
    user = comment.get("user")
    if not isinstance(user, dict) or not isinstance(user.get("login"), str):
        return False
    if bot and user.get("type") != "Bot":
        return False
    return user["login"].lower() == login.lower()


def post_comment(body: str, target: Target, mark: str) -> tuple[str, str]:
    """Create the sticky comment marked ``mark``, or edit the first comment holding it that the
    token's identity wrote (module docstring). Returns ("created" | "updated" | "unchanged",
    its URL); raises GitHubRefused / GitHubError and its subclasses."""
    gh = GitHubClient(target)
    if mark not in body:
        body = f"{mark}\n{body}"
    login, bot = gh.identity()
    mine = [
        c
        for c in gh.comments()
        if isinstance(c.get("body"), str) and mark in c["body"] and authored_by(c, login, bot)
    ]
    if not mine:
        got = gh.create(body)
        return "created", str(got.get("html_url", ""))
    old = mine[0]
    if old.get("body") == body:
        return "unchanged", str(old.get("html_url", ""))
    got = gh.update(old["id"], body)
    return "updated", str(got.get("html_url", old.get("html_url", "")))
