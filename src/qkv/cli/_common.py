"""What several commands of ``qkv`` share.

* one-line errors (:func:`fail`), the flag named from the error's key (:func:`named_by_flag`);
* help texts whose defaults are read from the library when ``--help`` shows them
  (:class:`DeferredHelp`);
* the model and decoding flags of ``translate``, ``evaluate`` and ``serve``, and the translator
  they load (:func:`load_translator`);
* file checks, and the library's messages on stderr while a command runs.

Nothing here imports torch when it is imported: ``qkv --help`` starts without it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from .._errors import SettingError, renamed, setting_of


# ---------------------------------------------------------------------------- errors
def user_errors(*extra: type[BaseException]) -> tuple[type[BaseException], ...]:
    """What a command reports as one line: bad input, a missing file or package, a damaged
    checkpoint, a full disk, and ``extra`` (imported when a command runs, not for ``--help``)."""
    from ..inference import CheckpointError
    from ..inference.writing import NoSpaceError

    base = (ValueError, TypeError, FileNotFoundError, CheckpointError, ImportError, NoSpaceError)
    return (*base, *extra)


def fail(command: str, err: BaseException) -> int:
    """Print ``qkv COMMAND: error: MESSAGE`` on stderr; the exit status: 2 for bad input (a
    value, a type, a missing file), else 1."""
    print(f"qkv {command}: error: {err}", file=sys.stderr)
    return 1 if not isinstance(err, (ValueError, TypeError, FileNotFoundError)) else 2


def flag(dest: str) -> str:
    """The flag of an argparse destination or a library key: ``max_chars`` -> ``--max-chars``."""
    return "--" + dest.replace("_", "-")


def named_by_flag(err: BaseException, flags: Mapping[str, str]) -> BaseException:
    """``err`` naming the flag the user typed: an error about a setting (a
    :class:`~qkv._errors.SettingError`, or an error of another kind the library made with
    :func:`~qkv._errors.keyed`: a missing file, a damaged checkpoint, a run folder in use) whose
    ``key`` ``flags`` maps (library key -> flag) is renamed, its type kept; anything else is
    returned as it is, whatever its message says (a message is never read for a key)."""
    setting = setting_of(err)
    if setting is None or setting[0] not in flags:
        return err
    return renamed(err, flags[setting[0]])


# ---------------------------------------------------------------------------- help texts
class DeferredHelp:
    """A flag's help text, built by ``text()`` when ``--help`` shows it.

    The defaults it names come from the library's configuration (``TrainConfig``,
    ``Decoding``, ``ServeConfig``), typed once there; reading some of them imports torch, which
    building the parser (``qkv --help``, or any command) does not pay. argparse formats it as
    it formats a help string (``help % params``); ``%`` in the text is shown as it is.
    """

    def __init__(self, text: Callable[[], str]) -> None:
        self._text = text

    def __str__(self) -> str:
        return self._text().replace("%", "%%")

    def __mod__(self, params: Mapping[str, Any]) -> str:
        return str(self) % params

    def __contains__(self, part: str) -> bool:
        return part in str(self)

    def strip(self) -> str:
        return str(self).strip()


def with_default(text: str, default: Callable[[], object]) -> DeferredHelp:
    """``text (default: D)``, ``D`` read by ``default()`` when the help is shown (a float
    without its trailing ``.0``: ``5``, not ``5.0``)."""

    def shown() -> str:
        value = default()
        written = f"{value:g}" if isinstance(value, float) else str(value)
        return f"{text} (default: {written})"

    return DeferredHelp(shown)


# ---------------------------------------------------------------------------- model flags
#: the decoding flags named otherwise than the Decoding option they set (``--length-penalty``
#: sets ``length_penalty``, and so on for the others)
DECODING_RENAMED = {"beam": "beam_size", "batch_tokens": "max_tokens"}


def _decoding_default(name: str) -> Any:
    from ..inference import Decoding

    return getattr(Decoding(), name)


def add_decoding_flags(
    p: argparse.ArgumentParser,
    *,
    beam: str = "beam size (default: the model's, chosen on validation by qkv train; else 1)",
    length_penalty: str = "beam length penalty (default: the model's, else 1.0)",
    no_repeat_ngram: str = "never repeat an N-gram of pieces in a translation (0: off; default: "
    "the model's, 3 for a qkv train run, else 0)",
) -> None:
    """``--beam``, ``--length-penalty``, ``--no-repeat-ngram``: None when not given (the model's
    decoding stays), with these help texts."""
    p.add_argument("--beam", type=int, default=None, help=beam)
    p.add_argument("--length-penalty", type=float, default=None, help=length_penalty)
    p.add_argument("--no-repeat-ngram", type=int, default=None, metavar="N", help=no_repeat_ngram)


def add_engine_flags(
    p: argparse.ArgumentParser,
    *,
    quantize: str = "int8: dynamic int8 linear layers (CPU only; faster, translations may differ "
    "slightly); with --engine ctranslate2: CTranslate2's int8 compute type",
    engine: str = "qkv (default), or ctranslate2: translate through the CTranslate2 model that "
    "qkv export --format ctranslate2 wrote in --model-dir (needs qkv[ct2])",
) -> None:
    """``--device``, ``--quantize``, ``--engine``, with these help texts."""
    p.add_argument("--device", default="cpu", help="cpu (default), auto, cuda, cuda:N")
    p.add_argument("--quantize", choices=("int8",), default=None, help=quantize)
    p.add_argument("--engine", choices=("qkv", "ctranslate2"), default="qkv", help=engine)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``translate`` and ``evaluate`` that pick the model and how it decodes."""
    p.add_argument(
        "--model-dir",
        required=True,
        help="a qkv train --out folder (its final model, else its best checkpoint) or a "
        "checkpoint or model folder",
    )
    add_decoding_flags(p)
    add_engine_flags(p)
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        metavar="N",
        help=with_default(
            "source tokens per batch (times the beam), sentences sorted by length",
            lambda: _decoding_default("max_tokens"),
        ),
    )


