"""``qkv translate``: the arguments, the lines of ``--src FILE`` or of stdin, one output line
per input line, in order (and, with ``--attention``, a figure or page of each sentence's
attention)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from .._deps import require
from .._errors import SettingError
from ._common import (
    add_model_flags,
    check_file_to_write,
    check_positive,
    engine_needs,
    fail,
    load_translator,
)

NAME = "translate"

log = logging.getLogger(__name__)

#: the figure formats of --attention (matplotlib) and the viewer's (no extra package)
_FIGURES, _PAGES = (".png", ".svg", ".pdf"), (".html", ".htm")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv translate``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="translate TEXT arguments, a --src file, or stdin lines",
        description="Translate sentences: the arguments, the lines of --src FILE, or the lines "
        "of stdin (typed at a terminal: each line as it is entered; from a pipe or a file: "
        "batched by --batch-tokens). One output line per input line, in order; a sentence's "
        "translation never depends on the others.",
    )
    add_model_flags(p)
    p.add_argument(
        "--n-best",
        type=int,
        default=1,
        metavar="K",
        help="print K lines per input: INDEX<TAB>SCORE<TAB>TRANSLATION, best first (a blank "
        "line: the empty translation scored 0, then K-1 scored -inf)",
    )
    p.add_argument(
        "--max-output-len",
        "--max-len",
        dest="max_output_len",
        type=int,
        default=None,
        help="most tokens per translation (default: 2 * the sentence's own length + 10)",
    )
    p.add_argument("--src", metavar="FILE", help="translate the lines of FILE (UTF-8)")
    p.add_argument(
        "--output",
        metavar="FILE",
        help="write the translations to FILE, replaced at once when all are done "
        "(default: stdout); never the --src file",
    )
    p.add_argument(
        "--attention",
        metavar="FILE",
        help="draw each sentence's attention to FILE (.png, .svg, .pdf or .html; "
        "several inputs or a terminal: FILE-1.png, FILE-2.png, ...); its folder must exist",
    )
    p.add_argument("--quiet", action="store_true", help="warnings only on stderr, no progress")
    p.add_argument("text", nargs="*", help="sentences (default: --src, else stdin lines)")
    return p


def _attention_path(base: Path, i: int, n: int | None) -> Path:
    """Sentence ``i``'s attention file: ``base`` itself for one sentence, else numbered
    (``n=None``: line by line, the count is not known)."""
    return base if n == 1 else base.with_name(f"{base.stem}-{i + 1}{base.suffix}")


def _check_args(args: argparse.Namespace) -> None:
    """Every flag of ``qkv translate`` checked before the model is loaded."""
    check_positive(args, "beam", "n_best", "max_output_len", "batch_tokens")
    if args.beam is not None and args.n_best > args.beam:
        raise ValueError(f"--n-best: expected at most --beam ({args.beam}), got {args.n_best}")
    if args.attention is not None:
        if Path(args.attention).suffix.lower() not in _FIGURES + _PAGES:
            raise ValueError(
                f"--attention: expected a file ending in .png, .svg, .pdf or .html, got "
                f"{args.attention!r}"
            )
        check_file_to_write("--attention", args.attention)
    if args.src is not None:
        if args.text:
            raise ValueError("--src: give sentences as arguments or in --src FILE, not both")
        if not Path(args.src).is_file():
            raise FileNotFoundError(f"--src: no such file {args.src!r}")
    if args.output is not None:
        out = check_file_to_write("--output", args.output)
        if args.src is not None and (
            out.resolve() == Path(args.src).resolve()
            or (out.exists() and os.path.samefile(out, args.src))
        ):
            raise ValueError(
                f"--output: {args.output!r} is the --src file; the translations would "
                "overwrite their sources (choose another file)"
            )


def _read_lines(stream: TextIO, what: str) -> list[str]:
    try:
        return [line.rstrip("\r\n") for line in stream]
    except UnicodeDecodeError as e:
        raise ValueError(f"{what}: expected UTF-8 text, got {e.reason} at byte {e.start}") from None


def _inputs(args: argparse.Namespace) -> tuple[list[str], bool]:
    """The sentences read up front, and whether stdin is a terminal to read line by line."""
    interactive = not args.text and args.src is None and sys.stdin.isatty()
    if args.text:
        return list(args.text), False
    if args.src is not None:
        with open(args.src, encoding="utf-8") as f:
            return _read_lines(f, "--src"), False
    if not interactive:  # a pipe or a file: read it all, then translate in batches
        return _read_lines(sys.stdin, "stdin"), False
    return [], True


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    """Where translations go: stdout, or ``path`` written atomically (a temporary file in its
    folder, renamed over it when every line is written; removed on an error; the mode the
    user's umask gives: :func:`qkv.inference.writing.atomic_file`)."""
    if path is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    from ..inference.writing import atomic_file

    with atomic_file(path, "w", encoding="utf-8", newline="\n") as f:
        yield f  # type: ignore[misc]


class _Progress:
    """``translated K/N sentences (R sentences/s)`` on stderr, redrawn at most twice a second
    and only once a file has taken half a second (a terminal only; cleared at the end)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.t0 = self.last = time.monotonic()
        self.drawn = False

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last, self.drawn = now, True
        rate = done / max(now - self.t0, 1e-9)
        sys.stderr.write(
            f"\rtranslated {done}/{self.total} sentences ({rate:.1f} sentences/s)\x1b[K"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


class _Writer:
    """Writes each translation (or, with ``--n-best``, its lines) and, with ``--attention``,
    draws the attention of the very translation printed (the best of the n-best)."""

    def __init__(self, tr: Any, args: argparse.Namespace) -> None:
        self.tr, self.lines = tr, args.n_best > 1
        self.attention = None if args.attention is None else Path(args.attention)

    def __call__(self, f: TextIO, i: int, text: str, hyps: Any, n: int | None) -> None:
        """Write ``text``'s hypotheses ``hyps`` (best first): the best, or one line each."""
        dec = self.tr.tgt_tokenizer.decode
        if self.lines:
            for ids, score in hyps:
                f.write(f"{i}\t{float(score):.4f}\t{dec(ids)}\n")
        else:
            f.write(dec(hyps[0][0]) + "\n")
        if self.attention is not None:
            best = hyps[0][0]
            try:
                path = self.tr.attention(text, ids=best).save(_attention_path(self.attention, i, n))
            except SettingError as e:  # the viewer's bound: a page too big to open
                if e.key != "kinds":
                    raise
                raise e.renamed("--attention") from None
            log.info("attention of %r -> %s", text, path)


def run(args: argparse.Namespace) -> int:
    """Translate as the command line says; one output line per input line."""
    figure = Path(args.attention or "").suffix.lower() in _FIGURES
    require(f"qkv {NAME}", [*engine_needs(args), *(["matplotlib"] if figure else [])])
    from ..inference import CheckpointError

    try:
        _check_args(args)
        texts, interactive = _inputs(args)
        if args.attention is not None:
            for i in range(len(texts)):
                check_file_to_write(
                    "--attention", _attention_path(Path(args.attention), i, len(texts))
                )
        tr = load_translator(args)  # its decoding: the model's, changed by the flags
        emit = _Writer(tr, args)
        if not interactive:
            progress = _Progress(len(texts), sys.stderr.isatty() and not args.quiet)
            try:
                res = tr.hypotheses(texts, progress=progress)
            finally:
                progress.close()
            with _output(args.output) as f:
                for i, (text, r) in enumerate(zip(texts, res)):
                    emit(f, i, text, r, len(texts))
        else:  # a terminal: each line translated as it is entered
            with _output(args.output) as f:
                for i, line in enumerate(iter(sys.stdin.readline, "")):
                    text = line.rstrip("\r\n")
                    emit(f, i, text, tr.hypotheses([text])[0], None)
                    f.flush()
    except (ValueError, TypeError, OSError, CheckpointError, ImportError) as e:
        return fail(NAME, e)  # OSError: reading --src, writing --output or a figure
    except KeyboardInterrupt:  # Ctrl-C ends a terminal session; --output is left as it was
        return 130
    return 0
