"""Matrix files (patchbench.matrix.spec): expansion, validation (file, key, line; the unit named),
stable unit ids, ``--on local`` end to end through the fake server with a suite whose primary
metric has a known effect per unit, and the matrix report (patchbench.matrix.report).

Run as a script (``python tests/matrix/test_matrix.py ARGS``) this file is ``patchbench bench ARGS``
with every server launched as the fake server (tests/fake_server) and the ``mx_fake`` suite
registered: the bench command the executors run in these tests (also tests/matrix/test_matrix_ray.py).
"""

import json
import math
import os
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))

import importlib.metadata  # noqa: E402
import urllib.request  # noqa: E402

from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from patchbench.records import write_json  # noqa: E402
from patchbench.suite import MetricInfo, Suite, SuiteError, SuiteResult, register  # noqa: E402


class MxParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: float = 100.0
    gains: dict[str, float] = Field(default_factory=dict)
    fail_if_exists: str = ""


@register
class MxFakeSuite(Suite):
    """One /generate against the cell's server, then a throughput whose ratio to the baseline is
    ``gains[variant] + 0.01 * repeat`` (1.0 for a variant not named): a known effect per unit.
    The patched variant's cells fail while the file ``fail_if_exists`` exists."""

    name = "mx_fake"
    Params = MxParams
    metrics = {"tput_tok_s": MetricInfo("higher", "tok/s", primary=True)}

    def run(self, ctx, params):
        if (
            params.fail_if_exists
            and ctx.variant == "patched"
            and Path(params.fail_if_exists).exists()
        ):
            raise SuiteError(f"{params.fail_if_exists} exists")
        req = urllib.request.Request(
            ctx.server.base_url + "/generate",
            data=b'{"text": "x"}',
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=60).read()
        gain = params.gains.get(ctx.variant, 1.0) + (
            0.01 * ctx.repeat if ctx.variant in params.gains else 0.0
        )
        value = params.base * (1 + 0.02 * ctx.repeat) * gain
        write_json(ctx.out_dir / "records.json", {"value": value})
        return SuiteResult(metrics={"tput_tok_s": value})


if __name__ == "__main__":
    from patchbench.cli import main
    from patchbench.run import cell

    _real = cell.launch_spec

    def _fake(cfg, venv, cdir, port):
        spec = _real(cfg, venv, cdir, port)
        spec.env["PYTHONPATH"] = str(HERE / "fake_server") + os.pathsep + spec.env["PYTHONPATH"]
        return spec

    cell.launch_spec = _fake
    sys.exit(main(["bench", *sys.argv[1:]]))

import pytest  # noqa: E402
import scipy.stats  # noqa: E402

from patchbench.analysis.comparison import read_comparison  # noqa: E402
from patchbench.envs.nodes import node_name, prepare_python  # noqa: E402
from patchbench.errors import (  # noqa: E402
    ConfigError,
    EnvironmentNotReady,
    RunFailed,
    UsageError,
)
from patchbench.inputs import REPO_ROOT  # noqa: E402
from patchbench.matrix.driver import add_cli_arguments, describe_matrix, run_cli, run_matrix  # noqa: E402
from patchbench.matrix.execute import pack_folder, unpack_folder  # noqa: E402
from patchbench.matrix.executors import LocalExecutor, make_executor  # noqa: E402
from patchbench.matrix.spec import is_matrix_file, load_matrix, unit_id  # noqa: E402
from patchbench.records import read_json  # noqa: E402

SGLANG = importlib.metadata.version("sglang")
#: the bench command of the executors in these tests: this file as a script
FAKE_COMMAND = ["{python}", str(Path(__file__).resolve()), "{config}", "--results", "{results}"]


