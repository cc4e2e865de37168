"""Parallel text, from a file on disk to padded token batches.

Readers (:func:`read_pairs`), normalisation (:class:`Normalizer`), vocabulary (:class:`Vocab`),
tokenizers (:class:`WordTokenizer`, :class:`SentencePieceTokenizer`, an imported model's
:class:`VocabSentencePieceTokenizer`), seeded splits
(:func:`split_pairs`), token-budget batching (:class:`TokenBatcher`), the bundled
English-French corpus (:func:`bundled_pairs`) and languages (:mod:`qkv.data.languages`: the
code table, :func:`check_language`, :func:`detect_language`). See ``docs/data.md``.
"""

from .batching import Batch, TokenBatcher
from .corpus import bundled_corpus_path, bundled_pairs
from .languages import (
    LANGUAGES,
    check_language,
    detect_language,
    detect_languages,
    language_code,
    language_name,
)
from .normalize import Normalizer
from .readers import FORMATS, ReadReport, guess_format, read_pairs, write_pairs
from .splits import Split, fingerprint, normalized_source, split_pairs
from .tokenizers import (
    SentencePieceTokenizer,
    Tokenizer,
    VocabSentencePieceTokenizer,
    VocabTooSmall,
    WordTokenizer,
    build_tokenizers,
    encode_pairs,
    load_tokenizer,
    load_tokenizers,
    save_tokenizers,
)
from .vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab

__all__ = [
    "BOS",
    "EOS",
    "FORMATS",
    "LANGUAGES",
    "PAD",
    "SPECIALS",
    "UNK",
    "Batch",
    "Normalizer",
    "ReadReport",
    "SentencePieceTokenizer",
    "Split",
    "TokenBatcher",
    "Tokenizer",
    "Vocab",
    "VocabSentencePieceTokenizer",
    "VocabTooSmall",
    "WordTokenizer",
    "build_tokenizers",
    "bundled_corpus_path",
    "bundled_pairs",
    "check_language",
    "detect_language",
    "detect_languages",
    "encode_pairs",
    "fingerprint",
    "guess_format",
    "language_code",
    "language_name",
    "load_tokenizer",
    "load_tokenizers",
    "normalized_source",
    "read_pairs",
    "save_tokenizers",
    "split_pairs",
    "write_pairs",
]
