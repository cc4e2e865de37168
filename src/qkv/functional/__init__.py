"""The math of attention: pure functions on tensors, no parameters, no state.

Data flows one way: modules -> :func:`attention` -> a backend.  Masks are canonicalised in
:mod:`qkv.functional.masks`, scores in :mod:`qkv.functional.scores`, the softmax in
:mod:`qkv.functional.softmax`.
"""

from .attention import BACKENDS, BackendChoice, additive_attention, attention, explain
from .masks import MaskSpec, check_masks
from .scores import SCORES, Score, ScoreMod
from .softmax import masked_softmax, safe_softmax

__all__ = [
    "BACKENDS",
    "SCORES",
    "BackendChoice",
    "MaskSpec",
    "Score",
    "ScoreMod",
    "additive_attention",
    "attention",
    "check_masks",
    "explain",
    "masked_softmax",
    "safe_softmax",
]
