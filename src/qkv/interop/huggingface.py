"""A Hugging Face model folder read as it is: found (a folder, or a Hub name through
``huggingface_hub``'s cache), its configs, its weights one tensor at a time with every size
checked first, its tokenizer files and its card.

Nothing here imports ``transformers``: a folder is JSON, SentencePiece models and a weight
file. Weights are read only from safetensors (the header read first: a tensor's shape is
checked before its bytes are) or from a PyTorch file through ``torch.load(...,
weights_only=True)`` (no code runs while reading it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._deps import require
from .._errors import SettingError, keyed
from .._folder import WEIGHTS

__all__ = ["HubUnreachable", "SourceFolder", "Weights", "read_source", "resolve_source"]

#: the files a Hub snapshot needs: configs, tokenizers, the card, and (second) the weights
META_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "target_vocab.json",
    "*.spm",
    "sentencepiece.bpe.model",
    "README.md",
    "LICENSE*",
]
#: transformers names its weight file as qkv does (``qkv._folder.WEIGHTS``)
SAFETENSORS = [WEIGHTS, f"{WEIGHTS}.index.json", "model-*.safetensors"]
PYTORCH = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


class HubUnreachable(OSError):
    """A Hub name that is not in the local cache, and the Hub cannot be reached."""


def _hub_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _snapshot(name: str, patterns: list[str], offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=offline))


def resolve_source(source: str | Path) -> tuple[Path, str]:
    """The local folder of ``source`` and the name it came by: a folder as it is, or a Hub
    name (``Helsinki-NLP/opus-mt-en-de``) from ``huggingface_hub``'s cache, else fetched once
    (configs, tokenizers and card, then the weights: safetensors when the repository has
    them, else its PyTorch file). With ``HF_HUB_OFFLINE=1`` only the cache is read.

    Raises:
        SettingError: keyed ``source``: a file rather than a folder, or a name that is
            neither a folder nor a Hub name.
        HubUnreachable: the name is not cached and the Hub cannot be reached (one line naming
            the cache and the folder form).
        FileNotFoundError: the Hub has no such repository (keyed ``source``).
    """
    p = Path(source).expanduser()
    if p.is_dir():
        return p, str(source)
    if p.exists():
        raise SettingError("source", f"{str(source)!r} is a file; expected a model folder")
    name = str(source)
    if not _HUB_NAME.match(name):
        raise SettingError(
            "source",
            f"{name!r} is no folder and no Hugging Face Hub name (owner/name); expected a "
            "folder holding config.json, or a name such as Helsinki-NLP/opus-mt-en-de",
        )
    require("qkv import of a Hub name", ["huggingface_hub"])
    from huggingface_hub import errors

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    for local in (True, False) if not offline else (True,):
        try:
            folder = _snapshot(name, META_FILES + SAFETENSORS, local)
            if not any(folder.glob("*.safetensors")):
                folder = _snapshot(name, PYTORCH, local)
            return folder, name
        except errors.RepositoryNotFoundError:
            raise keyed(
                FileNotFoundError,
                "source",
                f"no model {name!r} on the Hugging Face Hub (or it is private), and no such folder",
            ) from None
        except (errors.LocalEntryNotFoundError, OSError) as e:
            if not local and not isinstance(e, errors.LocalEntryNotFoundError):
                raise
    why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached (no network)"
    raise keyed(
        HubUnreachable,
        "source",
        f"{name} is not in the Hugging Face cache ({_hub_cache()}) and {why}: download the "
        f"model folder where there is a network (hf download {name} --local-dir DIR, or git "
        "clone), copy it here and run qkv import DIR",
    )


# ---------------------------------------------------------------------------- weights
@dataclass
class Weights:
    """A checkpoint's tensors, read one at a time by name (``weights(name)``, None for a
    name it lacks) as float32, each tensor's size checked before it is read: no tensor of
    more than ``max_numel`` numbers is read (what the model's config allows).

    safetensors files are read through their header (shapes first); a PyTorch file through
    ``torch.load(..., weights_only=True, mmap=True)``."""

    files: list[Path]
    max_numel: int | None = None
    _where: dict[str, Path] = field(default_factory=dict, repr=False)
    _shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    _torch: dict[str, Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.files[0].suffix == ".safetensors":
            from safetensors import safe_open

            for path in self.files:
                with safe_open(str(path), "pt") as f:
                    for name in f.keys():  # noqa: SIM118 - a safetensors file, not a dict
                        self._where[name] = path
                        self._shapes[name] = tuple(f.get_slice(name).get_shape())
            return
        state: dict[str, Tensor] = {}
        for path in self.files:
            try:
                part = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # an old (not zip) file cannot be mapped: read whole
                part = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(part, dict):
                raise SettingError("source", f"{str(path)!r} holds no state dict of tensors")
            state.update({k: v for k, v in part.items() if isinstance(v, Tensor)})
        self._torch = state
        self._shapes = {k: tuple(v.shape) for k, v in state.items()}

    @property
    def nbytes(self) -> int:
        """The weight files' size on disk."""
        return sum(p.stat().st_size for p in self.files)

    def names(self) -> Iterator[str]:
        return iter(self._shapes)

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self._shapes.get(name)

    def __call__(self, name: str) -> Tensor | None:
        shape = self._shapes.get(name)
        if shape is None:
            return None
        numel = 1
        for n in shape:
            numel *= n
        if self.max_numel is not None and numel > self.max_numel:
            raise SettingError(
                name,
                f"a tensor of shape {shape} is larger than any tensor of the model its "
                f"config describes ({self.max_numel:,} numbers at most): refused before reading",
            )
        if self._torch is not None:
            t = self._torch[name]
        else:
            from safetensors import safe_open

            with safe_open(str(self._where[name]), "pt") as f:
                t = f.get_tensor(name)
        return t.to(torch.float32) if t.is_floating_point() else t


def _weight_files(folder: Path) -> list[Path]:
    for single, index in (
        (WEIGHTS, f"{WEIGHTS}.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            shards = _read_json(folder / index).get("weight_map")
            if not isinstance(shards, dict):
                raise SettingError("source", f"{str(folder / index)!r} has no weight_map")
            names = sorted(set(shards.values()))
            for n in names:
                if "/" in n or "\\" in n or n in (".", ".."):
                    raise SettingError("source", f"{index} names a file out of the folder: {n!r}")
            return [folder / n for n in names]
    found = sorted(p.name for p in folder.iterdir() if p.is_file())
    raise SettingError(
        "source",
        f"{str(folder)!r} has no model.safetensors or pytorch_model.bin (qkv reads weights "
        f"from these only); it holds {', '.join(found) or 'nothing'}",
    )


# ---------------------------------------------------------------------------- the folder
def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise SettingError("source", f"{str(path)!r} is not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise SettingError("source", f"{str(path)!r} holds {type(data).__name__}, not an object")
    return data


def _optional_json(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


def card_license(readme: str) -> str | None:
    """The ``license:`` of a model card's front matter (YAML between ``---`` lines), or None."""
    m = re.match(r"\A---\s*\n(.*?)\n---\s*(\n|\Z)", readme, re.S)
    if m is None:
        return None
    for line in m.group(1).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "license" and value.strip():
            return value.strip().strip("'\"")
    return None


@dataclass
class SourceFolder:
    """A Hugging Face model folder, read.

    Attributes:
        path: the folder.
        name: what the user named (a Hub name, or the folder as given).
        config: ``config.json``.
        generation: ``generation_config.json`` (empty when the folder has none: then the
            generation keys of ``config.json`` apply, as for older folders).
        tokenizer: ``tokenizer_config.json`` (empty when absent).
        license: the card's ``license:`` (None when it says none).
        weight_files: the weight files, read by :meth:`weights`.
    """

    path: Path
    name: str
    config: dict[str, Any]
    generation: dict[str, Any]
    tokenizer: dict[str, Any]
    license: str | None
    weight_files: list[Path]

    def file(self, name: str) -> Path:
        """The file ``name`` of the folder (a plain name, checked)."""
        path = self.path / name
        if not path.is_file():
            raise SettingError("source", f"{str(self.path)!r} has no {name}")
        return path

    def json(self, name: str) -> dict[str, Any]:
        return _read_json(self.file(name))

    def weights(self, max_numel: int | None = None) -> Weights:
        """The checkpoint's tensors, none larger than ``max_numel`` numbers read."""
        return Weights(self.weight_files, max_numel)

    def generation_settings(self) -> dict[str, Any]:
        """The generation settings: ``generation_config.json``, else those of ``config.json``."""
        return dict(self.generation) if self.generation else dict(self.config)


def read_source(
    source: str | Path, resolve: Callable[[str | Path], tuple[Path, str]] = resolve_source
) -> SourceFolder:
    """The Hugging Face model folder ``source`` (a folder or a Hub name,
    :func:`resolve_source`), its JSON files read and its weight files found (not read).

    Raises:
        SettingError: keyed ``source``: no ``config.json``, unreadable JSON, no weights qkv
            reads (``model.safetensors``, ``pytorch_model.bin`` or their shards).
    """
    folder, name = resolve(source)
    config = _read_json(folder / "config.json") if (folder / "config.json").is_file() else None
    if config is None:
        raise SettingError(
            "source", f"{str(folder)!r} has no config.json: not a Hugging Face model folder"
        )
    readme = folder / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else ""
    return SourceFolder(
        path=folder,
        name=name,
        config=config,
        generation=_optional_json(folder / "generation_config.json"),
        tokenizer=_optional_json(folder / "tokenizer_config.json"),
        license=card_license(text),
        weight_files=_weight_files(folder),
    )
