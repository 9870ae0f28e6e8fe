"""Stand-in: names resolve (RotaryEmbedding grabs rotary_embedding at init); a call raises."""

import sys

_MARKER = "PATCHBENCH-STAND-IN-CALLED"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def stand_in(*args, **kwargs):
        msg = f"{_MARKER}: vllm._custom_ops.{name} (vllm CPU stand-in; not implemented)"
        print(msg, file=sys.stderr, flush=True)
        raise NotImplementedError(msg)

    return stand_in