def write_base(tmp_path: Path, port: int | None = None, name: str = "mxbase") -> Path:
    """A base config for the fake server: two variants, two repeats, the mx_fake suite; ``port``
    defaults to a free one (patchbench.run.ports.free_port)."""
    if port is None:
        from patchbench.run.ports import free_port

        port = free_port()
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    p = tmp_path / f"{name}.yaml"
    p.write_text(
        textwrap.dedent(f"""\
        name: {name}
        sglang: "{SGLANG}"
        model: {{path: "{model}"}}
        server: {{port: {port}, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2,
                  flush_pause_s: 0.05}}
        variants:
          baseline: []
          patched: [null-comment]
        schedule: {{repeats: 2}}
        compare: {{min_repeats: 2}}
        suites:
          mx_fake: {{gains: {{patched: 1.10}}}}
        """)
    )
    return p


def write_matrix(tmp_path: Path, body: str, name: str = "m.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


# --------------------------------------------------------------------------- expansion, ids
def test_axes_expand_in_order_with_exclude_set_and_stable_ids(tmp_path):
    base = write_base(tmp_path)
    m = write_matrix(
        tmp_path,
        f"""\
        name: sizes
        base: {base}
        axes:
          suites.mx_fake.gains.patched: [1.10, 0.95]
          gpu_type: [H100, H200]
        set: {{schedule.repeats: 3}}
        exclude:
          - {{suites.mx_fake.gains.patched: 0.95, gpu_type: H100}}
        """,
    )
    mx = load_matrix(m)
    got = [(u.labels["suites.mx_fake.gains.patched"], u.gpu_type) for u in mx.units]
    assert got == [(1.10, "H100"), (1.10, "H200"), (0.95, "H200")]  # first axis slowest
    u = mx.units[0]
    assert u.config.schedule.repeats == 3  # set: applies to every unit
    assert u.config.suite_params["mx_fake"].gains == {"patched": 1.10}
    assert "gpu_type" not in u.overrides and u.sglang == SGLANG
    # ids: readable slug + the sha256 of the canonical JSON of the labels (computed here)
    import hashlib

    canon = json.dumps(
        {"suites.mx_fake.gains.patched": 1.1, "gpu_type": "H100"},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert u.id == "1.1_h100-" + hashlib.sha256(canon.encode()).hexdigest()[:8]
    # stable: a second load (another process would do the same) gives the same ids; changing
    # `set` or the base file changes no id
    again = load_matrix(m)
    assert [x.id for x in again.units] == [x.id for x in mx.units]
    m.write_text(m.read_text().replace("repeats: 3", "repeats: 4"))
    assert [x.id for x in load_matrix(m).units] == [x.id for x in mx.units]
    assert len({x.id for x in mx.units}) == 3


def test_unit_id_slug_of_paths_and_lists():
    uid = unit_id(
        {
            "model.path": "Qwen/Qwen2.5-VL-3B-Instruct",
            "sglang": "0.5.23",
            "server.args": ["--disable-overlap-schedule"],
        }
    )
    assert uid.startswith("qwen2.5-vl-3b-instruct_0.5.23_disable-overlap-schedule-")
    assert len(uid.rsplit("-", 1)[1]) == 8
    # a different value of any label gives a different id; key order does not matter for the hash
    assert (
        unit_id({"a": 1, "b": 2}).rsplit("-", 1)[1] == unit_id({"b": 2, "a": 1}).rsplit("-", 1)[1]
    )
    assert unit_id({"a": 1}) != unit_id({"a": 2})


def test_explicit_units_list(tmp_path):
    a = write_base(tmp_path, name="cfga")
    b = write_base(tmp_path, port=31961, name="cfgb")
    m = write_matrix(
        tmp_path,
        f"""\
        name: listed
        units:
          - {{config: {a}, gpu_type: X}}
          - {{config: {b}, set: {{server.port: 31970}}}}
        """,
    )
    mx = load_matrix(m)
    assert [u.config.name for u in mx.units] == ["cfga", "cfgb"]
    assert [u.gpu_type for u in mx.units] == ["X", None]
    assert mx.units[1].config.server.port == 31970
    assert mx.units[0].id.startswith("cfga.yaml_x-")
    text = describe_matrix(mx)
    assert "units      2" in text and f"{mx.units[1].id}: gpu_type=any" in text


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            "name: m\nbase: @BASE@\naxes: {sglang: []}\n",
            r"m.yaml:3: axes.sglang: give at least one value",
        ),
        (
            "name: m\nbase: @BASE@\naxes:\n  gpu_type: [H100,\n    H100]\n",
            r"m.yaml:5: axes.gpu_type\[1\]: 'H100' is listed twice",
        ),
        (
            "name: m\nbase: @BASE@\naxis: {sglang: [a]}\n",
            r"m.yaml:3: unknown key 'axis'; allowed keys: name,",
        ),
        (
            "name: m\nbase: @BASE@\nresources: {num_gpus: all}\n",
            r"m.yaml:3: key 'resources.num_gpus'",
        ),
        ("name: m\n", r"give a base config with axes, or a list of units"),
        (
            "name: m\nbase: @BASE@\nunits: [{config: @BASE@}]\n",
            r"m.yaml:3: give either base/axes or units",
        ),
        (
            "name: m\nbase: @BASE@\naxes: {gpu_type: [A]}\nexclude: [{gpu_type: B}]\n",
            r"m.yaml:4: exclude\[0\].gpu_type: 'B' is not one of axes.gpu_type's values",
        ),
        (
            "name: m\nbase: @BASE@\naxes: {sglang: [a]}\nname: n\n",
            r"duplicate key 'name' at lines 1 and 4",
        ),
        (
            "name: m\nbase: @BASE@\naxes: {sglang: [latest]}\n",
            r"unit latest.*sglang latest: a matrix unit runs one release for all its variants",
        ),
        (
            "name: m\nbase: /nope/missing.yaml\n",
            r"m.yaml:2: /nope/missing.yaml: no such config file",
        ),
        (
            "name: m\nbase: @BASE@\naxes: {model.path.x: [a]}\n",
            r"m.yaml:3: unit .*'model.path' holds str, not a mapping",
        ),
    ],
)
def test_matrix_file_errors_name_file_key_line(tmp_path, body, expected):
    base = write_base(tmp_path)
    m = write_matrix(tmp_path, body.replace("@BASE@", str(base)))
    with pytest.raises(ConfigError, match=expected):
        load_matrix(m)


