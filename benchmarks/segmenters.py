"""Sentence segmenters compared on real text in six languages: which one ``qkv.text`` uses.

* **Real text**: the human translations in the gettext catalogs (``.mo``) that Debian installs
  under ``/usr/share/locale`` (apt, bash, coreutils, PAM, ...): English from their ``msgid``,
  French, German, Chinese, Japanese and Arabic from their ``msgstr``. Messages of one
  sentence (20-200 characters, one line, starting with a capital or an uncased letter, ending
  in a sentence stop, no other stop followed by a space or, in Chinese and Japanese, none at
  all; no placeholders, ellipses or runs of spaces) are joined into paragraphs of 2-5 (a space
  between them; none in Chinese and Japanese, as they are written), seeded: the boundaries
  are known. 300 paragraphs per language.
* **Hard cases**: paragraphs written for this comparison with their boundaries by hand
  (abbreviations, initials, decimal numbers, ordinals, quotes after the stop, ellipses,
  full-width punctuation, Arabic's question mark), in the same six languages.
* **Segmenters**: ``sentencex`` (Wikimedia), ``pysbd``, ``blingfire`` (Microsoft; one model
  for every language), ``sentence-splitter`` (Koehn and Schroeder's Moses rules; European
  languages only), qkv's own rules (:func:`qkv.text.sentences.rule_spans`) and what qkv uses,
  :func:`qkv.text.sentence_spans` (sentencex, then a cut after every full-width stop). Argos
  Translate 1.11's MiniSBD (Stanza's models in ONNX) downloads its models at first use, which
  this machine cannot: not measured.
* **Scores**: per language, the share of paragraphs cut exactly right, and the boundaries'
  recall and precision; the time to cut every paragraph, once each, in this process.

Run: ``python -m benchmarks.segmenters [--json P]`` (about a minute).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import struct
import time
from collections.abc import Callable
from pathlib import Path

from qkv.text.sentences import _located, rule_spans, sentence_spans

LOCALE = Path("/usr/share/locale")
LANGS = {"en": "fr", "fr": "fr", "de": "de", "zh": "zh_CN", "ja": "ja", "ar": "ar"}
NO_SPACE = {"zh", "ja"}
STOPS = {"zh": "。！？", "ja": "。！？", "ar": ".!?؟"}

# (paragraph, its sentences); the sentences joined by one space ("" in zh and ja) are the text
HARD: dict[str, list[list[str]]] = {
    "en": [
        ["Dr. Smith paid $3.50 for the book.", "He was happy."],
        ["The meeting is at 10 a.m. tomorrow.", "Please be on time."],
        ['She said "Stop!"', "Then she left."],
        ["J. R. R. Tolkien wrote it.", "It sold well."],
        ["Use e.g. a comma or i.e. a dot.", "Both work."],
        ["Wait...", "Is it done?", "Yes!"],
        ["Version 2.0 is out.", "Update now."],
        ["Mr. and Mrs. Brown live in the U.S.", "They like it."],
    ],
    "fr": [
        ["M. Dupont a payé 3,50 euros.", "Il était content."],
        ["« Arrête ! » dit-elle.", "Puis elle partit."],
        ["Voir p. ex. la page 12.", "C'est clair."],
        ["La version 2.1 est sortie.", "Mettez à jour."],
        ["Mme Martin arrive à 10 h.", "Elle est à l'heure."],
        ["Quoi ?", "Vraiment ?", "Oui."],
    ],
    "de": [
        ["Am 3. Oktober ist Feiertag.", "Die Läden sind zu."],
        ["Dr. Müller kommt z. B. morgen.", "Er bringt Kuchen."],
        ["Das kostet 3,50 Euro.", "Das ist billig."],
        ["Er sagte: „Komm!“", "Dann ging er."],
        ["Die Version 2.1 ist da.", "Bitte aktualisieren."],
        ["Prof. Schmidt liest heute.", "Der Saal ist voll."],
    ],
    "zh": [
        ["我今天很忙。", "你明天来吧！"],
        ["价格是3.5元。", "很便宜。"],
        ["他说：“走吧！”", "然后走了。"],
        ["真的吗？", "是的。"],
        ["版本2.0已发布。", "请更新。"],
    ],
    "ja": [
        ["今日は忙しいです。", "明日来てください！"],
        ["値段は3.5ドルです。", "安いです。"],
        ["「行こう！」と彼は言った。", "そして去った。"],
        ["本当ですか？", "はい。"],
        ["バージョン2.0が出ました。", "更新してください。"],
    ],
    "ar": [
        ["دفع الدكتور أحمد ٣٫٥ دينار.", "كان سعيدا."],
        ["هل أنت هنا؟", "نعم، أنا هنا."],
        ["صدر الإصدار 2.0 اليوم.", "حدّث الآن."],
        ["قال: «توقف!»", "ثم غادر."],
        ["الاجتماع في الساعة العاشرة.", "لا تتأخر."],
    ],
}


def read_mo(path: Path) -> dict[str, str]:
    """``msgid -> msgstr`` of a GNU ``.mo`` file (the first form of plural entries)."""
    data = path.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic == 0x950412DE else ">"
    _, n, orig, trans = struct.unpack(end + "4I", data[4:20])
    out = {}
    for i in range(n):
        ln, off = struct.unpack(end + "2I", data[orig + 8 * i : orig + 8 * i + 8])
        tl, toff = struct.unpack(end + "2I", data[trans + 8 * i : trans + 8 * i + 8])
        try:
            k = data[off : off + ln].decode("utf-8").split("\0")[0]
            v = data[toff : toff + tl].decode("utf-8").split("\0")[0]
        except UnicodeDecodeError:
            continue
        if k and v:
            out[k] = v
    return out


def one_sentence(text: str, lang: str) -> bool:
    """Whether a message is one sentence by the corpus' filter (see the module)."""
    stops = STOPS.get(lang, ".!?")
    if not 20 <= len(text) <= 200 or "\n" in text or text[-1] not in stops:
        return False
    if "%" in text or "{" in text or "<" in text or text.count('"') % 2 or "  " in text:
        return False
    if not text[0].isalpha() or text[0].islower() or "..." in text or "…" in text[:-1]:
        return False  # option tables, lists cut short: not prose
    inner = text[:-1]
    if lang in NO_SPACE:
        return not any(c in stops for c in inner)
    return re.search(rf"[{re.escape(stops)}]\s", inner) is None


