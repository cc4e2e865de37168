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


# -- issue 17: the guard everywhere: need_weights, forced backends, cgroup and ulimit limits --


@pytest.mark.parametrize("entry", ["attention", "explain"])
def test_need_weights_honours_the_memory_budget(entry, no_backend_runs):
    q, k, v = qkv_tensors()
    call = qf.attention if entry == "attention" else qf.explain
    with pytest.raises(qf.AttentionMemoryError) as e:
        call(q, k, v, need_weights=True, memory_budget=NEED // 2)
    msg = str(e.value)
    assert f"need_weights=True on {B}x{H}x{L}x{L} attention needs about 192.0 KiB" in msg
    assert "over the memory budget of 96.0 KiB" in msg
    assert "memory_budget=" in msg and "need_weights=False" in msg and "\n" not in msg
    old = qf.set_memory_budget(NEED - 1)  # the global budget too
    try:
        with pytest.raises(qf.AttentionMemoryError, match="over the memory budget"):
            call(q, k, v, need_weights=True)
    finally:
        qf.set_memory_budget(old)


def test_need_weights_within_the_budget_runs():
    q, k, v = qkv_tensors()
    _, w = qf.attention(q, k, v, need_weights=True, memory_budget=NEED)
    assert w.shape == (B, H, L, L)


def test_modules_asking_for_weights_keep_the_global_budget(no_backend_runs):
    from qkv import nn as qnn

    mha = qnn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 64, 16)
    old = qf.set_memory_budget(1024)
    try:
        with pytest.raises(qf.AttentionMemoryError, match="need_weights=True"):
            mha(x, x, x)  # torch's default: need_weights=True
    finally:
        qf.set_memory_budget(old)


@pytest.fixture
def little_memory(monkeypatch):
    """The device has 100 KiB available (any size is checked against it)."""
    monkeypatch.setattr(attention_module, "_available_memory", lambda device: 100 * 1024)
    monkeypatch.setattr(attention_module, "_CHECK_AVAILABLE_ABOVE", 0, raising=False)


def test_forced_reference_within_the_budget_but_over_the_memory_is_refused(
    little_memory, no_backend_runs
):
    q, k, v = qkv_tensors()  # needs 192 KiB
    with pytest.raises(qf.AttentionMemoryError) as e:
        qf.attention(q, k, v, backend="reference", memory_budget=1 << 30)
    msg = str(e.value)
    assert "backend: 'reference' would materialise" in msg and "about 192.0 KiB" in msg
    assert "more than the 100.0 KiB available on cpu" in msg and "ulimit -v" in msg
    with pytest.raises(qf.AttentionMemoryError, match=r"100\.0 KiB available"):
        qf.attention(q, k, v, need_weights=True, memory_budget=1 << 30)


