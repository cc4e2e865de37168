"""The Transformer: the book's shapes and modules, causality, caching, pre-norm, tying."""

from __future__ import annotations

import pytest
import torch

from qkv.nn.kv_cache import KVCache
from qkv.nn.transformer import (
    AddNorm,
    PositionWiseFFN,
    TransformerDecoder,
    TransformerDecoderBlock,
    TransformerDecoderState,
    TransformerEncoder,
    TransformerEncoderBlock,
)


def test_book_examples_keep_shapes():
    """d2l 1.0's examples: no layer changes the shape of its input."""
    ffn = PositionWiseFFN(4, 8)
    ffn.eval()
    assert ffn(torch.ones((2, 3, 8))).shape == (2, 3, 8)
    add_norm = AddNorm(4, 0.5)
    assert add_norm(torch.ones((2, 3, 4)), torch.ones((2, 3, 4))).shape == (2, 3, 4)
    X = torch.ones((2, 100, 24))
    valid_lens = torch.tensor([3, 2])
    encoder_blk = TransformerEncoderBlock(24, 48, 8, 0.5)
    encoder_blk.eval()
    assert encoder_blk(X, valid_lens).shape == (2, 100, 24)
    encoder = TransformerEncoder(200, 24, 48, 8, 2, 0.5)
    encoder.eval()
    assert encoder(torch.ones((2, 100), dtype=torch.long), valid_lens).shape == (2, 100, 24)
    decoder_blk = TransformerDecoderBlock(24, 48, 8, 0.5, 0)
    decoder_blk.eval()
    state = TransformerDecoderState(encoder_blk(X, valid_lens), valid_lens)
    assert decoder_blk(X, state)[0].shape == (2, 100, 24)
    decoder = TransformerDecoder(200, 24, 48, 8, 2, 0.5).eval()
    logits, _ = decoder(torch.ones((2, 7), dtype=torch.long), decoder.init_state(X, valid_lens))
    assert logits.shape == (2, 7, 200)


def test_parameter_names_follow_the_book():
    enc_names = set(TransformerEncoder(10, 8, 16, 2, 1, 0.0).state_dict())
    assert {
        "embedding.weight",
        "blks.block0.attention.W_q.weight",
        "blks.block0.attention.W_o.weight",
        "blks.block0.addnorm1.ln.weight",
        "blks.block0.ffn.dense1.weight",
        "blks.block0.ffn.dense2.bias",
        "blks.block0.addnorm2.ln.bias",
    } <= enc_names
    dec_names = set(TransformerDecoder(10, 8, 16, 2, 1, 0.0).state_dict())
    assert {
        "blks.block0.attention1.W_k.weight",
        "blks.block0.attention2.W_v.weight",
        "blks.block0.addnorm3.ln.weight",
        "dense.weight",
        "dense.bias",
    } <= dec_names
    assert not any("bias" in n and "attention" in n for n in dec_names)  # book: no bias


def test_add_norm_post_and_pre():
    X, Y = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    post = AddNorm(4, 0.0)
    torch.testing.assert_close(post(X, Y), torch.nn.functional.layer_norm(X + Y, (4,)))
    pre = AddNorm(4, 0.0, norm_first=True)
    torch.testing.assert_close(pre(X, Y), X + Y)
    torch.testing.assert_close(pre.pre(X), torch.nn.functional.layer_norm(X, (4,)))
    torch.testing.assert_close(post.pre(X), X)


