"""The bundled corpus and its generator (``tools/corpus_generator.py``, a developer tool outside
the package): French agreement, elision, determinism, the book's four."""

from __future__ import annotations

import gzip
import itertools
import re
import sys
from pathlib import Path

import pytest

from qkv.data import Normalizer, bundled_corpus_path, bundled_pairs, read_pairs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tools/
from tools.corpus_generator import (
    ADJ,
    ADJECTIVES,
    ASPIRATED,
    BOOK_PAIRS,
    NOUN,
    NOUNS,
    VERB,
    VERBS,
    finish_fr,
    invert,
    starts_with_vowel,
)


@pytest.fixture(scope="module")
def corpus() -> list[tuple[str, str]]:
    return bundled_pairs()


# ------------------------------------------------------------------ the shipped corpus


def test_bundled_corpus_loads_in_one_call(corpus):
    assert len(corpus) == 30_000
    _, report = read_pairs(bundled_corpus_path())
    assert report.n_skipped == 0 and report.format == "fra"
    with gzip.open(bundled_corpus_path(), "rt", encoding="utf-8") as f:
        assert len(f.readline().rstrip("\n").split("\t")) == 3  # fra.txt's three columns


def test_bundled_pairs_are_read_once_and_each_call_gets_its_own_list(monkeypatch):
    from qkv.data import corpus as bundled

    first = bundled_pairs()
    first.clear()  # the caller's list: the next call still gets every pair
    monkeypatch.setattr(bundled, "read_pairs", lambda *a, **k: pytest.fail("read again"))
    again = bundled_pairs()
    assert len(again) == 30_000 and again is not bundled_pairs()


def test_book_sentences_with_their_translations(corpus):
    table = dict(corpus)
    assert table["go ."] == "va !"
    assert table["i lost ."] == "j'ai perdu ."
    assert table["he's calm ."] == "il est calme ."
    assert table["i'm home ."] == "je suis chez moi ."
    assert corpus[:4] == list(BOOK_PAIRS)


def test_distinct_deterministic_lengths_and_normalised(corpus):
    english = [en for en, _ in corpus]
    assert len(set(english)) == len(english)  # one French rendering per English sentence
    assert len(set(corpus)) == len(corpus)
    book = Normalizer.book()
    for en, fr in corpus:
        assert 2 <= len(en.split(" ")) <= 15, en
        assert 2 <= len(fr.split(" ")) <= 15, fr
        assert book(en) == en and book(fr) == fr
    vocab_fr = {w for _, fr in corpus for w in fr.split(" ")}
    assert len(vocab_fr) < 1000  # a vocabulary a small model learns quickly


def _tokens(corpus):
    return [fr.split(" ") for _, fr in corpus]


def test_elision_and_contraction_everywhere(corpus):
    for _, fr in corpus:
        words = fr.split(" ")
        for a, b in itertools.pairwise(words):
            if a in ("je", "ne", "le", "la", "de", "que", "me", "te"):
                assert not starts_with_vowel(b), fr
            assert (a, b) not in {("à", "le"), ("à", "les"), ("de", "le"), ("de", "les")}, fr
            if a == "ce":
                assert not starts_with_vowel(b), fr
            if a == "cet":
                assert starts_with_vowel(b), fr
            if a in ("ma", "ta", "sa"):
                assert not starts_with_vowel(b), fr
        assert not re.search(r"\bje [aeiouéèêh]", fr)
    joined = "\n".join(fr for _, fr in corpus)
    for form in ("j'ai", "n'", "l'", "qu'il", "qu'elle", "d'", "au ", "du "):
        assert form in joined, form


