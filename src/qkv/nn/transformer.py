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

A decoding step in inference (``torch.no_grad``/``inference_mode``, eval mode, one new token
per row, on the CPU, no weights asked for) takes a fast path with the same results: the
self-attention's three projections are one product, the linear layers read transposed copies of
their weights (:mod:`qkv.nn._inference`), and attention runs through
:func:`qkv.functional.decode.cached_attention` and, over the encoder,
:func:`qkv.functional.decode.planned_attention` with the plan made once per batch
(``TransformerDecoderState.cross_plans``).  ``TransformerDecoder.fast_decode = False`` turns it off.
Without beams, once the first step has planned the cross-attention, the whole step (every block
and the output layer) runs as one TorchScript function (:mod:`qkv.nn._scripted`): the same
operators in the same order, called without Python in between; a step it cannot run (a cache
to grow, a projection that is not finite, a layer of another kind) runs in Python.
Beam search's beams (:meth:`TransformerDecoder.expand_beams`) then keep their self-attention keys
where they were written (:class:`~qkv.nn.kv_cache.BeamKVCache`): reordering beams moves no keys,
and a sentence's beams attend over the encoder as several queries of one row.

For a graph of one decoding step (``torch.export``, ONNX), :meth:`TransformerDecoder.cross_kv`
projects the encoder's keys and values of every layer once and :meth:`TransformerDecoder.step`
takes the past keys and values as tensors and returns them with the new positions appended
(:class:`~qkv.nn.kv_cache.TensorKVCache`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.decode import (
    _SCALED_DOT,
    PlannedKeys,
    cached_attention,
    grouped_attention,
    plan_keys,
    planned_attention,
)
from ._checks import boolean, dropout_rate, token_ids, xavier_
from ._checks import positive_int as _positive_int
from ._inference import (
    Linear,
    fused_product,
    fused_projection,
    linear,
    packed_of,
    product,
    versions,
    weights_of,
)
from ._scripted import scripted_step
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

    def _packed(
        self, x: Tensor, keep: Tensor | None, B: int, L: int, lens: Tensor | None
    ) -> Tensor:
        """:meth:`forward` in inference on the valid positions only: ``x`` ``(N, D)`` holds rows
        ``keep`` ``(N,)`` of the flattened ``(B * L, D)`` batch (None: every row); the linear
        layers and norms read those rows, attention the ``(B, H, L, d)`` batch with the padded
        positions zero (masked by ``lens``, as in :meth:`forward`)."""
        a = self.attention
        H, d = a.num_heads, a.head_dim
        D = H * d
        Q = self.addnorm1.pre(x)
        qkv = fused_projection(a, (a.W_q, a.W_k, a.W_v), Q)  # (N, 3D)
        if qkv is None:  # a weight without a version (an inference tensor): one by one
            qkv = torch.cat([linear(a.W_q, Q), linear(a.W_k, Q), linear(a.W_v, Q)], dim=1)
        if keep is not None:
            qkv = qkv.new_zeros(B * L, 3 * D).index_copy_(0, keep, qkv)
        q, k, v = qkv.view(B, L, 3, H, d).permute(2, 0, 3, 1, 4)  # each (B, H, L, d)
        if a.rotary is not None:
            q, k = a.rotary(q, 0), a.rotary(k, 0)
        out, a.attention_weights = a._attend(q, k, v, 0.0, valid_lens=lens)
        out = out.transpose(1, 2).reshape(B * L, D)  # (B, H, L, d) -> (B * L, D)
        if keep is not None:
            out = out.index_select(0, keep)
        Y = self.addnorm1(x, linear(a.W_o, out))
        ffn = self.ffn
        hidden = ffn.activation(linear(ffn.dense1, self.addnorm2.pre(Y)))
        return self.addnorm2(Y, linear(ffn.dense2, hidden))


def _plain_block(blk: TransformerEncoderBlock) -> bool:
    """Whether an encoder block's layers are plain ``nn.Linear`` in a :class:`PositionWiseFFN`:
    a dynamically quantized layer scales its input by the range of all its rows, padding
    included, so it runs on the padded batch as it always did."""
    a, ffn = blk.attention, blk.ffn
    linears = (
        a.W_q,
        a.W_k,
        a.W_v,
        a.W_o,
        getattr(ffn, "dense1", None),
        getattr(ffn, "dense2", None),
    )
    return type(ffn) is PositionWiseFFN and all(type(m) is nn.Linear for m in linears)


def _inference_ok(module: nn.Module, device: torch.device) -> bool:
    """Inference (no grad, eval mode) on the CPU, outside ``torch.compile``/``torch.export``
    and TorchScript: where a fast path of the Transformer's runs."""
    return (
        not module.training
        and not torch.is_grad_enabled()
        and device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
    )


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
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        # N(0, 1/D): after the book's sqrt(D) scaling the embeddings have unit variance, like the
        # positional encoding they are added to
        nn.init.normal_(self.embedding.weight, std=num_hiddens**-0.5)
        self.pos_encoding = make_positional_encoding(pos_encoding, num_hiddens, dropout, max_len)
        if pos_encoding != "rotary":
            return None
        return RotaryEmbedding(num_hiddens // num_heads, max_len=max_len)

    def _embed(self, X: Tensor, offset: int = 0) -> Tensor:
        # the book: embeddings are scaled by sqrt(num_hiddens), then the positions are added
        return self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens), offset)


