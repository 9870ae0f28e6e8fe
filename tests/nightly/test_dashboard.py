"""The nightly dashboard (patchbench/nightly/dashboard.py): the site's data on a synthetic history, and every
page in a real headless Chromium (Selenium; the Debian packages chromium and chromium-driver,
installed by ``make setup-browser``, which ``make test`` runs). Where the browser is missing the
browser test FAILS, naming the setup to run; it never skips.

The demo history (tests.nightly.demo_history): ``nightly-cpu``, 12 nights, the release changes
at night 7 with stock 8 % slower from then on (a change point), the last night red;
``nightly-cpu-small``, 3 green nights, the oldest one's run folder deleted.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import sqlite3
import sys
import threading
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest

from patchbench.cli import main
from patchbench.nightly.dashboard import build_site, slug
from patchbench.nightly.history import (
    night_builds_of,
    night_infos,
    open_history,
    read_change_points,
)
from tests.nightly import browser
from tests.nightly.demo_history import TPUT, build_demo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RED_RUN = "20260112T030000Z-nightly-cpu"
GONE_RUN = "20260101T030000Z-nightly-cpu-small"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(history path, site folder, SiteSummary) of the demo, built once for the module."""
    root = tmp_path_factory.mktemp("dashboard")
    hist = build_demo(root)
    site = root / "site"
    assert main(["dashboard", str(hist), "--out", str(site)]) == 0
    return hist, site, build_site(hist, site)


def _hrefs(page: Path) -> list[str]:
    """Every href / src of ``page`` but inline ``data:`` URLs (the empty favicon)."""
    refs = re.findall(r'(?:href|src)="([^"]+)"', page.read_text())
    return [r for r in refs if not r.startswith("data:")]


def test_site_data_values_change_points_red_nights_and_links(demo):
    hist, site, s = demo
    with open_history(hist) as h:
        cps = [c for c in read_change_points(h, "nightly-cpu") if c["metric"] == TPUT]
    assert cps and any(c["run_id"] == "20260107T030000Z-nightly-cpu" for c in cps)
    assert s.charts == {
        "chart-nightly-cpu-0": {
            "baseline": 12,
            "patched": 12,
            "red night": 1,
            "change point": len(cps),
        },
        "chart-nightly-cpu-small-0": {"baseline": 3, "patched": 3},
    }
    assert s.nights_gone == [GONE_RUN] and len(s.nights_copied) == 14
    assert (site / "assets/plotly.min.js").stat().st_size > 1_000_000
    index = (site / "index.html").read_text()
    row = re.search(r'<tr data-config="nightly-cpu">.*?</tr>', index, re.S).group(0)
    assert 'data-outcome="red"' in row and "0.5.23" in row and "patched: applies (verified)" in row
    assert f"nights/{RED_RUN}/nightly.html" in row and "-10." in row
    small = (site / "configs/nightly-cpu-small.html").read_text()
    assert f"{GONE_RUN} <span" in small and "run folder gone" in small
    assert f"nights/{slug(GONE_RUN)}/" not in small
    page = (site / "configs/nightly-cpu.html").read_text()
    assert page.count('src="../assets/plotly.min.js"') == 1 and "cdn" not in page.lower()
    assert "sglang 0.5.23" in page  # the release change's marker
    # every relative link of every page resolves inside the site
    for p in site.rglob("*.html"):
        for ref in _hrefs(p):
            assert not re.match(r"^[a-z]+:", ref), (p, ref)
            assert (p.parent / ref.split("#")[0]).resolve().is_file(), (p, ref)
            assert site.resolve() in (p.parent / ref).resolve().parents, (p, ref)
    # a night's report: nightly.md rendered, its link to report.md points at report.html
    night = (site / f"nights/{RED_RUN}/nightly.html").read_text()
    assert '<a href="report.html">report.md</a>' in night and "<table>" in night


def test_night_builds_read_defensively(demo, tmp_path):
    hist, _site, _s = demo
    with open_history(hist) as h:
        assert [b["state"] for b in night_builds_of(h, RED_RUN)] == ["", "applies"]
        assert night_builds_of(h, "no-such-night") == []
    old = tmp_path / "old.sqlite"
    shutil.copy(hist, old)
    con = sqlite3.connect(old)
    con.execute("DROP TABLE night_builds")
    con.commit()
    con.close()
    with open_history(old) as h:
        assert night_builds_of(h, RED_RUN) == []
        n = night_infos(h, "nightly-cpu")[-1]
        assert (n.release, n.patch_state, n.outcome) == ("0.5.23", "", "red")
    s = build_site(old, tmp_path / "site")
    assert s.charts["chart-nightly-cpu-0"]["red night"] == 1


