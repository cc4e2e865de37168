"""``qkv train``: settings from defaults < ``--config FILE`` < flags < ``--set KEY=VALUE``,
then :func:`qkv.train.train`.

Every flag defaults to "not given" and its help shows ``TrainConfig``'s default, read from the
dataclass when ``--help`` shows it. The packages a run needs are the library's to say
(``train()`` checks them before reading or writing anything); this command checks only the
parser of ``--config``, which it reads before the library sees the settings. The flags and the
settings read from them are shared with ``qkv prepare`` (:mod:`qkv.cli._train_settings`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._deps import MissingDependency, require
from .._errors import SettingError
from ._common import fail, user_errors, with_default
from ._train_settings import (
    TRAIN_FLAGS,
    config_modules,
    named_as_given,
    resume_point,
    train_config,
    train_flag_default,
)

NAME = "train"
#: the exit status of a run whose model is not usable (== qkv.train.verdict.EXIT_NOT_LEARNED,
#: without importing torch for --help; tested)
EXIT_NOT_LEARNED = 3

MODEL_KINDS = ("transformer", "bahdanau")  # == qkv.nn.seq2seq.MODEL_KINDS (tested)
#: the flags that take one file or two aligned files
_FILES = ("--data", "--valid", "--test", "--tokenizer")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv train``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="train a translation model (also under torchrun for several processes)",
        description="Train a Transformer or Bahdanau translator. Settings: defaults < --config "
        "FILE < flags < --set KEY=VALUE. Under `torchrun --nproc_per_node N` it trains with "
        "DistributedDataParallel.",
        epilog="Exit status: 0 when the model learned (its validation BLEU beats copying the "
        "source and repeating one frequent sentence, without degenerate output); "
        f"{EXIT_NOT_LEARNED} when it learned nothing or too little to use (the model is still "
        "written, and a line says why and how to train it further); 1 an error; 2 bad "
        "settings; 130 or 143 stopped by SIGINT or SIGTERM (resumable).",
    )
    p.add_argument("--config", metavar="FILE", help="a YAML or TOML file of settings")
    p.add_argument("--out", default="runs/qkv", help="run folder (default: runs/qkv)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest intact checkpoint",
    )
    p.add_argument(
        "--resume-from",
        metavar="PATH|STEP",
        help="continue the run in --out from this checkpoint (a folder of OUT/checkpoints, or "
        "its update number); implies --resume",
    )
    p.add_argument(
        "--init-from",
        metavar="DIR",
        help="start a new run (update 0) from the weights of a saved model: a run folder, its "
        "final/, or a checkpoint folder; its architecture and tokenizers are kept (fine-tuning)",
    )
    for name, (key, typ, text) in TRAIN_FLAGS.items():
        shown = with_default(text, lambda k=key: train_flag_default(k))
        kw: dict[str, Any] = {"type": typ, "default": argparse.SUPPRESS, "help": shown}
        if name == "--model":  # qkv.nn.seq2seq.MODEL_KINDS, without importing torch for --help
            kw["choices"] = MODEL_KINDS
        if name in _FILES:
            kw |= {"nargs": "+", "metavar": "FILE"}
        p.add_argument(name, **kw)
    p.add_argument(
        "--pair",
        metavar="SRC-TGT",
        help="the language pair, as fairseq and OpenNMT write it: sets --src-lang and "
        "--tgt-lang, and --data/--valid/--test PREFIX read PREFIX.SRC and PREFIX.TGT",
    )
    p.add_argument(
        "--strict", action="store_true", help="refuse a data file with any unreadable line"
    )
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bfloat16 autocast for the forward pass (--no-bf16: float32); default: on where "
        "the speed probe measures it faster (a CPU with bfloat16 arithmetic)",
    )
    p.add_argument("--tensorboard", action="store_true", help="TensorBoard logs in OUT/tensorboard")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any setting, e.g. --set model.num_hiddens=128 (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def run(args: argparse.Namespace) -> int:
    """Train as the command line says; print where the model is."""
    require(f"qkv {NAME}", config_modules(args))
    from ..train import RunLockedError, TrainingError, TrainingInterrupted, train

    try:
        if args.init_from is not None and args.resume:
            raise SettingError(
                "init_from",
                "--resume continues the run's own checkpoint; starting from another "
                "model's weights is a new run (drop --resume, or --init-from)",
            )
        config, resume = train_config(args)
        result = train(
            config,
            args.out,
            resume=resume,
            resume_from=resume_point(args.resume_from),
            init_from=args.init_from,
            progress=not args.quiet,
        )
    except MissingDependency as e:  # the library's list, checked before any work: one line
        raise MissingDependency(f"qkv {NAME}", e.packages, e.extras) from None
    except user_errors(RunLockedError) as e:
        return fail(NAME, named_as_given(e, args))
    except TrainingError as e:
        print(f"qkv train: stopped: {e}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:  # its line (how to resume) was logged
        return e.exit_status
    except KeyboardInterrupt:
        print("qkv train: interrupted; resume with --resume", file=sys.stderr)
        return 130
    if result.final_model is not None:
        how = "greedy" if result.decoding is None else result.decoding.describe()
        bleu = "?" if result.final_bleu is None else f"{result.final_bleu:.2f}"
        print(f"model: {result.final_model} (valid BLEU {bleu}, {how})")
    elif result.best_checkpoint is not None:
        print(f"best checkpoint: {result.best_checkpoint} (valid BLEU {result.best_bleu:.2f})")
    if result.verdict is not None and not result.verdict.usable:
        return EXIT_NOT_LEARNED  # the verdict's line (why, and the fix) was logged
    return 0
