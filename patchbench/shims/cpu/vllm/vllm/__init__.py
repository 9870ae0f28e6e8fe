"""Import-time stand-in for the few vllm names sglang 0.5.1.x imports on a CPU without AMX.

sglang/srt/layers/activation.py and layernorm.py do ``from vllm.model_executor.layers.{activation,
layernorm} import ...`` there; these modules hand back sglang's own classes (whose CustomOp
dispatch runs forward_native, pure torch, on this CPU). Every other vllm submodule stays missing,
so sglang's "vllm not available" paths are taken.
"""

__version__ = "0.0.0+patchbench-stand-in"
