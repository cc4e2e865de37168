"""Positional encodings: sinusoidal (the book's), learned, rotary (RoPE), and none.

Every additive encoding takes ``forward(X (B, L, D), offset=0)`` and returns ``(B, L, D)``: the
encodings of positions ``offset .. offset + L - 1`` added to ``X``, then dropout.  The ``offset`` is
how incremental decoding with a KV cache places one new token after those already decoded.

Rotary embeddings are not added to ``X``: :class:`RotaryEmbedding` rotates the queries and keys
of an attention layer (pass it as ``rotary=`` to :class:`qkv.nn.MultiHeadAttention`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._checks import dropout_rate
from ._checks import positive_int as _positive_int

__all__ = [
    "POSITIONAL_ENCODINGS",
    "LearnedPositionalEncoding",
    "NoPositionalEncoding",
    "PositionalEncoding",
    "RotaryEmbedding",
    "apply_rotary",
    "make_positional_encoding",
    "sinusoidal_encoding",
]

POSITIONAL_ENCODINGS: tuple[str, ...] = ("sinusoidal", "learned", "rotary", "none")


def _offset(value: object) -> int | torch.SymInt:
    """A position offset: a non-negative int, a symbolic int (``torch.export`` traces the
    decoder step with the past length as a size, whose range the export's dimension bounds), or
    a one-element integer tensor (read as an int; not under ``torch.export``: use a size)."""
    if isinstance(value, torch.SymInt):
        return value
    if (
        isinstance(value, Tensor)
        and value.numel() == 1
        and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    ):
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"offset: expected a non-negative int (or a symbolic size, or a one-element "
            f"integer tensor), got {value!r}"
        )
    return value


def _want_3d(X: object, width: int) -> Tensor:
    if not isinstance(X, Tensor) or X.dim() != 3 or X.shape[-1] != width:
        got = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X: expected a tensor of shape (B, L, {width}), got {got}")
    return X


def sinusoidal_encoding(
    positions: Tensor,
    num_hiddens: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The sinusoidal table of the paper and the book, for the given positions.

    ``P[i, 2j] = sin(pos_i / base^(2j/D))`` and ``P[i, 2j+1] = cos(pos_i / base^(2j/D))``; an odd
    ``D`` is allowed (the last column is a sine).

    Shapes: positions ``(L,)`` (any numeric dtype) -> ``(L, num_hiddens)`` in ``dtype``.
    """
    _positive_int("num_hiddens", num_hiddens)
    pos = positions.to(torch.float64).reshape(-1, 1)  # float64: exact angles for long tables
    inv = base ** (
        -torch.arange(0, num_hiddens, 2, dtype=torch.float64, device=pos.device) / num_hiddens
    )
    angles = pos * inv  # (L, ceil(D/2))
    P = torch.empty(pos.shape[0], num_hiddens, dtype=torch.float64, device=pos.device)
    P[:, 0::2] = torch.sin(angles)
    P[:, 1::2] = torch.cos(angles[:, : num_hiddens // 2])
    return P.to(dtype)


class PositionalEncoding(nn.Module):
    """The book's sinusoidal positional encoding, ``PositionalEncoding(num_hiddens, dropout,
    max_len=1000)``.

    The table ``P`` ``(1, max_len, num_hiddens)`` is precomputed (a buffer, not saved in the
    state dict); positions beyond it are computed on the fly, so any length works.

    ``forward(X (B, L, D), offset=0)`` returns ``dropout(X + P[:, offset:offset + L])``.
    """

    def __init__(self, num_hiddens: int, dropout: float = 0.0, max_len: int = 1000) -> None:
        super().__init__()
        self.num_hiddens = _positive_int("num_hiddens", num_hiddens)
        _positive_int("max_len", max_len)
        self.dropout = nn.Dropout(dropout_rate(dropout))
        P = sinusoidal_encoding(torch.arange(max_len), num_hiddens).unsqueeze(0)
        self.register_buffer("P", P, persistent=False)

    def encoding(self, offset: int, length: int, like: Tensor) -> Tensor:
        """``(1, length, D)`` encodings of positions ``offset .. offset + length - 1``."""
        end = offset + length
        if end <= self.P.shape[1]:
            P = self.P[:, offset:end]
        else:
            pos = torch.arange(offset, end, device=like.device)
            P = sinusoidal_encoding(pos, self.num_hiddens).unsqueeze(0)
        return P.to(device=like.device, dtype=like.dtype)

    def forward(self, X: Tensor, offset: int = 0) -> Tensor:
        _want_3d(X, self.num_hiddens)
        return self.dropout(X + self.encoding(_offset(offset), X.shape[1], X))

    def extra_repr(self) -> str:
        return f"num_hiddens={self.num_hiddens}, max_len={self.P.shape[1]}"


class LearnedPositionalEncoding(nn.Module):
    """Learned absolute positions (BERT, GPT-2): an embedding per position, added to ``X``.

    ``forward(X (B, L, D), offset=0)`` returns ``dropout(X + E[offset:offset + L])``.  A learned
    table cannot extrapolate: positions at or beyond ``max_len`` raise ValueError.
    """

    def __init__(self, num_hiddens: int, dropout: float = 0.0, max_len: int = 1000) -> None:
        super().__init__()
        self.num_hiddens = _positive_int("num_hiddens", num_hiddens)
        self.max_len = _positive_int("max_len", max_len)
        self.embedding = nn.Embedding(max_len, num_hiddens)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(dropout_rate(dropout))

    def forward(self, X: Tensor, offset: int = 0) -> Tensor:
        _want_3d(X, self.num_hiddens)
        offset = _offset(offset)
        end = offset + X.shape[1]
        if end > self.max_len:
            raise ValueError(
                f"X: positions up to {end - 1} need a table of at least {end} rows, but this "
                f"learned encoding has max_len={self.max_len} (learned positions cannot "
                f"extrapolate; use the sinusoidal or rotary encoding, or a larger max_len)"
            )
        return self.dropout(X + self.embedding.weight[offset:end].to(X.dtype))


class NoPositionalEncoding(nn.Module):
    """No additive encoding, only the dropout (for rotary embeddings, which act in attention).

    ``forward(X (B, L, D), offset=0)`` returns ``dropout(X)``.
    """

    def __init__(self, num_hiddens: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_hiddens = _positive_int("num_hiddens", num_hiddens)
        self.dropout = nn.Dropout(dropout_rate(dropout))

    def forward(self, X: Tensor, offset: int = 0) -> Tensor:
        _want_3d(X, self.num_hiddens)
        _offset(offset)
        return self.dropout(X)


# ---------------------------------------------------------------------------- rotary
def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs of features of ``x`` by position-dependent angles (RoPE).

    Uses the "rotate half" pairing (GPT-NeoX, LLaMA): feature ``i`` is paired with feature
    ``i + d/2``, each pair rotated by ``angle(pos, i) = pos * base^(-2i/d)``.

    Shapes: x ``(..., L, d)``; cos, sin ``(L, d/2)`` (broadcast over the leading axes).
    Returns ``(..., L, d)``, same dtype as ``x``.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer, Su et al. 2021) for queries and keys.

    ``RotaryEmbedding(head_dim, base=10000.0, max_len=2048)``; ``head_dim`` must be even.  The
    rotated ``q . k`` depends on positions only through their difference, so it needs no additive
    encoding.  The cos/sin tables are buffers (not saved); positions beyond ``max_len`` are
    computed on the fly.

    ``forward(x (B, H, L, d), offset=0)`` rotates positions ``offset .. offset + L - 1``.  Pass
    the module as ``rotary=`` to :class:`qkv.nn.MultiHeadAttention` to rotate its q and k.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, max_len: int = 2048) -> None:
        super().__init__()
        _positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim: expected an even number of features, got {head_dim}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"base: expected a float > 1, got {base!r}")
        _positive_int("max_len", max_len)
        self.head_dim, self.base = head_dim, float(base)
        cos, sin = self._tables(torch.arange(max_len), torch.device("cpu"))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, positions: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
        half = self.head_dim // 2
        inv = self.base ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
        angles = positions.to(device=device, dtype=torch.float64).reshape(-1, 1) * inv
        return torch.cos(angles).float(), torch.sin(angles).float()

    def tables(self, offset: int, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """``cos, sin`` ``(length, head_dim/2)`` for positions ``offset .. offset + length - 1``."""
        end = offset + length
        if end <= self.cos.shape[0]:
            return self.cos[offset:end], self.sin[offset:end]
        return self._tables(torch.arange(offset, end), device)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[-1] != self.head_dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x: expected a tensor (..., L, {self.head_dim}), got {got}")
        cos, sin = self.tables(_offset(offset), x.shape[-2], x.device)
        return apply_rotary(x, cos, sin)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}"


def make_positional_encoding(
    kind: str, num_hiddens: int, dropout: float = 0.0, max_len: int = 1000
) -> nn.Module:
    """The additive encoding for ``kind`` in :data:`POSITIONAL_ENCODINGS`.

    ``"rotary"`` and ``"none"`` give :class:`NoPositionalEncoding` (dropout only): rotary
    embeddings are applied inside attention instead.
    """
    if kind == "sinusoidal":
        return PositionalEncoding(num_hiddens, dropout, max_len)
    if kind == "learned":
        return LearnedPositionalEncoding(num_hiddens, dropout, max_len)
    if kind in ("rotary", "none"):
        return NoPositionalEncoding(num_hiddens, dropout)
    raise ValueError(f"pos_encoding: expected one of {POSITIONAL_ENCODINGS}, got {kind!r}")