class TransformerEncoder(_Stack):
    """d2l 1.0's ``TransformerEncoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads,
    num_blks, dropout, use_bias=False)``.

    ``forward(X (B, L) token ids, valid_lens (B,) or None, *, need_weights=False)`` returns
    ``(B, L, num_hiddens)``.  With ``need_weights=True``, ``self.attention_weights`` is the list
    of per-layer weights ``(B, H, L, L)`` (None otherwise).

    Keyword-only options: ``pos_encoding`` (``"sinusoidal"`` (the book), ``"learned"``,
    ``"rotary"``, ``"none"``), ``norm_first`` (pre-norm, with a final LayerNorm), ``max_len`` (the
    positional table), ``activation`` (``"relu"``, ``"gelu"``).

    ``forward(..., skip_padding=True)`` in inference (no grad, eval mode, the CPU, no weights
    asked for) skips the padding: the valid positions get the same outputs and the padded ones
    0 (:meth:`_forward_packed`; what decoding asks for, its attention masks the padding);
    anything else computes every position.
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
        if skip_padding and self._fast_ok(X, valid_lens, need_weights):
            return self._forward_packed(X, valid_lens)
        X = self._embed(X)
        weights = [] if need_weights else None
        for blk in self.blks:
            X = blk(X, valid_lens, need_weights=need_weights)
            if weights is not None:
                weights.append(blk.attention.attention_weights)
        self.attention_weights = weights
        return X if self.norm is None else self.norm(X)

    def _fast_ok(self, X: Tensor, valid_lens: object, need_weights: bool) -> bool:
        """Whether this call takes the packed path: inference (no grad, eval mode) on the CPU,
        no weights asked for, ``valid_lens`` None or ``(B,)`` on ``X``'s device, blocks of
        :class:`PositionWiseFFN`."""
        return (
            not need_weights
            and _inference_ok(self, X.device)
            and (
                valid_lens is None
                or (
                    isinstance(valid_lens, Tensor)
                    and valid_lens.shape == (X.shape[0],)
                    and not valid_lens.is_floating_point()
                    and valid_lens.device == X.device
                )
            )
            and all(_plain_block(blk) for blk in self.blks)
        )

    def _forward_packed(self, X: Tensor, valid_lens: Tensor | None) -> Tensor:
        """:meth:`forward` of ``X`` ``(B, L)`` in inference, the padding skipped: the linear
        layers, the feed-forward networks and the norms run on the valid positions only (each
        product through :func:`qkv.nn._inference.linear`), attention on the whole batch with
        the padded positions zero and masked.  The valid positions get what :meth:`forward`
        gives (to float rounding); the padded ones are 0.  Returns ``(B, L, D)``."""
        B, L = X.shape
        D = self.num_hiddens
        flat = self._embed(X).reshape(B * L, D)
        keep = None
        if valid_lens is not None:
            seen = torch.arange(L, device=X.device) < valid_lens.unsqueeze(1)  # (B, L)
            keep = seen.view(-1).nonzero().squeeze(1)  # (N,) the valid rows of (B * L)
            flat = flat.index_select(0, keep)
        for blk in self.blks:
            flat = blk._packed(flat, keep, B, L, valid_lens)
        if self.norm is not None:
            flat = self.norm(flat)
        self.attention_weights = None
        if keep is None:
            return flat.view(B, L, D)
        return flat.new_zeros(B * L, D).index_copy_(0, keep, flat).view(B, L, D)


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
    step_plan: _StepPlan | None = field(default=None, repr=False)

    @property
    def use_cache(self) -> bool:
        return self.self_caches is not None

    @property
    def offset(self) -> int:
        """Target positions already decoded (0 without a cache)."""
        return self.self_caches[0].length if self.self_caches else 0


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

    def _fast_ok(self) -> bool:
        """Whether :meth:`_step_fast` computes what :meth:`forward` does for this block."""
        a1, a2 = self.attention1, self.attention2
        return (
            a1.rotary is None
            and a1.score == a2.score == "scaled_dot"
            and a1.scale is None
            and a2.scale is None
            and type(self.ffn) is PositionWiseFFN
        )

    def _cross_kv(self, enc: Tensor) -> tuple[Tensor, Tensor]:
        """The cross-attention's keys and values of ``enc`` ``(B, Ls, D)``, ``(B, H, Ls, d)``
        each, in one product (:func:`qkv.nn._inference.fused_projection`) where it can."""
        a2 = self.attention2
        B, Ls, _ = enc.shape
        H, d = a2.num_heads, a2.head_dim
        kv = fused_projection(a2, (a2.W_k, a2.W_v), enc.reshape(B * Ls, -1))  # (B*Ls, 2D)
        if kv is None:  # e.g. quantized layers: one by one
            return (
                a2.W_k(enc).unflatten(-1, (H, d)).transpose(1, 2),
                a2.W_v(enc).unflatten(-1, (H, d)).transpose(1, 2),
            )
        k, v = kv.view(B, Ls, 2, H, d).permute(2, 0, 3, 1, 4)  # (B, H, Ls, d) each
        return k, v

    def _plan(self, x: Tensor) -> tuple:
        """What :meth:`_step_fast` reads of this block, for inputs like ``x`` ``(B, D)``: the
        products of its linear layers (the self-attention's three fused where it can) and its
        norms as ``(normalized_shape, weight, bias, eps)``."""
        a1, a2, ffn = self.attention1, self.attention2, self.ffn
        qkv = fused_product(a1, (a1.W_q, a1.W_k, a1.W_v), x)
        own = (qkv, *(product(m, x) for m in (a1.W_q, a1.W_k, a1.W_v, a1.W_o)))
        cross = (product(a2.W_q, x), product(a2.W_o, x))
        norms = tuple(
            (n.ln.normalized_shape, n.ln.weight, n.ln.bias, n.ln.eps)
            for n in (self.addnorm1, self.addnorm2, self.addnorm3)
        )
        ff = (product(ffn.dense1, x), ffn.activation, product(ffn.dense2, x))
        return (*own, *cross, *ff, *norms, self.addnorm1.norm_first)

    def _linears(self) -> tuple[nn.Module, ...]:
        a1, a2, ffn = self.attention1, self.attention2, self.ffn
        return (a1.W_q, a1.W_k, a1.W_v, a1.W_o, a2.W_q, a2.W_o, ffn.dense1, ffn.dense2)

    def _step_fast(self, X: Tensor, state: TransformerDecoderState) -> Tensor:
        """:meth:`forward` of one new position per row, with a cache, in inference: ``X``
        ``(B, D)`` -> ``(B, D)`` (see :class:`TransformerDecoder`'s fast path), reading the
        block's products and norms from the state's plan (:meth:`_plan`, made once per state)."""
        B, D = X.shape
        i = self.i
        qkv, W_q, W_k, W_v, W_o, W_q2, W_o2, f1, act, f2, n1, n2, n3, pre = state.step_plan[i]
        H = self.attention1.num_heads
        d = D // H
        # self-attention: the three projections in one product, the new key and value appended
        Q = F.layer_norm(X, *n1) if pre else X
        if qkv is None:  # e.g. quantized layers: one by one
            q, k, v = W_q(Q), W_k(Q), W_v(Q)
        else:
            q, k, v = qkv(Q).split(D, dim=1)
        # (B, D) -> (B, H, 1, d)
        q, k, v = q.view(B, H, 1, d), k.view(B, H, 1, d), v.view(B, H, 1, d)
        cache, beams = state.self_caches[i], state.beams
        keys, values = cache.append(k, v)
        out = None
        if beams is not None:  # a sentence's K beams over all its slots, each its own history
            G, K = beams.groups, beams.beams
            grouped = q.view(G, K, H, d).transpose(1, 2)  # (G, H, K, d)
            out = grouped_attention(grouped, keys, values, beams.bias, known_finite=cache.finite)
            if out is None:  # not known finite: every beam's own keys, by the general rule
                keys, values = cache.rows(beams)
        if out is None:
            out = cached_attention(q, keys, values)  # (B, H, 1, d)
        # (B, H, 1, d) or (G, H, K, d) -> (B, D)
        Y = _add_norm(X, W_o(out.transpose(1, 2).reshape(B, D)), n1, pre)
        # cross-attention over the encoder, planned once per batch
        plan = state.cross_plans[i]
        if plan is None:
            cache = state.cross_caches[i]
            if cache.empty:  # the first step: the encoder's keys and values, projected once
                cache.set(*self._cross_kv(state.enc_outputs))
            plan = plan_keys(cache.keys, cache.values, valid_lens=state.enc_valid_lens, heads=H)
            state.cross_plans[i] = plan
        q = W_q2(F.layer_norm(Y, *n2) if pre else Y)
        if beams is None:
            q = q.view(B, H, 1, d)
        else:  # the encoder's part is one row per sentence: its K beams are K queries of it
            q = q.view(beams.groups, beams.beams, H, d).transpose(1, 2)  # (G, H, K, d)
        out = planned_attention(q, plan)  # (B, H, 1, d) or (G, H, K, d)
        Z = _add_norm(Y, W_o2(out.transpose(1, 2).reshape(B, D)), n2, pre)
        hidden = act(f1(F.layer_norm(Z, *n3) if pre else Z))
        return _add_norm(Z, f2(hidden), n3, pre)


def _add_norm(X: Tensor, Y: Tensor, norm: tuple, pre: bool) -> Tensor:
    """:meth:`AddNorm.forward` in evaluation, its norm given as ``(normalized_shape, weight,
    bias, eps)``."""
    return X + Y if pre else F.layer_norm(Y + X, *norm)


def _act_code(act: nn.Module) -> int | None:
    """The feed-forward activation's code in the scripted step (``qkv.nn._scripted.ACTIVATIONS``:
    ReLU, GELU, GELU's tanh approximation), or None for any other module."""
    if type(act) is nn.ReLU:
        return 0
    if type(act) is nn.GELU:
        return {"none": 1, "tanh": 2}.get(act.approximate)
    return None


class _StepPlan:
    """What the fast decoding step reads, taken once per decoder state: every block's
    :meth:`TransformerDecoderBlock._plan` and the output layer's product; remade when a weight
    changes in place (its version counter; a weight replaced by a new tensor is seen by the
    next state).  Indexed by block.

    :meth:`scripted` runs a step as one TorchScript function (:mod:`qkv.nn._scripted`) where
    it can: the products and norms laid out for it once (:meth:`_script_args`), the
    cross-attention's plans per batch."""

    def __init__(self, decoder: TransformerDecoder, x: Tensor) -> None:
        linears = [m for blk in decoder.blks for m in blk._linears()] + [decoder.dense]
        self.tensors = weights_of(tuple(linears))
        self.versions = versions(self.tensors)
        # quantized layers' packed weights (replaced, never changed in place, when weights are:
        # set_weight_bias, load_state_dict), with what holds them
        self.packed = [
            (m._packed_params, packed_of(m)) for m in linears if packed_of(m) is not None
        ]
        self.blocks = [blk._plan(x) for blk in decoder.blks]
        self.dense = product(decoder.dense, x)
        self.heads = decoder.blks[0].attention1.num_heads if len(decoder.blks) else 1
        self.self_mult = float(_SCALED_DOT.multiplier(None, decoder.num_hiddens // self.heads, 1))
        self.script = scripted_step() if len(decoder.blks) else None
        self.args = self._script_args(decoder) if self.script is not None else None
        self._cross: tuple[list, tuple] | None = None  # the plans and their lists

    def current(self) -> bool:
        """Whether no weight changed since the plan was made."""
        return (
            self.versions is not None
            and versions(self.tensors) == self.versions
            and all(held._packed_params is p for held, p in self.packed)
        )

    def __getitem__(self, i: int) -> tuple:
        return self.blocks[i]

    def _script_args(self, decoder: TransformerDecoder) -> tuple | None:
        """The products and norms as :func:`qkv.nn._scripted.decode_step` takes them, or None
        when a layer is of a kind it does not run."""
        products, norms, pre, acts = [], [], set(), set()
        for plan in self.blocks:
            qkv, _, _, _, W_o, W_q2, W_o2, f1, act, f2, n1, n2, n3, norm_first = plan
            products += [qkv, W_o, W_q2, W_o2, f1, f2]
            norms += [n1, n2, n3]
            pre.add(norm_first)
            acts.add(_act_code(act))
        products.append(self.dense)
        final = decoder.norm
        if final is not None:
            if type(final) is not nn.LayerNorm:
                return None
            norms.append((final.normalized_shape, final.weight, final.bias, final.eps))
        heads = {b.attention1.num_heads for b in decoder.blks}
        heads |= {b.attention2.num_heads for b in decoder.blks}
        if (
            heads != {self.heads}
            or len(pre) != 1
            or len(acts) != 1
            or None in acts
            or any(type(p) is not Linear for p in products)
            or any(tuple(n[0]) != (decoder.num_hiddens,) for n in norms)
        ):
            return None
        packs = [p.packed for p in products if p.kind == Linear.INT8]
        where, k = [], 0
        for p in products:
            where.append(k if p.kind == Linear.INT8 else -1)
            k += p.kind == Linear.INT8
        empty = torch.empty(0)
        return (
            [p.kind for p in products],
            [empty if p.weight is None else p.weight for p in products],
            [p.bias for p in products],
            packs,
            where,
            [bool(p.reduce_range) for p in products],
            [n[1] for n in norms],
            [n[2] for n in norms],
            [float(n[3]) for n in norms],
            pre.pop(),
            acts.pop(),
            final is not None,
        )

    def scripted(self, x: Tensor, state: TransformerDecoderState) -> Tensor | None:
        """The logits ``(B, V)`` of the embedded new tokens ``x`` ``(B, D)`` by the scripted
        step, the caches advanced; None where it does not run (the Python step then does)."""
        caches, plans = state.self_caches, state.cross_plans
        if self.args is None or state.beams is not None or plans is None:
            return None
        t = caches[0].length
        for c in caches:
            k = c._k
            if (
                type(c) is not KVCache
                or k is None
                or c.length != t
                or not c._finite
                or k.shape[2] <= t
                or k.shape[0] != x.shape[0]
                or k.dtype != x.dtype
            ):
                return None
        cross = self._cross
        if (
            cross is None
            or len(cross[0]) != len(plans)
            or any(a is not b for a, b in zip(cross[0], plans))
        ):
            if any(
                p is None
                or p.key_t is None
                or p.key.shape[0] != x.shape[0]
                or p.key_t.dtype != x.dtype
                for p in plans
            ):
                return None
            lists = (
                [p.key_t for p in plans],
                [p.kernel_value for p in plans],
                [p.bias for p in plans],
                [p.dead for p in plans],
                [p.mult for p in plans],
            )
            cross = self._cross = (list(plans), lists)
        kinds, weights, biases, packs, where, rr, nw, nb, eps, pre, act, final = self.args
        out = self.script(
            x, t, [c._k for c in caches], [c._v for c in caches],
            kinds, weights, biases, packs, where, rr, nw, nb, eps,
            *cross[1], self.self_mult, self.heads, pre, act, final,
        )  # fmt: skip
        if out is not None:
            for c in caches:
                c.length = t + 1
        return out


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

    A decoding step with a cache in inference takes a fast path with the same results (see the
    module's notes); set ``fast_decode = False`` (on the class or an instance) to turn it off,
    ``scripted_decode = False`` to run it in Python rather than as one TorchScript function.
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
        if self._fast_ok(X, state, need_weights):
            B = X.shape[0]
            Y = self._embed(X, state.offset).reshape(B, self.num_hiddens)
            if state.cross_plans is None:
                state.cross_plans = [None] * self.num_blks
            if state.step_plan is None or not state.step_plan.current():
                state.step_plan = _StepPlan(self, Y)
            if state.beams is not None:  # this step's position in every beam's history
                state.beams.advance(Y.dtype)
            elif self.scripted_decode:  # the whole step scripted, where it runs
                logits = state.step_plan.scripted(Y, state)
                if logits is not None:
                    self.attention_weights = None
                    return logits.view(B, 1, -1), state
            for blk in self.blks:
                Y = blk._step_fast(Y, state)
            if self.norm is not None:
                Y = self.norm(Y)
            self.attention_weights = None
            return state.step_plan.dense(Y).view(B, 1, -1), state
        if state.beams is not None:  # the general path reads every row's own cache
            self._end_beams(state)
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

    def _fast_ok(self, X: Tensor, state: TransformerDecoderState, need_weights: bool) -> bool:
        """Whether this call takes the fast decoding step: inference (no grad, eval mode), one
        new token per row, a :class:`KVCache` (not a step graph's tensors), the CPU, no weights
        asked for, and blocks it knows."""
        return (
            self.fast_decode
            and not need_weights
            and not self.training
            and not torch.is_grad_enabled()
            and X.shape[1] == 1
            and X.device.type == "cpu"
            and state.self_caches is not None
            and type(state.self_caches[0]) in (KVCache, BeamKVCache)
            and not torch.compiler.is_compiling()
            and all(blk._fast_ok() for blk in self.blks)
        )

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

        Where the fast decoding step will run (see the module's notes), the self-attention
        caches become :class:`~qkv.nn.kv_cache.BeamKVCache`: reordering the beams within their
        sentences (``reorder_state(..., include_encoder=False)``) then moves no keys or
        values; anything else reads every row's own cache, as before.
        """
        if isinstance(beams, bool) or not isinstance(beams, int) or beams < 1:
            raise ValueError(f"beams: expected a positive int, got {beams!r}")
        B, device = state.enc_outputs.shape[0], state.enc_outputs.device
        caches = state.self_caches
        grouped = (
            beams > 1
            and state.beams is None
            and caches is not None
            and all(type(c) is KVCache and not c.empty and c.keys.shape[0] == B for c in caches)
            and self.fast_decode
            and not self.training
            and not torch.is_grad_enabled()
            and device.type == "cpu"
            and all(blk._fast_ok() for blk in self.blks)
        )
        if not grouped:
            return self.reorder_state(
                state, torch.arange(B, device=device).repeat_interleave(beams)
            )
        state.beams = BeamRows(B, beams, caches[0].length, caches[0].capacity or 1, device)
        state.self_caches = [BeamKVCache.from_cache(c, beams) for c in caches]
        return state  # the encoder's part stays one row per sentence

    def _end_beams(self, state: TransformerDecoderState) -> None:
        """Every beam's own rows again: its self-attention cache (:class:`KVCache`) and its
        sentence's encoder part, for anything but the fast step."""
        beams = state.beams
        if beams is None:
            return
        if state.self_caches is not None:
            state.self_caches = [c.to_cache(beams) for c in state.self_caches]
        state.beams = None
        G, device = beams.groups, state.enc_outputs.device
        self._reorder_encoder(state, torch.arange(G, device=device).repeat_interleave(beams.beams))

    def reorder_state(
        self, state: TransformerDecoderState, index: Tensor, *, include_encoder: bool = True
    ) -> TransformerDecoderState:
        """Keep rows ``index`` ``(B',)`` of the state, in that order (beam search).

        With ``include_encoder=False`` only the self-attention caches are reordered: valid when
        every row keeps the same source sentence (reordering beams within a sentence).
        """
        beams = state.beams
        if beams is not None:
            if not include_encoder and beams.within_groups(index):
                beams.reorder(index)  # no key moves: the beams read their new histories
                return state
            groups = beams.whole_groups(index) if include_encoder else None
            if groups is None:
                self._end_beams(state)
            else:  # whole sentences leave (early exit)
                for c in state.self_caches:
                    c.keep_groups(groups)
                beams.keep_groups(groups)
                self._reorder_encoder(state, groups)
                return state
        if state.self_caches is not None:
            for c in state.self_caches:
                c.reorder(index)
        if include_encoder:
            self._reorder_encoder(state, index)
        return state

    def _reorder_encoder(self, state: TransformerDecoderState, index: Tensor) -> None:
        state.cross_plans = None  # planned for the old rows
        state.enc_outputs = state.enc_outputs.index_select(0, index)
        if state.enc_valid_lens is not None:
            state.enc_valid_lens = state.enc_valid_lens.index_select(0, index)
        if state.cross_caches is not None:
            for c in state.cross_caches:
                c.reorder(index)