def test_unit_that_does_not_validate_is_named_with_the_matrix_line(tmp_path):
    base = write_base(tmp_path)
    m = write_matrix(
        tmp_path,
        f"""\
        name: bad
        base: {base}
        axes:
          schedule.repeats: [2, "three"]
          server.colour: [red]
        """,
    )
    with pytest.raises(ConfigError) as ei:
        load_matrix(m)
    msg = str(ei.value)
    # both units fail on server.colour (an unknown key, set by the matrix at line 5); the second
    # also on schedule.repeats (line 4, its second value)
    assert msg.count("its config does not validate") == 2
    assert f"{m}:5 (set by the matrix: server.colour): unknown key 'server.colour'" in msg
    assert f"{m}:4 (set by the matrix: schedule.repeats): key 'schedule.repeats'" in msg
    assert "unit 2_red-" in msg and "unit three_red-" in msg


def test_base_config_problem_points_at_the_base_line(tmp_path):
    base = write_base(tmp_path)
    base.write_text(
        base.read_text().replace("schedule: {repeats: 2}", "schedule: {repeats: 2, pace: 1}")
    )
    m = write_matrix(tmp_path, f"name: b\nbase: {base}\naxes: {{gpu_type: [A]}}\n")
    with pytest.raises(ConfigError, match=rf"{base}:9: unknown key 'schedule.pace'"):
        load_matrix(m)


def test_ray_missing_is_environment_not_ready(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(EnvironmentNotReady, match=r"pip install \.\[ray\].*make setup RAY=1"):
        make_executor("ray")
    assert isinstance(make_executor("local"), LocalExecutor)


def test_pack_and_unpack_round_trip_refuses_escaping_members(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "f.txt").write_text("hello")
    data = pack_folder(src)
    unpack_folder(data, tmp_path / "dest")
    assert (tmp_path / "dest" / "a" / "b" / "f.txt").read_text() == "hello"
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        unpack_folder(buf.getvalue(), tmp_path / "dest2")
    assert not (tmp_path / "evil.txt").exists()


# --------------------------------------------------------------------------- local, end to end
def hand_change(gain: float) -> tuple[float, float, float]:
    """Change and 95 % t-interval (%) of the paired log ratios gain, gain + 0.01 (two repeats),
    computed here from the definition (scipy's t quantile)."""
    logs = [math.log(gain), math.log(gain + 0.01)]
    mean = sum(logs) / 2
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 1)
    half = scipy.stats.t.ppf(0.975, 1) * sd / math.sqrt(2)
    return tuple(100 * (math.exp(x) - 1) for x in (mean, mean - half, mean + half))


