"""The one decoding policy of every engine (qkv.inference.TranslatorBase): encode, set aside the
blank and the too long, sort by length, batch, place, put back in order, name what the positions
stop; an engine implements one ``_decode_batch``, and results are n-best lists inside, shaped
once at the edge."""

from __future__ import annotations

import logging
import math

import pytest

from qkv.data import Normalizer, WordTokenizer, bundled_pairs
from qkv.inference import Decoding, TextTranslator, TranslatorBase
from qkv.inference.batches import SourceBatch, decode_sorted, sorted_batches
from qkv.inference.engine import one_best_or_all
from qkv.inference.limits import PositionBounds

PAIRS = bundled_pairs()[:300]
TOK = WordTokenizer.train([s for s, _ in PAIRS], normalizer=Normalizer.book())


class Echo(TranslatorBase):
    """An engine whose translation of a source is its ids without ``<eos>``, each repeated
    ``repeat`` times and cut at the source's limit; it records its batches."""

    engine = "echo"

    def __init__(self, repeat: int = 1, bounds: PositionBounds | None = None) -> None:
        self.src_tokenizer = self.tgt_tokenizer = TOK
        self.repeat, self.bounds, self.batches = repeat, bounds or PositionBounds(), []

    def _positions(self) -> PositionBounds:
        return self.bounds

    def _check_decoding(self, decoding: Decoding) -> None:
        if decoding.no_repeat_ngram:
            raise ValueError(f"no_repeat_ngram: the echo engine blocks nothing, got {decoding}")

    def _decode_batch(self, batch: SourceBatch, decoding: Decoding) -> list:
        self.batches.append([len(r) for r in batch.rows])
        assert batch.ids.shape == (len(batch.rows), max(len(r) for r in batch.rows))
        assert batch.lengths.tolist() == [len(r) for r in batch.rows]
        out = []
        for row, limit in zip(batch.rows, batch.limits):
            ids = [i for i in row[:-1] for _ in range(self.repeat)][:limit]
            out.append([(ids, -float(k)) for k in range(decoding.n_best)])
        return out


def _ids(text: str) -> list[int]:
    return TOK.encode(text)


TEXTS = ["i lost .", "", "he is calm and he is here .", "go .", "  "]


def test_an_engine_is_a_text_translator_and_answers_in_input_order():
    tr = Echo()
    assert isinstance(tr, TextTranslator)
    assert tr.generate(TEXTS) == [_ids(t) for t in TEXTS]
    # a blank text comes back as it is (its layout kept)
    assert tr.translate(TEXTS) == [TOK.decode(_ids(t)) if t.strip() else t for t in TEXTS]
    assert tr.translate("go .") == TOK.decode(_ids("go ."))
    assert tr.translate_ids("i lost .") == _ids("i lost .")


def test_a_sentence_that_reads_as_nothing_shows_as_it_is(monkeypatch):
    """A sentence the source tokenizer reads as nothing (as a normaliser that drops symbols
    would read ``***``) is never decoded; its paragraph keeps it as it is."""
    tr = Echo()
    encode = TOK.encode
    monkeypatch.setattr(TOK, "encode", lambda t: [] if t == "***" else encode(t))
    assert tr.translate("go . ***") == f"{TOK.decode(_ids('go .'))} ***"
    assert tr.translate_segments(["***", "go ."]) == ["***", TOK.decode(_ids("go ."))]
    assert tr.hypotheses(["***"]) == [[([], 0.0)]]


def test_results_are_n_best_lists_inside_and_shaped_at_the_edge():
    tr = Echo()
    hyps = tr.hypotheses(TEXTS)  # n_best=1: still one list per text
    assert [len(h) for h in hyps] == [1] * len(TEXTS)
    assert hyps[1] == hyps[4] == [([], 0.0)]  # nothing to translate: the empty one, certain
    two = tr.hypotheses(TEXTS, beam_size=2, n_best=2)
    assert two[1] == [([], 0.0), ([], -math.inf)]
    assert two[0] == [(_ids(TEXTS[0]), 0.0), (_ids(TEXTS[0]), -1.0)]
    assert tr.generate(TEXTS, beam_size=2, n_best=2) == two
    assert one_best_or_all(two, 1) == tr.generate(TEXTS)
    assert tr.translate("go .", beam_size=2, n_best=2)[1] == (TOK.decode(_ids("go .")), -1.0)


