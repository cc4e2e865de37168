"""Checkpoints that lose nothing, written so that a crash never leaves a half-written one.

A run's folder ``OUT`` holds (every name is :mod:`qkv.inference.layout`'s)::

    OUT/checkpoints/step-00001200/   one complete checkpoint (see below)
    OUT/checkpoints/best.json        which checkpoint has the best validation BLEU

and one checkpoint folder holds::

    manifest.json       format, version, step, and the size and SHA-256 of every other file
    model.safetensors   the weights (safetensors: no pickle, loads without running code)
    model.json          the qkv.nn.Seq2SeqConfig that rebuilds the model
    train.json          the qkv.train.TrainConfig of the run
    tokenizers/         the source and target tokenizers, their normaliser included
    split.json          which pairs are train / valid / test (with the data's fingerprint)
    trainer.json        step, data position, best BLEU, early-stopping count, history
    trainer.pt          optimizer and schedule state, every rank's RNG states (tensors only;
                        read back with torch.load(weights_only=True))

Writing is atomic (:mod:`qkv._atomic`): everything goes into ``.qkv-tmp-step-...-PID`` beside
the final folder, every file is flushed and fsynced, then the folder is renamed into place, and
``best.json`` is replaced the same way (temporary file in the same folder, fsync, rename). A folder without its ``manifest.json`` is never a checkpoint. The next start
removes what a killed writer left, and only that: qkv's own temporary names, holding only what
qkv writes (:func:`remove_stale_temporaries`). There is no ``latest.json``: the newest
checkpoint is the ``step-*`` folder with the highest number, and :func:`resume_checkpoint` picks
the newest intact one (or the one asked for). Reading a folder back (checking the manifest,
then the size and checksum of each file read, refusing one it does not list;
:class:`CheckpointError` with what is wrong) is :mod:`qkv.inference.saved`, which translating
and evaluating use too; its names are importable from here as well.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._atomic import NoSpaceError, replace, tree_bytes, write_bytes, write_json
from .._errors import SettingError, keyed
from .._folder import (
    MANIFEST,
    MODEL_CONFIG,
    SPLIT,
    TOKENIZERS,
    TRAIN_CONFIG,
    TRAINER_STATE,
    WEIGHTS,
)
from ..inference.layout import BEST_POINTER, FINAL_DIR, RunLayout, step_name, step_of
from ..inference.saved import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    LoadedCheckpoint,
    VerifiedFolder,
    best_checkpoint,
    find_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    model_languages,
    read_json,
    read_weights,
    resolve_model_dir,
    sha256_file,
    verify_checkpoint,
)
from ..inference.writing import TMP_PREFIX, check_out, remove_stale_folders, write_model_folder
from .runlock import LockHolder

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "LoadedCheckpoint",
    "NoSpaceError",
    "atomic_write_bytes",
    "atomic_write_json",
    "average_checkpoints",
    "average_weights",
    "best_checkpoint",
    "find_checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model_weights",
    "prune_checkpoints",
    "read_weights",
    "repair_best_pointer",
    "resolve_model_dir",
    "resume_checkpoint",
    "resumed_settings",
    "save_checkpoint",
    "sha256_file",
    "verify_checkpoint",
    "write_best_pointer",
    "write_model_folder",
]

log = logging.getLogger(__name__)

#: qkv's temporary files (atomic_write_bytes) are recognisable, so that clean-up never takes a
#: user's ``.tmp-*`` file for one
_STALE_FILE = re.compile(
    rf"^\.(?:{re.escape(BEST_POINTER)}|latest\.json){re.escape(TMP_PREFIX)}\d+$"
)


def run_lock_in_use(folder: str | Path) -> Callable[[int], bool] | None:
    """Which temporary folders in ``folder`` (a run's ``OUT`` or ``OUT/checkpoints``) may still
    be written: when this process holds the run's lock (``OUT/.lock``), no other process
    writes there, so only its own are; else None (any live process's are, see
    :func:`qkv.inference.remove_stale_folders`)."""
    folder = Path(folder)
    for run in (folder, folder.parent):
        try:
            holder = LockHolder.parse(RunLayout(run).lock.read_text(encoding="utf-8"))
        except OSError:
            continue
        if holder is not None and holder.pid == os.getpid() and holder.alive() is not False:
            me = os.getpid()
            return lambda pid: pid == me
    return None


# ---------------------------------------------------------------------------- atomic files
def _temp(path: Path) -> str:
    """The temporary name of ``path`` while it is written: ``.NAME.qkv-tmp-PID``, which
    :func:`remove_stale_temporaries` knows."""
    return f".{path.name}{TMP_PREFIX}{os.getpid()}"


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`qkv._atomic.write_bytes`: a temporary
    file in the same folder, fsync, rename, the mode the user's umask gives). Readers see the
    old content or the new one, never a part; on an error the temporary file is removed (a
    full disk: :class:`NoSpaceError`)."""
    write_bytes(path, data, temp=_temp(Path(path)))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as indented UTF-8 JSON."""
    write_json(path, obj, temp=_temp(Path(path)))


# ---------------------------------------------------------------------------- saving
def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: nn.Module,
    model_config: dict,
    train_config: dict,
    write_tokenizers: Callable[[Path], None],
    split: dict,
    trainer_state: dict,
    tensors: dict,
    languages: tuple[str, str] | None = None,
) -> Path:
    """Write checkpoint ``step`` into ``root`` (``OUT/checkpoints``) atomically.

    Args:
        root: the checkpoints folder (created if needed).
        step: the number of updates done.
        model: the unwrapped model (not the DDP wrapper); its ``state_dict()`` is saved with
            safetensors (tied weights once).
        model_config: ``Seq2SeqConfig.to_dict()``.
        train_config: ``TrainConfig.to_dict()``.
        write_tokenizers: ``fn(folder)`` that saves the tokenizers into ``folder``.
        split: ``Split.to_dict()``.
        trainer_state: JSON-serialisable loop state (data position, counters, history).
        tensors: optimizer/schedule/RNG state: tensors, numbers, strings, lists, tuples, dicts
            (what ``torch.load(weights_only=True)`` reads back).
        languages: the run's ``(source, target)`` codes, recorded in ``model.json``.

    Returns:
        The final checkpoint folder ``root/step-XXXXXXXX``.

    Raises:
        NoSpaceError: the disk is full: one line naming the folder and the space a checkpoint
            needs (:func:`_checkpoint_bytes`); the temporary folder is removed and the
            checkpoints written before are intact.
    """
    root = Path(root)
    final = write_model_folder(
        root / step_name(step),
        step=step,
        state_dict=model.state_dict(),
        model_config=model_config,
        write_tokenizers=write_tokenizers,
        documents={TRAIN_CONFIG: train_config, SPLIT: split, TRAINER_STATE: trainer_state},
        tensors=tensors,
        languages=languages,
        in_use=run_lock_in_use(root),
        needed=_checkpoint_bytes(root),
        remedy=(
            "then resume (qkv train --resume, from the newest checkpoint kept); --keep-last "
            "keeps fewer checkpoints"
        ),
    )
    return final


def _checkpoint_bytes(root: Path) -> int | None:
    """About what a checkpoint takes: the newest one written before in ``root`` (a run's
    checkpoints are one size), else None (the weights' and tensors' bytes are counted)."""
    before = find_checkpoints(root) if root.is_dir() else []
    return tree_bytes(before[-1]) if before else None


#: why checkpoints cannot be averaged, per part of :func:`_model_identity` that differs
_IDENTITY = (
    "model.json differs",
    "other tokenizers: the same ids stand for other words",
    "other languages",
)


def _model_identity(folder: Path) -> tuple[Any, ...]:
    """What makes ``folder``'s weights mean what they mean: its model config, its tokenizers
    (the SHA-256 of each file, verified) and its languages. Two runs of one architecture with
    other vocabularies (fr and zh) have equal configs and other tokenizers."""
    v = VerifiedFolder(folder)
    meta = v.json(MODEL_CONFIG)
    config = meta.get("config") if isinstance(meta, dict) else None
    v.tree(TOKENIZERS)
    tokenizers = {k: m.get("sha256") for k, m in v.files.items() if k.startswith("tokenizers/")}
    return config, tokenizers, model_languages(meta, folder)


def _refuse_repeats(paths: list[Path]) -> None:
    """Refuse a checkpoint given twice, as the same folder (a link or another spelling of its
    path included) or as a copy (the same update, weights, tokenizers and model config, by the
    step and the SHA-256 its manifest records of each): the mean would weigh it double. Two
    updates that happen to hold equal weights are two checkpoints.

    Raises:
        SettingError: (``checkpoints``) the two names and why they are one checkpoint.
    """
    folders: dict[Path, Path] = {}
    weights: dict[tuple, Path] = {}
    for p in paths:
        real = p.resolve()
        v = VerifiedFolder(p)
        sha = v.files.get(WEIGHTS, {}).get("sha256")
        model = sorted(
            (k, str(m.get("sha256")))
            for k, m in v.files.items()
            if k in (WEIGHTS, MODEL_CONFIG) or k.startswith(f"{TOKENIZERS}/")
        )
        model.append(("step", str(v.manifest.get("step"))))
        first, why = folders.get(real), "the same folder"
        if first is None and sha is not None and tuple(model) in weights:
            first, why = weights[tuple(model)], f"a copy: its weights' SHA-256 {str(sha)[:16]}..."
        if first is not None:
            raise SettingError(
                "checkpoints",
                f"{str(p)!r} is {str(first)!r} again ({why}); averaging a checkpoint twice "
                "weighs it double: give each checkpoint once",
            )
        folders[real] = p
        if sha is not None:
            weights[tuple(model)] = p


def average_weights(folders: list[Path] | list[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the weights of several checkpoint folders of one model
    (fairseq's checkpoint averaging), accumulated in float64 and returned in each tensor's own
    dtype. Integer tensors (none in qkv's models) must be equal and are kept.

    Raises:
        ValueError: fewer than one folder; a checkpoint given twice (:func:`_refuse_repeats`).
        CheckpointError: a corrupt folder, or folders of different models: another
            ``model.json``, other tokenizers (the same ids for other words), other languages.
    """
    paths = [Path(f) for f in folders]
    if not paths:
        raise ValueError("folders: expected at least one checkpoint folder, got none")
    _refuse_repeats(paths)
    acc: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    first: tuple[Any, ...] | None = None
    for p in paths:  # what is read is verified (model.json, model.safetensors, tokenizers)
        this = _model_identity(p)
        if first is None:
            first = this
        elif this != first:
            what = next(why for why, a, b in zip(_IDENTITY, this, first) if a != b)
            raise CheckpointError(
                f"checkpoint: {str(p)!r} holds another model than {str(paths[0])!r} ({what}); "
                "only checkpoints of one run can be averaged"
            )
        tensors = read_weights(p)
        if acc and set(tensors) != set(acc):
            raise CheckpointError(f"checkpoint: {str(p)!r} has other weight names than the rest")
        for k, v in tensors.items():
            if not v.is_floating_point():
                if k in acc and not torch.equal(acc[k], v):
                    raise CheckpointError(f"checkpoint: integer tensor {k} differs in {str(p)!r}")
                acc[k], dtypes[k] = v, v.dtype
                continue
            if k in acc:
                acc[k] += v.double()
            else:
                acc[k], dtypes[k] = v.double().clone(), v.dtype
    n = len(paths)
    return {k: (v / n).to(dtypes[k]) if v.is_floating_point() else v for k, v in acc.items()}


# ---------------------------------------------------------------------------- the best one
def write_best_pointer(root: str | Path, step: int, bleu: float | None) -> None:
    """Make ``root/best.json`` (``root``: ``OUT/checkpoints``) name the checkpoint of update
    ``step`` as the one of the best validation BLEU, ``bleu``; atomically."""
    atomic_write_json(
        Path(root) / BEST_POINTER, {"step": int(step), "path": step_name(int(step)), "bleu": bleu}
    )


def repair_best_pointer(root: str | Path, best_step: int | None, best_bleu: float | None) -> None:
    """Make ``best.json`` name ``best_step`` (the run state's best update) when that checkpoint
    exists and the pointer names another: a crash right after a checkpoint's rename, before
    its ``best.json`` write, leaves the pointer stale.

    Raises:
        CheckpointError: the pointer there names a folder out of ``root`` (not followed).
    """
    if best_step is None:
        return
    root, name = Path(root), step_name(int(best_step))
    if not (root / name / MANIFEST).is_file():
        return
    current = best_checkpoint(root)
    if current is None or current.name != name:
        write_best_pointer(root, best_step, best_bleu)


# ---------------------------------------------------------------------------- finding
def prune_checkpoints(
    root: str | Path, keep_last: int, *, best_step: int | None = None
) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints and the best one, plus temporary
    folders of killed writers. Returns the deleted folders.

    ``best_step`` (the run state's best update) is kept whatever ``best.json`` says: a crash
    between a checkpoint's rename and the ``best.json`` write leaves the pointer stale, and the
    run state is the truth."""
    root = Path(root)
    found = find_checkpoints(root)
    keep = set(found[-keep_last:])
    try:
        best = best_checkpoint(root)
    except CheckpointError:  # a pointer out of the folder: followed nowhere, kept nothing
        best = None
    if best is not None:
        keep.add(best)
    if best_step is not None:
        keep.add(root / step_name(int(best_step)))
    removed = []
    for p in found:
        if p not in keep:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def remove_stale_temporaries(root: str | Path) -> list[Path]:
    """Remove what a killed writer left in ``root`` (``OUT/checkpoints``), and only that:
    a ``.qkv-tmp-*``/``.qkv-old-*`` folder holding nothing but the files of a model folder and
    not being written (:func:`run_lock_in_use`: with the run's lock held, any other process's),
    a ``.best.json.qkv-tmp-PID`` file. A user's file is never touched, whatever its name (a
    ``.tmp-*`` of theirs included). Returns what was removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = remove_stale_folders(root, run_lock_in_use(root))
    for p in root.iterdir():
        if _STALE_FILE.match(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


# ---------------------------------------------------------------------------- resuming
def _resume_target(root: Path, resume_from: int | str | Path) -> Path:
    """The checkpoint folder ``resume_from`` names (an update number, or a checkpoint folder of
    ``root``); CheckpointError listing the checkpoints there when there is none such."""
    found = find_checkpoints(root)
    there = (
        f"the checkpoints in {str(root)!r} are: {', '.join(p.name for p in found)}"
        if found
        else f"{str(root)!r} holds no checkpoint"
    )
    if isinstance(resume_from, bool) or not isinstance(resume_from, (int, str, os.PathLike)):
        raise keyed(
            TypeError,
            "resume_from",
            f"expected an update number or a checkpoint folder, got {type(resume_from).__name__}",
        )
    if isinstance(resume_from, int):
        if resume_from < 0:
            raise keyed(
                CheckpointError, "resume_from", f"expected an update number >= 0, got {resume_from}"
            )
        target = root / step_name(resume_from)
        if target not in found:
            raise keyed(
                CheckpointError,
                "resume_from",
                f"no checkpoint of update {resume_from} in {str(root)!r}; {there}",
            )
        return target
    target = Path(resume_from)
    if not (target / MANIFEST).is_file():
        raise keyed(
            CheckpointError,
            "resume_from",
            f"{str(target)!r} is not a checkpoint folder "
            f"({'no ' + MANIFEST + ' in it' if target.is_dir() else 'no such folder'}); {there}",
        )
    if target.resolve() not in {p.resolve() for p in found}:
        raise keyed(
            CheckpointError,
            "resume_from",
            f"{str(target)!r} is not a checkpoint of the run being resumed (one of "
            f"{str(root)!r}); {there}",
        )
    return root / target.resolve().name


def _set_aside(folder: Path, why: str) -> Path:
    """Rename ``folder`` to ``folder.WHY`` (``.WHY-2``, ... when taken): out of the run's way,
    nothing deleted."""
    dest, n = folder.with_name(f"{folder.name}.{why}"), 1
    while dest.exists():
        n += 1
        dest = folder.with_name(f"{folder.name}.{why}-{n}")
    replace(folder, dest)
    return dest


def resume_checkpoint(
    root: str | Path, resume_from: int | str | Path | None = None, *, act: bool = True
) -> LoadedCheckpoint | None:
    """The checkpoint a resumed run continues from, verified and read (with its training
    state), or None when ``root`` (``OUT/checkpoints``) holds none.

    Without ``resume_from``, the newest intact checkpoint: a newer one that fails verification
    (a truncated or altered file, an unreadable manifest) is skipped with a warning naming it
    and why. With ``resume_from`` (an update number, or a checkpoint folder of ``root``), that
    one, and an error if it is damaged. The folder listing is the truth (``latest.json``,
    which earlier qkv versions wrote, is not read).

    With ``act`` (the one process that writes), the run's later history is set aside, renamed,
    never deleted: the checkpoints newer than the chosen one (``step-N.corrupt`` for damaged
    ones, ``step-N.superseded`` for intact ones) and a ``final`` model of a later update
    (``final.superseded``), so that the resumed run's pruning, averaging and final model see
    only its own checkpoints; and a stale ``latest.json`` is removed.

    Raises:
        CheckpointError: ``resume_from`` names no checkpoint of ``root`` (the message lists
            them) or a damaged one; every checkpoint is damaged (each named, with why).
    """
    root = Path(root)
    found = find_checkpoints(root)
    if resume_from is not None:
        target = _resume_target(root, resume_from)
        ckpt = load_checkpoint(target)
        skipped: list[tuple[Path, str]] = []
    else:
        if not found:
            return None
        ckpt, skipped = None, []
        for p in reversed(found):
            try:
                ckpt = load_checkpoint(p)
                break
            except CheckpointError as e:
                skipped.append((p, str(e)))
        if ckpt is None:
            raise CheckpointError(
                f"resume: no intact checkpoint in {str(root)!r}: "
                + "; ".join(f"{p.name}: {why}" for p, why in skipped)
            )
    if act:
        for p, why in skipped:
            log.warning(
                "checkpoint %s cannot be resumed from (%s); resuming from %s, the newest intact "
                "one; the damaged one is kept as %s",
                p.name,
                why,
                ckpt.path.name,
                _set_aside(p, "corrupt").name,
            )
        _set_aside_later(root, ckpt.path)
    return ckpt


def _set_aside_later(root: Path, chosen: Path) -> None:
    """Set aside what of the run is newer than ``chosen`` (see :func:`resume_checkpoint`)."""
    step = step_of(chosen)
    for p in find_checkpoints(root):
        if step_of(p) > step:  # type: ignore[operator] - both are checkpoints' names
            dest = _set_aside(p, "superseded")
            log.warning(
                "resuming from %s: the newer checkpoint %s is kept as %s (delete it when you no "
                "longer need it)",
                chosen.name,
                p.name,
                dest.name,
            )
    final = root.parent / FINAL_DIR  # root is OUT/checkpoints
    try:
        final_step = json.loads((final / MANIFEST).read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        final_step = None
    if isinstance(final_step, int) and final_step > step:
        dest = _set_aside(final, "superseded")
        log.warning(
            "resuming from %s: the final model of update %d is kept as %s; the resumed run "
            "writes a new one",
            chosen.name,
            final_step,
            dest,
        )
    stale = root / "latest.json"
    if stale.is_file():  # written by earlier qkv versions, never read
        stale.unlink()


def resumed_settings(
    root: str | Path, resume_from: int | str | Path | None = None
) -> dict[str, Any] | None:
    """The ``train.json`` settings of the run in ``root`` (``OUT/checkpoints``) that
    :func:`resume_checkpoint` would resume, read cheaply (only ``train.json`` verified): of
    ``resume_from``, else of the newest checkpoint whose ``train.json`` is intact (one run's
    checkpoints share their settings). None when there is none.

    Raises:
        CheckpointError: ``resume_from`` names no checkpoint of ``root``, or a damaged one.
    """
    root = Path(root)
    if resume_from is not None:
        return read_json(_resume_target(root, resume_from), TRAIN_CONFIG)
    for p in reversed(find_checkpoints(root)):
        try:
            return read_json(p, TRAIN_CONFIG)
        except CheckpointError:
            continue
    return None


def average_checkpoints(
    folders: list[Path] | list[str], out: str | Path, *, force: bool = False
) -> Path:
    """Write the average of checkpoint ``folders`` (one run's) as a model folder ``out`` that
    ``Translator.load``/``qkv translate``/``qkv evaluate`` accept (no training state: it
    cannot be resumed). Configs, split and tokenizers come from the newest folder.

    ``out`` must be new or empty; ``force`` replaces a model folder qkv wrote before (an
    average, an export), never a run, a checkpoint or a run's own ``final/`` (see
    :func:`qkv.inference.writing.check_out`).

    Raises:
        ValueError: no folders, or an ``out`` that would lose something (one of the folders,
            a non-empty folder without ``force``, a folder that is not a model folder).
        CheckpointError: a corrupt folder, or folders of different models (another
            ``model.json``, other tokenizers or languages).
    """
    paths = sorted((Path(f) for f in folders), key=lambda p: _manifest_step(p))
    if not paths:
        raise ValueError("checkpoints: expected at least one checkpoint folder, got none")
    out = check_out(out, force, tuple(paths))
    weights = average_weights(paths)
    newest = paths[-1]
    meta = read_json(newest, MODEL_CONFIG)
    steps = [_manifest_step(p) for p in paths]

    verify_checkpoint(newest, [TOKENIZERS])  # copied into a folder whose manifest vouches

    def copy_tokenizers(dest: Path) -> None:
        shutil.copytree(newest / TOKENIZERS, dest)

    return write_model_folder(
        out,
        step=steps[-1],
        state_dict=weights,
        model_config=meta["config"],
        languages=model_languages(meta, newest),
        write_tokenizers=copy_tokenizers,
        documents={
            TRAIN_CONFIG: read_json(newest, TRAIN_CONFIG),
            SPLIT: read_json(newest, SPLIT),
            TRAINER_STATE: {
                "step": steps[-1],
                "weights": {"kind": "average", "steps": steps, "folders": [str(p) for p in paths]},
            },
        },
    )


def _manifest_step(folder: Path) -> int:
    """The update a checkpoint folder holds (from its manifest)."""
    manifest = verify_checkpoint(folder, files=[])
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise CheckpointError(f"checkpoint: {str(folder)!r} has no step in its manifest")
    return step
