"""A qkv model as a Hugging Face ``transformers`` folder (``qkv export --format huggingface``).

The folder is what ``AutoModelForSeq2SeqLM.from_pretrained``, ``AutoTokenizer.from_pretrained``
and ``pipeline("translation")`` read, and what the Hub shows::

    config.json             the model, as the transformers class that computes it exactly
    generation_config.json  the model's default decoding (beam, length penalty, lengths, ...)
    model.safetensors       the weights under transformers' names
    source.spm, target.spm  the SentencePiece models of each side (MarianTokenizer's layout)
    vocab.json              piece -> id (target_vocab.json too with a vocabulary per side)
    tokenizer_config.json   MarianTokenizer, its special tokens and languages
    README.md               a model card ready for the Hub (languages, license, metrics, data)
    manifest.json           qkv's manifest (sizes and hashes; transformers ignores it)

The class: a post-norm Transformer with sinusoidal positions is a ``MarianMTModel``
(:mod:`qkv.interop.marian`, the table ``qkv import`` reads), a pre-norm one a
``PegasusForConditionalGeneration`` (:mod:`qkv.interop.pegasus`: Marian's blocks pre-norm, with
final layer norms); anything else (a Bahdanau model, learned or rotary positions, a pre-norm
model with a vocabulary per side) is refused with the reason. Nothing here imports
``transformers``: the folder is JSON, SentencePiece models and a safetensors file, written
atomically (:func:`qkv.inference.writing.write_folder`).
"""

from __future__ import annotations

import functools
import io
import json
import re
import tempfile
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from .._deps import require
from .._errors import SettingError
from .._folder import (
    CARD,
    HF_CONFIG,
    HF_GENERATION,
    HF_SOURCE_SPM,
    HF_TARGET_SPM,
    HF_TARGET_VOCAB,
    HF_TOKENIZER_CONFIG,
    HF_VOCAB,
    SPLIT,
    TRAIN_CONFIG,
    TRAINER_STATE,
    WEIGHTS,
)
from ..data import Normalizer, Tokenizer
from ..data.languages import language_name
from ..data.subwords import proto_fields, proto_message
from ..inference import Decoding, SavedModel, load_model
from ..inference.saved import HF_FOLDER_FORMAT, VerifiedFolder, verify_checkpoint
from ..inference.writing import (
    BUNDLED_DATA,
    check_out,
    describe_data_files,
    run_card,
    training_files,
    write_folder,
)
from ..interop import marian, pegasus
from ..nn.seq2seq import Seq2SeqConfig

__all__ = ["export_huggingface", "huggingface_class", "read_metrics"]

#: the transformers version the folder is written for (its config's ``transformers_version``)
TRANSFORMERS_VERSION = "5.24.0"
#: a license identifier as the Hub's model cards take it (``apache-2.0``, ``cc-by-4.0``, ``other``)
_LICENSE = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
#: what qkv's normaliser collapses as whitespace (:class:`qkv.data.Normalizer`)
_SPACE = re.compile(r"\s")
#: ``ModelProto.normalizer_spec``'s field number
_NORMALIZER = 3


def huggingface_class(config: Seq2SeqConfig) -> tuple[str, str | None]:
    """The ``transformers`` architecture that computes the model ``config`` describes exactly
    (``"MarianMTModel"`` or ``"PegasusForConditionalGeneration"``), and None; or ``""`` and
    the one-line reason no class does."""
    if config.norm_first:
        why = pegasus.why_not(config)
        return ("", why) if why else ("PegasusForConditionalGeneration", None)
    if config.kind != "transformer":
        return "", f"a {config.kind!r} model: transformers has no class for it"
    if config.pos_encoding != "sinusoidal":
        return "", (
            f"{config.pos_encoding!r} positions: Marian and Pegasus (the classes of qkv's "
            "post-norm and pre-norm Transformers) have sinusoidal ones"
        )
    return "MarianMTModel", None


def _refuse(why: str) -> SettingError:
    return SettingError("format", f"huggingface: cannot export this model: {why}")


