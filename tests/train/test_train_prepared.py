"""Training from a prepared corpus (qkv prepare, then qkv train --data FOLDER): the same pairs,
tokens and batches as a run reading the file itself; resumable exactly; a changed source
named; a killed prepare continued; a second prepare a no-op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _train_helpers import ENDED, kill_when_checkpointed, qkv_here, tiny_config
from safetensors.torch import load_file

from qkv.data import bundled_pairs, write_pairs
from qkv.data.prepared import PreparedCorpus
from qkv.train.checkpoint import latest_checkpoint
from qkv.train.corpus import prepare_corpus

_SPM = {"normalizer": "auto", "tokenizer": "auto", "preset": "auto", "max_tokens": 400}


def _setup(config, out):
    """What ``train()`` sets up before its first update, for a new run of ``config``."""
    from qkv.inference.layout import RunLayout
    from qkv.train import distributed as D
    from qkv.train.prepare import open_run, prepare

    info = D.setup("cpu")
    layout = RunLayout(out)
    settings, resumed = open_run(config, layout, info, False, lambda _m: None)
    return prepare(settings, resumed, layout, info)


@pytest.mark.parametrize("text", ["word", "sentencepiece"])
def test_prepared_data_gives_the_batches_of_the_file(tmp_path, corpus_file, text):
    config = tiny_config(data=str(corpus_file), seed=4, **(_SPM if text != "word" else {}))
    folder = prepare_corpus(config, tmp_path / "bin", workers=2)
    a = _setup(config, tmp_path / "a")
    b = _setup(config.updated({"data": str(folder)}), tmp_path / "b")
    assert b.data.prepared is not None and b.data.train == []
    assert a.data.n_train == b.data.n_train == len(a.data.train)
    assert a.data.src_tokenizer.tokens() == b.data.src_tokenizer.tokens()
    assert a.data.tgt_tokenizer.tokens() == b.data.tgt_tokenizer.tokens()
    assert (a.data.valid, a.data.raw_valid) == (b.data.valid, b.data.raw_valid)
    assert (a.data.test, a.data.raw_test) == (b.data.test, b.data.raw_test)
    assert a.config.to_dict() | {"data": None} == b.config.to_dict() | {"data": None}
    assert a.model_config == b.model_config
    assert a.batcher.state_dict() == b.batcher.state_dict()
    for _epoch in range(2):
        xs, ys = list(a.batcher), list(b.batcher)
        assert len(xs) == len(ys) > 3
        for x, y in zip(xs, ys):
            for f in ("src", "src_valid_lens", "tgt_in", "tgt_out", "tgt_valid_lens", "indices"):
                assert torch.equal(getattr(x, f), getattr(y, f)), f


def test_a_second_prepare_is_a_no_op_and_other_settings_prepare_again(tmp_path, corpus_file):
    config = tiny_config(data=str(corpus_file))
    said: list[str] = []
    folder = prepare_corpus(config, tmp_path / "bin", say=said.append)
    stamp = (folder / "manifest.json").stat().st_mtime_ns
    said.clear()
    prepare_corpus(config, folder, say=said.append)
    assert said == [f"{folder}: already prepared from these files with these settings; "
                    "nothing to do"]  # fmt: skip
    assert (folder / "manifest.json").stat().st_mtime_ns == stamp
    prepare_corpus(config.updated({"valid": 60}), folder, say=said.append)
    assert PreparedCorpus(folder).manifest["counts"]["valid"] >= 60
    assert not (folder / ".work").exists()


def test_a_linked_tokenizers_folder_is_replaced_by_a_new_prepare_and_its_target_kept(
    tmp_path, corpus_file
):
    config = tiny_config(data=str(corpus_file))
    folder = prepare_corpus(config, tmp_path / "bin")
    elsewhere = tmp_path / "kept-tokenizers"
    (folder / "tokenizers").rename(elsewhere)
    (folder / "tokenizers").symlink_to(elsewhere, target_is_directory=True)
    files = lambda: {p: p.read_bytes() for p in elsewhere.rglob("*") if p.is_file()}  # noqa: E731
    before = files()
    assert before
    prepare_corpus(config.updated({"valid": 60}), folder)
    assert not (folder / "tokenizers").is_symlink() and (folder / "tokenizers").is_dir()
    assert files() == before
    PreparedCorpus(folder)  # its tokenizers are the ones the manifest records


class _Killed(BaseException):
    pass


def test_a_killed_prepare_continues_where_it_stopped(tmp_path, corpus_file, monkeypatch):
    import qkv.train.corpus as corpus

    config = tiny_config(data=str(corpus_file))
    monkeypatch.setattr(corpus, "CHUNK", 100)
    calls = []
    real = corpus.encode_rows
    dying = [True]

    def dies_at_the_third(task):
        calls.append(len(task[3]))
        if dying[0] and len(calls) == 3:
            raise _Killed  # as a kill between two chunks: each chunk's file is written whole
        return real(task)

    monkeypatch.setattr(corpus, "encode_rows", dies_at_the_third)
    with pytest.raises(_Killed):
        prepare_corpus(config, tmp_path / "bin", workers=1)
    assert not (tmp_path / "bin" / "manifest.json").exists()
    assert len(list((tmp_path / "bin" / ".work").glob("chunk-*.npz"))) == 2
    calls.clear()
    dying[0] = False
    said: list[str] = []
    folder = prepare_corpus(config, tmp_path / "bin", workers=1, say=said.append)
    assert "reading: done before, kept" in said and "tokenizers: trained before, kept" in said
    assert any(m.startswith("resuming: 2 of 6 chunks encoded before") for m in said), said
    assert len(calls) == 4  # only the chunks left
    monkeypatch.setattr(corpus, "encode_rows", real)
    fresh = prepare_corpus(config, tmp_path / "fresh", workers=2)
    for name in ("train.src.tok", "train.src.idx", "train.tgt.tok", "train.tgt.len"):
        assert (folder / name).read_bytes() == (fresh / name).read_bytes(), name
    a, b = PreparedCorpus(folder).manifest, PreparedCorpus(fresh).manifest
    assert a["fingerprint"] == b["fingerprint"]


def test_a_prepare_killed_while_reading_reads_again_and_gives_the_same_folder(
    tmp_path, corpus_file, monkeypatch
):
    import qkv.train.corpus as corpus

    config = tiny_config(data=str(corpus_file))
    monkeypatch.setattr(corpus, "CHUNK", 64)
    real = corpus.group_hashes
    calls = []

    def dies_at_the_fourth(sources, seed):
        calls.append(len(sources))
        if len(calls) == 4:
            raise _Killed  # the first pass half done: no rows.json yet
        return real(sources, seed)

    monkeypatch.setattr(corpus, "group_hashes", dies_at_the_fourth)
    with pytest.raises(_Killed):
        prepare_corpus(config, tmp_path / "bin", workers=1)
    assert not (tmp_path / "bin" / ".work" / "rows.json").exists()
    said: list[str] = []
    folder = prepare_corpus(config, tmp_path / "bin", workers=1, say=said.append)
    assert "reading: done before, kept" not in said and sum(calls[4:]) == 600
    monkeypatch.setattr(corpus, "group_hashes", real)
    fresh = prepare_corpus(config, tmp_path / "fresh", workers=2)
    for name in ("train.src.tok", "train.src.idx", "train.tgt.tok", "valid.jsonl", "test.jsonl"):
        assert (folder / name).read_bytes() == (fresh / name).read_bytes(), name


@pytest.mark.parametrize("layout", ["one file", "aligned files and a validation file"])
def test_prepare_in_chunks_of_odd_sizes_gives_the_pairs_and_tokens_of_the_file(
    tmp_path, monkeypatch, layout
):
    """The stream (chunks of 7 pairs, raw pairs read back 5 rows at a time, two workers) gives
    what a run reading the whole file holds: its training pairs encoded with tokenizers learnt
    from the same sample, its held-out parts, its split's fingerprint."""
    import qkv.train.corpus as corpus
    from qkv.data import bundled_pairs, encode_pairs, write_pairs
    from qkv.data.prepared import RawPairs
    from qkv.train import run_data
    from qkv.train.run_data import load_run_data, read_run_files, run_split

    pairs = [*bundled_pairs()[:97], ("Go.", "Va !"), ("go .", "Vas-y !"), ("GO\u00a0.", "Va.")]
    config = tiny_config(valid=9, test=0.1)
    if layout == "one file":
        write_pairs(tmp_path / "en-fr.txt", pairs)
        config = config.updated({"data": str(tmp_path / "en-fr.txt")})
    else:
        for side, lang in enumerate(("en", "fr")):
            (tmp_path / f"c.{lang}").write_text("".join(p[side] + "\n" for p in pairs[:80]))
        write_pairs(tmp_path / "valid.txt", pairs[80:])
        aligned = [str(tmp_path / "c.en"), str(tmp_path / "c.fr")]
        config = config.updated({"data": aligned, "valid_data": str(tmp_path / "valid.txt")})
    monkeypatch.setattr(corpus, "CHUNK", 7)
    monkeypatch.setattr(RawPairs, "BLOCK", 5)
    # the tokenizers learn from a seeded sample of 50 of the training pairs cut to 1,500
    # characters, in both paths
    monkeypatch.setattr(run_data, "TOKENIZER_SAMPLE", 50)
    monkeypatch.setattr(run_data, "TOKENIZER_CHARS", 1500)
    folder = prepare_corpus(config, tmp_path / "bin", workers=2)
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    assert 10 < report["tokenizer_trained_on"] < 50
    files = read_run_files(config)  # what a run reads and splits (run_split: given files too)
    ref = load_run_data(config, split=run_split(config, files), pairs=(files.pairs, files.source))
    prepared = PreparedCorpus(folder)
    src_ids, tgt_ids = encode_pairs(
        ref.train, ref.src_tokenizer, ref.tgt_tokenizer, pre_normalized=True
    )
    assert prepared.n_train == len(ref.train) > 50
    assert [prepared.src[i].tolist() for i in range(prepared.n_train)] == src_ids
    assert [prepared.tgt[i].tolist() for i in range(prepared.n_train)] == tgt_ids
    assert prepared.held_out("valid")[1] == ref.valid and prepared.held_out("test")[1] == ref.test
    split = prepared.manifest["split"]
    assert (split["n"], split["fingerprint"]) == (ref.split.n, ref.split.fingerprint)


