"""The Transformer's sublayers with the book's (d2l 1.0) signatures: :class:`PositionWiseFFN` and
:class:`AddNorm` (post-norm as the paper and the book; pre-norm with ``norm_first=True``).

They sit beside :mod:`qkv.nn.transformer`, which builds its blocks from them, so that the fast
inference path (:mod:`qkv.nn._fast_decode`) can tell a plain sublayer from any other module
without importing the model it speeds up.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from ._checks import boolean, dropout_rate
from ._checks import positive_int as _positive_int

__all__ = ["ACTIVATIONS", "AddNorm", "PositionWiseFFN"]

#: the feed-forward activations by name: ReLU, GELU (exact, erf) and swish (SiLU,
#: ``x * sigmoid(x)``, what OPUS-MT's Marian models use)
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "swish")


def _activation(name: str) -> nn.Module:
    if name == "relu":
        return nn.ReLU()
    if name == "gelu":
        return nn.GELU()
    if name == "swish":
        return nn.SiLU()
    raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {name!r}")


class PositionWiseFFN(nn.Module):
    """The position-wise feed-forward network, d2l 1.0's ``PositionWiseFFN(ffn_num_hiddens,
    ffn_num_outputs)``: ``dense2(activation(dense1(X)))``.

    The book infers the input size lazily; here it is ``ffn_num_input`` (keyword), defaulting to
    ``ffn_num_outputs`` as in every Transformer block.

    Shapes: ``(..., ffn_num_input) -> (..., ffn_num_outputs)``.
    """

    def __init__(
        self,
        ffn_num_hiddens: int,
        ffn_num_outputs: int,
        *,
        ffn_num_input: int | None = None,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        _positive_int("ffn_num_hiddens", ffn_num_hiddens)
        _positive_int("ffn_num_outputs", ffn_num_outputs)
        n_in = ffn_num_outputs if ffn_num_input is None else ffn_num_input
        _positive_int("ffn_num_input", n_in)
        self.dense1 = nn.Linear(n_in, ffn_num_hiddens)
        self.activation = _activation(activation)
        self.dense2 = nn.Linear(ffn_num_hiddens, ffn_num_outputs)

    def forward(self, X: Tensor) -> Tensor:
        return self.dense2(self.activation(self.dense1(X)))


class AddNorm(nn.Module):
    """The residual connection and layer normalisation, d2l's ``AddNorm(norm_shape, dropout)``.

    Post-norm (the paper, the book): ``forward(X, Y) = LayerNorm(X + dropout(Y))`` where ``Y`` is
    the sublayer's output on ``X``.  Pre-norm (``norm_first=True``): the sublayer reads
    :meth:`pre` ``(X) = LayerNorm(X)`` and ``forward(X, Y) = X + dropout(Y)``.

    Shapes: X, Y ``(..., *norm_shape)`` -> same.
    """

    def __init__(
        self, norm_shape: int | Sequence[int], dropout: float, *, norm_first: bool = False
    ) -> None:
        super().__init__()
        shape = (norm_shape,) if isinstance(norm_shape, int) else tuple(norm_shape)
        if not shape or not all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape
        ):
            raise ValueError(
                f"norm_shape: expected a positive int or a sequence of them, got {norm_shape!r}"
            )
        self.dropout = nn.Dropout(dropout_rate(dropout))
        self.ln = nn.LayerNorm(shape)
        self.norm_first = boolean("norm_first", norm_first)

    def pre(self, X: Tensor) -> Tensor:
        """What the sublayer reads: ``LayerNorm(X)`` with pre-norm, ``X`` with post-norm."""
        return self.ln(X) if self.norm_first else X

    def forward(self, X: Tensor, Y: Tensor) -> Tensor:
        if self.training:  # dropout is the identity in evaluation: not even called (decoding)
            Y = self.dropout(Y)
        if self.norm_first:
            return X + Y
        return self.ln(Y + X)

    def extra_repr(self) -> str:
        return "norm_first=True" if self.norm_first else ""
