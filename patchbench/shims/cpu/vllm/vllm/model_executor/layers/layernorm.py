"""Stand-in: hands back sglang.srt.layers.layernorm's own RMSNorm,GemmaRMSNorm."""

import sys

_NAMES = "RMSNorm,GemmaRMSNorm".split(",")


def __getattr__(name):
    if name in _NAMES:
        return getattr(sys.modules["sglang.srt.layers.layernorm"], name)
    raise AttributeError(name)