def test_a_changed_source_file_is_named(tmp_path, corpus_file):
    data = tmp_path / "en-fr.txt"
    data.write_bytes(corpus_file.read_bytes())
    folder = prepare_corpus(tiny_config(data=str(data)), tmp_path / "bin")
    with open(data, "a", encoding="utf-8") as f:
        f.write("One more.\tEncore un.\n")
    r = qkv_here("train", "--data", str(folder), "--out", str(tmp_path / "run"), "--max-steps", "2")
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"qkv train: error: --data: '{data}' changed since it was prepared "
                           f"into '{folder}' (size ")  # fmt: skip
    assert f"qkv prepare --data {data} --out {folder}" in line


def test_a_setting_the_corpus_was_not_made_with_is_named(tmp_path, corpus_file):
    folder = prepare_corpus(tiny_config(data=str(corpus_file)), tmp_path / "bin")
    r = qkv_here("train", "--data", str(folder), "--out", str(tmp_path / "run"),
                 "--set", "split_seed=3")  # fmt: skip
    assert r.returncode == 2
    assert "split_seed: the prepared corpus" in r.stderr and "was made with 0, given 3" in r.stderr


STEPS = 24


def _train_args(data, out):
    return [
        "train", "--data", str(data), "--out", str(out), "--max-steps", str(STEPS),
        "--save-every", "7", "--eval-every", "1000", "--log-every", "10", "--threads", "1",
        "--max-tokens", "500", "--warmup-steps", "5", "--lr", "3e-3", "--seed", "3",
        "--set", "eval_sentences=5", "--set", "model.num_hiddens=32",
        "--set", "model.ffn_num_hiddens=64", "--set", "model.num_heads=2",
        "--set", "model.num_enc_layers=1", "--set", "model.num_dec_layers=1",
        "--set", "model.dropout=0.2", "--set", "average_last=1", "--set", "tune_decoding=false",
    ]  # fmt: skip


