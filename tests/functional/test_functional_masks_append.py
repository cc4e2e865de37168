"""append_visible_keys: a call's masks rewritten for keys appended that every query sees
(torch's add_bias_kv / add_zero_attn), lengths folded into bool masks."""

from __future__ import annotations

import pytest
import torch

from qkv.functional.masks import append_visible_keys

CPU = torch.device("cpu")
SIZES = dict(B=2, H=3, Lq=3, Lk=4, device=CPU)


def test_lengths_become_a_padding_mask_and_the_extra_keys_stay_visible():
    kpm, am = append_visible_keys(2, valid_lens=torch.tensor([2, 4]), **SIZES)
    assert am is None
    assert kpm.tolist() == [[False, False, True, True, False, False], [False] * 6]
    # merged into a float padding mask: -inf where the lengths hide a key
    given = torch.full((2, 4), 0.5)
    kpm, _ = append_visible_keys(1, valid_lens=[2, 4], key_padding_mask=given, **SIZES)
    inf = float("-inf")
    assert kpm.tolist() == [[0.5, 0.5, inf, inf, 0.0], [0.5, 0.5, 0.5, 0.5, 0.0]]


def test_lengths_per_query_go_into_the_attn_mask():
    lens = torch.tensor([[1, 2, 3], [4, 4, 2]])
    given = torch.zeros(3, 4)  # (Lq, Lk), float
    kpm, am = append_visible_keys(2, valid_lens=lens, attn_mask=given, **SIZES)
    assert kpm is None and am.shape == (2, 3, 3, 6)
    hidden = torch.arange(6) >= lens[:, None, :, None]  # (B, 1, Lq, 6)
    hidden[..., 4:] = False
    assert torch.equal(torch.isneginf(am), hidden.expand(2, 3, 3, 6))
    kpm, am = append_visible_keys(1, valid_lens=lens, **SIZES)  # no mask given: a bool one
    assert am.dtype == torch.bool and torch.equal(am, hidden[..., :5].expand(2, 3, 3, 5))


def test_masks_without_lengths_are_padded_and_checked():
    am = torch.rand(3, 4) < 0.5
    kpm, out = append_visible_keys(1, attn_mask=am, **SIZES)
    assert kpm is None and torch.equal(out, torch.cat([am, torch.zeros(3, 1, dtype=bool)], 1))
    with pytest.raises(
        ValueError, match=r"key_padding_mask: expected shape \(2, 4\), got \(2, 3\)"
    ):
        append_visible_keys(1, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool), **SIZES)
