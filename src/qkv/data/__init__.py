"""Parallel text, from a file on disk to padded token batches.

Readers (:func:`read_pairs`), normalisation (:class:`Normalizer`), vocabulary (:class:`Vocab`),
tokenizers (:class:`WordTokenizer`, :class:`SentencePieceTokenizer`), seeded splits
(:func:`split_pairs`), token-budget batching (:class:`TokenBatcher`) and the bundled
English-French corpus (:func:`bundled_pairs`). See ``docs/data.md``.
"""

from .batching import Batch, TokenBatcher
from .corpus import bundled_corpus_path, bundled_pairs
from .normalize import Normalizer
from .readers import FORMATS, ReadReport, guess_format, read_pairs, write_pairs
from .splits import Split, fingerprint, normalized_source, split_pairs
from .tokenizers import (
    SentencePieceTokenizer,
    Tokenizer,
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
    "WordTokenizer",
    "build_tokenizers",
    "bundled_corpus_path",
    "bundled_pairs",
    "encode_pairs",
    "fingerprint",
    "guess_format",
    "load_tokenizer",
    "load_tokenizers",
    "normalized_source",
    "read_pairs",
    "save_tokenizers",
    "split_pairs",
    "write_pairs",
]
