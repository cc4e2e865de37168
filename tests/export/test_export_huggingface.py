"""qkv -> Hugging Face ``transformers``: the exported folder loads with ``AutoModelForSeq2SeqLM``
and ``AutoTokenizer`` (no missing or unexpected weight), computes qkv's logits, generates the
tokens ``qkv translate`` does with the model's decoding (greedy and beam, real text), runs in
``pipeline("translation")``, and carries a Hub-ready card; what no class expresses is refused."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import unicodedata

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from _hf_models import generated_ids, load_exported  # noqa: E402
from _train_helpers import tiny_config  # noqa: E402

from qkv._errors import SettingError  # noqa: E402
from qkv.cli import main  # noqa: E402
from qkv.data import Normalizer, SentencePieceTokenizer, bundled_pairs  # noqa: E402
from qkv.export import save_model  # noqa: E402
from qkv.export.huggingface import export_huggingface, huggingface_class  # noqa: E402
from qkv.inference import Decoding, load_model  # noqa: E402
from qkv.nn import Seq2SeqConfig, build_model  # noqa: E402
from qkv.train import train  # noqa: E402
from qkv.translate import Translator  # noqa: E402

PAIRS = bundled_pairs()[:3000]
# real sentences the models never trained on
TEXTS = [s for s, _ in bundled_pairs()[6000:6060]]


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory, corpus_file):
    """qkv-trained SentencePiece models (plain text, as for a user's data): post-norm (a
    Marian) and pre-norm (a Pegasus), briefly trained."""
    out = {}
    for name, model in (
        ("post", {"norm_first": False, "activation": "gelu", "use_bias": True}),
        ("pre", {"norm_first": True, "activation": "relu", "share_embeddings": True,
                 "tie_embeddings": True}),
    ):  # fmt: skip
        folder = tmp_path_factory.mktemp(f"hf-run-{name}")
        cfg = tiny_config(
            data=str(corpus_file), tokenizer="sentencepiece", normalizer="plain", vocab_size=300,
            byte_fallback=False, max_steps=120, eval_every=1000, save_every=1000,
            src_lang="en", tgt_lang="fr",
            model={"kind": "transformer", "num_hiddens": 32, "ffn_num_hiddens": 64,
                   "num_heads": 2, "num_enc_layers": 2, "num_dec_layers": 2, **model},
        )  # fmt: skip
        out[name] = train(cfg, folder, progress=False).final_model
    return out


def _export(saved, tmp_path, decoding=None, **kw):
    if decoding is not None:
        saved = dataclasses.replace(saved, decoding=decoding)
    out = tmp_path / "hf"
    export_huggingface(saved, out, force=True, **kw)
    return out


def _generated(model, tok, texts) -> list[list[int]]:
    """``generate`` with the folder's generation config on the texts as one padded batch (as
    ``pipeline("translation")`` batches them), as qkv's token ids; and the decoded texts."""
    with torch.no_grad():
        rows = model.generate(**tok(texts, return_tensors="pt", padding=True))
    return generated_ids(model, rows), tok.batch_decode(rows, skip_special_tokens=True)


DECODINGS = [
    Decoding(max_output_len=24),
    Decoding(beam_size=4, max_output_len=24),
    Decoding(beam_size=4, length_penalty=0.6, no_repeat_ngram=2, max_output_len=24),
]


@pytest.mark.parametrize("kind", ["post", "pre"])
def test_transformers_generates_qkvs_tokens(trained_runs, tmp_path, kind):
    saved = load_model(trained_runs[kind])
    q = Translator.load(trained_runs[kind])
    finished = 0
    for decoding in DECODINGS:
        folder = _export(saved, tmp_path, decoding)
        model, tok = load_exported(folder)
        assert type(model).__name__ == huggingface_class(saved.model.config)[0]
        want = q.generate(TEXTS, decoding)  # as qkv translate batches them
        got, texts = _generated(model, tok, TEXTS)
        assert got == want, decoding.describe()
        finished += sum(len(ids) < decoding.max_output_len - 1 for ids in want)
        # the text of that batch, as pipeline("translation") of transformers 4 printed it (5
        # removed the task): qkv translate's, but for the spaces of a run of lone ▁ pieces,
        # which qkv shows as one (MarianTokenizer keeps them all)
        assert [" ".join(t.split()) for t in texts] == q.translate(TEXTS, decoding)
    assert finished > 0  # some translations ended by <eos>, not only at the limit


