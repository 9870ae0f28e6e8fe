"""Patches to sglang, as data and as code that applies them.

The patch folders themselves live in the repository's top-level ``patches/`` folder
(:data:`patchbench.inputs.PATCHES_DIR`: ``patches/<name>/manifest.yaml`` and one diff per
release); this package holds the code that reads and applies them:

- :mod:`~patchbench.patches.manifest`: the manifest schema and its loader;
- :mod:`~patchbench.patches.wheels`: upstream wheels (downloaded once) and pristine release files;
- :mod:`~patchbench.patches.diffs`: checking and rewriting unified diffs, naming failed hunks;
- :mod:`~patchbench.patches.apply`: a patch's diff for a release, applied with every hash checked
  (``patchbench check-patch``);
- :mod:`~patchbench.patches.author`: new patch folders from a diff or a git range
  (``patchbench new-patch``) and from a diff a config names;
- :mod:`~patchbench.patches.overlay`: the per-variant patched copy of the sglang package the
  server imports.

docs/patches.md describes the folder layout and the commands.
"""
