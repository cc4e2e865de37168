"""A real English→French corpus of human translations, built offline from gettext catalogs.

Every pair is one message of a software user interface (or its documentation strings) that a
person translated into French: the English ``msgid`` and the French ``msgstr`` of the gettext
catalogs (``.mo``/``.po``) that ship inside packages fetched **by name and pinned version**
(:data:`SOURCES`), never read from what happens to be installed on the machine:

* Debian packages, by ``apt-get download NAME=VERSION`` and ``dpkg-deb -x``: LibreOffice's
  French language pack (``libreoffice-l10n-fr``) and the Cinnamon desktop's translations
  (``cinnamon-l10n``, all languages in one package: only the ``fr`` catalogs are read);
* PyPI wheels, by ``pip download --no-deps --only-binary=:all: NAME==VERSION``, read straight from
  the zip: Django, Sphinx, Wagtail, django-allauth and JupyterLab's French language pack.

Each downloaded file's SHA-256 is pinned here too and checked, and the files are kept in
``<cache>/downloads/``, so a rebuild needs no network and gives the same bytes.

Catalogs: files ``…/fr/LC_MESSAGES/*.po|*.mo`` (or ``fr_FR``; not ``fr_CA`` and the like); where a
folder holds both ``X.po`` and ``X.mo``, only ``X.po`` is read.  Both formats are parsed here
(``.mo`` of either byte order; ``msgctxt`` is dropped from the pair but kept for sorting).

**Filters**, in this order; the first that applies names the reason an entry is dropped, and the
manifest counts each reason, overall and per source:

Entry rules (:func:`entry_reason`):

``empty``
    the catalog header (empty ``msgid``) or an untranslated entry (empty ``msgstr``);
``plural``
    plural entries (``msgid_plural``; in a ``.mo`` the ``msgid`` holds a ``NUL``);
``fuzzy``
    entries flagged ``#, fuzzy`` (only ``.po`` files have them: ``.mo`` files leave them out).

Text rules (:func:`clean_pair`, on the source and the target with surrounding whitespace
stripped; a pair is dropped when either side fails):

``control``
    a newline, tab or other control character inside the text;
``format``
    a format placeholder: ``%`` followed by a letter, digit, ``(``, ``{`` or ``%`` (``%s``,
    ``%d``, ``%(name)s``, ``%1``, ``%PRODUCTNAME``, ``%%``), anything in braces (``{0}``,
    ``{name}``, ``{{x}}``), any ``$`` (``$VAR``, ``$(ARG1)``, ``${x}``, LibreOffice's ``$1`` and
    bare ``$``; this also drops a few prices such as ``$100``), or a word between two ``#``
    (LibreOffice's ``#lib#``);
``markup``
    an XML/HTML tag (``<b>``, ``</a>``, ``<br/>``) or a character/entity reference (``&amp;``,
    ``&#160;``);
``url``
    a URL (``http://``, ``https://``, ``www.``) or an e-mail address;
``accelerator``
    a keyboard mnemonic that cannot be removed safely.  Each source names the marker characters
    its UI toolkit uses (LibreOffice: ``~`` and ``_``; Cinnamon, a GTK desktop: ``_``; the Python
    packages: none).  A marker is removed where it occurs once in the text and is followed by a
    letter or digit (``~Ignore`` → ``Ignore``, ``Measurement _unit:`` → ``Measurement unit:``,
    ``Ouv_rir`` → ``Ouvrir``; a rare real underscore between two words goes too); a text
    still holding a marker character after that is dropped.

Then whitespace is normalised: every run of whitespace, the no-break spaces of French
typography (U+00A0, U+202F) included, becomes one ASCII space.  Text is otherwise kept verbatim
(quotes, apostrophes, ellipses, letter case).

``no_letters``
    either side has no letter at all (``...``, ``100``, ``+/-``);
``too_short``
    either side shorter than 2 characters;
``too_long``
    either side longer than 200 characters;
``identical``
    source and target equal, ignoring case (untranslated names, ``OK``/``Ok``, ``Description``).

Corpus rule:

``duplicate``
    a source string already kept: entries are visited sorted by package name, catalog file,
    ``msgid``, ``msgctxt`` and ``msgstr``, and the first translation of each exact source string
    wins, so the output does not depend on the order files are listed in.

**Split**: pairs are grouped by a near-duplicate key (the source lower-cased with everything but
letters and digits removed, so ``Save As...`` and ``save as`` share a group); the groups, in a
fixed order, are shuffled with ``random.Random(0)`` and taken whole for the test set until it
holds exactly :data:`TEST_SIZE` pairs, so no test source has a near-duplicate in train.  The
training pairs are shuffled with the same generator (so any prefix is a fair sample).

**Output** (``<cache>`` is ``--cache DIR``, else ``$QKV_BENCH_CACHE``, else
``~/.cache/qkv/bench-real-en-fr-v1``): ``train.tsv`` (``source<TAB>target`` per line, no header),
``test.en`` and ``test.fr`` (aligned, one sentence a line), ``manifest.json`` (each download's
package, version and SHA-256, counts per source and per filter rule, the split sizes and each
output file's SHA-256).  A later call reuses the cache when the manifest's recipe (a hash of
this module's code and settings) is current and every output file is there with its recorded
SHA-256, and rebuilds otherwise (offline: from the files in ``downloads/``).

Needs ``dpkg-deb`` (Debian or a derivative) for every build, and ``apt-get`` and ``pip`` to
download what ``downloads/`` lacks; when ``apt-get download`` fails, one ``apt-get update`` (as
root) is run before it is tried again.  Debian's archive drops a package version once an update
replaces it: keep ``downloads/`` (or a copy of it) to rebuild after that.

Run: ``python -m benchmarks.real_corpus [--cache DIR] [--force]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CORPORA",
    "SOURCES",
    "TEST_SIZE",
    "Corpus",
    "CorpusPaths",
    "Entry",
    "Source",
    "build_corpus",
    "clean_pair",
    "default_cache",
    "entry_reason",
    "keep_pair",
    "normalize_space",
    "pairs_by_source",
    "parse_mo",
    "parse_po",
    "split_by_groups",
    "split_key",
    "strip_accelerators",
]

NAME = "bench-real-en-fr-v1"
TEST_SIZE = 1000
SEED = 0
MAX_CHARS = 200
MIN_CHARS = 2


@dataclass(frozen=True)
class Source:
    """One pinned package whose French gettext catalogs feed the corpus."""

    package: str
    version: str
    kind: str  # "deb" (apt-get download) or "wheel" (pip download)
    sha256: str  # of the downloaded file
    accelerators: str = ""  # the keyboard-mnemonic marker characters of its UI strings


SOURCES: tuple[Source, ...] = (
    Source(
        "libreoffice-l10n-fr",
        "4:7.4.7-1+deb12u14",
        "deb",
        "111da5e1b8379dc58a127ef76ef85e2b6819da5cb2c5fe73d13b25a0437f988c",
        accelerators="~_",
    ),
    Source(
        "cinnamon-l10n",
        "5.6.1-2",
        "deb",
        "c03953148ebcac4b440c6cb397d5ee345760a9836ce433942dc80d2becc92d89",
        accelerators="_",
    ),
    Source(
        "django",
        "5.2.19",
        "wheel",
        "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00",
    ),
    Source(
        "sphinx",
        "9.0.4",
        "wheel",
        "5bebc595a5e943ea248b99c13814c1c5e10b3ece718976824ffa7959ff95fffb",
    ),
    Source(
        "wagtail",
        "8.0.1",
        "wheel",
        "1e6ad5c7891a54efce1400e168298b5a2cc343b642cee89c31bf5ec30c98b26c",
    ),
    Source(
        "django-allauth",
        "65.21.1",
        "wheel",
        "7bdf018c9f3f0a32c80677f84e7777272d9c833b180bd6734314c4831c802a9e",
    ),
    Source(
        "jupyterlab-language-pack-fr-fr",
        "4.5.post3",
        "wheel",
        "9f6ce9d4e64b367ff084a2313af29d6ad8a02d1d08000f3e6c53e2856fa9a11f",
    ),
)

#: the Python packages' catalogs, the same wheels for every language
_WHEELS = SOURCES[2:6]


@dataclass(frozen=True)
class Corpus:
    """One English→LANG corpus: its language, cache name, catalog folders and sources."""

    lang: str  # the target's code, as qkv and sacreBLEU write it ("fr", "de", "zh")
    name: str  # the cache folder's name
    locales: tuple[str, ...]  # the catalog folders read (``<locale>/LC_MESSAGES``)
    sources: tuple[Source, ...]
    #: mnemonics written after the label in parentheses, ``保存(~S)``: removed whole
    paren_mnemonics: bool = False


#: every corpus: French (the original), German, Chinese (simplified, China)
CORPORA: dict[str, Corpus] = {
    "fr": Corpus("fr", NAME, ("fr", "fr_FR"), SOURCES),
    "de": Corpus(
        "de",
        "bench-real-en-de-v1",
        ("de", "de_DE"),
        (
            Source(
                "libreoffice-l10n-de",
                "4:7.4.7-1+deb12u14",
                "deb",
                "aee22c8e3b3c0431f6e1b0bc66f757ba36c860e2651a05eb050fde4897f06548",
                accelerators="~_",
            ),
            SOURCES[1],  # cinnamon-l10n: every language in one package
            *_WHEELS,
            Source(
                "jupyterlab-language-pack-de-de",
                "4.5.post3",
                "wheel",
                "b716b56f7e0c884f42152d5e36c253ea0f32ca41f99097d842d3934f4a4bc7fb",
            ),
        ),
    ),
    "zh": Corpus(
        "zh",
        "bench-real-en-zh-v1",
        ("zh_CN", "zh-CN", "zh_Hans", "zh-Hans"),
        (
            Source(
                "libreoffice-l10n-zh-cn",
                "4:7.4.7-1+deb12u14",
                "deb",
                "06b2800923811a11ddadc9e1e09ef8bda2a89ba118470403b2f6a897152e0809",
                accelerators="~_",
            ),
            SOURCES[1],
            *_WHEELS,
            Source(
                "jupyterlab-language-pack-zh-cn",
                "4.5.post3",
                "wheel",
                "47cdb0c41c6b066e795c867786c9c29fde527e2bf15aa6b3e9b2bab9929304b5",
            ),
        ),
        paren_mnemonics=True,
    ),
}

# the rules in the order they are applied (the manifest lists every one, zeros included)
RULES = (
    "empty",
    "plural",
    "fuzzy",
    "control",
    "format",
    "markup",
    "url",
    "accelerator",
    "no_letters",
    "too_short",
    "too_long",
    "identical",
    "duplicate",
)


# ---------------------------------------------------------------------------- catalogs
@dataclass(frozen=True)
class Entry:
    """One catalog message: ``msgid`` (English) → ``msgstr`` (French)."""

    msgid: str
    msgstr: str
    context: str = ""
    plural: bool = False
    fuzzy: bool = False


_CHARSET = re.compile(rb"charset=([A-Za-z0-9_.:-]+)")


def _charset(header: bytes) -> str:
    m = _CHARSET.search(header)
    name = m.group(1).decode("ascii") if m else "utf-8"
    try:
        "".encode(name)
    except LookupError:
        return "utf-8"
    return "utf-8" if name.upper() == "CHARSET" else name


def parse_mo(data: bytes) -> list[Entry]:
    """Parse a compiled gettext catalog (``.mo``), little- or big-endian.

    A ``msgid`` of the form ``"ctx\\x04id"`` carries a ``msgctxt``; one holding ``NUL`` is a plural
    entry (its ``msgstr`` is then the first form).
    """
    if len(data) < 28:
        raise ValueError("not a .mo file: too short")
    if data[:4] == b"\xde\x12\x04\x95":
        order = "<"
    elif data[:4] == b"\x95\x04\x12\xde":
        order = ">"
    else:
        raise ValueError("not a .mo file: bad magic number")
    revision, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])
    if revision >> 16 > 1:
        raise ValueError(f"unsupported .mo revision {revision:#x}")

    def table(at: int) -> list[bytes]:
        out = []
        for i in range(count):
            length, offset = struct.unpack_from(order + "2I", data, at + 8 * i)
            if offset + length > len(data):
                raise ValueError("corrupt .mo file: string out of range")
            out.append(data[offset : offset + length])
        return out

    ids, strs = table(ids_at), table(strs_at)
    charset = "utf-8"
    for raw_id, raw_str in zip(ids, strs):
        if raw_id == b"":
            charset = _charset(raw_str)
    entries = []
    for raw_id, raw_str in zip(ids, strs):
        msgid = raw_id.decode(charset, errors="replace")
        msgstr = raw_str.decode(charset, errors="replace")
        context = ""
        if "\x04" in msgid:
            context, msgid = msgid.split("\x04", 1)
        plural = "\x00" in msgid
        if plural:
            msgid = msgid.split("\x00", 1)[0]
            msgstr = msgstr.split("\x00", 1)[0]
        entries.append(Entry(msgid, msgstr, context, plural=plural))
    return entries


_PO_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    '"': '"',
    "'": "'",
    "?": "?",
    "\\": "\\",
}
_PO_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|[0-7]{1,3}|.)", re.DOTALL)


def _unquote(token: str) -> str:
    """``"a\\"b"`` → ``a"b``: strip the quotes of one PO string and undo its C escapes."""
    token = token.strip()
    if len(token) < 2 or token[0] != '"' or token[-1] != '"':
        raise ValueError(f"bad PO string: {token[:40]!r}")

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if code[0] == "x":
            return chr(int(code[1:], 16))
        if code[0] in "01234567":
            return chr(int(code, 8))
        return _PO_ESCAPES.get(code, code)

    return _PO_ESCAPE.sub(one, token[1:-1])


_PO_KEYWORD = re.compile(r"(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?)\s+(\".*)$")


def parse_po(text: str) -> list[Entry]:
    """Parse a gettext source catalog (``.po``); obsolete (``#~``) entries are left out.

    For a plural entry, ``msgid`` is the singular and ``msgstr`` the first form (``msgstr[0]``).
    """
    entries: list[Entry] = []
    fields: dict[str, list[str]] = {}
    fuzzy = False
    key = ""

    def flush() -> None:
        nonlocal fields, fuzzy, key
        if "msgid" in fields:
            msgstr = fields.get("msgstr", fields.get("msgstr[0]", []))
            entries.append(
                Entry(
                    "".join(fields["msgid"]),
                    "".join(msgstr),
                    "".join(fields.get("msgctxt", [])),
                    plural="msgid_plural" in fields,
                    fuzzy=fuzzy,
                )
            )
        fields, fuzzy, key = {}, False, ""

    def has_msgstr() -> bool:
        return any(k.startswith("msgstr") for k in fields)

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            if has_msgstr():
                flush()
            if not fields and (not line or line.startswith("#~")):
                fuzzy = False  # the flags before a blank line or an obsolete entry are not ours
            elif line.startswith("#,") and "fuzzy" in (f.strip() for f in line[2:].split(",")):
                fuzzy = True
            continue
        if line.startswith('"'):
            if not key:
                raise ValueError(f"line {lineno}: string outside an entry")
            fields[key].append(_unquote(line))
            continue
        m = _PO_KEYWORD.match(line)
        if not m:
            raise ValueError(f"line {lineno}: cannot parse {line[:40]!r}")
        key = m.group(1)
        if key in ("msgctxt", "msgid") and has_msgstr():
            flush()  # a new entry with no comment before it
            key = m.group(1)
        fields[key] = [_unquote(m.group(2))]
    flush()
    return entries


def _decode_po(data: bytes) -> str:
    head = data[: data.find(b"\n\n") if b"\n\n" in data else 4096]
    return data.decode(_charset(head), errors="replace").lstrip("\ufeff")


_CATALOG = re.compile(r"(?:^|/)(fr|fr_FR)/LC_MESSAGES/([^/]+)\.(po|mo)$")


def _catalog_pattern(locales: tuple[str, ...]) -> re.Pattern[str]:
    """The catalog files of ``locales`` (the French corpus's is :data:`_CATALOG`)."""
    return re.compile(
        r"(?:^|/)(" + "|".join(map(re.escape, locales)) + r")/LC_MESSAGES/([^/]+)\.(po|mo)$"
    )


def _pick_catalogs(names: Iterable[str], locales: tuple[str, ...] = ("fr", "fr_FR")) -> list[str]:
    """The catalogs of ``locales`` among ``names`` (French by default), ``X.po`` preferred to
    ``X.mo`` in one folder, sorted."""
    pattern = _catalog_pattern(locales)
    chosen: dict[str, str] = {}
    for name in sorted(names):
        m = pattern.search(name)
        if not m:
            continue
        stem = name[: -len(".po")]
        if m.group(3) == "po" or stem not in chosen:
            chosen[stem] = name
    return sorted(chosen.values())


def _parse_catalog(name: str, data: bytes) -> list[Entry]:
    return parse_po(_decode_po(data)) if name.endswith(".po") else parse_mo(data)


# ---------------------------------------------------------------------------- filters
_FORMAT = re.compile(r"%[A-Za-z0-9({%]|\{[^{}]*\}|\$|#\w+#")
_MARKUP = re.compile(
    r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>|&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);"
)
_URL = re.compile(r"https?://|\bwww\.|[\w.+-]+@[\w-]+\.[\w.-]+")
_MNEMONIC_NEXT = re.compile(r"\w")


def entry_reason(entry: Entry) -> str | None:
    """Why the entry-level rules drop ``entry`` (``empty``, ``plural``, ``fuzzy``), or ``None``."""
    if not entry.msgid or not entry.msgstr:
        return "empty"
    if entry.plural or "\x00" in entry.msgid:
        return "plural"
    if entry.fuzzy:
        return "fuzzy"
    return None


def strip_accelerators(text: str, markers: str) -> str | None:
    """Remove the keyboard-mnemonic markers of ``text``, or ``None`` where that is unsafe.

    For each character in ``markers``: one occurrence followed by a letter or digit is removed
    (``"~Open"`` → ``"Open"``, ``"Ouv_rir"`` → ``"Ouvrir"``); any other occurrence (two or more,
    or one not before a letter or digit) makes the text ambiguous and gives ``None``.
    """
    for mark in markers:
        n = text.count(mark)
        if n == 0:
            continue
        i = text.index(mark)
        if n > 1 or not _MNEMONIC_NEXT.match(text, i + 1) or text[i + 1] == "_":
            return None
        text = text[:i] + text[i + 1 :]
    return text


def normalize_space(text: str) -> str:
    """Strip ``text`` and turn every run of whitespace (no-break spaces included) into one space."""
    return " ".join(text.split())


def _has_control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def _has_letter(text: str) -> bool:
    return any(c.isalpha() for c in text)


# a mnemonic in parentheses after the label, as Chinese and Japanese UI strings write it:
# ``保存(~S)``, ``打开(_O)...``, full-width parentheses too
_PAREN_MNEMONIC = re.compile(r"\s*[(（][~_&]([A-Za-z0-9])[)）]")


def clean_pair(
    src: str, tgt: str, accelerators: str = "", *, paren_mnemonics: bool = False
) -> tuple[str, str, str | None]:
    """Apply the text rules to one pair: ``(clean_src, clean_tgt, reason)``.

    ``reason`` is ``None`` when the pair is kept (then ``clean_*`` are the texts to write) and
    otherwise the name of the first rule that drops it (``control``, ``format``, ``markup``,
    ``url``, ``accelerator``, ``no_letters``, ``too_short``, ``too_long``, ``identical``).
    ``accelerators`` are the source's mnemonic marker characters (see :func:`strip_accelerators`).
    """
    src, tgt = src.strip(), tgt.strip()
    pair = (src, tgt)
    if any(_has_control(s) for s in pair):
        return src, tgt, "control"
    if any(_FORMAT.search(s) for s in pair):
        return src, tgt, "format"
    if any(_MARKUP.search(s) for s in pair):
        return src, tgt, "markup"
    if any(_URL.search(s) for s in pair):
        return src, tgt, "url"
    if accelerators and paren_mnemonics:  # "保存(~S)" -> "保存", before the markers are read
        src, tgt = _PAREN_MNEMONIC.sub("", src), _PAREN_MNEMONIC.sub("", tgt)
    if accelerators:
        s2, t2 = strip_accelerators(src, accelerators), strip_accelerators(tgt, accelerators)
        if s2 is None or t2 is None:
            return src, tgt, "accelerator"
        src, tgt = s2, t2
    src, tgt = normalize_space(src), normalize_space(tgt)
    if not (_has_letter(src) and _has_letter(tgt)):
        return src, tgt, "no_letters"
    if min(len(src), len(tgt)) < MIN_CHARS:
        return src, tgt, "too_short"
    if max(len(src), len(tgt)) > MAX_CHARS:
        return src, tgt, "too_long"
    if src.casefold() == tgt.casefold():
        return src, tgt, "identical"
    return src, tgt, None


def keep_pair(src: str, tgt: str, accelerators: str = "") -> str | None:
    """The rule that drops the pair ``src → tgt`` (see :func:`clean_pair`), or ``None`` to keep it."""
    return clean_pair(src, tgt, accelerators)[2]


def split_key(src: str) -> str:
    """The near-duplicate key of the split: lower-cased, letters and digits only."""
    return "".join(c for c in src.casefold() if c.isalnum())


# ---------------------------------------------------------------------------- downloads
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _log(verbose: bool, msg: str) -> None:
    if verbose:
        print(msg, file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def _fetch_deb(src: Source, tmp: Path, verbose: bool) -> Path:
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{src.package}: needs apt-get (Debian) to download the package")
    spec = f"{src.package}={src.version}"
    res = _run(["apt-get", "download", spec], tmp)
    if res.returncode != 0:
        _log(verbose, f"  apt-get download {spec} failed; running apt-get update once")
        upd = _run(["apt-get", "update"], tmp)
        if upd.returncode != 0:
            raise RuntimeError(f"apt-get update failed (root needed?):\n{upd.stderr.strip()}")
        res = _run(["apt-get", "download", spec], tmp)
        if res.returncode != 0:
            raise RuntimeError(f"apt-get download {spec} failed:\n{res.stderr.strip()}")
    debs = sorted(tmp.glob("*.deb"))
    if len(debs) != 1:
        raise RuntimeError(f"apt-get download {spec}: expected one .deb, got {debs}")
    return debs[0]


def _fetch_wheel(src: Source, tmp: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",  # the wheels are pure Python: name the interpreter so any one gets the same file
        "-d",
        str(tmp),
        f"{src.package}=={src.version}",
    ]
    res = _run(cmd, tmp)
    if res.returncode != 0:
        raise RuntimeError(f"pip download {src.package}=={src.version} failed:\n{res.stderr}")
    wheels = sorted(tmp.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {src.package}: expected one wheel, got {wheels}")
    return wheels[0]


def _download(src: Source, downloads: Path, verbose: bool) -> Path:
    """The source's file in ``downloads/``, fetched unless already there with the pinned hash."""
    downloads.mkdir(parents=True, exist_ok=True)
    record = downloads / f"{src.package}.json"
    if record.exists():
        meta = json.loads(record.read_text())
        path = downloads / meta["file"]
        if meta.get("version") == src.version and path.exists() and _sha256(path) == src.sha256:
            return path
    _log(verbose, f"  downloading {src.package} {src.version} ({src.kind})")
    with tempfile.TemporaryDirectory(prefix="qkv-corpus-") as tmp_name:
        tmp = Path(tmp_name)
        got = _fetch_deb(src, tmp, verbose) if src.kind == "deb" else _fetch_wheel(src, tmp)
        digest = _sha256(got)
        if digest != src.sha256:
            raise RuntimeError(f"{got.name}: sha256 {digest} differs from the pinned {src.sha256}")
        path = downloads / got.name
        shutil.move(str(got), path)
    record.write_text(json.dumps({"file": path.name, "version": src.version}) + "\n")
    return path


def _catalogs(
    src: Source, path: Path, locales: tuple[str, ...] = ("fr", "fr_FR")
) -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of each catalog of ``locales`` in the downloaded file, sorted by name."""
    if src.kind == "wheel":
        with zipfile.ZipFile(path) as zf:
            for name in _pick_catalogs(zf.namelist(), locales):
                yield name, zf.read(name)
        return
    if shutil.which("dpkg-deb") is None:
        raise RuntimeError(f"{src.package}: needs dpkg-deb (Debian) to unpack {path.name}")
    with tempfile.TemporaryDirectory(prefix="qkv-corpus-") as tmp_name:
        root = Path(tmp_name)
        res = _run(["dpkg-deb", "-x", str(path), str(root)], root)
        if res.returncode != 0:
            raise RuntimeError(f"dpkg-deb -x {path.name} failed:\n{res.stderr}")
        names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        for name in _pick_catalogs(names, locales):
            yield name, (root / name).read_bytes()


# ---------------------------------------------------------------------------- the corpus
@dataclass
class CorpusPaths:
    """Where the corpus lies, and its sizes."""

    root: Path
    train: Path
    test_src: Path
    test_ref: Path
    manifest: Path
    n_train: int
    n_test: int
    per_source: dict[str, int] = field(default_factory=dict)
    filters: dict[str, int] = field(default_factory=dict)


def default_cache(lang: str = "fr") -> Path:
    """The French corpus's folder: ``$QKV_BENCH_CACHE`` if set, else
    ``~/.cache/qkv/bench-real-en-fr-v1``; another language's corpus lies beside it, under its
    own name (``bench-real-en-de-v1``)."""
    env = os.environ.get("QKV_BENCH_CACHE")
    french = Path(env).expanduser() if env else Path.home() / ".cache" / "qkv" / NAME
    return french if lang == "fr" else french.with_name(CORPORA[lang].name)


def _recipe(corpus: Corpus = CORPORA["fr"]) -> str:
    """A fingerprint of everything that decides the output: this module's code and settings."""
    spec = {
        "name": corpus.name,
        "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "sources": [vars(s) for s in corpus.sources],
        "rules": RULES,
        "patterns": [
            _FORMAT.pattern,
            _MARKUP.pattern,
            _URL.pattern,
            _catalog_pattern(corpus.locales).pattern,
        ],
        "limits": [MIN_CHARS, MAX_CHARS, TEST_SIZE, SEED],
        "paren_mnemonics": corpus.paren_mnemonics,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _outputs(corpus: Corpus) -> tuple[str, str, str]:
    return ("train.tsv", "test.en", f"test.{corpus.lang}")


def _paths(root: Path, manifest: dict, corpus: Corpus = CORPORA["fr"]) -> CorpusPaths:
    return CorpusPaths(
        root=root,
        train=root / "train.tsv",
        test_src=root / "test.en",
        test_ref=root / f"test.{corpus.lang}",
        manifest=root / "manifest.json",
        n_train=manifest["train"],
        n_test=manifest["test"],
        per_source={s["package"]: s["pairs"] for s in manifest["sources"]},
        filters=dict(manifest["filters"]),
    )


def _load_cached(root: Path, corpus: Corpus = CORPORA["fr"]) -> CorpusPaths | None:
    path = root / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("recipe") != _recipe(corpus):
        return None
    for name in _outputs(corpus):
        f = root / name
        if not f.exists() or _sha256(f) != manifest.get("files", {}).get(name, {}).get("sha256"):
            return None
    return _paths(root, manifest, corpus)


def split_by_groups(
    pairs: list[tuple[str, str]], n_test: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(train, test)``: near-duplicate groups (:func:`split_key`) shuffled with a fixed seed
    and taken whole for a test set of ``n_test`` pairs; the rest shuffled for training.

    Raises:
        RuntimeError: the groups cannot fill ``n_test`` pairs exactly.
    """
    groups: dict[str, list[int]] = {}
    for i, (src, _) in enumerate(pairs):
        groups.setdefault(split_key(src), []).append(i)
    keys = sorted(groups)
    rng = random.Random(SEED)
    rng.shuffle(keys)
    test_idx: list[int] = []
    in_test: set[int] = set()
    for key in keys:
        members = groups[key]
        if len(test_idx) + len(members) <= n_test:
            test_idx.extend(members)
            in_test.update(members)
        if len(test_idx) == n_test:
            break
    if len(test_idx) != n_test:
        raise RuntimeError(f"only {len(test_idx)} pairs for a test set of {n_test}")
    train = [p for i, p in enumerate(pairs) if i not in in_test]
    rng.shuffle(train)
    return train, [pairs[i] for i in test_idx]


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    tmp.replace(path)


@dataclass
class _Kept:
    """What the filters keep of a corpus's catalogs: the pairs with their package, in order,
    and the counts the manifest records."""

    pairs: list[tuple[str, str, str]]  # (source, target, package)
    filters: Counter[str]
    per_source_rules: dict[str, Counter[str]]
    per_source_pairs: Counter[str]
    source_meta: list[dict]


def _kept(root: Path, verbose: bool, corpus: Corpus) -> _Kept:
    """Every catalog of ``corpus`` read (downloaded into ``root/downloads`` first when
    missing) and filtered: the pairs kept, each with its package."""
    downloads = root / "downloads"
    # package, catalog, msgid, msgctxt, msgstr, the entry rule that drops it ("" if none), source
    rows: list[tuple[str, str, str, str, str, str, Source]] = []
    source_meta = []
    for src in sorted(corpus.sources, key=lambda s: s.package):
        path = _download(src, downloads, verbose)
        n_catalogs = n_entries = 0
        for name, data in _catalogs(src, path, corpus.locales):
            n_catalogs += 1
            for e in _parse_catalog(name, data):
                n_entries += 1
                reason = entry_reason(e) or ""
                rows.append((src.package, name, e.msgid, e.context, e.msgstr, reason, src))
        _log(verbose, f"  {src.package} {src.version}: {n_catalogs} catalogs, {n_entries} entries")
        source_meta.append(
            {
                "package": src.package,
                "version": src.version,
                "kind": src.kind,
                "file": path.name,
                "sha256": _sha256(path),
                "catalogs": n_catalogs,
                "entries": n_entries,
            }
        )
    rows.sort(key=lambda r: r[:5])

    filters: Counter[str] = Counter()
    per_source_rules: dict[str, Counter[str]] = {s.package: Counter() for s in corpus.sources}
    per_source_pairs: Counter[str] = Counter()
    seen: set[str] = set()
    pairs: list[tuple[str, str, str]] = []
    for package, _name, msgid, _ctx, msgstr, entry_rule, src in rows:
        reason: str | None = entry_rule or None
        if reason is None:
            msgid, msgstr, reason = clean_pair(
                msgid, msgstr, src.accelerators, paren_mnemonics=corpus.paren_mnemonics
            )
            if reason is None and msgid in seen:
                reason = "duplicate"
        if reason:
            filters[reason] += 1
            per_source_rules[package][reason] += 1
            continue
        seen.add(msgid)
        pairs.append((msgid, msgstr, package))
        per_source_pairs[package] += 1
    return _Kept(pairs, filters, per_source_rules, per_source_pairs, source_meta)


def pairs_by_source(
    cache: Path | None = None, *, lang: str = "fr", verbose: bool = True
) -> dict[str, list[tuple[str, str]]]:
    """The corpus's pairs (every pair the filters keep, before the split), by the package
    they come from, each in the corpus's order: what a benchmark of one domain against another
    reads (the desktop's LibreOffice and Cinnamon, the Python web packages). Reads the
    downloads of ``cache`` (see :func:`default_cache`), fetching what is missing."""
    root = Path(cache).expanduser() if cache is not None else default_cache(lang)
    out: dict[str, list[tuple[str, str]]] = {}
    for src, tgt, package in _kept(root, verbose, CORPORA[lang]).pairs:
        out.setdefault(package, []).append((src, tgt))
    return out


def _build(root: Path, verbose: bool, corpus: Corpus = CORPORA["fr"]) -> CorpusPaths:
    t0 = time.perf_counter()
    kept = _kept(root, verbose, corpus)
    filters, per_source_rules = kept.filters, kept.per_source_rules
    per_source_pairs, source_meta = kept.per_source_pairs, kept.source_meta
    pairs = [(s, t) for s, t, _ in kept.pairs]

    # the control rule guarantees one pair per line and one tab per pair
    assert not any(c in s + t for s, t in pairs for c in "\t\n\r")
    train, test = split_by_groups(pairs, TEST_SIZE)

    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").unlink(missing_ok=True)
    _write_lines(root / "train.tsv", (f"{s}\t{t}" for s, t in train))
    _write_lines(root / "test.en", (s for s, _ in test))
    _write_lines(root / f"test.{corpus.lang}", (t for _, t in test))
    for meta in source_meta:
        meta["pairs"] = per_source_pairs[meta["package"]]
        meta["rejected"] = {r: per_source_rules[meta["package"]][r] for r in RULES}
    manifest = {
        "name": corpus.name,
        "recipe": _recipe(corpus),
        "description": f"English→{corpus.lang} pairs from the gettext catalogs of pinned packages",
        "sources": source_meta,
        "filters": {r: filters[r] for r in RULES},
        "pairs": len(pairs),
        "train": len(train),
        "test": len(test),
        "seed": SEED,
        "files": {
            name: {
                "sha256": _sha256(root / name),
                "lines": len(train) if name == "train.tsv" else len(test),
            }
            for name in _outputs(corpus)
        },
    }
    tmp = root / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(root / "manifest.json")
    _log(verbose, f"  built {len(pairs)} pairs in {time.perf_counter() - t0:.1f} s -> {root}")
    return _paths(root, manifest, corpus)


def build_corpus(
    cache: Path | None = None, *, verbose: bool = True, force: bool = False, lang: str = "fr"
) -> CorpusPaths:
    """Build the English→``lang`` corpus (``fr``, ``de`` or ``zh``: :data:`CORPORA`) in
    ``cache`` (see :func:`default_cache`) or reuse the one already there.

    The cache is reused when its manifest matches this module's recipe and the output files are
    intact; otherwise (or with ``force``) it is rebuilt, from ``cache/downloads/`` where the
    pinned files already are.
    """
    if lang not in CORPORA:
        raise ValueError(f"lang: expected one of {sorted(CORPORA)}, got {lang!r}")
    corpus = CORPORA[lang]
    root = Path(cache).expanduser() if cache is not None else default_cache(lang)
    if not force:
        cached = _load_cached(root, corpus)
        if cached is not None:
            _log(verbose, f"reusing the corpus in {root}")
            return cached
    _log(verbose, f"building the corpus in {root}")
    return _build(root, verbose, corpus)


# ---------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache", type=Path, default=None, help=f"folder (default {default_cache()})"
    )
    parser.add_argument(
        "--lang", default="fr", choices=sorted(CORPORA), help="the language besides English (fr)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the cache is intact")
    parser.add_argument("--examples", type=int, default=10, help="random pairs to print")
    args = parser.parse_args(argv)
    paths = build_corpus(args.cache, force=args.force, lang=args.lang)
    manifest = json.loads(paths.manifest.read_text(encoding="utf-8"))
    print(f"corpus: {paths.root}")
    print(f"pairs: {manifest['pairs']} (train {paths.n_train}, test {paths.n_test})")
    print("\npairs per source:")
    for s in manifest["sources"]:
        label = f"{s['package']} {s['version']}"
        print(f"  {label:<46} {s['pairs']:>6} of {s['entries']:>6} entries")
    print("\ndropped, per rule:")
    for rule, n in manifest["filters"].items():
        print(f"  {rule:<12} {n:>6}")
    lines = paths.train.read_text(encoding="utf-8").splitlines()
    print(f"\n{args.examples} random training pairs:")
    for line in random.sample(lines, min(args.examples, len(lines))):
        src, tgt = line.split("\t")
        print(f"  {src}\n    → {tgt}")


if __name__ == "__main__":
    main()
