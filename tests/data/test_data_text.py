"""Normalizer, Vocab and the tokenizers: round trips with accents and unknown words."""

from __future__ import annotations

import json
import unicodedata

import pytest

from qkv.data import (
    Normalizer,
    SentencePieceTokenizer,
    Vocab,
    WordTokenizer,
    build_tokenizers,
    encode_pairs,
    load_tokenizer,
    load_tokenizers,
    save_tokenizers,
)


def book_preprocess(text: str) -> str:
    """The book's preprocess_nmt, written out as its loop (the reference)."""
    text = text.replace("\u202f", " ").replace("\xa0", " ").lower()
    out = []
    for i, ch in enumerate(text):
        out.append(" " + ch if i > 0 and ch in ",.!?" and text[i - 1] != " " else ch)
    return "".join(out)


@pytest.mark.parametrize(
    "text",
    [
        "Go.",
        "Va !",
        "J'ai perdu.",
        "Il est calme.",
        "Hello,world...",
        "Qui ?\u202fMoi\u00a0!",
        "Ça va?",
        ". starts with a dot",
        "a  . b",
    ],
)
def test_book_normalizer_matches_the_book(text):
    # the book's, with whitespace collapsed (the same words wherever the book's words have no
    # whitespace inside them)
    assert Normalizer.book()(text) == " ".join(book_preprocess(text).split())
    assert Normalizer.book()(text).split(" ") == [w for w in book_preprocess(text).split(" ") if w]


def test_book_normalizer_treats_tabs_and_newlines_as_spaces():
    book = Normalizer.book()
    assert book("a\tb.") == "a b ."  # the book's loop gives the one word "a\tb"
    assert book(" Il\test\n calme\u00a0! ") == "il est calme !"
    assert book("a\t.") == "a ."
    assert book(book("a\tb.")) == book("a\tb.")
    tok = WordTokenizer.train(["a\tb."], min_freq=1, normalizer=book)
    assert tok.vocab.tokens[4:] == [".", "a", "b"]


def test_nfc_and_whitespace():
    decomposed = "E\u0301le\u0300ve"  # É l è v e with combining accents
    n = Normalizer()
    assert n(decomposed) == unicodedata.normalize("NFC", decomposed) == "Élève"
    assert n("  a \t b\n ") == "a b"
    assert Normalizer(unicode_form=None, collapse_whitespace=False)(decomposed) == decomposed
    assert Normalizer.book()(decomposed) == "élève"


def test_normalizer_round_trips_through_json():
    for n in (Normalizer(), Normalizer.book(), Normalizer(lowercase=True, unicode_form="NFKC")):
        d = json.loads(json.dumps(n.to_dict()))
        m = Normalizer.from_dict(d)
        assert m == n
        assert m("Ça VA ?") == n("Ça VA ?")


def test_normalizer_bad_input():
    with pytest.raises(ValueError, match="unicode_form must be one of"):
        Normalizer(unicode_form="NFX")
    with pytest.raises(TypeError, match="lowercase must be a bool"):
        Normalizer(lowercase="yes")
    with pytest.raises(ValueError, match="space_before_punct must not contain whitespace"):
        Normalizer(space_before_punct=". ")
    with pytest.raises(ValueError, match="unknown Normalizer keys"):
        Normalizer.from_dict({"lowercase": True, "stem": True})
    with pytest.raises(TypeError, match="text must be a str"):
        Normalizer()(b"bytes")
    assert Normalizer.book().pairs([("Go.", "Va!")]) == [("go .", "va !")]


def test_vocab_specials_and_order():
    v = Vocab.build([["b", "a", "b"], ["c", "a", "b"], ["d"]], min_freq=2)
    assert v.tokens == ["<pad>", "<bos>", "<eos>", "<unk>", "b", "a"]
    assert (v.pad_id, v.bos_id, v.eos_id, v.unk_id) == (0, 1, 2, 3)
    assert v["b"] == 4 and v["zzz"] == v.unk_id and "c" not in v
    assert v.encode(["a", "c"]) == [5, 3]
    assert v.decode([4, 5, 3]) == ["b", "a", "<unk>"]
    assert Vocab.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    assert len(Vocab.build([["x"]], max_size=0)) == 4
    with pytest.raises(ValueError, match="ids must lie in"):
        v.decode([99])
    with pytest.raises(ValueError, match="min_freq must be an int >= 1"):
        Vocab.build([], min_freq=0)
    with pytest.raises(ValueError, match="duplicates"):
        Vocab(["a", "a"])
    with pytest.raises(ValueError, match="duplicates"):
        Vocab(["<unk>"])