def test_adjective_agreement_and_position(corpus):
    forms = {}
    for a in ADJECTIVES:
        for f in (a.ms, a.fs, a.mp, a.fp, a.mv):
            if f and " " not in f:
                forms.setdefault(f, []).append(a)
    fem_pl = {n.fr_pl: n for n in NOUNS if n.gender == "f" and n.fr_pl != n.fr}
    masc_sg = {n.fr: n for n in NOUNS if n.gender == "m"}
    checked_fp = checked_bel = 0
    for words in _tokens(corpus):
        for i, w in enumerate(words):
            if w in fem_pl and i + 1 < len(words) and words[i + 1] in forms:
                # a feminine plural noun followed by an adjective after it: the fp form
                after = [a for a in forms[words[i + 1]] if not a.before]
                if after:
                    assert words[i + 1] in {a.fp for a in after}, " ".join(words)
                    checked_fp += 1
            if w in fem_pl and i > 0 and words[i - 1] in forms:
                before = [a for a in forms[words[i - 1]] if a.before]
                if before:
                    assert words[i - 1] in {a.fp for a in before}, " ".join(words)
            if w in masc_sg and i > 0 and words[i - 1] in ("beau", "vieux", "nouveau", "bel"):
                # bel / vieil / nouvel exactly before a vowel or mute h
                assert (words[i - 1] == "bel") == starts_with_vowel(w), " ".join(words)
                checked_bel += 1
            if w in ("bel", "vieil", "nouvel"):
                assert starts_with_vowel(words[i + 1]), " ".join(words)
            if w == "des" and i + 1 < len(words):
                # des + plural adjective before the noun -> de
                assert not any(a.before for a in forms.get(words[i + 1], [])), " ".join(words)
    assert checked_fp > 50 and checked_bel > 10


ETRE_PP = {v.pp for v in VERBS if v.aux == "être"}
AVOIR_PP = {v.pp for v in VERBS if v.aux == "avoir" and v.pp not in ETRE_PP}


def test_etre_participles_agree_with_the_subject(corpus):
    expected = {"i": "", "you": "", "he": "", "she": "e", "we": "s", "they": "s"}
    checked = 0
    for en, fr in corpus:
        first = en.split(" ")[0]
        if first not in expected:
            continue
        for w in fr.split(" "):
            for pp in ETRE_PP:
                if w in (pp, pp + "e", pp + "s", pp + "es"):
                    assert w == pp + expected[first], (en, fr)
                    checked += 1
    assert checked > 200


def test_noun_subjects_agree_too(corpus):
    hits = [fr for en, fr in corpus if re.match(r"the (girls|women) (went|left|came|fell)", en)]
    assert len(hits) > 5
    for fr in hits:
        words = fr.split(" ")
        assert words[2] == "sont" and any(w in {pp + "es" for pp in ETRE_PP} for w in words), fr


def test_avoir_participles_do_not_agree(corpus):
    lexical = {f for n in NOUNS for f in (n.fr, n.fr_pl)}
    lexical |= {f for a in ADJECTIVES for f in (a.ms, a.fs, a.mp, a.fp)}
    lexical |= {f for v in VERBS for f in v.present}  # tu ris, ils lisent ...
    agreeing = {pp + e for pp in AVOIR_PP for e in ("e", "s", "es") if not pp.endswith("s")}
    for _, fr in corpus:
        for w in fr.split(" "):
            assert w not in agreeing or w in lexical, fr


def test_negation_questions_and_numbers_are_there(corpus):
    frs = [fr for _, fr in corpus]
    assert sum(" pas " in f for f in frs) > 3000
    assert any(f.startswith("est-ce qu") for f in frs)
    assert any(re.match(r"\w+-t-(il|elle) ", f) for f in frs)  # a-t-il, a-t-elle
    assert any(re.match(r"(es|est|sommes|sont)-(tu|il|elle|nous|ils) ", f) for f in frs)
    assert any("pas de " in f or "pas d'" in f for f in frs)
    assert any("vingt et une " in f or "-une " in f for f in frs)  # feminine numbers
    english = [en for en, _ in corpus]
    assert any(en.startswith("there are twenty-one") for en in english)
    for en in english:
        words = en.split(" ")
        for a, b in itertools.pairwise(words):
            if a == "a":
                assert b[0] not in "aeiou", en
            if a == "an":
                assert b[0] in "aeiou", en


# ------------------------------------------------------------------ the generator itself


def test_finish_fr_and_invert():
    assert finish_fr(["je", "ai", "perdu", "."]) == "j'ai perdu ."
    assert finish_fr(["à", "le", "marché"]) == "au marché"
    assert finish_fr(["à", "le", "hôtel"]) == "à l'hôtel"
    assert finish_fr(["près", "de", "les", "portes"]) == "près des portes"
    assert finish_fr(["de", "la", "eau"]) == "de l'eau"
    assert finish_fr(["est-ce", "que", "il", "ne", "a", "pas", "de", "œufs"]) == (
        "est-ce qu'il n'a pas d'œufs"
    )
    assert finish_fr(["le", "huit"]) == "le huit" and "huit" in ASPIRATED
    assert invert("a", "il") == "a-t-il" and invert("est", "elle") == "est-elle"
    assert invert("es", "tu") == "es-tu" and invert("ont", "ils") == "ont-ils"


