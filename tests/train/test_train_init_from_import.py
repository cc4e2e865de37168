"""qkv train --init-from a model qkv import wrote (a transformers MarianMTModel): the imported
tokenizers (SentencePiece with Marian's vocabulary and special ids), vocabulary and architecture
are kept, the batches use the model's own ids (<pad> as padding and decoder start, </s> as end),
and the run is planned as fine-tuning: a fine-tuning learning rate, the starting weights
validated as update 0 and kept as checkpoint 0."""

from __future__ import annotations

import json

import pytest
import torch
from _hf_models import corpus
from _train_helpers import ENDED

from qkv.cli import main
from qkv.data import load_tokenizers, write_pairs
from qkv.inference import load_model
from qkv.interop.importer import import_model
from qkv.train import TrainConfig, train
from qkv.train.presets import FINE_TUNING_LR


@pytest.fixture(scope="module")
def imported(marian_folder, tmp_path_factory):
    return import_model(marian_folder, tmp_path_factory.mktemp("imported") / "model").path


@pytest.fixture(scope="module")
def domain(tmp_path_factory):
    path = tmp_path_factory.mktemp("domain") / "domain.tsv"
    train_pairs, _ = corpus(n_train=300, n_test=0, seed=3)
    write_pairs(path, train_pairs)
    return path


def _config(data, **changes) -> TrainConfig:
    base = {
        "data": str(data),
        "valid": 20,
        "test": 20,
        "max_steps": 4,
        "eval_every": 2,
        "save_every": 2,
        "eval_sentences": 20,
        "threads": 1,
        "tune_decoding": False,
        "average_last": 0,
        "src_lang": "en",
        "tgt_lang": "fr",
    }
    base.update(changes)
    return TrainConfig().updated(base)


def test_fine_tuning_an_import_keeps_it_and_starts_from_its_validation(
    imported, domain, tmp_path, monkeypatch
):
    seen = []
    from qkv.train import prepare

    real = prepare.TokenBatcher

    def spy(*args, **kw):
        seen.append({k: kw.get(k) for k in ("pad_id", "bos_id", "eos_id")})
        return real(*args, **kw)

    monkeypatch.setattr(prepare, "TokenBatcher", spy)
    result = train(_config(domain), tmp_path, init_from=imported, progress=False)
    start = load_model(imported)
    src, tgt = start.src_tokenizer, start.tgt_tokenizer
    # the batches: Marian's <pad> pads and starts the decoder, </s> ends
    want = {"pad_id": tgt.pad_id, "bos_id": tgt.bos_id, "eos_id": tgt.eos_id}
    assert seen == [want, want] and tgt.bos_id == tgt.pad_id != 2
    # update 0: the imported weights validated and kept as they are
    assert result.history[0]["step"] == 0 and "valid_bleu" in result.history[0]
    ckpt0 = load_model(tmp_path / "checkpoints" / "step-00000000")
    for key, value in start.model.state_dict().items():
        assert torch.equal(ckpt0.model.state_dict()[key], value), key
    # the run: a fine-tuning rate, the import's architecture and tokenizers
    state = json.loads((tmp_path / "checkpoints" / "step-00000004" / "trainer.json").read_text())
    assert state["resolved_config"]["lr"] == state["preset"]["lr"] == FINE_TUNING_LR
    # and the usual label smoothing, recorded as trained, whatever the budget's epochs
    assert state["resolved_config"]["label_smoothing"] == state["preset"]["label_smoothing"] == 0.1
    final = load_model(result.final_model)
    assert final.model.config == start.model.config
    assert final.model.config.activation == "swish" and final.model.config.scale_embedding
    f_src, f_tgt = load_tokenizers(result.final_model / "tokenizers")
    assert f_src.kind == f_tgt.kind == "sentencepiece-vocab"
    assert (f_tgt.tokens(), f_tgt.bos_id, f_tgt.eos_id) == (tgt.tokens(), tgt.bos_id, tgt.eos_id)
    assert f_src.encode("The cat is here.") == src.encode("The cat is here.")
    # and it moved: the fine-tuned weights are not the imported ones (the final model is the
    # best validated, which for an untrained import may be the starting point itself)
    last = load_model(tmp_path / "checkpoints" / "step-00000004").model.state_dict()
    assert not torch.equal(
        last["decoder.dense.bias"], start.model.state_dict()["decoder.dense.bias"]
    )


def test_the_command_line_fine_tunes_an_import(imported, domain, tmp_path, capsys):
    code = main(
        ["train", "--init-from", str(imported), "--data", str(domain), "--out",
         str(tmp_path / "run"), "--max-steps", "2", "--set", "valid=20", "--set", "test=20",
         "--set", "eval_sentences=10", "--set", "tune_decoding=false", "--quiet"]
    )  # fmt: skip
    assert code in ENDED
    assert (tmp_path / "run" / "checkpoints" / "step-00000000").is_dir()
    history = json.loads((tmp_path / "run" / "final" / "trainer.json").read_text())["history"]
    assert history[0]["step"] == 0


def test_settings_that_contradict_an_import_are_refused(imported, domain, tmp_path):
    with pytest.raises(ValueError, match="tokenizer: the model's 'sentencepiece', given 'word'"):
        train(_config(domain, tokenizer="word"), tmp_path, init_from=imported, progress=False)


def test_fine_tuning_an_import_with_subword_sampling(imported, domain, tmp_path, monkeypatch):
    """--subword-alpha on an import: each epoch's training ids are sampled through the model's
    own vocabulary (they differ from the plain encoding and stay in the vocabulary), and the
    run trains."""
    from qkv.train import prepare

    real, seen = prepare.TokenBatcher, []

    def spy(*args, **kw):
        if kw.get("resample") is not None:
            seen.append(kw["resample"](0))
        return real(*args, **kw)

    monkeypatch.setattr(prepare, "TokenBatcher", spy)
    result = train(_config(domain, subword_alpha=0.1), tmp_path, init_from=imported,
                   progress=False)  # fmt: skip
    assert result.final_model.is_dir() and len(seen) == 1
    start = load_model(imported)
    src, tgt = start.src_tokenizer, start.tgt_tokenizer
    sampled_src, sampled_tgt = seen[0]
    assert all(0 <= i < src.vocab_size for ids in sampled_src for i in ids)
    assert all(i not in (tgt.pad_id, tgt.eos_id) for ids in sampled_tgt for i in ids)
    pairs = [line.split("\t") for line in domain.read_text().splitlines()]
    plain = {tuple(src.encode(s)) for s, _ in pairs}
    assert sum(tuple(ids) not in plain for ids in sampled_src) > 10