@pytest.mark.parametrize("kind", ["post", "pre"])
def test_the_tokenizer_gives_qkvs_ids(trained_runs, tmp_path, kind):
    saved = load_model(trained_runs[kind])
    _, tok = load_exported(_export(saved, tmp_path))
    src, tgt = saved.src_tokenizer, saved.tgt_tokenizer
    # qkv's plain normaliser (NFC, whitespace) is in the exported SentencePiece models' rules
    odd = ["Ça va, Zoë ?", "Ça\u00a0va\u202f?", "  a \t b\n c  ", "x\u3000y", "", " "]
    odd.append(unicodedata.normalize("NFD", "Zoë était là, déjà"))
    for text in [*TEXTS, *odd]:
        assert tok(text).input_ids == [*src.encode(text), src.eos_id], text
    for _, target in PAIRS[:60]:
        ids = tgt.encode(target)
        assert tok.decode(ids, skip_special_tokens=True) == tgt.decode(ids).strip()


def _random(vocab_src, vocab_tgt, seed=0, **over):
    torch.manual_seed(seed)
    kw = dict(num_hiddens=24, ffn_num_hiddens=40, num_heads=3, num_enc_layers=2,
              num_dec_layers=2, use_bias=True)  # fmt: skip
    model = build_model(Seq2SeqConfig(vocab_src, vocab_tgt, **{**kw, **over})).eval()
    with torch.no_grad():  # every norm and bias away from its initial value
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.5)
    return model


@pytest.fixture(scope="module")
def spm():
    norm = Normalizer()
    srcs, tgts = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    kw = {"vocab_size": 400, "byte_fallback": True, "normalizer": norm}
    joint = SentencePieceTokenizer.train(srcs + tgts, **kw)
    return joint, SentencePieceTokenizer.train(srcs, **kw), SentencePieceTokenizer.train(tgts, **kw)


