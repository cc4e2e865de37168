"""Languages: the table of codes, checking a code, reading one from a name, detecting one.

A language is written as a BCP-47 tag whose language subtag is an ISO 639-1 code: ``en``,
``fr``, ``zh``, or with a script or a region, ``zh-Hans``, ``pt-BR``, ``zh-CN`` (the codes
LibreTranslate, Argos Translate, Hugging Face model cards and sacreBLEU's ``-l`` use).

>>> check_language("zh-cn")          # the canonical spelling: language lower, region upper
'zh-CN'
>>> language_name("pt-BR"), base_language("zh-Hans")
('Portuguese (BR)', 'zh')
>>> language_code("French"), language_code("deu"), language_code("en_US")
('fr', 'de', 'en-US')

:func:`detect_language` names the language of some texts with ``py3langid`` (the ``langid``
extra: ``pip install 'qkv[langid]'``), whose model ships inside its wheel, so detection works
offline; it returns the code and a confidence in [0, 1]. Everything else here needs nothing
beyond the standard library.

This module is on the ground floor (it imports only :mod:`qkv._errors` and :mod:`qkv._deps`),
so every part of qkv, the trainer, the exporters and the server, may use it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from .._deps import require
from .._errors import SettingError

__all__ = [
    "CASELESS",
    "LANGUAGES",
    "RICH_CHARACTER_SETS",
    "base_language",
    "check_language",
    "detect_language",
    "detect_languages",
    "detectable_languages",
    "from_libretranslate",
    "language_code",
    "language_name",
    "language_script",
    "match_language",
    "rank_languages",
    "script_language",
    "script_name",
]

#: ISO 639-1 code -> English name (all 183 codes of the standard)
LANGUAGES: dict[str, str] = dict(
    line.split(" ", 1)
    for line in """\
