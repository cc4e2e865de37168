"""Argument checks shared by the modules (errors name the argument, the expected value and what
came), and the weight initialisation the Transformer stacks share."""

from __future__ import annotations

import math

from torch import Tensor, nn

from ..functional.scores import check_score


def positive_int(name: str, value: object) -> int:
    """``value`` if it is a positive int (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def boolean(name: str, value: object) -> bool:
    """``value`` if it is a bool, else TypeError naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return value


def probability(name: str, value: object) -> float:
    """``value`` as a float if it lies in [0, 1) (a dropout rate), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value!r}")
    return float(value)


def dropout_rate(value: object) -> float:
    """A module's ``dropout`` argument: :func:`probability` named ``dropout``."""
    return probability("dropout", value)


def token_ids(name: str, X: object) -> Tensor:
    """``X`` as token ids ``(B, L)``: a 2-D tensor (a float one, as the book feeds
    ``torch.ones(...)`` to the encoder, is taken as ids), else ValueError naming ``name``."""
    if not isinstance(X, Tensor) or X.dim() != 2:
        got = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"{name}: expected token ids of shape (B, L), got {got}")
    if X.is_floating_point():
        X = X.long()
    return X


def xavier_(module: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every Linear (as torch.nn.Transformer)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def score_and_scale(score: object, scale: object) -> None:
    """A known ``score`` (a name or a callable) and a positive finite float ``scale`` or None."""
    check_score(score)
    if scale is not None and (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not (math.isfinite(scale) and scale > 0)
    ):
        raise ValueError(f"scale: expected a positive finite float or None, got {scale!r}")
