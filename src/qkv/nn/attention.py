"""Attention modules: thin owners of parameters around :func:`qkv.functional.attention`.

None of them computes a softmax or builds a mask by itself: the masks a caller gives go to
:func:`~qkv.functional.attention` as they are, with two exceptions in
:class:`MultiheadAttention`, both through :mod:`qkv.functional.masks`.  It reads the masks
(:meth:`~qkv.functional.masks.MaskSpec.key_extent`) to skip projecting keys that no query sees,
cutting the masks to the keys kept; and torch's ``add_bias_kv``/``add_zero_attn`` append keys that
every query sees, so :func:`~qkv.functional.masks.append_visible_keys` rewrites the masks over
them (lengths, which count the given keys only, become bool masks).

* :class:`MultiheadAttention`: a drop-in for ``torch.nn.MultiheadAttention`` (same constructor,
  parameter names, forward and outputs), faster on the CPU and finite where torch returns NaN.
* :class:`DotProductAttention`, :class:`AdditiveAttention`, :class:`MultiHeadAttention`: the
  book's (d2l) modules with its signatures and parameter names.
* :class:`MultiHeadSelfAttention`: ViT's fused-``qkv`` attention (seed 002 / timm's ``Attention``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import additive_attention, attention, check_masks
from ..functional.masks import append_visible_keys
from ..functional.scores import Score
from ._checks import positive_int as _positive_int
from ._checks import probability as _dropout
from ._checks import score_and_scale
from .kv_cache import KVCache
from .position import RotaryEmbedding

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "MultiHeadAttention",
    "MultiHeadSelfAttention",
    "MultiheadAttention",
]


# ---------------------------------------------------------------------------- checks
def _heads(embed_name: str, embed_dim: int, num_heads: int) -> int:
    _positive_int(embed_name, embed_dim)
    _positive_int("num_heads", num_heads)
    if embed_dim % num_heads:
        raise ValueError(
            f"{embed_name}: expected a multiple of num_heads={num_heads}, got {embed_dim}"
        )
    return embed_dim // num_heads


def _want_3d(name: str, x: object, width: int | None = None) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() != 3:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected a 3-D tensor (B, L, D), got {shape}")
    if width is not None and x.shape[-1] != width:
        raise ValueError(f"{name}: expected last dimension {width}, got shape {tuple(x.shape)}")
    return x


# ---------------------------------------------------------------------------- the shared call
class _ScoredAttention(nn.Module):
    """What the modules calling :func:`qkv.functional.attention` share: their ``score`` and
    ``scale`` (checked once, at construction) and the one call.  Adds no parameters."""

    score: Score
    scale: float | None

    def _set_score(self, score: Score, scale: float | None) -> None:
        score_and_scale(score, scale)
        self.score, self.scale = score, scale

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        dropout: float,
        *,
        valid_lens: Tensor | Sequence[int] | None = None,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """:func:`qkv.functional.attention` of ``q`` ``(B, H, Lq, d)`` over ``k``/``v`` with this
        module's score and scale; the dropout rate applies in training only."""
        return attention(
            q,
            k,
            v,
            valid_lens=valid_lens,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            window=window,
            score=self.score,
            scale=self.scale,
            dropout_p=dropout if self.training else 0.0,
            need_weights=need_weights,
        )


