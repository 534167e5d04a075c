"""Import-only stand-ins for CUDA-built packages the real SGLang server imports but, on a CPU, never uses.

SGLang's PyPI wheel imports `sgl_kernel` (CUDA kernels) and, through its multimodal code,
`torchvision` (whose PyPI build links CUDA torch). On a CPU without AMX serving a text model,
neither is called. `install(package)` makes `package` and any `package.sub.module` importable, with
every name in them a `Refusal`: attribute access on one gives another (so module-level references
like `InterpolationMode.BICUBIC` import), and calling one raises `StandInUsed`, so a real use
fails loudly instead of computing something wrong. Only the SGLang server's PYTHONPATH, set by the
test setup, holds these packages.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, NoReturn


class StandInUsed(RuntimeError):
    """Raised when code actually calls into a stand-in (the CPU path was expected not to)."""


class Refusal:
    """A name in a stand-in package: any attribute is another Refusal, any call raises."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, attr: str) -> Refusal:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Refusal(f"{self._path}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise StandInUsed(f"stand-in: {self._path} was called; this CPU machine does not have it")

    def __repr__(self) -> str:
        return f"<stand-in {self._path}>"


class StandInModule(types.ModuleType):
    """A stand-in submodule: every missing attribute is a Refusal."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Refusal(f"{self.__name__}.{attr}")


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every `package.<sub>` import succeed with a StandInModule."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(package: str) -> None:
    """Make the already-imported top-level `package` and its submodules stand-ins."""
    module = sys.modules[package]
    module.__class__ = StandInModule
    sys.meta_path.insert(0, StandInFinder(package))
