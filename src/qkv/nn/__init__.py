"""Modules: own parameters, validate at construction, call :mod:`qkv.functional`."""

from .attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    MultiheadAttention,
    MultiHeadSelfAttention,
)

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "MultiHeadAttention",
    "MultiHeadSelfAttention",
    "MultiheadAttention",
]
