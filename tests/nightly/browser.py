"""Headless Chromium through Selenium, for the page's test and scripts/dashboard_screenshot.py:
the Debian packages ``chromium`` and ``chromium-driver`` (installed by ``make setup-browser``,
which ``make test`` runs)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from patchbench.errors import EnvironmentNotReady

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def missing() -> str | None:
    """Why the browser cannot start here (a sentence naming the fix), or None when it can."""
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        absent.append("the Python package selenium (requirements/harness.txt)")
    if absent:
        return (
            f"{', '.join(absent)} missing: run `make setup-browser` (as root it installs the "
            "Debian packages chromium and chromium-driver) and `make setup`"
        )
    return None


def start(width: int = 1280, height: int = 900):
    """A headless Chromium WebDriver with a fresh profile, console logs at level ALL.
    Raises EnvironmentNotReady (exit 3) when the browser or selenium is missing. The caller
    quits it."""
    why = missing()
    if why:
        raise EnvironmentNotReady(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='patchbench-chromium-')}")
    opts.add_argument(f"--window-size={width},{height}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


__all__ = ["CHROMEDRIVER", "CHROMIUM", "FLAGS", "missing", "start"]
