"""The models behind one server: what pair each translates, loaded when first asked, the least
recently used unloaded beyond a memory cap, and the route of a request through them.

A model is a folder (:func:`inspect_folder` reads what it translates and how big it is without
loading it: a qkv run, checkpoint or export, a CTranslate2 export, an ONNX export). A
:class:`Lane` is one model being served: its translator (None until loaded) and its own
:class:`~qkv.serve.batcher.Batcher`. A :class:`ModelRegistry` holds the lanes, one per
``(source, target)`` pair, and answers what LibreTranslate's API asks of a server:

* :meth:`ModelRegistry.route` -- the lanes a request goes through: one model for a pair served
  directly; two when no model translates the pair but one translates the source into a common
  language and another that language into the target (pivoting, as Argos Translate does,
  through English when it can); none when source and target are the same language (the text
  comes back as it is, as LibreTranslate answers it);
* :meth:`ModelRegistry.languages_answer` -- ``GET /languages``: every language with the targets
  it reaches, itself included, as LibreTranslate lists them;
* :meth:`ModelRegistry.acquire` / :meth:`~ModelRegistry.release` -- a lane loaded for a
  request (off the event loop), not unloaded while a request holds it; loading a model that
  does not fit under the cap first unloads the idle models least recently used.

The memory a model takes is counted as the size of its weights on disk (``model.safetensors``,
CTranslate2's ``model.bin``, the ONNX graphs): what loading it costs, give or take its
tokenizers. The cap is exceeded only by a model larger than the cap on its own, or while every
loaded model is answering a request (it is brought back under the cap as they finish).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import SettingError
from .._folder import (
    CT2_OPTIONS,
    CT2_WEIGHTS,
    MANIFEST,
    MODEL_MARKS,
    ONNX_CONFIG,
    TRAIN_CONFIG,
    WEIGHTS,
)
from ..data.languages import (
    base_language,
    check_language,
    from_libretranslate,
    language_name,
    language_script,
    match_language,
    script_name,
)
from ..engines import folder_engine, open_translator
from ..inference import Decoding, TextTranslator, verify_checkpoint
from ..inference.layout import CHECKPOINTS_DIR, FINAL_DIR
from ..inference.saved import HF_FOLDER_FORMAT
from .batcher import Batcher
from .metrics import BATCH_BUCKETS, Histogram

__all__ = [
    "Lane",
    "LoadError",
    "ModelFolder",
    "ModelRegistry",
    "Route",
    "display_name",
    "inspect_folder",
    "models_in",
    "open_model",
    "shown_path",
]

log = logging.getLogger(__name__)

#: what a folder of models holds that makes a subfolder a model (``--models-dir``): a model
#: folder's files, or a run folder's
_MODEL_MARKS = (*MODEL_MARKS, FINAL_DIR, CHECKPOINTS_DIR)

#: the language a pivot goes through when several would do (Argos Translate's)
PREFERRED_PIVOT = "en"


def display_name(code: str) -> str:
    """The English name ``/languages`` gives a code (``"de"`` -> ``"German"``); the code itself
    when it is not an ISO 639-1 one (a model served with ``--target-lang x-custom``)."""
    try:
        return language_name(code)
    except ValueError:
        return code


def unserved(value: str, served: Sequence[str]) -> str:
    """Why a request's language ``value`` is not among ``served``: the languages served, and
    the scripts of its language that are when only its script is not (``zh-TW`` where a
    Simplified model is served)."""
    listed = (
        f"the languages served are {', '.join(served)} (GET /languages lists each with its targets)"
    )
    try:
        base = base_language(from_libretranslate(value))
    except ValueError:
        return f"{value!r} is not served; {listed}"
    script = language_script(value)
    others = [c for c in served if _base_or_none(c) == base]
    if script is None or not others:
        return f"{value!r} is not served; {listed}"
    theirs = ", ".join(
        f"{c} ({script_name(s)})" if (s := language_script(c)) else c for c in others
    )
    return (
        f"{value!r} ({language_name(base)} in its {script_name(script)} script) is not served: "
        f"the {language_name(base)} served is {theirs}; {listed}"
    )


def _base_or_none(code: str) -> str | None:
    try:
        return base_language(code)
    except ValueError:
        return None


# ---------------------------------------------------------------------------- folders
@dataclass(frozen=True)
class ModelFolder:
    """What a model folder holds, read without loading its weights.

    Attributes:
        path: the folder as given (None: a translator built in Python).
        source, target: the language codes it translates (canonical BCP-47).
        engine: ``"qkv"``, ``"ctranslate2"`` or ``"onnx"``.
        size: bytes of its weights on disk (what loading it costs, roughly).
    """

    path: Path | None
    source: str
    target: str
    engine: str
    size: int

    @property
    def pair(self) -> str:
        """``"en-fr"``: the label of the model in ``/metrics`` and ``/health``."""
        return f"{self.source}-{self.target}"


def _bad(path: Path, problem: str) -> SettingError:
    return SettingError("model_dir", f"{str(path)!r} {problem}")


def _json_languages(path: Path, name: str) -> tuple[str, str] | None:
    try:
        meta = json.loads((path / name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _bad(path, f"has an unreadable {name}: {e}") from None
    langs = meta.get("languages") if isinstance(meta, dict) else None
    if isinstance(langs, list) and len(langs) == 2:
        return check_language(langs[0], "source"), check_language(langs[1], "target")
    return None


def _qkv_folder(path: Path) -> tuple[tuple[str, str] | None, int]:
    """The languages and weight bytes of a qkv run, checkpoint or export folder."""
    from ..inference import CheckpointError, recorded_languages, resolve_model_dir

    try:
        resolved = resolve_model_dir(path)
    except CheckpointError as e:
        message = str(e).removeprefix("model dir: ").removeprefix(f"{str(path)!r} ")
        raise _bad(path, message) from None
    weights = resolved / WEIGHTS
    size = weights.stat().st_size if weights.is_file() else 0
    return recorded_languages(resolved), size


def inspect_folder(path: str | Path, *, engine: str = "qkv") -> ModelFolder:
    """What the model folder ``path`` translates, with which engine, and its size.

    The engine is the one the folder holds: an ONNX export (``onnx.json``) runs on
    onnxruntime, a bare CTranslate2 model (``model.bin`` and ``qkv.json``) on CTranslate2; a
    folder that holds a qkv model (a run, a checkpoint, an export, with or without a
    ``ctranslate2/`` model inside) runs on ``engine`` (``"qkv"``, or ``"ctranslate2"`` for the
    CTranslate2 model a ``qkv export --format ctranslate2`` folder holds).

    Raises:
        SettingError: keyed ``model_dir``, one line naming the folder: it does not exist, holds
            no model of the engine, or does not record the languages it translates.
        MissingDependency: the engine's package is not installed.
    """
    from .._deps import require

    p = Path(path)
    if not p.exists():
        raise _bad(p, "does not exist")
    if not p.is_dir():
        raise _bad(p, "is a file; expected a model folder")
    if engine not in ("qkv", "ctranslate2"):
        raise SettingError("engine", f"expected 'qkv' or 'ctranslate2', got {engine!r}")
    held = folder_engine(p, engine)
    if held == "onnx":
        require("serving an ONNX model", ["onnxruntime"])
        langs = _json_languages(p, ONNX_CONFIG)
        size = sum(f.stat().st_size for f in p.glob("*.onnx*") if f.is_file())
        found = ("onnx", langs, size)
    elif held == "ctranslate2" and (p / CT2_WEIGHTS).is_file():  # a bare model
        require("serving a CTranslate2 model", ["ctranslate2"])
        found = ("ctranslate2", _json_languages(p, CT2_OPTIONS), (p / CT2_WEIGHTS).stat().st_size)
    elif held == "ctranslate2":
        ct2 = p / "ctranslate2"
        if not (ct2 / CT2_WEIGHTS).is_file():
            raise _bad(
                p,
                "holds no CTranslate2 model (expected ctranslate2/model.bin, as qkv export "
                "--format ctranslate2 writes)",
            )
        require("serving a CTranslate2 model", ["ctranslate2"])
        langs = _json_languages(ct2, CT2_OPTIONS) if (ct2 / CT2_OPTIONS).is_file() else None
        found = ("ctranslate2", langs or _qkv_folder(p)[0], (ct2 / CT2_WEIGHTS).stat().st_size)
    else:
        require("serving a qkv model", ["safetensors"])
        langs, size = _qkv_folder(p)
        found = ("qkv", langs, size)
    kind, langs, size = found
    if langs is None:
        raise _bad(
            p,
            "does not record the languages it translates: train it with qkv train --src-lang "
            "--tgt-lang, or serve it alone (one --model-dir, with --source-lang and --target-lang)",
        )
    return ModelFolder(path=p, source=langs[0], target=langs[1], engine=kind, size=size)


def _manifest_type(folder: Path) -> str | None:
    """The ``type`` its ``manifest.json`` gives a folder, or None."""
    try:
        meta = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = meta.get("type") if isinstance(meta, dict) else None
    return kind if isinstance(kind, str) else None


#: the manifest type of a prepared corpus (``qkv prepare --out``)
PREPARED_TYPE = "qkv.PreparedCorpus"
#: what a folder whose manifest says so is, when it is not a model qkv serves
_NOT_MODELS = {
    PREPARED_TYPE: "is a prepared corpus (qkv prepare), not a model",
    HF_FOLDER_FORMAT: "is a Hugging Face export, which transformers reads and qkv serve does not",
}


def _not_a_model(sub: Path) -> str | None:
    """What ``sub`` is when it is plainly no model (a prepared corpus, a run with no model
    yet, a folder of none of a model's files), else None."""
    kind = _manifest_type(sub) if (sub / MANIFEST).is_file() else None
    if kind in _NOT_MODELS:
        return _NOT_MODELS[kind]
    if any((sub / mark).exists() for mark in _MODEL_MARKS):
        return None
    if (sub / TRAIN_CONFIG).is_file():
        return "is a training run with no model saved yet"
    return "holds none of a model's files"


def models_in(parent: str | Path, *, engine: str = "qkv") -> list[ModelFolder]:
    """The models inside ``parent`` (``qkv serve --models-dir``), in name order: each
    subfolder :func:`inspect_folder` reads. Anything else is skipped with one log line saying
    what it is (a prepared corpus, a run with no model yet, a model that records no languages,
    an export whose engine is not installed, a folder of no model); hidden entries and files in
    silence.

    Raises:
        SettingError: keyed ``models_dir``: ``parent`` is not a folder, or holds no model that
            can be served (one line naming what each subfolder is; nothing logged).
    """
    from .._deps import MissingDependency

    p = Path(parent)
    if not p.is_dir():
        what = "does not exist" if not p.exists() else "is a file; expected a folder of models"
        raise SettingError("models_dir", f"{str(p)!r} {what}")
    found, skipped = [], []
    for sub in sorted(p.iterdir()):
        if not sub.is_dir() or sub.name.startswith("."):
            continue
        what = _not_a_model(sub)
        if what is None:
            try:
                found.append(inspect_folder(sub, engine=engine))
                continue
            except SettingError as e:
                what = e.problem.removeprefix(f"{str(sub)!r} ")
            except MissingDependency as e:
                what = f"needs what is not installed: {e}"
        skipped.append(f"{str(sub)!r} {what}")
    if not found:
        raise SettingError(
            "models_dir",
            f"{str(p)!r} holds no model folder (each subfolder a qkv run, checkpoint or "
            f"export, a CTranslate2 or an ONNX export){': ' if skipped else ''}"
            + "; ".join(skipped),
        )
    for line in skipped:
        log.warning("qkv serve: --models-dir: skipped %s", line)
    return found


def open_model(
    folder: ModelFolder, *, device: str = "cpu", quantize: str | None = None, threads: int = 0
) -> TextTranslator:
    """The translator of ``folder`` on its engine, opened by
    :func:`qkv.engines.open_translator` (``threads``: a CTranslate2 or ONNX model's CPU
    threads; 0: torch's for CTranslate2, onnxruntime's default for ONNX)."""
    if folder.path is None:
        raise ValueError("folder: a model built in Python has no folder to load")
    return open_translator(
        folder.path, engine=folder.engine, device=device, quantize=quantize, threads=threads
    )


# ---------------------------------------------------------------------------- a lane
class LoadError(RuntimeError):
    """A model could not be loaded when a request asked for it (the cause chained).

    Attributes:
        retry_after: seconds until the model is tried again (its back-off), or until its
            files change.
    """

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


#: after a model failed to load: seconds before it is tried again, doubled on each failure
#: up to :data:`LOAD_BACKOFF_MAX` (sooner when its files change)
LOAD_BACKOFF = 60.0
LOAD_BACKOFF_MAX = 600.0
#: while a failure is remembered, the most often (seconds) its folder's files are looked at
SIGNATURE_EVERY = 1.0
#: the most files a folder's signature looks at (a run folder of many checkpoints)
_SIGNATURE_FILES = 2000


def folder_signature(path: Path | None) -> tuple[tuple[str, int, int], ...]:
    """What a model folder's files are, cheaply: each file's path, size and mtime (ns), up to
    :data:`_SIGNATURE_FILES` of them; a changed, added or removed file changes it."""
    if path is None:
        return ()
    found: list[tuple[str, int, int]] = []
    with contextlib.suppress(OSError):
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(root, name))
                    found.append((os.path.join(root, name), st.st_size, st.st_mtime_ns))
                if len(found) >= _SIGNATURE_FILES:
                    return tuple(found)
    return tuple(found)


