"""Images as sequences (DETR, seed 000): a backbone's feature map fed to a Transformer encoder.

Features ``(B, C, Hi, Wi)`` (image height ``Hi``, width ``Wi``) go through a 1x1 convolution to
``(B, num_hiddens, Hi, Wi)`` and are flattened to a sequence ``(B, Hi*Wi, num_hiddens)``
(row-major: position ``y * Wi + x``).  Positions are encoded with a 2-D sine encoding
(:func:`sine_position_encoding_2d`): half the channels encode the row, half the column, each with
the sinusoidal scheme of the paper.  A padding mask ``(B, Hi, Wi)`` (True at padding, as DETR's)
becomes the encoder's ``key_padding_mask``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._checks import dropout_rate, xavier_
from ._checks import positive_int as _positive_int
from .transformer import TransformerEncoderBlock

__all__ = ["ImageEncoder", "ImageToSequence", "sine_position_encoding_2d"]


def sine_position_encoding_2d(
    mask: Tensor,
    num_hiddens: int,
    *,
    temperature: float = 10000.0,
    normalize: bool = True,
    scale: float = 2 * math.pi,
) -> Tensor:
    """DETR's 2-D sine positional encoding.

    Each valid pixel's row ``y`` and column ``x`` are counted from 1 over the non-padded pixels
    (so padding does not shift the positions of the image); with ``normalize`` they are divided by
    the image's height/width and multiplied by ``scale``.  Then ``num_hiddens / 2`` channels encode
    ``y`` and as many ``x``: channel pair ``(2j, 2j+1)`` is ``(sin, cos)(pos / temperature^(2j /
    (num_hiddens/2)))``.  Channels ``[0, num_hiddens/2)`` are the row's, the rest the column's.

    Shapes: mask ``(B, Hi, Wi)`` bool, True at padding -> ``(B, Hi*Wi, num_hiddens)`` float32.
    ``num_hiddens`` must be a multiple of 4.
    """
    _positive_int("num_hiddens", num_hiddens)
    if num_hiddens % 4:
        raise ValueError(
            f"num_hiddens: expected a multiple of 4 (sin/cos of y and x), got {num_hiddens}"
        )
    if not isinstance(mask, Tensor) or mask.dim() != 3 or mask.dtype != torch.bool:
        got = (
            f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        )
        raise ValueError(f"mask: expected a bool tensor (B, Hi, Wi), got {got}")
    valid = (~mask).to(torch.float32)
    y = valid.cumsum(1)  # (B, Hi, Wi): 1-based row among the valid pixels
    x = valid.cumsum(2)
    if normalize:
        eps = 1e-6
        y = y / (y[:, -1:, :] + eps) * scale
        x = x / (x[:, :, -1:] + eps) * scale
    half = num_hiddens // 2
    inv = temperature ** (-torch.arange(0, half, 2, dtype=torch.float32, device=mask.device) / half)

    def encode(pos: Tensor) -> Tensor:  # (B, Hi, Wi) -> (B, Hi, Wi, half), sin/cos interleaved
        angles = pos.unsqueeze(-1) * inv  # (B, Hi, Wi, half/2)
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)

    pos = torch.cat((encode(y), encode(x)), dim=-1)  # (B, Hi, Wi, num_hiddens)
    return pos.flatten(1, 2)  # (B, Hi*Wi, num_hiddens)


class ImageToSequence(nn.Module):
    """``(B, C, Hi, Wi)`` features -> ``(B, Hi*Wi, num_hiddens)`` tokens plus their positions.

    ``forward(features, mask=None)`` returns ``(tokens, pos, key_padding_mask)``: the 1x1-conv
    projected, flattened features ``(B, Hi*Wi, D)``, the 2-D sine encoding ``(B, Hi*Wi, D)`` and
    the flattened padding mask ``(B, Hi*Wi)`` (None without a mask).
    """

    def __init__(self, in_channels: int, num_hiddens: int, *, temperature: float = 10000.0) -> None:
        super().__init__()
        _positive_int("in_channels", in_channels)
        _positive_int("num_hiddens", num_hiddens)
        if num_hiddens % 4:
            raise ValueError(f"num_hiddens: expected a multiple of 4, got {num_hiddens}")
        self.num_hiddens, self.temperature = num_hiddens, float(temperature)
        self.input_proj = nn.Conv2d(in_channels, num_hiddens, kernel_size=1)

    def forward(
        self, features: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        C = self.input_proj.in_channels
        if not isinstance(features, Tensor) or features.dim() != 4 or features.shape[1] != C:
            got = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
            raise ValueError(f"features: expected a tensor (B, {C}, Hi, Wi), got {got}")
        B, _, Hi, Wi = features.shape
        if mask is None:
            pixel_mask = torch.zeros(B, Hi, Wi, dtype=torch.bool, device=features.device)
        elif not isinstance(mask, Tensor) or mask.shape != (B, Hi, Wi) or mask.dtype != torch.bool:
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else mask
            raise ValueError(
                f"mask: expected a bool tensor ({B}, {Hi}, {Wi}), True at padding, got {got}"
            )
        else:
            pixel_mask = mask
        # (B, C, Hi, Wi) -> (B, D, Hi, Wi) -> (B, D, Hi*Wi) -> (B, Hi*Wi, D)
        tokens = self.input_proj(features).flatten(2).transpose(1, 2)
        pos = sine_position_encoding_2d(pixel_mask, self.num_hiddens, temperature=self.temperature)
        kpm = None if mask is None else mask.flatten(1)
        return tokens, pos.to(tokens.dtype), kpm


class ImageEncoder(nn.Module):
    """A Transformer encoder over a feature map (DETR's encoder input, the book's blocks).

    ``ImageEncoder(in_channels, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout,
    use_bias=False)``; ``forward(features (B, C, Hi, Wi), mask (B, Hi, Wi) or None, *,
    need_weights=False)`` returns ``(B, Hi*Wi, num_hiddens)``.  The 2-D sine encoding is added to
    the projected features once, before the first block (DETR adds it to q and k in every layer;
    adding it at the input is the book's convention).  With ``need_weights=True``,
    ``self.attention_weights`` is the list of per-layer ``(B, H, Hi*Wi, Hi*Wi)``.
    """

    def __init__(
        self,
        in_channels: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        use_bias: bool = False,
        *,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        _positive_int("num_blks", num_blks)
        self.to_sequence = ImageToSequence(in_channels, num_hiddens)
        self.dropout = nn.Dropout(dropout_rate(dropout))
        self.blks = nn.Sequential(
            *(
                TransformerEncoderBlock(
                    num_hiddens,
                    ffn_num_hiddens,
                    num_heads,
                    dropout,
                    use_bias,
                    norm_first=norm_first,
                )
                for _ in range(num_blks)
            )
        )
        self.norm = nn.LayerNorm(num_hiddens) if norm_first else None
        xavier_(self.blks)
        self.attention_weights: list[Tensor] | None = None

    def forward(
        self, features: Tensor, mask: Tensor | None = None, *, need_weights: bool = False
    ) -> Tensor:
        tokens, pos, kpm = self.to_sequence(features, mask)
        X = self.dropout(tokens + pos)
        weights = [] if need_weights else None
        for blk in self.blks:
            X = blk(X, key_padding_mask=kpm, need_weights=need_weights)
            if weights is not None:
                weights.append(blk.attention.attention_weights)
        self.attention_weights = weights
        return X if self.norm is None else self.norm(X)