ARCHITECTURES = {
    "marian swish, tied": dict(activation="swish", share_embeddings=True, tie_embeddings=True),
    "marian gelu, shared untied": dict(activation="gelu", share_embeddings=True),
    "marian relu, two vocabularies": dict(activation="relu"),
    "marian no embedding scale": dict(scale_embedding=False, share_embeddings=True),
    "pegasus relu, tied": dict(norm_first=True, share_embeddings=True, tie_embeddings=True),
    "pegasus gelu, untied": dict(norm_first=True, activation="gelu", share_embeddings=True),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_logits_are_qkvs(spm, tmp_path, name):
    over = ARCHITECTURES[name]
    joint, src, tgt = spm
    if over.get("share_embeddings"):
        src = tgt = joint
    model = _random(src.vocab_size, tgt.vocab_size, **over)
    folder = save_model(model, src, tgt, tmp_path / "qkv", languages=("en", "fr"))
    hf, tok = load_exported(_export(load_model(folder), tmp_path))
    assert type(hf).__name__ == ("Pegasus" if over.get("norm_first") else "Marian") + (
        "ForConditionalGeneration" if over.get("norm_first") else "MTModel"
    )
    batch = tok(TEXTS[:16], return_tensors="pt", padding=True)
    torch.manual_seed(1)
    dec = torch.randint(4, tgt.vocab_size, (16, 9))
    dec[:, 0] = tgt.bos_id
    with torch.no_grad():
        ours = model(batch.input_ids, dec, batch.attention_mask.sum(1))
        ours = ours[0] if isinstance(ours, tuple) else ours
        theirs = hf(**batch, decoder_input_ids=dec).logits
    assert theirs.shape == ours.shape
    assert (theirs - ours).abs().max().item() < 1e-4


@pytest.mark.parametrize(
    ("over", "why"),
    [
        (dict(kind="bahdanau"), "'bahdanau' model"),
        (dict(pos_encoding="learned"), "'learned' positions"),
        (dict(pos_encoding="rotary"), "'rotary' positions"),
        (dict(norm_first=True), "a vocabulary per side"),
    ],
)
def test_what_no_class_expresses_is_refused_with_the_reason(spm, tmp_path, over, why):
    _, src, tgt = spm
    kw = (
        {}
        if over.get("kind") == "bahdanau"
        else dict(num_heads=2, num_enc_layers=1, num_dec_layers=1)
    )
    torch.manual_seed(0)
    model = build_model(
        Seq2SeqConfig(
            src.vocab_size, tgt.vocab_size, num_hiddens=16, ffn_num_hiddens=32, **kw, **over
        )
    )
    folder = save_model(model, src, tgt, tmp_path / "qkv")
    with pytest.raises(SettingError, match=why) as e:
        export_huggingface(folder, tmp_path / "hf")
    assert e.value.key == "format"
    assert not (tmp_path / "hf").exists()


def test_a_word_tokenizer_or_the_books_normaliser_is_refused(trained, tmp_path):
    with pytest.raises(SettingError, match="MarianTokenizer reads SentencePiece models"):
        export_huggingface(trained["transformer"], tmp_path / "hf")


def test_the_cli_writes_a_hub_ready_folder(trained_runs, tmp_path):
    test = tmp_path / "data" / "newstest.tsv"
    test.parent.mkdir()
    test.write_text("".join(f"{s}\t{t}\n" for s, t in bundled_pairs()[7000:7040]), encoding="utf-8")
    scores = tmp_path / "test.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert (
            main(
                [
                    "evaluate",
                    "--model-dir",
                    str(trained_runs["post"]),
                    "--data",
                    str(test),
                    "--json",
                ]
            )
            == 0
        )
    scores.write_text(buf.getvalue())
    out = tmp_path / "en-fr-hf"
    args = ["export", "--model-dir", str(trained_runs["post"]), "--out", str(out), "--format",
            "huggingface", "--license", "cc-by-4.0", "--metrics", str(scores)]  # fmt: skip
    assert main(args) == 0
    names = {p.name for p in out.iterdir()}
    assert names >= {"config.json", "generation_config.json", "model.safetensors", "source.spm",
                     "target.spm", "vocab.json", "tokenizer_config.json", "README.md"}  # fmt: skip
    card = (out / "README.md").read_text()
    front = card.split("---")[1]
    assert "license: cc-by-4.0" in front and "- en\n- fr" in front
    assert "metrics:\n- bleu\n- chrf" in front and "model-index:" in front
    bleu = json.loads(scores.read_text())["bleu"]
    assert f"value: {round(bleu, 2)}" in front
    assert "newstest.tsv" in front
    assert str(tmp_path) not in card  # names, never local paths
    assert "`en-fr.txt` (" in card and ", sha256 " in card  # by name, size and hash
    assert "): 520 training pairs (40 validation and 40 test pairs held out)" in card
    gen = json.loads((out / "generation_config.json").read_text())
    dec = load_model(trained_runs["post"]).decoding
    assert gen["num_beams"] == dec.beam_size and gen["bad_words_ids"] == [[0], [1]]
    # again without --force: refused; with it: replaced
    assert main(args) == 2
    assert main([*args, "--force"]) == 0
    # no license: none in the card, and the card says so
    assert main([*args[:-4], "--force"]) == 0
    card = (out / "README.md").read_text()
    assert "license:" not in card.split("---")[1] and "License: not given" in card


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--license", "Apache License"], "--license: expected a license identifier"),
        (["--metrics", "nope.json"], "--metrics: cannot read"),
    ],
)
def test_bad_card_flags_are_named(trained_runs, tmp_path, extra, message, capsys):
    args = ["export", "--model-dir", str(trained_runs["post"]), "--out", str(tmp_path / "o"),
            "--format", "huggingface", *extra]  # fmt: skip
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_license_and_metrics_only_with_huggingface(trained_runs, tmp_path, capsys):
    args = ["export", "--model-dir", str(trained_runs["post"]), "--out", str(tmp_path / "o"),
            "--license", "mit"]  # fmt: skip
    assert main(args) == 2
    assert "--license: only for --format huggingface" in capsys.readouterr().err


def test_the_default_decoding_length_is_the_models_limit(trained_runs, tmp_path):
    saved = load_model(trained_runs["post"])
    folder = _export(saved, tmp_path, Decoding(beam_size=2))
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["max_length"] == saved.model.config.max_len
    assert gen["early_stopping"] is True and math.isclose(gen["length_penalty"], 1.0)
