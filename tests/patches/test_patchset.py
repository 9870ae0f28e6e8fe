"""Patch manifests, diffs (stored and derived from upstream wheels), applying, check-patch.

Runs against the real installed sglang of the test environment (.venv: 0.5.1.post3). The derived
upstream diff needs the 0.5.2rc1/0.5.2rc2 wheels: downloaded once from PyPI into the repo's
git-ignored .cache/wheels/ (DEFAULT_CACHE_DIR) and reused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from patchbench import cli as pb_cli
from patchbench import inputs
from patchbench.errors import EXIT_OK, EXIT_USAGE, PatchError
from patchbench.patches import manifest, wheels
from patchbench.patches.apply import apply_to_tree, diff_text, patch_sha256
from patchbench.patches.manifest import (
    DEFAULT_CACHE_DIR,
    FORWARD_BATCH_INFO,
    ManifestError,
    UnsupportedRelease,
    load_manifest,
)

INSTALLED_VERSION, SITE = wheels.installed_sglang()
pytestmark = pytest.mark.skipif(SITE is None, reason="sglang is not installed in this environment")

LICENSE_END = "# ==============================================================================\n"
NULL_LINE = "# patchbench null-comment control patch: this comment is the only change.\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stock_fbi() -> bytes:
    return (SITE / FORWARD_BATCH_INFO).read_bytes()


def with_null_comment(data: bytes) -> bytes:
    """What null-comment must produce, computed here independently of any diff."""
    text = data.decode()
    assert text.count(LICENSE_END) == 1
    return text.replace(LICENSE_END, LICENSE_END + NULL_LINE).encode()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A site-packages-like folder holding a copy of the installed forward_batch_info.py."""
    root = tmp_path / "tree"
    (root / FORWARD_BATCH_INFO).parent.mkdir(parents=True)
    shutil.copyfile(SITE / FORWARD_BATCH_INFO, root / FORWARD_BATCH_INFO)
    return root


# ----------------------------------------------------------------------------- manifests
def test_every_patch_manifest_loads():
    names = manifest.available_patches()
    assert {"null-comment", "pr9460-upstream"} <= set(names)
    for n in names:
        m = load_manifest(n)
        assert m.name == n and m.releases


def test_null_comment_manifest_hashes_match_installed_release():
    m = load_manifest("null-comment")
    assert set(m.releases) == {"0.5.1.post3", "0.5.23"}
    h = m.release(INSTALLED_VERSION).files[FORWARD_BATCH_INFO]
    assert h.before == sha(stock_fbi())
    assert h.after == sha(with_null_comment(stock_fbi()))


def _write_patch(
    pdir: Path, name: str, manifest: dict | str, diffs: dict[str, str] | None = None
) -> None:
    d = pdir / name
    d.mkdir(parents=True)
    text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest, sort_keys=False)
    (d / "manifest.yaml").write_text(text)
    for fname, body in (diffs or {}).items():
        (d / fname).write_text(body)


def _null_manifest(version: str, before: str, after: str, name: str = "p") -> dict:
    return {
        "name": name,
        "releases": {
            version: {
                "diff": f"{version}.diff",
                "files": {FORWARD_BATCH_INFO: {"before": before, "after": after}},
            }
        },
    }


def test_manifest_errors_name_file_key_and_line(tmp_path):
    good = "a" * 64
    _write_patch(
        tmp_path,
        "badsha",
        _null_manifest("0.5.1.post3", "xyz", good, "badsha"),
        {"0.5.1.post3.diff": ""},
    )
    with pytest.raises(ManifestError) as e:
        load_manifest("badsha", patches_dir=tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "badsha" / "manifest.yaml") in msg
    assert (
        "releases.0.5.1.post3.files" in msg
        and "before" in msg
        and "64 hex" in msg
        and "'xyz'" in msg
    )

    m = _null_manifest("0.5.1.post3", good, good, "extra")
    m["colour"] = "red"
    _write_patch(tmp_path, "extra", m, {"0.5.1.post3.diff": ""})
    with pytest.raises(ManifestError, match=r"manifest.yaml:\d+: unknown key 'colour'"):
        load_manifest("extra", patches_dir=tmp_path)

    _write_patch(tmp_path, "nodiff", _null_manifest("0.5.1.post3", good, good, "nodiff"))
    with pytest.raises(
        ManifestError, match=r"releases.0.5.1.post3.diff names '0.5.1.post3.diff'.*does not exist"
    ):
        load_manifest("nodiff", patches_dir=tmp_path)

    _write_patch(
        tmp_path,
        "folder",
        _null_manifest("0.5.1.post3", good, good, "other"),
        {"0.5.1.post3.diff": ""},
    )
    with pytest.raises(ManifestError, match="'name' is 'other' but the folder is 'folder'"):
        load_manifest("folder", patches_dir=tmp_path)

    m = _null_manifest("0.5.1.post3", good, good, "derive")
    m["derive"] = {
        "from": "sglang>=0.5.2rc1",
        "to": "sglang==0.5.2rc2",
        "files": [FORWARD_BATCH_INFO],
    }
    _write_patch(tmp_path, "derive", m, {"0.5.1.post3.diff": ""})
    with pytest.raises(ManifestError) as e:
        load_manifest("derive", patches_dir=tmp_path)
    assert "derive.from" in str(e.value) and "must pin one exact version with '=='" in str(e.value)
    assert "'diff' and top-level 'derive' exclude each other" not in str(
        e.value
    )  # field error first

    with pytest.raises(ManifestError, match="patch 'missing' not found.*available: badsha"):
        load_manifest("missing", patches_dir=tmp_path)


