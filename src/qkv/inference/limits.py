"""What a model's positions allow: a learned positional table (``model.max_len`` with
``pos_encoding="learned"``) cannot encode a position beyond it, so longer sources cannot be read
and longer translations cannot be written. Sinusoidal and rotary encodings (and the GRU model)
have no such limit.

Training drops pairs longer than the table before its first update; translating caps each
translation at the table and leaves a source longer than the table untranslated, saying which.

The same rule holds for every engine whose positions are bounded (a CTranslate2 model's table,
an ONNX graph's ``max_len``): :func:`skip_too_long` names the lines left untranslated, the
others are translated as they would be alone, and :func:`warn_cut` names the translations the
positions stopped before they ended.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ..nn.position import LearnedPositionalEncoding
from .options import Decoding

__all__ = [
    "SETTING",
    "PositionBounds",
    "cut_by_positions",
    "position_limits",
    "skip_too_long",
    "too_long",
    "warn_cut",
]

log = logging.getLogger(__name__)

#: the setting that sizes a learned table, as users give it (--set model.max_len=N)
SETTING = "model.max_len"


@dataclass(frozen=True)
class PositionBounds:
    """What an engine's positions bound, and how its warnings name the bound.

    Attributes:
        source: the most source ids (``<eos>`` counted) it reads; None: no bound.
        target: the most tokens a translation may have (``<eos>`` counted); None: no bound.
        named: what bounds them, as the warnings say it (``"the CTranslate2 model's 1024
            positions (its positional table)"``).
        announced: None: each translation the target bound stops before it ends is named
            after decoding (:func:`warn_cut`); else the target bound as a warning names it
            (``"the model's 12 learned target positions (model.max_len)"``), said once before
            decoding when ``max_output_len`` asks for more (the learned table of qkv's engine,
            whose translations stop there by design).
    """

    source: int | None = None
    target: int | None = None
    named: str = ""
    announced: str | None = None


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


def _inputs(indices: Sequence[int], labels: Sequence[str] | None = None) -> str:
    """``input 3`` or ``inputs 3, 7, ...`` (1-based, or each index's label; at most ten
    shown)."""
    named = [str(i + 1) if labels is None else labels[i] for i in indices[:10]]
    shown = ", ".join(named) + (", ..." if len(indices) > 10 else "")
    return f"input{'s' if len(indices) > 1 else ''} {shown}"


def skip_too_long(
    lengths: Sequence[int],
    limit: int | None,
    positions: str,
    labels: Sequence[str] | None = None,
) -> list[int]:
    """The indices of ``lengths`` (source ids, ``<eos>`` counted) over ``limit``: sources an
    engine cannot read, left untranslated (empty) with one warning naming them (their number,
    or ``labels``) and ``positions`` (what bounds them: ``"the model's 12 learned positions
    (model.max_len)"``)."""
    skip = too_long(lengths, limit)
    if skip:
        log.warning(
            "%s: more source tokens than %s: not translated (empty)",
            _inputs(skip, labels), positions,
        )  # fmt: skip
    return skip


def warn_cut(
    cut: Sequence[int], limit: int, positions: str, labels: Sequence[str] | None = None
) -> None:
    """One warning naming the translations (indices, or their ``labels``) that ``positions``
    stopped at ``limit`` tokens before they ended, where the length rule allowed more."""
    if cut:
        log.warning(
            "%s: translation stopped at %d tokens, %s, before it ended (the length rule allows "
            "more)",
            _inputs(cut, labels), limit, positions,
        )  # fmt: skip


def cut_by_positions(ids: Sequence[int], src_len: int, limit: int, decoding: Decoding) -> bool:
    """Did the positions stop translation ``ids`` (without ``<eos>``) of a ``src_len``-token
    source: it reached ``limit`` (its cap with the positions) without ending, and the length
    rule alone (:meth:`Decoding.output_limit`) allows more?"""
    return len(ids) >= limit and decoding.output_limit(src_len) > limit