def test_encoder_ignores_padding():
    enc = TransformerEncoder(30, 16, 32, 4, 2, 0.0).eval()
    X = torch.randint(0, 30, (2, 6))
    vl = torch.tensor([4, 6])
    Y = X.clone()
    Y[0, 4:] = (X[0, 4:] + 1) % 30  # change only the padding of sentence 0
    torch.testing.assert_close(enc(X, vl)[0, :4], enc(Y, vl)[0, :4])
    torch.testing.assert_close(enc(X, vl)[0, :4], enc(X[:1, :4], vl[:1])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rotary"])
def test_decoder_is_causal_and_cache_matches_full_pass(norm_first, pos):
    torch.manual_seed(0)
    opts = dict(norm_first=norm_first, pos_encoding=pos)
    enc = TransformerEncoder(30, 16, 32, 4, 2, 0.0, **opts).eval()
    dec = TransformerDecoder(30, 16, 32, 4, 2, 0.0, **opts).eval()
    src, vl = torch.randint(0, 30, (3, 7)), torch.tensor([7, 2, 5])
    tgt = torch.randint(0, 30, (3, 6))
    E = enc(src, vl)
    full, _ = dec(tgt, dec.init_state(E, vl))
    # causal: later tokens do not change earlier logits
    tgt2 = tgt.clone()
    tgt2[:, 4:] = (tgt[:, 4:] + 3) % 30
    torch.testing.assert_close(dec(tgt2, dec.init_state(E, vl))[0][:, :4], full[:, :4])
    # one token at a time with the cache
    state = dec.init_state(E, vl, use_cache=True)
    steps = []
    for t in range(6):
        logits, state = dec(tgt[:, t : t + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert state.offset == 6
    # chunks of several tokens with the cache (bottom-right causal)
    state = dec.init_state(E, vl, use_cache=True, capacity=2)
    a, state = dec(tgt[:, :2], state)
    b, state = dec(tgt[:, 2:5], state)
    c, state = dec(tgt[:, 5:], state)
    torch.testing.assert_close(torch.cat([a, b, c], 1), full, rtol=1e-5, atol=1e-5)


def test_cross_attention_projected_once():
    dec = TransformerDecoder(30, 16, 32, 4, 2, 0.0).eval()
    E, vl = torch.randn(2, 5, 16), torch.tensor([5, 3])
    state = dec.init_state(E, vl, use_cache=True)
    calls = []
    hook = dec.blks.block0.attention2.W_k.register_forward_hook(lambda *a: calls.append(1))
    for t in range(4):
        _, state = dec(torch.full((2, 1), t), state)
    hook.remove()
    assert len(calls) == 1
    assert all(isinstance(c, KVCache) and c.static for c in state.cross_caches)
    assert state.cross_caches[0].keys.shape == (2, 4, 5, 4)


def test_training_mode_runs_backward_with_dropout():
    enc = TransformerEncoder(30, 16, 32, 4, 2, 0.2, norm_first=True)
    dec = TransformerDecoder(30, 16, 32, 4, 2, 0.2, norm_first=True, tie_embeddings=True)
    src, vl, tgt = (
        torch.randint(0, 30, (3, 7)),
        torch.tensor([7, 2, 5]),
        torch.randint(0, 30, (3, 4)),
    )
    logits, _ = dec(tgt, dec.init_state(enc(src, vl), vl))
    logits.logsumexp(-1).sum().backward()
    assert dec.dense.weight is dec.embedding.weight
    assert enc.embedding.weight.grad is not None and torch.isfinite(enc.embedding.weight.grad).all()


def test_attention_weights_only_on_request():
    enc = TransformerEncoder(30, 16, 32, 4, 2, 0.0).eval()
    dec = TransformerDecoder(30, 16, 32, 4, 3, 0.0).eval()
    src, vl, tgt = torch.randint(0, 30, (2, 7)), torch.tensor([7, 3]), torch.randint(0, 30, (2, 4))
    E = enc(src, vl)
    dec(tgt, dec.init_state(E, vl))
    assert enc.attention_weights is None and dec.attention_weights is None
    assert dec.blks.block0.attention1.attention_weights is None  # fused backend, no weights
    E = enc(src, vl, need_weights=True)
    dec(tgt, dec.init_state(E, vl), need_weights=True)
    assert [w.shape for w in enc.attention_weights] == [(2, 4, 7, 7)] * 2
    self_w, cross_w = dec.attention_weights
    assert [w.shape for w in self_w] == [(2, 4, 4, 4)] * 3
    assert [w.shape for w in cross_w] == [(2, 4, 4, 7)] * 3
    assert torch.all(self_w[0].triu(1) == 0)  # causal
    assert torch.all(cross_w[1][1, :, :, 3:] == 0)  # source padding
    torch.testing.assert_close(cross_w[0].sum(-1), torch.ones(2, 4, 4))


@pytest.mark.parametrize(
    ("make", "arg"),
    [
        (lambda: TransformerEncoder(0, 8, 16, 2, 1, 0.1), "vocab_size"),
        (lambda: TransformerEncoder(10, 9, 16, 2, 1, 0.1), "num_hiddens"),
        (lambda: TransformerEncoder(10, 8, 16, 2, 0, 0.1), "num_blks"),
        (lambda: TransformerEncoder(10, 8, 16, 2, 1, 1.0), "dropout"),
        (lambda: TransformerEncoder(10, 8, 16, 2, 1, 0.1, pos_encoding="abs"), "pos_encoding"),
        (lambda: TransformerDecoder(10, 8, 16, 2, 1, 0.1, activation="tanh"), "activation"),
        (lambda: TransformerDecoderBlock(8, 16, 2, 0.1, -1), "i"),
        (lambda: PositionWiseFFN(0, 8), "ffn_num_hiddens"),
        (lambda: AddNorm(0, 0.1), "norm_shape"),
    ],
)
def test_constructor_errors_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_forward_errors():
    enc = TransformerEncoder(10, 8, 16, 2, 1, 0.1)
    with pytest.raises(ValueError, match=r"X: expected token ids of shape \(B, L\)"):
        enc(torch.zeros(2, 3, 8, dtype=torch.long))
    dec = TransformerDecoder(10, 8, 16, 2, 1, 0.1)
    with pytest.raises(TypeError, match="state"):
        dec(torch.zeros(2, 3, dtype=torch.long), [torch.zeros(2, 3, 8), None, [None]])
    with pytest.raises(ValueError, match="enc_outputs"):
        dec.init_state(torch.zeros(2, 8))
