"""The bundled English-French corpus.

``corpus/en-fr.tsv.gz`` is made by ``tools/corpus_generator.py`` in the repository (run by a
developer, never at install or run time, and not in the installed package; ``corpus/README.md``
says how) and is in the ``fra`` format with a third column
naming the template each pair came from. Its text is already normalised the book's way
(lower case, a space before ``, . ! ?``), so ``Normalizer.book()`` leaves it unchanged.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from .readers import read_pairs

__all__ = ["BUNDLED_CORPUS", "bundled_corpus_path", "bundled_pairs"]

BUNDLED_CORPUS = "en-fr.tsv.gz"


def bundled_corpus_path() -> Path:
    """Filesystem path of the bundled corpus file (``en-fr.tsv.gz``, fra format, gzip)."""
    path = Path(str(resources.files("qkv.data") / "corpus" / BUNDLED_CORPUS))
    if not path.is_file():  # pragma: no cover - only in a broken install
        raise FileNotFoundError(f"the bundled corpus is missing from the package: {path}")
    return path


def bundled_pairs() -> list[tuple[str, str]]:
    """The bundled English-French pairs, ``[(english, french), ...]``, in file order.

    The file is clean: every line is a pair (``read_pairs`` on ``bundled_corpus_path()`` gives
    the report too).
    """
    return list(_bundled())


@functools.cache
def _bundled() -> tuple[tuple[str, str], ...]:
    """The bundled pairs, read once per process (the file ships with the package)."""
    pairs, _ = read_pairs(bundled_corpus_path(), format="fra")
    return tuple(pairs)
