"""Secrets never leave the server's environment (patchbench.redact): a token planted in
``server.env``, a variant's ``env`` and a ``server.secret_env`` name reaches the (fake) server
process as it is, and appears nowhere in the run folder, the report, the comment, the console or
the dry run, which show ``<redacted sha256:XXXXXXXX>`` instead (fake server, port 31901)."""

from __future__ import annotations

import hashlib

import pytest

import tests.fake_server.fake_suites  # noqa: F401  (registers the fake suites)
from patchbench import cli
from patchbench.config import load_config
from patchbench.errors import ConfigError
from patchbench.redact import is_secret, redact_env, redacted
from patchbench.run.preflight import config_of_run
from tests.run.test_bench_runner import write_config

HF = "hf_PLANTEDsecretVALUE0001"
MINE = "planted-my-var-VALUE0002"
KEY = "sk-PLANTED-api-key-0003"
CONFIG = f"""\
    name: secrets-test
    sglang: "@SGLANG@"
    model: {{path: "@MODEL@"}}
    server:
      port: 31901
      ready_timeout_s: 30
      stop_grace_s: 3
      flush_retries: 2
      flush_pause_s: 0.1
      env: {{HF_TOKEN: {HF}, MY_VAR: {MINE}, PLAIN_SETTING: visible}}
      secret_env: [MY_VAR]
    variants:
      baseline: []
      control: {{patches: [null-comment], env: {{OPENAI_API_KEY: {KEY}}}}}
    schedule: {{repeats: 1}}
    suites:
      fake: {{n: 2}}
"""


def shown(value: str) -> str:
    """The redacted form, computed by hand: sha256's first 8 hex digits."""
    return f"<redacted sha256:{hashlib.sha256(value.encode()).hexdigest()[:8]}>"


def test_redaction_rule_and_form():
    assert shown("abc") == "<redacted sha256:ba7816bf>"  # sha256("abc") = ba7816bf8f01...
    assert redacted("abc") == shown("abc") and redacted(shown("abc")) == shown("abc")
    assert [is_secret(n) for n in ("HF_TOKEN", "api_key", "Db_Password", "MY_SECRET_X")] == [
        True
    ] * 4
    assert not is_secret("MY_VAR") and is_secret("my_var", ["MY_VAR"])
    assert not is_secret("SGLANG_LOG_LEVEL")
    env = {"HF_TOKEN": "a", "MY_VAR": "b", "X": "c"}
    assert redact_env(env, ["MY_VAR"]) == {"HF_TOKEN": shown("a"), "MY_VAR": shown("b"), "X": "c"}


def test_secrets_reach_the_server_and_nothing_written_or_printed(fake_cli_env, tmp_path, capsys):
    cfg = write_config(tmp_path, CONFIG)
    # the dry run
    assert cli.main(["bench", str(cfg), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    # the run (console captured), then the comment
    results = tmp_path / "results"
    assert cli.main(["bench", str(cfg), "--results", str(results)]) == 0
    console = "".join(capsys.readouterr())
    (run_dir,) = results.iterdir()
    comment = tmp_path / "comment.md"
    assert cli.main(["comment", str(run_dir), "--out", str(comment)]) == 0
    console += "".join(capsys.readouterr())
    # the real values reached every server's environment
    for label, spec in fake_cli_env.seen.items():
        assert spec.env["HF_TOKEN"] == HF and spec.env["MY_VAR"] == MINE, label
        assert spec.env.get("OPENAI_API_KEY") == (KEY if label.startswith("control") else None)
    # nothing written holds a planted value
    files = [p for p in run_dir.rglob("*") if p.is_file()] + [comment]
    assert len(files) > 10
    for p in files:
        data = p.read_bytes()
        for secret in (HF, MINE, KEY):
            assert secret.encode() not in data, (p, secret)
    for text in (dry, console):
        for secret in (HF, MINE, KEY):
            assert secret not in text
    # ... and the redacted forms are where the values were shown
    manifest = (run_dir / "manifest.json").read_text()
    assert all(shown(v) in manifest for v in (HF, MINE, KEY))
    assert "visible" in manifest  # a plain setting stays
    assert shown(HF) in dry and shown(MINE) in dry and shown(KEY) in dry
    assert shown(KEY) in console  # the variant line: "variant control: ...; env OPENAI_API_KEY=..."
    assert f"`OPENAI_API_KEY={shown(KEY)}`" in (run_dir / "report.md").read_text()
    # resume with the config compares the redacted forms: nothing to do, no error
    assert cli.main(["bench", str(cfg), "--resume", str(run_dir)]) == 0
    capsys.readouterr()
    # a resume from the folder alone cannot have the secrets back: refused, naming them
    with pytest.raises(ConfigError, match=r"keeps server.env.HF_TOKEN, server.env.MY_VAR, "):
        config_of_run(run_dir)
    assert load_config(cfg).server.secret_env == ["MY_VAR"]


def test_secret_env_names_are_checked_at_load(tmp_path):
    cfg = write_config(tmp_path, CONFIG.replace("secret_env: [MY_VAR]", "secret_env: [1BAD]"))
    with pytest.raises(ConfigError, match=r"server.secret_env: \['1BAD'\] are not environment"):
        load_config(cfg)
