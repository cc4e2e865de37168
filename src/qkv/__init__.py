"""qkv: attention mechanisms and the Transformer on PyTorch, exact, tested and fast."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "functional"]

if TYPE_CHECKING:
    from . import functional


def __getattr__(name: str) -> Any:
    """``qkv.functional`` (and torch with it) loads on first use: ``qkv --help`` starts without
    torch, and an ``OMP_WAIT_POLICY`` set before the first use still applies."""
    if name == "functional":
        return importlib.import_module(f"{__name__}.functional")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
