"""What happens to text before and after the engine: sentences, layout, documents.

An engine translates *segments* (sentences, one at a time, as models are trained); people
bring paragraphs, line breaks, HTML and files. This package cuts what they bring into
segments and puts the translations back, each format a reader/writer pair around one
"segments in, segments out" call of the engine interface. It imports nothing above floor 1,
so :class:`qkv.inference.TranslatorBase` (every engine's base) calls it for every entry point
(the library, ``qkv translate``, ``qkv serve``) from one place.

The API:

* Sentences: :func:`sentence_spans(text, lang) <qkv.text.sentences.sentence_spans>` and
  :func:`split_sentences` cut one paragraph (no line break) by language; :func:`segmenter`
  names the segmenter in use.
* Layout: :func:`plan_texts(texts, source=, target=, split="sentences") <plan_texts>` gives
  a :class:`Plan`: ``plan.segments`` (the distinct segments of all texts, one list, to
  translate in one call), ``plan.join(translations)`` (each text rebuilt: line breaks, blank
  lines, indentation and the whitespace between sentences kept), ``plan.join_hypotheses``
  (n-best lists of texts from those of segments) and ``plan.joined`` (where each segment's
  translation landed). ``split="none"``: each line is one segment. :func:`clean` is what a
  translated segment looks like shown (no doubled or end spaces from subword pieces).
* Documents: :func:`read_document(data, fmt, source=, target=, split=, limits=)
  <read_document>` reads bytes (or a path) of a format of :data:`FORMATS` into a
  :class:`Document`: ``doc.segments`` to translate, ``doc.render(translations,
  alignments=None) -> bytes``; ``doc.aligned`` lists the segments whose inline markup an
  :class:`Alignment` (an engine's cross-attention) places. :func:`translate_document` and
  :func:`translate_file` do it all with an engine (or a function of segments);
  :class:`Limits` (``max_bytes``, ``max_chars``, ``max_segments``) are checked as it is read,
  each a :class:`~qkv._errors.SettingError` named by the limit. :func:`format_of` picks the
  format by a file's extension.

>>> from qkv.text import plan_texts
>>> plan = plan_texts(["I am home. He is calm.", "", "  Go."], source="en", target="fr")
>>> plan.segments
('I am home.', 'He is calm.', 'Go.')
>>> plan.join(["Je suis chez moi.", "Il est calme.", "Va."])
['Je suis chez moi. Il est calme.', '', '  Va.']
"""

from .documents import Alignment, Document, Limits, Translate
from .files import FORMATS, format_of, read_document, translate_document, translate_file
from .layout import (
    DEFAULT_SPLIT,
    NO_SPACES,
    SPLITS,
    Joined,
    Plan,
    Slot,
    check_split,
    clean,
    plan_texts,
)
from .sentences import segmenter, sentence_spans, split_sentences

__all__ = [
    "DEFAULT_SPLIT",
    "FORMATS",
    "NO_SPACES",
    "SPLITS",
    "Alignment",
    "Document",
    "Joined",
    "Limits",
    "Plan",
    "Slot",
    "Translate",
    "check_split",
    "clean",
    "format_of",
    "plan_texts",
    "read_document",
    "segmenter",
    "sentence_spans",
    "split_sentences",
    "translate_document",
    "translate_file",
]
