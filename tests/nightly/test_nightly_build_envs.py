"""``patchbench nightly MATRIX.yaml --build-envs``: the flag ``patchbench matrix`` has reaches the
matrix run as ``build_envs=True`` (only then may a missing pin environment be built), and is
refused with a plain config (exit 2) like the other matrix options."""

from __future__ import annotations

from patchbench.nightly import commands as nightly_cli
from tests.matrix import test_matrix


def test_build_envs_reaches_the_matrix_run_and_is_refused_for_a_plain_config(
    tmp_path, monkeypatch, capsys
):
    seen: list[dict] = []

    class Outcome:
        exit_code = 0

    def fake_nightly_matrix(path, **kw):
        seen.append(kw)
        return Outcome()

    monkeypatch.setattr(nightly_cli, "nightly_matrix", fake_nightly_matrix)
    base = test_matrix.write_base(tmp_path)
    m = test_matrix.write_matrix(
        tmp_path,
        f"""\
        name: nightly-mx
        base: {base}
        axes:
          suites.mx_fake.gains.patched: [1.0, 0.8]
        """,
    )
    assert nightly_cli.cli([str(m), "--build-envs"]) == 0
    assert nightly_cli.cli([str(m)]) == 0
    assert seen[0].get("build_envs") is True and "build_envs" not in seen[1]
    assert nightly_cli.cli([str(base), "--build-envs"]) == 2
    assert "--build-envs: only for a matrix file" in capsys.readouterr().err
