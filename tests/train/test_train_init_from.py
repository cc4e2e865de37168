"""--init-from: a new run (update 0, fresh optimizer and schedule) from a saved model's weights,
architecture and tokenizers; contradicting settings are refused before any data is read."""

from __future__ import annotations

import json

import pytest
import torch
from _train_helpers import TINY, tiny_config

from qkv.cli import main
from qkv.data import Normalizer, build_tokenizers, bundled_pairs, save_tokenizers
from qkv.nn.seq2seq import Seq2SeqConfig, build_model
from qkv.train import CheckpointError, train
from qkv.train.checkpoint import write_model_folder


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """A model folder (untrained, tiny Transformer, book-normalised word vocabularies)."""
    folder = tmp_path_factory.mktemp("init") / "model"
    src, tgt = build_tokenizers(bundled_pairs()[:300], "word", normalizer=Normalizer.book())
    options = {k: v for k, v in TINY["transformer"].items() if k != "kind"}
    config = Seq2SeqConfig(src.vocab_size, tgt.vocab_size, **options)
    write_model_folder(
        folder,
        step=7,
        state_dict=build_model(config).state_dict(),
        model_config=config.to_dict(),
        write_tokenizers=lambda d: save_tokenizers(d, src, tgt),
        documents={"train.json": {}, "split.json": {}, "trainer.json": {}},
    )
    return folder


@pytest.fixture
def no_data(monkeypatch):
    def read(*a, **k):
        raise AssertionError("the data was read")

    monkeypatch.setattr("qkv.train.prepare.read_run_files", read)


@pytest.mark.parametrize(
    ("kind", "changes", "named"),
    [
        ("transformer", {"model.num_hiddens": 64}, "model.num_hiddens: the model's 32, given 64"),
        ("bahdanau", {}, "model: the model's 'transformer', given 'bahdanau'"),
        ("transformer", {"tokenizer": "sentencepiece"}, "tokenizer: the model's 'word', given"),
        ("transformer", {"vocab_size": 99}, "vocab_size: the model's"),
    ],
)
def test_settings_that_contradict_the_model_are_refused_first(
    untrained, tmp_path, no_data, kind, changes, named
):
    config = tiny_config(kind).updated(changes)
    with pytest.raises(
        ValueError, match=r"^init_from: the model in .* fixes the architecture"
    ) as e:
        train(config, tmp_path, init_from=untrained, progress=False)
    assert named in str(e.value)


def test_dropout_may_change(untrained, tmp_path, no_data):
    config = tiny_config().updated({"model.dropout": 0.3})
    with pytest.raises(AssertionError, match="the data was read"):  # the settings passed
        train(config, tmp_path, init_from=untrained, progress=False)


def test_init_from_with_resume_or_from_nothing_is_refused(untrained, tmp_path, no_data, capsys):
    with pytest.raises(ValueError, match=r"^init_from: a resumed run"):
        train(tiny_config(), tmp_path, resume=True, init_from=untrained, progress=False)
    assert main(["train", "--out", str(tmp_path), "--resume", "--init-from", str(untrained)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("qkv train: error: --init-from: --resume continues") and err.count("\n") == 1
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"^init_from: .*holds no qkv checkpoint"):
        train(tiny_config(), tmp_path / "run", init_from=empty, progress=False)
    assert main(["train", "--out", str(tmp_path / "run"), "--init-from", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv train: error: --init-from: ") and "Traceback" not in err


def _valid_loss(result, step):
    return next(h["valid_loss"] for h in result.history if h["step"] == step and "valid_loss" in h)


def test_a_run_from_another_starts_at_update_0_with_its_validation_loss(tmp_path, corpus_file):
    quick = {"data": str(corpus_file), "tune_decoding": False, "average_last": 0}
    first = train(
        tiny_config(**quick, max_steps=20, eval_every=20, save_every=20), tmp_path / "a",
        progress=False,
    )  # fmt: skip
    start = tmp_path / "a" / "checkpoints" / "step-00000020"
    # one update at a negligible learning rate: the validation loss is the model's own
    tiny_lr = tiny_config(**quick, max_steps=1, eval_every=1, lr=1e-9)
    tuned = train(tiny_lr, tmp_path / "b", init_from=start, progress=False)
    fresh = train(tiny_lr, tmp_path / "c", progress=False)
    assert tuned.step == 1 and tuned.resumed_from is None
    assert abs(_valid_loss(tuned, 1) - _valid_loss(first, 20)) < 1e-3
    assert _valid_loss(fresh, 1) - _valid_loss(first, 20) > 0.5
    ckpt = tmp_path / "b" / "checkpoints" / "step-00000001"
    trainer = json.loads((ckpt / "trainer.json").read_text())
    assert trainer["init_from"] == {"path": str(start), "step": 20}
    assert torch.load(ckpt / "trainer.pt", weights_only=True)["schedule"]["last_step"] == 1
    # the vocabulary is the first run's
    for side in ("src", "tgt"):
        a = (start / "tokenizers" / side / "tokenizer.json").read_text()
        assert (ckpt / "tokenizers" / side / "tokenizer.json").read_text() == a
