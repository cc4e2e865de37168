"""What ``qkv train`` and ``qkv prepare`` share: the flags that give a ``TrainConfig`` setting,
the settings read from the command line, and errors named by the flag the user typed.

``qkv prepare`` takes the data flags of ``qkv train`` (what decides the prepared data), so a
corpus is prepared with the very settings a run would read it with. Nothing here imports torch
when it is imported: building the parser (``qkv --help``) reads no library default until
``--help`` shows it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from .._errors import SettingError
from ._common import named_by_flag

__all__ = [
    "TRAIN_FLAGS",
    "config_modules",
    "named_as_given",
    "resume_point",
    "train_config",
    "train_flag_default",
]

# flag -> (TrainConfig key, type, help): the flags of `qkv train` (all default to "not given");
# each help ends with the key's TrainConfig default, read from the dataclass by train_flag_default
TRAIN_FLAGS: dict[str, tuple[str, type, str]] = {
    "--data": (
        "data",
        str,
        "parallel text in any qkv.data format, or two aligned files (--data train.en train.fr; "
        "with --pair SRC-TGT, --data PREFIX reads PREFIX.SRC and PREFIX.TGT)",
    ),
    "--valid": (
        "valid_data",
        str,
        "a validation set of its own: a file or two aligned files (as --data); the run's "
        "validation split is then this file",
    ),
    "--test": (
        "test_data",
        str,
        "a test set of its own: a file or two aligned files (as --data)",
    ),
    "--src-lang": ("src_lang", str, "the source language (ISO 639-1/BCP-47 code: en, zh-CN)"),
    "--tgt-lang": ("tgt_lang", str, "the target language (ISO 639-1/BCP-47 code)"),
    "--tokenize": (
        "tokenize",
        str,
        "sacreBLEU's BLEU tokenizer for validation, the average and the decoding choice "
        "(13a, zh, ja-mecab, ko-mecab, intl, char, none)",
    ),
    "--format": ("data_format", str, "the data file's format"),
    "--src-column": (
        "src_column",
        str,
        "the source column of a tsv/csv file with a header row, or a jsonl field",
    ),
    "--tgt-column": (
        "tgt_column",
        str,
        "the target column of a tsv/csv file with a header row, or a jsonl field",
    ),
    "--max-skipped": (
        "max_skipped",
        float,
        "refuse a data file whose unreadable lines (blank ones aside) exceed this fraction",
    ),
    "--prepare-data": (
        "prepare_data",
        str,
        "prepare the data file into OUT/data first (as qkv prepare does) and train from there "
        "with flat memory: auto, always or never",
    ),
    "--tokenizer": (
        "tokenizer_model",
        str,
        "an existing SentencePiece model used as it is instead of training one: one .model "
        "file for both sides (one vocabulary), or two (--tokenizer src.model tgt.model)",
    ),
    "--subword-alpha": (
        "subword_alpha",
        float,
        "subword regularisation while training: each epoch samples a new segmentation of "
        "the training text with SentencePiece (unigram: smoothing, 0.5 samples near the best "
        "segmentation, 0.1 over all of them can double a sentence's pieces; BPE: BPE-dropout "
        "probability); never at validation or translation; 0: off",
    ),
    "--subword-nbest-size": (
        "subword_nbest_size",
        int,
        "unigram sampling from the N best segmentations (-1: all); SentencePiece's nbest_size",
    ),
    "--model": ("model", str, "transformer or bahdanau"),
    "--preset": ("preset", str, "auto, none, or a tier name (docs/train.md)"),
    "--max-steps": ("max_steps", int, "the most optimizer updates"),
    "--max-minutes": (
        "max_minutes",
        float,
        "the run's time budget (across --resume): training, evaluations and the final "
        "averaging fit in it",
    ),
    "--seed": ("seed", int, "seed of the weights, dropout and batch order"),
    "--max-tokens": ("max_tokens", int, "token budget of one micro-batch per process"),
    "--accum-steps": ("accum_steps", int, "micro-batches per update (gradient accumulation)"),
    "--lr": ("lr", float, "peak learning rate"),
    "--warmup-steps": ("warmup_steps", int, "linear warm-up updates"),
    "--schedule": ("schedule", str, "auto, linear, cosine or inverse_sqrt"),
    "--label-smoothing": ("label_smoothing", float, "label smoothing epsilon"),
    "--clip-norm": ("clip_norm", float, "gradient-norm clipping, 0 for none"),
    "--eval-every": ("eval_every", int, "validation loss and BLEU every N updates"),
    "--save-every": ("save_every", int, "checkpoint every N updates"),
    "--keep-last": ("keep_last", int, "checkpoints kept besides the best"),
    "--patience": ("patience", int, "early stopping: evaluations without a better BLEU (0: off)"),
    "--log-every": ("log_every", int, "progress line every N updates"),
    "--device": ("device", str, "auto, cpu, cuda, cuda:N"),
    "--threads": ("threads", int, "CPU threads for torch (0: chosen from the load)"),
}

#: the flags other than TRAIN_FLAGS that give a setting train() names in its errors
_RUN_FLAGS = {"resume_from": "--resume-from", "init_from": "--init-from", "out": "--out"}

#: what a TrainConfig default of None or "auto" stands for, shown after it in --help (the
#: numbers in braces are filled in from the library by train_flag_default)
_AUTO_MEANS: dict[str, str] = {
    "data": "the bundled corpus",
    "valid_data": "the --valid fraction of --data",
    "test_data": "the --test fraction of --data",
    "src_lang": "read from the data (columns, file suffixes, fra.txt) or detected",
    "tgt_lang": "read from the data (columns, file suffixes, fra.txt) or detected",
    "tokenize": "the target language's, as sacrebleu -l SRC-TGT picks it",
    "data_format": "guessed from the file",
    "prepare_data": "a file above {prepare_mib} MiB of text (times the torchrun processes)",
    "src_column": "src or source",
    "tgt_column": "tgt or target",
    "tokenizer_model": "one trained on the data",
    "preset": "from the corpus, budget and device",
    "max_steps": "{max_steps}; with --max-minutes, no limit but the clock",
    "max_minutes": "no time limit",
    "max_tokens": "the preset's",
    "lr": "the preset's",
    "label_smoothing": "the preset's: 0 for a run that sees its data under {few:g} times, else "
    "{smoothing:g}; {smoothing:g} with --preset none and for fine-tuning",
    "warmup_steps": "{warmup:.0%} of the planned run",
    "schedule": "linear decay to the end of the run",
    "eval_every": "about {evals} per run",
    "save_every": "about {saves} per run",
    "device": "CUDA when available, else the CPU",
}


def train_flag_default(key: str) -> str:
    """How ``qkv train --help`` shows the default of TrainConfig field ``key``: its value, and
    for None or ``"auto"`` what that stands for."""
    from ..train import Plan, TrainConfig
    from ..train.config import DEFAULT_MAX_STEPS
    from ..train.corpus import PREPARE_ABOVE
    from ..train.presets import FEW_EPOCHS, LABEL_SMOOTHING

    default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}[key]
    if default is not None and default != "auto":
        return str(default)
    means = _AUTO_MEANS[key].format(
        max_steps=DEFAULT_MAX_STEPS,
        warmup=Plan.WARMUP_FRACTION,
        evals=Plan.EVALS,
        saves=Plan.SAVES,
        prepare_mib=PREPARE_ABOVE // 2**20,
        few=FEW_EPOCHS,
        smoothing=LABEL_SMOOTHING,
    )
    return means if default is None else f"auto: {means}"


def resume_point(text: str | None) -> int | str | None:
    """``--resume-from``: an update number (digits) or a checkpoint folder."""
    if text is None:
        return None
    return int(text) if text.strip().isdigit() else text


def train_config(args: argparse.Namespace) -> tuple[Any, bool]:
    """The run's ``TrainConfig`` from the command line, and whether it resumes: the defaults
    (a resumed run's own settings) < ``--config`` < the flags < ``--set``."""
    from ..inference import RunLayout
    from ..train import TrainConfig, load_config_file, parse_assignment
    from ..train.checkpoint import resumed_settings

    changes: dict[str, Any] = {}
    if getattr(args, "config", None):
        changes.update(load_config_file(args.config))
    flags: dict[str, Any] = {}
    for name, (key, _, _) in TRAIN_FLAGS.items():
        dest = name[2:].replace("-", "_")
        if hasattr(args, dest):
            flags[key] = getattr(args, dest)
    _files_and_pair(flags, getattr(args, "pair", None))
    if getattr(args, "tensorboard", False):
        flags["tensorboard"] = True
    if getattr(args, "bf16", None) is not None:  # --bf16 or --no-bf16
        flags["bf16"] = args.bf16
    if args.strict:
        if hasattr(args, "max_skipped"):
            raise ValueError(
                f"--strict: refuses any unreadable line, which --max-skipped "
                f"{args.max_skipped:g} contradicts; give one of them"
            )
        flags["max_skipped"] = 0.0
    for text in getattr(args, "set", None) or []:
        key, value = parse_assignment(text)
        flags[key] = value
    out = Path(args.out)
    resume_from = resume_point(args.resume_from)
    resume = args.resume or resume_from is not None
    if resume:
        saved = resumed_settings(RunLayout(out).checkpoints, resume_from)
        if saved is not None:
            base = TrainConfig.from_dict(saved)
            return base.updated({**changes, **flags}), True
    return TrainConfig().updated({**changes, **flags}), resume


def _files_and_pair(flags: dict[str, Any], pair: str | None) -> None:
    """``--data``/``--valid``/``--test`` as settings (one file, or two aligned files), and
    ``--pair SRC-TGT``: the languages, and a single PREFIX read as ``PREFIX.SRC``,
    ``PREFIX.TGT``."""
    langs = None
    if pair is not None:
        src, sep, tgt = pair.partition("-")
        # a code may hold a region (zh-CN): split at the first "-" whose halves are both codes
        parts = pair.split("-")
        for i in range(1, len(parts)):
            a, b = "-".join(parts[:i]), "-".join(parts[i:])
            if _is_code(a) and _is_code(b):
                src, sep, tgt = a, "-", b
                break
        if not sep or not src or not tgt:
            raise SettingError("pair", f"expected SRC-TGT language codes (en-fr), got {pair!r}")
        langs = (src, tgt)
        flags.setdefault("src_lang", src)
        flags.setdefault("tgt_lang", tgt)
    models = flags.get("tokenizer_model")
    if isinstance(models, list):  # one SentencePiece model, or one per side
        if len(models) > 2:
            raise SettingError(
                "tokenizer_model",
                f"expected one SentencePiece model, or two (source, target), got {len(models)}",
            )
        flags["tokenizer_model"] = models[0] if len(models) == 1 else models
    for key in ("data", "valid_data", "test_data"):
        files = flags.get(key)
        if not isinstance(files, list):
            continue
        if len(files) == 1 and langs is not None:
            files = [f"{files[0]}.{langs[0]}", f"{files[0]}.{langs[1]}"]
        if len(files) > 2:
            raise SettingError(
                key, f"expected one file or two aligned files (source, target), got {len(files)}"
            )
        flags[key] = files[0] if len(files) == 1 else files


def _is_code(word: str) -> bool:
    from ..data.languages import language_code

    return language_code(word) is not None


def named_as_given(err: BaseException, args: argparse.Namespace) -> BaseException:
    """``err`` naming the flag that gave the setting it is about (``--data``, not ``data``),
    when the user gave it by that flag (:func:`~qkv.cli._common.named_by_flag`)."""
    flags = {key: name for name, (key, _, _) in TRAIN_FLAGS.items()} | _RUN_FLAGS
    flags["pair"] = "--pair"
    given = {
        key: name
        for key, name in flags.items()
        if getattr(args, name[2:].replace("-", "_"), None) is not None
    }
    return named_by_flag(err, given)


def config_modules(args: argparse.Namespace) -> list[str]:
    """The module that reads ``--config`` (the command reads it, before the library checks)."""
    config = str(getattr(args, "config", None) or "").lower()
    if config.endswith((".yaml", ".yml")):
        return ["yaml"]
    if config.endswith(".toml") and sys.version_info < (3, 11):
        return ["tomli"]
    return []
