"""A matrix of whole A/B runs ("units"), run one after another here or as Ray tasks on a cluster
(docs/scale-out.md). A unit is one whole ``bench`` run on one node: the arms of a comparison are
never split across machines.

Modules: :mod:`~patchbench.matrix.spec` (the matrix file, its units, their stable ids),
:mod:`~patchbench.matrix.record` (``matrix.json``, the matrix run folder),
:mod:`~patchbench.matrix.execute` (one unit run anywhere), :mod:`~patchbench.matrix.executors`
(local, Ray), :mod:`~patchbench.matrix.driver` (a whole matrix, resume, the ``patchbench
matrix`` command), :mod:`~patchbench.matrix.report`. A unit's python: patchbench.envs.nodes.
"""