def real_paragraphs(lang: str, n: int = 300, seed: int = 39) -> list[list[str]]:
    """``n`` paragraphs of 2-5 real one-sentence messages (see the module)."""
    folder = LOCALE / LANGS[lang] / "LC_MESSAGES"
    found: set[str] = set()
    for mo in sorted(folder.glob("*.mo")):
        for k, v in read_mo(mo).items():
            text = (k if lang == "en" else v).strip()
            if one_sentence(text, lang):
                found.add(text)
    pool = sorted(found)
    rng = random.Random(seed)
    return [rng.sample(pool, rng.randint(2, 5)) for _ in range(n)]


def _joined(sentences: list[str], lang: str) -> tuple[str, set[int]]:
    sep = "" if lang in NO_SPACE else " "
    text, cuts = "", set()
    for s in sentences:
        if text:
            cuts.add(len(text))
            text += sep
        text += s
    return text, cuts


def _segmenters() -> dict[str, Callable[[str, str], list[tuple[int, int]]]]:
    out: dict[str, Callable[[str, str], list[tuple[int, int]]]] = {}
    from sentencex import segment

    out["sentencex"] = lambda t, lang: _located(list(segment(lang, t)), t)
    import pysbd

    seg: dict[str, object] = {}

    def pysbd_spans(t: str, lang: str) -> list[tuple[int, int]]:
        if lang not in seg:
            seg[lang] = pysbd.Segmenter(language=lang, clean=False)
        return _located(seg[lang].segment(t), t)  # type: ignore[attr-defined]

    out["pysbd"] = pysbd_spans
    import blingfire

    out["blingfire"] = lambda t, lang: _located(blingfire.text_to_sentences(t).split("\n"), t)
    from sentence_splitter import SentenceSplitter

    split: dict[str, object] = {}

    def moses(t: str, lang: str) -> list[tuple[int, int]]:
        if lang not in split:
            split[lang] = SentenceSplitter(language=lang)
        return _located(split[lang].split(t), t)  # type: ignore[attr-defined]

    out["sentence-splitter"] = moses
    out["qkv rules"] = rule_spans
    out["qkv: sentencex + rules"] = sentence_spans
    return out


def score(spans_of, paragraphs: list[list[str]], lang: str) -> dict[str, float] | None:
    """Exact paragraphs, boundary recall and precision (%), seconds; None: not supported."""
    exact = found = right = gold = 0
    t0 = time.perf_counter()
    for sentences in paragraphs:
        text, cuts = _joined(sentences, lang)
        try:
            spans = spans_of(text, lang)
        except Exception:  # a language the segmenter does not support
            return None
        got = {a for a, _ in spans[1:]}
        # a cut is where the next sentence starts (the space before it is neither's)
        want = {c + (0 if lang in NO_SPACE else 1) for c in cuts}
        exact += got == want
        found += len(got)
        right += len(got & want)
        gold += len(want)
    return {
        "exact": 100 * exact / len(paragraphs),
        "recall": 100 * right / max(gold, 1),
        "precision": 100 * right / max(found, 1),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    segmenters = _segmenters()
    results: dict[str, dict] = {}
    for lang in LANGS:
        real = real_paragraphs(lang)
        for name, spans in segmenters.items():
            results.setdefault(name, {})[lang] = {
                "real": score(spans, real, lang),
                "hard": score(spans, HARD[lang], lang),
            }
    print(f"{'segmenter':<18}" + "".join(f"{lang:>16}" for lang in LANGS) + "   seconds")
    for name, per in results.items():
        cells, secs = [], 0.0
        for lang in LANGS:
            r, h = per[lang]["real"], per[lang]["hard"]
            if r is None or h is None:
                cells.append(f"{'-':>16}")
                continue
            secs += r["seconds"]
            cells.append(f"{r['exact']:>8.1f}/{h['exact']:>5.1f}%")
        print(f"{name:<18}" + "".join(cells) + f"   {secs:7.2f}")
    print("cells: paragraphs cut exactly right, real text / hard cases (%); seconds: real text")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