# ---------------------------------------------------------------------------- torch drop-in
class MultiheadAttention(_ScoredAttention):
    """A drop-in for ``torch.nn.MultiheadAttention``.

    Same constructor, same parameters under the same names and shapes (``load_state_dict`` works
    both ways), same ``forward`` and outputs (within 1e-5 in float32).  Differences:

    * where torch returns NaN for a query that may attend to nothing (every key masked), qkv
      returns a zero attention value, so the output is ``out_proj.bias``;
    * ``is_causal=True`` without ``attn_mask`` applies a causal mask (torch raises); with an
      ``attn_mask`` it is torch's hint, handled exactly as torch does;
    * extra keyword arguments: ``valid_lens`` (d2l's ``(B,)`` or ``(B, L)``) and ``window`` (a
      causal sliding window) on ``forward``;
      ``score`` and ``scale`` (see :mod:`qkv.functional.scores`) on the constructor.

    Shapes: ``(Lq, B, D)`` inputs, or ``(B, Lq, D)`` with ``batch_first=True``, or unbatched
    ``(Lq, D)``; key ``(Lk, B, kdim)``, value ``(Lk, B, vdim)``.  Returns ``(output, weights)``
    with weights ``(B, Lq, Lk)`` averaged over heads or ``(B, H, Lq, Lk)``, or None.  (torch's
    documentation calls these ``L``, ``S``, ``E`` and ``N``.)
    """

    __constants__: ClassVar[list[str]] = ["batch_first"]

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        score: Score = "scaled_dot",
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = _heads("embed_dim", embed_dim, num_heads)
        self.dropout = _dropout("dropout", dropout)
        self._set_score(score, scale)
        self.kdim = embed_dim if kdim is None else _positive_int("kdim", kdim)
        self.vdim = embed_dim if vdim is None else _positive_int("vdim", vdim)
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self.add_zero_attn = add_zero_attn
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        fk = {"device": device, "dtype": dtype}
        E = embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * E, E, **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(E, E, **fk))
            self.k_proj_weight = nn.Parameter(torch.empty(E, self.kdim, **fk))
            self.v_proj_weight = nn.Parameter(torch.empty(E, self.vdim, **fk))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * E, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(E, E, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, E, **fk))
            self.bias_v = nn.Parameter(torch.empty(1, 1, E, **fk))
        else:
            self.bias_k = self.bias_v = None
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """torch's initialisation: Xavier-uniform projections, zero biases."""
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    # -------------------------------------------------------------- helpers
    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Input projections on batch-first ``(B, L, .)`` tensors -> ``(B, L, E)`` each."""
        E = self.embed_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        if w is not None and query is key and key is value:
            return F.linear(query, w, b).chunk(3, dim=-1)  # one GEMM for self-attention
        bq = bk = bv = None
        if b is not None:
            bq, bk, bv = b.chunk(3)
        if w is not None:
            wq, wk, wv = w.chunk(3)
            if key is value:
                q = F.linear(query, wq, bq)
                kv = F.linear(key, w[E:], None if b is None else b[E:])
                k, v = kv.chunk(2, dim=-1)
                return q, k, v
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> bool:
        for name, t, width in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
            if t.dim() not in (2, 3):
                raise ValueError(
                    f"{name}: expected a 3-D (batched) or 2-D (unbatched) tensor, "
                    f"got shape {tuple(t.shape)}"
                )
            if t.shape[-1] != width:
                raise ValueError(
                    f"{name}: expected last dimension {width} (the module's "
                    f"{'embed_dim' if name == 'query' else name[0] + 'dim'}), got shape "
                    f"{tuple(t.shape)}"
                )
        if not (query.dim() == key.dim() == value.dim()):
            raise ValueError(
                f"query, key, value: expected the same number of dimensions, got shapes "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(
                f"key, value: expected the same sequence and batch sizes, got shapes "
                f"{tuple(key.shape)} and {tuple(value.shape)}"
            )
        return query.dim() == 3

    def _head_mask(self, attn_mask: Tensor, B: int, L: int, S: int) -> Tensor:
        """Accept torch's ``(L, S)`` and ``(B*num_heads, L, S)`` attn_mask shapes."""
        H = self.num_heads
        if attn_mask.dim() == 2:
            if attn_mask.shape != (L, S):
                raise ValueError(
                    f"attn_mask: expected shape ({L}, {S}) (target, source), "
                    f"got {tuple(attn_mask.shape)}"
                )
            return attn_mask
        if attn_mask.dim() == 3:
            if attn_mask.shape != (B * H, L, S):
                raise ValueError(
                    f"attn_mask: expected shape ({B * H}, {L}, {S}) (batch*num_heads, target, "
                    f"source), got {tuple(attn_mask.shape)}"
                )
            return attn_mask.view(B, H, L, S)
        raise ValueError(f"attn_mask: expected a 2-D or 3-D tensor, got {tuple(attn_mask.shape)}")

    # -------------------------------------------------------------- forward
    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        valid_lens: Tensor | Sequence[int] | None = None,
        window: int | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Multi-head attention with torch's semantics.

        Args:
            query: ``(Lq, B, D)`` (``(B, Lq, D)`` if batch_first) or unbatched ``(Lq, D)``.
            key: ``(Lk, B, kdim)`` / ``(B, Lk, kdim)`` / ``(Lk, kdim)``.
            value: ``(Lk, B, vdim)`` / ``(B, Lk, vdim)`` / ``(Lk, vdim)``.
            key_padding_mask: ``(B, S)`` (or ``(S,)`` unbatched); bool True = padding, or float
                added to the scores.
            need_weights: also return the attention weights.
            attn_mask: ``(L, S)`` or ``(B*num_heads, L, S)`` (``(num_heads, L, S)`` unbatched);
                bool True = not allowed, or float added.
            average_attn_weights: average the returned weights over heads.
            is_causal: causal masking (see the class notes).
            valid_lens: d2l-style lengths ``(B,)`` or ``(B, L)``.
            window: a causal sliding window: query ``i`` sees keys ``i - window < j <= i``
                (qkv's extension; torch's module has none).

        Returns:
            ``(output, weights)``: output shaped like ``query`` (last dim ``embed_dim``); weights
            ``(B, L, S)`` or ``(B, H, L, S)`` (no batch axis when unbatched), or None.
        """
        batched = self._check_inputs(query, key, value)
        query, key, value = self._batch_first(query, key, value, batched)
        key_padding_mask, attn_mask = self._check_call(
            query, key, key_padding_mask, attn_mask, window, batched
        )
        B, L, _ = query.shape
        S = key.shape[1]
        extra_keys = self.bias_k is not None or self.add_zero_attn
        S_in = S  # the weights returned cover every key given
        if not extra_keys and (key_padding_mask is not None or valid_lens is not None):
            key, value, key_padding_mask, valid_lens, attn_mask = self._drop_unseen_keys(
                L, key, value, key_padding_mask, valid_lens, attn_mask, query.device
            )
            S = key.shape[1]
        q, k, v = self._project(query, key, value)  # (B, L|S, E)
        if is_causal and attn_mask is not None:
            # torch's contract: attn_mask is the causal mask and is_causal a hint.  Like torch,
            # use the hint (causal over all keys, extra ones included) when nothing else needs
            # the mask, and the mask as given otherwise.
            if key_padding_mask is None and valid_lens is None and not need_weights:
                attn_mask = None
            else:
                is_causal = False
        if extra_keys:
            k, v = self._extend_keys(k, v)
            # lengths count the given keys; the extra ones must stay visible
            key_padding_mask, attn_mask = append_visible_keys(
                k.shape[1] - S,
                B=B,
                H=self.num_heads,
                Lq=L,
                Lk=S,
                device=self.out_proj.weight.device,
                valid_lens=valid_lens,
                key_padding_mask=key_padding_mask,
                attn_mask=attn_mask,
            )
            valid_lens = None

        H, d = self.num_heads, self.head_dim
        # (B, L, E) -> (B, L, H, d) -> (B, H, L, d): views, no copies
        q = q.unflatten(-1, (H, d)).transpose(1, 2)
        k = k.unflatten(-1, (H, d)).transpose(1, 2)
        v = v.unflatten(-1, (H, d)).transpose(1, 2)
        out, weights = self._attend(
            q,
            k,
            v,
            self.dropout,
            valid_lens=valid_lens,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            window=window,
            need_weights=need_weights,
        )
        out = self.out_proj(self._merge_heads(out, batched))
        if not batched:
            out = out.squeeze(0)
        if weights is not None:
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if S_in > S:  # the keys dropped unseen: zero columns
                weights = F.pad(weights, (0, S_in - S))
            if not batched:
                weights = weights.squeeze(0)
        return out, weights

    def _check_call(
        self,
        query: Tensor,
        key: Tensor,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        window: int | None,
        batched: bool,
    ) -> tuple[Tensor | None, Tensor | None]:
        """The checks of a call on batch-first ``query`` ``(B, L, D)`` and ``key``
        ``(B, S, kdim)``; returns the masks in that layout: ``key_padding_mask`` ``(B, S)`` and
        ``attn_mask`` ``(L, S)`` or ``(B, H, L, S)`` (see :meth:`_head_mask`)."""
        if key_padding_mask is not None and not isinstance(key_padding_mask, Tensor):
            raise TypeError(
                "key_padding_mask: expected a bool or float tensor, got "
                f"{type(key_padding_mask).__name__}"
            )
        if not batched and key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)  # (S,) -> (1, S)
        B, L, _ = query.shape
        S = key.shape[1]
        if key.shape[0] != B:
            raise ValueError(
                f"key: expected batch size {B} like query, got {key.shape[0]} "
                f"(batch_first={self.batch_first})"
            )
        if attn_mask is not None:
            if not isinstance(attn_mask, Tensor):
                raise TypeError(f"attn_mask: expected a tensor, got {type(attn_mask).__name__}")
            attn_mask = self._head_mask(attn_mask, B, L, S)
        if window is not None and (self.bias_k is not None or self.add_zero_attn):
            raise ValueError(
                "window: a sliding window counts key positions from the queries', and the keys "
                "add_bias_kv/add_zero_attn append after the last one would fall out of it; "
                "build the module without them to use window="
            )
        return key_padding_mask, attn_mask

    def _batch_first(
        self, query: Tensor, key: Tensor, value: Tensor, batched: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The inputs as ``(B, L, .)`` views; ``query is key is value`` stays visible to the
        projection (one GEMM for self-attention)."""

        def view(t: Tensor) -> Tensor:
            if not batched:
                return t.unsqueeze(0)  # (L, E) -> (1, L, E)
            return t if self.batch_first else t.transpose(0, 1)  # (L, B, D) -> (B, L, D)

        q_in = view(query)
        k_in = q_in if key is query else view(key)
        v_in = k_in if value is key else (q_in if value is query else view(value))
        return q_in, k_in, v_in

    def _drop_unseen_keys(
        self,
        L: int,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        valid_lens: Tensor | Sequence[int] | None,
        attn_mask: Tensor | None,
        device: torch.device,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | Sequence[int] | None, Tensor | None]:
        """Keys that every query has masked (padding shared by the whole batch) are never
        projected: their key/value rows would only be multiplied by zero weights (and weights
        asked for get them back as zero columns, after the mean over heads).  Returns key,
        value ``(B, S', .)`` and the masks cut to the ``S'`` keys kept (as given when none is
        dropped)."""
        B, S = key.shape[:2]
        end = check_masks(
            B=B,
            H=1,
            Lq=L,
            Lk=S,
            device=device,
            batched_heads=True,
            valid_lens=valid_lens,
            key_padding_mask=key_padding_mask,
        ).key_extent()
        if not 0 < end < S:
            return key, value, key_padding_mask, valid_lens, attn_mask
        # one slice for both when key is value: their projection stays one GEMM
        trimmed = key[:, :end]
        value = trimmed if value is key else value[:, :end]
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask[:, :end]
        if valid_lens is not None:
            valid_lens = torch.as_tensor(valid_lens).clamp(max=end)
        if attn_mask is not None:
            attn_mask = attn_mask[..., :end]
        return trimmed, value, key_padding_mask, valid_lens, attn_mask

    def _merge_heads(self, out: Tensor, batched: bool) -> Tensor:
        """Attention values ``(B, H, L, d)`` as ``(B, L, D)``, ``(L, B, D)`` for seq-first or
        ``(1, L, D)`` unbatched."""
        B, _, L, _ = out.shape
        if self.batch_first or not batched:
            out = out.transpose(1, 2).reshape(B, L, self.embed_dim)
        else:
            out = out.permute(2, 0, 1, 3).reshape(L, B, self.embed_dim)
        return out

    def _extend_keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """torch's ``add_bias_kv`` / ``add_zero_attn``: extra key/value positions at the end of
        ``(B, S, E)`` keys and values (their masks: :func:`append_visible_keys`)."""
        B = k.shape[0]
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.expand(B, 1, -1)], dim=1)
            v = torch.cat([v, self.bias_v.expand(B, 1, -1)], dim=1)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(B, 1, k.shape[-1])], dim=1)
            v = torch.cat([v, v.new_zeros(B, 1, v.shape[-1])], dim=1)
        return k, v

    def extra_repr(self) -> str:
        s = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"
        if not self._qkv_same_embed_dim:
            s += f", kdim={self.kdim}, vdim={self.vdim}"
        if self.batch_first:
            s += ", batch_first=True"
        if self.score != "scaled_dot":
            s += f", score={self.score!r}"
        return s