def test_a_run_on_prepared_data_killed_mid_epoch_resumes_exactly(tmp_path, corpus_file):
    folder = prepare_corpus(
        tiny_config(data=str(corpus_file)).updated(_SPM | {"valid": 40, "test": 40}),
        tmp_path / "bin",
    )
    ref_out, cut_out = tmp_path / "reference", tmp_path / "interrupted"
    first = cut_out / "checkpoints" / "step-00000007" / "manifest.json"
    kill_when_checkpointed(_train_args(folder, cut_out), first.parent)
    killed_at = json.loads((first.parent / "trainer.json").read_text())["data"]
    assert killed_at["epoch"] == 0 and killed_at["batch_index"] == 7  # mid-epoch
    resumed = qkv_here(*_train_args(folder, cut_out), "--resume")
    assert resumed.returncode in ENDED, resumed.stderr
    reference = qkv_here(*_train_args(folder, ref_out))
    assert reference.returncode in ENDED, reference.stderr
    a = latest_checkpoint(ref_out / "checkpoints")
    b = latest_checkpoint(cut_out / "checkpoints")
    assert a.name == b.name == f"step-{STEPS:08d}"
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ta, tb = (json.loads((c / "trainer.json").read_text())["data"] for c in (a, b))
    assert ta == tb
    split = json.loads((b / "split.json").read_text())
    assert split["type"] == "qkv.PreparedSplit" and split["corpus"] == str(folder)