def _plain_rules() -> dict[str, str]:
    """qkv's plain normaliser as SentencePiece normalisation rules: every canonical
    decomposition mapped to its composed character (Unicode NFC) and every whitespace
    character but the space to a space (SentencePiece then collapses runs and strips ends,
    as the normaliser does)."""
    rules = {}
    for cp in range(0x110000):
        c = chr(cp)
        d = unicodedata.normalize("NFD", c)
        if d != c and unicodedata.normalize("NFC", d) == c:
            rules[d] = c
    for c in map(chr, range(0x110000)):
        if c != " " and _SPACE.match(c):
            rules[c] = " "
    return rules


def _compiled(rules: Mapping[str, str]) -> bytes:
    """SentencePiece's compiled form (``NormalizerSpec.precompiled_charsmap``) of ``rules``,
    made by its own trainer (``normalization_rule_tsv``) on a throwaway corpus."""
    require("qkv export --format huggingface", ["sentencepiece"])
    import sentencepiece as spm

    def hexes(text: str) -> str:
        return " ".join(f"{ord(x):X}" for x in text)

    with tempfile.TemporaryDirectory() as d:
        tsv = Path(d) / "rules.tsv"
        tsv.write_text("".join(f"{hexes(a)}\t{hexes(b)}\n" for a, b in rules.items()))
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(["a b c"]), model_writer=buf, vocab_size=8,
            hard_vocab_limit=False, model_type="char", normalization_rule_tsv=str(tsv),
            minloglevel=2,
        )  # fmt: skip
    spec = next(v for n, _, v in proto_fields(buf.getvalue()) if n == _NORMALIZER)
    return next(v for n, _, v in proto_fields(spec) if n == 2)  # type: ignore[arg-type,return-value]


@functools.cache
def _plain_charsmap() -> bytes:
    """:func:`_plain_rules` compiled (:func:`_compiled`), once per process: the rules depend on
    Python's Unicode tables alone, and making them walks every code point (about a second)."""
    return _compiled(_plain_rules())


def _marian_spm(model: bytes, norm: Normalizer | None) -> bytes:
    """The SentencePiece model MarianTokenizer reads for one side: the model itself, with
    qkv's plain normaliser (which qkv applies before SentencePiece, and MarianTokenizer
    cannot) compiled into its own normalisation rules when the model has none of its own
    (``identity``, as qkv trains them); a model with its own rule (``nmt_nfkc``, a model of
    the user's) keeps it: NFKC composes and maps the other spaces to spaces itself."""
    fields = list(proto_fields(model))
    spec = next((v for n, _, v in fields if n == _NORMALIZER), b"")
    kept = [(n, w, v) for n, w, v in proto_fields(spec) if n not in (1, 2, 6)]  # type: ignore[arg-type]
    name = next((v for n, _, v in proto_fields(spec) if n == 1), b"")  # type: ignore[arg-type]
    if norm is None or name not in (b"identity", b""):
        return model
    new = proto_message([(1, 2, b"qkv_plain"), (2, 2, _plain_charsmap()), *kept])
    return proto_message([(n, w, new if n == _NORMALIZER else v) for n, w, v in fields])


def _check_tokenizer(name: str, tok: Tokenizer) -> bytes:
    """The SentencePiece model of one side (:func:`_marian_spm`), refusing what
    MarianTokenizer cannot reproduce."""
    model = getattr(tok, "model", None)
    if not isinstance(model, (bytes, bytearray)):
        raise _refuse(
            f"its {name} tokenizer is a {tok.kind!r} one; MarianTokenizer reads SentencePiece "
            "models (train with a SentencePiece tokenizer, the default for your data)"
        )
    norm = tok.normalizer
    if norm is not None and norm != Normalizer():
        raise _refuse(
            f"its {name} text is normalised by {norm} before SentencePiece, which "
            "MarianTokenizer cannot do (the plain normaliser, Unicode NFC and whitespace, "
            "goes into the SentencePiece model's own rules; lower-casing and punctuation "
            "spacing cannot)"
        )
    return _marian_spm(bytes(model), norm)


def _vocab(tok: Tokenizer) -> dict[str, int]:
    tokens = tok.tokens()
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        seen: set[str] = set()
        twice = next(t for t in tokens if t in seen or seen.add(t))  # type: ignore[func-returns-value]
        raise _refuse(f"its vocabulary spells the token {twice!r} twice; vocab.json cannot hold it")
    return vocab


