"""Many sources decoded in batches: sorted by length, cut into batches, placed on the device,
decoded by an engine's one method, and put back in input order.

:func:`decode_sorted` is that loop, once for every engine: :class:`~qkv.inference.
TranslatorBase` runs it with its engine's ``_decode_batch`` (after encoding and setting aside
what is not decoded), and :func:`qkv.inference.generate_ids` runs it on ids already encoded.
A batch is a :class:`SourceBatch`: the sources' ids (``<eos>`` appended), each one's output
limit, and the padded tensors an engine that runs torch reads (``ids`` ``(B, Ls)``,
``lengths`` ``(B,)``, on the engine's device, made when first read).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..decoding.search import Hypothesis
from .options import Decoding

__all__ = ["DecodeBatch", "SourceBatch", "decode_sorted", "sorted_batches"]


@dataclass(frozen=True)
class SourceBatch:
    """One batch of sources, shortest first.

    Attributes:
        rows: each source's ids, ``<eos>`` appended (an empty one is read as ``[eos_id]``).
        limits: each source's most output tokens (``<eos>`` counted).
        device: where :attr:`ids` and :attr:`lengths` are placed.
        eos_id: the source's ``<eos>`` id.
    """

    rows: list[list[int]]
    limits: list[int]
    device: Any = "cpu"
    eos_id: int = 2

    @functools.cached_property
    def lengths(self) -> Tensor:
        """``(B,)`` int64: each source's length (at least 1), on :attr:`device`."""
        lens = [max(len(r), 1) for r in self.rows]
        return torch.tensor(lens, dtype=torch.long).to(self.device)

    @functools.cached_property
    def ids(self) -> Tensor:
        """``(B, Ls)`` int64: the sources right-padded with 0, on :attr:`device`."""
        lens = [max(len(r), 1) for r in self.rows]
        src = torch.zeros(len(self.rows), max(lens), dtype=torch.long)
        for r, row in enumerate(self.rows):
            ids = list(row) or [self.eos_id]
            src[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return src.to(self.device)


#: ``decode_batch(batch, decoding)`` -> per source its hypotheses, best first
DecodeBatch = Callable[[SourceBatch, Decoding], list[list[Hypothesis]]]


def sorted_batches(
    lengths: Sequence[int],
    decoding: Decoding,
    *,
    sentences: int | None = None,
    limits: Sequence[int] | None = None,
) -> list[list[int]]:
    """The indices of ``lengths`` sorted by length (ties in input order), cut into batches.

    A batch holds as many sources as ``decoding.max_tokens`` allows (its size times its longest
    source times the beam), or, with ``sentences``, that many sources (CTranslate2's
    ``batch_type="examples"``). With ``limits`` (one per index) a batch of a beam search holds
    sources of one output limit only (an engine that stops a whole batch at one length).
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches:
            batch = batches[-1]
            if sentences is not None:
                same = limits is None or decoding.beam_size == 1 or limits[batch[0]] == limits[i]
                fits = len(batch) < sentences and same
            else:  # sorted: this source is the batch's longest
                fits = (len(batch) + 1) * max(lengths[i], 1) * decoding.beam_size
                fits = fits <= decoding.max_tokens
            if fits:
                batch.append(i)
                continue
        batches.append([i])
    return batches


def decode_sorted(
    src: Sequence[Sequence[int]],
    limits: Sequence[int],
    decoding: Decoding,
    decode_batch: DecodeBatch,
    *,
    device: Any = "cpu",
    eos_id: int = 2,
    sentences: int | None = None,
    one_limit: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[list[Hypothesis]]:
    """Decode every source of ``src`` (ids, ``<eos>`` appended; ``limits``: each one's most
    output tokens) in the batches of :func:`sorted_batches`, each placed on ``device`` and given
    to ``decode_batch``; ``progress(done)`` after every batch.

    Returns:
        Per source its hypotheses, best first, in input order.
    """
    out: list[list[Hypothesis]] = [[] for _ in src]
    lengths = [len(ids) for ids in src]
    done = 0
    batches = sorted_batches(
        lengths, decoding, sentences=sentences, limits=limits if one_limit else None
    )
    for rows in batches:
        batch = SourceBatch([list(src[i]) for i in rows], [limits[i] for i in rows], device, eos_id)
        for i, hyps in zip(rows, decode_batch(batch, decoding)):
            out[i] = hyps
        done += len(rows)
        if progress is not None:
            progress(done)
    return out
