"""A saved model folder: its format, where it is in a run folder, and reading it back.

A folder written by ``qkv train`` (a checkpoint ``OUT/checkpoints/step-XXXXXXXX``, or the run's
``OUT/final``, or an average written by ``qkv average``) holds::

    manifest.json       format, version, step, and the size and SHA-256 of every other file
    model.safetensors   the weights (safetensors: no pickle, loads without running code)
    model.json          the qkv.nn.Seq2SeqConfig that rebuilds the model (and tied-weight aliases),
                        and the languages it translates ({"source": "en", "target": "zh"}) when
                        known (a model saved before qkv recorded them has none: it still loads)
    train.json          the qkv.train.TrainConfig of the run
    tokenizers/         the source and target tokenizers, their normaliser included
    split.json          which pairs are train / valid / test (with the data's fingerprint)
    trainer.json        step, data position, best BLEU, ...; the final model's weight source
    trainer.pt          a checkpoint's optimizer, schedule and RNG state (tensors only)
    decoding.json       the final model's decoding chosen on validation (beam, length penalty)

This module reads that format (``qkv.train.checkpoint`` writes it; the files' names are
:mod:`qkv._folder`'s): verifying the manifest, finding the folder to use in a run folder (whose
names are :mod:`qkv.inference.layout`'s),
loading the weights, and :func:`load_model`, which returns a :class:`SavedModel` (model,
tokenizers, decoding) ready to decode. Anything wrong with a folder is a
:class:`CheckpointError` that says what, never a traceback from deep inside torch.

Every file read is verified first, and only what is read: it must be listed in the manifest
(a file the manifest leaves out is refused, never read unchecked) and have the listed size and
SHA-256. Translating reads the model, its tokenizers and ``decoding.json``, so a damaged
``trainer.pt`` stops a resume but not a translation. ``best.json`` is followed only to a
``step-*`` folder beside it. A checkpoint that a running trainer prunes while it is read (it
keeps its newest few and its best) is a :class:`CheckpointError` saying it is in use, naming the
trainer from the run's lock file, never a ``FileNotFoundError``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._deps import require
from .._folder import (
    CT2_DIR,
    CT2_WEIGHTS,
    DECODING,
    MANIFEST,
    MODEL_CONFIG,
    RESUME_FILES,
    SPLIT,
    TOKENIZERS,
    TRAIN_CONFIG,
    TRAINER_STATE,
    TRAINER_TENSORS,
    UNFINISHED_MARKS,
    WEIGHTS,
)
from ..data import Tokenizer, load_tokenizers
from ..data.languages import check_language
from ..nn.seq2seq import EncoderDecoder, build_model
from .bounds import check_decoding, check_model_config
from .device import pick_device
from .layout import BEST_POINTER, CHECKPOINTS_DIR, RunLayout, step_of
from .options import Decoding

log = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "CT2_FOLDER_FORMAT",
    "HF_FOLDER_FORMAT",
    "MANIFEST",
    "ONNX_FOLDER_FORMAT",
    "RESUME_FILES",
    "CheckpointError",
    "LoadedCheckpoint",
    "SavedModel",
    "best_checkpoint",
    "find_checkpoints",
    "languages_record",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "load_model_weights",
    "model_languages",
    "read_json",
    "read_weights",
    "resolve_model_dir",
    "sha256_file",
    "verify_checkpoint",
]

CHECKPOINT_FORMAT = "qkv.checkpoint"
CHECKPOINT_VERSION = 1
#: the manifest format of a folder of ONNX graphs (``qkv export --format onnx``), which qkv's
#: own engine does not read
ONNX_FOLDER_FORMAT = "qkv.onnx"
#: the manifest format of a CTranslate2 model folder (``OUT/ctranslate2`` of ``qkv export
#: --format ctranslate2``, which the manifest of ``OUT`` lists too)
CT2_FOLDER_FORMAT = "qkv.ctranslate2"
#: the manifest format of a Hugging Face folder (``qkv export --format huggingface``), which
#: ``transformers`` reads and qkv's own engine does not
HF_FOLDER_FORMAT = "qkv.huggingface"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used: missing, corrupt, foreign or mismatched."""