def check_units_layout(mdir: Path, mx) -> dict:
    man = read_json(mdir / "matrix.json")
    assert [u["id"] for u in man["units"]] == [u.id for u in mx.units]
    for u in mx.units:
        kept = u.config.redacted().model_dump(mode="json")
        assert read_json(mdir / "configs" / f"{u.id}.yaml") == kept
    return {u["id"]: u for u in man["units"]}


def test_local_matrix_runs_units_and_reports_their_effects(tmp_path):
    base = write_base(tmp_path)
    m = write_matrix(
        tmp_path,
        f"""\
        name: local
        base: {base}
        axes:
          suites.mx_fake.gains.patched: [1.10, 0.95]
        """,
    )
    mx = load_matrix(m)
    ex = LocalExecutor(env_setup="current", command=FAKE_COMMAND)
    mdir = run_matrix(m, executor=ex, results=tmp_path / "results", log=lambda s: None)
    assert mdir.parent == tmp_path / "results" and mdir.name.endswith("-local")
    units = check_units_layout(mdir, mx)
    report = (mdir / "report.md").read_text()
    # 1.10: log ratios 0.0953, 0.1044: the interval excludes 0; 0.95: -0.0513, -0.0408 with one
    # degree of freedom (t 12.71): the interval [-10.6 %, +2.1 %] includes 0
    for u, gain, verdict in zip(mx.units, (1.10, 0.95), ("improved", "inconclusive"), strict=True):
        assert units[u.id]["status"] == "ok" and units[u.id]["exit_code"] == 0
        run = mdir / u.id
        assert (run / "manifest.json").exists() and (run / "report.md").exists()
        assert sorted(p.parent.parent.name for p in run.glob("*/rep*/cell.json")) == [
            "baseline",
            "baseline",
            "patched",
            "patched",
        ]
        row = read_comparison(run).row("mx_fake", "tput_tok_s", "patched")
        change, low, high = hand_change(gain)
        assert row.change == pytest.approx(change, abs=1e-6)
        assert (row.low, row.high) == (pytest.approx(low, abs=1e-6), pytest.approx(high, abs=1e-6))
        assert row.verdict == verdict
        assert f"[{u.id}]({u.id}/report.md)" in report
        assert f"patched: **{verdict}** {change:+.2f}% [{low:+.2f}, {high:+.2f}]%" in report
    assert (mdir / "plots" / "matrix-effect.png").stat().st_size > 1000
    # the environment plan (announced before the units ran) and the timings' columns
    env = read_json(mdir / "matrix.json")["environments"]
    assert [(e["pin"], e["source"], e["path"]) for e in env] == [
        (SGLANG, "current", sys.executable)
    ]
    assert f"- sglang {SGLANG} on {node_name()}: this interpreter {sys.executable}" in report
    assert "| unit | node | queued s | env s | bench s | task s | driver overhead s |" in report
    assert (
        "| unit | gpu type | suites.mx_fake.gains.patched | status | mx_fake.tput_tok_s |" in report
    )
    # a resume with everything done runs nothing: the unit folders stay as they are
    before = {p: p.stat().st_mtime_ns for p in mdir.glob("*/manifest.json")}
    run_matrix(m, executor=ex, resume=mdir, log=lambda s: None)
    assert {p: p.stat().st_mtime_ns for p in mdir.glob("*/manifest.json")} == before
    assert "2 of 2 units done, 0 to run" in describe_matrix(mx, mdir)


