"""A run's text: read, split, normalised, tokenized; and the split of a saved run read back.

:func:`load_run_data` is what ``qkv train`` trains and validates on; :func:`saved_run_pairs` is
what ``qkv evaluate`` scores a saved model on by default (the run's own test split).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data import (
    Normalizer,
    ReadReport,
    Split,
    Tokenizer,
    build_tokenizers,
    bundled_pairs,
    read_pairs,
    split_pairs,
)
from ..inference import CheckpointError, load_checkpoint, resolve_model_dir
from .config import TrainConfig

__all__ = [
    "RUN_PARTS",
    "RunData",
    "load_run_data",
    "raw_run_pairs",
    "read_run_pairs",
    "saved_run_pairs",
]

log = logging.getLogger(__name__)


@dataclass
class RunData:
    """A run's text: the split, the three parts (normalised), the tokenizers."""

    split: Split
    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]
    test: list[tuple[str, str]]
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    source: str
    raw_valid: list[str] = field(default_factory=list)
    raw_test: list[str] = field(default_factory=list)


def _normalizer(name: str) -> Normalizer:
    return Normalizer.book() if name == "book" else Normalizer()


def read_run_pairs(config: TrainConfig) -> tuple[list[tuple[str, str]], str]:
    """The raw pairs of ``config.data`` (the bundled corpus when None), cut to ``max_pairs``.

    Skipped lines are reported through :mod:`logging` (a WARNING with the counts by reason and
    the first line numbers); a file whose unreadable lines (blank ones aside) are more than
    ``config.max_skipped`` of its lines is refused.

    Raises:
        ValueError, FileNotFoundError: the file cannot be read, or is mostly unreadable; the
            message starts with ``data:`` (``data_format:`` for an unknown format).
    """
    if config.data is None:
        pairs, source = bundled_pairs(), "the bundled English-French corpus"
    else:
        source = config.data
        try:
            pairs, report = read_pairs(
                config.data,
                config.data_format,
                src_column=config.src_column,
                tgt_column=config.tgt_column,
            )
        except (ValueError, TypeError, FileNotFoundError) as e:
            raise type(e)(_as_data_error(str(e), source)) from None
        _check_skipped(report, config.max_skipped)
    if config.max_pairs is not None:
        pairs = pairs[: config.max_pairs]
    return pairs, source


def _as_data_error(text: str, source: str) -> str:
    """A reader's error as the run's setting names it: ``data:`` (the file), not ``path:``."""
    if text.startswith("path: "):
        return "data: " + text[len("path: ") :]
    if text.startswith("format: "):
        return "data_format: " + text[len("format: ") :]
    for key in ("src_column", "tgt_column"):  # named as the setting and its flag
        if text.startswith(f"{key}: "):
            flag = "--" + key.replace("_", "-")
            text = text.replace(f"pass {key}= to choose one", f"pass {flag} NAME ({key})")
            return f"{text} (data {source!r})"
    return f"data: {source!r}: {text}"


def apply_split(split: Split, pairs: list[tuple[str, str]], source: str, remedy: str) -> tuple:
    """``split.apply(pairs)``, or a ValueError that names the data file, what changed and
    ``remedy`` (what to run instead) when the pairs are not the ones the run was split from."""
    try:
        return split.apply(pairs)
    except ValueError:
        if len(pairs) != split.n:
            what = f"it gives {len(pairs)} pairs, the run was split from {split.n}"
        else:
            what = f"its {len(pairs)} pairs are not the text the run was split from"
        raise ValueError(
            f"data: {source!r} changed since the run was split ({what}; split.json "
            f"fingerprint {split.fingerprint}): {remedy}"
        ) from None


#: what to do when a resumed run's data changed
RESUME_REMEDY = (
    "put back the file the run was trained on, or start a new run in a new folder "
    "(qkv train --data FILE --out NEW_DIR; add --init-from OLD_RUN to keep its weights)"
)
#: what to do when the data of a run being scored changed
EVALUATE_REMEDY = (
    "put back the file the run was trained on, or score another file with "
    "qkv evaluate --model-dir RUN --data FILE"
)


def _check_skipped(report: ReadReport, max_skipped: float) -> None:
    """Refuse a mostly unreadable file; report the skipped lines of an accepted one."""
    bad, frac = report.n_unreadable, report.unreadable_fraction
    if bad and frac > max_skipped:
        allowed = (
            "none may be (max_skipped=0, --strict)"
            if max_skipped == 0
            else f"at most {max_skipped:.1%} may be (max_skipped={max_skipped:g}, --max-skipped)"
        )
        raise ValueError(
            f"data: {bad} of the {report.pairs + bad} lines of {report.path} ({frac:.1%}) "
            f"cannot be read, {allowed}; blank lines are not counted: "
            f"{report.summary(blank=False)}"
        )
    if report.n_skipped and os.environ.get("RANK", "0") == "0":  # said once under torchrun
        log.warning(
            "%s (%s): %d of %d lines skipped: %s",
            report.path,
            report.format,
            report.n_skipped,
            report.lines,
            report.summary(),
        )