aa Afar
ab Abkhazian
ae Avestan
af Afrikaans
ak Akan
am Amharic
an Aragonese
ar Arabic
as Assamese
av Avaric
ay Aymara
az Azerbaijani
ba Bashkir
be Belarusian
bg Bulgarian
bi Bislama
bm Bambara
bn Bengali
bo Tibetan
br Breton
bs Bosnian
ca Catalan
ce Chechen
ch Chamorro
co Corsican
cr Cree
cs Czech
cu Church Slavic
cv Chuvash
cy Welsh
da Danish
de German
dv Divehi
dz Dzongkha
ee Ewe
el Greek
en English
eo Esperanto
es Spanish
et Estonian
eu Basque
fa Persian
ff Fulah
fi Finnish
fj Fijian
fo Faroese
fr French
fy Western Frisian
ga Irish
gd Scottish Gaelic
gl Galician
gn Guarani
gu Gujarati
gv Manx
ha Hausa
he Hebrew
hi Hindi
ho Hiri Motu
hr Croatian
ht Haitian Creole
hu Hungarian
hy Armenian
hz Herero
ia Interlingua
id Indonesian
ie Interlingue
ig Igbo
ii Sichuan Yi
ik Inupiaq
io Ido
is Icelandic
it Italian
iu Inuktitut
ja Japanese
jv Javanese
ka Georgian
kg Kongo
ki Kikuyu
kj Kuanyama
kk Kazakh
kl Kalaallisut
km Khmer
kn Kannada
ko Korean
kr Kanuri
ks Kashmiri
ku Kurdish
kv Komi
kw Cornish
ky Kyrgyz
la Latin
lb Luxembourgish
lg Ganda
li Limburgish
ln Lingala
lo Lao
lt Lithuanian
lu Luba-Katanga
lv Latvian
mg Malagasy
mh Marshallese
mi Maori
mk Macedonian
ml Malayalam
mn Mongolian
mr Marathi
ms Malay
mt Maltese
my Burmese
na Nauru
nb Norwegian Bokmål
nd North Ndebele
ne Nepali
ng Ndonga
nl Dutch
nn Norwegian Nynorsk
no Norwegian
nr South Ndebele
nv Navajo
ny Chichewa
oc Occitan
oj Ojibwa
om Oromo
or Odia
os Ossetian
pa Punjabi
pi Pali
pl Polish
ps Pashto
pt Portuguese
qu Quechua
rm Romansh
rn Rundi
ro Romanian
ru Russian
rw Kinyarwanda
sa Sanskrit
sc Sardinian
sd Sindhi
se Northern Sami
sg Sango
si Sinhala
sk Slovak
sl Slovenian
sm Samoan
sn Shona
so Somali
sq Albanian
sr Serbian
ss Swati
st Southern Sotho
su Sundanese
sv Swedish
sw Swahili
ta Tamil
te Telugu
tg Tajik
th Thai
ti Tigrinya
tk Turkmen
tl Tagalog
tn Tswana
to Tonga
tr Turkish
ts Tsonga
tt Tatar
tw Twi
ty Tahitian
ug Uyghur
uk Ukrainian
ur Urdu
uz Uzbek
ve Venda
vi Vietnamese
vo Volapük
wa Walloon
wo Wolof
xh Xhosa
yi Yiddish
yo Yoruba
za Zhuang
zh Chinese
zu Zulu""".splitlines()
)

#: languages written with a large character set (ideographs, Hangul syllables): SentencePiece's
#: authors recommend a character coverage of 0.9995 for them, 1.0 for every other script
RICH_CHARACTER_SETS = frozenset({"zh", "ja", "ko"})

#: languages whose usual script has no letter case (no upper or lower case to fold)
_CASELESS = "am ar as bn bo dv dz fa gu he hi ii iu ja ka km kn ko ks lo ml mr my ne or pa ps sa"
CASELESS = frozenset((_CASELESS + " sd si ta te th ti ug ur yi zh").split(" "))

# ISO 639-2/B, 639-2/T and 639-3 codes people write for the common languages (eng, fra, deu,
# fre, ger, cmn, ...) -> ISO 639-1
_THREE_LETTER = {
    "ara": "ar", "ben": "bn", "bul": "bg", "cat": "ca", "ces": "cs", "cze": "cs", "cmn": "zh",
    "chi": "zh", "zho": "zh", "yue": "zh", "dan": "da", "deu": "de", "ger": "de", "dut": "nl",
    "nld": "nl", "ell": "el", "gre": "el", "eng": "en", "epo": "eo", "est": "et", "eus": "eu",
    "baq": "eu", "fas": "fa", "per": "fa", "fin": "fi", "fra": "fr", "fre": "fr", "gle": "ga",
    "heb": "he", "hin": "hi", "hrv": "hr", "hun": "hu", "ind": "id", "isl": "is", "ice": "is",
    "ita": "it", "jpn": "ja", "kor": "ko", "lat": "la", "lav": "lv", "lit": "lt", "msa": "ms",
    "may": "ms", "nob": "nb", "nno": "nn", "nor": "no", "pol": "pl", "por": "pt", "ron": "ro",
    "rum": "ro", "rus": "ru", "slk": "sk", "slo": "sk", "slv": "sl", "spa": "es", "srp": "sr",
    "swe": "sv", "tha": "th", "tur": "tr", "ukr": "uk", "urd": "ur", "vie": "vi", "cym": "cy",
    "wel": "cy", "afr": "af", "sqi": "sq", "alb": "sq", "hye": "hy", "arm": "hy", "kat": "ka",
    "geo": "ka", "mkd": "mk", "mac": "mk", "glg": "gl", "tgl": "tl", "fil": "tl", "swa": "sw",
    "tam": "ta", "tel": "te", "mar": "mr", "kaz": "kk", "bel": "be", "bos": "bs", "aze": "az",
    "uzb": "uz", "mon": "mn", "nep": "ne", "sin": "si", "khm": "km", "lao": "lo", "mya": "my",
    "bur": "my", "amh": "am", "som": "so", "hau": "ha", "yor": "yo", "ibo": "ig", "zul": "zu",
    "xho": "xh", "kur": "ku", "pus": "ps", "tat": "tt", "uig": "ug", "ltz": "lb", "mlt": "mt",
    "gla": "gd", "bre": "br", "oci": "oc", "fao": "fo", "kir": "ky", "tgk": "tg", "tuk": "tk",
    "pan": "pa", "guj": "gu", "kan": "kn", "mal": "ml", "ori": "or", "asm": "as", "snd": "sd",
    "jav": "jv", "sun": "su", "mlg": "mg", "mri": "mi", "mao": "mi", "smo": "sm", "sna": "sn",
}  # fmt: skip
# names people use that are not the table's name
_OTHER_NAMES = {
    "farsi": "fa", "mandarin": "zh", "cantonese": "zh", "castilian": "es", "flemish": "nl",
    "haitian": "ht", "kirghiz": "ky", "moldavian": "ro", "panjabi": "pa", "pushto": "ps",
    "sinhalese": "si", "uighur": "ug", "gaelic": "gd", "bokmål": "nb", "bokmal": "nb",
    "nynorsk": "nn", "filipino": "tl", "oriya": "or", "burmese": "my", "slovene": "sl",
}  # fmt: skip
_BY_NAME = {name.casefold(): code for code, name in LANGUAGES.items()} | _OTHER_NAMES

# language[-script][-region], separated by - or _: en, en-US, zh-Hans, zh-Hans-CN, es-419
_TAG = re.compile(
    r"^(?P<lang>[A-Za-z]{2,3})(?:[-_](?P<script>[A-Za-z]{4}))?(?:[-_](?P<region>[A-Za-z]{2}|\d{3}))?$"
)


def _parse(code: str) -> tuple[str, str | None, str | None] | None:
    """``(ISO 639-1, script, region)`` of a tag whose language is in the table (a three-letter
    code mapped to its two-letter one), spelled canonically; None otherwise."""
    m = _TAG.match(code.strip())
    if m is None:
        return None
    lang = m.group("lang").lower()
    lang = _THREE_LETTER.get(lang, lang)
    if lang not in LANGUAGES:
        return None
    script, region = m.group("script"), m.group("region")
    return lang, script.title() if script else None, region.upper() if region else None


def _join(lang: str, script: str | None, region: str | None) -> str:
    return "-".join(p for p in (lang, script, region) if p)


def check_language(code: object, key: str = "language") -> str:
    """``code`` as a canonical BCP-47 tag (``"zh-cn"`` -> ``"zh-CN"``, ``"en_US"`` ->
    ``"en-US"``), its language subtag one of the ISO 639-1 codes of :data:`LANGUAGES`.

    Raises:
        SettingError: (a ``ValueError``) named ``key``: not a string, or not such a code. When
            the value is a language's name or a three-letter code (``"English"``, ``"fra"``),
            the message says which code to write.
    """
    if not isinstance(code, str) or not code.strip():
        raise SettingError(
            key, f"expected a language code such as en, fr, zh or pt-BR, got {code!r}"
        )
    m = _TAG.match(code.strip())
    parsed = _parse(code)
    if parsed is not None and m is not None and len(m.group("lang")) == 2:
        return _join(*parsed)
    hint = language_code(code)
    more = f" (did you mean {hint!r}?)" if hint else ""
    raise SettingError(
        key,
        f"expected an ISO 639-1 language code, optionally with a BCP-47 script or region "
        f"(en, fr, zh, zh-Hans, pt-BR), got {code!r}{more}",
    )


def base_language(code: str) -> str:
    """The ISO 639-1 language of a tag: ``"zh-Hans-CN"`` -> ``"zh"`` (checked as
    :func:`check_language` checks)."""
    return check_language(code).split("-", 1)[0]


def language_name(code: str) -> str:
    """The English name of a tag: ``"de"`` -> ``"German"``, ``"pt-BR"`` -> ``"Portuguese
    (BR)"``, ``"zh-Hant"`` -> ``"Chinese (Hant)"``."""
    lang, *rest = check_language(code).split("-")
    return LANGUAGES[lang] + (f" ({'-'.join(rest)})" if rest else "")