def test_a_matrix_folder_keeps_no_secret_and_its_unit_runs_with_the_real_value(tmp_path):
    """configs/<unit>.yaml is a record with the secrets redacted; the unit gets the real value
    through the executor's spec (its run's manifest holds the redacted form of the real value,
    not of a redacted one); a resume compares the redacted forms."""
    from patchbench.redact import redacted

    secret = "hf_matrix_secret_0123456789"
    base = write_base(tmp_path)
    text = base.read_text().replace(
        "flush_pause_s: 0.05}", f'flush_pause_s: 0.05, env: {{HF_TOKEN: "{secret}"}}}}'
    )
    assert secret in text
    base.write_text(text)
    m = write_matrix(
        tmp_path,
        f"""\
        name: secret
        base: {base}
        axes:
          suites.mx_fake.gains.patched: [1.10]
        """,
    )
    mx = load_matrix(m)
    (u,) = mx.units
    assert u.config.server.env["HF_TOKEN"] == secret
    ex = LocalExecutor(env_setup="current", command=FAKE_COMMAND)
    mdir = run_matrix(m, executor=ex, results=tmp_path / "results", log=lambda s: None)
    kept = read_json(mdir / "configs" / f"{u.id}.yaml")
    assert kept["server"]["env"]["HF_TOKEN"] == redacted(secret)
    assert redacted(secret).startswith("<redacted sha256:")
    man = read_json(mdir / u.id / "manifest.json")
    assert man["config"]["server"]["env"]["HF_TOKEN"] == redacted(secret)
    assert read_json(mdir / "matrix.json")["units"][0]["status"] == "ok"
    files = [p for p in mdir.rglob("*") if p.is_file()]
    assert len(files) > 10
    assert [p for p in files if secret.encode() in p.read_bytes()] == []
    # a resume with the same config is accepted (and runs nothing)
    run_matrix(m, executor=ex, resume=mdir, log=lambda s: None)
    assert "1 of 1 units done, 0 to run" in describe_matrix(mx, mdir)


def test_local_failed_unit_is_reported_others_kept_and_resume_reruns_it(tmp_path):
    base = write_base(tmp_path)
    flag = tmp_path / "fail-flag"
    flag.touch()
    m = write_matrix(
        tmp_path,
        f"""\
        name: fails
        base: {base}
        axes:
          suites.mx_fake.fail_if_exists: ["", "{flag}"]
        """,
    )
    mx = load_matrix(m)
    ex = LocalExecutor(env_setup="current", command=FAKE_COMMAND)
    with pytest.raises(RunFailed, match=r"1 of 2 units did not end ok") as ei:
        run_matrix(m, executor=ex, results=tmp_path / "results", log=lambda s: None)
    mdir = ei.value.run_dir
    units = check_units_layout(mdir, mx)
    good, bad = (units[u.id] for u in mx.units)
    assert good["status"] == "ok" and (mdir / good["id"] / "compare.json").exists()
    # bench's RunFailed (exit 4): the failed unit's folder is kept with its failed cells
    assert bad["status"] == "failed" and bad["exit_code"] == 4
    assert "2 of 4 cells failed" in bad["message"]
    cells = read_json(mdir / bad["id"] / "manifest.json")["cells"]
    assert sorted((c["variant"], c["status"]) for c in cells) == [
        ("baseline", "ok"),
        ("baseline", "ok"),
        ("patched", "failed"),
        ("patched", "failed"),
    ]
    report = (mdir / "report.md").read_text()
    assert f"- `{bad['id']}`: failed" in report
    # resume: the fault is gone; only the failed unit runs, through bench --resume (its two ok
    # baseline cells are kept as they are)
    flag.unlink()
    t_good = (mdir / good["id"] / "manifest.json").stat().st_mtime_ns
    t_cell = (mdir / bad["id"] / "baseline" / "rep0" / "cell.json").stat().st_mtime_ns
    run_matrix(m, executor=ex, resume=mdir, log=lambda s: None)
    units = {u["id"]: u for u in read_json(mdir / "matrix.json")["units"]}
    assert [u["status"] for u in units.values()] == ["ok", "ok"]
    assert (mdir / good["id"] / "manifest.json").stat().st_mtime_ns == t_good
    assert (mdir / bad["id"] / "baseline" / "rep0" / "cell.json").stat().st_mtime_ns == t_cell
    assert all(c["status"] == "ok" for c in read_json(mdir / bad["id"] / "manifest.json")["cells"])
    # a changed unit config is refused on resume, naming the unit
    m.write_text(m.read_text() + "set: {schedule.repeats: 3}\n")
    with pytest.raises(
        ConfigError, match=rf"config of unit\(s\) {good['id']}, {bad['id']} differs"
    ):
        run_matrix(m, executor=ex, resume=mdir, log=lambda s: None)


