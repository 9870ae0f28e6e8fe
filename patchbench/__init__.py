"""patchbench: A/B benchmarking and accuracy-regression suite for sglang patches (docs/design.md)."""
