"""Modules: own parameters, validate at construction, call :mod:`qkv.functional`."""

from .attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    MultiheadAttention,
    MultiHeadSelfAttention,
)
from .kv_cache import KVCache, TensorKVCache
from .position import (
    LearnedPositionalEncoding,
    PositionalEncoding,
    RotaryEmbedding,
    apply_rotary,
)
from .rnn import Seq2SeqAttentionDecoder, Seq2SeqEncoder
from .seq2seq import AttentionMaps, EncoderDecoder, Seq2SeqConfig, build_model
from .transformer import (
    AddNorm,
    PositionWiseFFN,
    TransformerDecoder,
    TransformerDecoderBlock,
    TransformerEncoder,
    TransformerEncoderBlock,
)
from .vision import ImageEncoder, ImageToSequence, sine_position_encoding_2d

__all__ = [
    "AddNorm",
    "AdditiveAttention",
    "AttentionMaps",
    "DotProductAttention",
    "EncoderDecoder",
    "ImageEncoder",
    "ImageToSequence",
    "KVCache",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "MultiHeadSelfAttention",
    "MultiheadAttention",
    "PositionWiseFFN",
    "PositionalEncoding",
    "RotaryEmbedding",
    "Seq2SeqAttentionDecoder",
    "Seq2SeqConfig",
    "Seq2SeqEncoder",
    "TensorKVCache",
    "TransformerDecoder",
    "TransformerDecoderBlock",
    "TransformerEncoder",
    "TransformerEncoderBlock",
    "apply_rotary",
    "build_model",
    "sine_position_encoding_2d",
]