@dataclass(frozen=True)
class _Failure:
    """A model's failed load, remembered: not tried again before ``until`` (monotonic
    seconds) unless its files' ``signature`` changes."""

    message: str
    signature: tuple[tuple[str, int, int], ...]
    until: float
    backoff: float


class _Stats:
    """One model's counters (updated by its batch worker, read by ``/metrics``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batch_sentences = Histogram(BATCH_BUCKETS)
        self.seconds = 0.0
        self.tokens = 0

    def batch(self, sentences: int, tokens: int, seconds: float) -> None:
        with self.lock:
            self.batch_sentences.observe(sentences)
            self.seconds += seconds
            self.tokens += tokens


class Lane:
    """One model served: its folder, its translator once loaded, its batcher, its counters.

    Args:
        folder: what the model is (:func:`inspect_folder`).
        load: ``load()`` -> the translator (run off the event loop when the model is first
            asked for, and again after it was unloaded).
        translator: a translator already loaded (such a lane is never unloaded).
    """

    def __init__(
        self,
        folder: ModelFolder,
        load: Callable[[], TextTranslator] | None = None,
        *,
        translator: TextTranslator | None = None,
    ) -> None:
        if load is None and translator is None:
            raise TypeError("Lane: expected load or translator")
        self.folder = folder
        self._load = load
        self.translator: TextTranslator | None = translator
        self.pinned = translator is not None
        self.batcher: Batcher | None = None
        #: the decoding of the requests it serves, once loaded: the model's, as served (the
        #: server's default ``beam_size``, one translation, the batch budget); a request
        #: changes it
        self.decoding: Decoding | None = None
        self.step: int | None = None
        self.resident = translator is not None  # loaded, or being loaded
        self.users = 0  # requests holding the lane
        self.last_used = time.monotonic()
        self.loads = 1 if translator is not None else 0
        self.unloads = 0
        self.stats = _Stats()
        self._lock: asyncio.Lock | None = None
        #: its last failed load while it is remembered (see :meth:`ModelRegistry.acquire`)
        self.failure: _Failure | None = None
        self.failures = 0
        self.files_checked = -math.inf  # when its failure's files were last looked at

    @property
    def pair(self) -> str:
        return self.folder.pair

    @property
    def source(self) -> str:
        return self.folder.source

    @property
    def target(self) -> str:
        return self.folder.target

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def load(self) -> TextTranslator:
        """Load the model (in a worker thread) and read its step; returns the translator."""
        assert self._load is not None  # a pinned lane is never unloaded
        tr = self._load()
        if not isinstance(tr, TextTranslator):
            raise TypeError(f"load: expected a TextTranslator, got {type(tr).__name__}")
        self.translator = tr
        self.loads += 1
        return tr

    def read_step(self) -> None:
        """The update the model's weights come from (None when its folder does not say)."""
        tr = self.translator
        self.step = None
        if tr is not None and tr.path is not None:
            with contextlib.suppress(Exception):
                self.step = int(verify_checkpoint(tr.path, files=[]).get("step") or 0)

    # -- runs in the worker thread
    def decode(self, texts: list[str], decoding: Decoding) -> list[list[tuple[str, float]]]:
        """The batcher's ``decode``: per text (one sentence) its translations, best first,
        ``(text, score)``, as the engine shows them (:meth:`~qkv.inference.TranslatorBase.
        shown_n_best`: no doubled or end spaces; a sentence that reads as nothing as it is);
        those there are none of, scored ``-inf``, left out, the empty one at least."""
        tr = self.translator
        if tr is None:
            raise RuntimeError(f"the {self.pair} model is not loaded")
        shown = tr.shown_n_best(texts, tr.hypotheses(texts, decoding))
        return [[(t, sc) for t, sc in h if sc != -math.inf] or [("", 0.0)] for h in shown]

    def tokens(self, texts: Sequence[str], decoding: Decoding) -> int:
        """The share of a batch's budget ``texts`` take: source tokens (with ``<eos>``) times
        ``decoding.beam_size``."""
        tr = self.translator
        if tr is None:
            raise RuntimeError(f"the {self.pair} model is not loaded")
        return sum(len(tr.encode(t)) for t in texts) * decoding.beam_size

    def health(self, *, full: bool = False) -> dict[str, Any]:
        """``/health``'s entry for this model (``full``: its folders' whole paths, for a
        client holding the key; else their names, :func:`shown_path`)."""
        tr = self.translator
        folder = self.folder.path
        return {
            "pair": self.pair,
            "source": self.source,
            "target": self.target,
            "model_dir": shown_path(folder, full=full),
            "engine": self.folder.engine,
            "bytes": self.folder.size,
            "loaded": tr is not None,
            "path": None if tr is None else shown_path(tr.path, folder, full=full),
            "step": self.step if tr is not None else None,
            "kind": tr.kind if tr is not None else None,
            "device": str(tr.device) if tr is not None else None,
            "beam": self.decoding.beam_size if tr is not None and self.decoding else None,
            "loads": self.loads,
            "unloads": self.unloads,
            "queue_depth": self.batcher.queue_depth if self.batcher is not None else 0,
        }


