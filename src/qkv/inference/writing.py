"""Writing a model folder (the format :mod:`qkv.inference.saved` reads), and an inference-only
one: :func:`save_model` for any model built by :func:`qkv.nn.build_model` with its tokenizers.

A checkpoint of ``qkv train`` holds the training state too (``trainer.pt``: the optimizer's
moments, twice the weights). A model folder written by :func:`save_model` holds only what
translating needs::

    manifest.json       format, version, and the size and SHA-256 of every other file
    model.safetensors   the weights
    model.json          the qkv.nn.Seq2SeqConfig that rebuilds the model
    tokenizers/         the source and target tokenizers, their normaliser included
    decoding.json       the decoding to use by default (beam, length penalty), when one is given
    README.md           the model card: training data, scores, settings, date, qkv version
    card.json           the card's content as data (kept when the folder is exported again)

``load_model``, ``Translator.load``, ``qkv translate``, ``qkv evaluate`` (with ``--data``) and the
attention viewer read it as they read a run. :func:`run_card` gathers a run's card from the
folder it was exported from.

The files' names are :mod:`qkv._folder`'s. Every folder is written atomically
(:func:`write_folder`, on :mod:`qkv._atomic`'s folder swap); :func:`atomic_file`,
:func:`fsync_dir`, :class:`NoSpaceError` (:mod:`qkv._atomic`) and :func:`current_umask`
(:mod:`qkv._machine`) are importable from here too.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from .._atomic import (
    NoSpaceError,
    atomic_file,
    fsync_dir,
    install_folder,
    is_no_space,
    no_space_error,
    payload_bytes,
    tree_bytes,
)
from .._errors import SettingError
from .._folder import (
    CARD,
    CARD_DATA,
    DECODING,
    FOLDER_NAMES,
    MANIFEST,
    MODEL_CONFIG,
    ONNX_CONFIG,
    ONNX_FILES,
    TOKENIZERS,
    TRAIN_CONFIG,
    TRAINER_STATE,
    TRAINER_TENSORS,
    WEIGHTS,
)
from .._machine import current_umask
from ..data import Tokenizer, save_tokenizers
from ..data.languages import language_name
from ..nn.seq2seq import EncoderDecoder
from .layout import CHECKPOINTS_DIR, FINAL_DIR
from .options import Decoding
from .saved import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    CT2_FOLDER_FORMAT,
    HF_FOLDER_FORMAT,
    ONNX_FOLDER_FORMAT,
    VerifiedFolder,
    languages_record,
    model_languages,
    sha256_file,
)

__all__ = [
    "BUNDLED_DATA",
    "BUNDLED_LANGUAGES",
    "TMP_PREFIX",
    "NoSpaceError",
    "atomic_file",
    "check_out",
    "current_umask",
    "data_files",
    "describe_data_files",
    "fsync_dir",
    "give_umask_modes",
    "is_model_folder",
    "model_card",
    "published",
    "remove_stale_folders",
    "run_card",
    "save_model",
    "training_files",
    "write_folder",
    "write_manifest",
    "write_model_folder",
]

#: what a model card says of a model trained on the bundled corpus (``qkv.data``), and the
#: language codes of that corpus (source, target)
BUNDLED_DATA = "the bundled English-French corpus (qkv.data)"
BUNDLED_LANGUAGES = ("en", "fr")

#: the prefixes of qkv's temporary names (a folder being written, a folder being replaced)
TMP_PREFIX, _OLD = ".qkv-tmp-", ".qkv-old-"
#: a folder being written or replaced by process PID: ``.qkv-tmp-NAME-PID``, ``.qkv-old-NAME-PID``
_TEMP_FOLDER = re.compile(r"^\.qkv-(?:tmp|old)-(.+)-(\d+)$")
#: what an ONNX export written before ONNX folders had a manifest holds (replaced by --force)
_OLD_ONNX_NAMES = frozenset({*ONNX_FILES, TOKENIZERS})


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # pragma: no cover - cannot tell: in use
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_folders(
    root: str | Path, in_use: Callable[[int], bool] | None = None
) -> list[Path]:
    """Remove the temporary folders a killed writer left in ``root`` (``.qkv-tmp-NAME-PID``,
    ``.qkv-old-NAME-PID``), and only those: holding nothing but what a model folder holds, and
    not in use. ``in_use(pid)`` says whether process ``pid`` may still be writing one
    (default: this process, or any live process on this host). Returns what was removed."""
    root = Path(root)
    in_use = in_use or (lambda pid: pid == os.getpid() or _pid_alive(pid))
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _TEMP_FOLDER.match(p.name)
        if m is None or p.is_symlink() or not p.is_dir() or in_use(int(m.group(2))):
            continue
        try:
            names = {c.name for c in p.iterdir()}
        except OSError:
            continue
        if names <= FOLDER_NAMES:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


# ---------------------------------------------------------------------------- modes
def give_umask_modes(root: Path) -> None:
    """Give ``root`` and everything under it the modes the user's umask gives a new file
    (``0o666 & ~umask``) and folder (``0o777 & ~umask``), as ``open()`` and ``mkdir`` do:
    libraries that write files 0600 (safetensors, ``mkstemp``) do not decide who may read a
    model. Links are left alone."""
    mask = current_umask()
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


# ---------------------------------------------------------------------------- the writer
def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_manifest(folder: Path, fmt: str, step: int = 0) -> dict[str, Any]:
    """Write ``folder/manifest.json`` (format ``fmt``, :data:`~qkv.inference.saved.
    CHECKPOINT_VERSION`, ``step``, the size and SHA-256 of every other file under ``folder``)
    after fsyncing those files and giving them the umask's modes (:func:`give_umask_modes`);
    what :class:`~qkv.inference.saved.VerifiedFolder` checks. Returns the manifest."""
    files = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel != MANIFEST:
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files[rel] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    give_umask_modes(folder)
    manifest = {
        "format": fmt,
        "version": CHECKPOINT_VERSION,
        "qkv_version": __version__,
        "step": step,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": files,
    }
    _write_synced(folder / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def write_folder(
    final: str | Path,
    fill: Callable[[Path], None],
    *,
    fmt: str = CHECKPOINT_FORMAT,
    step: int = 0,
    in_use: Callable[[int], bool] | None = None,
    remedy: str = "",
    needed: int | None = None,
) -> Path:
    """Write a folder atomically: ``fill(folder)`` writes its files into a temporary folder
    beside ``final`` (``.qkv-tmp-NAME-PID``), then the manifest (:func:`write_manifest`,
    format ``fmt``) goes last, every file and folder is fsynced and given the user's umask
    modes, and the folder is renamed to ``final`` (an existing ``final`` is replaced: set aside
    first, removed once the new one is in place). The one writer of every folder qkv writes:
    checkpoints, final models, averages, exports of every format.

    Temporary folders a killed writer left beside it are removed first
    (:func:`remove_stale_folders` with ``in_use``). On any error the temporary folder is
    removed and an existing ``final`` stays as it was; a full disk is a :class:`NoSpaceError`
    ("no space left", the folder, the space needed: ``needed`` bytes or what was written before
    the disk filled, whichever is more; ``remedy``). Returns ``final``.
    """
    final = Path(final)
    root, name = final.parent, final.name
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if is_no_space(e):
            raise no_space_error(e, root, name, remedy) from None
        raise
    remove_stale_folders(root, in_use)  # what a killed writer left, on the next write
    tmp = root / f"{TMP_PREFIX}{name}-{os.getpid()}"
    old = root / f"{_OLD}{name}-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        fill(tmp)
        write_manifest(tmp, fmt, step)
        for d in [*(p for p in tmp.rglob("*") if p.is_dir()), tmp]:
            fsync_dir(d)
        install_folder(tmp, final, old)
    except BaseException as e:
        full = isinstance(e, Exception) and is_no_space(e)
        written = tree_bytes(tmp) if full else 0
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written is left
        if full:
            raise no_space_error(e, root, name, remedy, max(needed or 0, written)) from None
        raise
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
    texts: dict[str, str] | None = None,
    extra: Callable[[Path], None] | None = None,
    in_use: Callable[[int], bool] | None = None,
    remedy: str = "",
    languages: tuple[str, str] | None = None,
    needed: int | None = None,
) -> Path:
    """Write a model folder atomically (:func:`write_folder`): ``model.safetensors``
    (``state_dict``, shared tensors once), ``model.json`` (with the model's ``(source, target)``
    ``languages`` when known), each ``documents`` entry as a JSON file of that name, the
    tokenizers, ``trainer.pt`` when ``tensors`` is given, each ``texts`` entry as a UTF-8 file
    of that name (a model card), what ``extra(folder)`` writes (another engine's model), and
    the manifest last (see :mod:`qkv.inference.saved`).

    An existing ``final`` is replaced. Returns ``final``. On any error an existing ``final``
    stays as it was; a full disk is a :class:`NoSpaceError` ("no space left", the folder,
    about ``needed`` bytes, by default the weights' and ``tensors``' bytes; ``remedy``).
    """
    meta: dict[str, Any] = {"config": model_config}
    if languages is not None:
        meta["languages"] = languages_record(languages)

    def fill(tmp: Path) -> None:
        _model_files(tmp, state_dict, meta, documents, tensors, texts)
        write_tokenizers(tmp / TOKENIZERS)
        if extra is not None:
            extra(tmp)

    needed = needed or payload_bytes((state_dict, tensors))
    return write_folder(final, fill, step=step, in_use=in_use, remedy=remedy, needed=needed)


def _model_files(
    tmp: Path,
    state_dict: dict[str, torch.Tensor],
    meta: dict[str, Any],
    documents: dict[str, Any],
    tensors: dict | None,
    texts: dict[str, str] | None,
) -> None:
    """:func:`write_model_folder`'s files but the tokenizers and another engine's, in ``tmp``."""
    from safetensors.torch import save_file

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
    save_file(unique, str(tmp / WEIGHTS), metadata={"format": "pt"})

    def dump(fname: str, obj: Any) -> None:
        _write_synced(tmp / fname, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode())

    dump(MODEL_CONFIG, {**meta, "aliases": aliases})
    for fname, obj in documents.items():
        dump(fname, obj)
    for fname, text in (texts or {}).items():
        _write_synced(tmp / fname, text.encode("utf-8"))
    if tensors is not None:
        # through a Python file: a full disk is an OSError with its errno, not torch's
        # "file write failed"
        with open(tmp / TRAINER_TENSORS, "wb") as f:
            torch.save(tensors, f)
            f.flush()
            os.fsync(f.fileno())


# ---------------------------------------------------------------------------- an inference-only folder
def check_out(out: str | Path, force: bool, sources: tuple[Path, ...] = ()) -> Path:
    """``out`` as a folder a model may be written to, else a one-line ValueError naming
    ``out``: not a file nor under one; not one of ``sources`` (the models being read) nor
    holding them; new or empty, or (``force``) a model folder qkv exported before, of any
    format (never a run, a checkpoint, a run's own ``final/``, or files qkv did not write)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SettingError(
            "out", f"{str(out)!r} is a file; expected a folder to write the model to"
        )
    for above in out.absolute().parents:
        if above.exists():
            if not above.is_dir():
                raise SettingError(
                    "out",
                    f"{str(above)!r} is a file, not a folder (in {str(out)!r}); expected "
                    "a folder to write the model to",
                )
            break
    for src in sources:
        if src.resolve() == out.resolve() or src.resolve().is_relative_to(out.resolve()):
            raise SettingError(
                "out",
                f"{str(out)!r} holds the model being saved ({str(src)!r}); choose a new folder",
            )
    if not out.exists() or not any(out.iterdir()):
        return out
    if not force:
        raise SettingError(
            "out",
            f"{str(out)!r} exists and is not empty; choose a new folder, or pass "
            "force=True (--force) to replace a model folder written before",
        )
    if _run_final(out):
        raise SettingError(
            "out",
            f"{str(out)!r} is the final model of the run {str(out.parent)!r} (its chosen "
            "weights and decoding): it is never replaced, even with --force; choose a new folder",
        )
    if not is_model_folder(out):
        raise SettingError(
            "out",
            f"{str(out)!r} is not a model folder qkv exported (a run, a checkpoint, or "
            "files qkv did not write): it is never replaced, even with --force; choose a new folder",
        )
    return out


def _run_final(folder: Path) -> bool:
    """Is ``folder`` a run's own ``OUT/final`` (a ``checkpoints/`` folder beside it)?"""
    return folder.name == FINAL_DIR and (folder.parent / CHECKPOINTS_DIR).is_dir()


def is_model_folder(folder: Path) -> bool:
    """Is ``folder`` a model folder qkv wrote, without training state: its manifest there (a
    model folder's, a CTranslate2 model's or ONNX graphs'), no ``trainer.pt`` (a checkpoint), no
    ``checkpoints/`` (a run), not a run's ``final/``; or ONNX graphs qkv exported before they
    had a manifest? Only such a folder is ever replaced by a new model
    (``save_model(force=True)``, ``qkv export --force``, ``qkv average --force``)."""
    if (folder / TRAINER_TENSORS).exists() or (folder / CHECKPOINTS_DIR).exists():
        return False
    if _run_final(folder):
        return False
    try:
        fmt = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        return ONNX_CONFIG in names and names <= _OLD_ONNX_NAMES
    return fmt in (CHECKPOINT_FORMAT, ONNX_FOLDER_FORMAT, CT2_FOLDER_FORMAT, HF_FOLDER_FORMAT)


# ---------------------------------------------------------------------------- what a card publishes
#: the settings that name files or folders: a card keeps their names only
PATH_SETTINGS = frozenset(
    {"data", "valid_data", "test_data", "tokenizer_model", "init_from", "out"}
)


def _is_path(text: str) -> bool:
    """Is ``text`` a local path a card must not show: absolute, or under the user's home."""
    return os.path.isabs(text) or text.startswith("~") or bool(re.match(r"^[A-Za-z]:[\\/]", text))


def _file_name(text: str) -> str:
    return re.split(r"[\\/]", text.rstrip("/\\"))[-1] or text


def published(value: Any, key: str | None = None) -> Any:
    """``value`` (a card, its settings, any JSON value) as a shared folder may show it: every
    local path (absolute, or under ``~``; any value of a :data:`PATH_SETTINGS` key) cut to its
    file name, at any depth; everything else as it is."""
    if isinstance(value, Mapping):
        return {k: published(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [published(v, key) for v in value]
    if isinstance(value, str) and (_is_path(value) or (key in PATH_SETTINGS and value)):
        return _file_name(value)
    return value


@functools.lru_cache(maxsize=64)
def _file_record(path: str, size: int, mtime_ns: int, inode: int) -> dict[str, Any]:
    """A file's record, hashed once per version of it in a process (the key changes with it)."""
    return {"file": Path(path).name, "bytes": size, "sha256": sha256_file(Path(path))}


def data_files(data: str | Path | list | tuple | None) -> list[dict[str, Any]]:
    """The training data as a shared folder describes it: per file ``{"file": its name,
    "bytes": its size, "sha256": its SHA-256}`` (a prepared corpus' folder: its files' total
    size and its manifest's SHA-256; a file that is gone: its name only), never its path. A
    file is hashed once per process for one size and modification time."""
    if data is None:
        return []
    records = []
    for item in [data] if isinstance(data, (str, Path)) else list(data):
        p = Path(item).expanduser()
        try:
            st = p.stat()
        except OSError:
            records.append({"file": _file_name(str(item))})
            continue
        if p.is_dir():
            total = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            rec: dict[str, Any] = {"file": p.name, "bytes": total}
            if (p / MANIFEST).is_file():
                rec["manifest_sha256"] = sha256_file(p / MANIFEST)
            records.append(rec)
            continue
        records.append(dict(_file_record(str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)))
    return records


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def describe_data_files(records: list[Mapping[str, Any]]) -> str:
    """The card's line for :func:`data_files`' records: ``"en-fr.tsv (1.2 MB, sha256
    0a1b...)"`` each, joined by ``" + "``."""
    parts = []
    for r in records:
        what = [_size(int(r["bytes"]))] if isinstance(r.get("bytes"), int) else []
        for k in ("sha256", "manifest_sha256"):
            if r.get(k):
                what.append(f"{k.replace('_', ' ')} {r[k]}")
        parts.append(f"`{r.get('file')}`" + (f" ({', '.join(what)})" if what else ""))
    return " + ".join(parts)


def _number(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, float) else str(x)


def model_card(
    card: Mapping[str, Any] | None,
    model: EncoderDecoder,
    decoding: Decoding | None,
    *,
    use: list[str] | None = None,
) -> str:
    """The ``README.md`` of a model folder (Markdown).

    Args:
        card: what is known of the model: ``"title"`` (str), ``"data"`` (the training data's
            name), ``"data_files"`` (its files, as :func:`data_files` describes them: kept in
            ``card.json``), ``"scores"`` (``{name: value or text}``, e.g. ``{"valid BLEU": 31.2}``),
            ``"signatures"`` (``{name: sacreBLEU signature}``), ``"settings"`` (``{name: value}``,
            the training settings), ``"notes"`` (a list of lines), ``"languages"``
            (``[source, target]`` codes), ``"source"`` (where the weights came from: an
            imported model's Hub name or folder), ``"license"`` (its license, as the source
            states it; never made up); every key optional.
        model: the model (its architecture is listed from its config).
        decoding: the default decoding, or None.
        use: the lines of its "Use" section (Markdown; ``THIS_FOLDER`` for the folder); None:
            ``qkv translate`` and ``qkv evaluate`` of a qkv model folder.

    When the languages, scores or license are known, the card starts with Hugging Face's
    model-card front matter (YAML between ``---`` lines): ``language:`` (source and target),
    ``license:``, ``metrics:`` (bleu, chrf, as scored), ``library_name: qkv``,
    ``pipeline_tag: translation``.
    """
    card = dict(card or {})
    known = {"title", "data", "data_files", "scores", "signatures", "settings", "notes", "step",
             "languages", "source", "license"}  # fmt: skip
    unknown = set(card) - known
    if unknown:
        raise ValueError(
            f"card: unknown keys {sorted(unknown)}; expected title, data, data_files, scores, "
            "signatures, settings, notes, step, languages, source, license"
        )
    langs = card.get("languages")
    if langs is not None:
        rec = languages_record(langs)
        langs = [rec["source"], rec["target"]]
    cfg = model.config.to_dict()
    front = ["---"]
    if langs:
        front += ["language:", *(f"- {c}" for c in dict.fromkeys(langs))]
    license_ = card.get("license")
    if license_:
        front.append(f"license: {license_}")
    metrics = [
        m for m in ("bleu", "chrf") if any(m in str(k).lower() for k in card.get("scores") or {})
    ]
    if metrics:
        front += ["metrics:", *(f"- {m}" for m in metrics)]
    front += ["library_name: qkv", "pipeline_tag: translation", "tags:", "- translation", "---"]
    # the front matter when it says something of this model (its languages, license, metrics)
    lines = [*front, ""] if (langs or metrics or license_) else []
    lines += [f"# {card.get('title') or 'qkv translation model'}", ""]
    lines.append(
        f"A {cfg.get('kind', 'transformer')} translation model saved by qkv {__version__} on "
        f"{time.strftime('%Y-%m-%d')} (inference only: no training state)."
    )
    if langs:
        lines += [
            "",
            f"Translates {language_name(langs[0])} into {language_name(langs[1])}: "
            f"`{langs[0]}` \u2192 `{langs[1]}`.",
        ]
    if card.get("source"):
        lines += ["", "## Source", "", f"Imported from {card['source']}"]
        lines.append(f"(license: {license_})." if license_ else "(its license is not stated).")
    lines += ["", "## Training data", "", str(card.get("data") or "not recorded")]
    if card.get("step") is not None:
        lines += ["", f"Trained for {card['step']} updates."]
    lines += ["", "## Scores", ""]
    scores = card.get("scores") or {}
    if scores:
        lines += [f"* {name}: {_number(v)}" for name, v in scores.items()]
    else:
        lines.append("none measured")
    for name, sig in (card.get("signatures") or {}).items():
        lines.append(f"* {name} signature: `{sig}`")
    lines += ["", "## Model", ""] + [f"* {k}: {v}" for k, v in cfg.items()]
    if decoding is not None:
        lines += ["", "## Decoding (the default)", ""]
        lines += [f"* {k}: {v}" for k, v in decoding.to_dict().items()]
    settings = card.get("settings") or {}
    if settings:
        lines += ["", "## Training settings", ""] + [f"* {k}: {v}" for k, v in settings.items()]
    for note in card.get("notes") or ():
        lines += ["", str(note)]
    if use is None:
        use = [
            "```text",
            "qkv translate --model-dir THIS_FOLDER 'Go.'",
            "qkv evaluate --model-dir THIS_FOLDER --data PAIRS.tsv",
            "```",
        ]
    lines += ["", "## Use", "", *use, ""]
    return "\n".join(lines)


def run_card(folder: str | Path) -> dict[str, Any]:
    """The model card of a saved model folder (see :func:`model_card`): a folder saved by
    :func:`save_model` keeps its card in ``card.json``; else it is gathered from what the
    folder's run recorded: ``train.json`` (data, settings) and ``trainer.json`` (validation
    BLEU and chrF, updates). What the folder lacks is left out; every file read is verified
    (a qkv model folder, or an exported CTranslate2 or ONNX one).
    """
    v = VerifiedFolder(folder, formats=(CHECKPOINT_FORMAT, ONNX_FOLDER_FORMAT, CT2_FOLDER_FORMAT))
    langs = model_languages(v.json(MODEL_CONFIG), folder) if MODEL_CONFIG in v.files else None
    if CARD_DATA in v.files:
        kept = v.json(CARD_DATA)
        if isinstance(kept, dict):
            if langs is not None:
                kept["languages"] = list(langs)
            return published(kept)
    card: dict[str, Any] = {"scores": {}}
    if langs is not None:
        card["languages"] = list(langs)
    state = v.json(TRAINER_STATE) if TRAINER_STATE in v.files else None
    if TRAIN_CONFIG in v.files:
        train = v.json(TRAIN_CONFIG)
        if isinstance(train, dict):
            card["data_files"] = training_files(train.get("data"), state)
            card["data"] = describe_data_files(card["data_files"]) or BUNDLED_DATA
            card["settings"] = published({k: val for k, val in train.items() if k != "data"})
    if isinstance(state, dict):
        card["step"] = state.get("step")
        if isinstance(state.get("valid_bleu"), (int, float)):
            card["scores"]["validation BLEU (final model, its decoding)"] = float(
                state["valid_bleu"]
            )
        evals = [h for h in state.get("history") or () if "valid_bleu" in h]
        if evals:
            last = evals[-1]
            card["scores"][f"validation BLEU (greedy, update {last.get('step')})"] = last[
                "valid_bleu"
            ]
            if "valid_chrf" in last:
                card["scores"][f"validation chrF (greedy, update {last.get('step')})"] = last[
                    "valid_chrf"
                ]
        card["notes"] = [
            "Validation scores are sacreBLEU's on the run's validation split (signatures "
            "not recorded by the run); `qkv evaluate` measures a test set."
        ]
    return card


def training_files(data: Any, state: Any) -> list[dict[str, Any]]:
    """The run's training files by name, size and SHA-256 (:func:`data_files`): as the run
    recorded them in its ``trainer.json`` (``state``), else read now; none for the bundled
    corpus."""
    if not data:
        return []
    recorded = state.get("data_files") if isinstance(state, dict) else None
    if isinstance(recorded, list) and recorded and all(isinstance(r, dict) for r in recorded):
        return [dict(r) for r in recorded]
    return data_files(data)


def save_model(
    model: EncoderDecoder,
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    out: str | Path,
    *,
    decoding: Decoding | Mapping[str, Any] | None = None,
    card: Mapping[str, Any] | None = None,
    force: bool = False,
    step: int = 0,
    source: str | Path | None = None,
    extra: Callable[[Path], None] | None = None,
    languages: tuple[str, str] | None = None,
    use: list[str] | None = None,
) -> Path:
    """Save a model with its tokenizers as an inference-only folder (see the module docstring)
    that :func:`~qkv.inference.load_model`, ``Translator.load`` and every ``qkv`` command read.

    The folder is written beside ``out`` under a temporary name and renamed into place, so
    ``out`` is never half-written.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder` built by
            :func:`~qkv.nn.build_model` (its ``config`` rebuilds it).
        src_tokenizer, tgt_tokenizer: its tokenizers (their vocabularies must fit the model).
        out: the folder to write.
        decoding: the default :class:`~qkv.inference.Decoding` (or its dict, checked), written
            as ``decoding.json``; None: none (greedy).
        card: what the ``README.md`` model card says (see :func:`model_card`).
        force: replace an existing model folder ``out`` (never a run or a checkpoint).
        step: the update the weights come from (0 for a model not trained by ``qkv train``).
        source: the folder the model was read from, which ``out`` must not be or hold.
        extra: ``fn(folder)`` writing more files into the folder before its manifest (another
            engine's model, as :func:`qkv.export.ctranslate2.export_ctranslate2` does).
        languages: the ``(source, target)`` codes the model translates, recorded in
            ``model.json`` and the card; None: the card's ``"languages"``, else not recorded.
        use: the card's "Use" section (see :func:`model_card`); None: qkv's commands.

    Returns:
        ``out``.

    Raises:
        TypeError: a model without a config, or a tokenizer that is not a qkv one.
        ValueError: vocabularies that do not fit the model, a bad ``decoding`` or ``card``, or
            an ``out`` that is not empty (without ``force``) or not a model folder.
    """
    if not isinstance(model, EncoderDecoder) or getattr(model, "config", None) is None:
        raise TypeError(
            f"model: expected an EncoderDecoder built by qkv.nn.build_model (with a config), got "
            f"{type(model).__name__}"
        )
    for name, tok in (("src_tokenizer", src_tokenizer), ("tgt_tokenizer", tgt_tokenizer)):
        if not isinstance(tok, Tokenizer):
            raise TypeError(f"{name}: expected a qkv.data Tokenizer, got {type(tok).__name__}")
    cfg = model.config
    sizes = (src_tokenizer.vocab_size, tgt_tokenizer.vocab_size)
    if sizes != (cfg.src_vocab_size, cfg.tgt_vocab_size):
        raise ValueError(
            f"tokenizers: vocabularies of {sizes[0]} and {sizes[1]} ids, the model expects "
            f"{cfg.src_vocab_size} and {cfg.tgt_vocab_size}"
        )
    default = None if decoding is None else Decoding.coerce(decoding)
    documents = {} if default is None else {DECODING: default.to_dict()}
    card = published(dict(card or {}))
    if languages is None and card.get("languages") is not None:
        languages = tuple(card["languages"])  # type: ignore[assignment]
    if languages is not None:
        rec = languages_record(languages)
        languages = (rec["source"], rec["target"])
        card["languages"] = list(languages)
    readme = model_card(card, model, default, use=use)
    try:  # kept as data too: a model exported again keeps its card
        documents[CARD_DATA] = json.loads(json.dumps(dict(card or {}), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"card: expected JSON-serialisable values (text, numbers): {e}") from None
    out = Path(out)
    check_out(out, force, () if source is None else (Path(source),))
    try:
        return write_model_folder(
            out,
            step=step,
            state_dict=model.state_dict(),
            model_config=cfg.to_dict(),
            write_tokenizers=lambda d: save_tokenizers(d, src_tokenizer, tgt_tokenizer),
            documents=documents,
            texts={CARD: readme},
            extra=extra,
            languages=languages,
        )
    except BaseException:  # nothing half-written is left beside out (out itself is untouched)
        shutil.rmtree(out.parent / f"{TMP_PREFIX}{out.name}-{os.getpid()}", ignore_errors=True)
        raise
