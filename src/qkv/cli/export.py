"""``qkv export``: a saved model written for deployment: an inference-only model folder, plus a
CTranslate2 model or ONNX graphs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._deps import require
from ._common import fail, named_by_flag, user_errors

NAME = "export"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv export``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="write a trained model for deployment: inference-only, CTranslate2, ONNX or "
        "Hugging Face transformers",
        description="Write a saved model (a qkv train --out folder: its final model, else its "
        "best checkpoint; or a checkpoint folder) to --out: weights, config, tokenizers, its "
        "decoding and a README.md model card, no training state (--format qkv; every qkv "
        "command reads it), plus a CTranslate2 model in OUT/ctranslate2 (--format "
        "ctranslate2, the ct2 extra), or ONNX graphs (--format onnx); or a Hugging Face "
        "folder (--format huggingface) that transformers' AutoModelForSeq2SeqLM, "
        "AutoTokenizer and pipeline('translation') load, generating the tokens qkv translate "
        "does with the model's decoding: a post-norm Transformer as a MarianMTModel, a "
        "pre-norm one as a PegasusForConditionalGeneration (both with sinusoidal positions), "
        "its SentencePiece models as a MarianTokenizer (source.spm, target.spm, vocab.json), "
        "and a model card ready for the Hub (--license, --metrics); writing it needs no "
        "transformers.",
    )
    p.add_argument("--model-dir", required=True, help="a qkv train --out folder or a model folder")
    p.add_argument("--out", required=True, help="the folder to write (new or empty)")
    p.add_argument(
        "--format",
        choices=("qkv", "ctranslate2", "onnx", "huggingface"),
        default="qkv",
        help="qkv (default): an inference-only model folder; ctranslate2: also a CTranslate2 "
        "model; onnx: the encoder and one decoder step as ONNX graphs; huggingface: a "
        "transformers folder (MarianMTModel or PegasusForConditionalGeneration, "
        "MarianTokenizer, generation_config.json from the model's decoding, a Hub model card)",
    )
    p.add_argument(
        "--license",
        metavar="ID",
        help="with --format huggingface: the license of the weights for the card's front "
        "matter, as the Hub names them (apache-2.0, mit, cc-by-4.0, other); qkv never "
        "invents one: without it the card has none",
    )
    p.add_argument(
        "--metrics",
        nargs="+",
        metavar="FILE",
        help="with --format huggingface: scores for the card (its metrics and model-index), "
        "each file the output of qkv evaluate --json (qkv evaluate --model-dir M --data "
        "test.tsv --json > test.json); data files are named, never shown by path",
    )
    p.add_argument(
        "--quantize",
        choices=("int8", "int8_float32", "float16"),
        default=None,
        help="with --format ctranslate2: the weight type of model.bin (default: float32)",
    )
    p.add_argument(
        "--keep-float-weights",
        action="store_true",
        help="with --format ctranslate2 --quantize: keep qkv's float32 model.safetensors beside "
        "the quantized model.bin, so the folder runs on qkv's engine too (qkv translate "
        "--attention needs it); default: left out, the folder runs on CTranslate2",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a model folder exported to --out before (of any format); never a run, a "
        "checkpoint or files qkv did not write",
    )
    p.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    return p


def _check_out(args: argparse.Namespace) -> Path:
    """``--out`` as a folder to write: new, empty, or (``--force``) one exported before, of any
    format (:func:`qkv.inference.writing.check_out`), checked before the model is read."""
    from ..inference.writing import check_out

    if args.quantize is not None and args.format != "ctranslate2":
        raise ValueError(f"--quantize: only for --format ctranslate2 (got --format {args.format})")
    if args.keep_float_weights and args.quantize is None:
        raise ValueError(
            "--keep-float-weights: only with --format ctranslate2 --quantize (a float32 export "
            "keeps them)"
        )
    for flag in ("license", "metrics"):
        if getattr(args, flag) is not None and args.format != "huggingface":
            raise ValueError(
                f"--{flag}: only for --format huggingface (got --format {args.format})"
            )
    return check_out(args.out, args.force, (Path(args.model_dir),))


def run(args: argparse.Namespace) -> int:
    """Export the model as the command line says; print where and how big."""
    ct2 = ["ctranslate2"] if args.format == "ctranslate2" else []
    require(f"qkv {NAME}", ["safetensors", *ct2])
    from ..inference import load_model

    try:
        out = _check_out(args)
        saved = load_model(args.model_dir)
        if args.format == "ctranslate2":
            from ..export.ctranslate2 import export_ctranslate2

            path = export_ctranslate2(
                saved,
                out,
                quantize=args.quantize,
                force=args.force,
                keep_float_weights=True if args.keep_float_weights else None,
            )
        elif args.format == "onnx":
            from ..export.onnx import export_onnx

            path = export_onnx(saved, out, force=args.force)
        elif args.format == "huggingface":
            from ..export.huggingface import export_huggingface

            path = export_huggingface(
                saved, out, license=args.license, metrics=args.metrics or (), force=args.force
            )
        else:
            from ..export import export_model

            path = export_model(saved, out, force=args.force)
    except user_errors() as e:
        flags = {k: f"--{k}" for k in ("out", "license", "metrics", "format")}
        return fail(NAME, named_by_flag(e, flags))
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    within = "" if Path(path) == Path(out) else f" in {out}"
    print(f"exported {saved.path} ({args.format}) -> {path} ({size / 1e6:.1f} MB written{within})")
    return 0
