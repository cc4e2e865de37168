"""The seeds' modules: the book's (d2l) attention modules and ViT's fused-qkv attention."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import math
import sys
import types

import pytest
import torch
from torch import nn

from qkv import functional as qf
from qkv.nn import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    MultiHeadSelfAttention,
)


def book_values():
    return torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)


def test_additive_attention_book_example():
    queries, keys = torch.normal(0, 1, (2, 1, 20)), torch.ones((2, 10, 2))
    valid_lens = torch.tensor([2, 6])
    attention = AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)
    attention.eval()
    out = attention(queries, keys, book_values(), valid_lens)
    torch.testing.assert_close(out, torch.tensor([[[2.0, 3, 4, 5]], [[10.0, 11, 12, 13]]]))
    w = attention.attention_weights
    assert w.shape == (2, 1, 10)
    torch.testing.assert_close(w[0, 0, :2], torch.full((2,), 0.5))
    assert sorted(k for k in attention.state_dict()) == ["W_k.weight", "W_q.weight", "w_v.weight"]


def test_dot_product_attention_book_example():
    queries, keys = torch.normal(0, 1, (2, 1, 2)), torch.ones((2, 10, 2))
    attention = DotProductAttention(dropout=0.5)
    attention.eval()
    out = attention(queries, keys, book_values(), torch.tensor([2, 6]))
    torch.testing.assert_close(out, torch.tensor([[[2.0, 3, 4, 5]], [[10.0, 11, 12, 13]]]))
    assert attention.attention_weights.shape == (2, 1, 10)
    attention(queries, keys, book_values(), need_weights=False)
    assert attention.attention_weights is None


def book_additive_reference(m: AdditiveAttention, q, k, v, valid_lens):
    """The book's AdditiveAttention.forward, written from its formula in float64."""
    qp, kp = m.W_q(q).double(), m.W_k(k).double()
    features = torch.tanh(qp.unsqueeze(2) + kp.unsqueeze(1))
    scores = m.w_v(features.float()).squeeze(-1).double()
    mask = torch.arange(k.shape[1])[None, None, :] < valid_lens[:, None, None]
    scores = scores.masked_fill(~mask, -1e6)
    return torch.softmax(scores, -1) @ v.double()


def test_additive_attention_matches_book_formula_random():
    for _ in range(5):
        B, Lq, Lk = 3, 4, 7
        m = AdditiveAttention(key_size=5, query_size=3, num_hiddens=6).eval()
        q, k, v = torch.randn(B, Lq, 3), torch.randn(B, Lk, 5), torch.randn(B, Lk, 2)
        vl = torch.randint(1, Lk + 1, (B,))
        torch.testing.assert_close(
            m(q, k, v, vl).double(), book_additive_reference(m, q, k, v, vl), rtol=1e-5, atol=1e-5
        )


def book_mha_reference(m: MultiHeadAttention, q, k, v, valid_lens):
    """The book's MultiHeadAttention (transpose_qkv, repeated valid_lens, masked_softmax)."""
    H = m.num_heads

    def transpose_qkv(X):
        X = X.reshape(X.shape[0], X.shape[1], H, -1).permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    Q, K, V = (transpose_qkv(f(x)).double() for f, x in ((m.W_q, q), (m.W_k, k), (m.W_v, v)))
    vl = torch.repeat_interleave(valid_lens, repeats=H, dim=0)
    scores = Q @ K.transpose(1, 2) / math.sqrt(Q.shape[-1])
    mask = torch.arange(K.shape[1])[None, None, :] < vl[:, None, None]
    w = torch.softmax(scores.masked_fill(~mask, -1e6), -1)
    out = w @ V
    out = out.reshape(-1, H, out.shape[1], out.shape[2]).permute(0, 2, 1, 3)
    out = out.reshape(out.shape[0], out.shape[1], -1)
    return m.W_o(out.float()).double()


def test_multihead_attention_book_example_and_formula():
    num_hiddens, num_heads = 100, 5
    attention = MultiHeadAttention(num_hiddens, num_heads, 0.5)
    attention.eval()
    batch_size, num_queries, num_kvpairs = 2, 4, 6
    valid_lens = torch.tensor([3, 2])
    X = torch.ones((batch_size, num_queries, num_hiddens))
    Y = torch.ones((batch_size, num_kvpairs, num_hiddens))
    assert attention(X, Y, Y, valid_lens).shape == (batch_size, num_queries, num_hiddens)
    X, Y = torch.randn_like(X), torch.randn_like(Y)
    torch.testing.assert_close(
        attention(X, Y, Y, valid_lens).double(),
        book_mha_reference(attention, X, Y, Y, valid_lens),
        rtol=1e-5,
        atol=1e-5,
    )
    attention(X, Y, Y, valid_lens, need_weights=True)
    assert attention.attention_weights.shape == (2, 5, 4, 6)
    assert sorted(attention.state_dict()) == [
        "W_k.weight",
        "W_o.weight",
        "W_q.weight",
        "W_v.weight",
    ]


