"""The epoch plan of TokenBatcher is built from arrays (a sort by length, a cut run by run of
equal cost): it must give exactly the batches of the per-example greedy loop it replaced, so a
run resumed across the change and a prepared corpus get the batches they always got."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from qkv.data import TokenBatcher


def _reference_plan(ls, lt, max_tokens, cap, shuffle, seed, epoch):
    """The greedy loop over examples, as TokenBatcher planned an epoch before arrays."""
    ls, lt = np.asarray(ls, dtype=np.int64), np.asarray(lt, dtype=np.int64)
    cost_all = np.maximum(ls, lt)
    n = len(ls)
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(n)
        order = perm[np.lexsort((ls[perm], cost_all[perm]))]
    else:
        rng = None
        order = np.lexsort((np.arange(n), ls, cost_all))
    cost = cost_all[order].tolist()
    cap = cap or n
    bounds, start, longest = [0], 0, 0
    for j, c in enumerate(cost):
        longest_if = max(longest, c)
        if j > start and ((j - start + 1) * longest_if > max_tokens or j - start >= cap):
            bounds.append(j)
            start, longest = j, c
        else:
            longest = longest_if
    bounds.append(n)
    batches = [order[a:b] for a, b in itertools.pairwise(bounds)]
    if rng is not None:
        batches = [batches[k] for k in rng.permutation(len(batches))]
    return batches


@pytest.mark.parametrize("trial", range(12))
def test_the_array_plan_is_the_greedy_loops_plan(trial):
    rng = np.random.default_rng(trial)
    n = int(rng.integers(1, 2500))
    src = [[5] * int(rng.integers(0, 40)) for _ in range(n)]
    tgt = [[6] * int(rng.integers(0, 40)) for _ in range(n)]
    max_tokens = [41, 100, 512, 4096][trial % 4]
    cap = [None, 7, 64][trial % 3]
    shuffle = trial % 5 != 0
    b = TokenBatcher(
        src, tgt, max_tokens=max_tokens, max_batch_size=cap, shuffle=shuffle, seed=trial,
        rank=0, world_size=1,
    )  # fmt: skip
    ls = [len(s) + 1 for s in src]
    lt = [len(t) + 1 for t in tgt]
    for epoch in range(2):
        want = _reference_plan(ls, lt, max_tokens, cap, shuffle, trial, epoch)
        got = b._batches(epoch)
        assert len(got) == len(want)
        for k, w in enumerate(want):
            assert got[k].tolist() == w.tolist()


def test_lengths_are_kept_small():
    """A batcher's memory is its length arrays, in the smallest type that holds them (a byte
    an example under max_pair_len 256), and a map from kept examples to input indices only when
    some were dropped: the dropped ones when they are fewer, else a table."""
    src = [[5] * (i % 300) for i in range(1000)]
    b = TokenBatcher(src, src, max_tokens=4096, rank=0, world_size=1)
    assert b._ls.dtype == np.uint16 and b._index is None and b._dropped_rank is None
    c = TokenBatcher(src, src, max_tokens=4096, max_pair_len=250, rank=0, world_size=1)
    assert c._ls.dtype == np.uint8 and c._lt.dtype == np.uint8
    assert c.n_dropped > 0 and c._index is None and c._dropped_rank is not None
    d = TokenBatcher(src, src, max_tokens=4096, max_pair_len=20, rank=0, world_size=1)
    assert d.n_dropped > d.num_examples and d._index is not None and d._index.dtype == np.int32
    for batcher, limit in ((c, 250), (d, 20)):
        seen = sorted(i for batch in batcher for i in batch.indices.tolist())
        assert seen == [i for i in range(1000) if i % 300 + 1 <= limit]
        for batch in batcher:
            for row, i in enumerate(batch.indices.tolist()):
                assert int(batch.src_valid_lens[row]) == i % 300 + 1
