"""qkv.decoding with one ``max_output_len`` per sentence: each row stops at its own limit, exactly as
it would alone, for greedy and beam search and both model kinds."""

from __future__ import annotations

import pytest
import torch
from _seq2seq_models import BOS, EOS, MAX_LEN, batch, calibrate_eos, tiny

from qkv.decoding import generate

KINDS = ["transformer", "bahdanau"]
LIMITS = [1, 3, 5, 2, MAX_LEN, 4]  # one per sentence of the batch (B = 6)


@pytest.fixture(scope="module", params=KINDS)
def setup(request):
    torch.manual_seed(11)
    model = tiny(request.param)
    src, lens = batch(B=6, L=9, seed=5)
    calibrate_eos(model, src, lens)
    return model, src, lens


def gen(model, src, lens, max_len, **kw):
    return generate(model, src, lens, max_output_len=max_len, bos_id=BOS, eos_id=EOS, **kw)


@pytest.mark.parametrize("beam", [1, 3])
def test_each_row_stops_at_its_own_limit_as_it_would_alone(setup, beam):
    model, src, lens = setup
    kw = {"beam_size": beam, "n_best": beam}
    together = gen(model, src, lens, LIMITS, **kw)
    alone = [gen(model, src[b : b + 1], lens[b : b + 1], LIMITS[b], **kw)[0] for b in range(6)]
    ids = (lambda r: [h[0] for h in r]) if beam > 1 else (lambda r: r)
    assert [ids(r) for r in together] == [ids(r) for r in alone]
    if beam > 1:  # the scores too
        for r, a in zip(together, alone):
            assert [s for _, s in r] == pytest.approx([s for _, s in a], abs=1e-5)
    longest = [max(len(h[0]) for h in r) if beam > 1 else len(r) for r in together]
    assert all(n <= m for n, m in zip(longest, LIMITS))
    # the limits bind: some sentence is cut at its own limit, below the batch's largest
    assert any(n == m < MAX_LEN for n, m in zip(longest, LIMITS))


@pytest.mark.parametrize("beam", [1, 3])
def test_one_limit_for_all_is_the_same_as_that_limit_per_row(setup, beam):
    model, src, lens = setup
    same = gen(model, src, lens, [5] * 6, beam_size=beam)
    assert same == gen(model, src, lens, 5, beam_size=beam)
    assert gen(model, src, lens, torch.tensor([5] * 6), beam_size=beam) == same


@pytest.mark.parametrize("bad", [[3, 3], [3, 0, 3, 3, 3, 3], 0, [2.0] * 6, "abcdef", True])
def test_bad_limits_are_refused_naming_max_output_len(setup, bad):
    model, src, lens = setup
    with pytest.raises(ValueError, match=r"^max_output_len: expected an int >= 1"):
        gen(model, src, lens, bad)


def test_max_len_is_the_decode_lengths_old_name(setup):
    """``max_len=`` (the old keyword) still decodes, with a DeprecationWarning naming
    ``max_output_len``; both at once, or neither, is a TypeError."""
    model, src, lens = setup
    want = gen(model, src, lens, 6)
    with pytest.warns(DeprecationWarning, match="use max_output_len="):
        got = generate(model, src, lens, max_len=6, bos_id=BOS, eos_id=EOS)
    assert got == want
    with pytest.raises(TypeError, match="give max_output_len alone"):
        generate(model, src, lens, max_len=6, max_output_len=6, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match="max_output_len: required"):
        generate(model, src, lens, bos_id=BOS, eos_id=EOS)
