"""qkv.nn.MultiheadAttention is a drop-in for torch.nn.MultiheadAttention.

The parity test copies a torch module's state_dict into ours (and back) and compares outputs,
weights and gradients on hundreds of random configurations with every option randomised.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from qkv import functional as qf
from qkv.nn import MultiheadAttention

N_CONFIGS = 300


def draw(rng: random.Random) -> dict:
    H = rng.choice([1, 2, 3, 4, 5])
    E = H * rng.choice([1, 2, 3, 5, 7])
    cross_dims = rng.random() < 0.3
    return dict(
        embed_dim=E,
        num_heads=H,
        bias=rng.random() < 0.7,
        add_bias_kv=rng.random() < 0.3,
        add_zero_attn=rng.random() < 0.3,
        kdim=rng.choice([3, 6, 11]) if cross_dims else None,
        vdim=rng.choice([2, 5, 9]) if cross_dims else None,
        batch_first=rng.random() < 0.5,
        batched=rng.random() < 0.8,
        self_attn=not cross_dims and rng.random() < 0.5,
        B=rng.randint(1, 4),
        L=rng.randint(1, 9),
        S=rng.randint(1, 9),
        kpm=rng.choice([None, "bool", "float"]),
        attn_mask=rng.choice([None, "2d-bool", "2d-float", "3d-bool", "3d-float", "causal"]),
        need_weights=rng.random() < 0.6,
        average=rng.random() < 0.5,
        train=rng.random() < 0.3,
    )


def make_inputs(cfg: dict, g: torch.Generator):
    E, H, B, L = cfg["embed_dim"], cfg["num_heads"], cfg["B"], cfg["L"]
    S = L if cfg["self_attn"] else cfg["S"]
    kdim, vdim = cfg["kdim"] or E, cfg["vdim"] or E

    def seq(n, w):
        if not cfg["batched"]:
            return torch.randn(n, w, generator=g)
        return (
            torch.randn(B, n, w, generator=g)
            if cfg["batch_first"]
            else torch.randn(n, B, w, generator=g)
        )

    q = seq(L, E)
    if cfg["self_attn"]:
        k = v = q
    else:
        k, v = seq(S, kdim), seq(S, vdim)
    Bm = B if cfg["batched"] else 1
    kw: dict = {}
    # every query keeps key 0 visible, so torch returns no NaN (dead rows are tested apart)
    if cfg["kpm"]:
        m = torch.rand(Bm, S, generator=g) < 0.4
        m[:, 0] = False
        if cfg["kpm"] == "float":
            m = torch.randn(Bm, S, generator=g).masked_fill(m, float("-inf"))
        kw["key_padding_mask"] = m if cfg["batched"] else m[0]
    am = cfg["attn_mask"]
    if am == "causal":
        kw["attn_mask"] = torch.ones(L, S, dtype=torch.bool).triu(1)
        kw["is_causal"] = True
    elif am:
        shape = (L, S) if am.startswith("2d") else ((Bm * H, L, S) if cfg["batched"] else (H, L, S))
        m = torch.rand(*shape, generator=g) < 0.4
        m[..., 0] = False
        if am.endswith("float"):
            m = torch.randn(*shape, generator=g).masked_fill(m, float("-inf"))
        kw["attn_mask"] = m
    return q, k, v, kw


def modules(cfg: dict):
    ctor = {
        k: cfg[k]
        for k in (
            "embed_dim",
            "num_heads",
            "bias",
            "add_bias_kv",
            "add_zero_attn",
            "kdim",
            "vdim",
            "batch_first",
        )
    }
    ref = torch.nn.MultiheadAttention(**ctor)
    ours = MultiheadAttention(**ctor)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [
        (n, p.shape) for n, p in ref.named_parameters()
    ]
    ours.load_state_dict(ref.state_dict())
    with torch.no_grad():  # make biases non-zero so they are really compared
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref.load_state_dict(ours.state_dict())  # and back the other way
    return ref, ours


@pytest.mark.parametrize("chunk", range(6))
def test_parity_random_configs(chunk):
    rng = random.Random(1000 + chunk)
    g = torch.Generator().manual_seed(chunk)
    for i in range(N_CONFIGS // 6):
        cfg = draw(rng)
        ref, ours = modules(cfg)
        if cfg["train"]:
            ref.train(), ours.train()  # dropout stays 0: the randomness cannot be matched
        else:
            ref.eval(), ours.eval()
        q, k, v, kw = make_inputs(cfg, g)
        args = dict(need_weights=cfg["need_weights"], average_attn_weights=cfg["average"], **kw)
        out_r, w_r = ref(q, k, v, **args)
        out_o, w_o = ours(q, k, v, **args)
        where = f"config {chunk}/{i}: {cfg}"
        torch.testing.assert_close(
            out_o, out_r, rtol=1e-5, atol=1e-5, msg=lambda m, where=where: f"{m}\n{where}"
        )
        if cfg["need_weights"]:
            torch.testing.assert_close(
                w_o, w_r, rtol=1e-5, atol=1e-5, msg=lambda m, where=where: f"{m}\n{where}"
            )
        else:
            assert w_o is None and w_r is None
        if cfg["train"]:
            out_r.square().sum().backward()
            out_o.square().sum().backward()
            for (n, pr), po in zip(ref.named_parameters(), ours.parameters()):
                torch.testing.assert_close(
                    po.grad,
                    pr.grad,
                    rtol=1e-4,
                    atol=1e-5,
                    msg=lambda m, n=n, where=where: f"{n}: {m}\n{where}",
                )


def test_dead_rows_are_finite_where_torch_gives_nan():
    E, H = 8, 2
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    ours = MultiheadAttention(E, H, batch_first=True).eval()
    with torch.no_grad():
        ref.out_proj.bias.normal_()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, E)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True  # the second sentence is all padding
    out_r, _ = ref(x, x, x, key_padding_mask=kpm)
    out_o, w_o = ours(x, x, x, key_padding_mask=kpm)
    assert torch.isnan(out_r[1]).all()  # torch's behaviour, documented as our one difference
    assert torch.isfinite(out_o).all()
    torch.testing.assert_close(out_o[1], ours.out_proj.bias.expand(5, E))
    torch.testing.assert_close(out_o[0], out_r[0])
    assert torch.all(w_o[1] == 0)


def test_is_causal_without_mask_and_valid_lens():
    E, H, L = 12, 3, 6
    ours = MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.randn(2, L, E)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    a, _ = ours(x, x, x, is_causal=True, need_weights=False)
    b, _ = ours(x, x, x, attn_mask=causal)
    torch.testing.assert_close(a, b)
    kpm = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    c, wc = ours(x, x, x, key_padding_mask=kpm)
    d, wd = ours(x, x, x, valid_lens=torch.tensor([4, 6]))
    torch.testing.assert_close(c, d)
    torch.testing.assert_close(wc, wd)


def test_dropout_in_training_only():
    E, H = 16, 4
    m = MultiheadAttention(E, H, dropout=0.5, batch_first=True)
    x = torch.randn(2, 32, E)
    m.train()
    _, w = m(x, x, x, average_attn_weights=False)
    assert 0.35 < (w == 0).float().mean() < 0.65
    m.eval()
    _, w = m(x, x, x, average_attn_weights=False)
    assert (w == 0).float().mean() == 0


def alibi(s, b, h, i, j):
    return s - 0.2 * (h + 1) * (i - j).abs()


@pytest.mark.parametrize("scale", [None, 0.37])
@pytest.mark.parametrize("score", [*qf.SCORES, alibi], ids=[*qf.SCORES, "score_mod"])
def test_every_score_runs(score, scale):
    """The output and weights are qkv.functional.attention(..., score=, scale=) on the module's
    own projections, computed here from its weights (float64, odd sizes)."""
    g = torch.Generator().manual_seed(0)
    E, H, B, L, S = 15, 3, 3, 5, 7
    m = MultiheadAttention(E, H, batch_first=True, score=score, scale=scale).double().eval()
    with torch.no_grad():  # non-zero biases
        for p in (m.in_proj_bias, m.out_proj.bias):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.randn(B, L, E, generator=g, dtype=torch.float64)
    kv = torch.randn(B, S, E, generator=g, dtype=torch.float64)
    kpm = torch.rand(B, S, generator=g) < 0.3
    kpm[:, 0] = False
    out, w = m(x, kv, kv, key_padding_mask=kpm)

    def heads(t):  # (B, L, E) -> (B, H, L, E/H)
        return t.unflatten(-1, (H, -1)).transpose(1, 2)

    (Wq, Wk, Wv), (bq, bk, bv) = m.in_proj_weight.chunk(3), m.in_proj_bias.chunk(3)
    q, k, v = heads(F.linear(x, Wq, bq)), heads(F.linear(kv, Wk, bk)), heads(F.linear(kv, Wv, bv))
    o, weights = qf.attention(
        q, k, v, key_padding_mask=kpm, score=score, scale=scale, need_weights=True
    )
    torch.testing.assert_close(out, m.out_proj(o.transpose(1, 2).reshape(B, L, E)))
    torch.testing.assert_close(w, weights.mean(dim=1))
    torch.testing.assert_close(w.sum(-1), torch.ones(B, L, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        (dict(embed_dim=10, num_heads=3), "embed_dim: expected a multiple of num_heads=3"),
        (dict(embed_dim=0, num_heads=1), "embed_dim: expected a positive int"),
        (dict(embed_dim=8, num_heads=0), "num_heads: expected a positive int"),
        (
            dict(embed_dim=8, num_heads=2, dropout=1.0),
            r"dropout: expected a probability in \[0, 1\)",
        ),
        (dict(embed_dim=8, num_heads=2, kdim=-1), "kdim: expected a positive int"),
        (dict(embed_dim=8, num_heads=2, score="max"), "score: expected one of"),
    ],
)
def test_constructor_errors(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        MultiheadAttention(**kwargs)


def test_forward_errors_name_the_argument():
    m = MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="query: expected last dimension 8"):
        m(torch.randn(2, 5, 7), x, x)
    with pytest.raises(ValueError, match="query: expected a 3-D"):
        m(torch.randn(5, 8, 1, 1), x, x)
    with pytest.raises(ValueError, match=r"attn_mask: expected shape \(4, 5, 5\)"):
        m(x, x, x, attn_mask=torch.zeros(3, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask: expected shape \(2, 5\)"):
        m(x, x, x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask: expected a bool or float tensor"):
        m(x[0], x[0], x[0], key_padding_mask=[False] * 5)
    with pytest.raises(ValueError, match="key: expected batch size 2"):
        m(x, torch.randn(3, 5, 8), torch.randn(3, 5, 8))


@pytest.mark.parametrize("per_query", [False, True])
def test_valid_lens_leave_extra_keys_visible(per_query):
    m = MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True, batch_first=True).eval()
    x = torch.randn(2, 4, 8)
    if per_query:
        vl = torch.tensor([[1, 2, 3, 4], [4, 4, 2, 1]])
        am = torch.arange(4)[None, None, :] >= vl[:, :, None]  # (B, L, S)
        ref_out, ref_w = m(x, x, x, attn_mask=am.repeat_interleave(2, 0))
    else:
        vl = torch.tensor([2, 4])
        ref_out, ref_w = m(x, x, x, key_padding_mask=torch.arange(4) >= vl[:, None])
    out, w = m(x, x, x, valid_lens=vl)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    assert torch.all(w[..., 4:] > 0)  # bias_k and the zero key stay visible


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("self_attn", [False, True])
def test_shared_trailing_padding_is_not_projected(batch_first, self_attn):
    E, H, B, L = 16, 4, 3, 9
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first).eval()
    ours = MultiheadAttention(E, H, batch_first=batch_first).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(B, L, E) if batch_first else torch.randn(L, B, E)
    kv = x if self_attn else (torch.randn_like(x))
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[:, 6:] = True
    kpm[1, 2] = True
    am = torch.rand(L, L) < 0.2
    am[:, 0] = False
    for kw in ({}, {"attn_mask": am}):
        a, _ = ref(x, kv, kv, key_padding_mask=kpm, need_weights=False, **kw)
        b, _ = ours(x, kv, kv, key_padding_mask=kpm, need_weights=False, **kw)
        torch.testing.assert_close(b, a)
    c, _ = ours(x, kv, kv, valid_lens=torch.tensor([6, 5, 6]), need_weights=False)
    kpm2 = torch.arange(L)[None] >= torch.tensor([6, 5, 6])[:, None]
    torch.testing.assert_close(c, ref(x, kv, kv, key_padding_mask=kpm2, need_weights=False)[0])
