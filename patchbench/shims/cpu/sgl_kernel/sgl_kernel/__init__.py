"""Import-time stand-in for the CPU build of sgl_kernel, which is not on PyPI.

sglang imports sgl_kernel at module level (e.g. ``custom_op = sgl_kernel.allreduce``,
``from sgl_kernel.kvcacheio import ...``); on a CPU without AMX it gates every sgl_kernel CPU op
off, so names only need to resolve. Any name resolves to a function that prints the
PATCHBENCH-STAND-IN-CALLED marker to stderr and raises NotImplementedError when called; the
harness fails the cell when the server log shows the marker. Only the ``kvcacheio`` submodule
is provided: a catch-all for submodules breaks sglang's ``from sgl_kernel.scalar_type import``
fallbacks (sglang 0.5.1.post3, quantization/utils.py).
"""

import importlib.abc
import importlib.machinery
import os
import sys
import types

__version__ = "0.0.0+patchbench-stand-in"
_MARKER = "PATCHBENCH-STAND-IN-CALLED"


def _missing(qualname):
    def stand_in(*args, **kwargs):
        msg = f"{_MARKER}: {qualname} (sgl_kernel CPU stand-in; not implemented)"
        print(msg, file=sys.stderr, flush=True)
        raise NotImplementedError(msg)

    stand_in.__name__ = qualname.rsplit(".", 1)[-1]
    stand_in.__qualname__ = qualname
    return stand_in


def _make_getattr(modname):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{modname}.{name}")

    return __getattr__


__getattr__ = _make_getattr(__name__)
_SUBMODULES = {"kvcacheio"} | (
    set(os.environ.get("PATCHBENCH_SGL_KERNEL_SUBMODULES", "").split(",")) - {""}
)


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + ".") and fullname.split(".", 1)[1] in _SUBMODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _make_getattr(spec.name)
        return m

    def exec_module(self, module):
        pass


sys.meta_path.append(_SubmoduleFinder())
