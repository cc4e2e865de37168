"""Paragraphs through ``/translate``: each text cut into sentences with its layout kept (line
breaks, blank lines, indentation), coming back exactly as the library gives it
(``translator.translate(text)``), for every engine the server runs (qkv, CTranslate2, ONNX);
the sentences of many requests still decoded together by the batching queue."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from _serve_helpers import live_server, wait_until

#: a paragraph of two sentences, three lines, a blank line and an indented line
PARAGRAPHS = [
    "I am home. He is calm.",
    "Go on.\nI lost. Thank you!\nGood night.",
    "  Hello. Goodbye.\n\n    Stop!  \n",
    "",
    "Tom is here? Mary is not.",
    "***\nGo on. 42",  # a line that reads as nothing shows as it is, as the library shows it
]


def check_layout(source: str, translation: str) -> None:
    """The shape a translation keeps: its lines, blank lines and the spaces that begin them."""
    src, out = source.split("\n"), translation.split("\n")
    assert len(out) == len(src)
    for a, b in zip(src, out):
        assert (a.strip() == "") == (b.strip() == "")
        assert b[: len(b) - len(b.lstrip())] == a[: len(a) - len(a.lstrip())]


def test_paragraphs_come_back_as_the_library_gives_them(live, translator):
    r = live.post("/translate", json={"q": PARAGRAPHS[0], "source": "en", "target": "fr"})
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": translator.translate(PARAGRAPHS[0])}
    # the two sentences' translations, each alone, joined
    halves = translator.translate_segments(["I am home.", "He is calm."])
    assert r.json()["translatedText"] == " ".join(
        t or s for t, s in zip(halves, ["I am home.", "He is calm."])
    )
    r = live.post("/translate", json={"q": PARAGRAPHS})
    assert r.json()["translatedText"] == translator.translate(PARAGRAPHS)
    for src, out in zip(PARAGRAPHS, r.json()["translatedText"]):
        check_layout(src, out)


def test_alternatives_of_a_paragraph_are_the_librarys(live, translator):
    text = PARAGRAPHS[1]
    r = live.post("/translate", json={"q": text, "alternatives": 2})
    assert r.status_code == 200, r.text
    ref = [t for t, score in translator.translate(text, beam_size=3, n_best=3) if score > -1e30]
    assert [r.json()["translatedText"], *r.json()["alternatives"]] == ref


def test_split_none_and_a_forms_line_ends(live, translator):
    text = "Go on. I lost.\nThank you."
    r = live.post("/translate", json={"q": text, "split": "none"})
    assert r.json()["translatedText"] == translator.translate(text, split="none")
    # a text box's \r\n, sent in a form, is \n (as LibreTranslate reads a form's q)
    r = live.post("/translate", data={"q": text.replace("\n", "\r\n")})
    assert r.json()["translatedText"] == translator.translate(text)
    assert live.post("/translate", json={"q": "Go.", "split": "words"}).status_code == 422


def test_layout_gives_each_sentence_for_the_page(live, translator):
    text = PARAGRAPHS[1]
    got = live.post("/translate", json={"q": text, "layout": True}).json()
    pieces = got["layout"]
    joined = "".join(p if isinstance(p, str) else p["translation"] for p in pieces)
    assert joined == got["translatedText"] == translator.translate(text)
    sentences = [p for p in pieces if isinstance(p, dict)]
    assert [p["source"] for p in sentences] == ["Go on.", "I lost.", "Thank you!", "Good night."]
    segs = translator.translate_segments([p["source"] for p in sentences])
    assert [p["translation"] for p in sentences] == [
        t or p["source"] for t, p in zip(segs, sentences)
    ]


def test_the_libretranslatepy_client_sends_a_paragraph(live, translator):
    lt_api = pytest.importorskip("libretranslatepy")
    lt = lt_api.LibreTranslateAPI(live.url)
    for text in PARAGRAPHS[:3]:
        assert lt.translate(text, "en", "fr") == translator.translate(text)


def test_the_sentences_of_many_requests_decode_together(translator):
    """Requests of three sentences each, queued while the worker is busy: their sentences go
    to the model in one batch (the text layer cuts, the queue batches sentences)."""
    texts = [f"Go on. I lost. Thank you number {i}." for i in range(6)]
    with live_server(translator, max_wait_ms=0) as s:
        batcher = s.lane.batcher
        batches: list[list[str]] = []
        real = batcher.decode

        def recording(found, decoding):
            batches.append(list(found))
            return real(found, decoding)

        batcher.decode = recording
        gate, busy = threading.Event(), threading.Event()
        blocker = batcher.call(lambda: busy.set() or gate.wait(60))
        assert busy.wait(30)  # the worker is in it: only requests' jobs are queued from now
        with ThreadPoolExecutor(len(texts)) as pool:
            futures = [pool.submit(s.post, "/translate", json={"q": t}) for t in texts]
            wait_until(lambda: batcher.queue_depth >= 3 * len(texts), what="every request queued")
            gate.set()
            answers = [f.result().json()["translatedText"] for f in futures]
        blocker.future.result(30)
        assert answers == translator.translate(texts)
        assert max(len(b) for b in batches) == 3 * len(texts)  # one batch: every request's


# ---------------------------------------------------------------------------- every engine
@pytest.mark.parametrize("engine", ["ct2", pytest.param("onnx", marks=pytest.mark.slow)])
def test_every_engine_serves_paragraphs_as_it_translates_them(engine, request):
    tr = request.getfixturevalue(engine)
    with live_server(tr, max_wait_ms=5) as s:
        r = s.post("/translate", json={"q": PARAGRAPHS})
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == tr.translate(PARAGRAPHS)
        for src, out in zip(PARAGRAPHS, r.json()["translatedText"]):
            check_layout(src, out)
        assert s.get("/health").json()["model"]["engine"] == tr.engine
