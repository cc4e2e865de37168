"""Subword regularisation while training: a new segmentation of every training sentence each
epoch, drawn by SentencePiece's sampling (Kudo, 2018: unigram sampling; Provilkov et al.,
2020: BPE-dropout).

:func:`epoch_sampler` gives the training batcher (:class:`qkv.data.TokenBatcher`'s
``resample``) the ids of one epoch: both sides of every training pair sampled with
``subword_alpha`` and ``subword_nbest_size``, from a seed made of the run's ``seed``, the
epoch and the side. The draws are thus a function of the data position a checkpoint saves
(its epoch): a killed and resumed run samples the very segmentations it would have, with no
generator state of its own to save; every process of a torchrun run draws the same epoch.
Validation, evaluation and translation encode with the tokenizer's one best segmentation
(``encode``): nothing but the training batches is sampled.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._errors import SettingError
from ..data import Tokenizer
from .config import TrainConfig
from .run_data import RunData

__all__ = ["LONG_SAMPLES", "epoch_sampler", "sampled_length_ratios", "sampling_seed"]

Ids = list[list[int]]

#: training pairs (spread evenly over the data) whose sampled and best segmentations the
#: greeting of a sampling run compares
LENGTH_PAIRS = 200
#: sampled segmentations with more than this many times the best one's pieces, on either side,
#: are said in a note. A chosen midpoint between two measurements on benchmarks/real.py's
#: English-French corpus (a joint 8,000-piece unigram model): alpha 0.1 over all segmentations
#: gave 2.0 times the pieces on both sides, and a 25-minute run of it validated at 0.36 BLEU
#: after 1,338 updates (stopped there) where the same run without sampling had 20.33 after
#: 1,233; alpha 0.5 gave 1.04 times and trained as fast as no sampling
LONG_SAMPLES = 1.5


def sampling_seed(seed: int, epoch: int, side: int) -> int:
    """SentencePiece's seed for one side (0 source, 1 target) of one epoch of a run."""
    return int(np.random.default_rng([seed, 0x5EED, epoch, side]).integers(2**32))


def _sampled(config: TrainConfig, tok: Tokenizer, texts: list[str], epoch: int, side: int) -> Ids:
    """``texts`` of one side (0 source, 1 target) sampled as the run's epoch ``epoch`` samples
    them: its ``subword_alpha``, ``subword_nbest_size`` and that epoch's seed."""
    return tok.sample_encode(
        texts,
        alpha=config.subword_alpha,
        nbest_size=config.subword_nbest_size,
        seed=sampling_seed(config.seed, epoch, side),
    )


def epoch_sampler(config: TrainConfig, data: RunData) -> Callable[[int], tuple[Ids, Ids]] | None:
    """``fn(epoch) -> (src_ids, tgt_ids)``: every training pair's ids sampled for that epoch,
    as ``config`` asks (``subword_alpha``, ``subword_nbest_size``); None when it asks for no
    sampling.

    Raises:
        SettingError: (``subword_alpha``) a run on a prepared corpus (its training pairs are
            token arrays, no text to sample from), a tokenizer that cannot sample (words), or a
            value its model refuses (a BPE-dropout probability of 1 or more).
    """
    alpha, nbest = config.subword_alpha, config.subword_nbest_size
    if not alpha:
        return None
    if data.prepared is not None:
        raise SettingError(
            "subword_alpha",
            f"samples the segmentation of the training text each epoch, and the prepared corpus "
            f"{str(data.prepared.folder)!r} holds its pairs as tokens only; train from the "
            "file (--data FILE --prepare-data never) or set subword_alpha=0",
        )
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
    for tok in {id(src_tok): src_tok, id(tgt_tok): tgt_tok}.values():
        tok.sample_encode([], alpha=alpha, nbest_size=nbest, seed=0)  # refuses before training
    src_texts = [s for s, _ in data.train]
    tgt_texts = [t for _, t in data.train]

    def resample(epoch: int) -> tuple[Ids, Ids]:
        return (
            _sampled(config, src_tok, src_texts, epoch, 0),
            _sampled(config, tgt_tok, tgt_texts, epoch, 1),
        )

    return resample


def sampled_length_ratios(
    config: TrainConfig, data: RunData, n: int = LENGTH_PAIRS
) -> tuple[float, float] | None:
    """How many times the pieces of their best segmentation the run's sampling gives the source
    and the target of up to ``n`` training pairs spread evenly over the data: ``(1.04, 1.05)``
    is a mild regularisation, ``(2.0, 2.0)`` sentences of twice their length (each batch then
    holds half the sentences). An estimate: the pairs are sampled with the run's settings and
    its first epoch's seeds, not drawn as that epoch draws them (one generator over every
    sentence), and pairs the batcher drops for their length count too. None when the run does
    not sample, or has no training text."""
    if not config.subword_alpha or data.prepared is not None or not data.train:
        return None
    k = min(n, len(data.train))
    pairs = [data.train[i * len(data.train) // k] for i in range(k)]
    ratios = []
    for side, tok in enumerate((data.src_tokenizer, data.tgt_tokenizer)):
        texts = [p[side] for p in pairs]
        sampled = _sampled(config, tok, texts, 0, side)
        best = sum(len(tok.encode_normalized(t)) for t in texts)
        ratios.append(sum(map(len, sampled)) / max(1, best))
    return ratios[0], ratios[1]