def test_a_kept_site_keeps_the_report_of_a_night_whose_folder_is_gone(demo, tmp_path):
    hist, _site, _s = demo
    old = tmp_path / "h.sqlite"
    shutil.copy(hist, old)
    moved = tmp_path / "runs" / RED_RUN
    shutil.copytree(hist.parent / "runs" / RED_RUN, moved)
    con = sqlite3.connect(old)
    con.execute("UPDATE nights SET run_dir = ? WHERE run_id = ?", (str(moved), RED_RUN))
    con.commit()
    con.close()
    site = tmp_path / "site"
    assert RED_RUN in build_site(old, site).nights_copied
    shutil.rmtree(moved)
    s = build_site(old, site)
    assert s.nights_kept == [RED_RUN] and (site / f"nights/{RED_RUN}/nightly.html").is_file()
    assert (
        f'href="../nights/{RED_RUN}/nightly.html"'
        in (site / "configs/nightly-cpu.html").read_text()
    )
    s = build_site(old, tmp_path / "fresh")  # no earlier copy: named as gone, no link
    assert (
        RED_RUN in s.nights_gone
        and f"nights/{RED_RUN}" not in (tmp_path / "fresh/configs/nightly-cpu.html").read_text()
    )


def test_site_from_nights_the_nightly_job_wrote(tmp_path):
    """The page reads what patchbench.nightly writes: two green nights, then a red one."""
    from patchbench.nightly.job import nightly_on_run
    from tests.nightly.test_nightly import JOB, clean, make_night

    h = tmp_path / "h.sqlite"
    for day in (1, 2):
        assert nightly_on_run(make_night(tmp_path, day, *clean(day)), JOB, history=h).exit_code == 0
    red = make_night(tmp_path, 3, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    assert nightly_on_run(red, JOB, history=h).exit_code == 1
    s = build_site(h, tmp_path / "site")
    assert s.charts == {"chart-nightly-test-0": {"baseline": 3, "patched": 3, "red night": 1}}
    index = (tmp_path / "site/index.html").read_text()
    assert 'data-outcome="red"' in index and f"serving.{TPUT} (patched, same_run) -10.0 %" in index
    page = tmp_path / "site/nights" / red.name
    assert (page / "nightly.html").is_file() and (
        page / "plots" / f"nightly-serving.{TPUT}.png"
    ).is_file()


def test_reports_render_without_raw_html_or_links_out_of_the_copy(tmp_path):
    from patchbench.nightly.dashboard import _md_to_html

    got = _md_to_html(
        "<script>x()</script>\n\n[r](report.md) [up](../../../../etc/hostname) "
        "![a](plots/a.png) ![b](plots/b.png) ![c](plots/../plots/a.png)",
        {"report.html", "plots/a.png"},
    )
    assert "<script>" not in got and '<a href="report.html">r</a>' in got
    assert " up " in got and "hostname" not in got
    assert '<img src="plots/a.png"' in got and '<span class="gone">[b]</span>' in got
    assert '<img src="plots/../plots/a.png"' in got


def test_dashboard_usage_errors(tmp_path, capsys):
    assert main(["dashboard", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "s")]) == 2
    assert "no such history file" in capsys.readouterr().err
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    assert main(["dashboard", str(bad), "--out", str(tmp_path / "s")]) == 3
    assert "Traceback" not in capsys.readouterr().err


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_every_page_in_headless_chromium(demo):
    """Every page loads without SEVERE console entries; every chart has its traces with the
    expected points; every link answers 200; the landing view shows the red config red."""
    why = browser.missing()
    if why:
        pytest.fail(f"the dashboard's browser test needs headless Chromium: {why}")
    _hist, site, s = demo
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser.start()
    try:
        checked: set[str] = set()
        for page in s.pages:
            driver.get(base + page)
            # a loaded machine (pytest-xdist's other worker) once read a page before its
            # charts were there: wait (up to 60 s) until the page is complete with its charts
            n_charts = sum(1 for c in s.charts if page == _page_of(c))
            WebDriverWait(driver, 60).until(
                lambda d, n=n_charts: (
                    d.execute_script("return document.readyState") == "complete"
                    and len(d.find_elements("css selector", "div.chart")) == n
                )
            )
            charts = driver.execute_script(
                "return Array.from(document.querySelectorAll('div.chart')).map(d => [d.id,"
                " (d.data || []).map(t => [t.name, t.x.length, t.y.length]),"
                " d.querySelectorAll('.main-svg .scatterlayer .trace').length])"
            )
            for div_id, traces, drawn in charts:
                want = s.charts[div_id]
                assert {n: nx for n, nx, _ny in traces} == want, (page, div_id)
                assert all(nx == ny for _n, nx, ny in traces)
                assert drawn == len(want), (page, div_id, drawn)  # plotly drew every trace
            assert len(charts) == n_charts
            severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert severe == [], (page, severe)
            for a in driver.find_elements("css selector", "a[href]"):
                href = a.get_attribute("href")
                if href in checked:
                    continue
                checked.add(href)
                assert urlparse(href).netloc == urlparse(base).netloc, (page, href)
                status = driver.execute_script(
                    "var r = new XMLHttpRequest(); r.open('HEAD', arguments[0], false);"
                    " r.send(); return r.status;",
                    href,
                )
                assert status == 200, (page, href)
        driver.get(base + "index.html")
        row = driver.find_element("css selector", 'tr[data-config="nightly-cpu"] .badge')
        assert row.text == "red"
        assert row.value_of_css_property("background-color") == "rgba(207, 34, 46, 1)"
        green = driver.find_element("css selector", 'tr[data-config="nightly-cpu-small"] .badge')
        assert green.text == "green"
        assert urljoin(base, "index.html") == driver.current_url
    finally:
        driver.quit()
        server.shutdown()


