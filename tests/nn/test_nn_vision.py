"""Images as sequences (DETR): 1x1 conv, flatten, 2-D sine positions, the encoder."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.nn.vision import ImageEncoder, ImageToSequence, sine_position_encoding_2d


def test_feature_map_becomes_a_sequence():
    m = ImageToSequence(in_channels=6, num_hiddens=16)
    feats = torch.randn(2, 6, 3, 5)
    tokens, pos, kpm = m(feats)
    assert tokens.shape == pos.shape == (2, 15, 16) and kpm is None
    # row-major flattening: token y * W + x is the 1x1 conv of pixel (y, x)
    conv = m.input_proj
    pixel = conv.weight[:, :, 0, 0] @ feats[1, :, 2, 4] + conv.bias
    torch.testing.assert_close(tokens[1, 2 * 5 + 4], pixel)


def test_sine_encoding_2d_structure():
    mask = torch.zeros(1, 3, 4, dtype=torch.bool)
    pos = sine_position_encoding_2d(mask, 8, normalize=False).view(1, 3, 4, 8)
    # the first half depends on the row only, the second on the column only
    assert torch.allclose(pos[0, :, 0, :4], pos[0, :, 3, :4])
    assert torch.allclose(pos[0, 0, :, 4:], pos[0, 2, :, 4:])
    # channel pairs (sin, cos) of the 1-based position over temperature ** (2j / (D/2))
    y = 2.0  # row 1 -> position 2
    expected = [math.sin(y), math.cos(y), math.sin(y / 100), math.cos(y / 100)]
    torch.testing.assert_close(pos[0, 1, 0, :4], torch.tensor(expected))
    # normalised: the last row and column map to `scale`
    posn = sine_position_encoding_2d(mask, 8).view(1, 3, 4, 8)
    torch.testing.assert_close(
        posn[0, 2, 0, 0], torch.tensor(math.sin(2 * math.pi)), atol=1e-4, rtol=0
    )


def test_padding_does_not_shift_the_image():
    """A padded image's valid pixels get the encoding of the unpadded image."""
    small = sine_position_encoding_2d(torch.zeros(1, 3, 4, dtype=torch.bool), 16)
    mask = torch.zeros(1, 5, 6, dtype=torch.bool)
    mask[:, 3:, :] = True
    mask[:, :, 4:] = True
    big = sine_position_encoding_2d(mask, 16).view(1, 5, 6, 16)
    torch.testing.assert_close(big[:, :3, :4].reshape(1, 12, 16), small)


def test_image_encoder_shapes_masks_and_weights():
    enc = ImageEncoder(
        in_channels=6, num_hiddens=16, ffn_num_hiddens=32, num_heads=4, num_blks=2, dropout=0.1
    ).eval()
    feats = torch.randn(2, 6, 3, 4)
    assert enc(feats).shape == (2, 12, 16)
    mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    mask[1, :, 2:] = True
    out = enc(feats, mask, need_weights=True)
    w = enc.attention_weights
    assert [x.shape for x in w] == [(2, 4, 12, 12)] * 2
    assert torch.all(w[0][1].view(4, 12, 3, 4)[..., 2:] == 0)  # padded pixels get no attention
    # the padded pixels' features do not matter
    feats2 = feats.clone()
    feats2[1, :, :, 2:] = torch.randn(6, 3, 2)
    torch.testing.assert_close(
        enc(feats2, mask).view(2, 3, 4, 16)[1, :, :2], out.view(2, 3, 4, 16)[1, :, :2]
    )


@pytest.mark.parametrize(
    ("make", "arg"),
    [
        (lambda: ImageToSequence(0, 16), "in_channels"),
        (lambda: ImageToSequence(3, 18), "num_hiddens"),
        (lambda: ImageEncoder(3, 16, 32, 4, 0, 0.1), "num_blks"),
        (lambda: ImageEncoder(3, 16, 32, 4, 1, 2.0), "dropout"),
    ],
)
def test_constructor_errors_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_forward_errors():
    m = ImageToSequence(3, 8)
    with pytest.raises(ValueError, match=r"features: expected a tensor \(B, 3, Hi, Wi\)"):
        m(torch.zeros(1, 4, 2, 2))
    with pytest.raises(ValueError, match="mask"):
        m(torch.zeros(1, 3, 2, 2), torch.zeros(1, 2, 2))
