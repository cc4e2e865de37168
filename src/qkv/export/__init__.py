"""A trained model made ready to ship: an inference-only folder, and other engines' formats.

* :func:`save_model`: a model built in Python (``qkv.nn.build_model`` and two tokenizers) as a
  model folder every qkv command reads (:func:`qkv.inference.save_model`);
* :func:`export_model`: the same from a saved model (a ``qkv train`` run, a checkpoint), its run's
  scores and settings in the ``README.md`` model card (``qkv export``);
* :mod:`qkv.export.ctranslate2`: a CTranslate2 model (``qkv export --format ctranslate2``) and
  :class:`~qkv.export.ctranslate2.Ct2Translator`, loaded on use (the ``ct2`` extra);
* :mod:`qkv.export.onnx`: the encoder and one cached decoder step as ONNX graphs
  (``qkv export --format onnx``) and :class:`~qkv.export.onnx.OnnxTranslator`, which runs them
  with onnxruntime, loaded on use (the ``onnx`` extra).

>>> from qkv.export import export_model
>>> export_model("runs/en-fr", "deploy/en-fr")      # a third of the run's size, or less
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..inference import SavedModel, load_model, run_card, save_model, verify_checkpoint

__all__ = ["export_model", "save_model"]


def export_model(
    model: SavedModel | str | Path,
    out: str | Path,
    *,
    force: bool = False,
    extra: Callable[[SavedModel, Path], None] | None = None,
    use: list[str] | None = None,
) -> Path:
    """Write a saved model as an inference-only model folder ``out`` (weights, config,
    tokenizers, its decoding, a ``README.md`` model card with the run's data, scores and
    settings; no training state), atomically.

    Args:
        model: a :class:`~qkv.inference.SavedModel`, or a folder
            :func:`~qkv.inference.load_model` reads (a run's final model, else its best
            checkpoint; a checkpoint; an exported model).
        out: the folder to write: new or empty.
        force: replace a model folder exported before (never a run or a checkpoint).
        extra: ``fn(saved, folder)`` writing another engine's model into the folder before its
            manifest (as :func:`qkv.export.ctranslate2.export_ctranslate2` does).
        use: the model card's "Use" section (Markdown lines); None: qkv's commands.

    Returns:
        ``out``.

    Raises:
        CheckpointError: no usable model at ``model``.
        ValueError: ``out`` is not empty (without ``force``), or not a model folder.
    """
    saved = model if isinstance(model, SavedModel) else load_model(model)
    return save_model(
        saved.model,
        saved.src_tokenizer,
        saved.tgt_tokenizer,
        out,
        decoding=saved.decoding,
        card=run_card(saved.path),
        force=force,
        step=int(verify_checkpoint(saved.path, files=[]).get("step") or 0),
        source=saved.path,
        extra=None if extra is None else (lambda d: extra(saved, d)),
        languages=saved.languages,
        use=use,
    )
