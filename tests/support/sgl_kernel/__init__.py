"""A stand-in for the CUDA-only `sgl_kernel` package, so the real SGLang server imports on a CPU.

SGLang's PyPI wheel imports `sgl_kernel` (and a few of its submodules) at start-up, even on the CPU
path that never calls it on a machine without AMX. This package satisfies those imports and
nothing else: every attribute is a callable that raises, so any real use fails loudly instead of
computing something wrong. It is put on the SGLang server's PYTHONPATH by the test setup only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, NoReturn

__version__ = "0.0.0+stand-in"


class StandInUsed(RuntimeError):
    """Raised when SGLang actually calls into the stand-in (the CPU path was expected not to)."""


def _refuse(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise StandInUsed(f"sgl_kernel stand-in: {name} was called; this CPU has no sgl_kernel")

    refuse.__name__ = name.rsplit(".", 1)[-1]
    refuse.__qualname__ = refuse.__name__
    return refuse


class _StandInModule(types.ModuleType):
    """A submodule whose every missing attribute is a refusing callable."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _refuse(f"{self.__name__}.{attr}")


def __getattr__(attr: str) -> Any:
    """Any name SGLang imports from the package itself: a refusing callable."""
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _refuse(f"{__name__}.{attr}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes any `sgl_kernel.<sub>` import succeed with a refusing module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _StandInFinder())