def language_code(word: object) -> str | None:
    """The language a word names, as a canonical tag, or None: a code (``"en"``, ``"en_US"``,
    ``"zh-Hans"``), a three-letter code (``"eng"``, ``"fra"``, ``"deu"``, ``"cmn"``) or an English
    name (``"French"``, ``"Chinese"``, case ignored). What a column name, a file suffix
    (``train.de``) or a ``--pair`` half says."""
    if not isinstance(word, str):
        return None
    w = word.strip()
    parsed = _parse(w)
    if parsed is not None:
        return _join(*parsed)
    return _BY_NAME.get(w.casefold())


# ---------------------------------------------------------------------------- scripts
#: scripts written by one language of the table, named as Unicode names their letters
#: (``"CJK UNIFIED IDEOGRAPH-4E2D"`` -> CJK): the language a text mostly in it is in
_SCRIPT_LANGUAGE = {
    "HANGUL": "ko", "THAI": "th", "GREEK": "el", "HEBREW": "he", "GEORGIAN": "ka",
    "ARMENIAN": "hy", "BENGALI": "bn", "TAMIL": "ta", "TELUGU": "te", "KANNADA": "kn",
    "MALAYALAM": "ml", "GUJARATI": "gu", "GURMUKHI": "pa", "ORIYA": "or", "SINHALA": "si",
    "KHMER": "km", "LAO": "lo", "MYANMAR": "my", "ETHIOPIC": "am", "TIBETAN": "bo",
    "DEVANAGARI": "hi", "ARABIC": "ar", "CYRILLIC": "ru",
}  # fmt: skip
#: letters that only some languages of a shared script write, checked in this order: the
#: first whose letters make up at least 0.5% of the script's letters names the language
_DISTINCT_LETTERS = {
    "CYRILLIC": (("uk", "іїєґ"), ("be", "ў"), ("sr", "ђћџљњј"), ("mk", "ѓќѕ"),
                 ("kk", "әғқңөұүһ"), ("mn", "өү")),
    "ARABIC": (("ur", "ٹڈڑںےھ"), ("fa", "پچژگکی")),
}  # fmt: skip
#: kana among a text's Han and kana letters from which it is Japanese (Japanese prose writes
#: about half of its letters in kana; Chinese none)
_KANA_SHARE = 0.05


