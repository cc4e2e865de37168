"""A forced backend keeps the memory budget: refused with the sizes and the way out, before
anything is allocated (``backend="auto"`` picks the chunked backend instead)."""

from __future__ import annotations

import sys

import pytest
import torch

from qkv import functional as qf

attention_module = sys.modules["qkv.functional.attention"]

B, H, L, D = 2, 3, 64, 8
# the reference backend holds the scores and the weights: float32, no gradient
NEED = B * H * L * L * 4 * 2


@pytest.fixture
def no_backend_runs(monkeypatch):
    """Fail if a backend starts: a refusal must come before any allocation."""

    def boom(*args, **kwargs):
        raise AssertionError("a backend ran although the call was over the budget")

    for name in ("_reference", "_fused", "run_chunked"):
        monkeypatch.setattr(attention_module, name, boom)


def qkv_tensors(L=L):
    return [torch.randn(B, H, L, D) for _ in range(3)]


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("entry", ["attention", "explain"])
def test_forced_reference_over_the_budget_is_refused_before_allocating(
    entry, need_weights, no_backend_runs
):
    q, k, v = qkv_tensors()
    call = qf.attention if entry == "attention" else qf.explain
    with pytest.raises(qf.AttentionMemoryError) as e:
        call(q, k, v, need_weights=need_weights, backend="reference", memory_budget=NEED // 2)
    msg = str(e.value)
    assert "\n" not in msg
    assert "backend: 'reference'" in msg and f"{B}x{H}x{L}x{L}" in msg
    assert "about 192.0 KiB" in msg and "budget of 96.0 KiB" in msg
    assert "memory_budget=" in msg and "set_memory_budget" in msg


def test_forced_reference_within_the_budget_runs():
    q, k, v = qkv_tensors()
    out, w = qf.attention(q, k, v, need_weights=True, backend="reference", memory_budget=NEED)
    assert w.shape == (B, H, L, L)
    ref, _ = qf.attention(q, k, v, backend="chunked", memory_budget=1)  # O(L): no budget
    torch.testing.assert_close(out, ref)


def test_the_global_budget_guards_forced_backends_too(no_backend_runs):
    q, k, v = qkv_tensors()
    old = qf.set_memory_budget(NEED - 1)
    try:
        with pytest.raises(qf.AttentionMemoryError, match="over the memory budget"):
            qf.attention(q, k, v, backend="reference")
        # auto picks the chunked backend instead of refusing
        assert qf.explain(q, k, v, score="normalized").backend == "chunked"
    finally:
        qf.set_memory_budget(old)


def test_forced_fused_refuses_a_mask_over_the_budget(no_backend_runs):
    q, k, v = qkv_tensors()
    per_query = (torch.arange(L) // 2 + 1).expand(B, L)  # a mask SDPA would need built
    mask_bytes = L * L * (1 + 4)  # the bool mask and the float one the kernel makes of it
    with pytest.raises(qf.AttentionMemoryError, match="'fused' would materialise the mask"):
        qf.attention(q, k, v, valid_lens=per_query, backend="fused", memory_budget=mask_bytes - 1)
    c = qf.explain(q, k, v, valid_lens=per_query, backend="fused", memory_budget=mask_bytes)
    assert c.backend == "fused"
    # the causal flag needs no mask built: nothing to refuse
    assert qf.explain(q, k, v, is_causal=True, backend="fused", memory_budget=1).backend == "fused"


def test_additive_attention_forced_reference_keeps_the_budget(no_backend_runs):
    q = k = v = torch.randn(2, 64, 8)
    w_v = torch.randn(8)
    # the scores and the weights, and tanh(q + k) twice (2*64*64*8 each)
    need = 2 * 64 * 64 * 4 * (2 + 2 * 8)
    with pytest.raises(qf.AttentionMemoryError, match="backend: 'reference' would materialise"):
        qf.additive_attention(q, k, v, w_v, backend="reference", memory_budget=need - 1)


def test_the_forty_gigabyte_call_is_refused_without_allocating(no_backend_runs):
    big = torch.zeros(1, 1, 1, 8).expand(1, 1, 100_000, 8)  # 100,000 positions, no storage
    with pytest.raises(qf.AttentionMemoryError, match=r"1x1x100000x100000 .* about 74\.5 GiB"):
        qf.attention(big, big, big, need_weights=True, backend="reference")
