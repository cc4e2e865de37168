"""qkv import's reading of a Hugging Face folder: what it keeps (tokenizers, languages, decoding,
card), what it refuses (one line naming the file or field), where it finds a Hub name (the
cache; no network in tests), and how it reads weights (safetensors header first, torch.load with
weights_only)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from qkv._errors import SettingError
from qkv.cli import main
from qkv.data import VocabSentencePieceTokenizer, load_tokenizers
from qkv.inference import Decoding, load_model
from qkv.interop import huggingface
from qkv.interop.importer import generation_decoding, import_model

transformers = pytest.importorskip("transformers")


@pytest.fixture
def folder(marian_folder, tmp_path):
    """A private copy of the untrained Marian folder, to change."""
    return shutil.copytree(marian_folder, tmp_path / "marian")


def _edit(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_the_import_keeps_tokenizers_languages_decoding_and_card(marian_folder, tmp_path):
    result = import_model(marian_folder, tmp_path / "out")
    saved = load_model(result.path)
    src, tgt = saved.src_tokenizer, saved.tgt_tokenizer
    assert isinstance(src, VocabSentencePieceTokenizer) and src.normalizer is None
    vocab = json.loads((marian_folder / "vocab.json").read_text())
    assert (tgt.pad_id, tgt.bos_id, tgt.eos_id, tgt.unk_id) == (
        vocab["<pad>"], vocab["<pad>"], vocab["</s>"], vocab["<unk>"],
    )  # fmt: skip
    assert saved.languages == result.languages == ("en", "fr")
    assert saved.decoding == Decoding(
        beam_size=4, max_output_len=39, early_stopping=False, forced_eos=True
    )
    card = (result.path / "README.md").read_text()
    assert "license: cc-by-4.0" in card and f"Imported from {marian_folder.name}" in card
    assert str(marian_folder) not in card  # a local folder by its name, never its path
    # the tokenizers read back as they were written
    again = load_tokenizers(result.path / "tokenizers")
    assert again[1].tokens() == tgt.tokens() and again[0].encode("Go home.") == src.encode(
        "Go home."
    )


def test_pytorch_weights_are_read_with_weights_only(folder, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    calls = []
    real = torch.load

    def spy(*args, **kw):
        calls.append(kw.get("weights_only"))
        return real(*args, **kw)

    monkeypatch.setattr(torch, "load", spy)
    result = import_model(folder, tmp_path / "out")
    assert calls and all(w is True for w in calls)
    assert load_model(result.path).model.config.activation == "swish"


def test_a_tensor_larger_than_the_config_allows_is_refused_before_it_is_read(folder, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["model.encoder.layers.0.fc1.weight"] = torch.zeros(4096, 4096)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(SettingError, match="larger than any tensor of the model"):
        import_model(folder, tmp_path / "out")


@pytest.mark.parametrize(
    "change, says",
    [
        ({"model_type": "bart"}, "a 'bart' model; qkv imports Marian"),
        ({"model_type": "m2m_100"}, "an M2M100/NLLB model needs a fixed position table"),
        ({"activation_function": "gelu_new"}, "activation_function: expected one of"),
        ({"decoder_attention_heads": 2}, "decoder_attention_heads: expected the same value"),
        ({"eos_token_id": 5}, "eos_token_id is 5, and the tokenizer's eos token is id 0"),
        ({"vocab_size": 9999}, r"embed_tokens.weight: expected shape \(9999, 64\), got"),
    ],
)
def test_a_folder_qkv_cannot_read_is_one_line_naming_what(folder, tmp_path, change, says):
    _edit(folder / "config.json", **change)
    with pytest.raises(SettingError, match=says) as e:
        import_model(folder, tmp_path / "out")
    assert e.value.key == "source" and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_missing_files_are_named(folder, tmp_path):
    (folder / "target.spm").unlink()
    with pytest.raises(SettingError, match=r"has no target\.spm"):
        import_model(folder, tmp_path / "out")
    (folder / "config.json").unlink()
    with pytest.raises(SettingError, match=r"has no config\.json"):
        import_model(folder, tmp_path / "out")


def test_a_hub_name_is_read_from_the_cache_and_never_waits_for_a_network(
    marian_folder, tmp_path, monkeypatch
):
    from huggingface_hub import errors

    asked = []

    def cached(name, patterns, offline):
        asked.append(offline)
        if name == "Helsinki-NLP/opus-mt-en-fr":
            return marian_folder
        raise errors.LocalEntryNotFoundError("not cached; no network")

    monkeypatch.setattr(huggingface, "_snapshot", cached)
    result = import_model("Helsinki-NLP/opus-mt-en-fr", tmp_path / "out")
    assert asked[0] is True and result.source == "Helsinki-NLP/opus-mt-en-fr"
    assert "# Helsinki-NLP/opus-mt-en-fr (imported)" in (result.path / "README.md").read_text()
    with pytest.raises(huggingface.HubUnreachable, match="not in the Hugging Face cache") as e:
        import_model("Helsinki-NLP/opus-mt-en-zz", tmp_path / "other")
    assert "qkv import DIR" in str(e.value) and e.value.key == "source"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked.clear()
    with pytest.raises(huggingface.HubUnreachable, match="HF_HUB_OFFLINE is set"):
        import_model("Helsinki-NLP/opus-mt-en-zz", tmp_path / "other")
    assert asked == [True]  # offline: the cache only


def test_the_command_says_what_it_wrote_and_names_the_argument_on_error(
    marian_folder, tmp_path, capsys, monkeypatch
):
    assert main(["import", str(marian_folder), "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "languages: en -> fr" in out and "decoding: beam 4" in out
    assert main(["translate", "--model-dir", str(tmp_path / "m"), "Hello."]) == 0
    capsys.readouterr()
    code = main(["import", "no/such-model-here", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("qkv import: error: SOURCE: no/such-model-here is not")
    assert len(err.splitlines()) == 1
    code = main(["import", str(marian_folder), "--out", str(tmp_path / "y"), "--tgt-lang", "zz"])
    assert code == 2 and "--tgt-lang: expected a language code" in capsys.readouterr().err


@pytest.mark.parametrize(
    "gen, want, notes",
    [
        ({}, Decoding(max_output_len=19), 0),  # transformers' defaults: max_length 20
        (
            {"num_beams": 5, "max_length": 512, "forced_eos_token_id": 0, "bad_words_ids": [[9]]},
            Decoding(beam_size=5, max_output_len=511, forced_eos=True, suppress=(9,)),
            0,
        ),
        (
            dict(
                num_beams=2,
                max_new_tokens=30,
                early_stopping="never",
                length_penalty=0.6,
                renormalize_logits=True,
                no_repeat_ngram_size=3,
            ),
            Decoding(
                beam_size=2,
                max_output_len=30,
                early_stopping="never",
                length_penalty=0.6,
                renormalize=True,
                no_repeat_ngram=3,
            ),
            0,
        ),
        (
            dict(bad_words_ids=[[9, 10]], repetition_penalty=1.2, do_sample=True),
            Decoding(max_output_len=19),
            3,
        ),
    ],
)
def test_generation_settings_become_the_decoding(gen, want, notes):
    got, said = generation_decoding(gen, eos_id=0, banned=(7,))
    assert got == want.replace(early_stopping=gen.get("early_stopping", False))
    assert len(said) == notes


def test_a_multi_target_model_records_its_targets_and_chooses_one(tmp_path):
    from _hf_models import build_marian

    folder, _ = build_marian(tmp_path / "m", "swish-multi", steps=0)
    result = import_model(folder, tmp_path / "a")
    assert result.targets == {"fr": ">>fra<<", "de": ">>deu<<"}
    assert result.languages == ("en", "fr")
    tok = load_model(result.path).src_tokenizer
    vocab = json.loads((folder / "vocab.json").read_text())
    assert tok.encode("Hi.")[0] == vocab[">>fra<<"]  # the default target, given to the text
    assert tok.encode(">>deu<< Hi.")[0] == vocab[">>deu<<"]  # a text that names one keeps it
    german = import_model(folder, tmp_path / "b", tgt_lang="de")
    assert german.languages == ("en", "de")
    assert load_model(german.path).src_tokenizer.encode("Hi.")[0] == vocab[">>deu<<"]
    with pytest.raises(SettingError, match=r"tgt_lang: expected one of the model's targets"):
        import_model(folder, tmp_path / "c", tgt_lang="es")
