"""Demos run by ``qkv demo [NAME]``: each prints its numbers and may write figures to ``--out``.

A demo is a function ``run(out: pathlib.Path, quick: bool) -> None`` registered with
:func:`register`; modules listed in ``_MODULES`` are imported lazily by :func:`load`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT", "REGISTRY", "Demo", "load", "register"]


@dataclass(frozen=True)
class Demo:
    name: str
    help: str
    run: Callable[[Path, bool], None]


REGISTRY: dict[str, Demo] = {}
DEFAULT = "translate"
# demo modules, imported on first use so `qkv --help` stays fast
_MODULES = (
    "qkv.demos.translate",
    "qkv.demos.tour",
    "qkv.demos.nadaraya_watson",
    "qkv.demos.positional_encoding",
    "qkv.demos.cat_milk",
    "qkv.demos.masks",
)


def register(name: str, help: str) -> Callable[[Callable[[Path, bool], None]], Callable]:
    """Decorator: make ``fn(out, quick)`` available as ``qkv demo NAME``."""

    def deco(fn: Callable[[Path, bool], None]) -> Callable[[Path, bool], None]:
        REGISTRY[name] = Demo(name, help, fn)
        return fn

    return deco


def load() -> dict[str, Demo]:
    """Import every demo module and return the registry."""
    for mod in _MODULES:
        importlib.import_module(mod)
    return REGISTRY
