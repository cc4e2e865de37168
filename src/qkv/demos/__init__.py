"""Demos run by ``qkv demo [NAME]``: each prints its numbers and may write figures to ``--out``.

A demo is a function ``run(out: pathlib.Path, quick: bool) -> int | None`` (its exit status;
None is 0) registered with :func:`register`, which checks the optional packages it ``needs``
before it starts; modules listed in ``_MODULES`` are imported lazily by :func:`load`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._deps import require

__all__ = ["DEFAULT", "REGISTRY", "Demo", "load", "register"]


DemoFn = Callable[[Path, bool], "int | None"]


@dataclass(frozen=True)
class Demo:
    """A registered demo: ``run(out, quick)`` checks ``needs`` (module names) first."""

    name: str
    help: str
    run: DemoFn
    needs: tuple[str, ...] = ()


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
    "qkv.demos.mha_step_by_step",
    "qkv.demos.vit_qkv",
    "qkv.demos.sqrt_dk",
    "qkv.demos.heads",
)


def register(name: str, help: str, needs: Sequence[str] = ()) -> Callable[[DemoFn], DemoFn]:
    """Decorator: make ``fn(out, quick)`` available as ``qkv demo NAME``; the function it
    returns (and registers) first checks that the optional modules ``needs`` are installed
    (:class:`~qkv._deps.MissingDependency`, one line naming the extra, before any work)."""

    def deco(fn: DemoFn) -> DemoFn:
        @functools.wraps(fn)
        def checked(out: Path, quick: bool) -> int | None:
            require(f"qkv demo {name}", needs)
            return fn(out, quick)

        REGISTRY[name] = Demo(name, help, checked, tuple(needs))
        return checked

    return deco


def load() -> dict[str, Demo]:
    """Import every demo module and return the registry."""
    for mod in _MODULES:
        importlib.import_module(mod)
    return REGISTRY
