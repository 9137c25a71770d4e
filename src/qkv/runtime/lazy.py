"""A package's submodules as its attributes (`qkv.viz.figures` after `import qkv`), each imported on first use,
so `import qkv` stays as light as the engine and a README line such as `qkv.viz.figures.head_heatmap(…)` works."""

from __future__ import annotations

import importlib
from types import ModuleType


def submodule(package: str, name: str) -> ModuleType:
    """PACKAGE.NAME, imported now: what a package's module-level `__getattr__` returns (PEP 562).

    A name that is no submodule is an AttributeError, as for any missing attribute; a submodule that
    exists but fails to import raises its own error.
    """
    if name.startswith("__") or not name.isidentifier():
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.{name}":
            raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