def test_evaluate_scores_the_held_out_parts_of_a_prepared_run(tmp_path, corpus_file):
    from qkv.train import train
    from qkv.train.run_data import saved_run_pairs

    config = tiny_config(data=str(corpus_file), max_steps=2, eval_every=2, save_every=2)
    folder = prepare_corpus(config, tmp_path / "bin")
    train(config.updated({"data": str(folder)}), tmp_path / "run", progress=False)
    pairs, what = saved_run_pairs(tmp_path / "run", "test")
    assert what == f"the test split of the prepared corpus {folder}"
    a = _setup(config, tmp_path / "a")
    assert [t for _, t in pairs] == a.data.raw_test and len(pairs) == 40
    with pytest.raises(ValueError, match="part: the run trained on the prepared corpus"):
        saved_run_pairs(tmp_path / "run", "train")
    assert np.array_equal(PreparedCorpus(folder).src.lengths, [len(x) for x in a.batcher._src])


def test_cleaning_drops_copies_long_ratios_and_duplicates_of_the_training_pairs(
    tmp_path, corpus_file
):
    from qkv.data import read_pairs, write_pairs
    from qkv.data.prepared import Cleaning

    pairs = read_pairs(corpus_file)[0]
    dirty = [*pairs, *pairs[:50], ("Same text.", "Same text."), ("Yes.", "Oui. " * 30)]
    data = tmp_path / "dirty.txt"
    write_pairs(data, dirty)
    config = tiny_config(data=str(data))
    clean = Cleaning(max_ratio=4, dedup=True, drop_copies=True)
    folder = prepare_corpus(config, tmp_path / "bin", cleaning=clean)
    report = json.loads((folder / "report.json").read_text())
    raw = PreparedCorpus(folder)
    plain = prepare_corpus(config, tmp_path / "plain")
    n_plain = PreparedCorpus(plain).n_train
    assert report["dropped"]["source = target"] == 1
    assert report["dropped"]["length ratio"] == 1
    duplicates = report["dropped"]["duplicate"]
    assert 0 < duplicates <= 50  # the copies of held-out pairs are held out with them
    assert raw.n_train == n_plain - 2 - duplicates == report["pairs"]["train"]
    assert raw.manifest["settings"]["cleaning"]["dedup"] is True


