"""Validation during a run: the loss on the validation split, and BLEU of its translations.

:func:`validation_loss` is the mean negative log-likelihood per target token (no label
smoothing); :func:`validation_bleu` decodes the sources with :func:`qkv.inference.decode_texts`,
as :class:`qkv.translate.Translator` does, and scores them with sacreBLEU. A run holds what it
validates on in one :class:`ValidationSet`: its scheduled evaluations and the final choice of
weights and decoding (:mod:`qkv.train.finish`) score through it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..data import TokenBatcher, Tokenizer
from ..inference import Decoding, Evaluation, corpus_scores, decode_texts
from ..nn.seq2seq import EncoderDecoder
from .losses import forward_precision, sequence_loss

__all__ = ["ValidationSet", "reference_caps", "validation_bleu", "validation_loss"]

#: a validation translation gets at most ``RATIO x`` its reference's tokens ``+ SLACK``
#: (``<eos>`` counted), rounded up to a multiple of ``STEP`` (sentences of one cap decode in one
#: call): a model that never ends its sentences decodes no further than that
RATIO, SLACK, STEP = 1.5, 10, 4


@torch.no_grad()
def validation_loss(
    model: nn.Module, batcher: TokenBatcher, device: torch.device, *, bf16: bool = False
) -> float:
    """Mean negative log-likelihood per target token over every batch of ``batcher`` (no
    label smoothing, eval mode)."""
    training = model.training
    model.eval()
    nll, tokens = 0.0, 0
    autocast = forward_precision(device, bf16)
    try:
        batcher.set_epoch(0)
        for batch in batcher:
            b = batch.to(device)
            with autocast:
                logits = model(b.src, b.tgt_in, b.src_valid_lens)
            _, s, n = sequence_loss(logits, b.tgt_out)
            nll += float(s)
            tokens += n
    finally:
        model.train(training)
    return nll / max(tokens, 1)


def reference_caps(targets: Sequence[str], tgt_tok: Tokenizer, cap: int | None) -> list[int]:
    """Per validation sentence the most tokens its translation may have: ``RATIO`` times its
    reference's tokens (normalised ``targets``, ``<eos>`` counted) plus ``SLACK``, rounded up
    to a multiple of ``STEP``, and never over ``cap`` (the run's pair limit; None: none)."""
    caps = []
    for text in targets:
        n = len(tgt_tok.encode_normalized(text)) + 1
        limit = STEP * math.ceil((RATIO * n + SLACK) / STEP)
        caps.append(limit if cap is None else min(limit, cap))
    return caps


def _decode_capped(
    model: EncoderDecoder,
    sources: Sequence[str],
    caps: Sequence[int] | None,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    device: torch.device,
    decoding: Decoding | None,
) -> list[Any]:
    """:func:`decode_texts` of ``sources``, each sentence's length capped at its ``caps``
    entry as well as by ``decoding`` (one call per distinct cap), in input order. The model
    stays in evaluation mode for all of them: the weights the fast path keeps are made once,
    not again after each call's return to training mode (which drops them)."""
    base = decoding or Decoding()
    groups: dict[int | None, list[int]] = {}
    for i in range(len(sources)):
        groups.setdefault(None if caps is None else caps[i], []).append(i)
    hyps: list[Any] = [None] * len(sources)
    training = model.training
    model.eval()
    try:
        for cap, idx in groups.items():
            dec = base
            if cap is not None:
                dec = base.replace(output_len_cap=min(cap, base.output_len_cap or cap))
            out = decode_texts(model, [sources[i] for i in idx], src_tok, tgt_tok, dec,
                               device=device, pre_normalized=True, warn=False)  # fmt: skip
            for i, h in zip(idx, out):
                hyps[i] = h
    finally:
        model.train(training)
    return hyps


def validation_bleu(
    model: EncoderDecoder,
    pairs: Sequence[tuple[str, str]],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    device: torch.device,
    decoding: Decoding | None = None,
    *,
    references: Sequence[str] | None = None,
    tokenize: str | None = None,
    caps: Sequence[int] | None = None,
) -> Evaluation:
    """sacreBLEU (and chrF) of ``model``'s translations of the normalised sources of ``pairs``.

    ``references`` are the raw reference texts (what sacreBLEU scores against); None scores
    against the normalised targets of ``pairs``. A run validates with ``decoding``'s
    ``output_len_cap`` set to its pair limit (``max_pair_len``: its model never saw longer
    targets), so an untrained model's validation does not decode every sentence to
    ``2 * source + 10`` tokens.
    The translations are decoded by :func:`qkv.inference.decode_texts`, as
    :class:`qkv.translate.Translator` decodes them, with its position-limit policy (a source
    longer than a learned table gets an empty hypothesis, never a crash in the middle of a
    run; nothing is logged: the run said before its first update what its table cannot hold).
    BLEU tokenizes with ``tokenize`` (the run's target's: ``zh``, ``ja-mecab``, ... ; None:
    ``13a``), as ``qkv evaluate`` and ``sacrebleu -l`` score. ``caps`` (one per pair, see
    :func:`reference_caps`) caps each translation's length further, so a model that never ends
    a sentence costs about what a good one costs.
    """
    hyps = _decode_capped(model, [s for s, _ in pairs], caps, src_tok, tgt_tok, device, decoding)
    refs = list(references) if references is not None else [t for _, t in pairs]
    return corpus_scores([tgt_tok.decode(ids) for ids in hyps], refs, tokenize=tokenize)


@dataclass
class ValidationSet:
    """What a run validates on: the batches of its validation split (the loss) and its first
    ``eval_sentences`` pairs with their raw references (BLEU).

    Attributes:
        batches: the validation split's batches (every pair, cut to the run's length limit).
        pairs: ``(normalised source, normalised target)`` pairs whose sources are translated.
        references: the raw reference texts of ``pairs`` (what sacreBLEU scores against).
        src_tokenizer, tgt_tokenizer: the run's tokenizers.
        device: where the model is.
        decoding: how the run's evaluations decode: its ``eval_beam``, the decode length capped
            at its pair limit (``max_pair_len``: its model never saw longer targets).
        tokenize: sacreBLEU's BLEU tokenizer of every score of the run (its checkpoints, the
            average, the decoding choice): its target language's, as ``sacrebleu -l`` picks it.
        caps: each pair's decode length cap (:func:`reference_caps`, from its reference and
            the decoding's cap; set when the set is made).
        best: the best-scoring evaluation of this invocation, its translations included (the
            final model's: the weights and decoding that validate best), for the run's verdict
            (:mod:`qkv.train.verdict`); None before the first.
    """

    batches: TokenBatcher
    pairs: list[tuple[str, str]]
    references: list[str]
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    device: torch.device
    decoding: Decoding
    tokenize: str = "13a"
    best: Evaluation | None = field(default=None, repr=False)
    caps: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.caps:
            cap = self.decoding.output_len_cap
            self.caps = reference_caps([t for _, t in self.pairs], self.tgt_tokenizer, cap)

    def loss(self, model: nn.Module, *, bf16: bool = False) -> float:
        """:func:`validation_loss` of ``model`` on :attr:`batches`."""
        return validation_loss(model, self.batches, self.device, bf16=bf16)

    def bleu(self, model: EncoderDecoder, decoding: Decoding | None = None) -> Evaluation:
        """:func:`validation_bleu` of ``model`` decoding :attr:`pairs` with ``decoding`` (None:
        :attr:`decoding`); the best of them is kept as :attr:`best`."""
        scores = validation_bleu(
            model,
            self.pairs,
            self.src_tokenizer,
            self.tgt_tokenizer,
            self.device,
            decoding or self.decoding,
            references=self.references,
            tokenize=self.tokenize,
            caps=self.caps,
        )
        if self.best is None or scores.bleu >= self.best.bleu:
            self.best = scores
        return scores
