"""The modules' ``window=`` (a causal sliding window), and the modules exported as torch's own
``MultiheadAttention`` exports: ``torch.export``, ONNX through it, ``torch.compile`` of a
training step without a graph break in attention."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from qkv.nn import (
    DotProductAttention,
    MultiHeadAttention,
    MultiheadAttention,
    MultiHeadSelfAttention,
)


def _window_reference(q, k, v, window):
    """float64 softmax attention with query i seeing keys i - window < j <= i: (B, H, L, d)."""
    q, k, v = q.double(), k.double(), v.double()
    L = q.shape[-2]
    i = torch.arange(L).view(-1, 1)
    j = torch.arange(k.shape[-2]).view(1, -1)
    blocked = (j > i) | (j <= i - window)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s.masked_fill(blocked, -math.inf).softmax(-1) @ v


@pytest.mark.parametrize("window", [1, 3, 50])
def test_every_module_takes_a_window_and_applies_it(window):
    torch.manual_seed(window)
    B, L, D, H = 2, 11, 12, 3
    x = torch.randn(B, L, D)
    mha = MultiheadAttention(D, H, batch_first=True, bias=False).eval()
    out, _ = mha(x, x, x, need_weights=False, window=window)
    w_q, w_k, w_v = mha.in_proj_weight.double().chunk(3)
    heads = lambda t: t.view(B, L, H, D // H).transpose(1, 2)  # noqa: E731
    xd = x.double()
    ref = _window_reference(heads(xd @ w_q.T), heads(xd @ w_k.T), heads(xd @ w_v.T), window)
    ref = ref.transpose(1, 2).reshape(B, L, D) @ mha.out_proj.weight.double().T
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)

    book = MultiHeadAttention(D, H).eval()
    y = book(x, x, x, window=window)
    heads_b = lambda t: t.view(B, L, H, D // H).transpose(1, 2)  # noqa: E731
    ref_b = _window_reference(
        heads_b(xd @ book.W_q.weight.double().T),
        heads_b(xd @ book.W_k.weight.double().T),
        heads_b(xd @ book.W_v.weight.double().T),
        window,
    )
    ref_b = ref_b.transpose(1, 2).reshape(B, L, D) @ book.W_o.weight.double().T
    torch.testing.assert_close(y.double(), ref_b, atol=1e-5, rtol=1e-5)

    dot = DotProductAttention()
    q, k, v = torch.randn(3, B, L, 5).unbind(0)
    got = dot(q, k, v, window=window, need_weights=True)
    torch.testing.assert_close(
        got.double(), _window_reference(q, k, v, window).float().double(), atol=1e-5, rtol=1e-5
    )
    w = dot.attention_weights  # (B, L, L): query 5 gives nothing to keys outside its window
    assert w[:, 5, 6:].abs().max() == 0 and w[:, 5, : max(0, 5 - window + 1)].abs().sum() == 0

    vit = MultiHeadSelfAttention(D, H).eval()
    a = vit(x, window=window)
    b = vit(x, attn_mask=_blocked(L, window))
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def _blocked(L, window):
    i, j = torch.arange(L).view(-1, 1), torch.arange(L).view(1, -1)
    return (j > i) | (j <= i - window)


def test_window_with_appended_keys_is_refused_by_name():
    mha = MultiheadAttention(8, 2, add_zero_attn=True, batch_first=True)
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="window"):
        mha(x, x, x, window=2)
    with pytest.raises((TypeError, ValueError), match="window"):
        MultiheadAttention(8, 2, batch_first=True)(x, x, x, window=0)


# ---------------------------------------------------------------------------- export
class _Wrap(torch.nn.Module):
    def __init__(self, mha, need_weights: bool) -> None:
        super().__init__()
        self.mha, self.need_weights = mha, need_weights

    def forward(self, x, kpm=None):
        out, w = self.mha(x, x, x, key_padding_mask=kpm, need_weights=self.need_weights)
        return (out, w) if self.need_weights else out


def _inputs(padding: bool):
    torch.manual_seed(3)
    x = torch.randn(3, 7, 16)
    if not padding:
        return (x,)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 4:] = True
    kpm[2, 6:] = True
    return (x, kpm)


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("cls", ["qkv", "torch"])
def test_torch_export_of_multihead_attention_equals_eager_as_torch_does(cls, need_weights, padding):
    torch.manual_seed(0)
    make = MultiheadAttention if cls == "qkv" else torch.nn.MultiheadAttention
    mod = _Wrap(make(16, 4, batch_first=True).eval(), need_weights)
    args = _inputs(padding)
    ep = torch.export.export(mod, args)
    got, want = ep.module()(*args), mod(*args)
    for g, w in zip(got if need_weights else (got,), want if need_weights else (want,)):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
    # the graph holds no host read-back of mask values: other inputs give their own outputs
    other = tuple(a.clone() for a in args)
    other[0].normal_()
    if padding:
        other[1][0, 2:] = True
    again = ep.module()(*other)
    torch.testing.assert_close(
        again[0] if need_weights else again,
        mod(*other)[0] if need_weights else mod(*other),
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("need_weights", [False, True])
def test_onnx_export_of_multihead_attention_runs_in_onnxruntime(need_weights, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    torch.manual_seed(1)
    mod = _Wrap(MultiheadAttention(16, 4, batch_first=True).eval(), need_weights)
    args = _inputs(True)
    path = tmp_path / "mha.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(mod, args, str(path), dynamo=True, verbose=False)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    outs = sess.run(None, feeds)
    want = mod(*args)
    want = want if need_weights else (want,)
    for o, w in zip(outs, want):
        torch.testing.assert_close(torch.from_numpy(o), w.detach(), atol=1e-5, rtol=1e-4)


def test_a_compiled_training_step_has_no_graph_break_in_attention():
    torch.manual_seed(2)
    mha = MultiheadAttention(16, 4, batch_first=True, dropout=0.1)
    x, kpm = _inputs(True)

    def step(x, kpm):
        out, _ = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
        return out.square().mean()

    explained = torch._dynamo.explain(step)(x, kpm)
    assert explained.graph_break_count == 0, explained.break_reasons