def _generation(d: Decoding, c: Seq2SeqConfig, tgt: Tokenizer) -> dict[str, Any]:
    """``generation_config.json`` of the decoding ``d``: the same search in ``transformers``.

    ``max_length`` counts the decoder's start token; qkv's default length (twice the source
    plus 10, :func:`qkv.decoding.default_output_len`) has no ``transformers`` equivalent, so a
    decoding without ``max_output_len`` gets the model's position limit instead."""
    banned = sorted({tgt.pad_id, tgt.bos_id, *getattr(d, "suppress", ())})
    out: dict[str, Any] = {
        "decoder_start_token_id": tgt.bos_id,
        "eos_token_id": tgt.eos_id,
        "pad_token_id": tgt.pad_id,
        "bad_words_ids": [[i] for i in banned],
        "num_beams": d.beam_size,
        "max_length": (d.max_output_len + 1) if d.max_output_len else c.max_len,
    }
    if d.beam_size > 1:  # what only a beam search reads (transformers warns of it otherwise)
        out["length_penalty"] = d.length_penalty
        out["early_stopping"] = getattr(d, "early_stopping", True)
    if d.no_repeat_ngram:
        out["no_repeat_ngram_size"] = d.no_repeat_ngram
    if getattr(d, "forced_eos", False):
        out["forced_eos_token_id"] = tgt.eos_id
    if getattr(d, "renormalize", False):
        out["renormalize_logits"] = True
    out["transformers_version"] = TRANSFORMERS_VERSION
    return out


def _config(arch: str, c: Seq2SeqConfig, d: Decoding, tgt: Tokenizer) -> dict[str, Any]:
    table = pegasus if arch.startswith("Pegasus") else marian
    out = table.transformers_config(
        c, pad_id=tgt.pad_id, eos_id=tgt.eos_id, decoder_start_id=tgt.bos_id
    )
    if not getattr(d, "forced_eos", False):  # the generation config says how to decode
        out.pop("forced_eos_token_id", None)
    out["dtype"] = "float32"
    out["transformers_version"] = TRANSFORMERS_VERSION
    return out


def _weights(arch: str, c: Seq2SeqConfig, state: Mapping[str, torch.Tensor]) -> dict:
    """The tensors under ``transformers``' names, each stored once: a tied output layer is
    not written (``transformers`` ties it to ``model.shared`` on reading, as its own files
    do); other names of one tensor are written as copies (safetensors stores no aliases)."""
    if arch.startswith("Pegasus"):
        sd = pegasus.to_transformers(c, state)
    else:
        sd = marian.to_transformers(c, state)
    if c.tie_embeddings and c.share_embeddings:
        for name in ("encoder", "decoder", "output"):
            sd.pop(marian.EMBEDDINGS[name], None)
    elif c.tie_embeddings:
        sd.pop(marian.EMBEDDINGS["output"], None)
    seen: set[int] = set()
    out = {}
    for name, t in sd.items():
        t = t.detach().to("cpu", torch.float32)
        ident = t.untyped_storage().data_ptr()
        out[name] = t.clone().contiguous() if ident in seen else t.contiguous()
        seen.add(ident)
    return out


def _tokenizer_files(
    src: Tokenizer, tgt: Tokenizer, languages: tuple[str, str] | None, c: Seq2SeqConfig
) -> dict[str, bytes]:
    """MarianTokenizer's files for the two tokenizers (one vocabulary when they are one)."""
    source, target = _check_tokenizer("source", src), _check_tokenizer("target", tgt)
    names = src.tokens()
    separate = src is not tgt and names != tgt.tokens()
    if tgt.tokens()[tgt.unk_id] != names[src.unk_id] or tgt.pad_id != src.pad_id:
        raise _refuse("its two tokenizers name their unknown or padding token differently")
    config: dict[str, Any] = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": languages[0] if languages else None,
        "target_lang": languages[1] if languages else None,
        "unk_token": names[src.unk_id],
        "eos_token": names[src.eos_id],
        "pad_token": names[src.pad_id],
        "model_max_length": c.max_len,
        "separate_vocabs": separate,
        "sp_model_kwargs": {},
    }

    def dump(obj: Any) -> bytes:
        return (json.dumps(obj, ensure_ascii=False, indent=1) + "\n").encode("utf-8")

    files = {
        HF_SOURCE_SPM: source,
        HF_TARGET_SPM: target,
        HF_VOCAB: dump(_vocab(src)),
        HF_TOKENIZER_CONFIG: dump(config),
    }
    if separate:
        files[HF_TARGET_VOCAB] = dump(_vocab(tgt))
    return files


