"""Lazy package exports (PEP 562): ``import mlpinterp`` / ``import mlpinterp.models`` stay fast; a name's module is
imported on first access."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """Module ``__getattr__`` for ``package`` exporting ``{name: module}``; a resolved name is cached in it."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
