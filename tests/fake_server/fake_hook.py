"""An in-server hook for the tests (``Instrumentation.hooks`` of tests/run/test_variants_run.py's
fake_args suite): every process that imports it appends its pid to ``$FAKE_HOOK_LOG``."""

import os

with open(os.environ["FAKE_HOOK_LOG"], "a") as f:
    f.write(f"{os.getpid()}\n")
