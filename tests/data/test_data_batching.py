"""Splits (deterministic, disjoint, grouped) and token-budget batching (resume, ranks)."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch

from qkv.data import (
    Split,
    TokenBatcher,
    WordTokenizer,
    fingerprint,
    save_tokenizers,
    split_pairs,
)


def make_pairs(n: int = 500, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    pairs = []
    for i in range(n):
        ls, lt = rng.randint(1, 12), rng.randint(1, 14)
        pairs.append(
            (
                " ".join(rng.choices(words, k=ls)) + f" s{i % 300}",
                " ".join(rng.choices(words, k=lt)),
            )
        )
    return pairs


# ----------------------------------------------------------------------------- splits


def test_split_is_deterministic_disjoint_and_covering():
    pairs = make_pairs()
    a, b = split_pairs(pairs, valid=0.1, test=0.1, seed=3), split_pairs(pairs, 0.1, 0.1, seed=3)
    assert a == b
    assert split_pairs(pairs, seed=4) != a
    parts = [set(a.train), set(a.valid), set(a.test)]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    assert parts[0] | parts[1] | parts[2] == set(range(len(pairs)))
    assert 50 <= len(a.test) <= 53 and 50 <= len(a.valid) <= 53


def test_split_keeps_a_source_sentence_in_one_part():
    pairs = make_pairs()
    tr, va, te = split_pairs(pairs, seed=1).apply(pairs)
    train_src = {s for s, _ in tr}
    assert not train_src & {s for s, _ in va}
    assert not train_src & {s for s, _ in te}


def test_split_does_not_depend_on_line_order():
    pairs = make_pairs()
    shuffled = pairs[:]
    random.Random(9).shuffle(shuffled)
    tr1 = {pairs[i] for i in split_pairs(pairs, seed=2).test}
    tr2 = {shuffled[i] for i in split_pairs(shuffled, seed=2).test}
    assert tr1 == tr2


def test_split_serialises_and_checks_the_data(tmp_path):
    pairs = make_pairs(100)
    s = split_pairs(pairs, valid=5, test=10, seed=0)
    assert len(s.test) == 10 and len(s.valid) == 5
    s.save(tmp_path / "split.json")
    again = Split.load(tmp_path / "split.json")
    assert again == s and again.fingerprint == fingerprint(pairs)
    assert again.apply(pairs) == s.apply(pairs)
    changed = pairs[:]
    changed[0] = ("other", "autre")
    with pytest.raises(ValueError, match="fingerprint"):
        s.apply(changed)
    with pytest.raises(ValueError, match="length 100"):
        s.apply(pairs[:-1])
    bad = s.to_dict()
    bad["test"] = bad["test"][1:]
    with pytest.raises(ValueError, match="partition"):
        Split.from_dict(bad)


def test_split_save_creates_its_folder_like_save_tokenizers(tmp_path):
    s = split_pairs(make_pairs(20), valid=2, test=2, seed=0)
    path = tmp_path / "run" / "data" / "split.json"
    s.save(path)
    assert Split.load(path) == s
    tok = WordTokenizer.train(["a b"])
    save_tokenizers(tmp_path / "run" / "tok", tok, tok)
    assert (tmp_path / "run" / "tok" / "joint").is_dir()


def test_split_groups_sources_that_differ_only_by_normalisation():
    # the reviewer's case: case, NBSP and spacing variants of one source must share a part,
    # since training normalises them into the same sentence
    from qkv.data import Normalizer

    pairs = [(f"Sentence {i}.", f"Phrase {i}.") for i in range(200)]
    pairs += [(f"sentence {i}.", f"Phrase {i} !") for i in range(200)]
    pairs += [(f"Sentence {i}.", f"Phrase {i}.") for i in range(200, 220)]
    pairs += [(f"Sentence\u00a0{i}.", f"Une phrase {i}.") for i in range(200, 220)]
    pairs += [(f"SENTENCE {i} .", f"Phrase {i}.") for i in range(220, 240)]
    pairs += [(f"  sentence   {i}.", f"Phrase {i}.") for i in range(220, 240)]
    pairs += [("Élève 1.", "a"), ("E\u0301le\u0300ve 1.", "b"), ("élève 1 .", "c")]
    # the book's normaliser, whitespace collapsed
    norm = Normalizer(lowercase=True, nbsp_to_space=True, space_before_punct=",.!?")
    split = split_pairs(pairs, valid=0.1, test=0.1, seed=0)
    assert split.grouping == "normalized"
    tr, va, te = split.apply(pairs)
    train_src = {norm(s) for s, _ in tr}
    assert not train_src & {norm(s) for s, _ in te}
    assert not train_src & {norm(s) for s, _ in va}
    assert not {norm(s) for s, _ in va} & {norm(s) for s, _ in te}
    where = {}
    for name, idx in (("train", split.train), ("valid", split.valid), ("test", split.test)):
        for i in idx:
            where.setdefault(norm(pairs[i][0]), set()).add(name)
    assert all(len(parts) == 1 for parts in where.values())
    assert len(where) == 241  # 240 sentences and the accented one
    # deterministic, and independent of line order
    assert split_pairs(pairs, valid=0.1, test=0.1, seed=0) == split
    shuffled = pairs[:]
    random.Random(1).shuffle(shuffled)
    again = split_pairs(shuffled, valid=0.1, test=0.1, seed=0)
    assert {shuffled[i] for i in again.test} == {pairs[i] for i in split.test}


def test_split_key_overrides_the_grouping():
    pairs = [(f"s{i}", "t") for i in range(50)] + [(f"S{i}", "T") for i in range(50)]
    raw = split_pairs(pairs, valid=0.2, test=0.2, seed=0, key=lambda s: s)
    assert raw.grouping == "custom"
    tr, _, te = raw.apply(pairs)
    assert {s.lower() for s, _ in tr} & {s.lower() for s, _ in te}  # the leak raw grouping has
    by_number = split_pairs(pairs, valid=0.2, test=0.2, seed=0, key=lambda s: s[1:])
    assert by_number.train != raw.train
    with pytest.raises(TypeError, match="key must return a str"):
        split_pairs(pairs, key=len)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be a function"):
        split_pairs(pairs, key="lower")  # type: ignore[arg-type]


def test_split_without_variants_is_the_same_as_before_and_old_files_load(tmp_path):
    # data whose sources are already distinct after normalisation gets the version-1 split
    # (groups ordered by the hash of the raw source), so older saved splits stay valid
    pairs = make_pairs(100)
    new = split_pairs(pairs, valid=5, test=10, seed=0)
    old = split_pairs(pairs, valid=5, test=10, seed=0, key=lambda s: s)
    assert (new.train, new.valid, new.test) == (old.train, old.valid, old.test)
    d = new.to_dict()
    assert d["version"] == 2 and d["grouping"] == "normalized"
    v1 = {k: v for k, v in d.items() if k not in ("version", "grouping")}
    loaded = Split.from_dict(v1)
    assert loaded.grouping == "raw" and loaded.apply(pairs) == new.apply(pairs)
    with pytest.raises(ValueError, match="needs a newer qkv"):
        Split.from_dict({**d, "version": 3})
    with pytest.raises(ValueError, match="grouping must be"):
        Split.from_dict({**d, "grouping": "fuzzy"})


def test_split_bad_arguments():
    pairs = make_pairs(10)
    with pytest.raises(ValueError, match="valid as a fraction"):
        split_pairs(pairs, valid=1.5)
    with pytest.raises(ValueError, match="must not exceed"):
        split_pairs(pairs, valid=6, test=6)
    with pytest.raises(ValueError, match="must not be empty"):
        split_pairs([])
    with pytest.raises(TypeError, match="seed must be an int"):
        split_pairs(pairs, seed="0")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- batches


def ids(pairs):
    tok = WordTokenizer.train([s for s, _ in pairs] + [t for _, t in pairs], min_freq=1)
    return [tok.encode(s) for s, _ in pairs], [tok.encode(t) for _, t in pairs]


def key(batch):
    return tuple(batch.indices.tolist())


def test_batches_respect_the_token_budget_and_pad_correctly():
    src, tgt = ids(make_pairs())
    b = TokenBatcher(src, tgt, max_tokens=120, seed=0)
    seen, spans = [], []
    for batch in b:
        B, Ls = batch.src.shape
        Lt = batch.tgt_in.shape[1]
        assert B * max(Ls, Lt) <= 120
        assert batch.tgt_out.shape == (B, Lt) and batch.src.dtype == torch.int64
        for r, i in enumerate(batch.indices.tolist()):
            s, t = src[i], tgt[i]
            assert batch.src_valid_lens[r] == len(s) + 1
            assert batch.src[r].tolist() == [*s, 2] + [0] * (Ls - len(s) - 1)
            assert batch.tgt_valid_lens[r] == len(t) + 1
            assert batch.tgt_in[r].tolist() == [1, *t] + [0] * (Lt - len(t) - 1)
            assert batch.tgt_out[r].tolist() == [*t, 2] + [0] * (Lt - len(t) - 1)
        lens = torch.maximum(batch.src_valid_lens, batch.tgt_valid_lens)
        spans.append((int(lens.min()), int(lens.max())))
        assert batch.num_tokens == int(batch.tgt_valid_lens.sum())
        seen.extend(batch.indices.tolist())
    assert sorted(seen) == list(range(len(src)))  # every example once per epoch
    # bucketing: batches cover consecutive length ranges (they overlap at most at an end)
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_max_batch_size_and_max_pair_len():
    src, tgt = ids(make_pairs())
    b = TokenBatcher(src, tgt, max_tokens=10_000, max_batch_size=16, shuffle=False)
    assert all(len(x) <= 16 for x in b)
    long_ones = sum(1 for s, t in zip(src, tgt) if len(s) + 1 > 10 or len(t) + 1 > 10)
    d = TokenBatcher(src, tgt, max_tokens=200, max_pair_len=10)
    assert d.n_dropped == long_ones > 0 and d.num_examples == len(src) - long_ones
    t = TokenBatcher(src, tgt, max_tokens=200, max_pair_len=10, truncate=True)
    assert t.n_dropped == 0
    for batch in t:
        assert batch.src.shape[1] <= 10 and batch.tgt_in.shape[1] <= 10
        assert (batch.src.gather(1, batch.src_valid_lens[:, None] - 1) == 2).all()


def test_shuffle_is_reproducible_by_seed_and_epoch():
    src, tgt = ids(make_pairs())
    a = [key(x) for x in TokenBatcher(src, tgt, max_tokens=100, seed=5)]
    b = [key(x) for x in TokenBatcher(src, tgt, max_tokens=100, seed=5)]
    c = [key(x) for x in TokenBatcher(src, tgt, max_tokens=100, seed=6)]
    assert a == b and a != c
    d = TokenBatcher(src, tgt, max_tokens=100, seed=5)
    first = [key(x) for x in d]
    second = [key(x) for x in d]  # the iterator moved on to epoch 1
    assert first == a and second != first and d.epoch == 2
    d.set_epoch(1)
    assert [key(x) for x in d] == second
    unshuffled = [key(x) for x in TokenBatcher(src, tgt, max_tokens=100, shuffle=False)]
    assert unshuffled == [key(x) for x in TokenBatcher(src, tgt, max_tokens=100, shuffle=False)]


def test_resume_yields_exactly_the_remaining_batches():
    src, tgt = ids(make_pairs())
    ref = TokenBatcher(src, tgt, max_tokens=100, seed=1)
    epoch0 = [key(x) for x in ref]
    epoch1 = [key(x) for x in ref]
    run = TokenBatcher(src, tgt, max_tokens=100, seed=1)
    it = iter(run)
    got = [key(next(it)) for _ in range(7)]
    state = json.loads(json.dumps(run.state_dict()))  # a checkpoint stores it
    assert state["epoch"] == 0 and state["batch_index"] == 7
    resumed = TokenBatcher(src, tgt, max_tokens=100, seed=1)
    resumed.load_state_dict(state)
    rest = [key(x) for x in resumed]
    assert got + rest == epoch0
    assert [key(x) for x in resumed] == epoch1  # and then the next epoch as usual
    # a position at the end of an epoch resumes at the next one
    end = TokenBatcher(src, tgt, max_tokens=100, seed=1)
    end.load_state_dict({**state, "batch_index": len(epoch0)})
    assert [key(x) for x in end] == epoch1


def test_load_state_dict_refuses_other_settings():
    src, tgt = ids(make_pairs(50))
    state = TokenBatcher(src, tgt, max_tokens=100, seed=1).state_dict()
    other = TokenBatcher(src, tgt, max_tokens=90, seed=1)
    with pytest.raises(ValueError, match="max_tokens: saved 100, here 90"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="state must be a dict"):
        other.load_state_dict({"epoch": 0})
    # max_pair_len, truncate and src_eos change the batches too
    state = TokenBatcher(src, tgt, max_tokens=100, max_pair_len=40, seed=1).state_dict()
    for kw, msg in [
        (dict(max_pair_len=30), "max_pair_len: saved 40, here 30"),
        (dict(max_pair_len=40, truncate=True), "truncate: saved False, here True"),
        (dict(max_pair_len=40, src_eos=False), "src_eos: saved True, here False"),
    ]:
        with pytest.raises(ValueError, match=msg):
            TokenBatcher(src, tgt, max_tokens=100, seed=1, **kw).load_state_dict(state)
    # a state from before these settings were recorded still loads
    old = {k: v for k, v in state.items() if k not in ("max_pair_len", "truncate", "src_eos")}
    TokenBatcher(src, tgt, max_tokens=100, max_pair_len=40, seed=1).load_state_dict(old)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_partition_the_batches(world_size):
    src, tgt = ids(make_pairs())
    full = [key(x) for x in TokenBatcher(src, tgt, max_tokens=100, seed=2)]
    shards = [
        [
            key(x)
            for x in TokenBatcher(src, tgt, max_tokens=100, seed=2, rank=r, world_size=world_size)
        ]
        for r in range(world_size)
    ]
    assert len({len(s) for s in shards}) == 1  # every rank takes the same number of steps
    pad = -len(full) % world_size
    merged = [b for step in zip(*shards) for b in step]
    assert merged == full + full[:pad]  # padded with the first batches, as DistributedSampler
    all_examples = [i for s in shards for b in s for i in b]
    assert set(all_examples) == set(range(len(src)))
    assert len(all_examples) == len(src) + sum(len(b) for b in full[:pad])


@pytest.mark.parametrize("world_size", [2, 4, 7])
def test_unshuffled_ranks_see_every_example_every_epoch(world_size):
    # a plan cut to a multiple of world_size dropped the same (longest) batches every epoch
    src, tgt = ids(make_pairs(400, seed=5))
    n_full = len(TokenBatcher(src, tgt, max_tokens=60, shuffle=False))
    assert n_full % world_size  # the case that used to drop batches
    ranks = [
        TokenBatcher(src, tgt, max_tokens=60, shuffle=False, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    for _ in range(2):  # epochs
        steps = [[key(x) for x in b] for b in ranks]
        assert len({len(s) for s in steps}) == 1
        assert len(steps[0]) == -(-n_full // world_size)
        assert {i for s in steps for b in s for i in b} == set(range(len(src)))


def test_rank_from_environment(monkeypatch):
    src, tgt = ids(make_pairs(60))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    b = TokenBatcher(src, tgt, max_tokens=50)
    assert (b.rank, b.world_size) == (1, 2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK must be an int"):
        TokenBatcher(src, tgt, max_tokens=50)


def test_batcher_bad_arguments():
    src, tgt = ids(make_pairs(20))
    with pytest.raises(ValueError, match="aligned"):
        TokenBatcher(src, tgt[:-1])
    with pytest.raises(ValueError, match="smaller than the longest example"):
        TokenBatcher(src, tgt, max_tokens=5)
    with pytest.raises(ValueError, match="rank must be an int in"):
        TokenBatcher(src, tgt, rank=2, world_size=2)
    with pytest.raises(ValueError, match="max_tokens must be an int"):
        TokenBatcher(src, tgt, max_tokens=0)
    with pytest.raises(ValueError, match="no example fits"):
        TokenBatcher([[5] * 20], [[5] * 20], max_pair_len=4)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        TokenBatcher(src, tgt, seed=-1)
    with pytest.raises(ValueError, match="exceeds the 1 batches"):
        len(TokenBatcher(src, tgt, max_tokens=10_000, rank=0, world_size=2))


def test_from_pairs_and_to_device():
    pairs = [("go .", "va !"), ("i lost .", "j'ai perdu ."), ("he's calm .", "il est calme .")]
    tok = WordTokenizer.train([s for p in pairs for s in p], min_freq=1)
    b = TokenBatcher.from_pairs(pairs, tok, tok, max_tokens=64, shuffle=False)
    batch = next(iter(b))
    assert len(batch) == 3
    moved = batch.to("cpu")
    assert torch.equal(moved.src, batch.src)
    order = batch.indices.tolist()
    assert tok.decode(batch.tgt_out[order.index(0)].tolist()) == "va !"


def test_benchmark_runs_at_small_scale(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "data.py"
    spec = importlib.util.spec_from_file_location("qkv_benchmarks_data", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "b.json"
    assert bench.main(["--pairs", "2000", "--max-tokens", "512", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [s["stage"] for s in res["stages"]] == [
        "read", "normalise", "split", "vocabulary", "tokenise", "batch",
    ]  # fmt: skip
    assert res["stages"][0]["note"].startswith("2000 pairs") and "total" in capsys.readouterr().out


def test_max_len_is_the_pair_limits_old_name():
    """``TokenBatcher(max_len=)`` (the old keyword) batches as ``max_pair_len=`` with a
    DeprecationWarning, and a state saved under the old key resumes."""
    src = [[5] * n for n in (3, 12, 6, 15, 4)]
    new = TokenBatcher(src, src, max_tokens=200, max_pair_len=10, seed=3)
    with pytest.warns(DeprecationWarning, match="max_pair_len"):
        old = TokenBatcher(src, src, max_tokens=200, max_len=10, seed=3)
    assert old.n_dropped == new.n_dropped == 2
    state = new.state_dict()
    state["max_len"] = state.pop("max_pair_len")
    TokenBatcher(src, src, max_tokens=200, max_pair_len=10, seed=3).load_state_dict(state)
    state["max_len"] = 12
    with pytest.raises(ValueError, match="max_pair_len: saved 12, here 10"):
        TokenBatcher(src, src, max_tokens=200, max_pair_len=10, seed=3).load_state_dict(state)
