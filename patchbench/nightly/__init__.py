"""The nightly regression job: run a config or a matrix, record it in the history, gate it.

``patchbench nightly CONFIG [--history PATH]``        run the config, record, gate (CI's command)
``patchbench nightly --from-run RUN_DIR [CONFIG]``     the same on a finished run folder (no run)
``patchbench nightly --record-only RUN_DIR [CONFIG]``  only append a finished run (e.g. after the
                                                       history was locked or corrupt that night)
``patchbench nightly MATRIX.yaml [--on local|ray] [--address ADDR] [--results DIR]``
                                                       run a matrix (patchbench.matrix), then the
                                                       job on every unit; one summary
``--from-run`` / ``--record-only`` also take a matrix run folder (every unit).

One pipeline over units (:func:`patchbench.nightly.job.run_night`): a single run is a night of
one unit; a matrix run is a night of one unit per matrix unit. Each unit with a run folder is
recorded and gated in its folder (its own ``nightly.md``); a matrix night adds one summary over
its units. A matrix unit's nights are keyed ``<config name>@<unit id>`` in the history (unit ids
are stable across matrix runs); the matrix night's exit code is the worst unit's in
:data:`patchbench.nightly.outcome.EXIT_ORDER` (a regression first, unlike one config's order below).

Modules: :mod:`~patchbench.nightly.job` (the pipeline over units, exit codes, nightly.json),
:mod:`~patchbench.nightly.matrix_night` (a matrix run folder's units and its one summary),
:mod:`~patchbench.nightly.repeats` (``schedule.repeats: auto``: tonight's repeats from the noise),
:mod:`~patchbench.nightly.render` (nightly.md), :mod:`~patchbench.nightly.cli` (the command),
:mod:`~patchbench.nightly.builds` (each variant's release and patch state per night, a release
change named as a step's likely cause, a patch that stops applying),
:mod:`~patchbench.nightly.confirm` (the confirmation run of a red night on a new build).
The gates themselves (settings, tests, Holm across the night, outcomes) live in
patchbench/nightly/gates/; the trend plots in patchbench/nightly/trend.py; the SQLite history in
patchbench/nightly/history.py. docs/nightly.md explains the error budget.

Exit codes (patchbench/errors.py), worst first: 4 the run failed (an exception of the runner,
failed cells, no comparison), 3 the environment is not ready or the history cannot be used,
2 bad usage or config (including a gate whose metric the run does not produce, and a patch
that does not apply to tonight's release: stock still runs and is gated), 1 a gate found a
regression (red night), 5 underpowered (nothing failed, but tonight's noise was clearly worse than
the learned noise, or short of the repeats that noise needs, or too few repeats to gate; with no
noise known yet: a gated metric stayed inconclusive), 0 green (no regression shown within the
error budget, or waiting for history). The summary always lists every gate, so a night that exits 3 or 4 still shows the
regressions it could see.

Outputs in the run folder: ``nightly.md`` (for $GITHUB_STEP_SUMMARY), ``nightly.json``
(dashboards), ``plots/nightly-<suite>.<metric>.png`` (trend per gated metric).
"""
