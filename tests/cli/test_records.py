"""Atomic writes keep the usual file mode (a fresh-user trial found results written 0600)."""

import os
import stat

from patchbench import records


def test_atomic_writes_get_the_umask_mode_not_mkstemps_0600(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "_UMASK", 0o022)
    p = records.write_json(tmp_path / "a" / "x.json", {"v": 1})
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644
    monkeypatch.setattr(records, "_UMASK", 0o077)
    p = records.write_text(tmp_path / "y.md", "hi")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert records.read_json(tmp_path / "a" / "x.json") == {"v": 1}
    assert not [f for f in tmp_path.rglob(".*.tmp")]  # no temp file left behind
