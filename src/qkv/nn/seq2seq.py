"""Encoder-decoder models: one interface for the Transformer and the Bahdanau RNN.

* :class:`EncoderDecoder` ``(encoder, decoder)``: the book's class with separate :meth:`encode`
  and :meth:`decode` (the annotated Transformer's split), so training and
  :func:`qkv.decoding.generate` run either kind;
* :class:`Seq2SeqConfig`: a small dataclass describing a model; ``to_dict``/``from_dict`` round
  trip through JSON, and :func:`build_model` rebuilds the model from it (a checkpoint stores the
  dict beside the weights);
* :class:`AttentionMaps`: every layer's encoder self-, decoder self- and cross-attention weights
  per head, returned on request by ``forward(..., return_attention=True)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .position import POSITIONAL_ENCODINGS
from .rnn import RNNDecoderState, Seq2SeqAttentionDecoder, Seq2SeqEncoder
from .transformer import (
    ACTIVATIONS,
    TransformerDecoder,
    TransformerDecoderState,
    TransformerEncoder,
)

__all__ = [
    "MODEL_KINDS",
    "AttentionMaps",
    "EncoderDecoder",
    "Seq2SeqConfig",
    "build_model",
]

MODEL_KINDS: tuple[str, ...] = ("transformer", "bahdanau")
DecoderState = TransformerDecoderState | RNNDecoderState


# ---------------------------------------------------------------------------- attention maps
def _crop(w: Tensor, i: int, rows: int | None, cols: int | None) -> Tensor:
    """Sentence ``i`` of per-layer weights ``(B, H, Lq, Lk)`` -> ``(H, rows, cols)`` on the CPU."""
    return w[i, :, :rows, :cols].detach().to("cpu", torch.float32)


@dataclass
class AttentionMaps:
    """Attention weights of one forward pass, per layer and per head.

    Attributes:
        encoder_self: per encoder layer ``(B, H, Ls, Ls)``; None for an encoder without attention
            (the Bahdanau model's GRU).
        decoder_self: per decoder layer ``(B, H, Lt, Lt)``; None for the Bahdanau decoder.
        cross: per decoder layer ``(B, H, Lt, Ls)``; the Bahdanau decoder's additive attention is
            one layer with one head ``(B, 1, Lt, Ls)``.
    """

    encoder_self: list[Tensor] | None
    decoder_self: list[Tensor] | None
    cross: list[Tensor] = field(default_factory=list)

    def sentence(
        self, i: int = 0, src_len: int | None = None, tgt_len: int | None = None
    ) -> dict[str, list[Tensor]]:
        """The weights of sentence ``i``, cropped to its lengths, as plain per-layer tensors.

        Returns ``{"encoder_self": [(H, Ls, Ls)], "decoder_self": [(H, Lt, Lt)], "cross":
        [(H, Lt, Ls)]}`` (kinds the model lacks are left out) with ``Ls = src_len`` and
        ``Lt = tgt_len`` (default: the whole padded lengths); float32 CPU tensors, ready for
        :func:`qkv.viz.translation_attention` (``encoder=``, ``decoder=``, ``cross=``).
        """
        B = self.cross[0].shape[0] if self.cross else self.encoder_self[0].shape[0]
        if isinstance(i, bool) or not isinstance(i, int) or not -B <= i < B:
            raise ValueError(f"i: expected a sentence index in [{-B}, {B}), got {i!r}")
        out: dict[str, list[Tensor]] = {}
        if self.encoder_self is not None:
            out["encoder_self"] = [_crop(w, i, src_len, src_len) for w in self.encoder_self]
        if self.decoder_self is not None:
            out["decoder_self"] = [_crop(w, i, tgt_len, tgt_len) for w in self.decoder_self]
        out["cross"] = [_crop(w, i, tgt_len, src_len) for w in self.cross]
        return out


# ---------------------------------------------------------------------------- the model
class EncoderDecoder(nn.Module):
    """The book's ``EncoderDecoder(encoder, decoder)`` with separate encode and decode.

    Any encoder with ``forward(X, valid_lens, *, need_weights)`` and decoder with
    ``init_state(enc_outputs, enc_valid_lens, *, use_cache)``, ``forward(X, state, *,
    need_weights) -> (logits, state)`` and ``reorder_state(state, index, *, include_encoder)``
    fits: :class:`~qkv.nn.transformer.TransformerEncoder` / ``TransformerDecoder`` and
    :class:`~qkv.nn.rnn.Seq2SeqEncoder` / ``Seq2SeqAttentionDecoder``.

    Shapes: ``enc_X`` ``(B, Ls)`` and ``dec_X`` ``(B, Lt)`` token ids, ``enc_valid_lens``
    ``(B,)``; logits ``(B, Lt, tgt_vocab_size)``.  ``config`` (keyword) is the
    :class:`Seq2SeqConfig` the model was built from, if any.
    """

    def __init__(
        self, encoder: nn.Module, decoder: nn.Module, *, config: Seq2SeqConfig | None = None
    ) -> None:
        super().__init__()
        for name, m, needs in (
            ("encoder", encoder, ("forward",)),
            ("decoder", decoder, ("init_state", "forward", "reorder_state")),
        ):
            if not isinstance(m, nn.Module) or not all(
                callable(getattr(m, a, None)) for a in needs
            ):
                raise TypeError(
                    f"{name}: expected an nn.Module with {', '.join(needs)}, got {type(m).__name__}"
                )
        self.encoder, self.decoder, self.config = encoder, decoder, config

    def encode(
        self,
        enc_X: Tensor,
        enc_valid_lens: Tensor | None = None,
        *,
        need_weights: bool = False,
        skip_padding: bool = False,
    ) -> Any:
        """The encoder's outputs for ``enc_X`` ``(B, Ls)`` (what :meth:`init_state` takes).

        ``skip_padding=True``: the padded positions may be left 0 (faster in inference; what
        decoding asks for, since attention masks them), passed on to an encoder that takes it
        (``skips_padding``, the :class:`~qkv.nn.transformer.TransformerEncoder`)."""
        if skip_padding and getattr(self.encoder, "skips_padding", False):
            return self.encoder(enc_X, enc_valid_lens, need_weights=need_weights, skip_padding=True)
        return self.encoder(enc_X, enc_valid_lens, need_weights=need_weights)

    def init_state(
        self,
        enc_outputs: Any,
        enc_valid_lens: Tensor | None = None,
        *,
        use_cache: bool = False,
        capacity: int | None = None,
    ) -> DecoderState:
        """The decoder's state; ``use_cache=True`` for incremental decoding."""
        return self.decoder.init_state(
            enc_outputs, enc_valid_lens, use_cache=use_cache, capacity=capacity
        )

    def decode(
        self, dec_X: Tensor, state: DecoderState, *, need_weights: bool = False
    ) -> tuple[Tensor, DecoderState]:
        """``(logits (B, Lt, V), state)`` for ``dec_X`` ``(B, Lt)``: the whole prefix without a
        cache, only the new tokens with one."""
        return self.decoder(dec_X, state, need_weights=need_weights)

    def reorder_state(
        self, state: DecoderState, index: Tensor, *, include_encoder: bool = True
    ) -> DecoderState:
        """Keep rows ``index`` of the decoder's state (beam search)."""
        return self.decoder.reorder_state(state, index, include_encoder=include_encoder)

    def expand_beams(self, state: DecoderState, beams: int) -> DecoderState:
        """Every row of the decoder's state repeated ``beams`` times, in order (rows
        ``b * beams + r``: beam search's hypotheses of sentence ``b``).  A decoder with its
        own ``expand_beams`` (the Transformer's: beams that reorder without copying their
        caches) does it; otherwise ``reorder_state`` repeats the rows of ``state.enc_outputs``."""
        expand = getattr(self.decoder, "expand_beams", None)
        if expand is not None:
            return expand(state, beams)
        rows = state.enc_outputs
        index = torch.arange(rows.shape[0], device=rows.device).repeat_interleave(beams)
        return self.decoder.reorder_state(state, index)

    def forward(
        self,
        enc_X: Tensor,
        dec_X: Tensor,
        enc_valid_lens: Tensor | None = None,
        *,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Teacher-forced logits ``(B, Lt, V)``; with ``return_attention=True`` also the
        :class:`AttentionMaps` of this pass (weights are materialised only then)."""
        enc_outputs = self.encode(enc_X, enc_valid_lens, need_weights=return_attention)
        state = self.init_state(enc_outputs, enc_valid_lens)
        logits, _ = self.decode(dec_X, state, need_weights=return_attention)
        if not return_attention:
            return logits
        return logits, self.attention_maps()

    def attention_maps(self) -> AttentionMaps:
        """The weights kept by the last ``need_weights=True`` encode and decode."""
        enc_w = getattr(self.encoder, "attention_weights", None)
        dec_w = getattr(self.decoder, "attention_weights", None)
        if dec_w is None:
            raise RuntimeError(
                "attention_maps: no weights were kept; call forward(..., return_attention=True) "
                "or decode(..., need_weights=True) first"
            )
        if isinstance(dec_w, Tensor):  # Bahdanau: per-step (B, Lt, Ls), one head
            return AttentionMaps(enc_w, None, [dec_w.unsqueeze(1)])
        return AttentionMaps(enc_w, list(dec_w[0]), list(dec_w[1]))


# ---------------------------------------------------------------------------- config
def _check_int(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {value!r}")


@dataclass
class Seq2SeqConfig:
    """Everything needed to rebuild a model; saved as JSON beside its weights.

    Attributes:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        kind: ``"transformer"`` or ``"bahdanau"``.
        num_hiddens: model width (Transformer) or GRU state size (Bahdanau).
        ffn_num_hiddens: feed-forward width (Transformer).
        num_heads: attention heads (Transformer).
        num_enc_layers, num_dec_layers: blocks (Transformer) or GRU layers (Bahdanau: equal).
        embed_size: token embedding size (Bahdanau; the Transformer's is ``num_hiddens``).
        dropout: dropout everywhere.
        use_bias: biases in the attention projections (Transformer; the book has none).
        pos_encoding: ``"sinusoidal"``, ``"learned"``, ``"rotary"`` or ``"none"`` (Transformer).
        norm_first: pre-norm blocks (Transformer).
        activation: ``"relu"``, ``"gelu"`` or ``"swish"`` (Transformer FFN).
        max_len: positional table length (sinusoidal and rotary extend beyond it).
        tie_embeddings: the target embedding is the output projection's weight.
        share_embeddings: the source and target embeddings are one (needs equal vocabularies).
        scale_embedding: token embeddings multiplied by ``sqrt(num_hiddens)`` before the
            positions are added (the book, Marian's OPUS-MT models); False: added as they are
            (Transformer).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    kind: str = "transformer"
    num_hiddens: int = 256
    ffn_num_hiddens: int = 1024
    num_heads: int = 4
    num_enc_layers: int = 3
    num_dec_layers: int = 3
    embed_size: int = 256
    dropout: float = 0.1
    use_bias: bool = False
    pos_encoding: str = "sinusoidal"
    norm_first: bool = False
    activation: str = "relu"
    max_len: int = 1024
    tie_embeddings: bool = False
    share_embeddings: bool = False
    scale_embedding: bool = True

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind: expected one of {MODEL_KINDS}, got {self.kind!r}")
        for name in (
            "src_vocab_size",
            "tgt_vocab_size",
            "num_hiddens",
            "ffn_num_hiddens",
            "num_heads",
            "num_enc_layers",
            "num_dec_layers",
            "embed_size",
            "max_len",
        ):
            _check_int(name, getattr(self, name))
        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {d!r}")
        for name in (
            "use_bias",
            "norm_first",
            "tie_embeddings",
            "share_embeddings",
            "scale_embedding",
        ):
            _check_bool(name, getattr(self, name))
        if self.pos_encoding not in POSITIONAL_ENCODINGS:
            raise ValueError(
                f"pos_encoding: expected one of {POSITIONAL_ENCODINGS}, got {self.pos_encoding!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {self.activation!r}")
        if self.kind == "transformer" and self.num_hiddens % self.num_heads:
            raise ValueError(
                f"num_hiddens: expected a multiple of num_heads={self.num_heads}, "
                f"got {self.num_hiddens}"
            )
        head = self.num_hiddens // self.num_heads
        if self.kind == "transformer" and self.pos_encoding == "rotary" and head % 2:
            raise ValueError(
                f"pos_encoding: 'rotary' needs an even head width, got num_hiddens / "
                f"num_heads = {head}"
            )
        if self.kind == "bahdanau":
            if self.num_enc_layers != self.num_dec_layers:
                raise ValueError(
                    f"num_dec_layers: the Bahdanau decoder starts from the encoder's GRU state, "
                    f"so expected num_enc_layers={self.num_enc_layers}, got {self.num_dec_layers}"
                )
            if self.tie_embeddings and self.embed_size != self.num_hiddens:
                raise ValueError(
                    f"tie_embeddings: expected embed_size == num_hiddens for a Bahdanau model, "
                    f"got embed_size={self.embed_size}, num_hiddens={self.num_hiddens}"
                )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings: expected src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (plain ints, floats, strs, bools)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Seq2SeqConfig:
        """The config saved by :meth:`to_dict`; unknown keys raise ValueError."""
        if not isinstance(data, dict):
            raise TypeError(f"data: expected a dict, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"data: unknown Seq2SeqConfig keys {unknown}; known: {sorted(known)}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in data and f.default is dataclasses.MISSING
        )
        if missing:
            raise ValueError(f"data: missing required Seq2SeqConfig keys {missing}")
        return cls(**data)


def build_model(config: Seq2SeqConfig | dict[str, Any]) -> EncoderDecoder:
    """The :class:`EncoderDecoder` described by ``config`` (a config or its dict)."""
    if isinstance(config, dict):
        config = Seq2SeqConfig.from_dict(config)
    if not isinstance(config, Seq2SeqConfig):
        raise TypeError(f"config: expected a Seq2SeqConfig or a dict, got {type(config).__name__}")
    c = config
    if c.kind == "transformer":
        opts = dict(
            pos_encoding=c.pos_encoding,
            norm_first=c.norm_first,
            max_len=c.max_len,
            activation=c.activation,
            scale_embedding=c.scale_embedding,
        )
        encoder = TransformerEncoder(
            c.src_vocab_size,
            c.num_hiddens,
            c.ffn_num_hiddens,
            c.num_heads,
            c.num_enc_layers,
            c.dropout,
            c.use_bias,
            **opts,
        )
        decoder = TransformerDecoder(
            c.tgt_vocab_size,
            c.num_hiddens,
            c.ffn_num_hiddens,
            c.num_heads,
            c.num_dec_layers,
            c.dropout,
            use_bias=c.use_bias,
            tie_embeddings=c.tie_embeddings,
            **opts,
        )
    else:
        encoder = Seq2SeqEncoder(
            c.src_vocab_size, c.embed_size, c.num_hiddens, c.num_enc_layers, c.dropout
        )
        decoder = Seq2SeqAttentionDecoder(
            c.tgt_vocab_size,
            c.embed_size,
            c.num_hiddens,
            c.num_dec_layers,
            c.dropout,
            tie_embeddings=c.tie_embeddings,
        )
    if c.share_embeddings:
        encoder.embedding.weight = decoder.embedding.weight
    return EncoderDecoder(encoder, decoder, config=dataclasses.replace(c))
