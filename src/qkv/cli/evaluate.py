"""``qkv evaluate``: sacreBLEU and chrF of a model on parallel text (``--data``, or the run's
own test split), signatures printed."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from .._deps import require
from .._folder import SPLIT
from ._common import (
    add_model_flags,
    check_positive,
    engine_needs,
    fail,
    load_translator,
    named_by_flag,
    user_errors,
)

NAME = "evaluate"

log = logging.getLogger(__name__)

#: read_pairs' argument names -> the flags of qkv evaluate that give them
_READ_FLAGS = {
    "path": "--data",
    "format": "--format",
    "src_column": "--src-column",
    "tgt_column": "--tgt-column",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv evaluate``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="sacreBLEU and chrF of a model on parallel text",
        description="Translate the sources (each as one segment, never cut into sentences: "
        "a test set's scores do not depend on a segmenter) and score the detokenised "
        "translations against the raw references with sacreBLEU's BLEU and chrF (signatures "
        "printed).",
    )
    add_model_flags(p)
    p.add_argument(
        "--data",
        nargs="+",
        metavar="FILE",
        help="parallel text, or two aligned files (test.en test.zh) (default: the run's own "
        "test split)",
    )
    p.add_argument(
        "--tokenize",
        choices=("13a", "zh", "ja-mecab", "ko-mecab", "intl", "char", "none"),
        default=None,
        help="sacreBLEU's BLEU tokenizer (default: the target language's, as sacrebleu -l "
        "SRC-TGT picks it: zh, ja-mecab, ko-mecab, else 13a)",
    )
    p.add_argument("--format", help="the data file's format (default: guessed)")
    p.add_argument(
        "--src-column",
        metavar="NAME",
        help="with --data: the source column of a tsv/csv header row, or a jsonl field "
        "(default: src or source)",
    )
    p.add_argument(
        "--tgt-column",
        metavar="NAME",
        help="with --data: the target column (default: tgt or target)",
    )
    p.add_argument(
        "--split",
        choices=("test", "valid", "train"),
        default="test",
        help="without --data: which part of the run's data (default: test)",
    )
    p.add_argument("--limit", type=int, default=None, help="score only the first N pairs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    p.add_argument(
        "--normalized-refs",
        action="store_true",
        help="score against references normalised as the training data (lower-cased for "
        "the book's normaliser); labelled in every output. Default: raw references, "
        "sacreBLEU's convention",
    )
    return p


def _pairs(args: argparse.Namespace, tr: Any) -> tuple[list[tuple[str, str]], str]:
    """The pairs to score and what they are: ``--data``, else the run's ``--split``."""
    from ..data import read_pairs
    from ..inference import verify_checkpoint
    from ..train import saved_run_pairs

    if args.data is not None:
        if len(args.data) > 2:
            raise ValueError(
                f"--data: expected one file or two aligned files, got {len(args.data)}"
            )
        data = args.data[0] if len(args.data) == 1 else tuple(args.data)
        try:
            pairs, report = read_pairs(
                data, args.format, src_column=args.src_column, tgt_column=args.tgt_column
            )
        except (ValueError, TypeError, FileNotFoundError) as err:  # named as the flags
            raise named_by_flag(err, _READ_FLAGS) from None
        if report.n_skipped:
            log.warning("%s", report)
        return pairs, " + ".join(args.data)
    if SPLIT not in verify_checkpoint(tr.path, files=[])["files"]:
        raise ValueError(
            f"--data: {str(tr.path)!r} is an exported model (it keeps no record of the data it "
            "was trained on, so there is no test split to score): give the parallel text to "
            "score with --data FILE"
        )
    pairs, what = saved_run_pairs(tr.path, args.split)
    if not pairs:
        raise ValueError(f"--split: the run's {args.split} split is empty")
    return pairs, what


def run(args: argparse.Namespace) -> int:
    """Score the model as the command line says; print the scores (``--json``: one object)."""
    from ..inference.scores import tokenizer_modules

    needs = tokenizer_modules(args.tokenize) if args.tokenize else []
    require(f"qkv {NAME}", [*engine_needs(args), "sacrebleu", *needs])
    try:
        check_positive(args, "beam", "batch_tokens")
        tr = load_translator(args)
        pairs, what = _pairs(args, tr)
        if args.limit is not None:
            if args.limit < 1:
                raise ValueError(f"--limit: expected a number of pairs >= 1, got {args.limit}")
            pairs = pairs[: args.limit]
        ev = tr.evaluate(pairs, normalize_references=args.normalized_refs, tokenize=args.tokenize)
    except user_errors() as e:
        return fail(NAME, e)
    if args.json:
        dec = tr.decoding
        print(
            json.dumps(
                {
                    **ev.to_dict(),
                    "data": str(what),
                    "model": str(tr.path),
                    "beam": dec.beam_size,
                    "length_penalty": dec.length_penalty,
                    "languages": list(tr.languages) if tr.languages else None,
                }
            )
        )
        return 0
    langs = tr.languages
    pair = f"{langs[0]} -> {langs[1]}, " if langs else ""
    print(f"{ev.n} sentences from {what}, model {tr.path} ({pair}{tr.decoding.describe()})")
    if ev.references_normalized:
        print(
            "NOTE: references normalised as the training data (--normalized-refs): not "
            "comparable with sacreBLEU scores on raw text"
        )
    print(f"BLEU = {ev.bleu:.2f}   ({ev.bleu_detail})")
    print(f"  signature: {ev.signatures['bleu']}")
    print(f"chrF = {ev.chrf:.2f}")
    print(f"  signature: {ev.signatures['chrf']}")
    return 0
