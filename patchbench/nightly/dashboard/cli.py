"""``patchbench dashboard HISTORY --out DIR``: write the nightly history's static site
(patchbench.nightly.dashboard.site)."""

from __future__ import annotations

import argparse

from patchbench.errors import EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("history", metavar="HISTORY", help="the nightly history (SQLite file)")
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="the site's folder (kept between nights, it keeps the reports of nights whose run "
        "folder is gone)",
    )


def run(a: argparse.Namespace) -> int:
    """Build the site; prints what it wrote. Exit 2 for a missing history, 3 for an unusable one."""
    from patchbench.nightly.dashboard.site import build_site

    s = build_site(a.history, a.out)
    print(
        f"dashboard: {s.out / 'index.html'}: {len(s.charts)} chart(s), "
        f"{len(s.nights_copied)} night report(s) copied"
        + (f", {len(s.nights_kept)} kept from an earlier build" if s.nights_kept else "")
        + (f", {len(s.nights_gone)} night(s) whose run folder is gone" if s.nights_gone else "")
    )
    return EXIT_OK
