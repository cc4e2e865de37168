"""``qkv prepare``: a corpus read, split, tokenized and encoded once into a folder that
``qkv train --data FOLDER`` trains from with flat memory (:func:`qkv.train.prepare_corpus`).

The data flags are ``qkv train``'s (``--data``, ``--valid``, ``--test``, ``--format``, the
columns, ``--pair``, ``--strict``, ``--config``, ``--set`` for the split and the tokenizer), so
a corpus is prepared with the very settings a run would read it with.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .._deps import MissingDependency, require
from ._common import fail, user_errors, with_default
from ._train_settings import (
    TRAIN_FLAGS,
    config_modules,
    named_as_given,
    train_config,
    train_flag_default,
)

if TYPE_CHECKING:
    from ..train.config import TrainConfig
    from ..train.corpus import Sizing

NAME = "prepare"

#: the flags of ``qkv train`` that ``qkv prepare`` takes (what decides the prepared data)
PREPARE_FLAGS = (
    "--data",
    "--valid",
    "--test",
    "--src-lang",
    "--tgt-lang",
    "--format",
    "--src-column",
    "--tgt-column",
    "--max-skipped",
    "--tokenizer",
)
#: the flags of ``qkv train`` that say which runs the corpus is for, with their help here: the
#: vocabulary is the one the preset of such a run chooses (``--max-minutes``: the tier this
#: machine's measured speed gives that budget, measured as ``qkv train`` measures it)
SIZING_FLAGS = {
    "--max-minutes": "the runs' time budget: the vocabulary of the preset a run of that budget "
    "chooses on this machine now (on a CPU, its speed measured for a few seconds, as qkv train "
    "measures it; default: none, the corpus size's vocabulary)",
    "--preset": "the runs' preset: auto (default), none, or a tier name (docs/train.md)",
    "--device": "the runs' device, for their preset: auto (default), cpu, cuda, cuda:N",
    "--threads": "CPU threads the speed is measured on (default 0: chosen from the load, as "
    "qkv train chooses them)",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv prepare``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="read, split, tokenize and encode a corpus once, for qkv train --data FOLDER",
        description="Prepare a corpus of any size, read as a stream (a chunk of pairs in "
        "memory at a time): the split, the tokenizers (trained on a seeded sample) and token "
        "arrays on disk in --out; qkv train --data OUT then trains with flat memory on every "
        "rank (qkv train --data FILE does this itself, into OUT/data, for a large file). A "
        "second prepare of unchanged data does nothing; a killed one continues where it "
        "stopped.",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the folder to write (e.g. data-bin/): new, empty, or a corpus qkv prepare wrote; "
        "locked while written (a second prepare or a train there refuses)",
    )
    p.add_argument("--config", metavar="FILE", help="a YAML or TOML file of settings")
    for name in PREPARE_FLAGS:
        key, typ, text = TRAIN_FLAGS[name]
        shown = with_default(text, lambda k=key: train_flag_default(k))
        kw: dict[str, Any] = {"type": typ, "default": argparse.SUPPRESS, "help": shown}
        if name in ("--data", "--valid", "--test", "--tokenizer"):
            kw |= {"nargs": "+", "metavar": "FILE"}
        p.add_argument(name, **kw)
    runs = p.add_argument_group(
        "the runs it is for (the vocabulary is the one their preset chooses, as in qkv train; "
        "without --max-minutes, the corpus size's)"
    )
    for (name, text), metavar in zip(SIZING_FLAGS.items(), ("M", "P", "D", "N"), strict=True):
        typ = TRAIN_FLAGS[name][1]
        runs.add_argument(name, type=typ, metavar=metavar, default=argparse.SUPPRESS, help=text)
    p.add_argument("--pair", metavar="SRC-TGT", help="the language pair (as qkv train --pair)")
    p.add_argument(
        "--strict", action="store_true", help="refuse a data file with any unreadable line"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a data setting, e.g. --set valid=2000 --set vocab_size=16000 (repeatable)",
    )
    clean = p.add_argument_group("cleaning (the training pairs only; off by default)")
    clean.add_argument(
        "--max-ratio",
        type=float,
        metavar="R",
        help="drop a pair whose longer side has more than R times the characters of the other",
    )
    clean.add_argument("--dedup", action="store_true", help="drop repeated pairs (by hash)")
    clean.add_argument(
        "--drop-copies", action="store_true", help="drop a pair whose target is its source"
    )
    clean.add_argument(
        "--check-languages",
        action="store_true",
        help="drop a pair whose sides are not detected as the source and target languages "
        "(py3langid: pip install 'qkv[langid]')",
    )
    p.add_argument(
        "--workers", type=int, default=0, help="processes that encode (default 0: every core)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def run(args: argparse.Namespace) -> int:
    """Prepare the corpus as the command line says; print the folder."""
    require(f"qkv {NAME}", config_modules(args))
    from ..data.prepared import Cleaning
    from ..train.corpus import prepare_corpus
    from ..train.runlock import RunLockedError

    args.resume, args.resume_from = False, None
    try:
        if args.workers < 0:
            raise ValueError(f"--workers: expected 0 (every core) or more, got {args.workers}")
        config, _ = train_config(args)
        cleaning = Cleaning(
            max_ratio=args.max_ratio,
            dedup=args.dedup,
            drop_copies=args.drop_copies,
            languages=("?", "?") if args.check_languages else None,  # the corpus's, once known
        )
        say = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
        out = prepare_corpus(
            config,
            args.out,
            workers=args.workers or None,
            say=say,
            stream=None if args.quiet else sys.stderr,
            cleaning=cleaning,
            sizing=_sizing(config),
        )
    except MissingDependency as e:
        raise MissingDependency(f"qkv {NAME}", e.packages, e.extras) from None
    except user_errors(RunLockedError) as e:
        return fail(NAME, named_as_given(e, args))
    except KeyboardInterrupt:
        print("qkv prepare: interrupted; run it again to continue", file=sys.stderr)
        return 130
    print(f"prepared: {out}")
    return 0


def _sizing(config: TrainConfig) -> Sizing:
    """The runs the corpus is for (:meth:`qkv.train.corpus.Sizing.of_runs`): a budget's speed
    measured on the threads ``qkv train`` would choose now."""
    from ..train.corpus import Sizing

    return Sizing.of_runs(config)
