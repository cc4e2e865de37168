"""qkv's own engine on a model in memory, and batched decoding on text or ids.

:class:`ModelEngine` is the qkv engine of :class:`~qkv.inference.TextTranslator` over an
:class:`~qkv.nn.seq2seq.EncoderDecoder` and its tokenizers: the policy of
:class:`~qkv.inference.TranslatorBase` (encode, skip, sort, batch, place, back in order) with
one batch decoded by :func:`qkv.decoding.search_hypotheses`. :class:`qkv.translate.Translator` is that
engine with a user's conveniences (loading, attention pictures); :func:`decode_texts` runs it
on a model as it is (training's validation decodes through it), so every qkv translation
follows one position-limit policy; :func:`generate_ids` decodes ids already encoded. How to
decode is one :class:`~qkv.inference.Decoding`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..data import Tokenizer
from ..decoding import search_hypotheses
from ..decoding.search import Hypothesis
from .batches import SourceBatch, decode_sorted
from .engine import TranslatorBase, one_best_or_all
from .limits import SETTING as POSITION_SETTING
from .limits import PositionBounds, position_limits
from .options import Decoding, default_max_len, default_output_len

__all__ = [
    "ModelEngine",
    "decode_texts",
    "default_max_len",
    "default_output_len",
    "generate_ids",
    "never_generated",
]


def never_generated(tok: Tokenizer) -> list[int]:
    """Ids a translation never needs: ``<unk>`` for a tokenizer that spells unknown characters
    in bytes (its training text never held ``<unk>``, so an emitted one is a model's error and
    would print as `` ⁇ ``)."""
    return [tok.unk_id] if getattr(tok, "byte_fallback", False) else []


def _search_batch(
    model: nn.Module, bos_id: int, eos_id: int, suppress: Sequence[int], pad_id: int | None = 0
) -> Callable[[SourceBatch, Decoding], list[list[Hypothesis]]]:
    """``decode_batch(batch, decoding)``: one batch through :func:`qkv.decoding.search_hypotheses`, each
    sentence stopped at its own limit; ``pad_id`` is the target's padding (never generated)."""

    def decode_batch(batch: SourceBatch, decoding: Decoding) -> list[list[Hypothesis]]:
        return search_hypotheses(
            model,
            batch.ids,
            batch.lengths,
            max_output_len=batch.limits,
            bos_id=bos_id,
            eos_id=eos_id,
            pad_id=pad_id,
            decoding=decoding,
            suppress=suppress,
        )

    return decode_batch


class ModelEngine(TranslatorBase):
    """The qkv engine over a model in memory: ``model`` as it is (not moved, its mode kept;
    the search runs it in evaluation mode without autograd and restores its mode).

    A model with learned positions (``model.max_len``) cannot read or write past its table:
    every translation stops at the table (said once, before decoding, when ``max_output_len``
    asks for more), and a source longer than the table is not translated, with a warning naming
    it (``input 3``, 1-based) and the setting; the other texts are translated as they would be
    alone.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder`.
        src_tokenizer, tgt_tokenizer: its tokenizers.
        device: where the model is (the batches are placed there).
        decoding: the default :class:`~qkv.inference.Decoding` (None: greedy).
    """

    engine = "qkv"

    def __init__(
        self,
        model: nn.Module,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        *,
        device: torch.device | str = "cpu",
        decoding: Decoding | None = None,
    ) -> None:
        self.model = model
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self._device = torch.device(device)
        self._decoding = Decoding.coerce(decoding)

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self._device

    def _positions(self) -> PositionBounds:
        src_limit, tgt_limit = position_limits(self.model)
        return PositionBounds(
            source=src_limit,
            target=tgt_limit,
            named=f"the model's {src_limit} learned positions ({POSITION_SETTING})",
            announced=f"the model's {tgt_limit} learned target positions ({POSITION_SETTING})",
        )

    def _decode_batch(self, batch: SourceBatch, decoding: Decoding) -> list[list[Hypothesis]]:
        tgt = self.tgt_tokenizer
        decode = _search_batch(self.model, tgt.bos_id, tgt.eos_id, never_generated(tgt), tgt.pad_id)
        return decode(batch, decoding)


def generate_ids(
    model: nn.Module,
    src_ids: Sequence[Sequence[int]],
    *,
    bos_id: int,
    eos_id: int,
    decoding: Decoding | None = None,
    device: torch.device | str = "cpu",
    positions: int | None = None,
    suppress: Sequence[int] = (),
    progress: Callable[[int], None] | None = None,
    pad_id: int | None = 0,
) -> list[Any]:
    """Decode many sources, batched by length, returned in input order.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder`.
        src_ids: one id list per sentence, ``<eos>`` already appended.
        bos_id, eos_id: the target's special ids (``pad_id``: its padding, never generated;
            qkv's 0 by default).
        decoding: how (default: greedy); its ``max_tokens`` sizes the batches (source
            positions times the beam) and :meth:`~qkv.inference.Decoding.output_limit` each
            sentence's length, so a translation never depends on the sentences batched with it.
        device: where to run.
        positions: the most target positions the model can encode (a learned table); every
            translation stops there.
        suppress: ids never generated besides ``<pad>`` and ``<bos>`` (see
            :func:`qkv.decoding.generate`).
        progress: called with the number of sentences decoded so far after every batch.

    Returns:
        Per sentence its ids (``n_best=1``) or its ``[(ids, score), ...]``, in input order.
    """
    dec = Decoding.coerce(decoding)
    limits = [dec.output_limit(max(len(ids), 1), positions) for ids in src_ids]
    hyps = decode_sorted(
        src_ids,
        limits,
        dec,
        _search_batch(model, bos_id, eos_id, suppress, pad_id),
        device=device,
        eos_id=eos_id,
        progress=progress,
    )
    return one_best_or_all(hyps, dec.n_best)


def decode_texts(
    model: nn.Module,
    texts: Sequence[str],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    decoding: Decoding | None = None,
    *,
    device: torch.device | str = "cpu",
    pre_normalized: bool = False,
    warn: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[Any]:
    """Decode ``texts`` with ``model`` through the qkv engine (:class:`ModelEngine`): encode
    each (with the ``<eos>`` the model was trained with), decode in batches, never emitting
    what :func:`never_generated` names; the model's learned table bounds both sides (see
    :class:`ModelEngine`). Training's validation passes ``warn=False`` (it says once, before
    the run, which pairs its table cannot hold).

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder`.
        texts: the sources.
        src_tokenizer, tgt_tokenizer: the model's tokenizers.
        decoding: how (default: greedy, nothing blocked).
        device: where the model is.
        pre_normalized: the texts went through the source normaliser already (a run's
            validation split); else they are normalised here.
        warn: log what the position limits cut or skip.
        progress: called with the number of texts done so far (those not decoded counted
            first).

    Returns:
        Per text its target ids (``n_best=1``) or its ``[(ids, score), ...]``, without
        ``<bos>``/``<eos>``, in input order (the convention of
        :class:`~qkv.inference.TranslatorBase`: a text that normalises to nothing gives ``[]``,
        with ``n_best`` the empty hypothesis scored 0.0 then ``n_best - 1`` scored ``-inf``; a
        source too long for the table gives ``[]``, with ``n_best`` empty ones scored ``-inf``).
    """
    dec = Decoding.coerce(decoding)
    engine = ModelEngine(model, src_tokenizer, tgt_tokenizer, device=device)
    hyps = engine._decode(texts, dec, progress, normalized=pre_normalized, warn=warn)
    return one_best_or_all(hyps, dec.n_best)
