#!/usr/bin/env python
"""Build the demo nightly history (tests.nightly.demo_history), render its site and save a
screenshot of one config's page with headless Chromium (tests/nightly/browser.py).

    PYTHONPATH=. .venv/bin/python scripts/dashboard_screenshot.py [--out docs/img/dashboard.png]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from patchbench.nightly.dashboard import build_site
from tests.nightly.browser import start
from tests.nightly.demo_history import build_demo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/img/dashboard.png", help="the PNG to write")
    ap.add_argument("--page", default="configs/nightly-cpu.html", help="the page to capture")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="patchbench-demo-") as tmp:
        site = Path(tmp) / "site"
        build_site(build_demo(tmp), site)
        driver = start(1200, 1100)
        try:
            driver.get((site / a.page).resolve().as_uri())
            time.sleep(1.5)
            out = Path(a.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(out))
        finally:
            driver.quit()
    print(f"dashboard screenshot: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