def test_unsupported_release_lists_supported():
    with pytest.raises(UnsupportedRelease) as e:
        diff_text("null-comment", "0.4.0")
    assert "patch 'null-comment' has no diff for sglang 0.4.0" in str(e.value)
    assert "supports 0.5.1.post3, 0.5.23" in str(e.value)
    with pytest.raises(UnsupportedRelease, match="supports 0.5.1.post3"):
        apply_to_tree(Path("/nonexistent"), "pr9460-upstream", "0.5.23")


# ----------------------------------------------------------------------------- applying
def test_apply_null_comment_gives_the_expected_file(tree):
    before = sha(stock_fbi())
    got = apply_to_tree(tree, "null-comment", INSTALLED_VERSION)
    expected = with_null_comment(stock_fbi())
    assert (tree / FORWARD_BATCH_INFO).read_bytes() == expected
    assert got == {FORWARD_BATCH_INFO: sha(expected)}
    assert sha(expected) != before
    assert sha(stock_fbi()) == before  # the installed file was only read


def test_apply_inside_an_enclosing_git_repository(tmp_path):
    """git apply in a subfolder of a repository would resolve paths from the repository's top and
    silently skip them; the overlays live in this repo's .cache/, so this must work."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    root = tmp_path / "cache" / "overlay"
    (root / FORWARD_BATCH_INFO).parent.mkdir(parents=True)
    shutil.copyfile(SITE / FORWARD_BATCH_INFO, root / FORWARD_BATCH_INFO)
    apply_to_tree(root, "null-comment", INSTALLED_VERSION)
    assert (root / FORWARD_BATCH_INFO).read_bytes() == with_null_comment(stock_fbi())


def test_diff_that_does_not_apply_names_patch_file_and_hunk(tree):
    f = tree / FORWARD_BATCH_INFO
    changed = stock_fbi().replace(b"# limitations under the License.\n", b"# (edited)\n", 1)
    assert changed != stock_fbi()
    f.write_bytes(changed)
    with pytest.raises(PatchError) as e:
        apply_to_tree(tree, "null-comment", INSTALLED_VERSION)
    msg = str(e.value)
    assert (
        f"patch 'null-comment' (sglang {INSTALLED_VERSION}) does not apply to {FORWARD_BATCH_INFO}"
        in msg
    )
    assert "hunk @@ -11,6 +11,7 @@" in msg
    assert "# limitations under the License." in msg  # first lines of the hunk
    assert f"has sha256 {sha(changed)}" in msg and sha(stock_fbi()) in msg
    assert f.read_bytes() == changed  # nothing applied


def test_missing_target_file_is_named(tmp_path):
    with pytest.raises(PatchError, match=f"target file {FORWARD_BATCH_INFO} is missing"):
        apply_to_tree(tmp_path, "null-comment", INSTALLED_VERSION)


def test_before_hash_mismatch_says_expected_and_found(tree):
    f = tree / FORWARD_BATCH_INFO
    changed = stock_fbi() + b"# appended far from the hunk\n"
    f.write_bytes(changed)
    with pytest.raises(PatchError) as e:
        apply_to_tree(tree, "null-comment", INSTALLED_VERSION)
    msg = str(e.value)
    assert f"{FORWARD_BATCH_INFO} before patching has sha256 {sha(changed)}" in msg
    assert f"the manifest expects {sha(stock_fbi())}" in msg
    assert f.read_bytes() == changed


def test_after_hash_mismatch_says_expected_and_found(tree, tmp_path):
    pdir = tmp_path / "patches"
    body = diff_text("null-comment", INSTALLED_VERSION)
    wrong = "0" * 64
    _write_patch(
        pdir,
        "wrongafter",
        _null_manifest(INSTALLED_VERSION, sha(stock_fbi()), wrong, "wrongafter"),
        {f"{INSTALLED_VERSION}.diff": body},
    )
    with pytest.raises(PatchError) as e:
        apply_to_tree(tree, "wrongafter", INSTALLED_VERSION, patches_dir=pdir)
    assert (
        f"{FORWARD_BATCH_INFO} after patching has sha256 {sha(with_null_comment(stock_fbi()))}, "
        f"the manifest expects {wrong}"
    ) in str(e.value)


def test_diff_touching_unlisted_file_is_a_manifest_error(tree, tmp_path):
    pdir = tmp_path / "patches"
    body = diff_text("null-comment", INSTALLED_VERSION).replace(
        FORWARD_BATCH_INFO, "sglang/other.py"
    )
    _write_patch(
        pdir,
        "unlisted",
        _null_manifest(INSTALLED_VERSION, "a" * 64, "b" * 64, "unlisted"),
        {f"{INSTALLED_VERSION}.diff": body},
    )
    with pytest.raises(ManifestError, match="the diff touches sglang/other.py but the manifest"):
        apply_to_tree(tree, "unlisted", INSTALLED_VERSION, patches_dir=pdir)


def test_patch_sha256_is_the_hash_of_the_diff_file():
    m = load_manifest("null-comment")
    raw = (m.folder / m.releases["0.5.23"].diff).read_bytes()
    assert patch_sha256("null-comment", "0.5.23") == sha(raw)


# ----------------------------------------------------------------------------- derived upstream diff
@pytest.mark.timeout(600)
def test_derived_upstream_diff_turns_0_5_1_post3_into_0_5_2rc2(tmp_path):
    """pr9460-upstream = forward_batch_info.py of 0.5.2rc1 -> 0.5.2rc2 (wheels from PyPI, cached)."""
    text = diff_text("pr9460-upstream", "0.5.1.post3", cache_dir=DEFAULT_CACHE_DIR)
    assert "int(self.seq_lens[batch_idx])" in text and "non_blocking=True" in text
    cached = list((DEFAULT_CACHE_DIR / "patches").glob("sglang-0.5.2rc1__sglang-0.5.2rc2-*.diff"))
    assert len(cached) == 1 and cached[0].read_text() == text

    def wheel_file(version: str) -> bytes:
        (w,) = (DEFAULT_CACHE_DIR / "wheels" / f"sglang-{version}").glob("*.whl")
        with zipfile.ZipFile(w) as z:
            return z.read(FORWARD_BATCH_INFO)

    rc1, rc2 = wheel_file("0.5.2rc1"), wheel_file("0.5.2rc2")
    root = tmp_path / "tree"
    src = wheels.pristine_files("0.5.1.post3", [FORWARD_BATCH_INFO], root)
    assert (root / FORWARD_BATCH_INFO).read_bytes() == rc1  # docs/FACTS.md 1: byte-identical
    got = apply_to_tree(root, "pr9460-upstream", "0.5.1.post3")
    assert (root / FORWARD_BATCH_INFO).read_bytes() == rc2
    assert got == {FORWARD_BATCH_INFO: sha(rc2)}
    assert load_manifest("pr9460-upstream").releases["0.5.1.post3"].files[
        FORWARD_BATCH_INFO
    ].after == sha(rc2)
    if INSTALLED_VERSION == "0.5.1.post3":
        assert src.startswith("installed ")


# ----------------------------------------------------------------------------- check-patch
def test_cli_ok_for_installed_release(capsys):
    rc = pb_cli.main(["check-patch", "--patch", "null-comment", "--sglang", INSTALLED_VERSION])
    out = capsys.readouterr().out
    assert rc == EXIT_OK
    before = sha(stock_fbi())[:8]
    after = sha(with_null_comment(stock_fbi()))[:8]
    assert f"forward_batch_info.py {before}..->{after}.." in out
    (line,) = [ln for ln in out.splitlines() if ln.strip()]
    assert line.split()[:3] == ["null-comment", INSTALLED_VERSION, "OK"]
    assert "installed" in line and "compiles" in line


def test_cli_usage_errors(capsys):
    assert pb_cli.main(["check-patch", "--patch", "no-such-patch"]) == EXIT_USAGE
    assert "patch 'no-such-patch' not found" in capsys.readouterr().out
    assert (
        pb_cli.main(["check-patch", "--patch", "pr9460-upstream", "--sglang", "0.5.23"])
        == EXIT_USAGE
    )
    assert "has no diff for sglang 0.5.23; it supports 0.5.1.post3" in capsys.readouterr().out
    assert pb_cli.main(["check-patch", "--bogus"]) == EXIT_USAGE


def test_cli_without_patch_skips_patches_lacking_the_release(capsys, tmp_path):
    pdir = tmp_path / "patches"
    shutil.copytree(inputs.PATCHES_DIR / "null-comment", pdir / "null-comment")
    m = yaml.safe_load((pdir / "null-comment" / "manifest.yaml").read_text())
    m["name"] = "only-old"
    m["releases"] = {
        "0.4.0": m["releases"][INSTALLED_VERSION] | {"diff": f"{INSTALLED_VERSION}.diff"}
    }
    _write_patch(
        pdir,
        "only-old",
        m,
        {f"{INSTALLED_VERSION}.diff": diff_text("null-comment", INSTALLED_VERSION)},
    )
    argv = ["check-patch", "--patches-dir", str(pdir), "--sglang", INSTALLED_VERSION]
    assert pb_cli.main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "only-old" in out and "SKIP" in out and "null-comment" in out and " OK " in out


def test_cli_diff_that_does_not_apply_exits_2(capsys, tmp_path):
    pdir = tmp_path / "patches"
    body = diff_text("null-comment", INSTALLED_VERSION).replace(
        " # limitations under the License.", " # not the line in the file", 1
    )
    _write_patch(
        pdir,
        "broken",
        _null_manifest(INSTALLED_VERSION, sha(stock_fbi()), "b" * 64, "broken"),
        {f"{INSTALLED_VERSION}.diff": body},
    )
    argv = ["check-patch", "--patches-dir", str(pdir), "--sglang", INSTALLED_VERSION]
    assert pb_cli.main(argv) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "broken" in out and "FAIL" in out and "hunk @@ -11,6 +11,7 @@" in out
    assert "# not the line in the file" in out


def test_cli_rejects_a_patch_that_does_not_compile(capsys, tmp_path):
    pdir = tmp_path / "patches"
    body = diff_text("null-comment", INSTALLED_VERSION).replace(
        "+# patchbench null-comment control patch",
        "+def broken(:  # patchbench null-comment control patch",
        1,
    )
    after = (
        stock_fbi()
        .decode()
        .replace(
            LICENSE_END,
            LICENSE_END + NULL_LINE.replace("# patchbench", "def broken(:  # patchbench"),
        )
        .encode()
    )
    _write_patch(
        pdir,
        "nocompile",
        _null_manifest(INSTALLED_VERSION, sha(stock_fbi()), sha(after), "nocompile"),
        {f"{INSTALLED_VERSION}.diff": body},
    )
    argv = ["check-patch", "--patches-dir", str(pdir), "--sglang", INSTALLED_VERSION]
    assert pb_cli.main(argv) == EXIT_USAGE
    assert "does not compile" in capsys.readouterr().out


def test_installed_version_is_the_environment_pin():
    assert INSTALLED_VERSION == importlib.metadata.version("sglang")
    assert (SITE / "sglang" / "__init__.py").is_file()


def test_pristine_files_come_from_another_environment_and_offline_fetches_nothing(tmp_path):
    """A release installed in another venv of this repo is read from there (no wheel); inside
    wheels.offline() a wheel missing from the cache is a FetchError at once (exit 3)."""
    from patchbench.envs import envinfo

    other = next((e for e in envinfo.environments() if e.sglang != INSTALLED_VERSION), None)
    if other is not None:
        got = wheels.pristine_files(other.sglang, [FORWARD_BATCH_INFO], tmp_path / "t")
        assert got == f"installed {other.site_dir}"
        assert (tmp_path / "t" / FORWARD_BATCH_INFO).read_bytes() == (
            other.site_dir / FORWARD_BATCH_INFO
        ).read_bytes()
    with wheels.offline(), pytest.raises(wheels.FetchError, match="offline check"):
        wheels.fetch_wheel("sglang==0.0.1", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_patch_state_per_release_is_what_a_nightly_records():
    """The shipped null-comment patch applies to each release this machine holds
    (moved from tests/envs/test_builds.py)."""
    from patchbench.envs import envinfo
    from patchbench.patches.state import patch_state

    have = [e.sglang for e in envinfo.environments()]
    got = {r: patch_state("null-comment", r) for r in have}
    assert {r: s.state for r, s in got.items()} == dict.fromkeys(have, "applies")
    assert got[have[0]].to_json()["state"] == "applies"
