"""The parts of ``patchbench bench`` (:func:`patchbench.run.bench.run_bench` strings them together).

- :mod:`.preflight`: what is checked before any server starts (installed sglang, the model, a
  resumed folder's config, orphaned servers, the port);
- :mod:`.plan`: the cells in order and the plan as text (``--dry-run``);
- :mod:`.manifest`: the run's :class:`patchbench.runfolder.RunManifest` and its cell entries;
- :mod:`.loop`: running the cells, the manifest rewritten after each, stopping on a signal or an
  unwritable results folder;
- :mod:`.looks`: the sequential looks (when a ``{min, max, step}`` schedule stops);
- :mod:`.overhead`: where the wall time outside the measurements went;
- :mod:`.lock`: one writer per run folder (``RUN/.lock``);
- :mod:`.identity`: what each variant runs, recorded per cell, checked on ``--resume``.
"""
