"""A matrix of whole A/B runs ("units"), run one after another here or as Ray tasks on a cluster.

The unit of work is one whole ``bench`` run (every variant and repeat of one config, interleaved,
on one node): the arms of one comparison are never split across machines. Different models, pins,
server arguments or GPU types are different units. docs/scale-out.md is the user's guide.

- :mod:`~patchbench.matrix.spec`: the matrix file, its units and their stable ids;
- :mod:`~patchbench.matrix.record`: ``matrix.json`` and the matrix run folder's layout;
- :mod:`~patchbench.envs.nodes`: the python of a unit's pin (this one, or a venv per pin);
- :mod:`~patchbench.matrix.execute`: one unit run anywhere (bench in a subprocess, its folder back);
- :mod:`~patchbench.matrix.executors`: local (one after another) and Ray (a task per unit);
- :mod:`~patchbench.matrix.driver`: the run of a whole matrix, resume, ``--dry-run``'s listing, the
  ``patchbench matrix`` command;
- :mod:`~patchbench.matrix.report`: ``report.md`` and the figure of the primary effects;
"""