def raw_run_pairs(
    config: TrainConfig, split: Split
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """The run's train, valid and test pairs exactly as the data file holds them (not
    normalised): what translations are scored against."""
    pairs, source = read_run_pairs(config)
    train, valid, test = apply_split(split, pairs, source, EVALUATE_REMEDY)
    return list(train), list(valid), list(test)


#: the parts of a run's data, in the order :meth:`qkv.data.Split.apply` returns them
RUN_PARTS = ("train", "valid", "test")


def saved_run_pairs(model_dir: str | Path, part: str = "test") -> tuple[list[tuple[str, str]], str]:
    """One part of the data a saved model was trained on, as the data file holds it (not
    normalised: what ``qkv evaluate`` scores against), and what it is in words.

    Args:
        model_dir: a ``qkv train --out`` folder or one of its checkpoint or model folders (see
            :func:`qkv.inference.resolve_model_dir`).
        part: ``"train"``, ``"valid"`` or ``"test"``.

    Returns:
        ``(pairs, description)``, e.g. ``"the test split of data/en-fr.tsv"``; no pairs
        when that part of the run is empty.

    Raises:
        ValueError: an unknown ``part``, or data that is not the data the run was split from.
        CheckpointError: no usable checkpoint there.
    """
    if part not in RUN_PARTS:
        raise ValueError(f"part: expected one of {RUN_PARTS}, got {part!r}")
    ckpt = load_checkpoint(resolve_model_dir(model_dir), with_tensors=False)
    try:
        config = TrainConfig.from_dict(ckpt.train_config)
        split = Split.from_dict(ckpt.split)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint: {str(ckpt.path)!r} is unusable: {e}") from None
    pairs = dict(zip(RUN_PARTS, raw_run_pairs(config, split)))[part]
    source = config.data or "the bundled English-French corpus"
    return pairs, f"the {part} split of {source}"


def load_run_data(
    config: TrainConfig,
    *,
    split: Split | None = None,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    pairs: tuple[list[tuple[str, str]], str] | None = None,
) -> RunData:
    """Read, split and normalise the run's pairs, and build (or take) the tokenizers.

    With ``split`` (a resumed run, or evaluation) the saved split is applied, which checks that
    the data is the data the run was trained on. ``pairs`` gives the ``(pairs, source)`` that
    :func:`read_run_pairs` returned, when they were read already. The references of the
    validation and test parts are also kept as they were read (``raw_valid``, ``raw_test``):
    translations are scored against those, as sacreBLEU scores.
    """
    pairs_read, source = pairs if pairs is not None else read_run_pairs(config)
    if split is None:
        split = split_pairs(
            pairs_read, valid=config.valid, test=config.test, seed=config.split_seed
        )
    train, valid, test = apply_split(split, pairs_read, source, RESUME_REMEDY)
    if not train or not valid:
        raise ValueError(
            f"data: {source} gives {len(train)} training and {len(valid)} validation pairs; "
            "expected some of each (more data, or other valid/test sizes)"
        )
    raw_valid, raw_test = [t for _, t in valid], [t for _, t in test]
    bundled = config.data is None
    # a resumed run keeps the normaliser saved with its tokenizers, even if the named one changed
    saved = tokenizers[0].normalizer if tokenizers is not None else None
    name = config.normalizer if config.normalizer != "auto" else ("book" if bundled else "plain")
    norm = saved if saved is not None else _normalizer(name)
    train, valid, test = norm.pairs(train), norm.pairs(valid), norm.pairs(test)
    if tokenizers is None:
        kind = config.tokenizer
        if kind == "auto":
            kind = "word" if bundled else "sentencepiece"
        joint = config.joint_vocab if config.joint_vocab is not None else kind == "sentencepiece"
        opts: dict[str, Any] = (
            {"min_freq": config.min_freq}
            if kind == "word"
            else {
                "vocab_size": config.vocab_size or 8000,
                "model_type": config.subword_model,
                "byte_fallback": config.byte_fallback,
            }
        )
        src_tok, tgt_tok = build_tokenizers(
            train, kind, joint=joint, normalizer=norm, pre_normalized=True, **opts
        )
    else:
        src_tok, tgt_tok = tokenizers
    return RunData(split, train, valid, test, src_tok, tgt_tok, source, raw_valid, raw_test)
