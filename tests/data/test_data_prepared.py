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


@pytest.mark.parametrize("max_pair_len", [None, 30])
def test_batches_from_columns_are_the_batches_from_lists(tmp_path, max_pair_len):
    src, tgt = _ids(2, 700), _ids(3, 700)
    cs, ct = _columns(tmp_path, src, tgt)
    kw = dict(max_tokens=400, max_pair_len=max_pair_len, seed=5, rank=0, world_size=1)
    lists, cols = TokenBatcher(src, tgt, **kw), TokenBatcher(cs, ct, **kw)
    assert lists.n_dropped == cols.n_dropped and (max_pair_len is None) == (cols.n_dropped == 0)
    assert lists.state_dict() == cols.state_dict()
    for _epoch in range(2):
        a, b = list(lists), list(cols)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)


def test_two_ranks_read_disjoint_batches_whose_union_is_the_epoch(tmp_path):
    src, tgt = _ids(4, 900), _ids(5, 900)
    cs, ct = _columns(tmp_path, src, tgt)
    kw = dict(max_tokens=300, max_pair_len=40, seed=1)
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


# ---------------------------------------------------------------------------- prepare's stream
def _variants(seed: int, n: int) -> list[tuple[str, str]]:
    """Pairs whose sources repeat, also as variants a normaliser makes equal (case, spaces)."""
    import random

    rng = random.Random(seed)
    words = ["go", "Go", "GO", "stop", "run", "the cat", "a dog"]
    ends = [".", " .", "!", "  !", "\u00a0!"]
    return [
        (" ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) + rng.choice(ends), f"t{i}")
        for i in range(n)
    ]


def _split_both(pairs, valid, test, seed):
    from qkv.data.splits import TEST, TRAIN, VALID, group_hashes, split_pairs, split_parts

    want = split_pairs(pairs, valid=valid, test=test, seed=seed)
    keys, ranks = group_hashes([s for s, _ in pairs], seed)
    asked = []

    def smallest(groups):
        asked.append(len(groups))
        return [min(pairs[i][0] for i in g) for g in groups]

    parts = split_parts(keys, ranks, valid, test, seed, smallest)
    got = tuple(tuple(np.flatnonzero(parts == p).tolist()) for p in (TRAIN, VALID, TEST))
    return (want.train, want.valid, want.test), got, asked


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sizes", [(0.1, 0.1), (3, 0), (0, 5), (0.3, 0.2), (0, 0)])
def test_the_split_from_hash_arrays_is_split_pairs(seed, sizes):
    pairs = _variants(seed, 20 + 13 * seed)
    want, got, asked = _split_both(pairs, *sizes, seed)
    assert got == want
    assert sum(asked) < len(pairs)  # only groups whose sources differ are read as text


def test_the_split_from_hash_arrays_breaks_digest_ties_by_the_text(monkeypatch):
    import hashlib

    import qkv.data.splits as splits

    real = hashlib.blake2b

    class Weak:  # 8-byte digests of one byte: groups tie, as 64-bit collisions would
        def __init__(self, data=b"", digest_size=64):
            self.h, self.size = real(data, digest_size=digest_size), digest_size

        def update(self, data):
            self.h.update(data)

        def digest(self):
            d = self.h.digest()
            return d[:1] + bytes(7) if self.size == 8 else d

        def hexdigest(self):
            return self.digest().hex()

    monkeypatch.setattr(splits.hashlib, "blake2b", Weak)
    for seed in range(4):
        want, got, _ = _split_both(_variants(10 + seed, 300), 0.2, 0.1, seed)
        assert got == want


@pytest.mark.parametrize("block", [1, 3, 1 << 16])
def test_raw_pairs_read_back_by_row_in_any_order(tmp_path, monkeypatch, block):
    from qkv.data.prepared import RawPairs, RawPairsWriter
    from qkv.data.splits import fingerprint

    pairs = [*_variants(3, 50), ("tab\there", "new\nline"), ("\ud800 lone", "é ü 中文"), ("x", "")]
    w = RawPairsWriter(tmp_path)
    seen = b"".join(w.append(pairs[a : a + 7]) for a in range(0, len(pairs), 7))
    w.close()
    import hashlib

    assert hashlib.blake2b(seen, digest_size=16).hexdigest() == fingerprint(pairs)
    monkeypatch.setattr(RawPairs, "BLOCK", block)
    raw = RawPairs(tmp_path)
    assert len(raw) == len(pairs)
    assert raw.pairs(np.arange(len(pairs))) == pairs
    rows = np.random.default_rng(0).permutation(len(pairs))[:20]
    assert raw.pairs(rows) == [pairs[i] for i in rows]
    assert raw.sources([4, 2]) == [pairs[4][0], pairs[2][0]]
