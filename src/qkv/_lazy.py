"""Public names of a package loaded from their modules on first use (PEP 562).

A package whose light names must not import torch (``qkv.inference.Decoding``, read by ``qkv
translate --help``) lists each public name with the module that defines it; this gives the
package's ``__getattr__`` and ``__dir__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` of ``package``: each name of ``where`` imported from its
    module (relative to ``package``; ``"scores"`` or ``"..nn.kv_cache"``) when first used, then
    kept in the package."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        relative = module if module.startswith(".") else f".{module}"
        value = getattr(importlib.import_module(relative, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