def test_lexicon_is_consistent():
    for n in NOUNS:
        assert n.gender in ("m", "f") and n.fr and n.fr_pl
    for v in VERBS:
        assert len(v.present) == 6, v.fr
        assert v.aux in ("avoir", "être")
    assert VERB["eat"].present[3] == "mangeons" and VERB["buy"].present[0] == "achète"
    assert ADJ["white"].fp == "blanches" and ADJ["happy"].fs == "heureuse"
    assert ADJ["old"].form("m", False, before_vowel=True) == "vieil"
    assert ADJ["old"].form("f", True) == "vieilles"
    assert ADJ["late"].form("f", True) == "en retard"


@pytest.fixture(scope="module")
def grammar():
    pytest.importorskip("num2words")
    from tools.corpus_generator import Grammar

    return Grammar(0)


def test_noun_phrases(grammar):
    def np(noun, det, plural, adjs=(), count=0, negated=False):
        out = grammar.np(NOUN[noun], det, plural, adjs=[ADJ[a] for a in adjs], count=count,
                         negated=negated)  # fmt: skip
        return " ".join(out.en), finish_fr(out.fr)

    assert np("man", "the", False, ["old"]) == ("the old man", "le vieil homme")
    assert np("hotel", "this", False, ["new"]) == ("this new hotel", "ce nouvel hôtel")
    assert np("hotel", "this", False) == ("this hotel", "cet hôtel")
    assert np("school", "my", False) == ("my school", "mon école")
    assert np("school", "my", False, ["small"]) == ("my small school", "ma petite école")
    assert np("apple", "a", True, ["big"]) == ("big apples", "de grandes pommes")
    assert np("apple", "a", False) == ("an apple", "une pomme")
    assert np("car", "the", True, ["small", "red"]) == (
        "the small red cars",
        "les petites voitures rouges",
    )
    assert np("house", "a", False, ["beautiful", "white"]) == (
        "a beautiful white house",
        "une belle maison blanche",
    )
    assert np("apple", "num", True, count=21) == ("twenty-one apples", "vingt et une pommes")
    assert np("apple", "num", True, count=81) == ("eighty-one apples", "quatre-vingt-une pommes")
    assert np("cat", "num", True, count=21) == ("twenty-one cats", "vingt et un chats")
    assert np("egg", "a", True, negated=True) == ("eggs", "d'œufs")
    assert np("water", "a", False) == ("water", "de l'eau")
    assert np("coffee", "a", False) == ("coffee", "du café")


def test_participle_agreement(grammar):
    go, eat = VERB["go"], VERB["eat"]
    assert grammar.participle(go, "f", True) == "allées"
    assert grammar.participle(go, "m", True) == "allés"
    assert grammar.participle(go, "f", False) == "allée"
    assert grammar.participle(eat, "f", True) == "mangé"


def test_generation_is_deterministic_and_has_the_book_pairs():
    pytest.importorskip("num2words")
    from tools.corpus_generator import generate

    a, b = generate(400, seed=1), generate(400, seed=1)
    assert a == b and len(a) == 400
    assert generate(400, seed=2) != a
    assert [(en, fr) for en, fr, _ in a[:4]] == list(BOOK_PAIRS)


def test_main_writes_a_readable_file(tmp_path):
    pytest.importorskip("num2words")
    from tools.corpus_generator import main

    out = tmp_path / "c.tsv.gz"
    lines = []
    assert main(["--out", str(out), "--size", "200", "--seed", "3"], emit=lines.append) == 0
    pairs, report = read_pairs(out)
    assert len(pairs) == 200 and report.n_skipped == 0
    assert "wrote 200 pairs" in lines[0]
    again = tmp_path / "d.tsv.gz"
    main(["--out", str(again), "--size", "200", "--seed", "3"], emit=lines.append)
    assert again.read_bytes() == out.read_bytes()  # byte-for-byte reproducible


@pytest.mark.slow
def test_shipped_corpus_is_what_the_generator_writes(tmp_path):
    pytest.importorskip("num2words")
    from tools.corpus_generator import main

    out = tmp_path / "en-fr.tsv.gz"
    main(["--out", str(out), "--size", "30000", "--seed", "0"], emit=lambda _: None)
    assert out.read_bytes() == bundled_corpus_path().read_bytes()