def shown_path(
    path: str | Path | None, root: str | Path | None = None, *, full: bool = False
) -> str | None:
    """A folder as ``/health`` shows it: its whole path when ``full`` (a client holding the
    server's key); else its part below ``root`` (``final``, ``checkpoints/step_...``) or its
    name, never a directory of the host's."""
    if path is None:
        return None
    p = Path(path)
    if full:
        return str(p)
    if root is not None:
        with contextlib.suppress(ValueError):
            below = p.relative_to(Path(root))
            return below.as_posix() if below.parts else Path(root).name
    return p.name


# ---------------------------------------------------------------------------- routes
@dataclass(frozen=True)
class Route:
    """How ``source`` becomes ``target``: through ``legs`` in order (none: the same language,
    the text as it is; one: a model of the pair; two: through the language ``pivot``)."""

    source: str
    target: str
    legs: tuple[Lane, ...] = field(default=())

    @property
    def pivot(self) -> str | None:
        """The language between the two legs of a pivoted route, else None."""
        return self.legs[0].target if len(self.legs) == 2 else None


def _key(code: str) -> str:
    return code.strip().lower()


# ---------------------------------------------------------------------------- the registry
#: ``make(lane)`` -> the lane's batcher, not started (the app's settings and counters)
BatcherFactory = Callable[[Lane], Batcher]


