"""Subtitles: every cue translated, numbers, timings, settings, notes and styles kept; the
output read back by the ``srt`` and ``webvtt-py`` libraries with the same cues and timings."""

from __future__ import annotations

import io
import random

import pytest

from qkv.text import read_document

srt_lib = pytest.importorskip("srt")
webvtt = pytest.importorskip("webvtt")

WORDS = ["home", "calm", "we", "go", "now", "the", "red", "car", "very", "happy", "l'eau"]


def _stamp(ms: int, comma: bool) -> str:
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if comma else '.'}{ms:03d}"


def _random_cues(rng: random.Random) -> list[tuple[int, int, list[str]]]:
    cues, t = [], rng.randint(0, 5000)
    for _ in range(rng.randint(1, 12)):
        start, t = t, t + rng.randint(500, 6000)
        lines = []
        for _ in range(rng.randint(1, 3)):
            words = " ".join(rng.choices(WORDS, k=rng.randint(1, 6))).capitalize()
            lines.append(words + rng.choice([".", "!", "?", ",", ""]))
        if rng.random() < 0.2:
            lines[0] = f"<i>{lines[0]}</i>"
        cues.append((start, t, lines))
        t += rng.randint(0, 2000)
    return cues


def _translate(segments):
    return [" ".join(w[::-1] for w in s.split()) for s in segments]


def test_random_srt_files_keep_every_cue_and_timing():
    rng = random.Random(39)
    for _ in range(60):
        cues = _random_cues(rng)
        nl = rng.choice(["\n", "\r\n"])
        text = "".join(
            f"{i + 1}{nl}{_stamp(a, True)} --> {_stamp(b, True)}{nl}{nl.join(lines)}{nl}{nl}"
            for i, (a, b, lines) in enumerate(cues)
        )
        data = text.encode()
        doc = read_document(data, "srt", source="en", target="fr")
        assert data.decode().replace(nl, " ").split() == [  # nothing but cue text changes
            w for w in doc.render(list(doc.segments)).decode().replace(nl, " ").split()
        ]
        out = doc.render(_translate(doc.segments)).decode()
        got, want = list(srt_lib.parse(out)), list(srt_lib.parse(text))
        assert [(c.index, c.start, c.end) for c in got] == [(c.index, c.start, c.end) for c in want]
        for g, w in zip(got, want):
            assert g.content.count("\n") <= w.content.count("\n")
            assert ("<i>" in g.content) == ("<i>" in w.content)
            if "<i>" not in w.content:
                assert g.content.split() == [x[::-1] for x in w.content.split()]


VTT = """WEBVTT - a film

NOTE translators: keep this. Note.

STYLE
::cue(.loud) { color: red }

intro
00:00:01.000 --> 00:00:04.000 align:start position:10%
<v Roger>Hello there. How are you &amp; me?

00:05.000 --> 00:06.500
One line, two
lines of words.

00:07.000 --> 00:08.000
<c.loud>Stop!</c> Now.
"""


def test_a_vtt_file_keeps_its_header_notes_styles_and_settings():
    doc = read_document(VTT, "vtt", source="en", target="fr")
    assert doc.render(list(doc.segments)) == VTT.encode()
    assert "keep this." not in " ".join(doc.segments)
    out = doc.render([s.upper() for s in doc.segments]).decode()
    for kept in ("WEBVTT - a film", "NOTE translators: keep this. Note.", "::cue(.loud)",
                 "intro\n00:00:01.000 --> 00:00:04.000 align:start position:10%\n<v Roger>",
                 "&amp;", "<c.loud>STOP!</c> NOW."):  # fmt: skip
        assert kept in out
    got, want = webvtt.from_buffer(io.StringIO(out)), webvtt.from_buffer(io.StringIO(VTT))
    assert [(c.identifier, c.start, c.end) for c in got] == [
        (c.identifier, c.start, c.end) for c in want
    ]
    assert got.captions[1].text == "ONE LINE, TWO\nLINES OF WORDS."


def test_a_cue_in_a_language_without_spaces_is_cut_between_characters():
    data = b"1\n00:00:01,000 --> 00:00:02,000\nI am home.\nHe is calm.\n\n"
    doc = read_document(data, "srt", source="en", target="zh")
    out = doc.render(["我在家。", "他很平静。"]).decode()
    assert out == "1\n00:00:01,000 --> 00:00:02,000\n我在家。\n他很平静。\n\n"