def test_vocab_reserved_and_file(tmp_path):
    v = Vocab.build([["a"]], reserved=["<sep>"])
    assert v.tokens[4] == "<sep>" and v["a"] == 5
    v.save(tmp_path / "v.json")
    assert Vocab.load(tmp_path / "v.json") == v


TRAIN = [
    "L'élève a vu le garçon.",
    "Le garçon est à l'école.",
    "Où est l'élève ?",
    "Ça va, merci !",
    "J'ai perdu mes clés à l'hôtel.",
    "Le café est très bon.",
]


def test_word_tokenizer_round_trip_accents_and_unknown(tmp_path):
    tok = WordTokenizer.train(TRAIN, min_freq=1, normalizer=Normalizer.book())
    text = "L'élève est à l'école !"
    ids = tok.encode(text)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == "l'élève est à l'école !"
    unknown = tok.encode("Le zèbre est à l'école.")
    assert unknown.count(tok.unk_id) == 1
    assert tok.decode(unknown) == "le <unk> est à l'école ."
    # decode drops <pad>/<bos>/<eos>
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id, tok.pad_id]) == tok.decode(ids)
    tok.save(tmp_path / "w")
    again = WordTokenizer.load(tmp_path / "w")
    assert again.encode(text) == ids and again.vocab == tok.vocab
    assert again.normalizer == Normalizer.book()
    assert isinstance(load_tokenizer(tmp_path / "w"), WordTokenizer)


def test_word_tokenizer_min_freq_is_the_books():
    tok = WordTokenizer.train(["a b", "a c"], min_freq=2)
    assert tok.vocab.tokens[4:] == ["a"]
    assert tok.encode("a b") == [4, tok.unk_id]


def test_word_tokenizer_decomposed_input_matches_composed():
    tok = WordTokenizer.train(["élève"], min_freq=1, normalizer=Normalizer())
    assert tok.encode("e\u0301le\u0300ve") == tok.encode("élève") == [4]


def test_literal_special_token_text_encodes_to_unk():
    # a literal "<eos>" in a target must not teach early stopping, nor a literal "<pad>" vanish
    # from the loss: special-token text is an unknown word, as in SentencePiece
    tok = WordTokenizer.train(["je suis chez moi ."], min_freq=1, normalizer=Normalizer.book())
    text = "je <eos> suis <pad> chez <bos> moi <unk> ."
    ids = tok.encode(text)
    assert ids == tok.encode_normalized(Normalizer.book()(text))
    assert [tok.pad_id, tok.bos_id, tok.eos_id] == [0, 1, 2]
    assert not {tok.pad_id, tok.bos_id, tok.eos_id} & set(ids)
    assert ids.count(tok.unk_id) == 4 and len(ids) == 9
    assert tok.decode(ids) == "je <unk> suis <unk> chez <unk> moi <unk> ."
    src, tgt = encode_pairs([("<eos>", "<pad> moi")], tok, tok)
    assert src == [[tok.unk_id]] and tgt == [[tok.unk_id, tok.encode("moi")[0]]]