def test_cli_dry_run_lists_units_and_runs_nothing(tmp_path, capsys):
    import argparse

    base = write_base(tmp_path)
    m = write_matrix(tmp_path, f"name: cli\nbase: {base}\naxes: {{gpu_type: [H100, H200]}}\n")
    p = argparse.ArgumentParser()
    add_cli_arguments(p)
    assert (
        run_cli(
            p.parse_args([str(m), "--on", "ray", "--dry-run", "--results", str(tmp_path / "r")])
        )
        == 0
    )
    out = capsys.readouterr().out
    ids = [u.id for u in load_matrix(m).units]
    assert "units      2 (resources per unit: num_gpus=node, num_cpus=node)" in out
    assert f"  {ids[0]}: gpu_type=H100 sglang={SGLANG} config=mxbase.yaml" in out
    assert f"  {ids[1]}: gpu_type=H200" in out
    assert not (tmp_path / "r").exists()
    with pytest.raises(UsageError, match="--env-root and --no-ship-code are for --on ray"):
        run_cli(p.parse_args([str(m), "--env-root", "/x"]))


def fake_make(tmp_path: Path, monkeypatch, checkout: Path) -> Path:
    """A stand-in ``make`` on PATH: records its arguments in the returned file and makes
    ``$VENV/bin/python`` a script that prints ``checkout`` (what _install_checkout asks the venv's
    python: so nothing is installed anywhere) and an installed sglang ``$SGLANG`` (its package
    and METADATA) in the venv; fails with a pip line when MAKE_FAILS is set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    (bin_dir / "make").write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {calls}
        for a in "$@"; do case "$a" in VENV=*) v="${{a#VENV=}}";; SGLANG=*) p="${{a#SGLANG=}}";; esac; done
        [ -n "$MAKE_FAILS" ] && {{ echo "pip: no matching distribution"; exit 2; }}
        mkdir -p "$v/bin" && printf '#!/bin/sh\\necho {checkout}\\n' > "$v/bin/python"
        chmod +x "$v/bin/python"
        s="$v/lib/python3/site-packages"; mkdir -p "$s/sglang" "$s/sglang-$p.dist-info"
        touch "$s/sglang/__init__.py"
        printf 'Metadata-Version: 2.1\\nName: sglang\\nVersion: %s\\n' "$p" > "$s/sglang-$p.dist-info/METADATA"
        """)
    )
    (bin_dir / "make").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_prepare_python_modes(tmp_path, monkeypatch):
    """ "current", and "auto"/"make" when this interpreter holds the pin and imports this checkout,
    use this interpreter; otherwise the checkout's venv for the pin, then ("make") the node's venv
    under env_root; a missing one is exit 3 naming the path and size and builds nothing unless
    build_envs (then `make -C <checkout> setup SGLANG=<pin> VENV=<venv>` under a lock); a failing
    setup is exit 3 with the output's tail. The checkout is a folder made here, so no shared venv
    is ever touched."""
    from patchbench.envs import envinfo
    from patchbench.envs import nodes as envs

    log = open(tmp_path / "log.txt", "w")
    spec = {"sglang": SGLANG}
    for mode in ("current", "auto", "make"):
        assert prepare_python({**spec, "env_setup": mode}, REPO_ROOT, log) == sys.executable
    co = tmp_path / "checkout"
    co.mkdir()
    calls = fake_make(tmp_path, monkeypatch, co.resolve())
    root = tmp_path / "envs"
    make = {**spec, "env_setup": "make", "env_root": str(root)}
    # this interpreter does not import the checkout's suites: a venv is needed, none exists
    plan = envs.plan_env(make, co)
    assert (plan.source, plan.path, plan.expected_gb) == (
        "build",
        str(root / f"sglang-{SGLANG}"),
        9,
    )
    assert envs.plan_env({**spec, "env_setup": "auto"}, co).path == str(
        envinfo.venv_dir(SGLANG, co)
    )
    with pytest.raises(EnvironmentNotReady) as ei:
        prepare_python(make, co, log)
    msg = str(ei.value)
    assert f"sglang {SGLANG} on {envs.node_name()} at {root / f'sglang-{SGLANG}'}" in msg
    assert "about 9 GB" in msg and "nothing is built without --build-envs" in msg
    assert ei.value.exit_code == 3 and not calls.exists() and not root.exists()
    got = prepare_python({**make, "build_envs": True}, co, log)
    assert got == str(root / f"sglang-{SGLANG}" / "bin" / "python")
    venv = root / f"sglang-{SGLANG}"
    assert calls.read_text().split() == ["-C", str(co), "setup", f"SGLANG={SGLANG}", f"VENV={venv}"]
    assert (root / f".lock-sglang-{SGLANG}").exists()
    # an existing venv that holds the pin is refreshed (make setup is idempotent) without
    # build_envs; the checkout's own venv comes first
    assert prepare_python(make, co, log) == got
    own = envinfo.venv_dir(SGLANG, co)
    (own / "bin").mkdir(parents=True)
    assert envs.plan_env(make, co).source == "env_root"  # the own venv lacks the pin
    (own / "bin" / "python").symlink_to(venv / "bin" / "python")
    (own / "lib").symlink_to(venv / "lib")
    assert envs.plan_env(make, co).source == "checkout"
    assert prepare_python(make, co, log) == str(own / "bin" / "python")
    assert calls.read_text().split()[-1] == f"VENV={own}"
    monkeypatch.setenv("MAKE_FAILS", "1")
    with pytest.raises(
        EnvironmentNotReady,
        match=r"setting up sglang .* failed \(exit 2\).*"
        r"no matching distribution",
    ):
        prepare_python(make, co, log)