def _page_of(div_id: str) -> str:
    return "configs/" + div_id.removeprefix("chart-").rsplit("-", 1)[0] + ".html"


def _own_copy(hist: Path, tmp_path: Path, run_id: str) -> tuple[Path, Path]:
    """A copy of the demo history whose night ``run_id`` points at a copy of its run folder
    (this test's to change); (history, run folder)."""
    h = tmp_path / "h.sqlite"
    shutil.copy(hist, h)
    run = tmp_path / "runs" / run_id
    shutil.copytree(hist.parent / "runs" / run_id, run)
    con = sqlite3.connect(h)
    con.execute("UPDATE nights SET run_dir = ? WHERE run_id = ?", (str(run), run_id))
    con.commit()
    con.close()
    return h, run


def test_links_in_a_run_folder_are_never_followed_into_the_site(demo, tmp_path, capsys):
    """A report-details.md linked to a file outside the run folder (as /etc/passwd), a plot
    linked out and a plots folder that is a link are left out with a note, never copied."""
    hist, _site, _s = demo
    h, run = _own_copy(hist, tmp_path, RED_RUN)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:SECRET-4711\n")
    (run / "report-details.md").unlink(missing_ok=True)
    (run / "report-details.md").symlink_to(secret)
    (run / "plots").mkdir(exist_ok=True)
    (run / "plots/leak.png").symlink_to(secret)
    (run / "plots/ok.png").write_bytes(b"\x89PNG fine")
    site = tmp_path / "site"
    assert main(["dashboard", str(h), "--out", str(site)]) == 0
    out = capsys.readouterr().out
    assert "report-details.md left out: a symbolic link (never followed)" in out
    assert "leak.png left out: a symbolic link (never followed)" in out
    night = site / "nights" / RED_RUN
    assert sorted(p.name for p in (night / "plots").iterdir()) == ["ok.png"]
    assert not (night / "report-details.md").exists()
    assert not any(b"SECRET-4711" in p.read_bytes() for p in site.rglob("*") if p.is_file())
    # a plots folder that is itself a link out of the run folder
    shutil.rmtree(run / "plots")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(secret, outside / "x.png")
    (run / "plots").symlink_to(outside)
    s = build_site(h, site)
    assert any(n.endswith("plots left out: a symbolic link (never followed)") for n in s.notes)
    assert not (night / "plots").exists()  # the earlier build's ok.png is gone with its night
    assert not any(b"SECRET-4711" in p.read_bytes() for p in site.rglob("*") if p.is_file())


