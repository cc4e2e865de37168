"""Checkpoints that lose nothing, written so that a crash never leaves a half-written one.

A run's folder ``OUT`` holds::

    OUT/checkpoints/step-00001200/   one complete checkpoint (see below)
    OUT/checkpoints/best.json        which checkpoint has the best validation BLEU
    OUT/checkpoints/latest.json      the newest checkpoint

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

Writing is atomic: everything goes into ``.tmp-step-...`` beside the final folder, every file is
flushed and fsynced, then the folder is renamed into place (``os.replace``), and the pointer files
are replaced the same way (temporary file in the same folder, fsync, ``os.replace``). A folder
without its ``manifest.json`` is never a checkpoint, and temporary folders left by a killed run
are removed on the next start. Reading a folder back (checking the manifest, the sizes and the
checksums; :class:`CheckpointError` with what is wrong) is :mod:`qkv.inference.saved`, which
translating and evaluating use too; its names are importable from here as well.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..inference.saved import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    MANIFEST,
    CheckpointError,
    LoadedCheckpoint,
    best_checkpoint,
    find_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    read_json,
    read_weights,
    resolve_model_dir,
    sha256_file,
    verify_checkpoint,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "LoadedCheckpoint",
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
    "resolve_model_dir",
    "save_checkpoint",
    "verify_checkpoint",
    "write_model_folder",
]


# ---------------------------------------------------------------------------- atomic files
def _fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, fsync,
    ``os.replace``. Readers see the old content or the new one, never a part."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    _fsync_dir(p.parent)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as indented UTF-8 JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


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

    Returns:
        The final checkpoint folder ``root/step-XXXXXXXX``.
    """
    root = Path(root)
    name = f"step-{step:08d}"
    final = write_model_folder(
        root / name,
        step=step,
        state_dict=model.state_dict(),
        model_config=model_config,
        write_tokenizers=write_tokenizers,
        documents={"train.json": train_config, "split.json": split, "trainer.json": trainer_state},
        tensors=tensors,
    )
    atomic_write_json(root / "latest.json", {"step": step, "path": name})
    return final


