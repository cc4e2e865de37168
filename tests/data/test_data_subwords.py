"""A SentencePiece model trained elsewhere used as it is (its special pieces mapped onto qkv's
ids), subword sampling, and a batcher whose epochs are resampled; checked against
SentencePiece itself."""

from __future__ import annotations

import collections
import io
import math
import random

import numpy as np
import pytest

spm = pytest.importorskip("sentencepiece")

from qkv._errors import SettingError  # noqa: E402
from qkv.data import (  # noqa: E402
    SentencePieceTokenizer,
    TokenBatcher,
    WordTokenizer,
    bundled_pairs,
    load_tokenizer,
)
from qkv.data.subwords import SubwordSampler  # noqa: E402

PAIRS = bundled_pairs()[:3000]
TEXTS = [s for s, _ in PAIRS] + [t for _, t in PAIRS]


def _spm_model(model_type: str = "unigram", vocab_size: int = 400, **ids) -> bytes:
    """A model as ``spm_train`` makes it (its default special ids unless ``ids`` says)."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        minloglevel=2,
        **ids,
    )
    return buf.getvalue()


LAYOUTS = {
    # spm_train's defaults: <unk> 0, <s> 1, </s> 2, no pad
    "spm-default": {},
    # fairseq's: <s> 0, <pad> 1, </s> 2, <unk> 3
    "fairseq": {"bos_id": 0, "pad_id": 1, "eos_id": 2, "unk_id": 3},
    # no bos, no eos, pad last-ish, unk in the middle
    "sparse": {"bos_id": -1, "eos_id": -1, "unk_id": 5, "pad_id": 7},
}


def _random_texts(n: int, seed: int) -> list[str]:
    """Fresh inputs: words of the corpus shuffled and glued with unseen characters."""
    rng = random.Random(seed)
    words = " ".join(TEXTS[:500]).split()
    odd = ["Ж", "ü", "123", "ß", "☃", "Ω"]
    return [" ".join(rng.choice(words + odd) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_model_trained_elsewhere_keeps_its_segmentation(tmp_path, layout):
    model = _spm_model(**LAYOUTS[layout])
    path = tmp_path / "user.model"
    path.write_bytes(model)
    ref = spm.SentencePieceProcessor(model_proto=model)
    tok = SentencePieceTokenizer.from_file(path)
    roles = [ref.pad_id(), ref.bos_id(), ref.eos_id(), ref.unk_id()]
    missing = sum(r < 0 for r in roles)
    assert tok.vocab_size == ref.get_piece_size() + missing
    names = tok.tokens()
    assert names[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    # every piece of the model is there once, in the model's order after the specials
    others = [ref.id_to_piece(i) for i in range(ref.get_piece_size()) if i not in roles]
    assert names[4:] == others
    for text in TEXTS[:200:7] + _random_texts(60, seed=1):
        ids = tok.encode(text)
        # the same pieces as SentencePiece's own, an unknown one as <unk>
        ref_ids = ref.encode(text)
        want = ["<unk>" if i == ref.unk_id() else ref.id_to_piece(i) for i in ref_ids]
        assert [names[i] for i in ids] == want
        assert tok.to_tokens(text) == want
        assert tok.decode(ids) == ref.decode(ref_ids)
        assert all(i > 2 for i in ids)  # never a pad, bos or eos from text
    # saved and loaded (as a checkpoint's tokenizers are), it is the same tokenizer
    tok.save(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    sample = TEXTS[:50]
    assert [again.encode(t) for t in sample] == [tok.encode(t) for t in sample]
    assert again.tokens() == names


def test_a_qkv_model_is_read_with_its_own_ids(tmp_path):
    qkv_tok = SentencePieceTokenizer.train(TEXTS, vocab_size=300)
    path = tmp_path / "qkv.model"
    path.write_bytes(qkv_tok.model)
    tok = SentencePieceTokenizer.from_file(path)
    ref = spm.SentencePieceProcessor(model_proto=qkv_tok.model)
    assert tok.vocab_size == ref.get_piece_size()
    for text in TEXTS[:100]:
        assert tok.encode(text) == ref.encode(text)


def test_a_file_that_is_not_a_model_is_refused_by_name(tmp_path):
    bad = tmp_path / "vocab.txt"
    bad.write_text("hello\nworld\n")
    with pytest.raises(SettingError, match=r"expected a SentencePiece \.model file") as e:
        SentencePieceTokenizer.from_file(bad)
    assert e.value.key == "tokenizer_model"
    with pytest.raises(SettingError, match="no such file"):
        SentencePieceTokenizer.from_file(tmp_path / "missing.model")


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
@pytest.mark.parametrize("byte_fallback", [False, True])
def test_the_samplers_search_is_sentencepieces_encode(model_type, byte_fallback):
    model = _spm_model(
        model_type,
        vocab_size=500 if byte_fallback else 400,
        byte_fallback=byte_fallback,
        user_defined_symbols=["<x>", "qkv"],
    )
    ref = spm.SentencePieceProcessor(model_proto=model)
    sampler = SubwordSampler(ref, model)
    texts = TEXTS[:1500:3] + _random_texts(400, seed=3) + ["", " ", "ЖЖ Ж", "a<x>qkv b", "☃☃☃"]
    for text in texts:
        assert sampler.best(text) == ref.encode(text), text


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
@pytest.mark.parametrize("layout", ["spm-default", "fairseq"])
def test_sampling_is_fixed_by_its_seed_and_segments_the_text(model_type, layout):
    model = _spm_model(model_type, **LAYOUTS[layout])
    tok = SentencePieceTokenizer(model)
    texts = TEXTS[:300] + _random_texts(100, seed=2)
    a = tok.sample_encode(texts, alpha=0.2, seed=7)
    assert a == tok.sample_encode(texts, alpha=0.2, seed=7)  # the same draws for a seed
    b = tok.sample_encode(texts, alpha=0.2, seed=8)
    assert a != b
    best = [tok.encode(t) for t in texts]
    assert sum(x != y for x, y in zip(a, best)) > len(texts) // 4  # it does sample
    for text, ids in zip(texts, a):
        # a segmentation of the text: it decodes to what the best one decodes to
        assert tok.decode(ids) == tok.decode(tok.encode(text))
        assert all(i > 2 for i in ids)


def _frequencies(segmentations) -> dict[tuple, float]:
    counts = collections.Counter(tuple(x) for x in segmentations)
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def _segmentations(word: str, pieces: dict[str, float]) -> dict[tuple, float]:
    """Every segmentation of ``word`` into ``pieces`` with its summed score (by brute force)."""
    if not word:
        return {(): 0.0}
    out = {}
    for k in range(1, len(word) + 1):
        head = word[:k]
        if head in pieces:
            for rest, score in _segmentations(word[k:], pieces).items():
                out[(head, *rest)] = pieces[head] + score
    return out


@pytest.mark.parametrize("alpha", [0.1, 0.5])
def test_unigram_sampling_draws_kudos_distribution(alpha):
    model = _spm_model("unigram")
    ref = spm.SentencePieceProcessor(model_proto=model)
    sampler = SubwordSampler(ref, model)
    pieces = {
        ref.id_to_piece(i): ref.get_score(i)
        for i in range(ref.get_piece_size())
        if not (ref.is_control(i) or ref.is_unknown(i))
    }
    n = 20000
    for word in ("▁understand", "▁nothing"):
        text = word[1:]
        exact = _segmentations(word, pieces)
        z = sum(math.exp(alpha * v) for v in exact.values())
        want = {k: math.exp(alpha * v) / z for k, v in exact.items()}
        got = _frequencies(
            tuple(ref.id_to_piece(i) for i in ids)
            for ids in sampler.sample(
                [text] * n, alpha=alpha, nbest_size=-1, rng=np.random.default_rng(0)
            )
        )
        # SentencePiece's own sampler, for the same distribution from its generator
        theirs = _frequencies(
            tuple(x)
            for x in ref.encode(
                [text] * n, out_type=str, enable_sampling=True, alpha=alpha, nbest_size=-1
            )
        )
        assert set(got) <= set(want)
        for seg, p in want.items():
            tol = 4 * math.sqrt(p * (1 - p) / n) + 1e-3
            assert abs(got.get(seg, 0.0) - p) < tol, (seg, got.get(seg), p)
            assert abs(theirs.get(seg, 0.0) - p) < tol, (seg, theirs.get(seg), p)


@pytest.mark.parametrize("alpha", [0.1, 0.3])
def test_bpe_dropout_draws_sentencepieces_distribution(alpha):
    model = _spm_model("bpe")
    ref = spm.SentencePieceProcessor(model_proto=model)
    sampler = SubwordSampler(ref, model)
    n = 20000
    for text in ("understand", "everything"):
        got = _frequencies(
            sampler.sample([text] * n, alpha=alpha, nbest_size=-1, rng=np.random.default_rng(1))
        )
        theirs = _frequencies(
            ref.encode([text] * n, enable_sampling=True, alpha=alpha, nbest_size=-1)
        )
        assert len(theirs) > 3
        for seg in set(got) | set(theirs):
            p, q = got.get(seg, 0.0), theirs.get(seg, 0.0)
            tol = 4 * math.sqrt(max(p, q) * (1 - max(p, q)) * 2 / n) + 1e-3
            assert abs(p - q) < tol, (seg, p, q)


def test_nbest_sampling_draws_among_the_nbest_segmentations():
    model = _spm_model("unigram")
    tok = SentencePieceTokenizer(model)
    ref = spm.SentencePieceProcessor(model_proto=model)
    names = tok.tokens()
    texts = TEXTS[:100]
    seen = set()
    for seed in range(5):
        for text, ids in zip(texts, tok.sample_encode(texts, alpha=1.0, nbest_size=3, seed=seed)):
            nbest = [tuple(p) for p in ref.nbest_encode(text, nbest_size=3, out_type=str)]
            pieces = tuple(names[i] for i in ids)
            assert pieces in nbest, (text, pieces, nbest)
            seen.add((text, pieces))
    assert len(seen) > len(texts)  # more than one segmentation of some text


def test_sampling_settings_are_checked_by_name():
    bpe = SentencePieceTokenizer(_spm_model("bpe"))
    with pytest.raises(SettingError, match="dropout probability in \\(0, 1\\)") as e:
        bpe.sample_encode(["a"], alpha=1.0, seed=0)
    assert e.value.key == "subword_alpha"
    uni = SentencePieceTokenizer(_spm_model("unigram"))
    assert uni.sample_encode(["hello"], alpha=5.0, seed=0)  # a unigram alpha may exceed 1
    for bad in (0, 1, -2):
        with pytest.raises(SettingError) as e:
            uni.sample_encode(["a"], alpha=0.1, nbest_size=bad, seed=0)
        assert e.value.key == "subword_nbest_size"
    with pytest.raises(SettingError, match="a number > 0"):
        uni.sample_encode(["a"], alpha=0.0, seed=0)
    word = SentencePieceTokenizer(_spm_model("word", vocab_size=300))
    assert word.model_type == "word"
    with pytest.raises(SettingError, match="unigram and BPE models only"):
        word.sample_encode(["a"], alpha=0.1, seed=0)
    words = WordTokenizer.train(TEXTS)
    with pytest.raises(SettingError, match="needs a SentencePiece tokenizer"):
        words.sample_encode(["a"], alpha=0.1, seed=0)


def _ids(n: int, seed: int, lo: int = 1, hi: int = 9) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 50) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _batches(batcher: TokenBatcher, n: int | None = None) -> list[list[tuple]]:
    out = []
    for batch in batcher:
        out.append(
            [
                (int(i), tuple(s[:ls].tolist()), tuple(t[:lt].tolist()))
                for i, s, ls, t, lt in zip(
                    batch.indices,
                    batch.src,
                    batch.src_valid_lens,
                    batch.tgt_out,
                    batch.tgt_valid_lens,
                )
            ]
        )
        if n is not None and len(out) == n:
            break
    return out


def test_a_resampled_batcher_cuts_each_epoch_from_its_ids():
    src, tgt = _ids(300, 1), _ids(300, 2)
    drawn: list[int] = []

    def resample(epoch):
        drawn.append(epoch)
        # as sampling does: other ids, often more of them; some too long for max_pair_len
        return _ids(300, 100 + epoch, 1, 14), _ids(300, 200 + epoch, 1, 14)

    kw = dict(max_tokens=60, max_pair_len=12, seed=3, rank=0, world_size=1)
    batcher = TokenBatcher(src, tgt, resample=resample, **kw)
    for epoch in range(3):
        es, et = resample(epoch)
        seen = {}
        for batch in _batches(batcher):
            assert sum(1 for _ in batch) * max(max(len(s), len(t)) for _, s, t in batch) <= 60
            for i, s, t in batch:
                seen[i] = (s, t)
        assert sorted(seen) == list(range(300))  # every example once an epoch, none dropped
        for i, (s, t) in seen.items():
            want_s = es[i] if len(es[i]) <= 11 else src[i]  # too long: its own ids
            want_t = et[i] if len(et[i]) <= 11 else tgt[i]
            assert s == (*want_s, 2)  # <eos> appended
            assert t == (*want_t, 2)
    assert sorted(set(drawn)) == [0, 1, 2]


def test_a_resampled_batcher_resumes_mid_epoch_exactly():
    src, tgt = _ids(200, 1), _ids(200, 2)

    def resample(epoch):
        return _ids(200, 10 + epoch, 1, 12), _ids(200, 20 + epoch, 1, 12)

    kw = dict(max_tokens=50, max_pair_len=12, seed=5, rank=0, world_size=1, resample=resample)
    whole = TokenBatcher(src, tgt, **kw)
    first = _batches(whole)  # epoch 0
    second = _batches(whole)  # epoch 1
    cut = TokenBatcher(src, tgt, **kw)
    _batches(cut)
    _batches(cut, n=4)
    state = cut.state_dict()
    assert state["resampled"] is True
    resumed = TokenBatcher(src, tgt, **kw)
    resumed.load_state_dict(state)
    assert _batches(resumed) == second[4:]
    assert first != second
    with pytest.raises(ValueError, match="resampled"):
        TokenBatcher(src, tgt, **{**kw, "resample": None}).load_state_dict(state)


def test_an_imported_models_tokenizer_samples_through_its_own_vocabulary():
    """Subword regularisation of an imported (Marian-style) tokenizer: sampled pieces mapped
    through its vocab.json (</s> 0, <pad> last, a >>xxx<< target token kept whole), the same
    text back, reproducible per seed, and at times another segmentation than encode's."""
    from qkv.data import VocabSentencePieceTokenizer

    model = _spm_model(unk_id=1, bos_id=-1, eos_id=0, pad_id=-1, unk_piece="<unk>",
                       eos_piece="</s>")  # fmt: skip
    sp = spm.SentencePieceProcessor(model_proto=model)
    vocab = {"</s>": 0, "<unk>": 1, ">>fra<<": 2, ">>deu<<": 3}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    pad = vocab["<pad>"]
    tok = VocabSentencePieceTokenizer(
        model, vocab, pad_id=pad, bos_id=pad, eos_id=0, unk_id=1, language_codes=True,
        target_token=">>fra<<",
    )  # fmt: skip
    texts = _random_texts(200, seed=3) + [">>deu<< " + t for t in _random_texts(50, seed=4)]
    a = tok.sample_encode(texts, alpha=0.1, seed=7)
    assert a == tok.sample_encode(texts, alpha=0.1, seed=7)
    assert a != tok.sample_encode(texts, alpha=0.1, seed=8)
    plain = [tok.encode_normalized(t) for t in texts]
    assert sum(x != y for x, y in zip(a, plain)) > 20
    for text, ids, want in zip(texts, a, plain):
        assert ids[0] == want[0] == vocab[">>deu<<" if text.startswith(">>deu<<") else ">>fra<<"]
        assert tok.decode(ids) == tok.decode(want)
        assert pad not in ids and 0 not in ids
    with pytest.raises(SettingError, match="subword_alpha"):
        tok.sample_encode(texts, alpha=0, seed=0)
