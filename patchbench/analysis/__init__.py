"""What changed between the variants of one run, and is it real: the typed comparison."""
