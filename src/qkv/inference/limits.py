"""What a model's positions allow: a learned positional table (``model.max_len`` with
``pos_encoding="learned"``) cannot encode a position beyond it, so longer sources cannot be read
and longer translations cannot be written. Sinusoidal and rotary encodings (and the GRU model)
have no such limit.

Training drops pairs longer than the table before its first update; translating caps each
translation at the table and leaves a source longer than the table untranslated, saying which.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..nn.position import LearnedPositionalEncoding

__all__ = ["SETTING", "position_limits", "too_long"]

#: the setting that sizes a learned table, as users give it (--set model.max_len=N)
SETTING = "model.max_len"


def _table(part: nn.Module | None) -> int | None:
    if part is None:
        return None
    sizes = [m.max_len for m in part.modules() if isinstance(m, LearnedPositionalEncoding)]
    return min(sizes) if sizes else None


def position_limits(model: nn.Module) -> tuple[int | None, int | None]:
    """``(source, target)``: the most positions the model's encoder and decoder can encode
    (the size of a learned table; None: no limit). A source of ``n`` ids (``<eos>`` counted)
    needs ``n`` positions; a translation of ``n`` tokens (``<eos>`` counted) needs ``n``
    decoder positions (``<bos>`` and the first ``n - 1`` tokens)."""
    return _table(getattr(model, "encoder", None)), _table(getattr(model, "decoder", None))


def too_long(lengths: Sequence[int], limit: int | None) -> list[int]:
    """The indices of ``lengths`` (source ids, ``<eos>`` counted) over ``limit``."""
    if limit is None:
        return []
    return [i for i, n in enumerate(lengths) if n > limit]
