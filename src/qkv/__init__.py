"""qkv: attention mechanisms and the Transformer on PyTorch, exact, tested and fast."""

from . import functional

__version__ = "0.1.0"
__all__ = ["__version__", "functional"]
