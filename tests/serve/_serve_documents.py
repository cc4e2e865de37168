"""A small file of each format ``/translate_file`` reads, made here (office files with their
own libraries), and the formats the text layer reads today."""

from __future__ import annotations

import io
import zipfile

from qkv.text.formats import EXTENSIONS, FORMATS

TEXT = "I am home. He is calm.\nGo on.\n\n  Thank you. Good night.\n"

HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Notes. Hello.</title></head>
<body><h1>Welcome <em>home</em>.</h1>
<p>I am <b>very</b> happy. He is <a href="/x">calm and <em>quiet</em></a> today.</p>
<pre>keep   this.</pre></body></html>
"""

SRT = """1
00:00:01,000 --> 00:00:03,500
I am home.
He is calm.

2
00:00:04,000 --> 00:00:06,000
<i>Go on.</i> Thank you.

"""

VTT = """WEBVTT

NOTE kept as it is.

00:01.000 --> 00:03.500 align:start
I am home. He is calm.

00:04.000 --> 00:06.000
<v Tom>Go on.</v> Thank you.
"""

PO = """# A catalog.
msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"
"Language: fr\\n"

#: main.c:12
#, c-format
msgid "I am home. He is calm."
msgstr ""

msgid "Go on."
msgid_plural "Go on, all of you."
msgstr[0] ""
msgstr[1] ""
"""

XLIFF = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file original="app.txt" source-language="en" target-language="fr" datatype="plaintext">
    <body>
      <trans-unit id="1"><source>I am home. He is calm.</source></trans-unit>
      <trans-unit id="2"><source>Thank you.</source></trans-unit>
    </body>
  </file>
</xliff>
"""

MD = """# Welcome home.

I am **very** happy. He is calm.

```
keep   this.
```
"""


def _docx() -> bytes:
    import docx

    d = docx.Document()
    d.add_heading("Welcome home.", level=1)
    p = d.add_paragraph("I am ")
    p.add_run("very").bold = True
    p.add_run(" happy. He is calm.")
    d.add_paragraph("Thank you. Good night.")
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def _odt() -> bytes:
    from odfdo import Document, Paragraph

    doc = Document("text")
    body = doc.body
    body.append(Paragraph("I am home. He is calm."))
    body.append(Paragraph("Thank you. Good night."))
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


#: file name -> how to make its bytes
SAMPLES = {
    "notes.txt": lambda: TEXT.encode(),
    "page.html": lambda: HTML.encode(),
    "film.srt": lambda: SRT.encode(),
    "film.vtt": lambda: VTT.encode(),
    "app.po": lambda: PO.encode(),
    "app.xliff": lambda: XLIFF.encode(),
    "report.docx": _docx,
    "report.odt": _odt,
    "readme.md": lambda: MD.encode(),
}


def readable(name: str) -> bool:
    """Whether the text layer reads the format of ``name`` (by its extension)."""
    ext = "." + name.rsplit(".", 1)[1]
    return ext in EXTENSIONS and EXTENSIONS[ext] in FORMATS


def contents(data: bytes) -> bytes | dict[str, bytes]:
    """A file's bytes; a zip's (.docx, .odt) members, whose stored times are the saving's."""
    if not data.startswith(b"PK"):
        return data
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}