def test_sentencepiece_literal_special_token_text_is_not_special():
    pytest.importorskip("sentencepiece")
    tok = SentencePieceTokenizer.train([t.lower() for t in TRAIN] * 3, vocab_size=60)
    ids = tok.encode("le <eos> <pad> garçon")
    assert not {tok.pad_id, tok.bos_id, tok.eos_id} & set(ids)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_round_trip(tmp_path, model_type):
    pytest.importorskip("sentencepiece")
    texts = [t.lower() for t in TRAIN] * 3
    tok = SentencePieceTokenizer.train(
        texts, vocab_size=60, model_type=model_type, normalizer=Normalizer.book()
    )
    assert [tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id] == [0, 1, 2, 3]
    for text in [
        "L'élève a vu le garçon.",
        "Où est l'hôtel ?",
        "Le garçon a vu l'élève à l'école.",
    ]:
        ids = tok.encode(text)
        assert all(4 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == Normalizer.book()(text)
    # an unseen word made of seen letters still round-trips; an unseen letter is <unk>
    assert tok.decode(tok.encode("éléphant")) == "éléphant"
    assert tok.unk_id in tok.encode("zèbre")
    tok.save(tmp_path / "sp")
    assert (tmp_path / "sp" / "spm.model").is_file()
    again = load_tokenizer(tmp_path / "sp")
    assert isinstance(again, SentencePieceTokenizer)
    assert again.encode("Où est l'élève ?") == tok.encode("Où est l'élève ?")
    with pytest.raises(ValueError, match="not a 'word' one"):
        WordTokenizer.load(tmp_path / "sp")


def test_sentencepiece_byte_fallback_round_trips_anything():
    pytest.importorskip("sentencepiece")
    tok = SentencePieceTokenizer.train(TRAIN * 3, vocab_size=300, byte_fallback=True)
    text = "Zèbre ß 日本"
    assert tok.decode(tok.encode(text)) == text


def test_sentencepiece_bad_arguments():
    pytest.importorskip("sentencepiece")
    with pytest.raises(ValueError, match="model_type must be"):
        SentencePieceTokenizer.train(TRAIN, model_type="wordpiece")
    with pytest.raises(ValueError, match="at least one non-empty sentence"):
        SentencePieceTokenizer.train(["", " "])
    with pytest.raises(TypeError, match="model must be the bytes"):
        SentencePieceTokenizer("not bytes")  # type: ignore[arg-type]


def test_sentencepiece_too_small_vocab_size_is_a_value_error():
    pytest.importorskip("sentencepiece")
    texts = ["Je suis chez moi.", "Il est calme.", "Va !", "Élève à l'école."] * 5
    chars = len(set("".join(texts)) - {" "}) + 1  # SentencePiece's "▁" stands for the space
    with pytest.raises(ValueError, match=rf"vocab_size=10 is too small.*at least {chars + 4}"):
        SentencePieceTokenizer.train(texts, vocab_size=10)
    assert SentencePieceTokenizer.train(texts, vocab_size=chars + 4).vocab_size == chars + 4
    with pytest.raises(ValueError, match=r"256 byte pieces.*vocab_size >= "):
        SentencePieceTokenizer.train(texts, vocab_size=100, byte_fallback=True)
    with pytest.raises(ValueError, match="character_coverage must lie in"):
        SentencePieceTokenizer.train(texts, vocab_size=100, character_coverage=0.5)
    with pytest.raises(ValueError, match="character_coverage must be a fraction"):
        SentencePieceTokenizer.train(texts, vocab_size=100, character_coverage=2)


PAIRS = [
    ("I lost.", "J'ai perdu."),
    ("He's calm.", "Il est calme."),
    ("I'm home.", "Je suis chez moi."),
    ("Go.", "Va !"),
]


def test_build_joint_and_separate(tmp_path):
    src, tgt = build_tokenizers(PAIRS, "word", min_freq=1, normalizer=Normalizer.book())
    assert src is not tgt
    assert "calme" in tgt.vocab and "calme" not in src.vocab
    save_tokenizers(tmp_path / "sep", src, tgt)
    s2, t2 = load_tokenizers(tmp_path / "sep")
    assert s2.vocab == src.vocab and t2.vocab == tgt.vocab
    j1, j2 = build_tokenizers(PAIRS, "word", joint=True, min_freq=1)
    assert j1 is j2
    save_tokenizers(tmp_path / "joint", j1, j2)
    k1, k2 = load_tokenizers(tmp_path / "joint")
    assert k1 is k2 and k1.vocab == j1.vocab
    s_ids, t_ids = encode_pairs(PAIRS, src, tgt)
    assert [src.decode(i) for i in s_ids] == ["i lost .", "he's calm .", "i'm home .", "go ."]
    assert t_ids[1] == tgt.encode("Il est calme.")
    with pytest.raises(ValueError, match="kind must be one of"):
        build_tokenizers(PAIRS, "char")
    with pytest.raises(ValueError, match="at least one"):
        build_tokenizers([], "word")


def test_tokenizer_type_errors():
    with pytest.raises(TypeError, match=r"vocab must be a qkv\.data\.Vocab"):
        WordTokenizer(["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="normalizer must be"):
        WordTokenizer(Vocab(), normalizer="book")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="texts must yield str"):
        WordTokenizer.train([1, 2])  # type: ignore[list-item]
