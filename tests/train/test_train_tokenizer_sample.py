"""Issue 40 item 5: the tokenizers learn from a bounded sample (at most TOKENIZER_SAMPLE pairs
and TOKENIZER_CHARS characters), the same in a run that reads its file and in qkv prepare, so
what SentencePiece's trainer holds does not grow with the corpus."""

from __future__ import annotations

import random

from qkv.train import run_data as RD


def _pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    return [
        (
            " ".join(rng.choices(words, k=rng.randint(1, 30))),
            f"{i} " + " ".join(rng.choices(words, k=3)),
        )
        for i in range(n)
    ]


def test_a_sample_is_bounded_in_pairs_and_characters_and_keeps_the_order(monkeypatch):
    pairs = _pairs(5000)
    monkeypatch.setattr(RD, "TOKENIZER_SAMPLE", 1000)
    monkeypatch.setattr(RD, "TOKENIZER_CHARS", 40_000)
    sample = RD.tokenizer_sample(pairs, seed=3)
    chars = sum(len(s) + len(t) for s, t in sample)
    assert 0 < len(sample) < 1000 and 40_000 - 300 < chars <= 40_000
    position = {p: i for i, p in enumerate(pairs)}  # the pairs are distinct
    at = [position[p] for p in sample]
    assert at == sorted(at) and len(set(at)) == len(at)
    assert RD.tokenizer_sample(pairs, seed=3) == sample  # seeded
    assert RD.tokenizer_sample(pairs, seed=4) != sample
    # long and short pairs are drawn alike: the mean length is the corpus's, within noise
    mean = sum(len(s) for s, _ in pairs) / len(pairs)
    assert abs(sum(len(s) for s, _ in sample) / len(sample) - mean) < 0.1 * mean


def test_a_small_corpus_is_taken_whole(monkeypatch):
    pairs = _pairs(300)
    assert RD.tokenizer_sample(pairs, seed=0) is pairs
    monkeypatch.setattr(RD, "TOKENIZER_CHARS", 10)
    assert len(RD.within_characters(pairs, seed=0)) == 1  # never empty
