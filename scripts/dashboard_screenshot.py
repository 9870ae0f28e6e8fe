#!/usr/bin/env python
"""Build a nightly history, render its site and save a screenshot of one config's page with
headless Chromium (tests/nightly/browser.py): the demo history (tests.nightly.demo_history), or
with ``--scenario`` one the nightly job wrote (tests.nightly.scenarios: stock-step, spike,
new-while-red), cropped from the page's title to the bottom of its first chart.

    PYTHONPATH=. .venv/bin/python scripts/dashboard_screenshot.py [--out docs/img/dashboard.png]
    PYTHONPATH=. .venv/bin/python scripts/dashboard_screenshot.py --scenario spike \\
        --out docs/img/nightly-spike.png [--page index.html] [--keep DIR]

``--keep DIR`` builds the history and the site in DIR and keeps them (open DIR/site/index.html).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from PIL import Image

from patchbench.nightly.dashboard import build_site
from tests.nightly.browser import start
from tests.nightly.demo_history import build_demo
from tests.nightly.scenarios import CONFIG, SCENARIOS, build_scenario

#: the top of the page's title to the bottom of its first chart, in CSS pixels
CROP_JS = (
    "var h = document.querySelector('h1').getBoundingClientRect();"
    "var c = document.querySelector('div.chart').getBoundingClientRect();"
    "return [h.top + window.scrollY, c.bottom + window.scrollY];"
)


def capture(page: Path, out: Path, *, crop: bool, width: int = 1200, height: int = 1100) -> Path:
    """Open ``page`` (a file) in headless Chromium once its charts are drawn, save a PNG at
    ``out`` (cropped to the title and the first chart with ``crop``), optimised by Pillow."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = start(width, height)
    try:
        driver.get(page.resolve().as_uri())
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script(
                "return document.readyState === 'complete' && "
                "document.querySelectorAll('div.chart').length === "
                "document.querySelectorAll('div.chart .main-svg').length"
            )
        )
        crop = crop and bool(driver.execute_script("return !!document.querySelector('div.chart')"))
        top, bottom = driver.execute_script(CROP_JS) if crop else (0, height)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
    img = Image.open(out)
    if crop:
        img = img.crop((0, max(int(top) - 8, 0), img.width, min(int(bottom) + 8, img.height)))
    img.convert("RGB").save(out, optimize=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", default="docs/img/dashboard.png", help="the PNG to write")
    ap.add_argument("--scenario", choices=SCENARIOS, help="a history the nightly job wrote")
    ap.add_argument("--page", default=None, help="the page to capture (default: the config's)")
    ap.add_argument("--keep", metavar="DIR", help="build the history and the site in DIR, kept")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="patchbench-demo-") as tmp:
        tmp = a.keep or tmp
        site = Path(tmp) / "site"
        if a.scenario:
            build_site(build_scenario(tmp, a.scenario), site)
            page = a.page or f"configs/{CONFIG}.html"
        else:
            build_site(build_demo(tmp), site)
            page = a.page or "configs/nightly-cpu.html"
        out = capture(site / page, Path(a.out), crop=bool(a.scenario))
    print(f"dashboard screenshot: {out} ({out.stat().st_size // 1024} KiB)")
    if a.keep:
        print(f"dashboard site: {Path(a.keep) / 'site' / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
