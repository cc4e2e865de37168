"""``qkv import``: a Hugging Face translation model (Marian: the OPUS-MT models) as a qkv model
folder, which every qkv command then reads (the module is ``import_``: ``import`` is a Python
keyword)."""

from __future__ import annotations

import argparse
from typing import Any

from .._deps import require
from ._common import fail, named_by_flag, user_errors

NAME = "import"

_DESCRIPTION = (
    "Read a Hugging Face translation model and write it as a qkv model folder --out, which "
    "qkv translate, evaluate (and its attention viewer), serve, export and train --init-from "
    "read as they read a model qkv trained. SOURCE is a local model folder (config.json, "
    "model.safetensors or pytorch_model.bin, the tokenizer's files) or a Hub name such as "
    "Helsinki-NLP/opus-mt-en-de, read from the Hugging Face cache (fetched when the Hub can "
    "be reached; HF_HUB_OFFLINE=1 reads the cache alone). Imports MarianMTModel (the OPUS-MT "
    "models: Marian's sinusoidal positions, swish/gelu/relu, tied or separate embeddings, "
    "separate source and target SentencePiece models with one vocab.json, the >>xxx<< "
    "target tokens of multi-target models). The translations are transformers' own: the "
    "same logits, and generation_config.json's beams, length limit, bad words and end of "
    "beam search become the folder's decoding. Weights are read from safetensors or with "
    "torch.load(weights_only=True), every size checked first. Needs sentencepiece and "
    "safetensors (qkv[train]); a Hub name needs huggingface_hub (qkv[hf]); the imported "
    "folder needs neither transformers nor huggingface_hub."
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv import``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="import a Hugging Face model (OPUS-MT/Marian) as a qkv model folder",
        description=_DESCRIPTION,
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="a Hugging Face model folder, or a Hub name (Helsinki-NLP/opus-mt-en-de) read "
        "from the Hugging Face cache",
    )
    p.add_argument("--out", required=True, help="the qkv model folder to write (new or empty)")
    p.add_argument(
        "--src-lang",
        metavar="CODE",
        default=None,
        help="the source language to record (default: the tokenizer's source_lang, else the "
        "name opus-mt-SRC-TGT)",
    )
    p.add_argument(
        "--tgt-lang",
        metavar="CODE",
        default=None,
        help="the target language to record (default: the tokenizer's target_lang, else the "
        "name); of a multi-target model, the target a text that names none (>>xxx<<) goes to "
        "(default: its first)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a model folder written to --out before; never a run, a checkpoint or "
        "files qkv did not write",
    )
    p.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    return p


def _summary(result: Any, config: Any) -> list[str]:
    c = config
    arch = (
        f"{c.num_enc_layers}+{c.num_dec_layers} layers, width {c.num_hiddens}, {c.num_heads} "
        f"heads, {c.activation}, vocabularies {c.src_vocab_size}/{c.tgt_vocab_size}"
    )
    langs = "not recorded (give --src-lang and --tgt-lang)"
    if result.languages is not None:
        langs = f"{result.languages[0]} -> {result.languages[1]}"
    lines = [f"imported {result.source} (Marian: {arch}) -> {result.path}", f"  languages: {langs}"]
    if result.targets:
        lines.append(f"  targets: {', '.join(f'{k} {v}' for k, v in result.targets.items())}")
    d = result.decoding
    lines.append(
        f"  decoding: {d.describe()}, at most {d.max_output_len} tokens"
        + (", <eos> forced at the limit" if d.forced_eos else "")
    )
    lines += [f"  not kept: {note}" for note in result.notes]
    lines.append(f"  next: qkv translate --model-dir {result.path} 'Hello.'")
    return lines


def run(args: argparse.Namespace) -> int:
    """Import the model as the command line says; print what was written."""
    require(f"qkv {NAME}", ["safetensors", "sentencepiece"])
    from ..interop.huggingface import HubUnreachable
    from ..interop.importer import import_model

    try:
        result = import_model(
            args.source,
            args.out,
            src_lang=args.src_lang,
            tgt_lang=args.tgt_lang,
            force=args.force,
        )
    except user_errors(HubUnreachable) as e:
        flags = {"source": "SOURCE", "out": "--out", "src_lang": "--src-lang"}
        return fail(NAME, named_by_flag(e, {**flags, "tgt_lang": "--tgt-lang"}))
    for line in _summary(result, result.config):
        print(line)
    return 0