def write_model_folder(
    final: str | Path,
    *,
    step: int,
    state_dict: dict[str, torch.Tensor],
    model_config: dict,
    write_tokenizers: Callable[[Path], None],
    documents: dict[str, Any],
    tensors: dict | None = None,
) -> Path:
    """Write a model folder atomically: ``model.safetensors`` (``state_dict``, shared tensors
    once), ``model.json``, each ``documents`` entry as a JSON file of that name, the tokenizers,
    ``trainer.pt`` when ``tensors`` is given, and the manifest last (see the module docstring).

    The folder is built beside ``final`` under a temporary name and renamed into place; an
    existing ``final`` is replaced. Returns ``final``.
    """
    from safetensors.torch import save_file

    final = Path(final)
    root, name = final.parent, final.name
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()

    # safetensors refuses shared storage: save each tensor once, remember the aliases
    state = state_dict
    seen: dict[int, str] = {}
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for key, value in state.items():
        ident = value.untyped_storage().data_ptr() if value.numel() else -1
        if ident in seen and ident != -1 and state[seen[ident]].shape == value.shape:
            aliases[key] = seen[ident]
            continue
        seen[ident] = key
        unique[key] = value.detach().to("cpu").contiguous()
    save_file(unique, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    with open(tmp / "model.safetensors", "rb+") as f:
        os.fsync(f.fileno())

    def dump(fname: str, obj: Any) -> None:
        _write_synced(tmp / fname, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode())

    dump("model.json", {"config": model_config, "aliases": aliases})
    for fname, obj in documents.items():
        dump(fname, obj)
    if tensors is not None:
        torch.save(tensors, tmp / "trainer.pt")
        with open(tmp / "trainer.pt", "rb+") as f:
            os.fsync(f.fileno())
    write_tokenizers(tmp / "tokenizers")
    files = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            if p.parent != tmp:
                with open(p, "rb+") as f:
                    os.fsync(f.fileno())
            rel = p.relative_to(tmp).as_posix()
            files[rel] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    dump(
        MANIFEST,
        {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "qkv_version": __version__,
            "step": step,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": files,
        },
    )
    for d in [*(p for p in tmp.rglob("*") if p.is_dir()), tmp]:
        _fsync_dir(d)
    if final.exists():  # the same step written again (a resumed run that stopped right here)
        old = root / f".old-{name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    return final


def average_weights(folders: list[Path] | list[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the weights of several checkpoint folders of one model
    (fairseq's checkpoint averaging), accumulated in float64 and returned in each tensor's own
    dtype. Integer tensors (none in qkv's models) must be equal and are kept.

    Raises:
        ValueError: fewer than one folder.
        CheckpointError: a corrupt folder, or folders of different models.
    """
    paths = [Path(f) for f in folders]
    if not paths:
        raise ValueError("folders: expected at least one checkpoint folder, got none")
    first_config = None
    acc: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for p in paths:
        verify_checkpoint(p)
        config = read_json(p, "model.json").get("config")
        if first_config is None:
            first_config = config
        elif config != first_config:
            raise CheckpointError(
                f"checkpoint: {str(p)!r} holds another model than {str(paths[0])!r} "
                "(model.json differs); only checkpoints of one run can be averaged"
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
    best = best_checkpoint(root)
    if best is not None:
        keep.add(best)
    if best_step is not None:
        keep.add(root / f"step-{int(best_step):08d}")
    removed = []
    for p in found:
        if p not in keep:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def remove_stale_temporaries(root: str | Path) -> None:
    """Remove ``.tmp-*``/``.old-*`` folders and files a killed writer left in ``root``."""
    root = Path(root)
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".old-")) or ".tmp-" in p.name:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def average_checkpoints(folders: list[Path] | list[str], out: str | Path) -> Path:
    """Write the average of checkpoint ``folders`` (one run's) as a model folder ``out`` that
    ``Translator.load``/``qkv translate``/``qkv evaluate`` accept (no training state: it
    cannot be resumed). Configs, split and tokenizers come from the newest folder.

    Raises:
        ValueError: no folders, or ``out`` is one of them.
        CheckpointError: a corrupt folder, or folders of different models.
    """
    paths = sorted((Path(f) for f in folders), key=lambda p: _step_of(p))
    if not paths:
        raise ValueError("checkpoints: expected at least one checkpoint folder, got none")
    out = Path(out)
    inside = any(p.resolve().is_relative_to(out.resolve()) for p in paths)
    if inside or (
        out.exists()
        and (
            not (out / MANIFEST).is_file()
            or (out / "trainer.pt").exists()
            or (out / "checkpoints").exists()
        )
    ):
        raise ValueError(
            f"--out: {str(out)!r} holds other things (a run, a checkpoint, or files qkv did not "
            "write); it would be replaced: choose a new folder"
        )
    weights = average_weights(paths)
    newest = paths[-1]
    meta = read_json(newest, "model.json")
    steps = [_step_of(p) for p in paths]

    def copy_tokenizers(dest: Path) -> None:
        shutil.copytree(newest / "tokenizers", dest)

    return write_model_folder(
        out,
        step=steps[-1],
        state_dict=weights,
        model_config=meta["config"],
        write_tokenizers=copy_tokenizers,
        documents={
            "train.json": read_json(newest, "train.json"),
            "split.json": read_json(newest, "split.json"),
            "trainer.json": {
                "step": steps[-1],
                "weights": {"kind": "average", "steps": steps, "folders": [str(p) for p in paths]},
            },
        },
    )


def _step_of(folder: Path) -> int:
    """The update a checkpoint folder holds (from its manifest)."""
    manifest = verify_checkpoint(folder)
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise CheckpointError(f"checkpoint: {str(folder)!r} has no step in its manifest")
    return step