class Seed002Attention(nn.Module):
    """Seed 002's ViT attention as the seed prints it (the module whose weights must load)."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        x = (self.attn_drop(attn) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_vit_attention_loads_seed002_weights(qkv_bias):
    seed = Seed002Attention(48, num_heads=6, qkv_bias=qkv_bias).eval()
    ours = MultiHeadSelfAttention(48, num_heads=6, qkv_bias=qkv_bias).eval()
    ours.load_state_dict(seed.state_dict())
    seed.load_state_dict(ours.state_dict())
    x = torch.randn(3, 13, 48)
    torch.testing.assert_close(ours(x), seed(x), rtol=1e-5, atol=1e-5)


def test_vit_attention_masks():
    m = MultiHeadSelfAttention(32, num_heads=4, qkv_bias=True).eval()
    x = torch.randn(2, 6, 32)
    a = m(x, valid_lens=torch.tensor([4, 6]))
    kpm = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    torch.testing.assert_close(a, m(x, key_padding_mask=kpm))
    # padded positions do not influence the others
    x2 = x.clone()
    x2[0, 4:] = torch.randn(2, 32)
    torch.testing.assert_close(m(x2, key_padding_mask=kpm)[0, :4], a[0, :4])
    c = m(x, is_causal=True)
    torch.testing.assert_close(c[:, :3], m(x[:, :3], is_causal=True), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(c[:, :3], m(x[:, :3]))


class _AnyModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyMeta(name, (), {})


class _AnyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return name


class _StubTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """timm imports torchvision at import time; PyPI's torchvision does not load beside this
    torch, and timm's attention layer does not use it, so a permissive stub stands in."""

    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _AnyModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


@pytest.fixture(scope="module")
def timm_attention():
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules.pop("torchvision", None)
        sys.meta_path.insert(0, _StubTorchvision())
    try:
        timm_layers = importlib.import_module("timm.layers")
    except ImportError as e:
        pytest.skip(f"timm is not installed (make test installs it): {e}")
    return timm_layers.Attention


@pytest.mark.parametrize("qkv_bias,qk_norm", [(False, False), (True, False), (True, True)])
def test_vit_attention_matches_timm(timm_attention, qkv_bias, qk_norm):
    ref = timm_attention(
        64, num_heads=4, qkv_bias=qkv_bias, qk_norm=qk_norm, norm_layer=nn.LayerNorm
    ).eval()
    ours = MultiHeadSelfAttention(64, num_heads=4, qkv_bias=qkv_bias, qk_norm=qk_norm).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.2)
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 11, 64)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def alibi(s, b, h, i, j):
    return s - 0.2 * (h + 1) * (i - j).abs()


def heads(x, H):
    """``(B, L, H*d) -> (B, H, L, d)``."""
    return x.unflatten(-1, (H, -1)).transpose(1, 2)


def randomize(m: nn.Module, g: torch.Generator) -> nn.Module:
    """Every parameter drawn at random (zero biases and unit norms would hide mistakes)."""
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return m