def test_forced_fused_mask_over_the_memory_is_refused(little_memory, no_backend_runs):
    q, k, v = qkv_tensors(L=256)
    per_query = (torch.arange(256) // 2 + 1).expand(B, 256)  # a (B, L, L) mask to build
    with pytest.raises(qf.AttentionMemoryError, match="'fused' would materialise the mask"):
        qf.attention(q, k, v, valid_lens=per_query, backend="fused", memory_budget=1 << 30)


def test_auto_takes_the_chunked_backend_when_the_memory_is_short(little_memory):
    q, k, v = qkv_tensors()
    c = qf.explain(q, k, v, score="normalized", memory_budget=1 << 30)
    assert c.backend == "chunked" and "100.0 KiB available" in str(c)


def test_forced_export_keeps_the_budget(no_backend_runs):
    q, k, v = qkv_tensors()
    with pytest.raises(qf.AttentionMemoryError, match="backend: 'export' would materialise"):
        qf.attention(q, k, v, need_weights=True, backend="export", memory_budget=NEED - 1)


# ----- what "available" means: the least of MemAvailable, the cgroups and ulimit -v


def _tree(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path / "proc", tmp_path / "cg"


GiB = 1 << 30


def test_cgroup_v2_limit_and_its_ancestors(tmp_path, monkeypatch):
    from qkv.functional._memory import cpu_available_memory

    monkeypatch.setattr("resource.getrlimit", lambda r: (-1, -1))
    proc, cg = _tree(
        tmp_path,
        {
            "proc/meminfo": f"MemTotal: 1 kB\nMemAvailable: {64 * GiB // 1024} kB\n",
            "proc/self/cgroup": "0::/job/step\n",
            "cg/job/step/memory.max": "max\n",
            "cg/job/step/memory.current": f"{GiB}\n",
            "cg/job/memory.max": f"{4 * GiB}\n",  # the limit sits on the parent
            "cg/job/memory.current": f"{3 * GiB}\n",
            "cg/job/memory.stat": f"anon 1\ninactive_file {GiB // 2}\n",  # reclaimable cache
        },
    )
    assert cpu_available_memory(proc, cg) == 4 * GiB - (3 * GiB - GiB // 2)


def test_cgroup_v1_limit_inside_a_namespace(tmp_path, monkeypatch):
    from qkv.functional._memory import cpu_available_memory

    monkeypatch.setattr("resource.getrlimit", lambda r: (-1, -1))
    proc, cg = _tree(
        tmp_path,
        {
            "proc/meminfo": f"MemAvailable: {64 * GiB // 1024} kB\n",
            "proc/self/cgroup": "9:cpu:/\n4:memory:/docker/abc\n0::/\n",
            # the container sees its own cgroup at the mount's root: /docker/abc is not there
            "cg/memory/memory.limit_in_bytes": f"{2 * GiB}\n",
            "cg/memory/memory.usage_in_bytes": f"{GiB}\n",
            "cg/memory/memory.stat": "total_inactive_file 0\n",
        },
    )
    assert cpu_available_memory(proc, cg) == GiB
    # v1's "no limit" is a huge number: MemAvailable then
    (cg / "memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cpu_available_memory(proc, cg) == 64 * GiB


def test_ulimit_v_counts(tmp_path, monkeypatch):
    import resource

    from qkv.functional._memory import cpu_available_memory

    proc, cg = _tree(
        tmp_path,
        {
            "proc/meminfo": f"MemAvailable: {64 * GiB // 1024} kB\n",
            "proc/self/status": f"Name: python\nVmSize: {3 * GiB // 1024} kB\n",
        },
    )
    monkeypatch.setattr(resource, "getrlimit", lambda r: (5 * GiB, resource.RLIM_INFINITY))
    assert cpu_available_memory(proc, cg) == 2 * GiB
    monkeypatch.setattr(resource, "getrlimit", lambda r: (resource.RLIM_INFINITY,) * 2)
    assert cpu_available_memory(proc, cg) == 64 * GiB
    assert cpu_available_memory(tmp_path / "none", tmp_path / "none") is None


def test_a_real_ulimit_v_turns_an_allocation_into_a_clear_error(tmp_path):
    """Under ``ulimit -v`` the weights that MemAvailable would allow fail to allocate: the guard
    refuses them first, with the figures (before: torch's allocator error, or a crash)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import resource, torch
        from qkv import functional as qf
        vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status")
                  if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
        x = torch.zeros(1, 1, 1, 8).expand(1, 4, 12_000, 8)   # weights: about 4.3 GB
        try:
            qf.attention(x, x, x, need_weights=True, memory_budget=1 << 40)
        except qf.AttentionMemoryError as e:
            print("REFUSED", e)
        except Exception as e:
            print("CRASHED", type(e).__name__, str(e)[:200])
        """
    )
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.stdout.startswith("REFUSED"), (res.stdout, res.stderr[-2000:])
    assert "available on cpu" in res.stdout and "ulimit -v" in res.stdout