def _script(c: str) -> str:
    """The script of a letter: the first word of its Unicode name, ``KANA`` for hiragana and
    katakana (half-width included); ``""`` for a character without a name."""
    name = unicodedata.name(c, "")
    if name.startswith("HIRAGANA") or "KATAKANA" in name:
        return "KANA"
    return "CJK" if name.startswith("CJK") else name.split(" ", 1)[0]


def script_language(texts: str | Iterable[str]) -> tuple[str, float]:
    """The language of some texts recognised from their script alone, and the share of their
    letters in it; needs nothing beyond the standard library (the fallback of
    :func:`detect_language`, which needs py3langid).

    A sample mostly (over half of its letters) in Han is Chinese (``zh``), with kana
    (at least :data:`_KANA_SHARE` of its Han and kana) Japanese (``ja``), in Hangul Korean
    (``ko``); Thai, Greek, Hebrew, Georgian, Armenian and the scripts of India and South-East
    Asia name their language; Cyrillic is Russian unless letters only another language writes
    say Ukrainian, Belarusian, Serbian, Macedonian, Kazakh or Mongolian; Arabic script is
    Arabic unless Urdu's or Persian's letters appear; Devanagari is Hindi. Latin script (or no
    letter) says nothing: ``("", 0.0)``.

    >>> script_language(["我们明天去北京。", "他喜欢喝茶。"])
    ('zh', 1.0)
    >>> script_language("東京へ行きます")[0], script_language("Привіт, як справи?")[0]
    ('ja', 'uk')
    """
    counts: dict[str, int] = {}
    letters: dict[str, dict[str, int]] = {}
    for text in [texts] if isinstance(texts, str) else texts:
        for c in text:
            if not c.isalpha():
                continue
            script = _script(c)
            counts[script] = counts.get(script, 0) + 1
            if script in _DISTINCT_LETTERS:
                seen = letters.setdefault(script, {})
                seen[c.lower()] = seen.get(c.lower(), 0) + 1
    total = sum(counts.values())
    if not total:
        return "", 0.0
    han, kana = counts.get("CJK", 0), counts.get("KANA", 0)
    if han + kana > total / 2:
        code = "ja" if kana >= _KANA_SHARE * (han + kana) else "zh"
        return code, round((han + kana) / total, 4)
    script = max(counts, key=lambda s: counts[s])
    if counts[script] <= total / 2 or script not in _SCRIPT_LANGUAGE:
        return "", 0.0
    code = _SCRIPT_LANGUAGE[script]
    seen = letters.get(script, {})
    for lang, distinct in _DISTINCT_LETTERS.get(script, ()):
        if sum(seen.get(c, 0) for c in distinct) >= 0.005 * counts[script]:
            code = lang
            break
    return code, round(counts[script] / total, 4)


