"""qkv.decoding: greedy and beam search, with and without the KV cache, for both model kinds.

Results are compared as token ids.  The models are random but their EOS logit is calibrated so
sentences stop at different steps (some never), which exercises stopping and dead rows.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _seq2seq_models import BOS, EOS, MAX_LEN, PAD, V, batch, calibrate_eos, tiny

from qkv.decoding import beam_search, generate, greedy_search

KINDS = ["transformer", "bahdanau"]


@pytest.fixture(scope="module", params=KINDS)
def setup(request):
    torch.manual_seed(7)
    model = tiny(request.param)
    src, lens = batch(B=6, L=9, seed=3)
    calibrate_eos(model, src, lens)
    return model, src, lens


def gen(model, src, lens, **kw):
    return generate(model, src, lens, max_output_len=MAX_LEN, bos_id=BOS, eos_id=EOS, **kw)


def test_calibrated_outputs_vary_in_length(setup):
    model, src, lens = setup
    lengths = [len(x) for x in gen(model, src, lens)]
    assert len(set(lengths)) >= 2 and max(lengths) <= MAX_LEN


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cache_gives_the_tokens_of_the_full_prefix(setup, dtype):
    model, src, lens = setup
    model = model.to(dtype)
    try:
        assert gen(model, src, lens) == gen(model, src, lens, use_cache=False)
        a = gen(model, src, lens, beam_size=3, n_best=3)
        b = gen(model, src, lens, beam_size=3, n_best=3, use_cache=False)
        assert [[ids for ids, _ in h] for h in a] == [[ids for ids, _ in h] for h in b]
        for ha, hb in zip(a, b):
            for (_, sa), (_, sb) in zip(ha, hb):
                assert sa == pytest.approx(sb, abs=1e-4)
    finally:
        model.float()


def test_beam_of_one_is_greedy(setup):
    model, src, lens = setup
    greedy = greedy_search(model, src, lens, max_output_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    beam = beam_search(
        model, src, lens, max_output_len=MAX_LEN, bos_id=BOS, eos_id=EOS, beam_size=1
    )
    assert [h[0][0] for h in beam] == greedy


@pytest.mark.parametrize("beam_size", [1, 3])
def test_results_do_not_depend_on_batch_or_padding(setup, beam_size):
    model, src, lens = setup
    together = gen(model, src, lens, beam_size=beam_size)
    for i in range(src.shape[0]):
        alone = src[i : i + 1, : int(lens[i])]
        assert gen(model, alone, lens[i : i + 1], beam_size=beam_size) == [together[i]]
    # more padding, and a different order and batch size
    wide = F.pad(src, (0, 5), value=PAD)
    order = torch.tensor([4, 0, 2])
    part = gen(model, wide[order], lens[order], beam_size=beam_size)
    assert part == [together[i] for i in order.tolist()]
    # garbage (not PAD) past the valid length changes nothing either
    noisy = src.clone()
    noisy[torch.arange(src.shape[1])[None, :] >= lens[:, None]] = 5
    assert gen(model, noisy, lens, beam_size=beam_size) == together


def _logprob(model, src, lens, b: int, ids: list[int], max_len: int) -> float:
    """The model's own ``sum(log p)`` of ``ids`` for sentence ``b``, teacher-forced in one pass:
    BOS, the ids, and EOS when the output ended before ``max_len`` (as the search counts it)."""
    tgt = [BOS, *ids] + ([EOS] if len(ids) < max_len else [])
    with torch.no_grad():
        state = model.init_state(model.encode(src[b : b + 1], lens[b : b + 1]), lens[b : b + 1])
        logits, _ = model.decode(torch.tensor([tgt[:-1]]), state)
    logp = F.log_softmax(logits[0].double(), -1)
    return logp[torch.arange(len(tgt) - 1), torch.tensor(tgt[1:])].sum().item()


def test_n_best_are_sorted_and_scored(setup):
    """Each score is sum(log p) / length ** alpha of its own tokens (EOS counted when said)."""
    model, src, lens = setup
    alpha = 0.6
    hyps = gen(model, src, lens, beam_size=4, n_best=3, length_penalty=alpha)
    for b, h in enumerate(hyps):
        assert len(h) == 3
        scores = [s for _, s in h]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(ids) for ids, _ in h}) == 3
        for ids, score in h:
            length = len(ids) + (len(ids) < MAX_LEN)  # EOS counted when said
            total = _logprob(model, src, lens, b, ids, MAX_LEN)
            assert score == pytest.approx(total / length**alpha, abs=1e-4)
            assert EOS not in ids and BOS not in ids


@pytest.mark.parametrize("kind", KINDS)
def test_beam_finds_at_least_the_greedy_score_without_length_penalty(kind):
    """With ``length_penalty=0`` a beam's score is ``sum(log p)``; rescored by the model itself
    (not by the search's own number), beam search's best output is never less likely than the
    greedy output, and on some sentences it is strictly more likely with words greedy search never
    chose (it searched beyond the greedy path).

    Not a theorem of beam search (it may prune the greedy prefix), but it holds for a beam of 5
    on these small random models; a search that drops hypotheses, returns the wrong one or
    mixes up their tokens fails it.
    """
    better = 0
    for seed, L, max_len in [
        (0, 7, 11),
        (1, 9, 13),
        (2, 11, 9),
        (3, 5, 15),
        (4, 13, 7),
        (5, 3, 11),
    ]:
        torch.manual_seed(seed)
        model = tiny(kind)
        src, lens = batch(B=5, L=L, seed=seed)
        calibrate_eos(model, src, lens)
        kw = dict(max_output_len=max_len, bos_id=BOS, eos_id=EOS)
        greedy = greedy_search(model, src, lens, **kw)
        beam = beam_search(model, src, lens, beam_size=5, length_penalty=0.0, **kw)
        for b, (g_ids, [(b_ids, b_score)]) in enumerate(zip(greedy, beam)):
            g = _logprob(model, src, lens, b, g_ids, max_len)
            s = _logprob(model, src, lens, b, b_ids, max_len)
            assert b_score == pytest.approx(s, abs=1e-4)  # the search's number is the model's
            assert s >= g - 1e-5, (seed, b, g_ids, b_ids)
            # strictly better and off the greedy path: not just greedy's path stopped earlier
            better += s > g + 1e-5 and b_ids != g_ids[: len(b_ids)]
    assert better >= 3


def test_generate_restores_training_mode_and_needs_no_grad(setup):
    model, src, lens = setup
    model.train()
    try:
        a = gen(model, src, lens)
        assert model.training
        model.eval()
        assert a == gen(model, src, lens)  # dropout was off while generating
    finally:
        model.eval()


def test_output_formats(setup):
    model, src, lens = setup
    one = gen(model, src, lens, beam_size=2)
    assert isinstance(one, list) and all(isinstance(x, list) for x in one)
    assert all(isinstance(t, int) for x in one for t in x)
    many = gen(model, src, lens, beam_size=2, n_best=2)
    assert all(len(h) == 2 and isinstance(h[0][1], float) for h in many)
    assert [h[0][0] for h in many] == one


def test_no_valid_lens_means_unpadded():
    model = tiny()
    src = torch.randint(3, 20, (3, 5))
    a = generate(model, src, None, max_output_len=4, bos_id=BOS, eos_id=EOS)
    b = generate(model, src, torch.tensor([5, 5, 5]), max_output_len=4, bos_id=BOS, eos_id=EOS)
    assert a == b and all(len(x) <= 4 for x in a)


def test_stops_at_once_when_everything_ends():
    model = tiny()
    with torch.no_grad():
        model.decoder.dense.bias[EOS] = 100.0
    src, lens = batch(B=3)
    assert gen(model, src, lens) == [[], [], []]
    hyps = gen(model, src, lens, beam_size=3, n_best=2)
    assert all(h[0][0] == [] for h in hyps)
    assert all(math.isfinite(s) for h in hyps for _, s in h)


@pytest.mark.parametrize("kind", KINDS)
def test_pad_and_bos_are_never_generated(kind):
    torch.manual_seed(0)
    model = tiny(kind)
    with torch.no_grad():  # a model that would rather say PAD or BOS than anything else
        model.decoder.dense.bias[PAD] = 20.0
        model.decoder.dense.bias[BOS] = 19.0
    src, lens = batch(B=4)
    for use_cache in (True, False):
        for beam_size in (1, 3):
            out = gen(model, src, lens, beam_size=beam_size, use_cache=use_cache)
            assert all(out) and not {PAD, BOS} & {t for ids in out for t in ids}
    greedy = gen(model, src, lens)
    assert gen(model, src, lens, use_cache=False) == greedy
    beam = beam_search(
        model, src, lens, max_output_len=MAX_LEN, bos_id=BOS, eos_id=EOS, beam_size=1
    )
    assert [h[0][0] for h in beam] == greedy
    # pad_id=None lets PAD through (BOS stays masked); another pad_id masks that id instead
    raw = gen(model, src, lens, pad_id=None)
    assert PAD in {t for ids in raw for t in ids} and BOS not in {t for ids in raw for t in ids}
    other = gen(model, src, lens, pad_id=5)
    assert 5 not in {t for ids in other for t in ids}
    with pytest.raises(ValueError, match="pad_id"):
        gen(model, src, lens, pad_id=V)


@pytest.mark.parametrize(
    ("kw", "arg"),
    [
        (dict(max_output_len=0), "max_output_len"),
        (dict(beam_size=0), "beam_size"),
        (dict(beam_size=2, n_best=3), "n_best"),
        (dict(beam_size=2, length_penalty=float("nan")), "length_penalty"),
        (dict(bos_id=-1), "bos_id"),
        (dict(pad_id=-1), "pad_id"),
    ],
)
def test_argument_errors(kw, arg):
    model = tiny()
    src, lens = batch(B=2)
    args = dict(max_output_len=4, bos_id=BOS, eos_id=EOS) | kw
    with pytest.raises(ValueError, match=arg):
        generate(model, src, lens, **args)


def test_input_errors():
    model = tiny()
    with pytest.raises(ValueError, match="src"):
        generate(model, torch.zeros(2, 3), None, max_output_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="src_valid_lens"):
        generate(
            model, torch.zeros(2, 3, dtype=torch.long), [3], max_output_len=3, bos_id=1, eos_id=2
        )
    src = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(TypeError, match="model"):
        generate(torch.nn.Linear(2, 2), src, None, max_output_len=3, bos_id=1, eos_id=2)


def _ngrams(ids: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_blocks_every_repeat_and_changes_nothing_else(setup, n):
    model, src, lens = setup
    plain = gen(model, src, lens)
    for kw in ({}, {"beam_size": 3}):
        out = gen(model, src, lens, no_repeat_ngram=n, **kw)
        for ids in out:
            grams = _ngrams(ids, n)
            assert len(grams) == len(set(grams)), (n, ids)
    # a greedy output that repeats no n-gram is left exactly as it was
    blocked = gen(model, src, lens, no_repeat_ngram=n)
    for a, b in zip(plain, blocked):
        grams = _ngrams(a, n)
        if len(grams) == len(set(grams)):
            assert a == b
    assert any(len(set(_ngrams(a, n))) < len(_ngrams(a, n)) for a in plain) or n > 1
    with pytest.raises(ValueError, match="no_repeat_ngram"):
        gen(model, src, lens, no_repeat_ngram=-1)


def test_suppressed_ids_are_never_generated(setup):
    model, src, lens = setup
    plain = gen(model, src, lens)
    common = max(
        {t for ids in plain for t in ids}, key=lambda t: sum(ids.count(t) for ids in plain)
    )
    for kw in ({}, {"beam_size": 3}):
        out = gen(model, src, lens, suppress=[common], **kw)
        assert all(common not in ids for ids in out)
    with pytest.raises(ValueError, match="suppress"):
        gen(model, src, lens, suppress=[-1])
