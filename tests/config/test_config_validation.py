"""Config validation: variants as mappings, harness-owned arguments in any spelling, environment
checks, duplicate keys, encoding, size and alias bounds, strict types, typed sections, the removed
mrope_probe key, and a missing local model (exit 3 before any launch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbench import errors
from patchbench.config import Config, load_config
from patchbench.config.args import split_args
from patchbench.errors import ConfigError
from patchbench.inputs import MAX_CONFIG_BYTES, MAX_YAML_ALIASES, REPO_ROOT, sha256_file

BASE = """\
name: t
sglang: 0.5.1.post3
model: {path: .cache/models/tiny-qwen25vl-tf4, tiny: true}
server:
  args: [--device=cpu, --mem-fraction-static=0.05]
  env: {SGLANG_USE_CPU_ENGINE: "1"}
variants:
VARIANTS
"""


def write(tmp_path: Path, variants: str, base: str = BASE, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(base.replace("VARIANTS", "\n".join("  " + ln for ln in variants.splitlines())))
    return p


def err(tmp_path: Path, variants: str, base: str = BASE) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, variants, base))
    assert errors.exit_code_of(e.value) == 2 and isinstance(e.value, errors.ConfigError)
    return str(e.value)


# ----------------------------------------------------------------------------- variants
def test_long_and_short_forms(tmp_path):
    cfg = load_config(
        write(
            tmp_path,
            """\
baseline: []
patched: [null-comment]
no-overlap:
  server_args: [--disable-overlap-schedule, --cuda-graph-max-bs, "8"]
  env: {SGLANG_X: "1"}
aa: {patches: []}""",
        )
    )
    assert cfg.patches_of("patched") == ["null-comment"]
    assert cfg.server_args_of("no-overlap") == [
        "--enable-metrics",  # server.metrics (the default): the harness's, first
        "--device=cpu",
        "--mem-fraction-static=0.05",
        "--disable-overlap-schedule",
        "--cuda-graph-max-bs",
        "8",
    ]
    assert cfg.server_env_of("no-overlap") == {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_X": "1"}
    assert cfg.server_args_of("baseline")[1:] == ["--device=cpu", "--mem-fraction-static=0.05"]
    cfg.server.metrics = False
    assert cfg.server_args_of("baseline") == ["--device=cpu", "--mem-fraction-static=0.05"]
    assert [v for v in cfg.variants if cfg.is_aa(v)] == ["aa"] == cfg.aa_variants()
    assert not cfg.is_aa("baseline") and not cfg.is_aa("patched")
    d = cfg.variant_diff("no-overlap")
    assert d["server_args"] == {
        "added": ["--disable-overlap-schedule", "--cuda-graph-max-bs=8"],
        "removed": [],
        "changed": {},
    }
    assert d["env"] == {"added": {"SGLANG_X": "1"}, "removed": [], "changed": {}}
    assert d["patches"] == [] and d["aa"] is False
    dumped = cfg.model_dump(mode="json")["variants"]
    assert dumped["patched"] == ["null-comment"] and dumped["aa"] == []
    assert dumped["no-overlap"] == {
        "patches": [],
        "server_args": ["--disable-overlap-schedule", "--cuda-graph-max-bs", "8"],
        "env": {"SGLANG_X": "1"},
    }
    # the dump reads back into the same config
    again = Config.model_validate(cfg.model_dump(mode="json"))
    assert again.variants == cfg.variants


def test_variant_diff_patch_hashes_and_changed_args(tmp_path):
    from patchbench.patches.manifest import load_manifest
    from patchbench.run.manifest import variant_diff

    cfg = load_config(
        write(
            tmp_path,
            """\
