"""Issue 34's smaller items, each pinned: a server command over the system's ARG_MAX refused
before launch (exit 2), shell-quoted server commands in ``--dry-run``, quoted Makefile
variables, terminal controls stripped from what is rendered. Fake server port 31932."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import tests.fake_server.fake_suites  # noqa: F401 (registers the fake suites)
from patchbench import cli, records
from patchbench.config import load_config
from patchbench.config.args import arg_max, exec_bytes, launch_size_problem
from patchbench.errors import ConfigError
from patchbench.run import bench
from patchbench.run.server import LaunchRefused, LaunchSpec, SglangServer
from tests.run.test_bench_runner import write_config

PORT = 31932
CONFIG = f"""\
    name: small-faults
    sglang: "@SGLANG@"
    model: {{path: "@MODEL@"}}
    server: {{port: {PORT}, ready_timeout_s: 30, stop_grace_s: 3, args: ["--served-model-name", "a b;c"]}}
    variants:
      baseline: []
    schedule: {{repeats: 1}}
    suites:
      fake: {{n: 1}}
"""


def test_exec_bytes_counts_strings_nuls_and_pointers():
    # "ab\\0" + "c\\0" = 5, "K=v\\0" = 4, pointers: (2 + 1 + 2) * 8 = 40
    assert exec_bytes(["ab", "c"], {"K": "v"}) == 49
    assert arg_max() == os.sysconf("SC_ARG_MAX")
    assert launch_size_problem(["x"], {"K": "v"}) is None


def _huge_env() -> dict[str, str]:
    """Values each under MAX_ARG_STRLEN, together over ARG_MAX."""
    n = arg_max() // 100_000 + 2
    return {f"BIG{i}": "x" * 100_000 for i in range(n)}


def test_a_server_command_over_arg_max_is_refused_before_any_launch(fake_env, tmp_path):
    path = write_config(tmp_path, CONFIG)
    cfg = load_config(path)
    cfg.server.env.update(_huge_env())
    with pytest.raises(ConfigError) as e:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    assert e.value.exit_code == 2
    msg = str(e.value)
    assert "variant baseline: the server's arguments and environment take " in msg
    assert (
        f"over this system's {arg_max()} (getconf ARG_MAX; the launch would fail with E2BIG)" in msg
    )
    assert not (tmp_path / "results").exists() or list((tmp_path / "results").iterdir()) == []


def test_the_server_itself_refuses_a_command_over_arg_max_naming_it(tmp_path):
    spec = LaunchSpec(
        python=sys.executable,
        model_path="m",
        host="127.0.0.1",
        port=PORT,
        args=[],
        env=_huge_env(),
        log_path=tmp_path / "server.log",
    )
    with pytest.raises(LaunchRefused, match="server not started: the server's arguments"):
        SglangServer(spec).start()
    assert not (tmp_path / "server.log").exists()


def test_dry_run_prints_shell_quoted_server_commands(tmp_path, capsys):
    path = write_config(tmp_path, CONFIG.replace("baseline: []", "baseline: {env: {X: 'a b'}}"))
    assert cli.main(["bench", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("server     baseline: "))
    words = shlex.split(line.removeprefix("server     baseline: "))
    assert words[1:3] == ["-m", "sglang.launch_server"] and words[-2:] == [
        "--served-model-name",
        "a b;c",
    ]
    assert "env: X='a b'" in out


def test_makefile_quotes_what_a_user_sets():
    root = Path(__file__).resolve().parents[2]
    evil = "x'; touch /tmp/pb-pwned; echo 'y `id` a  b"
    for target, var, want in (
        ("nightly", "NIGHTLY_CONFIG", ["nightly", evil]),
        ("bench", "CONFIG", ["bench", evil]),
        ("doctor", "DOCTOR_CONFIG", ["doctor", evil]),
    ):
        got = (
            subprocess.run(
                ["make", "-s", "-n", "-C", str(root), target, f"{var}={evil}"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        assert shlex.split(got)[-len(want) :] == want, got


def test_printable_strips_terminal_controls_and_keeps_text():
    raw = "a\x1b[31mred\x1b[0m b\x1b]0;title\x07 c\r\x00d\x9b2Je\tf\nok ü 日本\x1bc!"
    assert records.printable(raw) == "ared b cd2Je\tf\nok ü 日本!"