# ---------------------------------------------------------------------------- qkv train FILE
def test_which_data_files_a_run_prepares_into_its_folder(tmp_path, corpus_file, monkeypatch):
    import gzip

    import qkv.train.corpus as corpus
    from qkv.train.corpus import data_bytes, prepare_reason

    size = corpus_file.stat().st_size
    config = tiny_config(data=str(corpus_file))
    assert prepare_reason(config) is None  # small: read into memory
    assert prepare_reason(config.updated({"prepare_data": "always"})) == "prepare_data=always"
    monkeypatch.setattr(corpus, "PREPARE_ABOVE", size - 1)
    assert "above the" in prepare_reason(config) and "--prepare-data never" in prepare_reason(
        config
    )
    assert prepare_reason(config.updated({"prepare_data": "never"})) is None
    monkeypatch.setattr(corpus, "PREPARE_ABOVE", size)
    assert prepare_reason(config) is None
    assert "x 2 processes" in prepare_reason(config, world_size=2)  # each rank holds a copy
    assert prepare_reason(tiny_config()) is None  # the bundled corpus
    folder = prepare_corpus(config, tmp_path / "bin")
    assert prepare_reason(config.updated({"data": str(folder), "prepare_data": "always"})) is None
    gz = tmp_path / "en-fr.txt.gz"
    gz.write_bytes(gzip.compress(corpus_file.read_bytes()))
    assert data_bytes(str(gz)) == size > gz.stat().st_size  # the text's size, from the trailer
    assert data_bytes([str(corpus_file), str(corpus_file)]) == 2 * size


