"""A request as one typed value (qkv.serve.Asked) and the Decoding a model decodes it with: the
served decoding with the beam asked, widened to the alternatives asked on the last model of a
route; the batcher keys its jobs by that Decoding, and a lane decodes with it."""

from __future__ import annotations

import math

import pytest

from qkv.inference import Decoding
from qkv.serve import Asked, ServeConfig, create_app

SERVED = Decoding(beam_size=3, length_penalty=0.6, no_repeat_ngram=3, max_tokens=512)


def test_a_request_leaves_the_beam_to_the_model_or_asks_its_own():
    assert Asked(("go .",)).decoding(SERVED) == SERVED
    assert Asked(("go .",), beam_size=5).decoding(SERVED) == SERVED.replace(beam_size=5)
    two = Asked(("go .",), alternatives=1).decoding(SERVED)
    assert (two.beam_size, two.n_best, two.length_penalty) == (3, 2, 0.6)
    wide = Asked(("go .",), alternatives=4).decoding(SERVED)  # widened to the translations asked
    assert (wide.beam_size, wide.n_best, wide.max_tokens) == (5, 5, 512)


def test_an_earlier_model_of_a_pivot_gives_its_best():
    asked = Asked(("go .",), beam_size=4, alternatives=2)
    first = asked.decoding(SERVED, last=False)
    assert (first.beam_size, first.n_best) == (4, 1)
    assert asked.decoding(SERVED).n_best == 3


def test_a_lane_decodes_with_the_value_and_gives_n_best_lists(translator):
    app = create_app(translator, ServeConfig(source_lang="en", target_lang="fr"))
    (lane,) = app.state.qkv.registry.lanes
    assert lane.decoding == translator.decoding.replace(max_tokens=4096)
    texts = ["go .", "", "i lost ."]
    one = lane.decode(texts, lane.decoding)
    assert [len(found) for found in one] == [1, 1, 1] and one[1] == [("", 0.0)]
    # each text one sentence, shown as the engine shows it (no doubled or end spaces)
    assert [found[0][0] for found in one] == translator.translate_segments(texts)
    three = lane.decode(texts, Asked(tuple(texts), alternatives=2).decoding(lane.decoding))
    assert three[1] == [("", 0.0)]  # no other translation of nothing
    nbest = translator.translate(texts, n_best=3, split="none")
    assert [[t for t, _ in found] for found in three] == [
        [t for t, score in hyps if score > -math.inf] for hyps in nbest
    ]
    assert [s for _, s in three[0]] == pytest.approx([s for _, s in nbest[0]])
    assert lane.tokens(["go ."], Decoding(beam_size=3)) == 3 * len(translator.encode("go ."))
