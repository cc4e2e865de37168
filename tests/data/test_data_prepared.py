"""The prepared corpus's format (qkv.data.prepared): token columns written and mapped back,
batches from the columns equal to batches from lists, ranks that share the epoch, sources
checked."""

from __future__ import annotations

import os

import numpy as np
import pytest

from qkv.data import TokenBatcher
from qkv.data.prepared import (
    TokenArraysWriter,
    TokenColumn,
    check_sources,
    source_record,
    token_dtype,
)


def _ids(seed: int, n: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(4, 900, int(rng.integers(0, 50))).tolist() for _ in range(n)]


def _columns(tmp_path, src, tgt, chunk: int = 97):
    dtype = token_dtype(900)
    for name, ids in (("train.src", src), ("train.tgt", tgt)):
        w = TokenArraysWriter(tmp_path, name, dtype)
        for a in range(0, len(ids), chunk):
            part = ids[a : a + chunk]
            w.append(np.array([len(x) for x in part]), np.array([i for x in part for i in x]))
        w.close()
    return (
        TokenColumn(tmp_path, "train.src", dtype, len(src)),
        TokenColumn(tmp_path, "train.tgt", dtype, len(tgt)),
    )


def test_columns_give_back_every_sentence(tmp_path):
    src, tgt = _ids(0, 500), _ids(1, 500)
    cs, ct = _columns(tmp_path, src, tgt)
    assert len(cs) == 500 and cs.dtype == np.uint16 and cs[0].dtype == np.uint16
    assert all(cs[i].tolist() == src[i] and ct[i].tolist() == tgt[i] for i in range(500))
    assert cs.lengths.tolist() == [len(x) for x in src]
    assert not list(tmp_path.glob("*.tmp"))


def _same(a, b):
    for f in ("src", "src_valid_lens", "tgt_in", "tgt_out", "tgt_valid_lens", "indices"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape and bool((x == y).all()), f


@pytest.mark.parametrize("max_len", [None, 30])
def test_batches_from_columns_are_the_batches_from_lists(tmp_path, max_len):
    src, tgt = _ids(2, 700), _ids(3, 700)
    cs, ct = _columns(tmp_path, src, tgt)
    kw = dict(max_tokens=400, max_len=max_len, seed=5, rank=0, world_size=1)
    lists, cols = TokenBatcher(src, tgt, **kw), TokenBatcher(cs, ct, **kw)
    assert lists.n_dropped == cols.n_dropped and (max_len is None) == (cols.n_dropped == 0)
    assert lists.state_dict() == cols.state_dict()
    for _epoch in range(2):
        a, b = list(lists), list(cols)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)


def test_two_ranks_read_disjoint_batches_whose_union_is_the_epoch(tmp_path):
    src, tgt = _ids(4, 900), _ids(5, 900)
    cs, ct = _columns(tmp_path, src, tgt)
    kw = dict(max_tokens=300, max_len=40, seed=1)
    whole = TokenBatcher(cs, ct, rank=0, world_size=1, **kw)
    ranks = [TokenBatcher(cs, ct, rank=r, world_size=2, **kw) for r in range(2)]
    for epoch in range(3):
        for b in (whole, *ranks):
            b.set_epoch(epoch)
        everything = sorted(i for batch in whole for i in batch.indices.tolist())
        assert everything == sorted(set(everything))  # an epoch sees each example once
        seen = [[tuple(b.indices.tolist()) for b in r] for r in ranks]
        assert len(seen[0]) == len(seen[1])  # the same number of steps on both ranks
        n_batches = len(list(whole))
        padded = n_batches % 2  # batches repeated to give both ranks as many (at most 1)
        shared = set(seen[0]) & set(seen[1])
        assert len(shared) <= padded
        union = sorted({i for r in seen for batch in r for i in batch})
        assert union == everything
        if padded == 0:
            assert not shared
            assert sorted(i for r in seen for batch in r for i in batch) == everything


def test_a_changed_source_is_named_and_an_unchanged_one_passes(tmp_path):
    f = tmp_path / "corpus.tsv"
    f.write_text("a\tb\nc\td\n", encoding="utf-8")
    rec = source_record("data", f)
    check_sources([rec], tmp_path / "bin", "prepare again")
    os.utime(f, ns=(rec["mtime_ns"] + 10**9, rec["mtime_ns"] + 10**9))  # touched, same bytes
    check_sources([rec], tmp_path / "bin", "prepare again")
    f.write_text("a\tb\nc\te\n", encoding="utf-8")  # same size, other content
    with pytest.raises(ValueError, match=r"data: '.*corpus\.tsv' changed .*same size, other"):
        check_sources([rec], tmp_path / "bin", "prepare again")
    f.write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"corpus\.tsv' changed .*size 8 -> 4 bytes.*again"):
        check_sources([rec], tmp_path / "bin", "prepare again")
    f.unlink()
    with pytest.raises(ValueError, match=r"corpus\.tsv' was prepared into .* and is gone"):
        check_sources([rec], tmp_path / "bin", "prepare again")


def test_a_truncated_array_is_a_clear_error(tmp_path):
    src = _ids(6, 50)
    cs, _ = _columns(tmp_path, src, src)
    del cs
    tok = tmp_path / "train.src.tok"
    tok.write_bytes(tok.read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"train\.src\.tok' should hold \d+ uint16 values"):
        TokenColumn(tmp_path, "train.src", np.uint16, 50)
