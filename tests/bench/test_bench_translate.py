"""benchmarks/translate.py: the eager-PyTorch loops it times against qkv decode what qkv decodes
(token for token, greedy and beam 4), and its sources and batches have the layout it states."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import translate as bt
from qkv.decoding import generate


@pytest.fixture(scope="module")
def model():
    return bt.make_model(vocab=500)


def test_sources_are_log_normal_within_their_bounds_and_batches_keep_input_order():
    srcs = bt.make_sources(200, 500)
    lens = [len(s) for s in srcs]
    assert min(lens) >= 5 and max(lens) <= 27 and 9 <= sorted(lens)[100] <= 14
    assert all(4 <= i < 500 for s in srcs for i in s)  # no special id
    batches = bt.make_batches(srcs[:40])
    assert [b[0].shape[0] for b in batches] == [32, 8]
    src, lens0 = batches[0]
    for r in range(32):  # EOS appended, right-padded, in input order
        assert src[r, : lens0[r]].tolist() == [*srcs[r], bt.EOS]
        assert (src[r, lens0[r] :] == bt.PAD).all()


@pytest.mark.parametrize("loop", [bt.TightLoop, bt.PlainLoop])
@pytest.mark.parametrize("beam", [1, 4])
def test_loops_decode_what_qkv_decodes(model, loop, beam):
    ((src, lens),) = bt.make_batches(bt.make_sources(9, 500, seed=3))
    want = generate(
        model, src, lens, max_output_len=7, bos_id=bt.BOS, eos_id=bt.EOS, beam_size=beam
    )
    got = loop(model).search(src, lens, 7, beam)
    assert got == want
    assert all(len(r) == 7 for r in got)  # the forced length: EOS never wins