# ---------------------------------------------------------------------------- the card
def read_metrics(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The scores of ``qkv evaluate --json`` runs, one JSON object per file.

    Raises:
        SettingError: (``metrics``) a file that is missing or not such an object.
    """
    out = []
    for p in paths:
        path = Path(p)
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SettingError("metrics", f"cannot read {str(path)!r}: {e}") from None
        ok = isinstance(obj, dict) and all(
            isinstance(obj.get(k), (int, float)) and not isinstance(obj.get(k), bool)
            for k in ("bleu", "chrf", "n")
        )
        if not ok:
            raise SettingError(
                "metrics",
                f"expected the JSON object `qkv evaluate --json` prints (bleu, chrf, n, data), "
                f"got {str(path)!r}",
            )
        out.append(obj)
    return out


def _names(text: str) -> str:
    """``text`` with every path in it cut to its file name: a card never shows a local path."""
    return " ".join(Path(w).name if "/" in w or "\\" in w else w for w in str(text).split(" "))


def _training_data(folder: Path, card: Mapping[str, Any]) -> str:
    """The training data by name and size (files' names, pairs), never by path."""
    v = VerifiedFolder(folder)
    data: Any = card.get("data")
    if TRAIN_CONFIG in v.files:
        data = v.json(TRAIN_CONFIG).get("data") or BUNDLED_DATA
    if data is None:
        return "not recorded"
    if data == BUNDLED_DATA:
        name = data
    else:
        state = v.json(TRAINER_STATE) if TRAINER_STATE in v.files else None
        files = training_files(data, state) if TRAIN_CONFIG in v.files else []
        name = describe_data_files(files) if files else _names(str(data))
        if isinstance(data, list):
            name += " (aligned files)"
    if SPLIT in v.files:
        split = v.json(SPLIT)
        sizes = {k: split.get(k) for k in ("train", "valid", "test")}
        if all(isinstance(x, list) for x in sizes.values()):
            return (
                f"{name}: {len(sizes['train']):,} training pairs ({len(sizes['valid']):,} "
                f"validation and {len(sizes['test']):,} test pairs held out)"
            )
    return name


def _yaml(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON scalar is a YAML scalar


def _front_matter(
    arch: str,
    languages: tuple[str, str] | None,
    license: str | None,
    metrics: list[dict[str, Any]],
    title: str,
) -> list[str]:
    front = ["---"]
    if languages:
        front += ["language:", *(f"- {c}" for c in dict.fromkeys(languages))]
    if license:
        front.append(f"license: {license}")
    front += ["library_name: transformers", "pipeline_tag: translation", "tags:"]
    front += [
        "- translation",
        f"- {'pegasus' if arch.startswith('Pegasus') else 'marian'}",
        "- qkv",
    ]
    if metrics:
        front += ["metrics:", "- bleu", "- chrf", "model-index:", f"- name: {_yaml(title)}"]
        front.append("  results:")
        pair = "-".join(languages) if languages else ""
        for m in metrics:
            data = _names(m.get("data") or "a test set")
            front += [
                "  - task:",
                "      type: translation",
                f"      name: {_yaml(('Translation ' + pair).strip())}",
                "    dataset:",
                f"      name: {_yaml(data)}",
                f"      type: {_yaml(data)}",
                "    metrics:",
                "    - type: bleu",
                f"      value: {round(float(m['bleu']), 2)}",
                "      name: BLEU",
                "    - type: chrf",
                f"      value: {round(float(m['chrf']), 2)}",
                "      name: chrF",
            ]
    return [*front, "---"]


def _card(
    saved: SavedModel,
    arch: str,
    decoding: Decoding,
    *,
    license: str | None,
    metrics: list[dict[str, Any]],
    title: str,
) -> str:
    card = run_card(saved.path)
    langs = saved.languages
    c = saved.model.config
    lines = _front_matter(arch, langs, license, metrics, title)
    lines += ["", f"# {title}", ""]
    what = (
        f"A {'pre' if c.norm_first else 'post'}-norm Transformer ({c.num_enc_layers}+"
        f"{c.num_dec_layers} layers, width {c.num_hiddens}, {c.num_heads} heads, feed-forward "
        f"{c.ffn_num_hiddens}) trained with qkv {__version__}, written "
        f"as a `{arch}` for `transformers`."
    )
    lines.append(what)
    if langs:
        lines += ["", f"Translates {language_name(langs[0])} into {language_name(langs[1])}."]
    lines += ["", "## Training data", "", _training_data(saved.path, card)]
    if card.get("step") is not None:
        lines += ["", f"Trained for {card['step']} updates."]
    lines += ["", "## Evaluation", ""]
    if metrics:
        lines += [
            "| data | sentences | BLEU | chrF | decoding |",
            "| --- | --- | --- | --- | --- |",
        ]
        for m in metrics:
            beam = m.get("beam")
            how = f"beam {beam}" if isinstance(beam, int) and beam > 1 else "greedy"
            lines.append(
                f"| {_names(m.get('data') or 'a test set')} | {m['n']} | {float(m['bleu']):.2f} "
                f"| {float(m['chrf']):.2f} | {how} |"
            )
        sigs = [s for m in metrics for s in (m.get("signatures") or {}).values()]
        if sigs:
            lines += ["", "sacreBLEU signatures:", "", *(f"* `{s}`" for s in dict.fromkeys(sigs))]
    else:
        scores = card.get("scores") or {}
        lines += [f"* {k}: {v}" for k, v in scores.items()] or ["none measured (`qkv evaluate`)"]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        'translate = pipeline("translation", model="THIS_FOLDER")',
        'print(translate("...")[0]["translation_text"])',
        "```",
        "",
        f"The default decoding (`generation_config.json`): {decoding.describe()}.",
    ]
    if not license:
        lines += ["", "License: not given (`qkv export --license`)."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the export
def export_huggingface(
    model: SavedModel | str | Path,
    out: str | Path,
    *,
    license: str | None = None,
    metrics: Sequence[str | Path] = (),
    force: bool = False,
) -> Path:
    """Write a saved model as a Hugging Face folder ``out`` (see the module docstring).

    Args:
        model: a :class:`~qkv.inference.SavedModel`, or a folder
            :func:`~qkv.inference.load_model` reads (a run, its final model, a checkpoint, an
            export).
        out: the folder to write: new or empty (or, with ``force``, a model folder qkv
            exported before).
        license: the license of the weights, as the Hub's cards name one (``apache-2.0``,
            ``cc-by-4.0``, ``other``); None: the card has none (qkv never invents one).
        metrics: files of ``qkv evaluate --json`` output, the card's scores.
        force: replace a model folder exported to ``out`` before.

    Returns:
        ``out``.

    Raises:
        SettingError: a model no ``transformers`` class expresses exactly (keyed ``format``,
            with the reason), a license or metrics file that is not one (``license``,
            ``metrics``), an ``out`` that cannot be written (``out``).
    """
    if license is not None and not _LICENSE.match(license):
        raise SettingError(
            "license",
            f"expected a license identifier as the Hub names them (apache-2.0, mit, "
            f"cc-by-4.0, cc-by-nc-sa-4.0, other), got {license!r}",
        )
    scores = read_metrics(metrics)
    out = Path(out)
    saved = model if isinstance(model, SavedModel) else load_model(model)
    check_out(out, force, (saved.path,))
    c = saved.model.config
    arch, why = huggingface_class(c)
    if why is not None:
        raise _refuse(why)
    src, tgt = saved.src_tokenizer, saved.tgt_tokenizer
    decoding = saved.decoding or Decoding()
    langs = saved.languages
    tokenizer = _tokenizer_files(src, tgt, langs, c)
    tensors = _weights(arch, c, saved.model.state_dict())
    config = _config(arch, c, decoding, tgt)
    generation = _generation(decoding, c, tgt)
    title = out.name or "qkv-translation"
    readme = _card(saved, arch, decoding, license=license, metrics=scores, title=title)
    step = int(verify_checkpoint(saved.path, files=[]).get("step") or 0)

    def fill(tmp: Path) -> None:
        from safetensors.torch import save_file

        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        for name, obj in ((HF_CONFIG, config), (HF_GENERATION, generation)):
            (tmp / name).write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
        for name, data in tokenizer.items():
            (tmp / name).write_bytes(data)
        (tmp / CARD).write_text(readme, encoding="utf-8")

    return write_folder(out, fill, fmt=HF_FOLDER_FORMAT, step=step)
