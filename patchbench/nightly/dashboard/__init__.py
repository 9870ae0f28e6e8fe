"""The nightly history as a static site: ``patchbench dashboard HISTORY --out DIR``.

A landing view of tonight's state per config, and per config one chart per gated metric (the
nightly medians with the repeats' range, change points, red nights, sglang releases) with every
night linked to its report, copied into the site. Plotly draws the charts; its JavaScript is
written once into ``DIR/assets/`` (no CDN at view time), so the folder can be published as it is
(GitHub Pages: .github/workflows/nightly.yml). docs/nightly.md, "The page".

Modules: :mod:`~patchbench.nightly.dashboard.data` (what is read from the history and the run folders,
also used by ``patchbench history``), :mod:`~patchbench.nightly.dashboard.site` (the pages),
:mod:`~patchbench.nightly.dashboard.cli` (the command), :mod:`~tests.nightly.demo_history` (a synthetic
history for the test and the screenshot), :mod:`~patchbench.nightly.dashboard.browser` (headless
Chromium for both).
"""
