"""What an export folder says of its use without qkv: the ``README.md`` of a CTranslate2 model
(:func:`ct2_readme`: ``ctranslate2`` and ``sentencepiece`` alone, the folder's decoding mapped
to CTranslate2's options) and the "Use" section of an ONNX export's model card
(:func:`onnx_use`: the graphs run with ``onnxruntime``, ``sentencepiece`` and ``numpy``).

What qkv does around the engine is written out from the folder's own settings, so the snippet
gives ``qkv translate --engine ctranslate2``'s translation of each sentence:

* the source normaliser (:class:`qkv.data.Normalizer`: Unicode form, non-breaking spaces,
  lowercasing, a space before punctuation, whitespace collapsed), as Python lines;
* the pieces of the SentencePiece model (``tokenizers/``), ``<eos>`` added by CTranslate2
  (``add_source_eos`` in its ``config.json``);
* the decoding (``qkv.json``): ``beam_size``, ``length_penalty`` and ``no_repeat_ngram`` as
  ``beam_size``, ``length_penalty`` and ``no_repeat_ngram_size``; the decode length rule
  (:meth:`qkv.inference.Decoding.output_limit`: ``2 * (source pieces + 1) + 10`` unless
  ``max_output_len``, never past the positions) as each sentence's ``max_decoding_length``;
  ``<pad>`` and ``<bos>`` never generated (``suppress_sequences``), ``<unk>`` never under byte
  fallback (``disable_unk``).

A model whose tokenizers are not SentencePiece ones (qkv's word tokenizer) gets a README that
says so: its tokens are qkv's, used through :class:`~qkv.export.ctranslate2.Ct2Translator`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._folder import CARD
from ..data import Normalizer, SentencePieceTokenizer, Tokenizer
from ..inference import Decoding

__all__ = ["SAMPLE", "ct2_readme", "ct2_use", "normalizer_source", "onnx_use", "write_readme"]

#: the sentences the README's snippet translates
SAMPLE = ["Go.", "I'm hungry."]


def normalizer_source(norm: Normalizer | None) -> list[str]:
    """Python lines defining ``normalize(text)``, the same text as ``norm(text)``."""
    lines = ["def normalize(text):"]
    if norm is None:
        return [*lines, "    return text"]
    if norm.unicode_form is not None:
        lines.append(f"    text = unicodedata.normalize({norm.unicode_form!r}, text)")
    if norm.nbsp_to_space:
        lines.append('    text = text.replace("\\u00a0", " ").replace("\\u202f", " ")')
    if norm.lowercase:
        lines.append("    text = text.lower()")
    if norm.space_before_punct:
        cls = "".join("\\" + c if c in "\\]^-" else c for c in norm.space_before_punct)
        lines.append(f'    text = re.sub(r"(?<=[^ ])([{cls}])", r" \\1", text)')
    if norm.collapse_whitespace:
        lines.append('    text = re.sub(r"\\s+", " ", text).strip()')
    return [*lines, "    return text"]


def _spm_file(tok: Tokenizer, side: str, joint: bool) -> str | None:
    """The SentencePiece model of ``tok`` in ``tokenizers/`` (relative), None for another kind."""
    if not isinstance(tok, SentencePieceTokenizer):
        return None
    return f"tokenizers/{'joint' if joint else side}/spm.model"


def _options(decoding: Decoding, disable_unk: bool, tokens: list[str], pad: int, bos: int) -> str:
    """CTranslate2's keywords for the folder's decoding, as Python source (one a line)."""
    never = [[tokens[i]] for i in sorted({pad, bos, *decoding.suppress})]
    parts = [
        f"beam_size={decoding.beam_size}",
        f"length_penalty={decoding.length_penalty!r}",
        f"no_repeat_ngram_size={decoding.no_repeat_ngram}",
        f"suppress_sequences={never!r}",
        f"disable_unk={disable_unk}",
        "max_input_length=0",
    ]
    return "".join(f"            {p},\n" for p in parts).rstrip("\n")


def ct2_readme(
    src: Tokenizer,
    tgt: Tokenizer,
    decoding: Decoding,
    *,
    positions: int,
    disable_unk: bool,
    quantize: str | None,
    languages: tuple[str, str] | list[str] | None,
) -> str:
    """The README.md of a CTranslate2 model folder (Markdown): what it holds and a Python
    snippet that translates with ``ctranslate2`` and ``sentencepiece`` as qkv does (run in the
    folder; see the module's notes)."""
    joint = src is tgt
    spm_src, spm_tgt = _spm_file(src, "src", joint), _spm_file(tgt, "tgt", joint)
    pair = f" ({languages[0]} \u2192 {languages[1]})" if languages else ""
    weights = quantize or "float32"
    lines = [
        f"# A CTranslate2 translation model{pair}",
        "",
        f"Exported by qkv: `model.bin` ({weights} weights), CTranslate2's `config.json` and "
        "vocabulary, the SentencePiece models in `tokenizers/`, `qkv.json` (qkv's decoding "
        "and options) and `manifest.json` (the size and SHA-256 of every file).",
        "",
        "With qkv: `qkv translate --model-dir THIS_FOLDER --engine ctranslate2 'Go.'` or "
        "`qkv serve --model-dir THIS_FOLDER --engine ctranslate2`.",
        "",
        "## With CTranslate2 alone",
        "",
    ]
    if spm_src is None or spm_tgt is None:
        return "\n".join(
            [
                *lines,
                "This model's tokenizers are not SentencePiece models that `sentencepiece` "
                "reads alone (qkv's word tokenizer, or a vocabulary of its own): translate it "
                "with qkv (`qkv.export.ctranslate2.Ct2Translator`).",
                "",
            ]
        )
    norm_src = getattr(src, "normalizer", None)
    options = _options(decoding, disable_unk, tgt.tokens(), tgt.pad_id, tgt.bos_id)
    limit = (
        f"min({decoding.max_output_len}, {positions})"
        if decoding.max_output_len is not None
        else f"min(2 * (len(pieces) + 1) + 10, {positions})"
    )
    if decoding.max_output_len is None and decoding.output_len_cap is not None:
        limit = f"min(2 * (len(pieces) + 1) + 10, {decoding.output_len_cap}, {positions})"
    lines += [
        "`pip install ctranslate2 sentencepiece`, then, in this folder:",
        "",
        "```python",
        "import re",
        "import unicodedata",
        "",
        "import ctranslate2",
        "import sentencepiece as spm",
        "",
        f'source_spm = spm.SentencePieceProcessor(model_file="{spm_src}")',
        f'target_spm = spm.SentencePieceProcessor(model_file="{spm_tgt}")',
        'translator = ctranslate2.Translator(".", device="cpu")',
        "",
        "",
        "# the text as qkv normalises it before SentencePiece",
        *normalizer_source(norm_src),
        "",
        "",
        "def translate(sentences):",
        "    out = []",
        "    for sentence in sentences:",
        "        pieces = source_spm.encode(normalize(sentence), out_type=str)",
        "        if not pieces:",
        '            out.append("")',
        "            continue",
        f"        limit = {limit}  # qkv's decode length, <eos> counted",
        "        result = translator.translate_batch(",
        "            [pieces],",
        "            max_decoding_length=limit,",
        options,
        "        )[0]",
        "        text = target_spm.decode(result.hypotheses[0][:limit])",
        '        out.append(re.sub(r"[^\\S\\n]+", " ", text).strip())  # spaces as qkv shows them',
        "    return out",
        "",
        "",
        f'print("\\n".join(translate({SAMPLE!r})))',
        "```",
        "",
        "The options are qkv's decoding of this model (`qkv.json`, "
        f"{_describe(decoding)}) in CTranslate2's names: `beam_size`, `length_penalty`, "
        "`no_repeat_ngram_size`; each sentence's `max_decoding_length` is qkv's decode length "
        "(`2 * source tokens + 10`, `<eos>` counted, within the model's positions); `<pad>` and "
        "`<bos>` are never generated (`suppress_sequences`)"
        + (", nor `<unk>` (`disable_unk`: the target has byte fallback)" if disable_unk else "")
        + ". CTranslate2 adds `<eos>` to each source itself (`config.json`). One sentence a "
        "call keeps each one's own length limit, as qkv does; a batch of several shares the "
        "longest.",
        "",
    ]
    return "\n".join(lines)


def ct2_use(float_weights: bool) -> list[str]:
    """The "Use" section of the model card around a CTranslate2 model (Markdown lines):
    ``float_weights``: qkv's weights are there too, so both engines run it."""
    engines = "qkv's engine, or CTranslate2's with `--engine ctranslate2`"
    return [
        "```text",
        "qkv translate --model-dir THIS_FOLDER 'Go.'",
        "qkv serve --model-dir THIS_FOLDER --engine ctranslate2",
        "```",
        "",
        f"`qkv translate` runs it on {engines if float_weights else 'CTranslate2'}"
        + ("" if float_weights else " (qkv's float32 weights are not in this folder)")
        + ". Without qkv: `ctranslate2/README.md` shows it with `ctranslate2` and "
        "`sentencepiece` alone.",
    ]


def _describe(decoding: Decoding) -> str:
    d: dict[str, Any] = decoding.to_dict()
    d.pop("chosen_on", None)
    return ", ".join(f"{k} {v}" for k, v in d.items())


def write_readme(folder: Path, text: str) -> None:
    """``folder/README.md``: ``text`` as UTF-8."""
    (folder / CARD).write_text(text, encoding="utf-8")


def _same_ids(tok: Tokenizer, model_file: Path) -> bool:
    """Are ``tok``'s ids the SentencePiece model's own (no mapping of special ids)?"""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    return tok.tokens() == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def onnx_use(src: Tokenizer, tgt: Tokenizer, folder: Path) -> list[str]:
    """The "Use" section of an ONNX export's model card (Markdown lines): qkv's commands, and a
    snippet that runs the graphs with ``onnxruntime``, ``sentencepiece`` and ``numpy`` alone,
    as :class:`~qkv.export.onnx.OnnxTranslator` does (greedy search, ``onnx.json``'s ids and
    positions; run in the folder), when the tokenizers are SentencePiece models whose ids are
    the model's."""
    joint = src is tgt
    files = _spm_file(src, "src", joint), _spm_file(tgt, "tgt", joint)
    lines = [
        "With qkv: `qkv translate --model-dir THIS_FOLDER 'Go.'`, `qkv serve --model-dir "
        'THIS_FOLDER`, or `qkv.export.onnx.OnnxTranslator("THIS_FOLDER").translate(["Go."])`: '
        "greedy search.",
        "",
        "### With onnxruntime alone",
        "",
    ]
    usable = all(f is not None for f in files) and all(
        _same_ids(tok, folder / f)  # type: ignore[operator]
        for tok, f in zip((src, tgt), files)
    )
    if not usable:
        return [
            *lines,
            "This model's tokenizers are not SentencePiece models whose ids are the model's: "
            "translate it with qkv (`qkv.export.onnx.OnnxTranslator`).",
        ]
    return [
        *lines,
        "`pip install onnxruntime sentencepiece numpy`, then, in this folder:",
        "",
        "```python",
        "import json",
        "import re",
        "import unicodedata",
        "",
        "import numpy as np",
        "import onnxruntime as ort",
        "import sentencepiece as spm",
        "",
        'meta = json.load(open("onnx.json"))  # ids, sizes, the tokens never generated',
        'encoder = ort.InferenceSession("encoder.onnx")',
        'step = ort.InferenceSession("decoder_step.onnx")',
        f'source_spm = spm.SentencePieceProcessor(model_file="{files[0]}")',
        f'target_spm = spm.SentencePieceProcessor(model_file="{files[1]}")',
        'never = sorted({meta["pad_id"], meta["bos_id"], *meta["suppress"]} - {meta["eos_id"]})',
        "",
        "",
        "# the text as qkv normalises it before SentencePiece",
        *normalizer_source(getattr(src, "normalizer", None)),
        "",
        "",
        "def translate_one(sentence):",
        '    ids = source_spm.encode(normalize(sentence)) + [meta["src_eos_id"]]',
        "    if len(ids) == 1:",
        '        return ""',
        '    limit = min(2 * len(ids) + 10, meta["max_positions"])  # qkv\'s decode length',
        "    src, src_len = np.array([ids]), np.array([len(ids)])",
        '    cross_k, cross_v = encoder.run(None, {"src": src, "src_len": src_len})',
        '    shape = (meta["layers"], 1, meta["heads"], 0, meta["head_dim"])',
        "    past_k = past_v = np.zeros(shape, dtype=np.float32)",
        '    tok, out = meta["bos_id"], []',
        "    for _ in range(limit):  # greedy search",
        "        feed = {",
        '            "tok": np.array([[tok]]), "src_len": src_len, "past_k": past_k,',
        '            "past_v": past_v, "cross_k": cross_k, "cross_v": cross_v,',
        "        }",
        "        logits, past_k, past_v = step.run(None, feed)",
        "        logits[0, never] = -np.inf",
        "        tok = int(logits[0].argmax())",
        '        if tok == meta["eos_id"]:',
        "            break",
        "        out.append(tok)",
        '    return re.sub(r"[^\\S\\n]+", " ", target_spm.decode(out)).strip()',
        "",
        "",
        f'print("\\n".join(translate_one(s) for s in {SAMPLE!r}))',
        "```",
        "",
        "This is qkv's greedy search as the graphs run it: `<eos>` appended to the source, "
        "`<bos>` first, `<pad>`, `<bos>` and the ids `onnx.json` lists under `suppress` "
        "never chosen, at most `2 * source tokens + 10` tokens (`<eos>` counted) within the "
        "model's positions. The graphs take a batch (`src` padded, `src_len` its lengths).",
    ]
