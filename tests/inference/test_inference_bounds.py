"""qkv.inference.bounds: every size a model folder states is checked against sane bounds, its
weight file and the memory available before anything is allocated (issue 27, row 4).

A tampered folder whose manifest was rewritten to match (``beam_size: 1000000``,
``num_hiddens: 1000000``, ``num_enc_layers: 1000000``) took the machine down: OOM-killed at
20 GB, or hung building a million layers. Each case is refused here in one line naming the file
and the field, and the model is never built (``build_model`` is watched); the memory available
is mocked, never exhausted.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from _folders import one_line, tamper_json

import qkv.inference.bounds as bounds
import qkv.inference.saved as saved_module
from qkv.cli import main
from qkv.data import WordTokenizer, bundled_pairs
from qkv.inference import CheckpointError, Decoding, load_model, save_model
from qkv.inference.bounds import (
    LIMITS,
    check_decoding,
    check_model_config,
    min_model_bytes,
    min_parameters,
)
from qkv.nn import Seq2SeqConfig, build_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny model folder (16 wide, a vocabulary of a few hundred words), beam 2."""
    tok = WordTokenizer.train([s for s, _ in bundled_pairs()[:300]], min_freq=1)
    config = Seq2SeqConfig(tok.vocab_size, tok.vocab_size, num_hiddens=16, ffn_num_hiddens=32,
                           num_heads=2, num_enc_layers=1, num_dec_layers=1)  # fmt: skip
    model = build_model(config)
    return save_model(model, tok, tok, tmp_path_factory.mktemp("m") / "model",
                      decoding=Decoding(beam_size=2))  # fmt: skip


@pytest.fixture
def copy(folder, tmp_path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "model"))


@pytest.fixture
def never_built(monkeypatch) -> list:
    """``build_model`` of the loader, watched: a test asserts nothing was built."""
    calls: list = []

    def watched(config):
        calls.append(config)
        raise AssertionError("the model was built")

    monkeypatch.setattr(saved_module, "build_model", watched)
    return calls


def _translate(folder: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["translate", "--model-dir", str(folder), "--quiet", "go now"])
    return rc, err.getvalue()


# ---------------------------------------------------------------------------- the estimates
@pytest.mark.parametrize(
    "over",
    [
        {},
        {"pos_encoding": "learned", "max_len": 64},
        {"pos_encoding": "rotary"},
        {"tie_embeddings": True, "use_bias": True},
        {"share_embeddings": True, "src_vocab_size": 50, "tgt_vocab_size": 50},
        {"kind": "bahdanau", "embed_size": 24, "num_enc_layers": 2, "num_dec_layers": 2},
        {"kind": "bahdanau", "embed_size": 32, "tie_embeddings": True},
    ],
)
def test_the_estimates_are_lower_bounds_close_to_the_model(over):
    c = Seq2SeqConfig(**{"src_vocab_size": 50, "tgt_vocab_size": 60, "num_hiddens": 32,
                         "ffn_num_hiddens": 64, "num_heads": 2, "num_enc_layers": 2,
                         "num_dec_layers": 2, "max_len": 128, **over})  # fmt: skip
    model = build_model(c)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert 0.6 * params <= min_parameters(c) <= params
    assert min_model_bytes(c) <= 4 * params + buffers


def test_sizes_in_bounds_pass_and_each_limit_is_named():
    c = Seq2SeqConfig(100, 100, num_hiddens=16, ffn_num_hiddens=32, num_heads=2)
    assert check_model_config(c.to_dict(), weights_bytes=10**8) == c
    assert check_decoding(Decoding(beam_size=5), tgt_vocab_size=100).beam_size == 5
    for key in ("num_enc_layers", "num_hiddens", "src_vocab_size", "max_len"):
        with pytest.raises(ValueError, match=rf"^{key}: .* is more than qkv reads"):
            check_model_config({**c.to_dict(), key: LIMITS[key] + 1})
    for key in ("beam_size", "max_tokens", "max_output_len", "no_repeat_ngram"):
        with pytest.raises(ValueError, match=rf"^{key}: .* is more than qkv reads"):
            check_decoding(Decoding(**{key: LIMITS[key] + 1}))


# ---------------------------------------------------------------------------- a folder
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_enc_layers": 10**6}, r"num_enc_layers: 1,000,000 is more than qkv reads"),
        ({"num_hiddens": 10**6, "num_heads": 1}, r"num_hiddens: 1,000,000 is more than qkv"),
        ({"num_hiddens": 1 << 16, "num_heads": 1}, r"its weight file holds .* bytes"),
        ({"src_vocab_size": 10**6}, r"its weight file holds .* bytes"),
        ({"max_len": 10**9}, r"max_len: 1,000,000,000 is more than qkv reads"),
    ],
    ids=[
        "a million layers",
        "a million wide",
        "wider than its weights",
        "a million words",
        "a billion positions",
    ],
)
def test_a_tampered_model_json_is_refused_before_the_model_is_built(
    copy, never_built, change, named
):
    meta = json.loads((copy / "model.json").read_text())
    tamper_json(copy, "model.json", config={**meta["config"], **change})
    with pytest.raises(CheckpointError, match=rf"model\.json in .* is invalid: .*{named}"):
        load_model(copy)
    assert never_built == []
    rc, err = _translate(copy)
    assert rc == 2 and "model.json in" in one_line(err, "translate")
    assert never_built == []


def test_a_model_larger_than_the_memory_available_is_refused_before_it_is_built(
    copy, never_built, monkeypatch
):
    # consistent sizes (the weight file is big enough), but the machine is small
    monkeypatch.setattr(bounds, "available_memory", lambda: 1000)
    with pytest.raises(CheckpointError, match=r"model\.json in .* needs at least .* available"):
        load_model(copy)
    assert never_built == []


def test_a_tampered_decoding_json_is_refused_before_decoding(copy, monkeypatch):
    tamper_json(copy, "decoding.json", beam_size=10**6, n_best=1)
    with pytest.raises(CheckpointError, match=r"decoding\.json in .* beam_size: 1,000,000 is"):
        load_model(copy)
    rc, err = _translate(copy)
    assert rc == 2 and "decoding.json in" in one_line(err, "translate")
    tamper_json(copy, "decoding.json", beam_size=1000)  # in bounds, but not in this memory
    monkeypatch.setattr(bounds, "available_memory", lambda: 10**6)  # the model fits, the beam not
    with pytest.raises(CheckpointError, match=r"decoding\.json .* a beam of 1,000 needs"):
        load_model(copy)
    monkeypatch.setattr(bounds, "available_memory", lambda: None)  # where nothing says
    assert load_model(copy).decoding.beam_size == 1000


def test_the_memory_available_is_read_where_the_system_says_it():
    free = bounds.available_memory()
    assert free is None or free > 0
