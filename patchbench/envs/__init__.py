"""Where each build of sglang runs: the environments of this machine and its nodes, and the model."""
