"""The per-variant overlay: a cached, patched copy of the installed sglang; the installed package
untouched; the server environment resolving forward_batch_info inside it.

Uses the real installed sglang of the test environment (.venv: 0.5.1.post3, about 20 MB copied per
build) and the null-comment control patch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from patchbench.errors import PatchError
from patchbench.patches import wheels
from patchbench.patches.manifest import DEFAULT_CACHE_DIR, FORWARD_BATCH_INFO, load_manifest
from patchbench.patches.overlay import Overlay, OverlayError, build_overlay, verify_in_env

VERSION, SITE = wheels.installed_sglang()
pytestmark = pytest.mark.skipif(SITE is None, reason="sglang is not installed in this environment")

LICENSE_END = "# ==============================================================================\n"
NULL_LINE = "# patchbench null-comment control patch: this comment is the only change.\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_hashes(pkg: Path) -> dict[str, str]:
    """{relative path: sha256} of every file of a package folder, skipping bytecode caches."""
    return {
        str(p.relative_to(pkg)): sha(p.read_bytes())
        for p in sorted(pkg.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def stock_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def stock_before() -> dict[str, str]:
    """Hashes of the installed package before any overlay is built in this module."""
    return tree_hashes(SITE / "sglang")


@pytest.fixture(scope="module")
def built(tmp_path_factory, stock_before) -> tuple[Overlay, Path]:
    cache_root = tmp_path_factory.mktemp("overlays")
    ov = build_overlay(VERSION, ["null-comment"], stock_site_dir=SITE, cache_root=cache_root)
    return ov, cache_root


def test_overlay_is_a_patched_copy(built, stock_before):
    ov, cache_root = built
    stock_fbi = (SITE / FORWARD_BATCH_INFO).read_bytes()
    expected = stock_fbi.decode().replace(LICENSE_END, LICENSE_END + NULL_LINE).encode()
    assert ov.root is not None and ov.root.parent == cache_root.resolve()
    assert ov.root.name.startswith(f"{VERSION}-") and ov.sglang_dir == ov.root / "sglang"
    assert not ov.reused
    assert ov.fbi_path.read_bytes() == expected
    assert ov.fbi_sha256 == sha(expected) == ov.files[FORWARD_BATCH_INFO]
    assert ov.files == {FORWARD_BATCH_INFO: sha(expected)}
    m = load_manifest("null-comment")
    assert ov.patch_hashes == {
        "null-comment": sha((m.folder / m.releases[VERSION].diff).read_bytes())
    }
    # every other file identical, none missing, no bytecode copied
    copy = tree_hashes(ov.sglang_dir)
    rel = str(Path(FORWARD_BATCH_INFO).relative_to("sglang"))
    assert set(copy) == set(stock_before)
    assert {k for k in copy if copy[k] != stock_before[k]} == {rel}
    assert not list(ov.sglang_dir.rglob("__pycache__"))
    # no half-built folder left behind; overlay.json written
    assert [p.name for p in cache_root.iterdir()] == [ov.root.name]
    assert (ov.root / "overlay.json").is_file()


def test_installed_package_untouched(built, stock_before):
    assert tree_hashes(SITE / "sglang") == stock_before


def test_second_build_reuses_without_copying(built):
    ov, cache_root = built
    marker = ov.sglang_dir / "marker-from-test.txt"
    marker.write_text("kept")  # survives only if the folder is not rebuilt
    try:
        again = build_overlay(VERSION, ["null-comment"], stock_site_dir=SITE, cache_root=cache_root)
        assert again.reused and again.root == ov.root and again.key == ov.key
        assert again.files == ov.files and again.fbi_sha256 == ov.fbi_sha256
        assert marker.read_text() == "kept"
    finally:
        marker.unlink()


def test_tampered_overlay_is_rebuilt(tmp_path):
    ov = build_overlay(VERSION, ["null-comment"], stock_site_dir=SITE, cache_root=tmp_path)
    good = ov.fbi_path.read_bytes()
    ov.fbi_path.write_bytes(good + b"# tampered\n")
    with pytest.raises(OverlayError, match=f"has sha256 .*expected {ov.fbi_sha256}"):
        verify_in_env(ov, sys.executable, ov.env(stock_env()))
    again = build_overlay(VERSION, ["null-comment"], stock_site_dir=SITE, cache_root=tmp_path)
    assert not again.reused and again.root == ov.root
    assert again.fbi_path.read_bytes() == good


def test_no_patches_points_at_stock(tmp_path):
    ov = build_overlay(VERSION, [], stock_site_dir=SITE, cache_root=tmp_path / "overlays")
    assert ov.root is None and ov.sglang_dir == (SITE / "sglang").resolve()
    assert ov.fbi_sha256 == sha((SITE / FORWARD_BATCH_INFO).read_bytes())
    assert ov.files == {} and ov.patches == []
    assert not (tmp_path / "overlays").exists()  # nothing copied
    assert ov.env({"PYTHONPATH": "/x"}) == {"PYTHONPATH": "/x"}


def test_wrong_installed_version_refused(tmp_path):
    other = "0.5.23" if VERSION != "0.5.23" else "0.5.1.post3"
    with pytest.raises(OverlayError, match=f"holds sglang {VERSION}, not {other}"):
        build_overlay(other, ["null-comment"], stock_site_dir=SITE, cache_root=tmp_path)
    with pytest.raises(OverlayError, match="no sglang package at"):
        build_overlay(VERSION, ["null-comment"], stock_site_dir=tmp_path, cache_root=tmp_path)


def test_patch_that_does_not_apply_leaves_nothing(tmp_path):
    """A fake site-packages whose forward_batch_info.py differs where the hunk lands."""
    site = tmp_path / "site"
    for rel in ("sglang/__init__.py", "sglang/version.py", FORWARD_BATCH_INFO):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SITE / rel, site / rel)
    f = site / FORWARD_BATCH_INFO
    f.write_bytes(f.read_bytes().replace(b"# limitations under the License.\n", b"# changed\n", 1))
    cache_root = tmp_path / "overlays"
    with pytest.raises(
        PatchError,
        match=r"patch 'null-comment' .*does not apply to .*forward_batch_info.py: hunk @@ -11,6 \+11,7 @@",
    ):
        build_overlay(VERSION, ["null-comment"], stock_site_dir=site, cache_root=cache_root)
    assert list(cache_root.iterdir()) == []


def test_duplicate_patch_refused(tmp_path):
    with pytest.raises(OverlayError, match="names null-comment twice"):
        build_overlay(
            VERSION, ["null-comment", "null-comment"], stock_site_dir=SITE, cache_root=tmp_path
        )


# ----------------------------------------------------------------------------- verify_in_env
def test_verify_in_env_accepts_the_servers_environment(built):
    ov, _ = built
    got = verify_in_env(ov, sys.executable, ov.env(stock_env()))
    assert Path(got["forward_batch_info"]) == ov.fbi_path
    assert got["sha256"] == ov.fbi_sha256
    assert str(ov.root) in got["sys_path_head"]


def test_verify_in_env_catches_a_wrong_pythonpath(built, tmp_path):
    ov, _ = built
    with pytest.raises(OverlayError) as e:
        verify_in_env(ov, sys.executable, stock_env())  # overlay missing from PYTHONPATH
    msg = str(e.value)
    assert f"resolves to {(SITE / FORWARD_BATCH_INFO).resolve()}" in msg
    assert f"expected {ov.fbi_path}" in msg and "null-comment" in msg

    stock = build_overlay(VERSION, [], stock_site_dir=SITE, cache_root=tmp_path)
    assert verify_in_env(stock, sys.executable, stock_env())["sha256"] == stock.fbi_sha256
    with pytest.raises(OverlayError, match=f"stock variant: .*resolves to {ov.fbi_path}"):
        verify_in_env(stock, sys.executable, ov.env(stock_env()))  # stock run sees the overlay


def test_verify_in_env_reports_a_python_that_fails(built):
    ov, _ = built
    with pytest.raises(OverlayError, match="could not run /no/such/python"):
        verify_in_env(ov, "/no/such/python", stock_env())


# ----------------------------------------------------------------------------- stacking
@pytest.mark.skipif(VERSION != "0.5.1.post3", reason="pr9460-upstream is for 0.5.1.post3")
@pytest.mark.timeout(600)
def test_stacked_patches_apply_in_order(tmp_path):
    """null-comment then the derived upstream change: the result is 0.5.2rc2's file plus the comment
    line; the second patch's hashes are not checked against stock (the file changed before it)."""
    ov = build_overlay(
        VERSION, ["null-comment", "pr9460-upstream"], stock_site_dir=SITE, cache_root=tmp_path
    )
    (w,) = (DEFAULT_CACHE_DIR / "wheels" / "sglang-0.5.2rc2").glob("*.whl")
    with zipfile.ZipFile(w) as z:
        rc2 = z.read(FORWARD_BATCH_INFO).decode()
    expected = rc2.replace(LICENSE_END, LICENSE_END + NULL_LINE).encode()
    assert ov.fbi_path.read_bytes() == expected
    assert ov.files == {FORWARD_BATCH_INFO: sha(expected)} and ov.fbi_sha256 == sha(expected)
    assert list(ov.patch_hashes) == ["null-comment", "pr9460-upstream"]
    swapped = build_overlay(
        VERSION, ["pr9460-upstream", "null-comment"], stock_site_dir=SITE, cache_root=tmp_path
    )
    assert swapped.root != ov.root  # the order is part of the cache key
