"""Batched decoding: many sources at once, sorted by length, returned in input order.

:func:`decode_texts` is the one path from text to target ids: :class:`qkv.translate.Translator`
translates through it and the training loop's validation decodes through it; :func:`generate_ids`
is the same on ids already encoded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..data import Tokenizer
from ..decoding import generate

__all__ = ["decode_texts", "default_max_len", "generate_ids", "never_generated"]


def default_max_len(src_len: int) -> int:
    """The most tokens a translation of a ``src_len``-token source gets by default:
    ``2 * src_len + 10``."""
    return 2 * src_len + 10


def generate_ids(
    model: nn.Module,
    src_ids: Sequence[Sequence[int]],
    *,
    bos_id: int,
    eos_id: int,
    device: torch.device | str = "cpu",
    beam_size: int = 1,
    n_best: int = 1,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    max_tokens: int = 4096,
    max_len_cap: int | None = None,
    no_repeat_ngram: int = 0,
    suppress: Sequence[int] = (),
    progress: Callable[[int], None] | None = None,
) -> list[Any]:
    """Decode many sources, batched by length, returned in input order.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder`.
        src_ids: one id list per sentence, ``<eos>`` already appended.
        bos_id, eos_id: the target's special ids.
        device: where to run.
        beam_size, n_best, length_penalty: as :func:`qkv.decoding.generate`.
        max_len: the most tokens per translation; None: each sentence's own
            :func:`default_max_len` of its length (``<eos>`` counted), so a translation never
            depends on the sentences batched with it.
        max_tokens: a batch holds at most this many source positions (times the beam).
        max_len_cap: with ``max_len=None``, the default length is capped at this.
        progress: called with the number of sentences decoded so far after every batch.
        no_repeat_ngram, suppress: as :func:`qkv.decoding.generate`.

    Returns:
        Per sentence its ids (``n_best=1``) or its ``[(ids, score), ...]``, in input order.
    """
    if max_len is not None:
        _positive("max_len", max_len)
    _positive("max_tokens", max_tokens)
    n = len(src_ids)
    out: list[Any] = [None] * n
    order = sorted(range(n), key=lambda i: len(src_ids[i]))
    start = 0
    while start < n:
        longest = max(len(src_ids[order[start]]), 1)
        stop = start + 1
        while stop < n:
            longest_next = max(longest, len(src_ids[order[stop]]))
            if (stop - start + 1) * longest_next * beam_size > max_tokens:
                break
            longest, stop = longest_next, stop + 1
        rows = order[start:stop]
        lens = [max(len(src_ids[i]), 1) for i in rows]
        L = max(lens)
        src = torch.zeros(len(rows), L, dtype=torch.long)
        for r, i in enumerate(rows):
            ids = list(src_ids[i]) or [eos_id]
            src[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        valid = torch.tensor(lens, dtype=torch.long)
        limit: int | list[int] = (
            max_len if max_len is not None else [default_max_len(n) for n in lens]
        )
        if max_len is None and max_len_cap is not None:
            limit = [min(m, max_len_cap) for m in limit]
        res = generate(
            model,
            src.to(device),
            valid.to(device),
            max_len=limit,
            bos_id=bos_id,
            eos_id=eos_id,
            beam_size=beam_size,
            length_penalty=length_penalty,
            n_best=n_best,
            no_repeat_ngram=no_repeat_ngram,
            suppress=suppress,
        )
        for r, i in enumerate(rows):
            out[i] = res[r]
        start = stop
        if progress is not None:
            progress(stop)
    return out


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")


def never_generated(tok: Tokenizer) -> list[int]:
    """Ids a translation never needs: ``<unk>`` for a tokenizer that spells unknown characters
    in bytes (its training text never held ``<unk>``, so an emitted one is a model's error and
    would print as `` ⁇ ``)."""
    return [tok.unk_id] if getattr(tok, "byte_fallback", False) else []


def decode_texts(
    model: nn.Module,
    texts: Sequence[str],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    *,
    device: torch.device | str = "cpu",
    beam_size: int = 1,
    n_best: int = 1,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    max_len_cap: int | None = None,
    no_repeat_ngram: int = 0,
    pre_normalized: bool = False,
    max_tokens: int = 4096,
    progress: Callable[[int], None] | None = None,
) -> list[Any]:
    """Decode ``texts`` with ``model``: encode each (with the ``<eos>`` the model was trained
    with), decode in batches (:func:`generate_ids`), never emitting what
    :func:`never_generated` names.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder`.
        texts: the sources.
        src_tokenizer, tgt_tokenizer: the model's tokenizers.
        device, beam_size, n_best, length_penalty, max_len, max_len_cap, no_repeat_ngram,
            max_tokens: as :func:`generate_ids`.
        pre_normalized: the texts went through the source normaliser already (a run's
            validation split); else they are normalised here.
        progress: called with the number of texts done so far (blank ones counted first).

    Returns:
        Per text its target ids (``n_best=1``) or its ``[(ids, score), ...]``, without
        ``<bos>``/``<eos>``, in input order. A text that normalises to nothing is not decoded
        (the model would otherwise make a sentence up from ``<eos>`` alone): ``[]``, and with
        ``n_best`` the same shape as any text's: ``n_best`` hypotheses, the empty one with
        score 0.0 (the log-probability of a certainty: nothing translates to nothing), then
        ``n_best - 1`` empty ones scored ``-inf`` (there is no other translation).
    """
    encode = src_tokenizer.encode_normalized if pre_normalized else src_tokenizer.encode
    src = [[*encode(t), src_tokenizer.eos_id] for t in texts]
    todo = [i for i, ids in enumerate(src) if len(ids) > 1]
    blank = len(src) - len(todo)
    res = generate_ids(
        model,
        [src[i] for i in todo],
        bos_id=tgt_tokenizer.bos_id,
        eos_id=tgt_tokenizer.eos_id,
        device=device,
        beam_size=beam_size,
        n_best=n_best,
        length_penalty=length_penalty,
        max_len=max_len,
        max_len_cap=max_len_cap,
        no_repeat_ngram=no_repeat_ngram,
        suppress=never_generated(tgt_tokenizer),
        max_tokens=max_tokens,
        progress=None if progress is None else (lambda k: progress(blank + k)),
    )
    nothing = [([], 0.0)] + [([], -math.inf)] * (n_best - 1)
    out: list[Any] = [[] if n_best == 1 else list(nothing) for _ in src]
    for i, r in zip(todo, res):
        out[i] = r
    return out
