"""The Transformer encoder's packed path (``skip_padding=True`` in inference) gives what its
general path gives at every valid position, with padding, a source of length 0, pre-norm, rotary
positions and biases (quantized layers keep the general path); padded positions are 0; a NaN
reaches its own sentence only; it is taken only when asked (decoding asks) in inference."""

from __future__ import annotations

import pytest
import torch

from qkv.decoding import generate
from qkv.inference import quantize_model
from qkv.nn.seq2seq import build_model
from qkv.nn.transformer import TransformerEncoder

V = 40


def _encoder(dtype=torch.float64, **kw) -> TransformerEncoder:
    torch.manual_seed(0)
    use_bias = kw.pop("use_bias", False)
    return TransformerEncoder(V, 24, 40, 4, 2, 0.0, use_bias, **kw).to(dtype).eval()


def _batch(B: int = 5, L: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, L + 1, (B,), generator=g)
    lens[0], lens[2] = L, 0  # one unpadded row, one with no token
    X = torch.randint(3, V, (B, L), generator=g)
    X[torch.arange(L) >= lens[:, None]] = 0
    return X, lens


def _both(enc: TransformerEncoder, X, lens) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return enc(X, lens, skip_padding=True), enc(X, lens)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"norm_first": True},
        {"pos_encoding": "rotary"},
        {"use_bias": True, "activation": "gelu", "pos_encoding": "learned"},
        {"use_bias": True, "activation": "swish", "scale_embedding": False},
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_path_equals_the_general_path_at_valid_positions(kw, dtype):
    enc = _encoder(dtype, **kw)
    for seed in range(2):
        X, lens = _batch(seed=seed)
        fast, slow = _both(enc, X, lens)
        valid = torch.arange(X.shape[1]) < lens[:, None]
        tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}
        torch.testing.assert_close(fast[valid], slow[valid], **tol)
        assert (fast[~valid] == 0).all()


def test_without_lengths_every_position_is_valid():
    enc = _encoder()
    X, _ = _batch()
    fast, slow = _both(enc, X, None)
    torch.testing.assert_close(fast, slow)


def test_quantized_layers_keep_the_general_path():
    """A dynamically quantized layer scales its input by the range of all its rows, padding
    included: the encoder then runs on the padded batch, as before."""
    enc = quantize_model(_encoder(torch.float32), "int8")
    X, lens = _batch(seed=3)
    calls = []
    packed = enc._forward_packed
    enc._forward_packed = lambda *a: calls.append(1) or packed(*a)
    with torch.inference_mode():
        enc(X, lens, skip_padding=True)
    assert calls == []


def test_a_nan_reaches_its_own_sentence_only():
    enc = _encoder()
    X, lens = _batch(seed=4)
    X[1, 0] = 1
    with torch.no_grad():
        enc.embedding.weight[1, 3] = float("nan")  # token 1: in sentence 1 only
    fast, slow = _both(enc, X, lens)
    assert torch.isnan(fast[1, : lens[1]]).all() and torch.isnan(slow[1, : lens[1]]).all()
    others = torch.tensor([0, 3, 4])
    valid = torch.arange(X.shape[1]) < lens[others, None]
    torch.testing.assert_close(fast[others][valid], slow[others][valid])


def test_packed_path_is_taken_only_when_asked_in_inference():
    enc = _encoder()
    X, lens = _batch()
    calls = []
    packed = enc._forward_packed
    enc._forward_packed = lambda *a: calls.append(1) or packed(*a)
    enc(X, lens, skip_padding=True)  # autograd on: the general path
    with torch.no_grad():
        enc(X, lens)  # not asked: every position computed (training, exports)
        enc(X, lens, need_weights=True, skip_padding=True)  # weights asked for
        enc(X, lens.tolist(), skip_padding=True)  # lengths not a tensor
        enc.train()
        enc(X, lens, skip_padding=True)  # training mode
        enc.eval()
        assert calls == []
        enc(X, lens, skip_padding=True)
    assert calls == [1]


def test_decoding_asks_for_it_through_encode():
    model = build_model(
        dict(
            src_vocab_size=V,
            tgt_vocab_size=V,
            num_hiddens=16,
            num_heads=2,
            ffn_num_hiddens=24,
            num_enc_layers=1,
            num_dec_layers=1,
        )
    ).eval()
    calls = []
    packed = model.encoder._forward_packed
    model.encoder._forward_packed = lambda *a: calls.append(1) or packed(*a)
    X, lens = _batch()
    generate(model, X, lens, max_output_len=3, bos_id=1, eos_id=2)
    assert calls == [1]