def test_a_matrix_that_would_build_an_environment_is_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys
):
    """The plan is announced (log, --dry-run) and a missing environment stops the matrix with
    exit 3 before any unit runs or a run folder is made; this interpreter holds the pin and
    imports this checkout, so it is the plan without the stand-ins."""
    import argparse

    from patchbench.envs import nodes as envs

    base = write_base(tmp_path)
    m = write_matrix(tmp_path, f"name: envs\nbase: {base}\naxes: {{gpu_type: [A]}}\n")
    monkeypatch.setattr(envs, "_interpreter_facts", lambda python: (None, None))
    monkeypatch.setattr(envs, "venv_dir", lambda pin, workdir: tmp_path / "no-venv")
    lines: list[str] = []
    ex = LocalExecutor(command=FAKE_COMMAND)
    with pytest.raises(EnvironmentNotReady, match="1 environment.s. would be built") as ei:
        run_matrix(m, executor=ex, results=tmp_path / "r", log=lines.append)
    assert ei.value.exit_code == 3 and not (tmp_path / "r").exists()
    assert lines == [
        f"environment: sglang {SGLANG} on {envs.node_name()}: MISSING: would build "
        f"{tmp_path / 'no-venv'} (about 9 GB)"
    ]
    p = argparse.ArgumentParser()
    add_cli_arguments(p)
    assert run_cli(p.parse_args([str(m), "--dry-run"])) == 0
    out = capsys.readouterr().out
    assert f"MISSING: would build {tmp_path / 'no-venv'} (about 9 GB)" in out
    assert "a missing environment is built only with --build-envs" in out
    monkeypatch.undo()
    plan = LocalExecutor().plan_envs(load_matrix(m).units)
    assert [(p.pin, p.source, p.path) for p in plan] == [(SGLANG, "interpreter", sys.executable)]


