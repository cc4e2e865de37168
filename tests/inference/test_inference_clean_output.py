"""Clean output: a SentencePiece model's ``▁`` pieces (a run of them at the end of a
translation, as a young model emits) decode to spaces; every engine shows its translations
without leading, trailing or doubled spaces, through translate and translate_segments."""

from __future__ import annotations

import pytest

from qkv.data import SentencePieceTokenizer, bundled_pairs
from qkv.inference import Decoding, TranslatorBase
from qkv.inference.batches import SourceBatch

pytest.importorskip("sentencepiece")

PAIRS = bundled_pairs()[:2000]


@pytest.fixture(scope="module")
def spm():
    return SentencePieceTokenizer.train([t for _, t in PAIRS], vocab_size=300)


class Spaces(TranslatorBase):
    """An engine whose every translation is the pieces of ``text`` then ``runs`` pieces that
    decode to nothing but spaces (SentencePiece's ``▁``)."""

    engine = "spaces"

    def __init__(self, tok: SentencePieceTokenizer, text: str, runs: int) -> None:
        self.src_tokenizer = self.tgt_tokenizer = tok
        space = tok.tokens().index("\u2581")
        self.ids = [space, *tok.encode(text), *[space] * runs]

    def _decode_batch(self, batch: SourceBatch, decoding: Decoding) -> list:
        return [[(list(self.ids), 0.0)] for _ in batch.rows]


def test_the_pieces_decode_to_runs_of_spaces_and_are_shown_clean(spm):
    tr = Spaces(spm, "je suis là", runs=5)
    raw = spm.decode(tr.ids)
    assert raw != raw.strip() or "  " in raw  # the pieces do leave spaces
    assert tr.detokenize(tr.ids) == "je suis là"
    assert tr.translate("go .") == "je suis là"
    assert tr.translate("Go. Now.\n  Bye.") == "je suis là je suis là\n  je suis là"
    assert tr.translate_segments(["go .", "hi ."]) == ["je suis là"] * 2