def _trainer_of(folder: Path) -> str | None:
    """The trainer a run's lock file names for a folder of that run (``OUT/final``,
    ``OUT/checkpoints/step-*``): ``"pid N on HOST (lock OUT/.lock)"``, or None without one."""
    for run in (folder.parent, folder.parent.parent):
        lock = RunLayout(run).lock
        try:
            holder = json.loads(lock.read_text(encoding="utf-8"))
            pid, host = int(holder["pid"]), str(holder["host"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host == socket.gethostname() and os.name == "posix":
            try:
                os.kill(pid, 0)
            except ProcessLookupError:  # a lock left by a killed trainer: nobody runs
                return None
            except PermissionError:  # another user's process: running
                pass
        return f"pid {pid} on {host} (lock {lock})"
    return None


def _in_use(folder: Path) -> CheckpointError | None:
    """The error for a checkpoint removed while it was read (its folder or its manifest is
    gone): a running trainer prunes its old checkpoints. None while it is still there."""
    if (folder / MANIFEST).is_file():
        return None
    who = _trainer_of(folder)
    by = f"the trainer running in that run folder ({who})" if who else "another process"
    return CheckpointError(
        f"checkpoint: {str(folder)!r} is in use: {by} removed it while it was being read "
        "(a run keeps only its newest and best checkpoints); read the run folder itself (its "
        "final model, or its best checkpoint, which is never pruned), or a newer checkpoint, "
        "or wait for the run to end"
    )


# ---------------------------------------------------------------------------- the format
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------- finding
def find_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoint folders under ``root`` (``OUT/checkpoints``), oldest step first (a
    link is not one: a run's checkpoints are its own folders)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        step = step_of(p)
        if step is not None and p.is_dir() and not p.is_symlink() and (p / MANIFEST).is_file():
            found.append((step, p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    found = find_checkpoints(root)
    return found[-1] if found else None


def best_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint ``best.json`` names (best validation BLEU), if it still exists.

    Raises:
        CheckpointError: ``best.json`` names something else than a checkpoint folder of
            ``root`` (an absolute path, ``..``, a link leading out): it is not followed.
    """
    root = Path(root)
    pointer = root / BEST_POINTER
    if not pointer.is_file():
        return None
    try:
        name = json.loads(pointer.read_text(encoding="utf-8"))["path"]
    except (ValueError, KeyError, TypeError, OSError):
        return None
    p = root / str(name)
    inside = isinstance(name, str) and step_of(name) is not None
    if not inside or not p.resolve().is_relative_to(root.resolve()):
        raise CheckpointError(
            f"checkpoint: {pointer} names {name!r}, which is not a checkpoint folder of "
            f"{str(root)!r} (step-NNNNNNNN beside it); qkv follows no pointer out of a run "
            "folder: delete or fix best.json"
        )
    return p if (p / MANIFEST).is_file() else None


def resolve_model_dir(path: str | Path) -> Path:
    """The checkpoint folder to use for ``path``: a checkpoint folder itself, or a run's ``OUT``
    (its ``final`` model, else its best checkpoint by validation BLEU, else its newest).

    Raises:
        CheckpointError: nothing usable there.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"model dir: {str(p)!r} does not exist")
    if p.is_file():
        raise CheckpointError(
            f"model dir: {str(p)!r} is a file; expected a qkv run folder (the --out of qkv "
            "train) or one of its checkpoint folders"
        )
    if (p / MANIFEST).is_file():
        return p
    run = RunLayout(p)
    if (run.final / MANIFEST).is_file() and _is_current(run.final, run.checkpoints):
        return run.final  # a run's final model (averaged, decoding chosen)
    if any((p / name).exists() for name in UNFINISHED_MARKS):
        raise CheckpointError(
            f"model dir: {str(p)!r} is not a qkv checkpoint, or one never completed (it has no "
            f"{MANIFEST}, which qkv writes last)"
        )
    for root in (run.checkpoints, p):
        if root.is_dir():
            found = best_checkpoint(root) or latest_checkpoint(root)
            if found is not None:
                return found
    raise CheckpointError(
        f"model dir: {str(p)!r} holds no qkv checkpoint (expected {MANIFEST} in it, or "
        f"{CHECKPOINTS_DIR}/step-*/ under it, as written by qkv train)"
    )


def _is_current(final: Path, ckroot: Path) -> bool:
    """Is a run's ``final`` model at least as new as its newest checkpoint? (A resumed run
    that was stopped before it finished leaves the previous invocation's ``final``.)"""
    newest = latest_checkpoint(ckroot)
    if newest is None:
        return True
    try:
        final_step = json.loads((final / MANIFEST).read_text(encoding="utf-8")).get("step")
        newest_step = json.loads((newest / MANIFEST).read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError):
        return False
    return (
        isinstance(final_step, int) and isinstance(newest_step, int) and final_step >= newest_step
    )


# ---------------------------------------------------------------------------- reading
class VerifiedFolder:
    """One folder's manifest, checked, and the files of it verified so far (each hashed once).

    A file is read only after :meth:`file` (or :meth:`tree`) verified it: listed in the
    manifest, of the listed size and SHA-256. A file that is not listed is refused, never read
    unchecked; so is a listed file that is missing, and one reached through a link. ``formats``:
    the manifest formats accepted (a qkv model folder's; :data:`ONNX_FOLDER_FORMAT` for ONNX
    graphs).
    """

    def __init__(self, folder: str | Path, formats: tuple[str, ...] = (CHECKPOINT_FORMAT,)) -> None:
        self.dir = d = Path(folder)
        mpath = d / MANIFEST
        if not mpath.is_file() and step_of(d) is not None and _trainer_of(d) is not None:
            raise _in_use(d) or CheckpointError(f"checkpoint: {str(d)!r} is not a folder")
        if not d.is_dir():
            raise CheckpointError(f"checkpoint: {str(d)!r} is not a folder")
        if not mpath.is_file():
            raise CheckpointError(
                f"checkpoint: {str(d)!r} is not a qkv checkpoint (no {MANIFEST}); qkv writes "
                "checkpoints with qkv train"
            )
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"checkpoint: {mpath} is corrupt (not JSON: {e})") from None
        except OSError as e:
            raise _in_use(d) or CheckpointError(
                f"checkpoint: {mpath} is unreadable ({e.strerror})"
            ) from None
        if not isinstance(manifest, dict) or manifest.get("format") not in formats:
            raise CheckpointError(
                f"checkpoint: {str(d)!r} is not a qkv checkpoint ({MANIFEST} has format "
                f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, expected "
                f"{' or '.join(map(repr, formats))})"
            )
        if manifest.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(
                f"checkpoint: {str(d)!r} has format version {manifest.get('version')!r}; this "
                f"qkv reads version {CHECKPOINT_VERSION}"
            )
        files = manifest.get("files")
        if not isinstance(files, dict):
            raise CheckpointError(f"checkpoint: {mpath} is corrupt (no file list)")
        for rel, meta in files.items():
            if (
                not isinstance(meta, dict)
                or not rel
                or Path(rel).is_absolute()
                or ".." in Path(rel).parts
                or rel == MANIFEST
            ):
                raise CheckpointError(f"checkpoint: {mpath} is corrupt (bad file entry {rel!r})")
        self.manifest: dict = manifest
        self.files: dict[str, dict] = files
        self._checked: set[str] = set()

    def _check(self, rel: str) -> Path:
        d, meta = self.dir, self.files[rel]
        p = d / rel
        if rel in self._checked:
            return p
        if not p.is_file():
            raise self.gone() or CheckpointError(
                f"checkpoint: {str(d)!r} is incomplete: {rel} is missing"
            )
        if any(q.is_symlink() for q in (p, *p.parents) if q != d and q.is_relative_to(d)) or (
            not p.resolve().is_relative_to(d.resolve())
        ):
            raise CheckpointError(
                f"checkpoint: {rel} in {str(d)!r} is a link; a checkpoint's files are its own "
                "(qkv follows no link out of a model folder)"
            )
        try:  # a file can vanish or fail between the check above and its reading
            size = p.stat().st_size
            digest = sha256_file(p) if size == meta.get("bytes") else None
        except OSError as e:
            raise self.gone() or CheckpointError(
                f"checkpoint: {rel} in {str(d)!r} is unreadable ({e.strerror})"
            ) from None
        if size != meta.get("bytes"):
            raise CheckpointError(
                f"checkpoint: {rel} in {str(d)!r} is corrupt: {size} bytes, the manifest says "
                f"{meta.get('bytes')}"
            )
        if digest != meta.get("sha256"):
            raise CheckpointError(
                f"checkpoint: {rel} in {str(d)!r} is corrupt: its SHA-256 differs from the "
                "manifest's"
            )
        self._checked.add(rel)
        return p

    def gone(self) -> CheckpointError | None:
        """The "in use" error when the folder was removed since it was opened, else None."""
        return _in_use(self.dir)

    def _unlisted(self, rel: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint: {rel} in {str(self.dir)!r} is not listed in its {MANIFEST}, so it "
            "cannot be verified; qkv reads no file unchecked (a damaged or altered checkpoint)"
        )

    def file(self, rel: str) -> Path:
        """The path of file ``rel``, verified (CheckpointError when unlisted or damaged)."""
        if rel not in self.files:
            raise self._unlisted(rel)
        return self._check(rel)

    def tree(self, rel: str) -> Path:
        """The path of folder ``rel``, every file under it listed and verified."""
        base = self.dir / rel
        if base.is_dir():
            try:
                found = sorted(base.rglob("*"))
            except OSError as e:  # removed while listed
                raise self.gone() or CheckpointError(
                    f"checkpoint: {rel} in {str(self.dir)!r} is unreadable ({e.strerror})"
                ) from None
            for p in found:
                name = p.relative_to(self.dir).as_posix()
                if not p.is_dir() and name not in self.files:
                    raise self._unlisted(name)
        for name in self.files:
            if name.startswith(rel.rstrip("/") + "/"):
                self._check(name)
        return base

    def all(self) -> None:
        """Verify every listed file."""
        for rel in self.files:
            self._check(rel)

    def whole(self) -> None:
        """Verify every listed file, and refuse any file in the folder the manifest does not
        list (a folder another engine reads by itself, where an added file could be read)."""
        self.all()
        try:
            found = sorted(self.dir.rglob("*"))
        except OSError as e:
            raise self.gone() or CheckpointError(
                f"checkpoint: {str(self.dir)!r} is unreadable ({e.strerror})"
            ) from None
        for p in found:
            name = p.relative_to(self.dir).as_posix()
            if name != MANIFEST and not p.is_dir() and name not in self.files:
                raise self._unlisted(name)

    def invalid(self, rel: str, err: BaseException) -> CheckpointError:
        """The error for file ``rel``, verified, whose content is invalid or out of bounds
        (``err``; a :class:`~qkv._errors.SettingError` names the field): one line naming the
        file, never a traceback from where it was used."""
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return CheckpointError(f"checkpoint: {rel} in {str(self.dir)!r} is invalid: {text}")

    def size(self, rel: str) -> int | None:
        """The size the manifest lists for file ``rel`` (what it has once verified), or None."""
        size = self.files.get(rel, {}).get("bytes")
        return size if isinstance(size, int) and not isinstance(size, bool) else None

    def json(self, rel: str) -> Any:
        """File ``rel``, verified, read as JSON."""
        p = self.file(rel)
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(
                f"checkpoint: {rel} in {str(self.dir)!r} is corrupt: {e}"
            ) from None
        except OSError as e:  # removed since it was verified
            raise self.gone() or CheckpointError(
                f"checkpoint: {rel} in {str(self.dir)!r} is unreadable ({e.strerror})"
            ) from None


def verify_checkpoint(folder: str | Path, files: Sequence[str] | None = None) -> dict:
    """Check a checkpoint folder against its manifest; return the manifest.

    Args:
        folder: a checkpoint or model folder.
        files: the files (or folders, like ``"tokenizers"``) to verify, each of which must be
            listed (every file under a folder); None: every file the manifest lists.

    Raises:
        CheckpointError: no manifest, a foreign format or version, a missing file, a file to
            verify that the manifest does not list, or a file whose size or SHA-256 differs
            from the manifest (corruption, truncation).
    """
    v = VerifiedFolder(folder)
    if files is None:
        v.all()
    for rel in files or ():
        if (v.dir / rel).is_dir():
            v.tree(rel)
        else:
            v.file(rel)
    return v.manifest


def read_json(d: Path, name: str) -> Any:
    """File ``name`` of checkpoint folder ``d`` as JSON, verified against the manifest first.

    Raises:
        CheckpointError: see :func:`verify_checkpoint`; also a file that is not JSON.
    """
    return VerifiedFolder(d).json(name)


def load_model_weights(folder: str | Path, model: nn.Module) -> None:
    """Load ``model.safetensors`` of ``folder`` into ``model`` (strictly).

    Raises:
        CheckpointError: an unreadable file, or weights that do not fit the model (missing or
            unexpected names, other shapes), listed in the message.
    """
    d = Path(folder)
    _fit_weights(d, read_weights(d), model)


def _fit_weights(d: Path, tensors: dict[str, torch.Tensor], model: nn.Module) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    shapes = [
        f"{k}: saved {tuple(tensors[k].shape)}, model {tuple(own[k].shape)}"
        for k in own
        if k in tensors and tensors[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if shapes:
            parts.append(f"other shapes {shapes[:3]}{' ...' if len(shapes) > 3 else ''}")
        raise CheckpointError(
            f"checkpoint: the weights in {str(d)!r} do not fit the model its model.json "
            f"describes ({'; '.join(parts)})"
        )
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(tensors[k])


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` read from a checkpoint folder (weights are loaded into a
    model separately, by :func:`load_model_weights`)."""

    path: Path
    manifest: dict
    model_config: dict
    train_config: dict
    split: dict
    trainer_state: dict
    tensors: dict | None


def load_checkpoint(folder: str | Path, *, with_tensors: bool = True) -> LoadedCheckpoint:
    """Verify and read a checkpoint folder (see the module docstring for its files).

    Args:
        folder: a checkpoint folder (``OUT/checkpoints/step-...``).
        with_tensors: also read ``trainer.pt`` (optimizer, schedule and RNG state): to resume
            the run, for which the whole folder is verified (every file listed, and each file
            resuming reads, :data:`RESUME_FILES`, listed); without it, only the JSON files
            read here are verified.

    Raises:
        CheckpointError: see :func:`verify_checkpoint`; also unreadable JSON or state.
    """
    v = VerifiedFolder(folder)
    d = v.dir
    if with_tensors:
        v.all()
        for rel in RESUME_FILES:
            v.tree(rel) if rel == TOKENIZERS else v.file(rel)
    model_meta = v.json(MODEL_CONFIG)
    if not isinstance(model_meta, dict) or not isinstance(model_meta.get("config"), dict):
        raise CheckpointError(f"checkpoint: model.json in {str(d)!r} has no model config")
    try:  # a run resumed builds this model: its sizes in bounds first
        check_model_config(model_meta["config"], v.size(WEIGHTS))
    except (ValueError, TypeError) as e:
        raise v.invalid(MODEL_CONFIG, e) from None
    tensors = _read_state(v) if with_tensors else None
    return LoadedCheckpoint(
        path=d,
        manifest=v.manifest,
        model_config=model_meta["config"],
        train_config=v.json(TRAIN_CONFIG),
        split=v.json(SPLIT),
        trainer_state=v.json(TRAINER_STATE),
        tensors=tensors,
    )


def _read_state(v: VerifiedFolder) -> dict:
    """``trainer.pt``, verified, read with ``torch.load(weights_only=True)``; never otherwise."""
    path = v.file(TRAINER_TENSORS)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise v.gone() or CheckpointError(
            f"checkpoint: trainer.pt in {str(v.dir)!r} is unreadable ({e.strerror})"
        ) from None
    except Exception as e:  # torch raises several kinds on a bad file
        # torch's message may advise loading with weights_only=False, which runs any code a
        # pickle holds: never repeat it. What the file holds is named, not how to unpickle it.
        first = str(e).splitlines()[0] if str(e) else ""
        detail = "" if "weights_only" in str(e) or "trust" in first else f": {first}"
        raise CheckpointError(
            f"checkpoint: trainer.pt in {str(v.dir)!r} is not training state qkv can read "
            f"(it holds something besides tensors, numbers and containers, or is damaged; "
            f"{type(e).__name__}{detail}); qkv reads it only as plain tensors: resume from "
            "another checkpoint"
        ) from None


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of ``folder/model.safetensors`` by state-dict name (shared ones under every
    name they have), ``model.safetensors`` and ``model.json`` verified against the manifest.

    Raises:
        CheckpointError: an unlisted, damaged or unreadable file.
    """
    return _read_weights(VerifiedFolder(folder))


def _read_weights(v: VerifiedFolder) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = v.dir
    path = v.file(WEIGHTS)
    meta = v.json(MODEL_CONFIG)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, RuntimeError) as e:
        raise v.gone() or CheckpointError(
            f"checkpoint: model.safetensors in {str(d)!r} is unreadable: {e}"
        ) from None
    aliases = meta.get("aliases") if isinstance(meta, dict) else None
    if aliases is not None and (
        not isinstance(aliases, dict)
        or not all(isinstance(k, str) and isinstance(t, str) for k, t in aliases.items())
    ):
        raise CheckpointError(
            f"checkpoint: model.json in {str(d)!r} is invalid: aliases must map weight names "
            f"to weight names, got {type(aliases).__name__}"
        )
    for alias, target in (aliases or {}).items():
        if target in tensors:
            tensors[alias] = tensors[target]
    return tensors


# ---------------------------------------------------------------------------- languages
def languages_record(languages: Sequence[str]) -> dict[str, str]:
    """``model.json``'s ``languages`` entry: ``{"source": ..., "target": ...}``, each code
    checked (:func:`qkv.data.check_language`; a SettingError naming ``languages``)."""
    if isinstance(languages, str) or len(languages) != 2:
        raise ValueError(f"languages: expected (source, target) codes, got {languages!r}")
    src, tgt = (check_language(c, "languages") for c in languages)
    return {"source": src, "target": tgt}


def model_languages(meta: Any, folder: str | Path = "") -> tuple[str, str] | None:
    """``(source, target)`` from a ``model.json`` (read as JSON), or None when it records
    none (a model saved before qkv recorded them).

    Raises:
        CheckpointError: a ``languages`` entry that is not two language codes.
    """
    langs = meta.get("languages") if isinstance(meta, dict) else None
    if langs is None:
        return None
    try:
        src, tgt = langs["source"], langs["target"]
        return check_language(src, "source"), check_language(tgt, "target")
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint: model.json in {str(folder)!r} has invalid languages ({e}); expected "
            '{"source": CODE, "target": CODE}'
        ) from None


# ---------------------------------------------------------------------------- a model to use
@dataclass
class SavedModel:
    """A saved model read back: what translating, evaluating or serving needs.

    Attributes:
        model: the :class:`~qkv.nn.seq2seq.EncoderDecoder`, on ``device``, in eval mode.
        src_tokenizer, tgt_tokenizer: the tokenizers it was trained with (with their normaliser).
        path: the folder it was read from.
        decoding: the folder's ``decoding.json`` as a :class:`~qkv.inference.Decoding`
            (checked), or None when it has none.
        device: where the model is.
        languages: ``(source, target)`` codes as ``model.json`` records them, or None.
        verdict: what the run that wrote this final model found at its end
            (:class:`qkv.train.verdict.Verdict` as a dict, with the ``fix`` it gave): its
            ``usable`` is False for a model that learned nothing or too little to use; None
            for a folder without one (a checkpoint, an import, a model saved before runs
            recorded it).
    """

    model: EncoderDecoder
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    path: Path
    decoding: Decoding | None
    device: torch.device
    languages: tuple[str, str] | None = None
    verdict: dict | None = None


def _build(v: VerifiedFolder, config: dict) -> EncoderDecoder:
    """The model ``model.json`` describes, its sizes checked against sane bounds, its weight
    file and the memory available first (:func:`qkv.inference.bounds.check_model_config`:
    nothing is allocated for a config that cannot fit); a CheckpointError for any config it
    cannot build (a tampered file whose manifest was rewritten to match: negative or huge
    sizes, wrong types, ...)."""
    if WEIGHTS not in v.files and f"{CT2_DIR}/{CT2_WEIGHTS}" in v.files:
        raise CheckpointError(
            f"model dir: {str(v.dir)!r} holds a quantized CTranslate2 model without qkv's "
            f"float32 weights ({WEIGHTS}): translate it with --engine ctranslate2 (qkv.export."
            "ctranslate2.Ct2Translator), or export it again with --keep-float-weights for "
            "qkv's engine"
        )
    try:
        checked = check_model_config(config, v.size(WEIGHTS))
        return build_model(checked)
    except Exception as e:  # whatever torch raises on an impossible size, named once
        raise v.invalid(MODEL_CONFIG, e) from None


def load_model(model_dir: str | Path, *, device: torch.device | str = "cpu") -> SavedModel:
    """Read a saved model: a ``qkv train --out`` folder (its final model, else its best
    checkpoint by validation BLEU, else its newest; see :func:`resolve_model_dir`) or one
    checkpoint or model folder.

    ``device`` is picked by :func:`~qkv.inference.pick_device` (``"auto"``, ``"cpu"``,
    ``"cuda"``, ``"cuda:N"``).

    Raises:
        CheckpointError: no checkpoint there, or a corrupt or foreign one.
        ValueError: a bad device name, or CUDA asked for where it is not available.
        MissingDependency: safetensors is not installed (the ``train`` extra).
    """
    require("loading a model", ["safetensors"])
    device = pick_device(device)
    folder = resolve_model_dir(model_dir)
    # only what translating reads is verified: a damaged trainer.pt or split.json of a
    # checkpoint does not stop its weights from translating
    v = VerifiedFolder(folder)
    meta = v.json(MODEL_CONFIG)
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise CheckpointError(f"checkpoint: model.json in {str(folder)!r} has no model config")
    languages = model_languages(meta, folder)
    model = _build(v, meta["config"])
    _fit_weights(folder, _read_weights(v), model)
    try:
        src, tgt = load_tokenizers(v.tree(TOKENIZERS))
    except (OSError, ValueError, KeyError) as e:
        raise v.gone() or CheckpointError(
            f"checkpoint: the tokenizers in {str(folder)!r} cannot be loaded: {e}"
        ) from None
    cfg = model.config
    if (src.vocab_size, tgt.vocab_size) != (cfg.src_vocab_size, cfg.tgt_vocab_size):
        raise CheckpointError(
            f"checkpoint: the tokenizers in {str(folder)!r} have vocabularies of "
            f"{src.vocab_size} and {tgt.vocab_size} ids, the model expects "
            f"{cfg.src_vocab_size} and {cfg.tgt_vocab_size}"
        )
    decoding = None
    if DECODING in v.files or (folder / DECODING).exists():
        try:
            decoding = check_decoding(Decoding.from_dict(v.json(DECODING)), cfg.tgt_vocab_size)
        except (ValueError, TypeError) as e:
            raise v.invalid(DECODING, e) from None
    verdict = _recorded_verdict(v)
    return SavedModel(
        model.to(device).eval(), src, tgt, folder, decoding, device, languages, verdict
    )


def _recorded_verdict(v: VerifiedFolder) -> dict | None:
    """The run's verdict a final model's ``trainer.json`` records (verified as every file
    read), None when it records none (a checkpoint's is not read: checkpoints carry none). A
    model its run judged not usable is warned about once per process and verdict (a server
    reloading it after an unload says it once): a user who missed the run's last line, or
    serves the folder later, still hears it."""
    if TRAINER_STATE not in v.files or step_of(v.dir) is not None:
        return None
    try:
        state = v.json(TRAINER_STATE)
    except CheckpointError as e:  # the weights translate without it, as without split.json
        log.warning(f"{e} (the verdict of the run that trained it is not known)")
        return None
    verdict = state.get("verdict") if isinstance(state, dict) else None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("usable"), bool):
        return None
    said = (str(v.dir), json.dumps(verdict, sort_keys=True, default=str))
    if not verdict["usable"] and said not in _WARNED:
        _WARNED.add(said)
        reason = verdict.get("reason") or "it learned too little to use"
        fix = verdict.get("fix") or ""
        log.warning(
            f"{v.dir}: the run that trained this model judged it not usable: {reason}. "
            f"Its translations are not to be trusted. {fix}".rstrip()
        )
    return verdict


#: (folder, verdict) pairs already warned about in this process
_WARNED: set[tuple[str, str]] = set()