@pytest.mark.parametrize("how", ["above the threshold", "always"])
def test_a_run_on_a_large_file_prepares_it_and_trains_on_the_same_batches(
    tmp_path, corpus_file, monkeypatch, how
):
    import qkv.train.corpus as corpus

    config = tiny_config(data=str(corpus_file), seed=4, **_SPM)
    if how == "always":
        big = config.updated({"prepare_data": "always"})
    else:
        monkeypatch.setattr(corpus, "PREPARE_ABOVE", 1000)
        big = config
    a = _setup(config.updated({"prepare_data": "never"}), tmp_path / "a")
    b = _setup(big, tmp_path / "b")
    assert a.data.prepared is None and b.data.prepared is not None
    assert b.data.prepared.folder == (tmp_path / "b" / "data").resolve()
    assert b.settings["data"] == str(corpus_file)  # train.json keeps the file the run was given
    assert a.data.src_tokenizer.tokens() == b.data.src_tokenizer.tokens()
    assert (a.data.valid, a.data.raw_test) == (b.data.valid, b.data.raw_test)
    assert a.model_config == b.model_config
    assert a.batcher.state_dict() == b.batcher.state_dict()
    xs, ys = list(a.batcher), list(b.batcher)
    assert len(xs) == len(ys) > 3
    for x, y in zip(xs, ys):
        for f in ("src", "src_valid_lens", "tgt_in", "tgt_out", "tgt_valid_lens", "indices"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f


@pytest.fixture(scope="module")
def pairs_2600(tmp_path_factory) -> Path:
    """2,600 bundled pairs: a corpus whose own vocabulary (4,000) is above the small tiers'
    (2,000), so that which preset sized it shows."""
    path = tmp_path_factory.mktemp("corpus-2600") / "en-fr.txt"
    write_pairs(path, bundled_pairs()[:2600])
    return path


def _slow_machine(monkeypatch, native_bf16: bool = False) -> list:
    """Every speed measurement from a fake machine (the reference tier's model at 500 tokens/s,
    a sixth of the reference machine's, any other at 2,000, and 1.6 times those in bfloat16
    where it has ``native_bf16``: a 3-minute budget chooses cpu-micro, capped at 2,000 pieces),
    recorded (with the precision, on such a machine); a measurement not made through
    :class:`qkv.train.presets.OneMeasurement` fails."""
    import qkv.train.presets as presets

    calls = []

    def machine(model, vocab, max_tokens, seconds, *, bf16=False):
        shape = (model["num_enc_layers"], model["num_dec_layers"], model["num_hiddens"], vocab)
        calls.append((*shape, bf16) if native_bf16 else shape)
        reference = model == dict(presets.TIERS[presets.REFERENCE_TIER][2], dropout=0.1)
        return (500.0 if reference else 2000.0) * (1.6 if bf16 else 1.0)

    def elsewhere(*_a):
        raise AssertionError("the speed measured outside the run's one measurement")

    monkeypatch.setattr(presets, "measure_speed", machine)
    monkeypatch.setattr(presets, "native_bf16", lambda: native_bf16)  # not this CPU's
    monkeypatch.setitem(presets.resolve_config.__kwdefaults__, "probe", elsewhere)
    return calls


_TIMED = {**_SPM, "max_tokens": None, "lr": None, "max_minutes": 3.0, "max_steps": None,
          "model": {"kind": "transformer"}}  # fmt: skip


def test_a_run_that_prepares_its_file_measures_the_machine_once(tmp_path, pairs_2600, monkeypatch):
    """The prepared corpus's vocabulary and the run's preset follow one measurement of the
    machine's speed: each model the probe times is timed once (the probe's share of the
    budget spent once), and the corpus's vocabulary is the one of the tier the run trains."""
    calls = _slow_machine(monkeypatch)
    config = tiny_config(data=str(pairs_2600), prepare_data="always", **_TIMED)
    run = _setup(config, tmp_path / "run")
    assert run.data.prepared is not None
    preset = run.state.preset
    assert preset["name"] == "cpu-micro" and "measured 2,000 tokens/s" in preset["reason"]
    assert len(calls) == len(set(calls)) == 2, calls  # the reference's model, then the chosen's
    assert [c[-1] for c in calls] == [4000, 2000]  # each with its tier's vocabulary
    manifest = json.loads((run.data.prepared.folder / "manifest.json").read_text())
    assert manifest["resolved"]["vocab_size"] == run.config.vocab_size == 2000
    assert preset["notes"] == []


def test_a_machine_with_bf16_is_measured_in_both_precisions_once(tmp_path, pairs_2600, monkeypatch):
    """On a CPU with bfloat16 arithmetic the run that prepares its file measures the reference
    model in float32 and in bfloat16, then the chosen tier's in bfloat16, once for the corpus
    and the run together, and trains in bfloat16."""
    calls = _slow_machine(monkeypatch, native_bf16=True)
    config = tiny_config(data=str(pairs_2600), prepare_data="always", **_TIMED)
    run = _setup(config, tmp_path / "run")
    preset = run.state.preset
    assert preset["name"] == "cpu-micro" and "3,200 tokens/s on" in preset["reason"]
    assert "in bfloat16" in preset["reason"] and run.config.bf16 is True
    assert [(c[-2], c[-1]) for c in calls] == [(4000, False), (4000, True), (2000, True)], calls


def test_a_prepared_corpus_keeps_its_vocabulary_whatever_the_tier(
    tmp_path, pairs_2600, monkeypatch
):
    """A corpus prepared for no budget (``qkv prepare``: its own vocabulary of 4,000), trained
    in 3 minutes on a machine whose speed chooses cpu-micro (2,000 pieces): the run trains on the
    corpus's tokenizers, its speed measured with their vocabulary, and says so, where it
    refused to start (the corpus "made with 4000, the
    run resolves it to 2000")."""
    calls = _slow_machine(monkeypatch)
    untimed = tiny_config(data=str(pairs_2600), **{**_SPM, "max_steps": None})
    folder = prepare_corpus(untimed, tmp_path / "corpus")
    assert PreparedCorpus(folder).manifest["resolved"]["vocab_size"] == 4000
    run = _setup(tiny_config(data=str(folder), **_TIMED), tmp_path / "run")
    assert run.state.preset["name"] == "cpu-micro"
    assert run.config.vocab_size == 4000
    # the machine measured by the reference model as it is swept (its own 4,000 pieces at
    # 2,340 pairs), the chosen one with the vocabulary it trains
    assert [c[-1] for c in calls] == [4000, 4000]
    assert run.state.preset["notes"] == [
        "the data's vocab_size 4000 kept (the tier's: 2000, which qkv prepare --max-minutes 3 "
        "gives a corpus)"
    ]


def test_qkv_prepare_sizes_the_vocabulary_for_the_runs_budget(
    tmp_path, pairs_2600, monkeypatch, capsys
):
    """``qkv prepare --max-minutes 3`` measures the machine as a 3-minute run does and gives
    the corpus the vocabulary of the tier that run then chooses: the run keeps it, with nothing
    to note. Without a budget it gives the corpus size's vocabulary, and says how to size it
    for short runs; the same folder prepared for a budget is prepared again, once."""
    from qkv.cli import main
    from qkv.data.prepared import prepare_command

    calls = _slow_machine(monkeypatch)
    folder = tmp_path / "corpus"
    prep = ["prepare", "--data", str(pairs_2600), "--out", str(folder), "--workers", "1",
            "--set", "valid=40", "--set", "test=40"]  # fmt: skip
    assert main(prep) == 0
    said = capsys.readouterr().err
    assert calls == []  # no budget: nothing measured
    assert PreparedCorpus(folder).manifest["resolved"]["vocab_size"] == 4000
    assert (
        "vocabulary: 4,000 pieces, for 2,520 training pairs and runs of any budget (a CPU run of "
        "a few minutes would choose 2,000: --max-minutes M sizes it for runs of M minutes)"
    ) in said
    said = []
    for _ in range(2):
        assert main([*prep, "--max-minutes", "3", "--device", "cpu"]) == 0
        said.append(capsys.readouterr().err)
    first, again = said
    manifest = PreparedCorpus(folder).manifest
    assert manifest["resolved"]["vocab_size"] == 2000
    assert "vocabulary: 2,000 pieces, for the runs' preset cpu-micro: 2520 training pairs" in first
    assert "measured 2,000 tokens/s" in first
    assert "nothing to do" in again and "vocabulary" not in again
    assert [c[-1] for c in calls] == [4000, 2000]  # measured as the run measures, once
    assert prepare_command(folder, manifest).endswith(" --max-minutes 3 --device cpu")
    calls.clear()
    run = _setup(tiny_config(data=str(folder), **_TIMED), tmp_path / "run")
    assert run.state.preset["name"] == "cpu-micro" and run.config.vocab_size == 2000
    assert run.state.preset["notes"] == []


@pytest.mark.slow
def test_a_run_that_prepared_its_file_resumes_from_its_folder_exactly(tmp_path, corpus_file):
    """Killed mid-epoch, resumed: the prepared folder found again (not prepared again), and the
    weights those of a run that read the same file into memory."""
    ref_out, cut_out = tmp_path / "in-memory", tmp_path / "prepared"
    args = [*_train_args(corpus_file, cut_out), "--prepare-data", "always"]
    first = cut_out / "checkpoints" / "step-00000007"
    kill_when_checkpointed(args, first)
    manifest = cut_out / "data" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    resumed = qkv_here(*args, "--resume")
    assert resumed.returncode in ENDED, resumed.stderr
    assert "data: preparing" not in resumed.stderr and manifest.stat().st_mtime_ns == stamp
    reference = qkv_here(*_train_args(corpus_file, ref_out), "--prepare-data", "never")
    assert reference.returncode in ENDED, reference.stderr
    assert not (ref_out / "data").exists()
    a = latest_checkpoint(ref_out / "checkpoints")
    b = latest_checkpoint(cut_out / "checkpoints")
    assert a.name == b.name == f"step-{STEPS:08d}"
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    split = json.loads((b / "split.json").read_text())
    assert split["type"] == "qkv.PreparedSplit" and split["corpus"] == str(cut_out / "data")
    train_json = json.loads((b / "train.json").read_text())
    assert train_json["data"] == str(corpus_file)


def test_a_run_that_prepares_says_so_in_one_line(tmp_path, corpus_file):
    out = tmp_path / "run"
    r = qkv_here("train", "--data", str(corpus_file), "--out", str(out), "--max-steps", "1",
                 "--prepare-data", "always", "--set", "tokenizer=word", "--threads", "1")  # fmt: skip
    assert r.returncode in ENDED, r.stderr
    said = [line for line in r.stderr.splitlines() if "data: preparing" in line]
    assert len(said) == 1 and f"into {out.resolve() / 'data'} (prepare_data=always)" in said[0]
    bad = qkv_here("train", "--data", str(corpus_file), "--out", str(tmp_path / "x"),
                   "--prepare-data", "sometimes")  # fmt: skip
    assert bad.returncode == 2
    assert "--prepare-data: expected 'auto', 'always' or 'never'" in bad.stderr.splitlines()[-1]


def test_workers_fork_only_a_process_of_one_thread(tmp_path, corpus_file, monkeypatch):
    """A fork copies the locks other threads hold (a notebook's kernel, a server, a test
    runner's I/O thread): with one alive the workers start from a fork server, and the corpus
    is the one prepared without workers."""
    import threading

    from qkv.train import corpus

    with monkeypatch.context() as m:
        m.setattr(corpus, "threads_running", lambda: 1)
        assert corpus.start_method() == "fork"
        m.setattr(corpus, "threads_running", lambda: 3)  # a library's threads Python never saw
        assert corpus.start_method() == "forkserver"
        m.setattr(corpus, "threads_running", lambda: None)  # no /proc: Python's count
        m.setattr(corpus.threading, "active_count", lambda: 1)
        assert corpus.start_method() == "fork"
    config = tiny_config(data=str(corpus_file), seed=4)
    alone = prepare_corpus(config, tmp_path / "alone", workers=1)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert corpus.start_method() == "forkserver"
        served = prepare_corpus(config, tmp_path / "served", workers=2)
    finally:
        stop.set()
        other.join()
    names = sorted(p.relative_to(alone) for p in alone.rglob("*") if p.is_file())
    assert {"train.src.tok", "train.tgt.idx", "valid.jsonl"} <= {n.name for n in names}
    for name in names:
        if name.name not in ("manifest.json", "report.json"):  # they say how long it took
            assert (alone / name).read_bytes() == (served / name).read_bytes(), name


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc")
def test_a_fork_servers_workers_are_forked_with_torch_already_loaded(monkeypatch):
    """A pool started from a fork server: the server imports the prepare's module (torch and
    qkv) once, and its workers, forked from it, start with them loaded; else each worker of
    every pool imports them itself (about 2 s of CPU each)."""
    from qkv.train import corpus

    monkeypatch.setattr(corpus, "start_method", lambda: "forkserver")
    with corpus._pool(2) as pool:
        server = pool.apply(os.getppid)
    assert server != os.getpid()
    with open(f"/proc/{server}/maps") as f:
        assert "libtorch" in f.read()


# a run's handlers installed (as qkv train installs them), then a prepare's pool: forked in a
# process of one thread, its workers would run the run's handler on the SIGTERM the pool's end
# sends them (a traceback each)
_WORKERS_UNDER_A_RUNS_HANDLERS = """
import signal
from qkv.train.corpus import _pool, start_method
from qkv.train.interrupt import StopSignals

with StopSignals(lambda signum: None):
    method = start_method()  # the pool's: after it, its threads may still be exiting
    with _pool(2) as pool:
        got = pool.apply(signal.getsignal, (signal.SIGTERM,)), pool.apply(signal.getsignal, (signal.SIGINT,))
print(method, got == (signal.SIG_DFL, signal.SIG_IGN))
"""


def test_a_prepares_workers_do_not_run_the_runs_signal_handlers():
    res = subprocess.run(
        [sys.executable, "-c", _WORKERS_UNDER_A_RUNS_HANDLERS],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["fork", "True"], (res.stdout, res.stderr)
