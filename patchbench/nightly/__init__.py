"""The nightly regression job: run a config or a matrix, record it in the history, gate it.

``patchbench nightly CONFIG [--history PATH]``        run the config, record, gate (CI's command)
``patchbench nightly --from-run RUN_DIR [CONFIG]``     the same on a finished run folder (no run)
``patchbench nightly --record-only RUN_DIR [CONFIG]``  only append a finished run to the history
``patchbench nightly MATRIX.yaml [--on local|ray] [--address ADDR] [--results DIR]``
                                                       run a matrix, then the job on every unit

A night's same-run answer is its report's verdict (compare.json); the nightly adds what the
report cannot know: the history (history gates, change points, trend) and the confirmation run
of a red night on a new build. Modules: :mod:`~patchbench.nightly.job` (the pipeline over units,
exit codes, nightly.json), :mod:`~patchbench.nightly.gates` (the ``nightly:`` settings and the
rules), :mod:`~patchbench.nightly.noise` (the noise learned from the history),
:mod:`~patchbench.nightly.repeats` (``schedule.repeats: auto``), :mod:`~patchbench.nightly.history`
(the SQLite store and its readers), :mod:`~patchbench.nightly.changepoints`,
:mod:`~patchbench.nightly.trend` (plots), :mod:`~patchbench.nightly.builds` (release and patch
state per night), :mod:`~patchbench.nightly.confirm`, :mod:`~patchbench.nightly.matrix_night`,
:mod:`~patchbench.nightly.render` (what a night found, its nightly.md),
:mod:`~patchbench.nightly.dashboard` (the static site) and
:mod:`~patchbench.nightly.commands` (``nightly``, ``history``, ``dashboard``).

Exit codes (patchbench/errors.py), worst first: 4 the run failed, 3 the environment or the
history cannot be used, 2 bad usage or config (a gate's metric missing, a patch that does not
apply tonight), 1 a gate found a regression, 5 underpowered (nothing failed, but a gate could
not show that nothing regressed), 0 green. A matrix night ranks a regression first
(:data:`patchbench.nightly.render.EXIT_ORDER`).
"""