def test_queue_split_and_driver_overhead():
    """A start delay splits at the last end of another unit of the node that lies between
    submission and start: before it the unit queued, after it Ray dispatched it; the driver's
    overhead leaves the queueing out (an older matrix.json without the split counts start_delay
    whole)."""
    from patchbench.matrix.executors import queue_split
    from patchbench.matrix.report import driver_overhead_s

    assert queue_split(100.0, 100.4, []) == (0.0, 0.4)
    assert queue_split(100.0, 130.5, [99.0, 130.0, 131.0]) == (30.0, 0.5)
    t = {"start_delay": 30.5, "queued": 30.0, "dispatch": 0.5, "return_delay": 0.25, "get": 0.25}
    assert driver_overhead_s(t) == 1.0
    assert driver_overhead_s({"start_delay": 30.5, "get": 0.5}) == 31.0


def test_unit_workdir_is_the_drivers_checkout_on_the_drivers_machine(tmp_path, monkeypatch):
    from patchbench.envs.nodes import machine_key
    from patchbench.matrix.execute import unit_workdir

    monkeypatch.chdir(tmp_path)
    home = {"path": str(REPO_ROOT), "machine": machine_key()}
    assert unit_workdir({"workdir": "cwd", "checkout": home}) == REPO_ROOT
    other = {**home, "machine": "elsewhere/0"}
    assert unit_workdir({"workdir": "cwd", "checkout": other}) == tmp_path
    assert unit_workdir({"workdir": None}) == REPO_ROOT


def test_is_matrix_file_tells_a_matrix_from_a_config(tmp_path):
    base = write_base(tmp_path)
    m = write_matrix(tmp_path, f"name: a\nbase: {base}\naxes: {{gpu_type: [A]}}\n")
    assert is_matrix_file(m) is True
    assert is_matrix_file(base) is False


def test_matrix_report_of_sweep_units_has_per_point_rows_and_curve_metrics(tmp_path):
    """Units with a load sweep (synthetic run folders): the curve metrics are columns of the
    main table, the per-point primaries one row per (unit, variant, point) in "Load curves"."""
    from patchbench.analysis.build import build_comparison
    from patchbench.analysis.comparison import write_comparison
    from patchbench.matrix.record import MatrixRecord, UnitRecord, write_matrix_record
    from patchbench.matrix.report import write_matrix_report
    from tests.synthetic import make_run, make_sweep_run

    d = tmp_path / "m"
    d.mkdir()
    runs = {
        "flat": make_sweep_run(d, run_id="flat", points=(1, 16)),
        "low-load": make_sweep_run(d, run_id="low-load", gains={"c1": 1.15}, points=(1, 4, 16)),
        "one-point": make_run(
            d,
            run_id="one-point",
            metrics={
                "serving": {
                    "output_throughput_tok_s": {
                        "baseline": [100.0, 101.0, 99.0],
                        "patched": [100.0, 101.0, 99.0],
                    }
                }
            },
        ),
    }
    for run in runs.values():
        write_comparison(run, build_comparison(run))
    units = [UnitRecord(id=u, labels={"case": u}, status="ok", exit_code=0) for u in runs]
    write_matrix_record(
        d, MatrixRecord(name="sweeps", executor="local", axes=["case"], units=units)
    )
    text = write_matrix_report(d).read_text()
    head = next(x for x in text.splitlines() if x.startswith("| unit | gpu type"))
    assert "serving.goodput_at_slo_req_s" in head and "serving.max_concurrency_at_slo_count" in head
    assert "@" not in head  # per-point primaries are not columns
    assert "serving.output_throughput_tok_s |" in head  # the single-point unit's primary
    assert "## Load curves" in text
    assert (
        "| unit | variant | point | serving.output_throughput_tok_s | serving.itl_median_ms |"
        in text
    )
    rows = [
        x for x in text.splitlines() if x.startswith(("| low-load | patched", "| flat | patched"))
    ]
    assert [x.split(" | ")[2] for x in rows] == ["c1", "c16", "c1", "c4", "c16"]  # load order
    assert rows[2].startswith("| low-load | patched | c1 | **improved** +")
    assert not any(x.startswith("| one-point | patched | c") for x in text.splitlines())
    assert (d / "plots" / "matrix-effect.png").stat().st_size > 1000
