"""Opening a model folder with an engine: the one way ``qkv`` commands and ``qkv serve`` do it.

The engines live on floor 5, as siblings that do not know each other: qkv's own
(:class:`qkv.translate.Translator`), CTranslate2's (:class:`qkv.export.ctranslate2.
Ct2Translator`) and ONNX's (:class:`qkv.export.onnx.OnnxTranslator`). This package, one floor
above them, is where they are found by name (:data:`ENGINES`): :func:`folder_engine` says
which engine a folder holds, :func:`open_translator` opens it. Every engine is then a
:class:`qkv.inference.TextTranslator`.

>>> from qkv.engines import open_translator
>>> tr = open_translator("runs/en-fr")                                # qkv's engine
>>> ct2 = open_translator("deploy/en-fr", engine="ctranslate2", quantize="int8")

Nothing here imports torch or an engine's package until a folder is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import SettingError
from .._folder import CT2_DIR, CT2_OPTIONS, CT2_WEIGHTS, ONNX_CONFIG, WEIGHTS

if TYPE_CHECKING:
    from ..inference import TextTranslator

__all__ = ["ENGINES", "folder_engine", "open_translator"]

#: every engine's name, as ``--engine`` and :attr:`TextTranslator.engine` spell it
ENGINES: tuple[str, ...] = ("qkv", "ctranslate2", "onnx")


def folder_engine(folder: str | Path, engine: str = "qkv") -> str:
    """The engine that runs ``folder``: an ONNX export (``onnx.json``) runs on onnxruntime, a
    bare CTranslate2 model (``model.bin`` and ``qkv.json``) or an export holding a
    ``ctranslate2/`` model without qkv's weights (a quantized one) on CTranslate2; any other
    folder (a qkv run, checkpoint or export, with or without a ``ctranslate2/`` model inside)
    on ``engine``.

    Raises:
        SettingError: keyed ``engine``: not one of :data:`ENGINES`.
    """
    if engine not in ENGINES:
        raise SettingError("engine", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    p = Path(folder)
    if (p / ONNX_CONFIG).is_file():
        return "onnx"
    if (p / CT2_WEIGHTS).is_file() and (p / CT2_OPTIONS).is_file():
        return "ctranslate2"
    if (p / CT2_DIR / CT2_WEIGHTS).is_file() and not (p / WEIGHTS).exists():
        return "ctranslate2"  # a quantized export without qkv's float weights
    return engine


def open_translator(
    folder: str | Path,
    *,
    engine: str = "qkv",
    device: str = "cpu",
    quantize: str | None = None,
    threads: int = 0,
) -> TextTranslator:
    """The translator of the model folder ``folder`` on ``engine``, its default decoding the
    model's.

    Args:
        folder: a qkv run, checkpoint or export (``"qkv"``), an export holding a CTranslate2
            model or that model's folder (``"ctranslate2"``), an ONNX export (``"onnx"``).
        engine: one of :data:`ENGINES` (:func:`folder_engine` picks it from the folder).
        device: ``"cpu"``, ``"auto"``, ``"cuda"``, ``"cuda:N"`` (the ONNX runner: CPU only).
        quantize: ``"int8"`` (qkv: dynamic int8 linear layers, CPU only; CTranslate2: its
            compute type, any of its own); None: the saved weights as they are. The ONNX
            runner's graphs are what the export wrote: it takes none.
        threads: the CPU threads of a CTranslate2 model (0: torch's) or an ONNX one (0:
            onnxruntime's default); qkv's engine uses torch's.

    Raises:
        SettingError: keyed ``engine``, an unknown engine; keyed ``device`` or
            ``compute_type``, what CTranslate2 refuses.
        CheckpointError, FileNotFoundError: no model of the engine in ``folder``.
        MissingDependency: the engine's package is not installed.
    """
    if engine not in ENGINES:
        raise SettingError("engine", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    tr: Any
    if engine == "onnx":
        from ..export.onnx import OnnxTranslator

        tr = OnnxTranslator(folder, threads=threads or None)
    elif engine == "ctranslate2":
        import torch

        from ..export.ctranslate2 import Ct2Translator

        tr = Ct2Translator(
            folder,
            device=device,
            compute_type=quantize or "default",
            threads=threads or torch.get_num_threads(),
        )
    else:
        from ..translate import Translator

        tr = Translator.load(folder, device=device, quantize=quantize)
    return tr
