"""Using a trained model, below everything that uses one: loading a saved model folder, decoding
text in batches, scoring with sacreBLEU, and picking the device.

Training (its validation and final model), :mod:`qkv.translate`, ``qkv evaluate``, the demos and
any later server import these; this package imports nothing above it (no ``train``,
``translate``, ``cli`` or ``demos``). Where things are in a run folder (checkpoints, ``best.json``,
``final/``, the lock) is :class:`RunLayout` (:mod:`qkv.inference.layout`), for the trainer that
writes them and every reader.

>>> from qkv.inference import Decoding, load_model, decode_texts, corpus_scores
>>> saved = load_model("runs/en-fr")                     # model, tokenizers, decoding, path
>>> ids = decode_texts(saved.model, ["Go."], saved.src_tokenizer, saved.tgt_tokenizer,
...                    Decoding(beam_size=4))
>>> saved.tgt_tokenizer.decode(ids[0])

How to decode is one value, :class:`Decoding`; every engine (qkv's :class:`qkv.translate.
Translator`, CTranslate2's, ONNX's) is a :class:`TextTranslator`, a :class:`TranslatorBase`
that decodes one batch (its ``_decode_batch``) under the base's one policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
    from .decode import ModelEngine, decode_texts, generate_ids, never_generated
    from .device import pick_device
    from .engine import (
        Hypothesis,
        TextTranslator,
        TranslatorBase,
        evaluate_pairs,
        one_best_or_all,
        recorded_languages,
    )
    from .layout import RunLayout
    from .limits import position_limits
    from .options import CANDIDATES, Decoding, default_max_len, default_output_len
    from .quantize import QUANTIZATIONS, check_quantize, quantize_model
    from .saved import (
        CheckpointError,
        LoadedCheckpoint,
        SavedModel,
        best_checkpoint,
        find_checkpoints,
        latest_checkpoint,
        load_checkpoint,
        load_model,
        load_model_weights,
        model_languages,
        read_weights,
        resolve_model_dir,
        verify_checkpoint,
    )
    from .scores import BLEU_TOKENIZERS, Evaluation, bleu_tokenizer, corpus_scores
    from .writing import (
        BUNDLED_DATA,
        BUNDLED_LANGUAGES,
        NoSpaceError,
        model_card,
        remove_stale_folders,
        run_card,
        save_model,
        write_model_folder,
    )

#: each public name and the module that defines it: loaded when first used, so that a
#: light one (``Decoding``, ``RunLayout``) does not import torch (``qkv translate --help``)
_WHERE: dict[str, str] = {
    "BLEU_TOKENIZERS": "scores",
    "BUNDLED_DATA": "writing",
    "BUNDLED_LANGUAGES": "writing",
    "CANDIDATES": "options",
    "CheckpointError": "saved",
    "Decoding": "options",
    "Evaluation": "scores",
    "Hypothesis": "engine",
    "LoadedCheckpoint": "saved",
    "ModelEngine": "decode",
    "NoSpaceError": "writing",
    "QUANTIZATIONS": "quantize",
    "RunLayout": "layout",
    "SavedModel": "saved",
    "TextTranslator": "engine",
    "TranslatorBase": "engine",
    "best_checkpoint": "saved",
    "bleu_tokenizer": "scores",
    "check_quantize": "quantize",
    "corpus_scores": "scores",
    "decode_texts": "decode",
    "default_max_len": "options",
    "default_output_len": "options",
    "evaluate_pairs": "engine",
    "find_checkpoints": "saved",
    "generate_ids": "decode",
    "latest_checkpoint": "saved",
    "load_checkpoint": "saved",
    "load_model": "saved",
    "load_model_weights": "saved",
    "model_card": "writing",
    "model_languages": "saved",
    "never_generated": "decode",
    "one_best_or_all": "engine",
    "pick_device": "device",
    "position_limits": "limits",
    "quantize_model": "quantize",
    "read_weights": "saved",
    "recorded_languages": "engine",
    "remove_stale_folders": "writing",
    "resolve_model_dir": "saved",
    "run_card": "writing",
    "save_model": "writing",
    "verify_checkpoint": "saved",
    "write_model_folder": "writing",
}

__all__ = [
    "BLEU_TOKENIZERS",
    "BUNDLED_DATA",
    "BUNDLED_LANGUAGES",
    "CANDIDATES",
    "QUANTIZATIONS",
    "CheckpointError",
    "Decoding",
    "Evaluation",
    "Hypothesis",
    "LoadedCheckpoint",
    "ModelEngine",
    "NoSpaceError",
    "RunLayout",
    "SavedModel",
    "TextTranslator",
    "TranslatorBase",
    "best_checkpoint",
    "bleu_tokenizer",
    "check_quantize",
    "corpus_scores",
    "decode_texts",
    "default_max_len",
    "default_output_len",
    "evaluate_pairs",
    "find_checkpoints",
    "generate_ids",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "load_model_weights",
    "model_card",
    "model_languages",
    "never_generated",
    "one_best_or_all",
    "pick_device",
    "position_limits",
    "quantize_model",
    "read_weights",
    "recorded_languages",
    "remove_stale_folders",
    "resolve_model_dir",
    "run_card",
    "save_model",
    "verify_checkpoint",
    "write_model_folder",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)