def test_sources_are_sorted_by_length_and_batched_by_the_token_budget():
    tr = Echo()
    texts = [" ".join(["go"] * n) for n in (5, 1, 3, 2, 4)]
    tr.generate(texts, max_tokens=8)
    # 2, 3, 4, 5, 6 ids (<eos> counted): each batch's size times its longest within 8 tokens
    assert tr.batches == [[2, 3], [4], [5], [6]]
    tr.batches.clear()
    tr.generate(texts, max_tokens=8, beam_size=2)  # the beam counts too
    assert tr.batches == [[2], [3], [4], [5], [6]]
    assert sorted_batches([3, 2, 3], Decoding(max_tokens=100)) == [[1, 0, 2]]  # ties in order


def test_an_engine_may_batch_by_sentences_and_one_limit():
    tr = Echo()
    tr.batch_sentences, tr.one_limit_per_batch = 2, True
    texts = ["go .", "hi .", "run .", "i lost .", "he is calm ."]
    tr.generate(texts)  # greedy: any limits together
    assert tr.batches == [[3, 3], [3, 4], [5]]
    tr.batches.clear()
    tr.generate(texts, beam_size=2)  # a beam: one limit per batch
    assert tr.batches == [[3, 3], [3], [4], [5]]


def test_what_the_positions_cannot_read_is_skipped_and_named(caplog):
    bounds = PositionBounds(source=4, target=6, named="the echo's 4 positions")
    tr = Echo(repeat=3, bounds=bounds)
    texts = ["go .", "he is calm and he is here .", "i lost ."]
    with caplog.at_level(logging.WARNING, logger="qkv"):
        hyps = tr.hypotheses(texts, beam_size=2, n_best=2)
    assert hyps[1] == [([], -math.inf)] * 2
    assert len(hyps[0][0][0]) == 6  # stopped at the target bound
    msgs = [r.getMessage() for r in caplog.records]
    assert (
        msgs[0] == "input 2: more source tokens than the echo's 4 positions: not translated (empty)"
    )
    assert msgs[1].startswith("inputs 1, 3: translation stopped at 6 tokens, the echo's 4")
    assert len(msgs) == 2


def test_an_announced_bound_is_said_once_before_decoding(caplog):
    bounds = PositionBounds(target=6, named="-", announced="the echo's 6 target positions")
    tr = Echo(repeat=3, bounds=bounds)
    with caplog.at_level(logging.WARNING, logger="qkv"):
        tr.generate(["i lost .", "go ."])  # stopped at 6: not named one by one
        assert caplog.records == []
        tr.generate(["go ."], max_output_len=9)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert msg == (
        "max_output_len (--max-output-len) 9 is more than the echo's 6 target positions: "
        "translations stop at 6 tokens"
    )


def test_progress_counts_the_texts_not_decoded_first():
    seen = []
    Echo().generate(["", "go .", "i lost ."], max_tokens=4, progress=seen.append)
    assert seen == [2, 3]


def test_an_engine_refuses_what_it_cannot_do_before_anything():
    tr = Echo()
    with pytest.raises(ValueError, match="no_repeat_ngram: the echo engine"):
        tr.generate([""], no_repeat_ngram=2)
    assert tr.batches == []


def test_decode_sorted_places_each_batch_and_keeps_the_order():
    seen = []

    def decode(batch, decoding):
        seen.append((batch.ids.tolist(), batch.limits))
        return [[(row, 0.0)] for row in batch.rows]

    src = [[5, 6, 2], [7, 2], []]
    out = decode_sorted(src, [9, 8, 7], Decoding(), decode, eos_id=2)
    assert out == [[([5, 6, 2], 0.0)], [([7, 2], 0.0)], [([], 0.0)]]
    assert seen == [([[2, 0, 0], [7, 2, 0], [5, 6, 2]], [7, 8, 9])]  # empty: <eos>, padded
