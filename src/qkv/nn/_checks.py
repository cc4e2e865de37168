"""Constructor argument checks shared by the modules: errors name the argument, the expected
value and what came."""

from __future__ import annotations


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