# ---------------------------------------------------------------------------- the book's modules
class DotProductAttention(_ScoredAttention):
    """The book's scaled dot-product attention (d2l ``DotProductAttention(dropout)``).

    ``forward(queries (B, Lq, d), keys (B, Lk, d), values (B, Lk, dv), valid_lens=None)``
    returns ``(B, Lq, dv)``; with ``need_weights=True`` (the default, as the book) the weights
    ``(B, Lq, Lk)`` are kept in ``.attention_weights``.  4-D ``(B, H, L, d)`` inputs work too.
    """

    def __init__(
        self, dropout: float = 0.0, *, score: Score = "scaled_dot", scale: float | None = None
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(_dropout("dropout", dropout))
        self._set_score(score, scale)
        self.attention_weights: Tensor | None = None

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | Sequence[int] | None = None,
        *,
        need_weights: bool = True,
        window: int | None = None,
    ) -> Tensor:
        out, self.attention_weights = self._attend(
            queries,
            keys,
            values,
            self.dropout.p,
            valid_lens=valid_lens,
            window=window,
            need_weights=need_weights,
        )
        return out


class AdditiveAttention(nn.Module):
    """The book's additive (Bahdanau) attention, ``AdditiveAttention(key_size, query_size,
    num_hiddens, dropout)``, with its parameters ``W_q``, ``W_k``, ``w_v`` (Linear, no bias).

    ``forward(queries (B, Lq, query_size), keys (B, Lk, key_size), values (B, Lk, dv),
    valid_lens=None)`` returns ``(B, Lq, dv)``; weights ``(B, Lq, Lk)`` in ``.attention_weights``.
    """

    def __init__(self, key_size: int, query_size: int, num_hiddens: int, dropout: float = 0.0):
        super().__init__()
        _positive_int("key_size", key_size)
        _positive_int("query_size", query_size)
        _positive_int("num_hiddens", num_hiddens)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(_dropout("dropout", dropout))
        self.attention_weights: Tensor | None = None

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | Sequence[int] | None = None,
        *,
        need_weights: bool = True,
        projected_keys: Tensor | None = None,
    ) -> Tensor:
        """``projected_keys`` (``W_k keys`` from :meth:`project_keys`, ``(B, Lk, num_hiddens)``)
        skips the key projection: a decoder attending to the same source at every step
        projects it once."""
        q = self.W_q(_want_3d("queries", queries, self.W_q.in_features))
        if projected_keys is None:
            k = self.project_keys(keys)
        else:
            k = _want_3d("projected_keys", projected_keys, self.W_k.out_features)
        out, self.attention_weights = additive_attention(
            q,
            k,
            values,
            self.w_v.weight[0],
            valid_lens=valid_lens,
            dropout_p=self.dropout.p if self.training else 0.0,
            need_weights=need_weights,
        )
        return out

    def project_keys(self, keys: Tensor) -> Tensor:
        """``W_k keys``: ``(B, Lk, key_size) -> (B, Lk, num_hiddens)``."""
        return self.W_k(_want_3d("keys", keys, self.W_k.in_features))


