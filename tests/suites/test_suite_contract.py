"""The suite contract end to end: a suite written in a temporary folder, registered only through
the public contract (``patchbench.suite.register`` in a module named by
``PATCHBENCH_SUITE_MODULES``), runs through ``bench`` against the fake server and shows up in
compare.json (its rows and its pair hook's dict), report.md (its report section) and the plots
(its plot), without any file of patchbench or of the built-in suites naming it.

Also: the built-in suites' hooks on hand-made MMMU records (the MMMU suite's pair over repeats,
report section and plot)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import textwrap
from pathlib import Path

import pytest

from patchbench import suite as suite_mod

FAKE = Path(__file__).parent.parent / "fake_server"
SGLANG = importlib.metadata.version("sglang")
REPO = Path(__file__).resolve().parents[2]

ECHO = '''
"""A trivial suite: n /generate calls, texts kept; pairs texts by index."""
import json
import time
import urllib.request
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from patchbench.records import read_json, write_json
from patchbench.suite import MetricInfo, Suite, SuiteResult, register, suite_pairs


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 3


@register
class EchoSuite(Suite):
    name = "echo"
    Params = Params
    metrics = {"echo_wall_ms": MetricInfo("lower", "ms", "wall time", primary=True, kind="run",
                                          margin=50.0),
               "echo_requests_count": MetricInfo("none", "count", kind="descriptive")}

    def run(self, ctx, params):
        texts = []
        t0 = time.monotonic()
        for i in range(params.n):
            req = urllib.request.Request(ctx.server.base_url + "/generate",
                                         data=json.dumps({"text": f"echo {i}"}).encode(),
                                         headers={"Content-Type": "application/json"})
            texts.append(json.loads(urllib.request.urlopen(req, timeout=10).read()).get("text", ""))
        write_json(ctx.out_dir / "texts.json", texts)
        return SuiteResult(metrics={"echo_wall_ms": 1000 * (time.monotonic() - t0) + 1.0,
                                    "echo_requests_count": float(params.n)})

    def pair(self, baseline_dirs, variant_dirs, params):
        same = n = 0
        for a, b in zip(baseline_dirs, variant_dirs):
            ta, tb = read_json(Path(a) / "texts.json"), read_json(Path(b) / "texts.json")
            n += len(ta)
            same += sum(x == y for x, y in zip(ta, tb))
        return {"echo_identical": same, "echo_n": n, "repeats": len(baseline_dirs)}

    def report_section(self, comparison):
        out = ["## Echo paired", ""]
        for v, p in suite_pairs(comparison, "echo").items():
            out.append(f"- ECHO-SECTION {v}: {p['echo_identical']}/{p['echo_n']} identical "
                       f"over {p['repeats']} repeats")
        return out + [""]

    def plots(self, comparison, out_dir):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        pairs = suite_pairs(comparison, "echo")
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.bar(list(pairs), [p["echo_identical"] for p in pairs.values()])
        out = Path(out_dir) / "echo_identical.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
        plt.close(fig)
        return [out]
'''

CONFIG = """\
    name: contract-test
    sglang: "@SGLANG@"
    model: {path: "@MODEL@"}
    server: {port: 31995, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2, flush_pause_s: 0.1}
    variants:
      baseline: []
      control: [null-comment]
    schedule: {repeats: 3}
    suites:
      echo: {n: 3}
