"""Stand-in: hands back sglang.srt.layers.activation's own SiluAndMul,GeluAndMul."""

import sys

_NAMES = "SiluAndMul,GeluAndMul".split(",")


def __getattr__(name):
    if name in _NAMES:
        return getattr(sys.modules["sglang.srt.layers.activation"], name)
    raise AttributeError(name)
