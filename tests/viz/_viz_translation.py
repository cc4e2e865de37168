"""A 2+2-layer, 4-head Transformer translator (random weights, seeded) and one sentence's
attention, shared by the viewer's view tests and its comparison with bertviz."""

from __future__ import annotations

import torch

from qkv.data import Normalizer, WordTokenizer
from qkv.nn import Seq2SeqConfig, build_model
from qkv.translate import SentenceAttention, Translator

PAIRS = [("i lost .", "j'ai perdu ."), ("he's calm .", "il est calme ."), ("go .", "va !")]


def sentence_attention(
    text: str = "he's calm .", target: str = "il est calme ."
) -> SentenceAttention:
    """``text``'s attention, the decoder fed ``target``'s tokens (the model is untrained: its
    own translation would be arbitrary)."""
    norm = Normalizer.book()
    src = WordTokenizer.train([s for s, _ in PAIRS * 2], normalizer=norm)
    tgt = WordTokenizer.train([t for _, t in PAIRS * 2], normalizer=norm)
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(
        src_vocab_size=src.vocab_size,
        tgt_vocab_size=tgt.vocab_size,
        num_hiddens=32,
        ffn_num_hiddens=64,
        num_heads=4,
        num_enc_layers=2,
        num_dec_layers=2,
        dropout=0.0,
    )
    model = build_model(cfg).eval()
    tr = Translator(model, src, tgt)
    ids = [i for i in tgt.encode(target) if i not in (tgt.bos_id, tgt.eos_id)]
    return tr.attention(text, ids=ids)
