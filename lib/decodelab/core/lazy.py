"""Lazy package exports (PEP 562): a package's ``__init__`` names its main classes, and the
module holding each is imported on first use, not when the package is.

Importing any submodule imports its package's ``__init__`` first, so eager imports there would
load everything (torch included) for ``import decodelab.engine.scheduler`` too. With
:func:`lazy_exports`, ``from decodelab.engine import Engine`` imports ``engine.engine`` (and
torch) at that moment only, while the torch-free modules stay torch-free.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package``, whose public name ``n`` is defined
    in its submodule ``where[n]`` (a name relative to the package)."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return list(where), __getattr__, __dir__