@pytest.mark.parametrize("scale", [None, 0.37])
@pytest.mark.parametrize("score", [*qf.SCORES, alibi], ids=[*qf.SCORES, "score_mod"])
def test_every_module_takes_every_score(score, scale):
    """Each module's output is qkv.functional.attention(..., score=, scale=) on its own projected
    queries, keys and values, computed here from its weights (float64, odd sizes)."""
    g = torch.Generator().manual_seed(0)
    B, Lq, Lk, H, d = 3, 5, 7, 3, 5
    D = H * d
    vl = torch.tensor([3, 7, 1])
    kw = {"score": score, "scale": scale}

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def attend(q, k, v, **masks):
        return qf.attention(q, k, v, **kw, **masks, need_weights=True)

    # the book's DotProductAttention: no projection
    m = DotProductAttention(**kw).eval()
    q, k, v = rand(B, Lq, d), rand(B, Lk, d), rand(B, Lk, 4)
    out, w = attend(q, k, v, valid_lens=vl)
    torch.testing.assert_close(m(q, k, v, vl), out)
    torch.testing.assert_close(m.attention_weights, w)

    # the book's MultiHeadAttention: W_q, W_k, W_v, W_o
    m = randomize(MultiHeadAttention(D, H, bias=True, **kw).double().eval(), g)
    X, Y = rand(B, Lq, D), rand(B, Lk, D)
    out, w = attend(heads(m.W_q(X), H), heads(m.W_k(Y), H), heads(m.W_v(Y), H), valid_lens=vl)
    torch.testing.assert_close(m(X, Y, Y, vl), m.W_o(out.transpose(1, 2).flatten(2)))
    m(X, Y, Y, vl, need_weights=True)
    torch.testing.assert_close(m.attention_weights, w)

    # ViT's MultiHeadSelfAttention: fused qkv, per-head LayerNorms, proj
    m = MultiHeadSelfAttention(D, H, qkv_bias=True, qk_norm=True, **kw).double().eval()
    m = randomize(m, g)
    q, k, v = m.qkv(Y).view(B, Lk, 3, H, d).permute(2, 0, 3, 1, 4)  # (B, H, Lk, d) each
    out, _ = attend(m.q_norm(q), m.k_norm(k), v, valid_lens=vl)
    torch.testing.assert_close(m(Y, valid_lens=vl), m.proj(out.transpose(1, 2).reshape(B, Lk, D)))


@pytest.mark.parametrize(
    "ctor,msg",
    [
        (lambda: AdditiveAttention(0, 2, 8), "key_size: expected a positive int"),
        (lambda: AdditiveAttention(2, 2, 8, dropout=1.5), "dropout: expected a probability"),
        (lambda: DotProductAttention(-0.1), "dropout: expected a probability"),
        (lambda: MultiHeadAttention(10, 4), "num_hiddens: expected a multiple of num_heads=4"),
        (lambda: MultiHeadSelfAttention(10, 3), "dim: expected a multiple of num_heads=3"),
        (lambda: MultiHeadSelfAttention(12, 3, attn_drop=1), "attn_drop: expected a probability"),
        (lambda: MultiHeadSelfAttention(12, 3, scale=0.0), "scale: expected a positive"),
    ],
)
def test_constructor_errors(ctor, msg):
    with pytest.raises(ValueError, match=msg):
        ctor()


def test_forward_errors():
    m = AdditiveAttention(2, 20, 8)
    with pytest.raises(ValueError, match="queries: expected last dimension 20"):
        m(torch.randn(2, 1, 19), torch.ones(2, 10, 2), book_values())
    with pytest.raises(ValueError, match="x: expected a 3-D tensor"):
        MultiHeadSelfAttention(12, 3)(torch.randn(12))


def test_additive_attention_reuses_projected_keys():
    m = AdditiveAttention(key_size=5, query_size=3, num_hiddens=6).eval()
    q, k, v = torch.randn(2, 4, 3), torch.randn(2, 7, 5), torch.randn(2, 7, 2)
    vl = torch.tensor([3, 7])
    keys = m.project_keys(k)
    torch.testing.assert_close(m(q, k, v, vl, projected_keys=keys), m(q, k, v, vl))
    with pytest.raises(ValueError, match="projected_keys: expected last dimension 6"):
        m(q, k, v, vl, projected_keys=k)


def test_bahdanau_decoder_projects_the_source_once():
    from qkv.nn import Seq2SeqAttentionDecoder, Seq2SeqEncoder

    enc = Seq2SeqEncoder(11, 8, 16, 2).eval()
    dec = Seq2SeqAttentionDecoder(13, 8, 16, 2).eval()
    src, vl = torch.randint(0, 11, (3, 6)), torch.tensor([6, 4, 2])
    state = dec.init_state(enc(src, vl), vl)
    calls = []
    dec.attention.W_k.register_forward_hook(lambda *a: calls.append(1))
    tgt = torch.randint(0, 13, (3, 5))
    full, _ = dec(tgt, state)
    assert len(calls) == 1  # once for 5 steps
    step_state, outs = state, []
    for t in range(5):  # incremental decoding: the projection rides in the state
        logits, step_state = dec(tgt[:, t : t + 1], step_state)
        outs.append(logits)
    assert len(calls) == 2 and step_state.enc_keys is not None
    torch.testing.assert_close(torch.cat(outs, 1), full)
