"""The math of attention: pure functions on tensors, no parameters, no state.

Data flows one way: modules -> :func:`attention` -> a backend.  Masks are canonicalised in
:mod:`qkv.functional.masks` (position-based kinds in ``INDEX_MASKS``), score kinds registered in
:mod:`qkv.functional.scores` (``SCORE_KINDS``), the softmax in :mod:`qkv.functional.softmax`.
"""

from .attention import (
    BACKENDS,
    AttentionMemoryError,
    BackendChoice,
    additive_attention,
    attention,
    explain,
    get_memory_budget,
    set_memory_budget,
)
from .chunked import plan_blocks
from .masks import MaskSpec, check_masks
from .scores import SCORE_KINDS, SCORES, Score, ScoreKind, ScoreMod
from .softmax import masked_softmax, safe_softmax

__all__ = [
    "BACKENDS",
    "SCORES",
    "SCORE_KINDS",
    "AttentionMemoryError",
    "BackendChoice",
    "MaskSpec",
    "Score",
    "ScoreKind",
    "ScoreMod",
    "additive_attention",
    "attention",
    "check_masks",
    "explain",
    "get_memory_budget",
    "masked_softmax",
    "plan_blocks",
    "safe_softmax",
    "set_memory_budget",
]
