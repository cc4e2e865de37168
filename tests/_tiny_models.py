"""A tiny translator built in Python, shared by the tests that save, export and serve one."""

from __future__ import annotations

import torch

from qkv.data import Normalizer, WordTokenizer, bundled_pairs
from qkv.nn import Seq2SeqConfig, build_model


def tiny_translator(
    pairs: list[tuple[str, str]], eos_boost: float, *, layers: int = 1, heads: int = 2
) -> tuple[torch.nn.Module, WordTokenizer, WordTokenizer]:
    """A ``layers``+``layers``-layer, ``heads``-head, 32-wide Transformer (random weights,
    seeded) in eval mode, with word tokenizers trained on ``pairs``; ``eos_boost`` is added to
    the EOS logit's bias so sentences stop before the length limit, at different lengths.
    Returns (model, src, tgt)."""
    norm = Normalizer.book()
    src = WordTokenizer.train([s for s, _ in pairs], normalizer=norm)
    tgt = WordTokenizer.train([t for _, t in pairs], normalizer=norm)
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(
        src_vocab_size=src.vocab_size,
        tgt_vocab_size=tgt.vocab_size,
        num_hiddens=32,
        ffn_num_hiddens=64,
        num_heads=heads,
        num_enc_layers=layers,
        num_dec_layers=layers,
        dropout=0.0,
    )
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.decoder.dense.bias[tgt.eos_id] += eos_boost
    return model, src, tgt


#: the settings of the tiny model most tests of saved, exported and served folders share (their
#: ONNX trace is made once per run: tests/_onnx_cache.py)
SHARED_PAIRS = 600
SHARED_EOS_BOOST = 1.8


def shared_translator() -> tuple[torch.nn.Module, WordTokenizer, WordTokenizer]:
    """:func:`tiny_translator` on the first :data:`SHARED_PAIRS` bundled pairs with
    :data:`SHARED_EOS_BOOST`: the one tiny model of many test files."""
    return tiny_translator(bundled_pairs()[:SHARED_PAIRS], eos_boost=SHARED_EOS_BOOST)