class ModelRegistry:
    """The lanes of one server, one per ``(source, target)`` pair (see the module's notes).

    Args:
        lanes: the models; two of the same pair are refused.

    The memory cap is the app's setting (:attr:`ServeConfig.memory_cap_mb
    <qkv.serve.ServeConfig>`), given by :meth:`set_memory_cap`.

    Raises:
        SettingError: keyed ``model_dir``: two models of one pair, or none at all.
    """

    def __init__(self, lanes: Sequence[Lane]) -> None:
        if not lanes:
            raise SettingError("model_dir", "expected at least one model, got none")
        self.lanes = list(lanes)
        #: the most bytes of weights the loaded models may take together (None: no cap)
        self.memory_cap: int | None = None
        self.direct: dict[tuple[str, str], Lane] = {}
        for lane in self.lanes:
            key = (_key(lane.source), _key(lane.target))
            if key in self.direct:
                other = self.direct[key].folder.path
                raise SettingError(
                    "model_dir",
                    f"{str(lane.folder.path)!r} translates {lane.source} to {lane.target}, as "
                    f"{str(other)!r} does; serve one model per pair",
                )
            self.direct[key] = lane
        codes = {_key(c): c for lane in self.lanes for c in (lane.source, lane.target)}
        self.codes: dict[str, str] = dict(sorted(codes.items()))
        #: the ``(source, target)`` of a server of one translator (:meth:`of_one`): requests
        #: may leave them out; None for a registry of folders
        self.pair: tuple[str, str] | None = None
        self._make_batcher: BatcherFactory | None = None
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def of_one(cls, translator: TextTranslator, source: str, target: str) -> ModelRegistry:
        """A server of one translator, loaded already (never unloaded), served as translating
        ``source`` into ``target``: a registry of one lane whose pair is :attr:`pair`."""
        folder = ModelFolder(translator.path, source, target, translator.engine, 0)
        registry = cls([Lane(folder, translator=translator)])
        registry.pair = (source, target)
        return registry

    @classmethod
    def from_folders(
        cls,
        folders: Iterable[ModelFolder],
        load: Callable[[ModelFolder], TextTranslator] = open_model,
    ) -> ModelRegistry:
        """A registry of ``folders`` (:func:`inspect_folder`), each loaded by ``load(folder)``
        (default :func:`open_model`) when first asked for."""
        return cls([Lane(f, (lambda f=f: load(f))) for f in folders])

    def set_memory_cap(self, megabytes: float | None) -> None:
        """Cap the loaded models' weights at ``megabytes`` MB (10^6 bytes); None: no cap.

        Raises:
            SettingError: keyed ``memory_cap_mb``: not a number > 0.
        """
        if megabytes is None:
            self.memory_cap = None
            return
        if (
            isinstance(megabytes, bool)
            or not isinstance(megabytes, (int, float))
            or not 0 < megabytes < 1e12
        ):
            raise SettingError("memory_cap_mb", f"expected a number > 0, got {megabytes!r}")
        self.memory_cap = max(1, round(megabytes * 1_000_000))

    # -------------------------------------------------------------- what is served
    @property
    def languages(self) -> list[str]:
        """Every language served (a source or a target of a model), sorted."""
        return list(self.codes.values())

    def targets(self, source: str) -> list[str]:
        """The languages ``source`` reaches: itself, its models' targets, and the targets of
        the models those lead to (one pivot), sorted."""
        s = _key(source)
        direct = {t for (a, t) in self.direct if a == s}
        reach = {s} | direct | {t for (a, t) in self.direct if a in direct}
        return [self.codes[c] for c in sorted(reach) if c in self.codes]

    def languages_answer(self) -> list[dict[str, Any]]:
        """``GET /languages``, LibreTranslate's shape: each language with its name and the
        targets it reaches (itself included, as LibreTranslate lists them)."""
        return [
            {"code": code, "name": display_name(code), "targets": self.targets(code)}
            for code in self.languages
        ]

    def code(self, name: str, value: str) -> str:
        """The served code a request's ``value`` names, BCP 47's way
        (:func:`~qkv.data.languages.match_language`): ``zh-CN`` for ``zh`` when only ``zh-CN``
        is served, ``en`` for ``en-US``; never a Simplified Chinese model for ``zh-TW``,
        ``zh-Hant`` or LibreTranslate's ``zt``.

        Raises:
            SettingError: keyed ``name``, listing the languages served (and, for a script not
                served, the script that is).
        """
        found = match_language(value, self.languages)
        if found is not None:
            return found
        raise SettingError(name, unserved(value, self.languages))

    def route(self, source: str, target: str) -> Route:
        """The lanes from ``source`` to ``target`` (codes as a request gives them).

        Raises:
            SettingError: keyed ``source`` or ``target``: a language not served, or a pair no
                model and no pivot reaches, naming what the source does reach.
        """
        src, tgt = self.code("source", source), self.code("target", target)
        s, t = _key(src), _key(tgt)
        if s == t:
            return Route(src, tgt)
        if (s, t) in self.direct:
            return Route(src, tgt, (self.direct[(s, t)],))
        pivots = sorted(p for (a, p) in self.direct if a == s and p != t and (p, t) in self.direct)
        if pivots:
            p = PREFERRED_PIVOT if PREFERRED_PIVOT in pivots else pivots[0]
            return Route(src, tgt, (self.direct[(s, p)], self.direct[(p, t)]))
        raise SettingError(
            "target",
            f"{tgt!r} is not served from {src!r}: no model translates {src} to {tgt}, directly "
            f"or through another language; from {src} this server translates to "
            f"{', '.join(self.targets(src))} (GET /languages)",
        )

    # -------------------------------------------------------------- loading, unloading
    def attach(self, make_batcher: BatcherFactory) -> None:
        """Give the registry the app's batchers (``make_batcher(lane)``, not started: it sets the
        lane's :attr:`Lane.decoding` too); the lanes loaded already get theirs now."""
        self._make_batcher = make_batcher
        for lane in self.lanes:
            if lane.translator is not None and lane.batcher is None:
                lane.read_step()
                lane.batcher = make_batcher(lane)

    def on_load(self, lane: Lane) -> None:
        """Called (in a worker thread) once a lane's model is loaded: its step and batcher."""
        lane.read_step()
        if self._make_batcher is None:
            raise RuntimeError("the registry has no batchers: attach() it to an app first")
        lane.batcher = self._make_batcher(lane)
        lane.batcher.start()

    @property
    def resident_bytes(self) -> int:
        """What the loaded models (and those being loaded) take, by their weights."""
        return sum(lane.folder.size for lane in self.lanes if lane.resident)

    async def acquire(self, lane: Lane) -> Lane:
        """``lane``, loaded (a model not loaded is loaded off the event loop, after the idle
        models least recently used are unloaded to make room under the cap); it stays loaded
        until :meth:`release`.

        Raises:
            LoadError: the model could not be loaded (the cause chained).
        """
        lane.users += 1
        try:
            if lane.translator is None:
                async with lane.lock:
                    if lane.translator is None:
                        await self._remembered_failure(lane)
                        await self._load(lane)
        except BaseException:
            lane.users -= 1
            raise
        lane.last_used = time.monotonic()
        return lane

    async def _remembered_failure(self, lane: Lane) -> None:
        """Raise the lane's last load failure again while it is remembered: until its back-off
        passes or its folder's files change (read off the event loop), so that requests for a
        broken model do not load (and hash) it each time.

        Raises:
            LoadError: the failure, with the seconds left of the back-off.
        """
        failed = lane.failure
        if failed is None:
            return
        clock = time.monotonic()
        left = failed.until - clock
        if left > 0:
            if clock - lane.files_checked < SIGNATURE_EVERY:  # looked at them a moment ago
                raise LoadError(failed.message, left)
            lane.files_checked = clock
            loop = asyncio.get_running_loop()
            now = await loop.run_in_executor(None, folder_signature, lane.folder.path)
            if now == failed.signature:
                raise LoadError(failed.message, left)
            lane.failures = 0  # its files changed: a new start
        lane.failure = None  # tried again

    async def _load(self, lane: Lane) -> None:
        lane.resident = True  # counted from now: two models loading at once share the cap
        try:
            await self._make_room(keep=lane)
        except BaseException:
            lane.resident = False
            raise
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            await loop.run_in_executor(None, lambda: (lane.load(), self.on_load(lane)))
        except Exception as e:
            lane.resident, lane.translator = False, None
            raise await self._failed(lane, e) from e
        lane.failures = 0
        log.info(
            "qkv serve: loaded %s from %s in %.2f s (%s of weights; %s in memory)",
            lane.pair,
            lane.folder.path,
            time.perf_counter() - t0,
            _mb(lane.folder.size),
            _mb(self.resident_bytes),
        )

    async def _failed(self, lane: Lane, error: Exception) -> LoadError:
        """Remember a failed load (its back-off doubled from the last one, capped), log it in
        one line, and return the error requests get until it is tried again."""
        lane.failures += 1
        backoff = min(LOAD_BACKOFF_MAX, LOAD_BACKOFF * 2 ** min(lane.failures - 1, 16))
        loop = asyncio.get_running_loop()
        signature = await loop.run_in_executor(None, folder_signature, lane.folder.path)
        path = lane.folder.path
        said = str(error) if path is None else str(error).replace(str(path), path.name)
        message = f"the {lane.pair} model could not be loaded: {said}"  # no path of the host's
        lane.failure = _Failure(message, signature, time.monotonic() + backoff, backoff)
        log.error(
            "qkv serve: loading %s (%s) failed: %r; not tried again for %g s, or until its "
            "files change",
            lane.pair,
            path,
            error,
            backoff,
        )
        return LoadError(message, backoff)

    def release(self, lane: Lane) -> None:
        """A request is done with ``lane``; models over the cap that are now idle go."""
        lane.users -= 1
        lane.last_used = time.monotonic()
        if self.memory_cap is not None and self.resident_bytes > self.memory_cap:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule
                task = asyncio.get_running_loop().create_task(self._make_room(keep=None))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _make_room(self, keep: Lane | None) -> None:
        """Unload idle models, least recently used first, until the resident ones fit under
        the cap (``keep``: the model being loaded, never unloaded for itself)."""
        cap = self.memory_cap
        if cap is None:
            return
        while self.resident_bytes > cap:
            idle = [
                x
                for x in self.lanes
                if x.translator is not None and x.users == 0 and not x.pinned and x is not keep
            ]
            if not idle:
                if keep is not None:
                    log.warning(
                        "qkv serve: loading %s goes over --memory-cap-mb (%s loaded, every "
                        "model answering a request)",
                        keep.pair,
                        _mb(self.resident_bytes),
                    )
                return
            if not await self.unload(min(idle, key=lambda x: x.last_used)):
                return  # never spin: an idle lane that does not unload ends the search

    async def unload(self, lane: Lane) -> bool:
        """Unload ``lane`` if it is idle (no request holds it) and not pinned; its batcher
        stops (off the event loop). Returns whether it was unloaded."""
        if lane.translator is None or lane.users or lane.pinned:
            return False
        batcher = lane.batcher
        lane.translator, lane.batcher, lane.resident = None, None, False
        lane.unloads += 1
        log.info("qkv serve: unloaded %s (least recently used)", lane.pair)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: (batcher and batcher.stop(), gc.collect()))
        return True

    def start(self) -> None:
        """Start the batchers of the lanes loaded already (the app's startup)."""
        for lane in self.lanes:
            if lane.batcher is not None:
                lane.batcher.start()

    def stop(self) -> None:
        """Stop every batcher, each finishing what is queued (blocking: the app's shutdown,
        off the event loop)."""
        for lane in self.lanes:
            if lane.batcher is not None:
                lane.batcher.stop()

    # -------------------------------------------------------------- counters
    @property
    def queue_depth(self) -> int:
        return sum(x.batcher.queue_depth for x in self.lanes if x.batcher is not None)

    @property
    def in_progress(self) -> int:
        return sum(x.batcher.in_progress for x in self.lanes if x.batcher is not None)

    def metrics_lines(self) -> list[str]:
        """``/metrics``'s lines of each model, labelled ``pair`` (Prometheus' text format)."""
        out: list[str] = []

        def family(name: str, kind: str, text: str, rows: Iterable[tuple[Lane, float]]) -> None:
            out.extend((f"# HELP {name} {text}", f"# TYPE {name} {kind}"))
            out.extend(f'{name}{{pair="{_esc(x.pair)}"}} {_num(v)}' for x, v in rows)

        lanes = self.lanes
        family("qkv_model_loaded", "gauge", "1 when the model is loaded.",
               ((x, int(x.translator is not None)) for x in lanes))  # fmt: skip
        family("qkv_model_bytes", "gauge", "The model's weights, bytes on disk.",
               ((x, x.folder.size) for x in lanes))  # fmt: skip
        family("qkv_model_loads_total", "counter", "Times the model was loaded.",
               ((x, x.loads) for x in lanes))  # fmt: skip
        family("qkv_model_unloads_total", "counter", "Times it was unloaded to make room.",
               ((x, x.unloads) for x in lanes))  # fmt: skip
        family("qkv_model_queue_depth", "gauge", "Sentences waiting for the model.",
               ((x, x.batcher.queue_depth if x.batcher else 0) for x in lanes))  # fmt: skip
        family("qkv_model_batch_tokens_total", "counter", "Source tokens (times the beam) "
               "the model decoded.", ((x, x.stats.tokens) for x in lanes))  # fmt: skip
        family("qkv_model_decode_seconds_total", "counter", "Time the model spent decoding.",
               ((x, x.stats.seconds) for x in lanes))  # fmt: skip
        out += [
            "# HELP qkv_model_batch_sentences Sentences the model decoded together in one batch.",
            "# TYPE qkv_model_batch_sentences histogram",
        ]
        for x in lanes:
            with x.stats.lock:
                out += x.stats.batch_sentences.lines("qkv_model_batch_sentences", {"pair": x.pair})
        out += [
            "# HELP qkv_models_memory_bytes The loaded models' weights, bytes.",
            "# TYPE qkv_models_memory_bytes gauge",
            f"qkv_models_memory_bytes {self.resident_bytes}",
        ]
        if self.memory_cap is not None:
            out += [
                "# HELP qkv_models_memory_cap_bytes The cap on the loaded models' weights.",
                "# TYPE qkv_models_memory_cap_bytes gauge",
                f"qkv_models_memory_cap_bytes {self.memory_cap}",
            ]
        return out


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