# ---------------------------------------------------------------------------- detection
#: the detector's own codes that are a variety of a language of the table
_DETECTED_AS = {"ary": "ar", "arz": "ar", "apc": "ar", "srl": "sr", "nds": "de"}


@lru_cache(maxsize=1)
def _identifier() -> Any:
    require("detecting a language", ["py3langid"])
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detectable_languages() -> list[str]:
    """The ISO 639-1 codes :func:`detect_language` can answer, sorted."""
    labels = _identifier().labels
    return sorted({_DETECTED_AS.get(c, c) for c in labels} & set(LANGUAGES))


def _scores(text: str, allowed: frozenset[str] | None) -> list[tuple[str, float]]:
    """Every language's probability for ``text`` (over ``allowed`` alone when given), most
    likely first."""
    scores: dict[str, float] = {}
    for label, p in _identifier().rank(text):
        code = _DETECTED_AS.get(label, label)
        if code in LANGUAGES and (allowed is None or code in allowed):
            scores[code] = scores.get(code, 0.0) + float(p)
    total = sum(scores.values())
    if total <= 0:
        return []
    return sorted(((c, p / total) for c, p in scores.items()), key=lambda cp: (-cp[1], cp[0]))


def _ranked(text: str, allowed: frozenset[str] | None) -> tuple[str, float]:
    ranked = _scores(text, allowed)
    return ranked[0] if ranked else ("", 0.0)


def _candidates(candidates: Iterable[str] | None) -> frozenset[str] | None:
    if candidates is None:
        return None
    if isinstance(candidates, str):
        raise TypeError("candidates: expected a list of language codes, got a str")
    codes = frozenset(base_language(c) for c in candidates)
    if not codes:
        raise SettingError("candidates", "expected at least one language code, got none")
    return codes


def detect_languages(
    texts: Sequence[str], *, candidates: Iterable[str] | None = None
) -> list[tuple[str, float]]:
    """The language of each text, ``(ISO 639-1 code, confidence in [0, 1])``, by ``py3langid``.

    ``candidates`` (codes) restricts the answer to those languages (a server that holds models
    for a few sources asks which of them), the confidence then being over those alone. A text
    with no letter of any language (empty, digits, punctuation) is ``("", 0.0)``.

    Raises:
        MissingDependency: py3langid is not installed (``pip install 'qkv[langid]'``).
        TypeError: a text that is not a string.
    """
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts: expected a sequence of str, got {type(texts).__name__}")
    allowed = _candidates(candidates)
    _identifier()
    out = []
    for t in texts:
        if not isinstance(t, str):
            raise TypeError(f"texts: expected str items, got {type(t).__name__}")
        out.append(_ranked(t, allowed) if any(c.isalpha() for c in t) else ("", 0.0))
    return out


