"""Running a config (``patchbench bench``); docs/design.md lists the modules."""
