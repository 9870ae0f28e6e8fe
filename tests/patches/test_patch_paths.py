"""A patch manifest is data from someone else: the diff it names stays inside its own folder.
No sglang needed: the manifests are written here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from patchbench.errors import EXIT_USAGE, PatchError
from patchbench.patches.manifest import ManifestError, load_manifest

SHA = "a" * 64


def _patch(pdir: Path, name: str, diff: str) -> Path:
    d = pdir / name
    d.mkdir(parents=True)
    manifest = {
        "name": name,
        "releases": {
            "0.5.1.post3": {
                "diff": diff,
                "files": {"sglang/srt/x.py": {"before": SHA, "after": SHA}},
            }
        },
    }
    (d / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return d / "manifest.yaml"


@pytest.mark.parametrize("diff", ["../outside.diff", "sub/../../outside.diff", "ABS"])
def test_a_diff_outside_the_patch_folder_is_refused_naming_file_key_and_value(tmp_path, diff):
    pdir = tmp_path / "patches"
    outside = tmp_path / "outside.diff"
    outside.write_text("--- a/sglang/srt/x.py\n")
    # an absolute path is refused as such, before it is opened (short: the message cuts a long
    # value)
    diff = "/patch-outside.diff" if diff == "ABS" else diff
    manifest = _patch(pdir, "p", diff)
    with pytest.raises(ManifestError) as e:
        load_manifest("p", patches_dir=pdir)
    msg = str(e.value)
    # the manifest's line 4 holds releases.0.5.1.post3.diff (name, releases, version, diff)
    assert msg.startswith(f"{manifest}:4: key 'releases.0.5.1.post3.diff'")
    assert f"(got '{diff}')" in msg and "inside the patch folder" in msg
    assert isinstance(e.value, PatchError) and e.value.exit_code == EXIT_USAGE == 2


def test_a_diff_that_is_a_link_pointing_out_of_the_folder_is_refused(tmp_path):
    pdir = tmp_path / "patches"
    secret = tmp_path / "secret.txt"
    secret.write_text("not a diff\n")
    manifest = _patch(pdir, "p", "0.5.1.post3.diff")
    (pdir / "p" / "0.5.1.post3.diff").symlink_to(secret)
    with pytest.raises(ManifestError) as e:
        load_manifest("p", patches_dir=pdir)
    assert str(e.value) == (
        f"{manifest}:4: key 'releases.0.5.1.post3.diff' is '0.5.1.post3.diff', a link that "
        f"points outside the patch folder (to {secret.resolve()}); keep the diff itself in "
        f"{pdir / 'p'}"
    )
    assert e.value.exit_code == 2


def test_a_diff_inside_the_folder_loads_links_within_it_too(tmp_path):
    pdir = tmp_path / "patches"
    _patch(pdir, "p", "diffs/0.5.1.post3.diff")
    (pdir / "p" / "diffs").mkdir()
    (pdir / "p" / "real.diff").write_text("--- a/sglang/srt/x.py\n")
    (pdir / "p" / "diffs" / "0.5.1.post3.diff").symlink_to(pdir / "p" / "real.diff")
    m = load_manifest("p", patches_dir=pdir)
    assert m.releases["0.5.1.post3"].diff == "diffs/0.5.1.post3.diff"