def rank_languages(
    text: str, *, candidates: Iterable[str] | None = None
) -> list[tuple[str, float]]:
    """Every language ``text`` may be in, ``(ISO 639-1 code, probability)``, most likely first,
    the probabilities summing to 1 (over ``candidates`` alone when given, as
    :func:`detect_languages`); ``[]`` for a text with no letter.

    Raises:
        MissingDependency: py3langid is not installed (``pip install 'qkv[langid]'``).
        TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    allowed = _candidates(candidates)
    _identifier()
    return _scores(text, allowed) if any(c.isalpha() for c in text) else []


def detect_language(
    texts: str | Sequence[str], *, candidates: Iterable[str] | None = None
) -> tuple[str, float]:
    """The language of one text, or of a sample of texts taken together, and the confidence.

    For one text: its most likely language and that language's probability. For several:
    each text with letters votes for its most likely language (:func:`detect_languages`); the
    language with the most votes wins (a tie goes to the larger sum of probabilities), and
    the confidence is its share of the votes (0.69: the most likely language of 69% of the
    texts; short texts such as software messages often look like several languages, long
    sentences rarely do). ``("", 0.0)`` when no text has a letter. ``candidates``: as
    :func:`detect_languages`.

    Raises:
        MissingDependency: py3langid is not installed (``pip install 'qkv[langid]'``).
    """
    if isinstance(texts, str):
        return detect_languages([texts], candidates=candidates)[0]
    found = [(c, p) for c, p in detect_languages(list(texts), candidates=candidates) if c]
    if not found:
        return "", 0.0
    votes: dict[str, list[float]] = {}
    for code, p in found:
        votes.setdefault(code, []).append(p)
    code = max(votes, key=lambda c: (len(votes[c]), sum(votes[c])))
    return code, round(len(votes[code]) / len(found), 4)


# ---------------------------------------------------------------------------- matching
#: LibreTranslate's and Argos Translate's codes that are not BCP 47: "zt", Chinese in its
#: Traditional script
_LIBRETRANSLATE_CODES = {"zt": "zh-Hant"}
#: the script a language is written in when its tag names none (CLDR's likely subtags): for
#: languages written in more than one, by region first
_REGION_SCRIPTS = {("zh", "TW"): "Hant", ("zh", "HK"): "Hant", ("zh", "MO"): "Hant"}
_DEFAULT_SCRIPTS = {"zh": "Hans", "sr": "Cyrl"}
_SCRIPT_NAMES = {"Hans": "Simplified", "Hant": "Traditional", "Cyrl": "Cyrillic", "Latn": "Latin"}


def from_libretranslate(code: str) -> str:
    """``code`` as BCP 47 writes it: LibreTranslate's ``"zt"`` -> ``"zh-Hant"``; any other
    code as it is."""
    return _LIBRETRANSLATE_CODES.get(code.strip().lower(), code)


def language_script(code: str) -> str | None:
    """The script ``code`` is written in: its own script subtag, else the one its language
    and region imply (``"zh-TW"`` -> ``"Hant"``, ``"zh"`` and ``"zh-CN"`` -> ``"Hans"``,
    ``"sr"`` -> ``"Cyrl"``); None for a language written in one script (``"en-GB"``), or a tag
    that is not one (``"x-custom"``). LibreTranslate's ``"zt"`` is ``"Hant"``."""
    parsed = _parse(from_libretranslate(code))
    if parsed is None:
        return None
    lang, script, region = parsed
    return script or _REGION_SCRIPTS.get((lang, region or "")) or _DEFAULT_SCRIPTS.get(lang)


def script_name(script: str) -> str:
    """A script subtag in words: ``"Hant"`` -> ``"Traditional"``; others as they are."""
    return _SCRIPT_NAMES.get(script, script)


def match_language(asked: str, offered: Iterable[str]) -> str | None:
    """The one of ``offered`` (codes served) that serves ``asked`` (a request's code), BCP 47's
    way, or None.

    The same code (case aside) wins. Otherwise the language must be the same and so must the
    script, given or implied (:func:`language_script`): ``zh-TW``, ``zh-HK``, ``zh-Hant`` and
    LibreTranslate's ``zt`` are not served by a Simplified model (``zh``, ``zh-CN``,
    ``zh-Hans``), nor the other way round; but the bare language (``zh``) is served by the
    one model of its language whatever its script. A region alone is a preference: ``en-GB`` is served
    by ``en`` or ``en-US``; among several, the one of the same region, then the one with none;
    None when that leaves more than one (``en`` with ``en-GB`` and ``en-US`` served).
    """
    offered = list(offered)
    key = asked.strip().lower()
    same = [c for c in offered if c.strip().lower() == key]
    if same:
        return same[0]
    parsed = _parse(from_libretranslate(asked))
    if parsed is None:
        return None
    lang, given_script, region = parsed
    script = language_script(_join(*parsed))
    ranked, other_scripts = [], []
    for code in offered:
        other = _parse(code)
        if other is None or other[0] != lang:
            continue
        rank = ((other[2] == region, other[2] is None), code)
        (ranked if language_script(code) == script else other_scripts).append(rank)
    if not ranked and given_script is None and region is None:
        ranked = other_scripts  # the bare language ("zh"): whatever script is served
    if not ranked:
        return None
    best = max(rank for rank, _ in ranked)
    found = [code for rank, code in ranked if rank == best]
    return found[0] if len(found) == 1 else None
