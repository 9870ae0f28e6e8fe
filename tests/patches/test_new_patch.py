"""new-patch: a patch made from a git range or a diff file, checked against pristine releases;
diffs named directly in a config; every touched file verified in the server's environment.

The git repository is laid out like an sglang checkout (``python/sglang/...``) and holds the real
files of the installed release (.venv: 0.5.1.post3). Expected hashes are computed here from the
files' bytes, independently of the code under test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from patchbench import errors
from patchbench.errors import PatchError
from patchbench.patches import apply, author, diffs, manifest, wheels
from patchbench.patches.manifest import FORWARD_BATCH_INFO
from patchbench.patches.overlay import OverlayError, build_overlay, verify_in_env
from tests.helpers import git_run as git

VERSION, SITE = wheels.installed_sglang()
pytestmark = pytest.mark.skipif(SITE is None, reason="sglang is not installed in this environment")

SAMPLING = "sglang/srt/sampling/sampling_params.py"
FBI_ANCHOR = "                next_input_positions = []\n"  # only in 0.5.1.post3's decode path
FBI_LINE = "                # patchbench test: a comment in the decode path\n"
SAMPLING_LINE = "# patchbench test: a second file\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def changed_fbi() -> bytes:
    text = (SITE / FORWARD_BATCH_INFO).read_text()
    assert text.count(FBI_ANCHOR) == 1
    return text.replace(FBI_ANCHOR, FBI_ANCHOR + FBI_LINE).encode()


def changed_sampling() -> bytes:
    text = (SITE / SAMPLING).read_text()
    i = text.index("\nclass ")
    return (text[: i + 1] + SAMPLING_LINE + text[i + 1 :]).encode()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git repository laid out like sglang's: main holds the release's two real files (and one
    file the release does not have); branch my-branch changes both release files."""
    repo = tmp_path / "sglang"
    for rel in (FORWARD_BATCH_INFO, SAMPLING):
        (repo / "python" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SITE / rel, repo / "python" / rel)
    (repo / "python/sglang/srt/brand_new.py").write_text("X = 1\n")
    (repo / "README.md").write_text("sglang\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "release files")
    git(repo, "checkout", "-qb", "my-branch")
    (repo / "python" / FORWARD_BATCH_INFO).write_bytes(changed_fbi())
    (repo / "python" / SAMPLING).write_bytes(changed_sampling())
    git(repo, "commit", "-qam", "two-file change")
    return repo


def branch(repo: Path, name: str, change) -> str:
    """A new branch off main with ``change(repo)`` committed; returns the range main...name."""
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-qb", name)
    change(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", name)
    return f"main...{name}"


# ----------------------------------------------------------------------------- the happy path
def test_from_git_makes_a_patch_that_checks_and_verifies_in_the_server_env(checkout, tmp_path):
    pdir = tmp_path / "patches"
    res = author.new_patch_from_git(
        "my-change", checkout, "main...my-branch", [VERSION], patches_dir=pdir
    )
    assert res.fails == {} and list(res.applies) == [VERSION]
    expected = {
        FORWARD_BATCH_INFO: {
            "before": sha((SITE / FORWARD_BATCH_INFO).read_bytes()),
            "after": sha(changed_fbi()),
        },
        SAMPLING: {"before": sha((SITE / SAMPLING).read_bytes()), "after": sha(changed_sampling())},
    }
    assert res.applies[VERSION] == expected
    raw = yaml.safe_load((pdir / "my-change" / "manifest.yaml").read_text())
    assert raw["releases"][VERSION]["files"] == expected
    assert raw["origin"]["kind"] == "git" and raw["origin"]["range"] == "main...my-branch"
    body = (pdir / "my-change" / f"{VERSION}.diff").read_text()
    assert f"+++ b/{FORWARD_BATCH_INFO}" in body and "python/sglang" not in body

    # a ready config beside the patch, from the generic CPU preset (text-only serving)
    from patchbench.config import load_config

    assert res.config == pdir / "my-change" / "cpu.yaml"
    cfg = load_config(res.config, check_files=False)
    assert (cfg.name, cfg.sglang, cfg.baseline) == ("my-change-cpu", VERSION, "baseline")
    assert {v: cfg.patches_of(v) for v in cfg.variants} == {
        "baseline": [],
        "my-change": ["my-change"],
    }
    assert list(cfg.suites) == ["serving"] and cfg.suite_params["serving"].dataset_name == (
        "random-ids"
    )
    assert f"run: patchbench bench {res.config}" in res.summary()

    checked = apply.check_patch("my-change", VERSION, patches_dir=pdir)
    assert checked["files"] == expected

    ov = build_overlay(
        VERSION, [pdir / "my-change"], stock_site_dir=SITE, cache_root=tmp_path / "overlays"
    )
    assert ov.files == {p: h["after"] for p, h in expected.items()}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = verify_in_env(ov, sys.executable, ov.env(env))
    assert {p: f["sha256"] for p, f in got["files"].items()} == ov.files
    assert Path(got["files"][SAMPLING]["path"]) == ov.sglang_dir.parent / SAMPLING

    # the second file is verified too, not only forward_batch_info.py
    (ov.sglang_dir.parent / SAMPLING).write_bytes(changed_sampling() + b"# tampered\n")
    with pytest.raises(OverlayError) as e:
        verify_in_env(ov, sys.executable, ov.env(env))
    tampered = sha(changed_sampling() + b"# tampered\n")
    assert (
        f"{(ov.sglang_dir.parent / SAMPLING).resolve()} has sha256 {tampered}, expected "
        f"{sha(changed_sampling())}"
    ) in str(e.value)
    assert FORWARD_BATCH_INFO not in str(e.value).split("PYTHONPATH")[0]


def test_from_diff_in_repository_layout(checkout, tmp_path):
    diff = tmp_path / "change.diff"
    diff.write_text(git(checkout, "diff", "main...my-branch"))
    res = author.new_patch_from_diff("from-diff", diff, [VERSION], patches_dir=tmp_path / "p")
    assert res.applies[VERSION][SAMPLING]["after"] == sha(changed_sampling())
    with pytest.raises(PatchError, match="already exists"):
        author.new_patch_from_diff("from-diff", diff, [VERSION], patches_dir=tmp_path / "p")


@pytest.mark.skipif(
    not list((manifest.DEFAULT_CACHE_DIR / "wheels" / "sglang-0.5.2rc2").glob("*.whl")),
    reason="the 0.5.2rc2 wheel is not cached (tests/patches/test_patchset.py fetches it)",
)
def test_says_which_releases_it_applies_to_and_names_the_failing_hunk(checkout, tmp_path):
    """0.5.2rc2 rewrote the decode path the change touches: the patch is written for the
    installed release only, and the failure names the release, file and hunk."""
    res = author.new_patch_from_git(
        "two", checkout, "main...my-branch", [VERSION, "0.5.2rc2"], patches_dir=tmp_path / "p"
    )
    assert list(res.applies) == [VERSION] and list(res.fails) == ["0.5.2rc2"]
    why = res.fails["0.5.2rc2"]
    assert f"(sglang 0.5.2rc2) does not apply to {FORWARD_BATCH_INFO}: hunk @@" in why
    assert "next_input_positions = []" in why
    assert "0.5.2rc2: does NOT apply" in res.summary()
    m = manifest.load_manifest("two", patches_dir=tmp_path / "p")
    assert list(m.releases) == [VERSION]


# ----------------------------------------------------------------------------- refusals
def test_refuses_a_path_outside_sglang(checkout, tmp_path):
    rng = branch(checkout, "docs", lambda r: (r / "README.md").write_text("changed\n"))
    with pytest.raises(PatchError) as e:
        author.new_patch_from_git("x", checkout, rng, [VERSION], patches_dir=tmp_path / "p")
    assert "outside python/sglang/ (README.md)" in str(e.value)
    assert f"git -C {checkout} diff {rng} -- python/sglang > change.diff" in str(e.value)
    diff = tmp_path / "d.diff"
    diff.write_text(git(checkout, "diff", rng))
    with pytest.raises(PatchError, match=r"README.md' is outside the sglang package"):
        author.new_patch_from_diff("x", diff, [VERSION], patches_dir=tmp_path / "p")
    assert not (tmp_path / "p" / "x").exists()


def test_refuses_a_symlink(checkout, tmp_path):
    rng = branch(
        checkout,
        "link",
        lambda r: os.symlink("sampling_params.py", r / "python/sglang/srt/sampling/alias.py"),
    )
    with pytest.raises(PatchError) as e:
        author.new_patch_from_git("x", checkout, rng, [VERSION], patches_dir=tmp_path / "p")
    assert "sglang/srt/sampling/alias.py: " in str(e.value) and "is a symlink" in str(e.value)


def test_refuses_a_hunk_that_does_not_apply_naming_it(checkout, tmp_path):
    def edit(r: Path) -> None:
        f = r / "python" / FORWARD_BATCH_INFO
        f.write_text(
            f.read_text().replace(
                "# limitations under the License.\n", "# limitations under the License (edited).\n"
            )
        )

    rng = branch(checkout, "context", edit)
    diff = git(checkout, "diff", rng)
    # the same change against a file whose context differs in the release: shift the context
    bad = diff.replace(
        " # See the License for the specific language governing permissions and",
        " # A context line the release does not have",
    )
    assert bad != diff
    f = tmp_path / "bad.diff"
    f.write_text(bad)
    with pytest.raises(PatchError) as e:
        author.new_patch_from_diff("x", f, [VERSION], patches_dir=tmp_path / "p")
    msg = str(e.value)
    assert f"applies to none of sglang {VERSION}" in msg
    assert f"(sglang {VERSION}) does not apply to {FORWARD_BATCH_INFO}: hunk @@ -" in msg
    assert "A context line the release does not have" in msg


def test_refuses_a_file_the_release_does_not_have(checkout, tmp_path):
    rng = branch(
        checkout,
        "new-module",
        lambda r: (r / "python/sglang/srt/brand_new.py").write_text("X = 2\n"),
    )
    with pytest.raises(PatchError) as e:
        author.new_patch_from_git("x", checkout, rng, [VERSION], patches_dir=tmp_path / "p")
    assert f"(sglang {VERSION}): the release has no file sglang/srt/brand_new.py" in str(e.value)


def test_errors_are_patch_errors_with_exit_2(checkout, tmp_path):
    with pytest.raises(PatchError) as e:
        author.new_patch_from_git("x", tmp_path, "main...my-branch", [VERSION])
    assert "not a git checkout" in str(e.value)
    assert isinstance(e.value, errors.PatchError) and errors.exit_code_of(e.value) == 2
    with pytest.raises(PatchError, match="git cannot diff 'main...nope'"):
        author.new_patch_from_git("x", checkout, "main...nope", [VERSION])
    with pytest.raises(PatchError, match="patch name '../x'"):
        author.new_patch_from_git("../x", checkout, "main...my-branch", [VERSION])
    fetch = wheels.FetchError("no network")
    assert errors.exit_code_of(fetch) == 3 and isinstance(fetch, errors.PatchError)


DIFF_HEAD = "diff --git a/python/sglang/{p} b/python/sglang/{q}\n"


@pytest.mark.parametrize(
    "header, reason",
    [
        (
            "diff --git a/python/sglang/x.py b/python/sglang/x.py\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/python/sglang/x.py\n@@ -0,0 +1 @@\n+X = 1\n",
            "creates a new file",
        ),
        (
            "diff --git a/python/sglang/x.py b/python/sglang/x.py\ndeleted file mode 100644\n"
            "--- a/python/sglang/x.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-X = 1\n",
            "deletes the file",
        ),
        (
            "diff --git a/python/sglang/x.py b/python/sglang/y.py\nsimilarity index 100%\n"
            "rename from python/sglang/x.py\nrename to python/sglang/y.py\n",
            "renames the file",
        ),
        (
            "diff --git a/python/sglang/x.py b/python/sglang/x.py\nold mode 100644\nnew mode 100755\n",
            "changes the file mode",
        ),
        (
            "diff --git a/python/sglang/x.bin b/python/sglang/x.bin\nindex 1..2 100644\n"
            "Binary files a/python/sglang/x.bin and b/python/sglang/x.bin differ\n",
            "is a binary change",
        ),
        ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "'..'"),
        ("--- /abs/sglang/x.py\n+++ /abs/sglang/x.py\n@@ -1 +1 @@\n-a\n+b\n", "an absolute path"),
    ],
)
def test_inspect_diff_refuses_what_a_patch_cannot_honour(header, reason):
    with pytest.raises(PatchError) as e:
        diffs.inspect_diff(header, source="change.diff")
    assert str(e.value).startswith("change.diff: cannot be used as a patch")
    assert reason in str(e.value)


def test_inspect_diff_maps_repository_paths():
    text = (
        "diff --git a/python/sglang/srt/a.py b/python/sglang/srt/a.py\nindex 1..2 100644\n"
        "--- a/python/sglang/srt/a.py\n+++ b/python/sglang/srt/a.py\n@@ -1 +1 @@\n-a\n+b\n"
        "--- sglang/srt/b.py\t2024-01-01\n+++ sglang/srt/b.py\t2024-01-02\n@@ -1 +1 @@\n-a\n+b\n"
    )
    changes = diffs.inspect_diff(text)
    assert [c.path for c in changes] == [
        "sglang/srt/a.py"
    ]  # git blocks: the --- pair is a hunk line
    site = diffs.site_layout_diff(text, changes)
    assert "--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n" in site and "index " not in site
    plain = (
        "--- sglang/srt/b.py\t2024-01-01\n+++ sglang/srt/b.py\t2024-01-02\n@@ -1 +1 @@\n-a\n+b\n"
    )
    assert [c.path for c in diffs.inspect_diff(plain)] == ["sglang/srt/b.py"]


def test_stored_patch_with_a_mode_change_is_refused_before_applying(tmp_path):
    """A diff in patches/ is checked against what a patch may do before anything is applied."""
    body = apply.diff_text("null-comment", VERSION)
    bad = body.replace(
        f"diff --git a/{FORWARD_BATCH_INFO} b/{FORWARD_BATCH_INFO}\n",
        f"diff --git a/{FORWARD_BATCH_INFO} b/{FORWARD_BATCH_INFO}\nold mode 100644\n"
        "new mode 100755\n",
    )
    assert bad != body
    m = manifest.load_manifest("null-comment")
    d = tmp_path / "p" / "modey"
    d.mkdir(parents=True)
    raw = yaml.safe_load((m.folder / "manifest.yaml").read_text())
    raw["name"] = "modey"
    raw["releases"] = {VERSION: raw["releases"][VERSION]}
    (d / "manifest.yaml").write_text(yaml.safe_dump(raw))
    (d / f"{VERSION}.diff").write_text(bad)
    tree = tmp_path / "tree"
    (tree / FORWARD_BATCH_INFO).parent.mkdir(parents=True)
    shutil.copyfile(SITE / FORWARD_BATCH_INFO, tree / FORWARD_BATCH_INFO)
    with pytest.raises(
        PatchError,
        match=f"patch 'modey' \\(sglang {VERSION}\\): cannot be used as a "
        f"patch:\n  {FORWARD_BATCH_INFO}: changes the file mode",
    ):
        apply.apply_to_tree(tree, "modey", VERSION, patches_dir=tmp_path / "p")
    assert (tree / FORWARD_BATCH_INFO).read_bytes() == (SITE / FORWARD_BATCH_INFO).read_bytes()


# ----------------------------------------------------------------------------- diffs in configs
def test_a_diff_named_in_a_config_is_hashed_applied_and_verified(checkout, tmp_path):
    from patchbench.config import load_config
    from patchbench.envs.builds import overlay_patches
    from patchbench.run.manifest import copy_config_files, variant_diff

    diff = tmp_path / "my change.diff"
    diff.write_text(git(checkout, "diff", "main...my-branch"))
    cfg_text = (Path(__file__).resolve().parents[2] / "configs" / "aa-cpu.yaml").read_text()
    cfg_text = cfg_text.replace("  baseline-aa: []\n", f"  mine: [{{diff: '{diff}'}}]\n")
    p = tmp_path / "c.yaml"
    p.write_text(cfg_text)
    cfg = load_config(p)
    digest = sha(diff.read_bytes())
    (copied,) = copy_config_files(cfg, tmp_path / "run")
    assert (copied.source, copied.path) == (str(diff), f"diffs/{digest[:12]}-my change.diff")
    assert (tmp_path / "run" / copied.path).read_bytes() == diff.read_bytes()
    d = variant_diff(cfg, "mine")
    assert d["patches"] == [
        {"name": f"diff:{diff}", "kind": "diff", "path": str(diff), "sha256": digest}
    ]
    assert d["aa"] is False and d["patches_added"] == [f"diff:{diff}"]
    folders = overlay_patches(cfg, "mine", VERSION, cache_dir=tmp_path / "cache")
    assert len(folders) == 1 and folders[0].name == f"my-change-{digest[:12]}"
    assert overlay_patches(cfg, "mine", VERSION, cache_dir=tmp_path / "cache") == folders
    ov = build_overlay(VERSION, folders, stock_site_dir=SITE, cache_root=tmp_path / "ov")
    assert ov.files == {FORWARD_BATCH_INFO: sha(changed_fbi()), SAMPLING: sha(changed_sampling())}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    verify_in_env(ov, sys.executable, ov.env(env))

    # a diff that creates a symlink is refused when the config loads, before any server
    bad = tmp_path / "link.diff"
    bad.write_text(
        "diff --git a/python/sglang/l.py b/python/sglang/l.py\nnew file mode 120000\n"
        "--- /dev/null\n+++ b/python/sglang/l.py\n@@ -0,0 +1 @@\n+x.py\n"
    )
    p.write_text(cfg_text.replace(str(diff), str(bad)))
    from patchbench.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "variants.mine.patches[0]" in str(e.value) and "is a symlink" in str(e.value)


# ----------------------------------------------------------------------------- patch states
def test_from_git_reads_a_bare_repository(checkout, tmp_path):
    """A bare clone gives the same patch as its work tree: only commits are read."""
    bare = tmp_path / "sglang.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(checkout), str(bare)], check=True)
    res = author.new_patch_from_git(
        "bare", bare, "main...my-branch", [VERSION], patches_dir=tmp_path / "p"
    )
    assert res.applies[VERSION][SAMPLING]["after"] == sha(changed_sampling())
    one = author.new_patch_from_git(
        "one", bare, "my-branch", [VERSION], patches_dir=tmp_path / "p"
    )  # one commit: that commit's own change
    assert one.applies == res.applies


def test_state_says_applies_contained_or_conflicts_at_file_hunk(checkout, tmp_path):
    """The reverse of a change the release already has is 'already contained'; a diff whose
    second file's context the release lacks 'conflicts at' that file, hunk 1, with next steps."""
    from patchbench.patches.state import diff_state

    change = git(checkout, "diff", "main...my-branch")
    assert diff_state("c", change, VERSION).state == "applies"

    undo = git(checkout, "diff", "my-branch", "main")  # removes lines the release lacks
    st = diff_state("undo", undo, VERSION, name="undo")
    assert (st.state, st.summary) == ("contained", f"already contained in {VERSION}")
    assert "nothing to patch" in st.next_step and f"`sglang: {VERSION}`" in st.next_step

    bad = change.replace(" TOP_K_ALL = 1 << 30", " TOP_K_ALL = 'a context line the release lacks'")
    assert bad != change
    st = diff_state("bad", bad, VERSION, name="my-change")
    assert (st.state, st.file, st.hunk) == ("conflicts", SAMPLING, 1)
    assert st.summary == f"conflicts at {SAMPLING} hunk 1"
    assert f"{FORWARD_BATCH_INFO} applies" in st.detail
    assert f"new-patch my-change-{VERSION} --from-git CHECKOUT" in st.next_step


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_new_patch_and_check_patch_print_the_state_and_next_step(checkout, tmp_path, capsys):
    """new-patch says 'already contained in RELEASE' (not 'does NOT apply') with the next step."""
    undo = _write(tmp_path / "undo.diff", git(checkout, "diff", "my-branch", "main"))
    with pytest.raises(PatchError) as e:
        author.new_patch_from_diff("undo", undo, [VERSION], patches_dir=tmp_path / "p")
    assert f"(already contained in {VERSION}) next: sglang {VERSION} already has" in str(e.value)
