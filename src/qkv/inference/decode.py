"""Batched decoding: many sources at once, sorted by length, returned in input order.

:func:`decode_texts` is the one path from text to target ids: every qkv engine translates
through it (:class:`qkv.translate.Translator`) and the training loop's validation decodes
through it, so both follow one position-limit policy; :func:`generate_ids` is the same on ids
already encoded. How to decode is one :class:`~qkv.inference.Decoding`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..data import Tokenizer
from ..decoding import generate
from .limits import SETTING as POSITION_SETTING
from .limits import position_limits, skip_too_long, too_long
from .options import Decoding, default_max_len

__all__ = ["decode_texts", "default_max_len", "generate_ids", "never_generated"]

log = logging.getLogger(__name__)


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
) -> list[Any]:
    """Decode many sources, batched by length, returned in input order.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder`.
        src_ids: one id list per sentence, ``<eos>`` already appended.
        bos_id, eos_id: the target's special ids.
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
    n = len(src_ids)
    out: list[Any] = [None] * n
    order = sorted(range(n), key=lambda i: len(src_ids[i]))
    start = 0
    while start < n:
        longest = max(len(src_ids[order[start]]), 1)
        stop = start + 1
        while stop < n:
            longest_next = max(longest, len(src_ids[order[stop]]))
            if (stop - start + 1) * longest_next * dec.beam_size > dec.max_tokens:
                break
            longest, stop = longest_next, stop + 1
        rows = order[start:stop]
        lens = [max(len(src_ids[i]), 1) for i in rows]
        src = torch.zeros(len(rows), max(lens), dtype=torch.long)
        for r, i in enumerate(rows):
            ids = list(src_ids[i]) or [eos_id]
            src[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        res = generate(
            model,
            src.to(device),
            torch.tensor(lens, dtype=torch.long).to(device),
            max_len=[dec.output_limit(k, positions) for k in lens],
            bos_id=bos_id,
            eos_id=eos_id,
            suppress=suppress,
            **dec.search_options(),
        )
        for r, i in enumerate(rows):
            out[i] = res[r]
        start = stop
        if progress is not None:
            progress(stop)
    return out


def never_generated(tok: Tokenizer) -> list[int]:
    """Ids a translation never needs: ``<unk>`` for a tokenizer that spells unknown characters
    in bytes (its training text never held ``<unk>``, so an emitted one is a model's error and
    would print as `` ⁇ ``)."""
    return [tok.unk_id] if getattr(tok, "byte_fallback", False) else []


def _fit_positions(
    dec: Decoding, src: list[list[int]], model: nn.Module, warn: bool
) -> tuple[list[int], int | None]:
    """The position-limit policy of a model with learned positions: the sources longer than its
    encoder's table (their indices: not translated) and its decoder's table (every translation
    stops there); a ``max_output_len`` past the table, and the sources skipped, are warned
    about (``warn``), naming the setting."""
    src_limit, tgt_limit = position_limits(model)
    if warn and tgt_limit is not None and (dec.max_output_len or 0) > tgt_limit:
        log.warning(
            "max_output_len (--max-len) %d is more than the model's %d learned target "
            "positions (%s): translations stop at %d tokens",
            dec.max_output_len, tgt_limit, POSITION_SETTING, tgt_limit,
        )  # fmt: skip
    lengths = [len(ids) for ids in src]
    if not warn:
        return too_long(lengths, src_limit), tgt_limit
    positions = f"the model's {src_limit} learned positions ({POSITION_SETTING})"
    return skip_too_long(lengths, src_limit, positions), tgt_limit


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
    """Decode ``texts`` with ``model``: encode each (with the ``<eos>`` the model was trained
    with), decode in batches (:func:`generate_ids`), never emitting what
    :func:`never_generated` names.

    A model with learned positions (``model.max_len``) cannot read or write past its table:
    every translation stops at the table, and a source longer than the table is not translated
    (an empty hypothesis) with a warning naming it (``input 3``, 1-based) and the setting; the
    other texts are translated as they would be alone. Training's validation passes
    ``warn=False`` (it says once, before the run, which pairs its table cannot hold).

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
        ``<bos>``/``<eos>``, in input order. A text that normalises to nothing is not decoded
        (the model would otherwise make a sentence up from ``<eos>`` alone): ``[]``, and with
        ``n_best`` the same shape as any text's: ``n_best`` hypotheses, the empty one with
        score 0.0 (the log-probability of a certainty: nothing translates to nothing), then
        ``n_best - 1`` empty ones scored ``-inf`` (there is no other translation). A source
        too long for the table gives ``[]`` (n-best: ``n_best`` empty ones scored ``-inf``).
    """
    dec = Decoding.coerce(decoding)
    encode = src_tokenizer.encode_normalized if pre_normalized else src_tokenizer.encode
    src = [[*encode(t), src_tokenizer.eos_id] for t in texts]
    skip, tgt_limit = _fit_positions(dec, src, model, warn)
    skipped = set(skip)
    todo = [i for i, ids in enumerate(src) if len(ids) > 1 and i not in skipped]
    undone = len(src) - len(todo)
    res = generate_ids(
        model,
        [src[i] for i in todo],
        bos_id=tgt_tokenizer.bos_id,
        eos_id=tgt_tokenizer.eos_id,
        decoding=dec,
        device=device,
        positions=tgt_limit,
        suppress=never_generated(tgt_tokenizer),
        progress=None if progress is None else (lambda k: progress(undone + k)),
    )
    k = dec.n_best
    nothing: list[Any] = [([], 0.0)] + [([], -math.inf)] * (k - 1)
    out: list[Any] = [[] if k == 1 else list(nothing) for _ in src]
    for i in skip:
        out[i] = [] if k == 1 else [([], -math.inf)] * k
    for i, r in zip(todo, res):
        out[i] = r
    return out
