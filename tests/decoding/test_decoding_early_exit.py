"""Greedy search drops finished sentences from the batch: the rest decode on fewer rows, and
every sentence's result is what it is decoded alone (its EOS, its own limit)."""

from __future__ import annotations

import pytest
import torch
from _seq2seq_models import BOS, EOS, V, batch, tiny

from qkv.decoding import greedy_search

#: an EOS bias per kind with which the sentences end after different numbers of steps
_EOS_BIAS = {"transformer": 0.0, "bahdanau": 0.3}


def _eos_prone(kind: str = "transformer") -> torch.nn.Module:
    torch.manual_seed(3)
    model = tiny(kind)
    with torch.no_grad():
        model.decoder.dense.bias[EOS] += _EOS_BIAS[kind]
    return model


@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
def test_finished_rows_leave_the_batch_and_results_equal_one_by_one(kind, monkeypatch):
    model = _eos_prone(kind)
    src, lens = batch(B=16, L=7, seed=4)
    limits = [3 + i % 9 for i in range(16)]  # some rows stop at their own limit
    rows_seen = []
    decode = model.decode

    def counting(tokens, state, **kw):
        rows_seen.append(tokens.shape[0])
        return decode(tokens, state, **kw)

    monkeypatch.setattr(model, "decode", counting)
    got = greedy_search(model, src, lens, max_output_len=limits, bos_id=BOS, eos_id=EOS)
    monkeypatch.setattr(model, "decode", decode)
    alone = [
        greedy_search(
            model, src[i : i + 1], lens[i : i + 1], max_output_len=limits[i], bos_id=BOS, eos_id=EOS
        )[0]
        for i in range(16)
    ]
    assert got == alone
    assert all(len(g) <= m for g, m in zip(got, limits)) and all(EOS not in g for g in got)
    lengths = sorted(len(g) for g in got)
    assert lengths[0] < lengths[-1]  # the rows do end at different steps
    assert rows_seen[0] == 16 and min(rows_seen) < 16  # and the batch shrank
    assert rows_seen == sorted(rows_seen, reverse=True)


def test_without_the_cache_nothing_is_dropped_and_results_are_the_same():
    model = _eos_prone()
    src, lens = batch(B=8, L=6, seed=2)
    cached = greedy_search(model, src, lens, max_output_len=10, bos_id=BOS, eos_id=EOS)
    full = greedy_search(
        model, src, lens, max_output_len=10, bos_id=BOS, eos_id=EOS, use_cache=False
    )
    assert cached == full
    assert all(0 <= t < V for row in cached for t in row)
