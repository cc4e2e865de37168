"""The Transformer (Vaswani et al. 2017) with the book's (d2l 1.0) modules and signatures.

* :class:`~qkv.nn.sublayers.PositionWiseFFN`, :class:`~qkv.nn.sublayers.AddNorm` (post-norm as
  the paper and the book; pre-norm with ``norm_first=True``), from :mod:`qkv.nn.sublayers`;
* :class:`TransformerEncoderBlock`, :class:`TransformerEncoder`: ``forward(X, valid_lens)``;
* :class:`TransformerDecoderBlock`, :class:`TransformerDecoder`: ``init_state(enc_outputs,
  enc_valid_lens)`` then ``forward(X, state) -> (logits, state)``.

All attention runs through :class:`qkv.nn.MultiHeadAttention`; weights are materialised only when
``need_weights=True`` is passed, otherwise the fused backend runs.

Decoding.  Without a cache (training, or decoding the book's way) the decoder's input ``X`` is the
whole target prefix from position 0 and its self-attention is causal.  With
``init_state(..., use_cache=True)`` each ``forward`` takes only the new tokens: their keys and
values are appended to a per-layer :class:`~qkv.nn.kv_cache.KVCache`, and the encoder's keys and
values are projected once, on the first call.

In inference on the CPU, the encoder's ``forward(..., skip_padding=True)`` and the decoder's
cached step of one new token per row take a fast path with the same results
(:mod:`qkv.nn._fast_decode`); ``why_not_fast_path`` of either says why a call does not.
``TransformerDecoder.fast_decode = False`` turns the decoder's off.

For a graph of one decoding step (``torch.export``, ONNX), :meth:`TransformerDecoder.cross_kv`
projects the encoder's keys and values of every layer once and :meth:`TransformerDecoder.step`
takes the past keys and values as tensors and returns them with the new positions appended
(:class:`~qkv.nn.kv_cache.TensorKVCache`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..functional.decode import PlannedKeys
from . import _fast_decode as fast
from ._checks import boolean, dropout_rate, token_ids, xavier_
from ._checks import positive_int as _positive_int
from .attention import MultiHeadAttention
from .kv_cache import BeamKVCache, BeamRows, KVCache, TensorKVCache
from .position import POSITIONAL_ENCODINGS, RotaryEmbedding, make_positional_encoding
from .sublayers import ACTIVATIONS, AddNorm, PositionWiseFFN

__all__ = [
    "ACTIVATIONS",
    "AddNorm",
    "PositionWiseFFN",
    "TransformerDecoder",
    "TransformerDecoderBlock",
    "TransformerDecoderState",
    "TransformerEncoder",
    "TransformerEncoderBlock",
]


# ---------------------------------------------------------------------------- encoder
class TransformerEncoderBlock(nn.Module):
    """d2l 1.0's ``TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout,
    use_bias=False)``: self-attention and a feed-forward network, each with :class:`AddNorm`.

    ``forward(X (B, L, D), valid_lens=None, *, key_padding_mask=None, need_weights=False)``
    returns ``(B, L, D)``; ``valid_lens`` ``(B,)`` or a ``key_padding_mask`` ``(B, L)`` hide the
    padding.  With ``need_weights=True`` the weights ``(B, H, L, L)`` are in
    ``self.attention.attention_weights``.
    """

    def __init__(
        self,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        dropout: float,
        use_bias: bool = False,
        *,
        norm_first: bool = False,
        rotary: RotaryEmbedding | None = None,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(
            num_hiddens, num_heads, dropout, boolean("use_bias", use_bias), rotary=rotary
        )
        self.addnorm1 = AddNorm(num_hiddens, dropout, norm_first=norm_first)
        self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens, activation=activation)
        self.addnorm2 = AddNorm(num_hiddens, dropout, norm_first=norm_first)

    def forward(
        self,
        X: Tensor,
        valid_lens: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        Q = self.addnorm1.pre(X)
        Y = self.addnorm1(
            X,
            self.attention(
                Q,
                Q,
                Q,
                valid_lens,
                key_padding_mask=key_padding_mask,
                need_weights=need_weights,
            ),
        )
        return self.addnorm2(Y, self.ffn(self.addnorm2.pre(Y)))


class _Stack(nn.Module):
    """What the encoder and the decoder share: validation, embedding, positions, blocks."""

    def _setup(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        pos_encoding: str,
        max_len: int,
        scale_embedding: bool = True,
    ) -> RotaryEmbedding | None:
        _positive_int("vocab_size", vocab_size)
        _positive_int("num_hiddens", num_hiddens)
        _positive_int("ffn_num_hiddens", ffn_num_hiddens)
        _positive_int("num_heads", num_heads)
        _positive_int("num_blks", num_blks)
        dropout_rate(dropout)
        _positive_int("max_len", max_len)
        if num_hiddens % num_heads:
            raise ValueError(
                f"num_hiddens: expected a multiple of num_heads={num_heads}, got {num_hiddens}"
            )
        if pos_encoding not in POSITIONAL_ENCODINGS:
            raise ValueError(
                f"pos_encoding: expected one of {POSITIONAL_ENCODINGS}, got {pos_encoding!r}"
            )
        self.num_hiddens, self.num_blks = num_hiddens, num_blks
        self.scale_embedding = boolean("scale_embedding", scale_embedding)
        self.embed_scale = math.sqrt(num_hiddens) if scale_embedding else 1.0
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        # N(0, 1/D): after the book's sqrt(D) scaling the embeddings have unit variance, like the
        # positional encoding they are added to
        nn.init.normal_(self.embedding.weight, std=num_hiddens**-0.5)
        self.pos_encoding = make_positional_encoding(pos_encoding, num_hiddens, dropout, max_len)
        if pos_encoding != "rotary":
            return None
        return RotaryEmbedding(num_hiddens // num_heads, max_len=max_len)

    def train(self, mode: bool = True) -> _Stack:
        """``nn.Module.train``; on a change of mode the weights the fast inference path kept
        are dropped (an optimizer may change them unseen in training mode:
        :func:`qkv.nn._fast_decode.forget`). ``eval()`` of a model in evaluation mode already
        (an attention map's call, a decoding's guard) keeps them."""
        if mode != self.training:
            fast.forget(self)
        return super().train(mode)

    def _embed(self, X: Tensor, offset: int = 0) -> Tensor:
        # the book: embeddings are scaled by sqrt(num_hiddens) (embed_scale; 1 with
        # scale_embedding=False), then the positions are added
        return self.pos_encoding(self.embedding(X) * self.embed_scale, offset)


class TransformerEncoder(_Stack):
    """d2l 1.0's ``TransformerEncoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads,
    num_blks, dropout, use_bias=False)``.

    ``forward(X (B, L) token ids, valid_lens (B,) or None, *, need_weights=False)`` returns
    ``(B, L, num_hiddens)``.  With ``need_weights=True``, ``self.attention_weights`` is the list
    of per-layer weights ``(B, H, L, L)`` (None otherwise).

    Keyword-only options: ``pos_encoding`` (``"sinusoidal"`` (the book), ``"learned"``,
    ``"rotary"``, ``"none"``), ``norm_first`` (pre-norm, with a final LayerNorm), ``max_len`` (the
    positional table), ``activation`` (``"relu"``, ``"gelu"``, ``"swish"``),
    ``scale_embedding`` (the embeddings multiplied by ``sqrt(num_hiddens)`` before the
    positions are added, as the book; False: as they are).

    ``forward(..., skip_padding=True)`` in inference (no grad, eval mode, the CPU, no weights
    asked for) skips the padding: the valid positions get the same outputs and the padded ones
    0 (:meth:`_forward_packed`; what decoding asks for, its attention masks the padding);
    anything else computes every position (:meth:`why_not_fast_path` says why).
    """

    #: forward takes ``skip_padding`` (:meth:`EncoderDecoder.encode` passes it on)
    skips_padding: bool = True

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        use_bias: bool = False,
        *,
        pos_encoding: str = "sinusoidal",
        norm_first: bool = False,
        max_len: int = 1000,
        activation: str = "relu",
        scale_embedding: bool = True,
    ) -> None:
        super().__init__()
        rotary = self._setup(
            vocab_size,
            num_hiddens,
            ffn_num_hiddens,
            num_heads,
            num_blks,
            dropout,
            pos_encoding,
            max_len,
            scale_embedding,
        )
        self.blks = nn.Sequential()
        for i in range(num_blks):
            self.blks.add_module(
                f"block{i}",
                TransformerEncoderBlock(
                    num_hiddens,
                    ffn_num_hiddens,
                    num_heads,
                    dropout,
                    use_bias,
                    norm_first=norm_first,
                    rotary=rotary,
                    activation=activation,
                ),
            )
        self.norm = nn.LayerNorm(num_hiddens) if boolean("norm_first", norm_first) else None
        xavier_(self.blks)
        self.attention_weights: list[Tensor] | None = None

    def forward(
        self,
        X: Tensor,
        valid_lens: Tensor | None = None,
        *,
        need_weights: bool = False,
        skip_padding: bool = False,
    ) -> Tensor:
        X = token_ids("X", X)
        if (
            skip_padding
            and fast.why_not_fast_path(self, X, valid_lens=valid_lens, need_weights=need_weights)
            is None
        ):
            return self._forward_packed(X, valid_lens)
        X = self._embed(X)
        weights = [] if need_weights else None
        for blk in self.blks:
            X = blk(X, valid_lens, need_weights=need_weights)
            if weights is not None:
                weights.append(blk.attention.attention_weights)
        self.attention_weights = weights
        return X if self.norm is None else self.norm(X)

    def why_not_fast_path(
        self, X: Tensor, valid_lens: Tensor | None = None, *, need_weights: bool = False
    ) -> str | None:
        """Why ``forward(X, valid_lens, need_weights=..., skip_padding=True)`` would compute
        every position rather than skip the padding, in a few words; None when it skips it
        (:func:`qkv.nn._fast_decode.why_not_fast_path`)."""
        return fast.why_not_fast_path(self, X, valid_lens=valid_lens, need_weights=need_weights)

    def _forward_packed(self, X: Tensor, valid_lens: Tensor | None) -> Tensor:
        """:meth:`forward` of ``X`` ``(B, L)`` in inference, the padding skipped
        (:func:`qkv.nn._fast_decode.encode_packed`): ``(B, L, D)``, the padded positions 0."""
        return fast.encode_packed(self, X, valid_lens)


# ---------------------------------------------------------------------------- decoder
@dataclass
class TransformerDecoderState:
    """What the decoder carries between calls.

    Attributes:
        enc_outputs: ``(B, Ls, D)`` the encoder's outputs.
        enc_valid_lens: ``(B,)`` source lengths, or None (no padding).
        self_caches: per layer, the growing self-attention :class:`KVCache`; None when decoding
            without a cache (then ``X`` is always the whole prefix).
        cross_caches: per layer, the static cross-attention :class:`KVCache` (None likewise).
        cross_plans: per layer, the cross-attention planned once for the fast decoding step
            (:func:`qkv.functional.decode.plan_keys`), or None; dropped whenever the rows of the
            encoder's part change (:meth:`TransformerDecoder.reorder_state`).
        step_plan: the decoder's weights as the fast decoding step reads them, taken at its
            first step (remade when a weight changes in place).
        beams: with :meth:`TransformerDecoder.expand_beams`, the beams' histories that
            ``self_caches`` (then :class:`~qkv.nn.kv_cache.BeamKVCache`) are read through;
            None otherwise.  With beams, the encoder's part (``enc_outputs``,
            ``enc_valid_lens``, ``cross_caches``) keeps one row per sentence, ``(G, ...)``,
            for its ``G * K`` rows of beams.
    """

    enc_outputs: Tensor
    enc_valid_lens: Tensor | None = None
    self_caches: list[KVCache] | list[BeamKVCache] | None = None
    cross_caches: list[KVCache] | None = None
    cross_plans: list[PlannedKeys | None] | None = field(default=None, repr=False)
    beams: BeamRows | None = field(default=None, repr=False)
    step_plan: fast.StepPlan | None = field(default=None, repr=False)

    @property
    def use_cache(self) -> bool:
        return self.self_caches is not None

    @property
    def offset(self) -> int:
        """Target positions already decoded (0 without a cache)."""
        return self.self_caches[0].length if self.self_caches else 0

    def _reorder_encoder(self, index: Tensor) -> None:
        """Keep rows ``index`` of the encoder's part; its cross-attention plans were made for
        the old rows and are dropped."""
        self.cross_plans = None
        self.enc_outputs = self.enc_outputs.index_select(0, index)
        if self.enc_valid_lens is not None:
            self.enc_valid_lens = self.enc_valid_lens.index_select(0, index)
        if self.cross_caches is not None:
            for c in self.cross_caches:
                c.reorder(index)


class TransformerDecoderBlock(nn.Module):
    """d2l 1.0's ``TransformerDecoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, i)``:
    causal self-attention, cross-attention over the encoder, a feed-forward network.

    ``forward(X (B, Lt, D), state, *, need_weights=False)`` returns ``(Y (B, Lt, D), state)``,
    with ``state`` a :class:`TransformerDecoderState`.  Without a cache the self-attention is causal
    over ``X``; with one, ``X`` holds the new positions, appended to the block's cache ``i``.
    The cross-attention hides the encoder's padding with ``state.enc_valid_lens``.
    """

    def __init__(
        self,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        dropout: float,
        i: int,
        *,
        use_bias: bool = False,
        norm_first: bool = False,
        rotary: RotaryEmbedding | None = None,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"i: expected the block's index, a non-negative int, got {i!r}")
        self.i = i
        use_bias = boolean("use_bias", use_bias)
        self.attention1 = MultiHeadAttention(
            num_hiddens, num_heads, dropout, use_bias, rotary=rotary
        )
        self.addnorm1 = AddNorm(num_hiddens, dropout, norm_first=norm_first)
        self.attention2 = MultiHeadAttention(num_hiddens, num_heads, dropout, use_bias)
        self.addnorm2 = AddNorm(num_hiddens, dropout, norm_first=norm_first)
        self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens, activation=activation)
        self.addnorm3 = AddNorm(num_hiddens, dropout, norm_first=norm_first)

    def forward(
        self, X: Tensor, state: TransformerDecoderState, *, need_weights: bool = False
    ) -> tuple[Tensor, TransformerDecoderState]:
        if not isinstance(state, TransformerDecoderState):
            raise TypeError(
                f"state: expected a TransformerDecoderState (from TransformerDecoder.init_state), "
                f"got {type(state).__name__}"
            )
        B, L, _ = X.shape
        self_cache = cross_cache = None
        dec_valid_lens, causal = None, True
        if state.use_cache:
            self_cache, cross_cache = state.self_caches[self.i], state.cross_caches[self.i]
            causal = False
            if L > 1:  # new query j sees the cached keys and new keys up to itself (d2l's lens)
                past = self_cache.length
                dec_valid_lens = torch.arange(past + 1, past + L + 1, device=X.device).expand(B, L)
        Q = self.addnorm1.pre(X)
        Y = self.addnorm1(
            X,
            self.attention1(
                Q,
                Q,
                Q,
                dec_valid_lens,
                is_causal=causal,
                need_weights=need_weights,
                cache=self_cache,
            ),
        )
        enc = state.enc_outputs
        Z = self.addnorm2(
            Y,
            self.attention2(
                self.addnorm2.pre(Y),
                enc,
                enc,
                state.enc_valid_lens,
                need_weights=need_weights,
                cache=cross_cache,
            ),
        )
        return self.addnorm3(Z, self.ffn(self.addnorm3.pre(Z))), state


class TransformerDecoder(_Stack):
    """d2l 1.0's ``TransformerDecoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads,
    num_blks, dropout)``.

    ``init_state(enc_outputs (B, Ls, D), enc_valid_lens (B,) or None, *, use_cache=False)``
    returns a :class:`TransformerDecoderState`; ``forward(X (B, Lt) token ids, state, *,
    need_weights=False)`` returns ``(logits (B, Lt, vocab_size), state)``.  With
    ``need_weights=True``, ``self.attention_weights`` is ``[self_attention, cross_attention]``,
    each a list of per-layer weights ``(B, H, Lt, Lk)`` (the book's layout; ``Lk`` is the
    decoded prefix for the self-attention, ``Ls`` for the cross-attention).

    Keyword-only options: those of :class:`TransformerEncoder`, plus ``use_bias`` and
    ``tie_embeddings`` (the output projection shares the embedding's weight).

    A decoding step with a cache in inference takes a fast path with the same results
    (:mod:`qkv.nn._fast_decode`; :meth:`why_not_fast_path` says why a call does not); set
    ``fast_decode = False`` (on the class or an instance) to turn it off, ``scripted_decode =
    False`` to run it in Python rather than as one TorchScript function.
    """

    #: take the fast path for a decoding step in inference (same results; False: never)
    fast_decode: bool = True
    #: run the fast step as one TorchScript function where it can (the same numbers, bit for
    #: bit; False: in Python)
    scripted_decode: bool = True

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        *,
        use_bias: bool = False,
        pos_encoding: str = "sinusoidal",
        norm_first: bool = False,
        max_len: int = 1000,
        activation: str = "relu",
        tie_embeddings: bool = False,
        scale_embedding: bool = True,
    ) -> None:
        super().__init__()
        rotary = self._setup(
            vocab_size,
            num_hiddens,
            ffn_num_hiddens,
            num_heads,
            num_blks,
            dropout,
            pos_encoding,
            max_len,
            scale_embedding,
        )
        self.blks = nn.Sequential()
        for i in range(num_blks):
            self.blks.add_module(
                f"block{i}",
                TransformerDecoderBlock(
                    num_hiddens,
                    ffn_num_hiddens,
                    num_heads,
                    dropout,
                    i,
                    use_bias=use_bias,
                    norm_first=norm_first,
                    rotary=rotary,
                    activation=activation,
                ),
            )
        self.norm = nn.LayerNorm(num_hiddens) if boolean("norm_first", norm_first) else None
        self.dense = nn.Linear(num_hiddens, vocab_size)
        xavier_(self.blks)
        if boolean("tie_embeddings", tie_embeddings):
            self.dense.weight = self.embedding.weight
        self.tie_embeddings = tie_embeddings
        self.attention_weights: list[list[Tensor]] | None = None

    def init_state(
        self,
        enc_outputs: Tensor,
        enc_valid_lens: Tensor | None = None,
        *,
        use_cache: bool = False,
        capacity: int | None = None,
    ) -> TransformerDecoderState:
        """The state for decoding against ``enc_outputs`` ``(B, Ls, D)``.

        Args:
            enc_valid_lens: ``(B,)`` source lengths, or None.
            use_cache: decode incrementally (each ``forward`` takes only the new tokens).
            capacity: target positions to preallocate in each cache (it grows anyway).
        """
        if (
            not isinstance(enc_outputs, Tensor)
            or enc_outputs.dim() != 3
            or enc_outputs.shape[-1] != self.num_hiddens
        ):
            got = (
                f"shape {tuple(enc_outputs.shape)}"
                if isinstance(enc_outputs, Tensor)
                else type(enc_outputs).__name__
            )
            raise ValueError(
                f"enc_outputs: expected the encoder's output (B, Ls, {self.num_hiddens}), got {got}"
            )
        if enc_valid_lens is not None and not isinstance(enc_valid_lens, Tensor):
            enc_valid_lens = torch.as_tensor(enc_valid_lens, device=enc_outputs.device)
        state = TransformerDecoderState(enc_outputs, enc_valid_lens)
        if boolean("use_cache", use_cache):
            state.self_caches = [KVCache(capacity=capacity) for _ in range(self.num_blks)]
            state.cross_caches = [KVCache(static=True) for _ in range(self.num_blks)]
        return state

    def forward(
        self, X: Tensor, state: TransformerDecoderState, *, need_weights: bool = False
    ) -> tuple[Tensor, TransformerDecoderState]:
        if not isinstance(state, TransformerDecoderState):
            raise TypeError(
                f"state: expected a TransformerDecoderState (from init_state), got "
                f"{type(state).__name__}"
            )
        X = token_ids("X", X)
        if fast.why_not_fast_path(self, X, state=state, need_weights=need_weights) is None:
            self.attention_weights = None
            return fast.decoder_step(self, X, state), state
        fast.end_beams(state)  # the general path reads every row's own cache
        X = self._embed(X, state.offset)
        weights = [[], []] if need_weights else None
        for blk in self.blks:
            X, state = blk(X, state, need_weights=need_weights)
            if weights is not None:
                weights[0].append(blk.attention1.attention_weights)
                weights[1].append(blk.attention2.attention_weights)
        self.attention_weights = weights
        if self.norm is not None:
            X = self.norm(X)
        return self.dense(X), state

    def why_not_fast_path(
        self,
        X: Tensor | None,
        state: TransformerDecoderState,
        *,
        need_weights: bool = False,
    ) -> str | None:
        """Why ``forward(X, state, need_weights=...)`` would not take the fast decoding step,
        in a few words; None when it takes it.  ``X`` None: why the steps to come would not
        (what :meth:`expand_beams` asks).  See :func:`qkv.nn._fast_decode.why_not_fast_path`."""
        return fast.why_not_fast_path(self, X, state=state, need_weights=need_weights)

    def cross_kv(self, enc_outputs: Tensor) -> tuple[Tensor, Tensor]:
        """Every layer's cross-attention keys and values of ``enc_outputs`` ``(B, Ls, D)``:
        ``(keys, values)``, each ``(num_blks, B, H, Ls, d)`` (what :meth:`step` takes)."""
        keys, values = [], []
        for blk in self.blks:
            a = blk.attention2
            H, d = a.num_heads, a.head_dim
            keys.append(a.W_k(enc_outputs).unflatten(-1, (H, d)).transpose(1, 2))
            values.append(a.W_v(enc_outputs).unflatten(-1, (H, d)).transpose(1, 2))
        return torch.stack(keys), torch.stack(values)

    def step(
        self,
        X: Tensor,
        enc_valid_lens: Tensor | None,
        past_keys: Tensor,
        past_values: Tensor,
        cross_keys: Tensor,
        cross_values: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Decode the new tokens ``X`` ``(B, n)`` after ``T`` decoded positions, all in tensors.

        The tensor form of ``forward(X, state)`` with a cache, for a step graph: the past
        self-attention keys and values come in (``T`` may be 0) and go out with the ``n`` new
        positions appended; the decoder's position is ``T``.

        Shapes: enc_valid_lens ``(B,)`` or None; past_keys/past_values ``(num_blks, B, H, T, d)``;
        cross_keys/cross_values ``(num_blks, B, H, Ls, d)`` (:meth:`cross_kv`).  Returns
        ``(logits (B, n, vocab_size), keys, values)``, keys/values ``(num_blks, B, H, T+n, d)``.
        """
        B = X.shape[0]
        selfs = [TensorKVCache(past_keys[i], past_values[i]) for i in range(self.num_blks)]
        cross = [
            TensorKVCache(cross_keys[i], cross_values[i], static=True) for i in range(self.num_blks)
        ]
        # the encoder's outputs are not read: every cross-attention cache is filled
        placeholder = cross_keys.new_zeros(B, 0, self.num_hiddens)
        state = TransformerDecoderState(placeholder, enc_valid_lens, selfs, cross)  # type: ignore[arg-type]
        logits, _ = self.forward(X, state)
        return (
            logits,
            torch.stack([c.keys for c in selfs]),
            torch.stack([c.values for c in selfs]),
        )

    def expand_beams(self, state: TransformerDecoderState, beams: int) -> TransformerDecoderState:
        """Every row of the state repeated ``beams`` times (rows ``b * beams + r``: beam
        search's hypotheses of sentence ``b``), as ``reorder_state(state,
        arange(B).repeat_interleave(beams))``.

        Where the fast decoding step will run (:meth:`why_not_fast_path` with ``X`` None), the
        self-attention caches become :class:`~qkv.nn.kv_cache.BeamKVCache`: reordering the
        beams within their sentences (``reorder_state(..., include_encoder=False)``) then moves
        no keys or values (:func:`qkv.nn._fast_decode.expand_beams`); anything else reads every
        row's own cache.
        """
        if isinstance(beams, bool) or not isinstance(beams, int) or beams < 1:
            raise ValueError(f"beams: expected a positive int, got {beams!r}")
        return fast.expand_beams(self, state, beams)

    def reorder_state(
        self, state: TransformerDecoderState, index: Tensor, *, include_encoder: bool = True
    ) -> TransformerDecoderState:
        """Keep rows ``index`` ``(B',)`` of the state, in that order (beam search).

        With ``include_encoder=False`` only the self-attention caches are reordered: valid when
        every row keeps the same source sentence (reordering beams within a sentence).
        """
        if fast.reorder_beams(state, index, include_encoder):
            return state
        if state.self_caches is not None:
            for c in state.self_caches:
                c.reorder(index)
        if include_encoder:
            state._reorder_encoder(index)
        return state