"""


@pytest.fixture
def echo_suite(tmp_path, monkeypatch):
    """The echo suite module in tmp_path, named by PATCHBENCH_SUITE_MODULES; unregistered after."""
    mod_dir = tmp_path / "plugins"
    mod_dir.mkdir()
    (mod_dir / "pb_echo_suite.py").write_text(ECHO)
    monkeypatch.syspath_prepend(str(mod_dir))
    monkeypatch.setenv("PATCHBENCH_SUITE_MODULES", "pb_echo_suite")
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(mod_dir)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    yield
    suite_mod._REGISTRY.pop("echo", None)
    suite_mod._INSTANCES.pop("echo", None)
    import sys

    sys.modules.pop("pb_echo_suite", None)


def test_echo_suite_registered_through_the_environment(echo_suite):
    assert "echo" in suite_mod.suite_names()
    s = suite_mod.get_suite("echo")
    assert s.metrics["echo_wall_ms"].primary and s.Params().n == 3


def test_builtin_suites_are_their_folders():
    folders = {
        d.name for d in (REPO / "patchbench" / "suites").iterdir() if (d / "__init__.py").is_file()
    }
    assert folders == {"mmmu", "profile", "serving", "sync_probe", "traffic"}
    assert folders <= set(suite_mod.suite_names())


def test_a_new_suite_folder_is_found_without_a_core_change(tmp_path, monkeypatch):
    """A folder added to patchbench.suites is a suite: found by its name, imported on first use."""
    import sys

    import patchbench.suites

    (tmp_path / "folder_echo").mkdir()
    (tmp_path / "folder_echo" / "__init__.py").write_text(
        "from pydantic import BaseModel\n"
        "from patchbench.suite import Suite, register\n\n\n"
        "@register\nclass FolderEcho(Suite):\n"
        "    name = 'folder_echo'\n    Params = BaseModel\n"
    )
    monkeypatch.setattr(patchbench.suites, "__path__", [*patchbench.suites.__path__, str(tmp_path)])
    try:
        assert "folder_echo" in suite_mod.suite_names()
        assert "patchbench.suites.folder_echo" not in sys.modules
        assert type(suite_mod.get_suite("folder_echo")).__name__ == "FolderEcho"
    finally:
        suite_mod._REGISTRY.pop("folder_echo", None)
        suite_mod._INSTANCES.pop("folder_echo", None)
        sys.modules.pop("patchbench.suites.folder_echo", None)
    with pytest.raises(KeyError, match="unknown suite 'nope'; allowed: ") as e:
        suite_mod.get_suite("nope")
    allowed = str(e.value).strip("\"'").split("allowed: ")[1].split(", ")
    assert {"folder_echo", "mmmu", "profile", "serving", "sync_probe"} <= set(allowed)


def test_no_core_file_names_the_echo_suite():
    hits = [
        p
        for p in list((REPO / "patchbench").rglob("*.py"))
        if "echo_identical" in p.read_text(encoding="utf-8")
        or "EchoSuite" in p.read_text(encoding="utf-8")
    ]
    assert hits == []


def test_echo_suite_through_bench_appears_in_compare_report_and_plots(
    echo_suite, tmp_path, monkeypatch
):
    from patchbench.run import bench, cell

    real = cell.launch_spec

    def launch_spec(cfg, venv, cdir, port):
        spec = real(cfg, venv, cdir, port)
        spec.env["PYTHONPATH"] = str(FAKE) + os.pathsep + spec.env["PYTHONPATH"]
        return spec

    monkeypatch.setattr(cell, "launch_spec", launch_spec)
    model = tmp_path / "model"
    model.mkdir()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        textwrap.dedent(CONFIG).replace("@MODEL@", str(model)).replace("@SGLANG@", SGLANG)
    )
    run_dir = bench.run_bench(cfg, results_root=tmp_path / "results")
    cmp = json.loads((run_dir / "compare.json").read_text())
    # the pair hook's dict, as returned, over the 3 paired repeats of 3 requests each
    assert cmp["pairs"]["echo"]["control"] == {"echo_identical": 9, "echo_n": 9, "repeats": 3}
    rows = {(r["suite"], r["metric"], r["variant"]): r for r in cmp["rows"]}
    row = rows["echo", "echo_wall_ms", "control"]
    assert row["primary"] is True and row["kind"] == "run" and row["n_pairs"] == 3
    assert rows["echo", "echo_requests_count", "control"]["kind"] == "descriptive"
    md = (run_dir / "report.md").read_text()
    assert "## Echo paired" in md
    assert "- ECHO-SECTION control: 9/9 identical over 3 repeats" in md
    png = run_dir / "plots" / "echo_identical.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a suite's plot is in the details file; report.md shows the PR figure and links the details
    assert "echo_identical.png" in (run_dir / "report-details.md").read_text()
    assert "echo_identical.png" not in md and "](report-details.md)" in md


# --------------------------------------------------------------------------- MMMU hooks


def _records(tmp: Path, name: str, rows: list[tuple[str, str, str]]) -> Path:
    """records.jsonl of one cell: (id, verdict, response) per question; same prompt/parser."""
    d = tmp / name
    d.mkdir(parents=True)
    with open(d / "records.jsonl", "w") as f:
        for qid, verdict, resp in rows:
            f.write(
                json.dumps(
                    {
                        "id": qid,
                        "subject": qid.split("_")[1],
                        "verdict": verdict,
                        "response": resp,
                        "prompt_sha256": "p" + qid,
                        "parser": "strict",
                        "parser_seed": None,
                        "sampling": {"t": 0},
                        "protocol": "pr",
                    }
                )
                + "\n"
            )
    return d


def test_mmmu_pair_averages_each_question_over_repeats(tmp_path):
    from patchbench.suite import get_suite

    ids = ["validation_Art_1", "validation_Art_2", "validation_Math_1", "validation_Math_2"]
    # repeat 0: Art_1 right->wrong, Math_1 wrong->right; repeat 1: only Art_1 right->wrong;
    # Math_2 failed in repeat 1 of the variant (left out of that repeat only)
    b0 = _records(
        tmp_path,
        "b0",
        [
            (ids[0], "correct", "A"),
            (ids[1], "correct", "B"),
            (ids[2], "wrong", "C"),
            (ids[3], "wrong", "D"),
        ],
    )
    v0 = _records(
        tmp_path,
        "v0",
        [
            (ids[0], "wrong", "X"),
            (ids[1], "correct", "B"),
            (ids[2], "correct", "Y"),
            (ids[3], "wrong", "D"),
        ],
    )
    b1 = _records(
        tmp_path,
        "b1",
        [
            (ids[0], "correct", "A"),
            (ids[1], "correct", "B"),
            (ids[2], "wrong", "C"),
            (ids[3], "wrong", "D"),
        ],
    )
    v1 = _records(
        tmp_path,
        "v1",
        [
            (ids[0], "wrong", "X"),
            (ids[1], "correct", "B"),
            (ids[2], "wrong", "C"),
            (ids[3], "failed", ""),
        ],
    )
    p = get_suite("mmmu").pair([b0, b1], [v0, v1], None)
    acc = p["accuracy"]["mmmu_overall_acc"]
    assert acc["ids"] == sorted(ids)
    # per question, averaged over its repeats: Art_1 1 -> 0, Art_2 1 -> 1, Math_1 0 -> 0.5, Math_2 0 -> 0
    assert acc["baseline"] == [1.0, 1.0, 0.0, 0.0] and acc["variant"] == [0.0, 1.0, 0.5, 0.0]
    assert p["right_to_wrong"] == 1.0 and p["wrong_to_right"] == 0.5
    assert p["n"] == 4 and p["repeats_used"] == 2
    assert p["acc_a"] == 0.5 and p["acc_b"] == 0.375
    # identical responses: repeat 0 2/4 (A/X, C/Y differ), repeat 1 2/3 (A/X differs; the failed
    # question left out) -> mean (1/2 + 2/3) / 2 = 7/12
    assert p["identical_share"] == pytest.approx(7 / 12)
    assert [(f["id"], f["subject"]) for f in p["flipped"]] == [(ids[0], "Art"), (ids[2], "Math")]
    assert (
        p["subjects"]["Art"]["right_to_wrong"] == 1.0
        and p["subjects"]["Math"]["wrong_to_right"] == 0.5
    )
    # McNemar on the rounded discordant counts [[2, 1], [0, 2]] (0.5 rounds to 0): exact p = 1.0
    assert p["mcnemar_p"] == pytest.approx(1.0)


def test_mmmu_pair_refuses_with_the_pairing_reason(tmp_path):
    from patchbench.suite import PairingRefused, get_suite

    b = _records(tmp_path, "b", [("validation_Art_1", "correct", "A")])
    v = _records(tmp_path, "v", [("validation_Art_2", "correct", "A")])
    with pytest.raises(PairingRefused, match="paired repeat 0: .*question lists differ"):
        get_suite("mmmu").pair([b], [v], None)


def test_mmmu_report_section_and_plot_from_the_comparison_only(tmp_path):
    from patchbench.suite import get_suite

    pair = {
        "repeats_used": 2,
        "n": 4,
        "acc_a": 0.5,
        "acc_b": 0.375,
        "right_to_wrong": 1.0,
        "wrong_to_right": 0.5,
        "flips": 2,
        "mcnemar_p": 1.0,
        "identical_share": 0.75,
        "subjects": {
            "Art": {
                "n": 2,
                "acc_a": 1.0,
                "acc_b": 0.5,
                "right_to_wrong": 1.0,
                "wrong_to_right": 0.0,
            },
            "Math": {
                "n": 2,
                "acc_a": 0.0,
                "acc_b": 0.25,
                "right_to_wrong": 0.0,
                "wrong_to_right": 0.5,
            },
        },
        "notes": [],
    }
    cmp = {
        "baseline": "base",
        "run_id": "r",
        "pairs": {"mmmu": {"patched": pair}},
        "refusals": {"mmmu": {"other": "paired repeat 0: prompts differ"}},
    }
    md = "\n".join(get_suite("mmmu").report_section(cmp))
    assert "| patched | 2 | 4 | 0.500 | 0.375 | 1 | 0.50 | 1 | 75.0% |" in md
    assert "| other | pairing refused: paired repeat 0: prompts differ |" in md
    assert "| Math | 2 | 0.000 | 0.250 | 0 | 0.50 |" in md
    paths = get_suite("mmmu").plots(cmp, tmp_path / "plots")
    assert [p.name for p in paths] == ["mmmu_subjects.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_builtin_declarations():
    from patchbench.suite import get_suite

    m = get_suite("mmmu").metrics
    assert [n for n, i in m.items() if i.primary] == ["mmmu_overall_acc"]
    assert m["mmmu_overall_acc"].kind == "accuracy" and m["mmmu_overall_acc"].margin == 2.0
    assert all(i.kind == "descriptive" for n, i in m.items() if n.endswith("_count"))
