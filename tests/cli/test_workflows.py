"""The GitHub workflows are safe by construction (docs/faults.md, "Security"): least permissions
per job, no stored credentials in a checkout, actions pinned by commit, the pull-request A/B
pinned to the head commit a maintainer triggered on and verified before anything runs, the PR's
code in a read-only job, the comment posted by a job that runs none of it, and the PR A/B and the
nightly on separate runners. The pin step's script runs here against a stand-in ``gh``."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
ACTION = REPO / ".github" / "actions" / "patchbench-ab" / "action.yml"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def steps_of(doc: dict) -> list[dict]:
    if "runs" in doc:
        return doc["runs"]["steps"]
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_grants_nothing_at_the_top_and_each_job_its_own(path):
    wf = load(path)
    assert wf["permissions"] == {}
    for name, job in wf["jobs"].items():
        assert "permissions" in job, (path.name, name)
        assert all(v in ("read", "write", "none") for v in job["permissions"].values())


@pytest.mark.parametrize("path", [*WORKFLOWS, ACTION], ids=lambda p: p.name)
def test_every_checkout_leaves_no_credentials_and_every_action_is_pinned(path):
    for step in steps_of(load(path)):
        uses = step.get("uses", "")
        if uses.startswith("actions/"):
            assert re.fullmatch(r"actions/[\w-]+@[0-9a-f]{40}", uses), uses
        if uses.startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False, (path.name, step)
        # nothing from the event or a step's output is spliced into a script's text
        assert "${{" not in step.get("run", ""), (path.name, step.get("name"))


def test_the_pr_ab_runs_pr_code_read_only_and_comments_from_another_job():
    wf = load(REPO / ".github/workflows/pr-ab-example.yml")
    # the base branch's workflow file runs, on a label or a maintainer's comment only
    assert wf[True] == {
        "pull_request_target": {"types": ["labeled"]},
        "issue_comment": {"types": ["created"]},
    }
    pin, ab, comment = wf["jobs"]["pin"], wf["jobs"]["ab"], wf["jobs"]["comment"]
    assert "github.event.label.name == 'patchbench-ab'" in pin["if"]
    assert "startsWith(github.event.comment.body, '/patchbench ab')" in pin["if"]
    assert "github.event.comment.author_association" in pin["if"]
    assert pin["permissions"] == {"pull-requests": "read"}
    # the PR's code: read-only, checked out at the pinned SHA and verified first
    assert ab["needs"] == "pin" and ab["permissions"] == {"contents": "read"}
    assert ab["runs-on"] == ["self-hosted", "h200", "pr-ab"]
    first, verify = ab["steps"][0], ab["steps"][1]
    assert first["with"]["ref"] == "${{ needs.pin.outputs.sha }}"
    assert "git -C sglang rev-parse HEAD" in verify["run"] and '"$PIN_SHA"' in verify["run"]
    trusted = [
        s for s in ab["steps"] + comment["steps"] if s.get("with", {}).get("path") == "patchbench"
    ]
    assert len(trusted) == 2 and all(
        s["with"]["ref"] == "${{ vars.PATCHBENCH_REF || 'main' }}" for s in trusted
    )
    action = next(s for s in ab["steps"] if "patchbench-ab" in s.get("uses", ""))
    assert action["with"]["comment"] == "false"
    assert (REPO / action["uses"].removeprefix("./patchbench/") / "action.yml").exists()
    # the comment: write permission, no PR code (no checkout of it, no make of it)
    assert comment["needs"] == ["pin", "ab"] and comment["runs-on"] == "ubuntu-latest"
    assert comment["permissions"] == {
        "contents": "read",
        "pull-requests": "write",
        "issues": "write",
    }
    assert not any(s.get("with", {}).get("path") == "sglang" for s in comment["steps"])
    assert any("download-artifact" in s.get("uses", "") for s in comment["steps"])
    # the nightly's runner is another registration: no PR code where the history lives
    nightly = load(REPO / ".github/workflows/nightly.yml")["jobs"]["nightly"]
    assert nightly["runs-on"] == ["self-hosted", "h200", "nightly"]
    assert set(ab["runs-on"]) != set(nightly["runs-on"])


HEAD = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("event", "labeled", "comment", "rc", "said"),
    [
        ("pull_request_target", HEAD, "", 0, f"sha={HEAD}"),
        ("pull_request_target", "f" * 40, "", 1, "pushed after the trigger"),
        ("issue_comment", "", "/patchbench ab 0123456789ab\nthanks", 0, f"sha={HEAD}"),
        ("issue_comment", "", f"/patchbench ab {HEAD}", 0, "base=main"),
        ("issue_comment", "", "/patchbench ab", 1, "write '/patchbench ab SHA'"),
        ("issue_comment", "", "/patchbench ab 0123456; rm -rf /", 1, "write '/patchbench ab SHA'"),
        ("issue_comment", "", "/patchbench ab abcdef0", 1, "pushed after the trigger"),
    ],
)
def test_the_pin_step_runs_only_the_commit_the_maintainer_saw(
    tmp_path, event, labeled, comment, rc, said
):
    step = next(
        s
        for s in load(REPO / ".github/workflows/pr-ab-example.yml")["jobs"]["pin"]["steps"]
        if s.get("id") == "pin"
    )
    gh = tmp_path / "bin" / "gh"
    gh.parent.mkdir()
    gh.write_text(
        '#!/bin/sh\n[ "$2" = repos/o/r/pulls/7 ] || exit 9\n'
        f'echo \'{{"head": {{"sha": "{HEAD}"}}, "base": {{"ref": "main"}}}}\'\n'
    )
    gh.chmod(0o755)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{gh.parent}:{os.environ['PATH']}",
        "GITHUB_OUTPUT": str(out),
        "GH_TOKEN": "x",
        "REPO": "o/r",
        "EVENT": event,
        "PR": "7",
        "LABELED_SHA": labeled,
        "COMMENT": comment,
    }
    r = subprocess.run(["bash", "-c", step["run"]], env=env, capture_output=True, text=True)
    assert r.returncode == rc, r.stdout + r.stderr
    got = (out.read_text() if out.exists() else "") + r.stdout
    assert said in got
    if rc:
        assert not out.exists()


def _actionlint() -> str:
    import sysconfig

    exe = Path(sysconfig.get_path("scripts")) / "actionlint"
    if not exe.exists():
        pytest.skip("no actionlint in this environment (requirements/harness.txt installs it)")
    return str(exe)


def test_actionlint_passes_the_workflows_and_catches_a_broken_one(tmp_path):
    """The repository's workflows have zero findings; the same run over a workflow with an
    unknown runner label and a misspelt context fails and names both, so the lint can fail."""
    exe = _actionlint()
    ok = subprocess.run(
        [exe, *map(str, WORKFLOWS)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\npermissions: {}\njobs:\n  a:\n    runs-on: [self-hosted, h100-unknown]\n"
        "    steps:\n      - run: echo ${{ github.shaa }}\n"
    )
    (tmp_path / ".github" / "actionlint.yaml").write_text(
        (REPO / ".github" / "actionlint.yaml").read_text()
    )
    out = subprocess.run([exe, str(bad)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "h100-unknown" in out.stdout and "shaa" in out.stdout, out.stdout
