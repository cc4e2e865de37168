"""A 2+2-layer, 4-head Transformer translator (random weights, seeded) and one sentence's
attention, shared by the viewer's view tests and its comparison with bertviz."""

from __future__ import annotations

from _tiny_models import tiny_translator

from qkv.translate import SentenceAttention, Translator

#: each pair twice: the word tokenizers keep the words seen at least twice
PAIRS = [("i lost .", "j'ai perdu ."), ("he's calm .", "il est calme ."), ("go .", "va !")] * 2


def sentence_attention(
    text: str = "he's calm .", target: str = "il est calme ."
) -> SentenceAttention:
    """``text``'s attention, the decoder fed ``target``'s tokens (the model is untrained: its
    own translation would be arbitrary)."""
    model, src, tgt = tiny_translator(PAIRS, eos_boost=0.0, layers=2, heads=4)
    tr = Translator(model, src, tgt)
    ids = [i for i in tgt.encode(target) if i not in (tgt.bos_id, tgt.eos_id)]
    return tr.attention(text, ids=ids)