baseline: {server_args: [--chunked-prefill-size=512]}
v: {patches: [null-comment], server_args: [--chunked-prefill-size=1024]}""",
        )
    )
    assert cfg.variant_diff("v")["patches"][0]["sha256"] is None  # the config does no patch I/O
    d = variant_diff(cfg, "v")
    m = load_manifest("null-comment")
    assert d["patches"] == [
        {
            "name": "null-comment",
            "kind": "patch",
            "path": None,
            "sha256": sha256_file(m.folder / "0.5.1.post3.diff"),
        }
    ]
    assert d["server_args"]["changed"] == {"--chunked-prefill-size": ["512", "1024"]}
    assert d["patches_added"] == ["null-comment"] and not cfg.is_aa("v")


@pytest.mark.parametrize(
    "item",
    [
        "--port=31000",
        "--port 31000",
        "--po=1",
        "--host",
        "--model",
        "--model-path",
        "--model-p=x",
        "--tokenizer-path",
        "--tokenizer-p",
    ],
)
def test_harness_owned_args_refused_per_variant_naming_it(tmp_path, item):
    msg = err(tmp_path, f"baseline: []\nfast:\n  server_args: ['{item}', '1']")
    assert "key 'variants.fast.server_args': server_args[0]: " in msg
    assert "set by the harness" in msg or "which the harness sets" in msg
    assert f"'{item}'" in msg


@pytest.mark.parametrize("item", ["--port=31000", "--port 31000", "--tokenizer-path"])
def test_harness_owned_args_refused_in_server_args(tmp_path, item):
    base = BASE.replace("args: [--device=cpu,", f"args: ['{item}', --device=cpu,")
    msg = err(tmp_path, "baseline: []", base)
    assert "c.yaml:5: key 'server.args'" in msg and "harness" in msg


def test_flag_and_value_in_one_item_refused(tmp_path):
    msg = err(tmp_path, "baseline: []\nv: {server_args: ['--cuda-graph-max-bs 8']}")
    assert "holds a flag and its value in one item" in msg and "--cuda-graph-max-bs=VALUE" in msg


def test_same_flag_in_server_args_and_variant_is_an_error_naming_it(tmp_path):
    msg = err(tmp_path, "baseline: []\nv:\n  server_args: [--mem-fraction-static, '0.1']")
    assert msg.startswith(
        f"{tmp_path / 'c.yaml'}:10: variants.v.server_args[0]: "
        "--mem-fraction-static is also in server.args [1]"
    )


def test_same_env_in_server_env_and_variant_is_an_error(tmp_path):
    msg = err(tmp_path, "baseline: []\nv: {env: {SGLANG_USE_CPU_ENGINE: '0'}}")
    assert "variants.v.env.SGLANG_USE_CPU_ENGINE: also set in server.env" in msg


@pytest.mark.parametrize(
    "env, expected",
    [
        ("{'1X': a}", "'1X' is not an environment variable name"),
        ("{'A-B': a}", "'A-B' is not an environment variable name"),
        ("{X: 1}", 'Input should be a valid string (got 1; quote it: "1")'),
        ("{X: true}", 'quote it: "true"'),
        ('{X: "a\\0b"}', "env.X: the value holds a NUL character"),
        ("{PYTHONPATH: /x}", "env.PYTHONPATH: set by the harness"),
        ("{PATCHBENCH_MROPE: '1'}", "env.PATCHBENCH_MROPE: set by the harness"),
    ],
)
def test_env_names_and_values(tmp_path, env, expected):
    assert expected in err(tmp_path, f"baseline: []\nv: {{env: {env}}}")


def test_patch_entries(tmp_path):
    assert "'null-comment' is listed twice" in err(
        tmp_path, "b: []\nv: [null-comment, null-comment]"
    )
    assert "'../x' is not a patch name" in err(tmp_path, "b: []\nv: ['../x']")
    msg = err(tmp_path, "b: []\nv: [nosuch]")
    assert "c.yaml:9: variants.v.patches[0]: patch 'nosuch' not found" in msg
    assert "available: " in msg and "null-comment" in msg
    msg = err(tmp_path, "b: []\nv: [{dif: x.diff}]")
    assert "unknown key 'variants.v.patches.0.dif'" in msg and "valid string" not in msg
    assert f"diff file {REPO_ROOT / 'nope.diff'} does not exist" in err(
        tmp_path, "b: []\nv: [{diff: nope.diff}]"
    )
    base = BASE.replace("sglang: 0.5.1.post3", "sglang: 0.5.23")
    assert "patch 'pr9460-upstream' has no diff for sglang 0.5.23" in err(
        tmp_path, "b: []\nv: [pr9460-upstream]", base
    )


# ----------------------------------------------------------------------------- the file
def test_duplicate_keys_name_both_lines(tmp_path):
    """A variant written twice: last-wins would quietly run stock sglang as 'the patch'."""
    msg = err(tmp_path, "baseline: []\nv: [null-comment]\nv: []")
    assert msg == (
        f"{tmp_path / 'c.yaml'}:10: duplicate key 'v' at lines 9 and 10: YAML would "
        "silently keep only the last one; remove one of them"
    )
    p = tmp_path / "d.yaml"
    p.write_text(BASE.replace("VARIANTS", "  b: []") + "name: again\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'name' at lines 1 and 9"):
        load_config(p)


def test_not_utf8_is_a_clear_error(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes(
        BASE.replace("VARIANTS", "  b: []")
        .replace("name: t", "name: t\ndescription: caf\xe9")
        .encode("latin-1")
    )
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == (
        f"{p}:2: not UTF-8 text (byte 0xe9 at offset 24); save the file as UTF-8"
    )


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'none.yaml'}: no such config file$"):
        load_config(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match=f"^{tmp_path}: is a directory, not a config file$"):
        load_config(tmp_path)


def test_size_and_alias_bounds(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(
        ConfigError, match=f"bytes; a config file may hold at most {MAX_CONFIG_BYTES}"
    ):
        load_config(big)
    # a "billion laughs": few aliases, 10**9 nodes once expanded
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"bomb.yaml: \d+ YAML nodes once aliases are expanded"):
        load_config(bomb)
    many = tmp_path / "many.yaml"
    many.write_text("a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_YAML_ALIASES + 1)) + "]\n")
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_ALIASES} aliases"):
        load_config(many)


@pytest.mark.parametrize(
    "snippet, expected",
    [
        (
            "schedule: {repeats: true}",
            "key 'schedule.repeats': Input should be a valid integer (got True; "
            "a boolean is not a number)",
        ),
        ("schedule: {repeats: '3'}", "key 'schedule.repeats': Input should be a valid integer"),
        ("server: {ready_timeout_s: false}", "a boolean is not a number"),
        ("sglang_bad: 1", "unknown key 'sglang_bad'"),
    ],
)
def test_strict_types(tmp_path, snippet, expected):
    base = (
        BASE.replace(
            "server:\n  args: [--device=cpu, --mem-fraction-static=0.05]\n"
            '  env: {SGLANG_USE_CPU_ENGINE: "1"}\n',
            "",
        )
        + snippet
        + "\n"
    )
    assert expected in err(tmp_path, "b: []", base)


def test_release_written_as_a_number_is_refused(tmp_path):
    assert "quote the release" in err(tmp_path, "b: []", BASE.replace("0.5.1.post3", "0.5"))


def test_removed_mrope_probe_says_what_replaces_it(tmp_path):
    base = BASE.replace("server:\n", "server:\n  mrope_probe: true\n")
    msg = err(tmp_path, "b: []", base)
    assert "c.yaml:5: key 'server.mrope_probe': server.mrope_probe was removed" in msg
    assert "sync_probe" in msg


def test_removed_retokenized_change_share_is_refused_with_what_to_do(tmp_path):
    msg = err(tmp_path, "b: []", BASE + "compare: {retokenized_change_share: 0.01}\n")
    assert "c.yaml:9: key 'compare': compare.retokenized_change_share was removed" in msg
    assert "delete the key" in msg


def test_compare_and_nightly_are_typed(tmp_path):
    from patchbench.config import CompareSettings
    from patchbench.config.nightly import NightlySettings

    cfg = load_config(write(tmp_path, "b: []", BASE + "compare: {confidence: 0.9}\n"))
    assert isinstance(cfg.compare, CompareSettings) and cfg.compare.confidence == 0.9
    assert isinstance(cfg.nightly, NightlySettings) and cfg.nightly.gates == []
    assert cfg.model_dump(mode="json")["compare"]["confidence"] == 0.9
    msg = err(tmp_path, "b: []", BASE + "compare: {confidance: 0.9}\n")
    assert "unknown key 'compare.confidance'; allowed keys: " in msg and "confidence" in msg


# ----------------------------------------------------------------------------- the model
@pytest.mark.parametrize("path", ["/nonexistent/models/qwen", "./nonexistent/qwen", "../nowhere/x"])
def test_missing_local_model_is_environment_not_ready(tmp_path, path):
    base = BASE.replace(
        "{path: .cache/models/tiny-qwen25vl-tf4, tiny: true}", f"{{path: '{path}'}}"
    )
    cfg = load_config(write(tmp_path, "b: []", base))
    assert cfg.model_ref == str(cfg.resolve_path(path))
    with pytest.raises(errors.EnvironmentNotReady) as e:
        cfg.require_model()
    assert errors.exit_code_of(e.value) == 3
    assert f"model.path {cfg.resolve_path(path)} does not exist" in str(e.value)


def test_hub_id_and_tiny_model_pass(tmp_path):
    base = BASE.replace(
        "{path: .cache/models/tiny-qwen25vl-tf4, tiny: true}", "{path: Qwen/Qwen2.5-VL-3B-Instruct}"
    )
    cfg = load_config(write(tmp_path, "b: []", base))
    assert cfg.model_ref == "Qwen/Qwen2.5-VL-3B-Instruct"  # a hub id: passed as it is
    cfg.require_model()
    tiny = load_config(
        write(
            tmp_path, "b: []", BASE.replace(".cache/models/tiny-qwen25vl-tf4", "/nonexistent/tiny")
        )
    )
    assert tiny.model_ref == "/nonexistent/tiny"  # tiny: a local folder, never a hub id
    tiny.require_model()  # built when missing


def test_split_args():
    assert split_args(["--a=1", "--b", "2", "--c", "--d", "-1", "x"]) == [
        (0, "--a", "1"),
        (1, "--b", "2"),
        (3, "--c", None),
        (4, "--d", "-1"),
        (6, "", "x"),
    ]


def test_a_value_the_message_already_quotes_is_not_repeated_and_long_lists_stay_closed(
    tmp_path,
):
    msg = err(tmp_path, "baseline: []", BASE + "schedule: {repeats: 0}\n")
    assert "repeats must be between 1 and 100, got 0" in msg and msg.count("got 0") == 1
    long_args = ", ".join(f"--arg-{i}={'x' * 30}" for i in range(8))
    msg = err(
        tmp_path, "baseline: []", BASE.replace("[--device=cpu,", f"[--port=1234, {long_args},")
    )
    got = msg[msg.index("(got ") :]
    assert got.startswith("(got ['--port=1234', ") and got.endswith(", ...])")


# ----------------------------------------------------------------------------- unusable values
@pytest.mark.parametrize(
    "section, expected",
    [
        ("server: {stall_timeout_s: .inf}", "key 'server.stall_timeout_s': inf is not a usable"),
        ("server: {ready_timeout_s: .inf}", "key 'server.ready_timeout_s': inf is not a usable"),
        ("server: {flush_pause_s: .inf}", "key 'server.flush_pause_s': inf is not a usable"),
        (
            "suites: {serving: {timeout_s: .inf}}",
            "key 'suites.serving.timeout_s': inf is not a usable",
        ),
        (
            "suites: {mmmu: {request_timeout_s: .inf}}",
            "key 'suites.mmmu.request_timeout_s': inf is not a usable",
        ),
        ('server: {host: ""}', "key 'server.host': server.host is the address"),
        ('server: {host: "http://x"}', "key 'server.host': server.host is the address"),
        ('model: {path: " "}', "key 'model.path': the model path is empty"),
        (
            'server: {env: {BIG: "' + "z" * 131070 + '"}}',
            "server.env.BIG: the value has 131070 characters; NAME=value may be at most 131071",
        ),
        (
            'server: {args: ["--x=' + "z" * 131072 + '"]}',
            "server.args[0]: 131076 characters; a process argument may be at most 131071 bytes",
        ),
    ],
)
def test_values_a_run_cannot_use_are_refused_at_load(tmp_path, section, expected):
    """Infinite times or limits (they wait forever), an empty or spaced host, an empty model path
    (the current folder) and an argument or environment value longer than Linux passes to a
    process (the launch fails with E2BIG) are refused at load, not after a cell started."""
    base = "name: t\nsglang: 0.5.1.post3\nvariants:\nVARIANTS\n"
    if not section.startswith("model"):
        base += "model: {path: .cache/models/tiny-qwen25vl-tf4, tiny: true}\n"
    msg = err(tmp_path, "baseline: []\nv: []", base + section + "\n")
    assert expected in msg, msg


def test_infinity_stays_where_it_is_the_default(tmp_path):
    """``serving.request_rate: .inf`` (all requests at once, the default) is a setting."""
    p = write(tmp_path, "baseline: []\nv: []", BASE + "suites: {serving: {request_rate: .inf}}\n")
    assert load_config(p).suite_params["serving"].request_rate == float("inf")


@pytest.mark.parametrize(
    "variants, section, expected",
    [
        ("baseline: []\n'🚀fast': []", "", "variant name '🚀fast': use letters, digits"),
        ("baseline: []\n'vérsion': []", "", "variant name 'vérsion': use letters, digits"),
        ("baseline: []\nv: [{diff: patches}]", "", "is a directory, not a diff file"),
        ("baseline: []\nv: {env: {X: 1}}", "", "Input should be a valid string (got 1; quote it"),
        ("baseline: []\nv: []", "schedule: {repeats: 0}", "repeats must be between 1 and 100"),
        ("baseline: []\nv: []", "schedule: {repeats: -2}", "repeats must be between 1 and 100"),
        ("baseline: []\nv: []", "server: {stall_timeout_s: 0}", "greater than 0 (got 0)"),
        ("baseline: []\nv: []", "server: {stall_timeout_s: -1}", "greater than 0 (got -1)"),
        (
            "baseline: []\nv: []",
            "suites: {serving: {sweep: {points: [8, 8.0, 1]}}}",
            "sweep points must be distinct",
        ),
        (
            "baseline: []\nv: []",
            "suites: {serving: {sweep: {points: [0, 1]}}}",
            "sweep points must be finite and > 0",
        ),
    ],
)
def test_names_counts_and_paths_that_cannot_work_are_refused_at_load(
    tmp_path, variants, section, expected
):
    """Non-ASCII variant names (they name folders and report columns), a patch path that is a
    folder, an environment value that is not a string, zero or negative repeats and stall
    limits, duplicate or non-positive sweep points: exit 2 at load, naming the key."""
    base = "name: t\nsglang: 0.5.1.post3\nmodel: {path: .cache/models/tiny-qwen25vl-tf4}\n"
    base += "variants:\nVARIANTS\n" + section + "\n"
    msg = err(tmp_path, variants, base)
    assert expected in msg, msg


def test_an_input_that_never_ends_is_refused_not_waited_for(tmp_path, monkeypatch):
    """A config path that is a FIFO nobody writes (its open would block for ever) or a device
    that never ends (/dev/zero: read whole, it would fill the memory) is refused within
    ``STREAM_WAIT_S`` or the size bound; a pipe that ends (``bench <(sed ... cfg.yaml)``) is
    read like a file."""
    import os
    import threading
    import time

    from patchbench import inputs

    monkeypatch.setattr(inputs, "STREAM_WAIT_S", 0.5)
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"not a regular file, and it did not end within 0.5 s"):
        load_config(fifo)
    assert time.monotonic() - t0 < 5
    with pytest.raises(ConfigError, match=r"/dev/zero: not a regular file, and it did not end"):
        load_config("/dev/zero")
    good = write(tmp_path, "baseline: []\nv: []", name="good.yaml").read_text()

    def writer():
        with open(fifo, "w") as f:
            f.write(good)

    th = threading.Thread(target=writer)
    th.start()
    assert load_config(fifo).name == "t"
    th.join(5)


# ----------------------------------------------------------------------------- built in memory
def test_a_mapping_gets_the_validation_and_messages_of_a_file(tmp_path):
    """config_from_mapping validates what load_config validates (suite parameters, patches),
    naming the origin it is given; a valid mapping gives the same config, without a source."""
    import yaml

    from patchbench.config import config_from_mapping

    path = write(tmp_path, "baseline: []\npatched: [null-comment]")
    raw = yaml.safe_load(path.read_text())
    raw["suites"] = {"serving": {"num_prompts": 4}}
    cfg = config_from_mapping(raw, "in memory")
    assert cfg.source is None and cfg.suite_params["serving"].num_prompts == 4
    assert load_config(path).variants == cfg.variants
    bad = {**raw, "suites": {"serving": {"num_prompts": "x"}}, "variants": {"b": ["nope"]}}
    with pytest.raises(ConfigError) as e:
        config_from_mapping(bad, "in memory")
    msg = str(e.value)
    assert "in memory: key 'suites.serving.num_prompts'" in msg
    assert "in memory: variants.b.patches[0]: patch 'nope' not found" in msg


def test_derive_changes_dotted_keys_and_validates_the_result(tmp_path):
    from patchbench.config import derive

    cfg = load_config(write(tmp_path, "baseline: []\npatched: [null-comment]"))
    two = derive(cfg, {"schedule.repeats": 2, "variants": {"baseline": []}, "name": "t2"})
    assert (two.schedule.repeats, list(two.variants), two.name) == (2, ["baseline"], "t2")
    assert two.source is None and cfg.schedule.repeats == 1 and len(cfg.variants) == 2
    assert two.model_dump(mode="json")["server"] == cfg.model_dump(mode="json")["server"]
    with pytest.raises(ConfigError, match=r"c.yaml \(with schedule.repeats\): key 'schedule.rep"):
        derive(cfg, {"schedule.repeats": 0})
    with pytest.raises(ConfigError, match="'name' holds str, not a mapping"):
        derive(cfg, {"name.x": 1})
    auto = load_config(REPO_ROOT / "configs" / "nightly-h200.yaml")
    assert auto.schedule.auto and derive(auto, {"name": "x"}).schedule.auto
    assert not derive(auto, {"schedule.repeats": 4}).schedule.auto


def test_a_randomized_order_keeps_its_seed_and_may_look_sequentially(tmp_path):
    from patchbench.config import config_from_mapping

    raw = {"name": "t", "sglang": "0.5.1.post3", "model": {"path": "m", "tiny": True}}
    raw["variants"] = {"a": [], "b": []}
    plain = config_from_mapping(raw, check_files=False)
    assert plain.schedule.seed is None and "seed" not in plain.model_dump(mode="json")["schedule"]
    seq = {"min": 4, "max": 8, "step": 2}
    cfg = config_from_mapping(
        {**raw, "schedule": {"order": "randomized", "seed": 7, "repeats": seq}}, check_files=False
    )
    assert cfg.schedule.model_dump(mode="json")["seed"] == 7
    assert cfg.schedule.order_text() == "randomized (seed 7)"
    for bad, says in (
        ({"order": "randomized", "seed": -1}, "schedule.seed"),
        ({"order": "sequential", "repeats": seq}, "use order: interleaved or randomized"),
    ):
        with pytest.raises(ConfigError, match=says):
            config_from_mapping({**raw, "schedule": bad}, check_files=False)
