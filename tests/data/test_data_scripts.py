"""Text handling per script (issue 26): real sentences in Chinese, Japanese, Arabic, Russian and
German (full-width punctuation, right-to-left text, combining marks) round-trip unchanged
through the normaliser and the tokenizers a run trains, through a translator, and through the
server's JSON."""

from __future__ import annotations

import unicodedata

import pytest

from qkv.data import Normalizer, build_tokenizers
from qkv.data.splits import normalized_source

SENTENCES = {
    "zh": ["猫在椅子上睡觉。", "请问，火车站在哪里？", "“你好！”她说：（笑）"],
    "ja": ["猫は椅子の上で寝ています。", "駅はどこですか？", "「ありがとう」と言った。"],
    "ar": ["القطة نائمة على الكرسي.", "أين محطة القطار؟", "مَرْحَبًا بِكُمْ"],
    "ru": ["Кошка спит на стуле.", "Где вокзал?", "Ёлка «зелёная» — ещё."],
    "de": ["Die Katze schläft auf dem Stuhl.", "Wo ist der Bahnhof?", "Größe: „Maß“ – Straße."],
    # combining marks with no precomposed form (NFC keeps them): Devanagari, Vietnamese
    "hi": ["नमस्ते, आप कैसे हैं?"],
    "vi": ["Tiếng Việt có dấu: ở, ữ, ậ."],
}
ALL = [s for ss in SENTENCES.values() for s in ss]


def test_the_sentences_are_in_nfc():
    assert all(unicodedata.normalize("NFC", s) == s for s in ALL)


def test_the_plain_normaliser_and_the_split_key_leave_caseless_scripts_alone():
    norm = Normalizer()
    assert [norm(s) for s in ALL] == ALL
    for lang in ("zh", "ja", "ar"):  # no case to fold: the split's key is the text itself
        for s in SENTENCES[lang]:
            assert normalized_source(s).replace(" ", "") == s.replace(" ", "")


@pytest.mark.parametrize("coverage", [1.0, 0.9995])
def test_sentencepiece_round_trips_every_script(coverage):
    pytest.importorskip("sentencepiece")
    pairs = [(s, t) for s in ALL for t in ALL[:3]] * 3
    src, tgt = build_tokenizers(
        pairs, "sentencepiece", joint=True, vocab_size=600, model_type="unigram",
        byte_fallback=True, character_coverage=coverage, normalizer=Normalizer(),
    )  # fmt: skip
    for s in ALL:
        assert tgt.decode(tgt.encode(s)) == s
        assert src.decode(src.encode(s)) == s


def test_a_translator_and_the_server_return_the_text_unchanged():
    pytest.importorskip("sentencepiece")
    pytest.importorskip("starlette")
    import httpx

    from qkv.inference import Decoding, TranslatorBase
    from qkv.serve import ServeConfig, create_app

    pairs = [(s, s) for s in ALL] * 3
    tok, _ = build_tokenizers(
        pairs, "sentencepiece", joint=True, vocab_size=600, byte_fallback=True,
        character_coverage=0.9995, normalizer=Normalizer(),
    )  # fmt: skip

    class Copy(TranslatorBase):
        """An engine whose translation is its source: what text handling alone gives back."""

        engine = "copy"

        def __init__(self) -> None:
            self.src_tokenizer = self.tgt_tokenizer = tok
            self._decoding = Decoding()
            self._languages = ("en", "zh")

        def _decode_batch(self, batch, decoding):
            return [[(row[:-1], 0.0)] for row in batch.rows]  # the source's ids, <eos> dropped

    tr = Copy()
    assert tr.translate(ALL) == ALL
    app = create_app(tr, ServeConfig(batching=False))
    transport = httpx.ASGITransport(app=app)

    async def ask() -> list[str]:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            out = []
            for s in ALL:
                r = await client.post("/translate", json={"q": s, "source": "en", "target": "zh"})
                out.append(r.json()["translatedText"])
            r = await client.post("/translate", data={"q": ALL[0], "source": "en", "target": "zh"})
            out.append(r.json()["translatedText"])
            return out

    import asyncio

    async def with_lifespan() -> list[str]:
        async with app.router.lifespan_context(app):
            return await ask()

    assert asyncio.run(with_lifespan()) == [*ALL, ALL[0]]
