"""Constructor argument checks shared by the modules: errors name the argument, the expected
value and what came."""

from __future__ import annotations

import math

from ..functional.scores import check_score


def positive_int(name: str, value: object) -> int:
    """``value`` if it is a positive int (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def probability(name: str, value: object) -> float:
    """``value`` as a float if it lies in [0, 1) (a dropout rate), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value!r}")
    return float(value)


def score_and_scale(score: object, scale: object) -> None:
    """A known ``score`` (a name or a callable) and a positive finite float ``scale`` or None."""
    check_score(score)
    if scale is not None and (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not (math.isfinite(scale) and scale > 0)
    ):
        raise ValueError(f"scale: expected a positive finite float or None, got {scale!r}")