def test_a_folder_the_dashboard_did_not_write_is_refused_and_only_its_files_are_cleaned(
    demo, tmp_path, capsys
):
    hist, _site, _s = demo
    theirs = tmp_path / "theirs"
    (theirs / "configs").mkdir(parents=True)
    (theirs / "configs/mine.html").write_text("keep me")
    assert main(["dashboard", str(hist), "--out", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert "site folder refused (exit 2)" in err and ".patchbench-dashboard" in err
    assert [p.name for p in theirs.rglob("*")] == ["configs", "mine.html"]  # untouched
    # the dashboard's own folder: files it did not write stay; a file it wrote and no longer
    # writes goes
    site = tmp_path / "site"
    build_site(hist, site)
    marker = json.loads((site / ".patchbench-dashboard").read_text())
    assert "index.html" in marker["files"] and "assets/plotly.min.js" in marker["files"]
    assert f"nights/{RED_RUN}/nightly.html" in marker["files"]
    (site / "configs/mine.html").write_text("keep me")
    (site / "nights/not-a-night").mkdir()
    (site / "nights/not-a-night/notes.txt").write_text("keep me too")
    (site / "configs/gone-config.html").write_text("old page")
    marker["files"].append("configs/gone-config.html")
    marker["files"].append("../outside.txt")  # a tampered marker names nothing outside
    (tmp_path / "outside.txt").write_text("not the site's")
    (site / ".patchbench-dashboard").write_text(json.dumps(marker))
    build_site(hist, site)
    assert (site / "configs/mine.html").read_text() == "keep me"
    assert (site / "nights/not-a-night/notes.txt").read_text() == "keep me too"
    assert not (site / "configs/gone-config.html").exists()
    assert (tmp_path / "outside.txt").is_file()
    # a site written before markers (only the site's own entries) is adopted
    (site / ".patchbench-dashboard").unlink()
    assert build_site(hist, site).pages[0] == "index.html"
    assert (site / ".patchbench-dashboard").is_file()


def test_a_run_id_that_is_no_folder_name_is_refused_at_record_and_left_out_of_the_page(
    demo, tmp_path, capsys
):
    """A run id of ``..`` once made the next build delete the whole site (exit 70)."""
    from patchbench.nightly.history import History, RunIdRefused, night_from_run
    from patchbench.nightly.job import record_only

    hist, _site, _s = demo
    h, run = _own_copy(hist, tmp_path, RED_RUN)
    night = night_from_run(run)
    for bad in ("..", ".", "a/b", "", "x@..", "x@"):
        night.run_id = bad
        with History(h) as hh, pytest.raises(RunIdRefused) as e:
            hh.record(night)
        assert e.value.exit_code == 2
    cmp = (
        json.loads((run / "compare.json").read_text()) if (run / "compare.json").is_file() else None
    )
    man = json.loads((run / "manifest.json").read_text())
    man["run_id"] = ".."
    (run / "manifest.json").write_text(json.dumps(man))
    if cmp is not None:
        cmp["run_id"] = ".."
        (run / "compare.json").write_text(json.dumps(cmp))
    assert record_only(run, tmp_path / "new.sqlite") == 2
    assert "run id refused (exit 2)" in capsys.readouterr().err
    # a history that already holds one (written before the check): the build leaves it out
    con = sqlite3.connect(h)
    con.execute("UPDATE nights SET run_id = '..' WHERE run_id = ?", (RED_RUN,))
    con.commit()
    con.close()
    site = tmp_path / "site"
    build_site(h, site)
    s = build_site(h, site)  # the second build deleted the whole site before
    assert (site / "index.html").is_file() and (site / ".patchbench-dashboard").is_file()
    assert (
        s.notes
        == [
            "night '..' (nightly-cpu) left out: its run id cannot name a folder: use letters, "
            "digits, '.', '_', '-' (starting with a letter or digit)"
        ]
        * 1
    )
    assert len(s.nights_copied) == 13


def test_night_links_evidence_no_runner_paths_and_a_lean_bundle(demo):
    """Each night links its A/B report and figures; no page holds the runner's absolute
    paths (the demo's tmp folder); the plotly bundle is the partial one."""
    from patchbench.nightly.dashboard import plotly_bundle

    hist, site, _s = demo
    page = (site / "configs/nightly-cpu.html").read_text()
    assert f'href="../nights/{RED_RUN}/report.html">A/B report</a>' in page
    assert 'class="toc"' in page
    assert "higher is better" in page and "change vs reference [%]" in page
    index = (site / "index.html").read_text()
    row = re.search(r'<tr data-config="nightly-cpu">.*?</tr>', index, re.S).group(0)
    assert f'href="nights/{RED_RUN}/report.html">A/B report</a>' in row
    tmp = str(hist.parent.resolve())
    leaks = [p for p in site.rglob("*") if p.is_file() and tmp.encode() in p.read_bytes()]
    assert leaks == []
    assert plotly_bundle()[1] == "basic"
    assert (site / "assets/plotly.min.js").stat().st_size < 1_500_000


def test_a_night_row_names_its_machine_short_with_the_whole_identity_on_hover():
    from patchbench.nightly.dashboard import short_machine

    gpu = "NVIDIA H200 [GPU-0a1b2c3d-1111-2222-3333-444455556666, GPU-ffff0000-1111-2222-3333-4]"
    assert short_machine(gpu) == "NVIDIA H200 [GPU-0a1b2c3d…" + " +1]"
    assert short_machine("Intel Xeon on runner-7") == "Intel Xeon on runner-7"
    assert short_machine(None) == "unknown"
    assert len(short_machine("x" * 60)) == 48


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_config_page_screenshot_shows_the_chart_the_red_ring_and_the_new_red(tmp_path):
    """The config page of a history the nightly job wrote (tests.nightly.scenarios: stock 10 %
    slower since a release change, red since; tonight the patched variant 2.5x slower), as
    Chromium paints it: a PNG of the viewport's size; the plot area is not blank; the red
    ring's colour (#cf222e) lies on a ring of radius 6 to 10 px around tonight's point, where
    plotly's own axes put it, and not around the first night's; the story's "new tonight" line
    is above the fold."""
    import io

    import numpy as np
    from PIL import Image

    from tests.nightly.scenarios import CONFIG, build_scenario

    why = browser.missing()
    if why:
        pytest.fail(f"the dashboard's browser test needs headless Chromium: {why}")
    build_site(build_scenario(tmp_path, "new-while-red", nights=12), tmp_path / "site")
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser.start(1200, 900)
    try:
        driver.get((tmp_path / "site/configs" / f"{CONFIG}.html").as_uri())
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return !!document.querySelector('div.chart .main-svg')")
        )
        geo = driver.execute_script(
            "var d = document.querySelector('div.chart'), r = d.getBoundingClientRect(),"
            " L = d._fullLayout, s = L._size, t = d.data.find(t => t.name === 'red night'),"
            " b = d.data[0], at = (x, y) => [r.left + s.l + L.xaxis.d2p(x),"
            " r.top + s.t + L.yaxis.d2p(y)], st = document.querySelector('[data-story]');"
            " return {view: [innerWidth, innerHeight, devicePixelRatio],"
            " plot: [r.left + s.l, r.top + s.t, s.w, s.h],"
            " ring: at(t.x[t.x.length - 1], t.y[t.y.length - 1]), first: at(b.x[0], b.y[0]),"
            " story: [st.textContent, st.getBoundingClientRect().top,"
            " st.getBoundingClientRect().bottom]};"
        )
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    w, h, dpr = geo["view"]
    assert img.shape == (round(h * dpr), round(w * dpr), 3)
    x0, y0, pw, ph = (round(v * dpr) for v in geo["plot"])
    assert y0 + ph <= img.shape[0], "the plot area is below the fold"
    assert img[y0 : y0 + ph, x0 : x0 + pw].std() > 10  # a white plot area has 0

    def red_on_ring(cx: float, cy: float) -> int:
        yy, xx = np.mgrid[0 : img.shape[0], 0 : img.shape[1]]
        r = np.hypot(xx - cx * dpr, yy - cy * dpr)
        ring = (r >= 6 * dpr) & (r <= 10 * dpr)
        red = (abs(img - np.array([0xCF, 0x22, 0x2E])) <= 40).all(axis=2)
        return int((ring & red).sum())

    assert red_on_ring(*geo["ring"]) >= 20
    assert red_on_ring(*geo["first"]) == 0
    text, top, bottom = geo["story"]
    assert "new tonight" in text and 0 <= top and bottom <= h
