"""Starting a new run from a saved model's weights (``init_from``: fine-tuning).

:func:`load_init` reads the model (:func:`qkv.inference.load_model`, verified) into an
:class:`InitModel`: its weights, architecture and tokenizers. The run keeps the architecture and
the vocabulary (:meth:`InitModel.settings` refuses settings that contradict them, before any data
is read) and starts at update 0 with a fresh optimizer and a fine-tuning schedule
(:func:`qkv.train.presets.resolve_config` with ``fine_tuning``); the loop validates the
starting weights as update 0. A model ``qkv import`` wrote is such a model: its tokenizers
(SentencePiece with its own vocabulary and special ids) and its architecture are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._errors import SettingError, keyed
from ..data import Normalizer, Tokenizer, VocabSentencePieceTokenizer
from ..inference import CheckpointError, load_model
from ..inference.saved import MANIFEST
from .config import TrainConfig

__all__ = ["INIT_MAY_CHANGE", "InitModel", "load_init"]


#: the model options a run started from another model's weights may change
INIT_MAY_CHANGE = frozenset({"dropout"})


@dataclass
class InitModel:
    """The saved model a new run starts from (``init_from``): its weights, architecture and
    tokenizers."""

    folder: Path
    step: int | None
    model_config: dict[str, Any]
    weights: dict[str, torch.Tensor]
    tokenizers: tuple[Tokenizer, Tokenizer]

    def describe(self) -> str:
        """The folder (and update) for messages."""
        return str(self.folder) + (f" (update {self.step})" if self.step is not None else "")

    def record(self) -> dict[str, Any]:
        """What the run state keeps of it (``RunState.init_from``)."""
        return {"path": str(self.folder), "step": self.step}

    def settings(self, config: TrainConfig) -> TrainConfig:
        """``config`` with this model's architecture and vocabulary.

        Raises:
            ValueError: ``config`` asks for another architecture or vocabulary (every
                difference listed), before any data is read.
        """
        mc, (src, tgt) = self.model_config, self.tokenizers
        own = {k: v for k, v in mc.items() if k not in ("src_vocab_size", "tgt_vocab_size", "kind")}
        joint = src is tgt
        norm = {Normalizer.book(): "book", Normalizer(): "plain"}.get(src.normalizer)
        # an imported model's SentencePiece (with its own vocabulary) is a SentencePiece one
        kind = "sentencepiece" if src.kind == VocabSentencePieceTokenizer.kind else src.kind
        conflicts = []
        # TrainConfig's default kind cannot be told from a choice: only another kind conflicts
        default_kind = TrainConfig.__dataclass_fields__["model"].default
        if config.model not in (mc["kind"], default_kind):
            conflicts.append(f"model: the model's {mc['kind']!r}, given {config.model!r}")
        conflicts += [
            f"model.{k}: the model's {own.get(k)!r}, given {v!r}"
            for k, v in sorted(config.model_options.items())
            if k not in INIT_MAY_CHANGE and own.get(k) != v
        ]
        for key, given, theirs, unset in (
            ("tokenizer", config.tokenizer, kind, "auto"),
            ("normalizer", config.normalizer, norm, "auto"),
            ("joint_vocab", config.joint_vocab, joint, None),
            ("vocab_size", config.vocab_size, tgt.vocab_size, None),
        ):
            if given != unset and theirs is not None and given != theirs:
                conflicts.append(f"{key}: the model's {theirs!r}, given {given!r}")
        if config.tokenizer_model is not None:
            conflicts.append(
                f"tokenizer_model: the model's own tokenizers, given {config.tokenizer_model!r}"
            )
        if conflicts:
            raise SettingError(
                "init_from",
                f"the model in {str(self.folder)!r} fixes the architecture and the "
                f"vocabulary, and these settings differ: {'; '.join(conflicts)} (leave them "
                f"out; of the model options only {', '.join(sorted(INIT_MAY_CHANGE))} may change)",
            )
        options = {**own, **{k: v for k, v in config.model_options.items() if k in own}}
        changes: dict[str, Any] = {
            "model": mc["kind"],
            "model_options": options,
            "tokenizer": kind,
            "joint_vocab": joint,
        }
        if norm is not None:
            changes["normalizer"] = norm
        return config.updated(changes)

    def load_into(self, model: nn.Module) -> None:
        """Copy the weights into ``model`` (built from :meth:`settings`' configuration)."""
        try:
            model.load_state_dict(self.weights)
        except RuntimeError as e:  # pragma: no cover - settings() keeps the shapes equal
            raise keyed(
                CheckpointError,
                "init_from",
                f"the weights in {str(self.folder)!r} do not fit the model: {e}",
            ) from None


def load_init(path: str | Path) -> InitModel:
    """Read the model a run starts from (:func:`qkv.inference.load_model`, verified).

    Raises:
        CheckpointError: nothing usable there (the message names ``init_from``).
    """
    try:
        saved = load_model(path, device="cpu")
        manifest = json.loads((saved.path / MANIFEST).read_text(encoding="utf-8"))
    except (CheckpointError, OSError, ValueError) as e:
        text = str(e)
        for label in ("model dir: ", "checkpoint: "):  # init_from names it
            text = text.removeprefix(label)
        raise keyed(CheckpointError, "init_from", f"{text}") from None
    step = manifest.get("step") if isinstance(manifest, dict) else None
    return InitModel(
        folder=saved.path,
        step=step if isinstance(step, int) else None,
        model_config=saved.model.config.to_dict(),
        weights=saved.model.state_dict(),
        tokenizers=(saved.src_tokenizer, saved.tgt_tokenizer),
    )
