"""Pegasus (``transformers``' ``PegasusForConditionalGeneration``): the pre-norm sibling of
Marian, and the ``transformers`` class that expresses a pre-norm qkv Transformer exactly.

Its blocks are Marian's (the same parameter names, the same biased attention and feed-forward
layers, LayerNorm eps 1e-5) applied pre-norm, with a layer norm after the last block of each
stack (qkv's ``encoder.norm``/``decoder.norm``), the same sinusoid table (sines then cosines,
the residual permutation of :mod:`qkv.interop.marian`), ``scale_embedding``,
``final_logits_bias`` and one vocabulary for both sides. So :func:`to_transformers` is Marian's
table read with the blocks' order aside, plus the two final norms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..nn.seq2seq import Seq2SeqConfig
from . import marian
from ._table import ROWS, Param, inverse_permutation, permuted

__all__ = ["FINAL_NORMS", "MODEL_TYPE", "to_transformers", "transformers_config", "why_not"]

#: ``config.json``'s ``model_type`` of a Pegasus model
MODEL_TYPE = "pegasus"
#: the layer norms after the last block of each stack: Pegasus's name, qkv's
FINAL_NORMS = [
    Param(f"model.{side}.layer_norm.{w}", f"{side}.norm.{w}", ROWS)
    for side in ("encoder", "decoder")
    for w in ("weight", "bias")
]
#: ``MarianConfig`` fields Pegasus does not have (one vocabulary, always shared)
_MARIAN_ONLY = ("decoder_vocab_size", "share_encoder_decoder_embeddings")


def why_not(c: Seq2SeqConfig) -> str | None:
    """Why Pegasus cannot express the model ``c`` describes, or None when it can."""
    if c.kind != "transformer":
        return f"a {c.kind!r} model, not a Transformer"
    if not c.norm_first:
        return "post-norm blocks (Pegasus's are pre-norm: a post-norm model is Marian)"
    if c.pos_encoding != "sinusoidal":
        return f"{c.pos_encoding!r} positions (Pegasus's are sinusoidal)"
    if not c.share_embeddings or c.src_vocab_size != c.tgt_vocab_size:
        return "a vocabulary per side (Pegasus has one embedding table for both)"
    return None


def _as_marian(c: Seq2SeqConfig) -> Seq2SeqConfig:
    """``c`` read as a post-norm model: the blocks' tensors have the same names and shapes."""
    why = why_not(c)
    if why is not None:
        raise ValueError(f"config: not a Pegasus model: {why}")
    return dataclasses.replace(c, norm_first=False)


def transformers_config(
    c: Seq2SeqConfig,
    *,
    pad_id: int,
    eos_id: int,
    decoder_start_id: int | None = None,
    max_length: int | None = None,
) -> dict[str, Any]:
    """The ``PegasusConfig`` fields (``config.json``'s) of the model ``c`` describes (the
    arguments as :func:`qkv.interop.marian.transformers_config`'s).

    Raises:
        ValueError: ``c`` is not a model Pegasus expresses (:func:`why_not`).
    """
    out = marian.transformers_config(
        _as_marian(c),
        pad_id=pad_id,
        eos_id=eos_id,
        decoder_start_id=decoder_start_id,
        max_length=max_length,
    )
    for key in _MARIAN_ONLY:
        out.pop(key, None)
    out["model_type"] = MODEL_TYPE
    out["architectures"] = ["PegasusForConditionalGeneration"]
    return out


def to_transformers(c: Seq2SeqConfig, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The Pegasus state dict of the pre-norm qkv model of config ``c`` and ``state_dict``:
    Marian's tensors (:func:`qkv.interop.marian.to_transformers`), its position tables (which
    Pegasus saves and reads) and the two final layer norms, the permutation undone.

    Raises:
        ValueError: ``c`` is not a model Pegasus expresses (:func:`why_not`).
    """
    sd = marian.to_transformers(_as_marian(c), state_dict, positions=True)
    q = inverse_permutation(marian.residual_permutation(c.num_hiddens))
    for param in FINAL_NORMS:
        sd[param.hf] = permuted(state_dict[param.qkv], param.kind, q)
    return sd
