"""The code that reads and applies the patch folders of ``patches/`` (docs/patches.md; the
modules: docs/design.md)."""