def engine_needs(args: argparse.Namespace) -> list[str]:
    """The optional module the chosen ``--engine`` loads a model with."""
    return ["ctranslate2"] if args.engine == "ctranslate2" else ["safetensors"]


def with_decoding_flags(tr: Any, args: argparse.Namespace) -> Any:
    """``tr`` with the decoding flags given over its model's decoding (a flag not given, None,
    keeps the model's; ``--batch-tokens`` not given is Decoding's own budget, as its help says);
    an option out of range is named by its flag."""
    from ..inference import Decoding

    options = {f.name: f.name for f in dataclasses.fields(Decoding)} | DECODING_RENAMED
    given = {key: getattr(args, dest) for dest, key in options.items() if hasattr(args, dest)}
    if "max_tokens" in given and given["max_tokens"] is None:
        given["max_tokens"] = Decoding().max_tokens
    try:
        return tr.with_decoding(**given)
    except SettingError as e:
        raise named_by_flag(e, {key: flag(dest) for dest, key in options.items()}) from None


def load_translator(
    args: argparse.Namespace, folder: str | None = None, engine: str | None = None
) -> Any:
    """The translator of ``--model-dir`` (or ``folder``) on ``--engine`` (or ``engine``),
    opened by :func:`qkv.engines.open_translator` with ``--quantize``, ``--device`` and
    ``--threads`` where the command has it: a :class:`qkv.inference.TextTranslator`, its
    decoding the model's changed by the flags; what the engine refuses is named by its flag."""
    from ..engines import folder_engine, open_translator

    engine = args.engine if engine is None else engine
    # an ONNX export (or a bare CTranslate2 model) runs on its own engine, as qkv serve runs it
    engine = folder_engine(args.model_dir if folder is None else folder, engine)
    if engine == "ctranslate2" and getattr(args, "attention", None) is not None:
        raise ValueError("--attention: needs --engine qkv (CTranslate2 returns no weights)")
    if engine == "qkv" and args.quantize is not None and args.device != "cpu":
        raise ValueError(
            f"--quantize: {args.quantize} runs on the CPU only (torch's dynamic "
            f"quantization), got --device {args.device}"
        )
    try:
        tr = open_translator(
            args.model_dir if folder is None else folder,
            engine=engine,
            device=args.device,
            quantize=args.quantize,
            threads=getattr(args, "threads", 0),
        )
    except SettingError as e:  # what CTranslate2 refuses is said as the engine's
        if e.key != "device" or engine != "ctranslate2":
            raise
        raise SettingError(e.key, f"--engine ctranslate2 {e.problem}").renamed("--device") from None
    return with_decoding_flags(tr, args)