class MultiHeadAttention(_ScoredAttention):
    """The book's multi-head attention, ``MultiHeadAttention(num_hiddens, num_heads, dropout,
    bias=False)`` with ``W_q``, ``W_k``, ``W_v``, ``W_o``.

    ``forward(queries (B, Lq, q_size), keys (B, Lk, k_size), values (B, Lk, v_size),
    valid_lens=None)`` returns ``(B, Lq, num_hiddens)``; ``valid_lens`` is ``(B,)`` or
    ``(B, Lq)``.  Input sizes default to ``num_hiddens`` (the book infers them lazily).  With
    ``need_weights=True`` the per-head weights ``(B, H, Lq, Lk)`` are kept in
    ``.attention_weights``.  Extra keyword masks (``key_padding_mask``, ``attn_mask``,
    ``is_causal``, ``window``) follow :func:`qkv.functional.attention`.

    Keyword-only extras:

    * ``rotary`` (constructor): a :class:`qkv.nn.position.RotaryEmbedding` rotating the
      projected queries and keys by their positions (RoPE), from 0 or, with a growing cache, from
      the number of positions already cached;
    * ``cache`` (forward): a :class:`qkv.nn.kv_cache.KVCache` for incremental decoding.  A growing
      cache appends the keys/values of the new positions and attends over all of them (masks then
      refer to all ``L_cached + Lk`` keys); a static cache is filled on first use and then reused,
      ``keys``/``values`` being ignored (they may be None).
    """

    def __init__(
        self,
        num_hiddens: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = False,
        *,
        query_size: int | None = None,
        key_size: int | None = None,
        value_size: int | None = None,
        score: Score = "scaled_dot",
        scale: float | None = None,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = _heads("num_hiddens", num_hiddens, num_heads)
        self.num_hiddens, self.num_heads = num_hiddens, num_heads
        self._set_score(score, scale)
        if rotary is not None:
            if not isinstance(rotary, RotaryEmbedding):
                raise TypeError(
                    f"rotary: expected a RotaryEmbedding or None, got {type(rotary).__name__}"
                )
            if rotary.head_dim != self.head_dim:
                raise ValueError(
                    f"rotary: expected head_dim={self.head_dim} (num_hiddens // num_heads), "
                    f"got a RotaryEmbedding of head_dim={rotary.head_dim}"
                )
        self.rotary = rotary
        qs = num_hiddens if query_size is None else _positive_int("query_size", query_size)
        ks = num_hiddens if key_size is None else _positive_int("key_size", key_size)
        vs = num_hiddens if value_size is None else _positive_int("value_size", value_size)
        self.W_q = nn.Linear(qs, num_hiddens, bias=bias)
        self.W_k = nn.Linear(ks, num_hiddens, bias=bias)
        self.W_v = nn.Linear(vs, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.dropout = nn.Dropout(_dropout("dropout", dropout))
        self.attention_weights: Tensor | None = None

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | Sequence[int] | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
        window: int | None = None,
    ) -> Tensor:
        H, d = self.num_heads, self.head_dim
        # (B, L, num_hiddens) -> (B, H, L, d)
        q = self.W_q(_want_3d("queries", queries)).unflatten(-1, (H, d)).transpose(1, 2)
        if cache is not None and cache.static and self.rotary is not None:
            raise ValueError(
                "cache: a static (cross-attention) cache cannot be used with rotary embeddings, "
                "whose query and key positions must be those of one sequence"
            )
        if cache is not None and cache.static and not cache.empty:
            k, v = cache.keys, cache.values  # the encoder's, projected once
        else:
            k = self.W_k(_want_3d("keys", keys)).unflatten(-1, (H, d)).transpose(1, 2)
            v = self.W_v(_want_3d("values", values)).unflatten(-1, (H, d)).transpose(1, 2)
            if self.rotary is not None:
                offset = 0 if cache is None else cache.length
                q, k = self.rotary(q, offset), self.rotary(k, offset)
            if cache is not None:
                k, v = cache.set(k, v) if cache.static else cache.append(k, v)
        out, self.attention_weights = self._attend(
            q,
            k,
            v,
            self.dropout.p,
            valid_lens=valid_lens,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            window=window,
            need_weights=need_weights,
        )
        # (B, H, Lq, d) -> (B, Lq, H*d)
        return self.W_o(out.transpose(1, 2).flatten(2))


class MultiHeadSelfAttention(_ScoredAttention):
    """ViT's self-attention with a fused ``qkv`` projection (seed 002, timm's ``Attention``).

    Parameters ``qkv`` (Linear ``dim -> 3*dim``), ``proj`` (Linear ``dim -> dim``) and, with
    ``qk_norm=True``, ``q_norm``/``k_norm`` (LayerNorm over each head's width, as timm), so
    seed 002's and timm's weights load.

    ``forward(x (B, L, dim), valid_lens=None, key_padding_mask=None, attn_mask=None,
    is_causal=False, *, window=None)`` returns ``(B, L, dim)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        score: Score = "scaled_dot",
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = _heads("dim", dim, num_heads)
        self.dim, self.num_heads = dim, num_heads
        self._set_score(score, scale)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(_dropout("attn_drop", attn_drop))
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(_dropout("proj_drop", proj_drop))

    def forward(
        self,
        x: Tensor,
        valid_lens: Tensor | Sequence[int] | None = None,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        *,
        window: int | None = None,
    ) -> Tensor:
        B, N, C = _want_3d("x", x, self.dim).shape
        # (B, N, 3*C) -> (B, N, 3, H, d) -> (3, B, H, N, d)
        q, k, v = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        out, _ = self._attend(
            q,
            k,
            v,
            self.attn_drop.p,
            valid_lens=valid_lens,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            window=window,
        )
        out = out.transpose(1, 2).reshape(B, N, C)  # (B, H, N, d) -> (B, N, C)
        return self.proj_drop(self.proj(out))