# ---------------------------------------------------------------------------- checks
def check_positive(args: argparse.Namespace, *names: str) -> None:
    """ValueError naming the flag when one of ``names`` is given and below 1."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"{flag(name)}: expected >= 1, got {value}")


def check_file_to_write(flag_name: str, path: str | Path) -> Path:
    """``path`` as a file this command may write, or a one-line ValueError naming
    ``flag_name``: not a folder, not under a file, in a folder that exists (nothing is created
    silently)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag_name}: {str(p)!r} is a folder; expected a file name")
    for folder in (p.parent, *p.parent.parents):
        if folder.exists():
            break
    if not folder.is_dir():
        raise ValueError(f"{flag_name}: {str(folder)!r} is a file, not a folder (in {str(p)!r})")
    if folder != p.parent:
        raise ValueError(
            f"{flag_name}: the folder {str(p.parent)!r} does not exist; create it first"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag_name}: cannot write in the folder {str(folder)!r}")
    return p


# ---------------------------------------------------------------------------- logging
class _CliHandler(logging.StreamHandler):
    """``qkv: message`` on the stderr of the moment (tests swap sys.stderr between calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("qkv: %(message)s"))

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ sets it
        pass


@contextlib.contextmanager
def logging_to_stderr(
    quiet: bool, first: Callable[[bool], list[tuple[int, str]]] | None = None
) -> Iterator[None]:
    """While a command runs: the library's messages (the ``qkv`` loggers) on stderr, INFO and
    up (``--quiet``: WARNING); the logger is left as it was afterwards. ``first(working)``: the
    ``(level, message)`` lines shown just before the command's first message (``working``
    True; those whose level is shown), so that a command that fails before any work (a missing
    package, a bad flag) still prints its one line only; its warnings are shown at the end
    (``working`` False) when nothing else was."""
    top = logging.getLogger("qkv")
    handler, level = _CliHandler(), top.level
    lines = None if first is None else _FirstLine(handler, first)
    if lines is not None:
        handler.addFilter(lines)
    top.addHandler(handler)
    top.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        if lines is not None:
            lines.flush(logging.WARNING, working=False)
        top.removeHandler(handler)
        top.setLevel(level)


class _FirstLine(logging.Filter):
    """Shows the lines of ``lines(working)`` (each ``(level, message)``, logger
    ``qkv.runtime``) once, just before the first record its handler shows."""

    def __init__(self, handler: logging.Handler, lines: Callable[[bool], list[tuple[int, str]]]):
        super().__init__()
        self.handler, self.pending = handler, lines

    def flush(self, at_least: int = logging.NOTSET, working: bool = True) -> None:
        """Show the pending lines of level ``at_least`` and up (once)."""
        if self.pending is None:
            return
        lines, self.pending = self.pending(working), None
        for level, message in lines:
            if level >= at_least and logging.getLogger("qkv.runtime").isEnabledFor(level):
                line = logging.LogRecord("qkv.runtime", level, __file__, 0, message, None, None)
                self.handler.emit(line)

    def filter(self, record: logging.LogRecord) -> bool:
        self.flush()
        return True
