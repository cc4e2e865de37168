"""``qkv translate``: the arguments, the lines of ``--src FILE`` or of stdin, one output line
per input line, in order, each line a paragraph cut into sentences (``--split none``: one
sentence) with its layout kept (and, with ``--attention``, a figure or page of each line's
attention); or a document (``--format``, or ``--src`` by its extension: HTML, subtitles,
catalogs, office files, Markdown) translated into ``--output`` with everything but its text
kept."""

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
from ..text.layout import DEFAULT_SPLIT, SPLITS
from ._common import (
    add_model_flags,
    check_file_to_write,
    check_positive,
    engine_needs,
    fail,
    load_translator,
    named_by_flag,
    with_default,
)

NAME = "translate"

log = logging.getLogger(__name__)

#: the figure formats of --attention (matplotlib) and the viewer's (no extra package)
_FIGURES, _PAGES = (".png", ".svg", ".pdf"), (".html", ".htm")
#: the document formats of --format (qkv.text.FORMATS, listed here so --help loads nothing)
DOCUMENTS = ("html", "srt", "vtt", "po", "xliff", "docx", "odt", "md")
#: what each document format needs installed beyond the engine
_DOCUMENT_NEEDS = {
    "po": ["translate"],
    "xliff": ["translate"],
    "docx": ["docx"],
    "odt": ["odfdo"],
    "md": ["markdown_it"],
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv translate``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="translate TEXT arguments, a --src file, or stdin lines",
        description="Translate text: the arguments, the lines of --src FILE, or the lines "
        "of stdin (typed at a terminal: each line as it is entered; from a pipe or a file: "
        "batched by --batch-tokens). Each line is a paragraph: its sentences translated one "
        "by one (--split none: the line is one sentence) and joined, its indentation and "
        "blank lines kept; one output line per input line, in order; a sentence's "
        "translation never depends on the others. A document (--src FILE.html, .srt, .vtt, "
        ".po, .pot, .xliff, .docx, .odt, .md, or --format) is translated into --output with "
        "its markup, timings, catalog entries or formatting kept.",
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
    p.add_argument(
        "--split",
        choices=SPLITS,
        default=None,
        help=with_default(
            "how a line is cut: sentences (the model's source language's segmenter), or "
            "none (the line is one sentence, for test sets cut into sentences already)",
            lambda: DEFAULT_SPLIT,
        ),
    )
    p.add_argument(
        "--format",
        choices=("text", *DOCUMENTS),
        default=None,
        help="what the input is: text (lines; the default, and a .txt --src), or a document "
        "format, translated whole into --output or stdout (default: --src's extension)",
    )
    p.add_argument(
        "--src",
        metavar="FILE",
        help="translate the lines of FILE (UTF-8), or the document FILE by its extension",
    )
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


def _document_format(args: argparse.Namespace) -> str | None:
    """The document format of this run (None: lines of text): ``--format``, else the
    extension of ``--src`` when it names a document format (a ``.txt`` file is lines)."""
    if args.format is not None:
        return None if args.format == "text" else args.format
    if args.src is None:
        return None
    from ..text import format_of

    try:
        fmt = format_of(args.src)
    except SettingError:  # any other extension: lines of text
        return None
    return None if fmt == "txt" else fmt


def _check_document(args: argparse.Namespace, fmt: str) -> None:
    """The flags of a document run: no --n-best or --attention; binary formats need
    --output."""
    if args.n_best != 1:
        raise ValueError(f"--n-best: expected 1 for a {fmt} document, got {args.n_best}")
    if args.attention is not None:
        raise ValueError(f"--attention: lines of text only, not a {fmt} document")
    if fmt in ("docx", "odt") and args.output is None:
        raise ValueError(f"--output: a {fmt} document is written to a file; name one")


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
    """Writes each line's translation (or, with ``--n-best``, its lines) and, with
    ``--attention``, draws the attention of the very translation printed (the best of the
    n-best), sentence by sentence for a line of several."""

    def __init__(self, tr: Any, args: argparse.Namespace) -> None:
        self.tr, self.lines, self.n_best = tr, args.n_best > 1, args.n_best
        self.attention = None if args.attention is None else Path(args.attention)

    def __call__(self, f: TextIO, first: int, plan: Any, hyps: list[Any], n: int | None) -> None:
        """Write every text of ``plan``, numbered from ``first``, from the hypotheses ``hyps``
        of every segment of the plan (best first): its best, or one line each."""
        if self.lines:
            ranked = plan.join_hypotheses(self.tr.shown_n_best(plan.segments, hyps), self.n_best)
            for k, texts in enumerate(ranked):
                f.writelines(f"{first + k}\t{score:.4f}\t{text}\n" for text, score in texts)
        else:
            f.writelines(text + "\n" for text in plan.join(self.tr.shown(plan.segments, hyps)))
        if self.attention is not None:
            for k in range(len(plan.texts)):
                self._draw(self.attention, first + k, plan, hyps, n, k)

    def _draw(self, where: Path, i: int, plan: Any, hyps: list[Any], n: int | None, k: int) -> None:
        """Draw at ``where`` the attention of text ``k`` of ``plan`` (numbered ``i`` of
        ``n``), a figure per sentence of it."""
        slots = plan.slots(k)
        for m, slot in enumerate(slots):
            text, best = plan.segments[slot.segment], hyps[slot.segment][0][0]
            path = _attention_path(where, i, n)
            if len(slots) > 1:
                path = path.with_name(f"{path.stem}.{m + 1}{path.suffix}")
            try:
                path = self.tr.attention(text, ids=best).save(path)
            except SettingError as e:  # the viewer's bound: a page too big to open
                if e.key != "kinds":
                    raise
                raise e.renamed("--attention") from None
            log.info("attention of %r -> %s", text, path)


def _split(args: argparse.Namespace) -> dict[str, str]:
    """``split=`` as --split gives it (not given: the library's default)."""
    return {} if args.split is None else {"split": args.split}


def _translate_lines(tr: Any, args: argparse.Namespace, texts: list[str]) -> None:
    """Every line of ``texts`` as a paragraph: all their sentences in one plan, one output
    line per input line."""
    emit = _Writer(tr, args)
    plan = tr.plan(texts, **_split(args))
    progress = _Progress(len(plan.segments), sys.stderr.isatty() and not args.quiet)
    try:
        res = tr.plan_hypotheses(plan, progress=progress)
    finally:
        progress.close()
    with _output(args.output) as f:
        emit(f, 0, plan, res, len(texts))


def _translate_document(tr: Any, args: argparse.Namespace, fmt: str) -> None:
    """The document of ``--src`` (or stdin) in format ``fmt`` into ``--output`` (or stdout)."""
    from ..text import translate_document

    data = Path(args.src).read_bytes() if args.src else sys.stdin.buffer.read()
    out = translate_document(data, tr, fmt, **_split(args))
    if args.output is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
        return
    from .._atomic import atomic_file

    with atomic_file(args.output, "wb") as f:
        f.write(out)


def run(args: argparse.Namespace) -> int:
    """Translate as the command line says: one output line per input line, or a document."""
    figure = Path(args.attention or "").suffix.lower() in _FIGURES
    fmt = _document_format(args)
    needs = _DOCUMENT_NEEDS.get(fmt or "", [])
    require(f"qkv {NAME}", [*engine_needs(args), *(["matplotlib"] if figure else []), *needs])
    from ..inference import CheckpointError

    try:
        _check_args(args)
        if fmt is not None:
            _check_document(args, fmt)
            tr = load_translator(args)
            _translate_document(tr, args, fmt)
            return 0
        texts, interactive = _inputs(args)
        if args.attention is not None:
            for i in range(len(texts)):
                check_file_to_write(
                    "--attention", _attention_path(Path(args.attention), i, len(texts))
                )
        tr = load_translator(args)  # its decoding: the model's, changed by the flags
        if not interactive:
            _translate_lines(tr, args, texts)
        else:  # a terminal: each line translated as it is entered
            emit = _Writer(tr, args)
            with _output(args.output) as f:
                for i, line in enumerate(iter(sys.stdin.readline, "")):
                    plan = tr.plan([line.rstrip("\r\n")], **_split(args))
                    emit(f, i, plan, tr.plan_hypotheses(plan), None)
                    f.flush()
    except SettingError as e:
        return fail(NAME, named_by_flag(e, _TEXT_FLAGS))
    except (ValueError, TypeError, OSError, CheckpointError, ImportError) as e:
        return fail(NAME, e)  # OSError: reading --src, writing --output or a figure
    except KeyboardInterrupt:  # Ctrl-C ends a terminal session; --output is left as it was
        return 130
    return 0


#: the library's names of qkv.text's settings -> the flags that give them (a file its format's
#: reader cannot read: --src)
_TEXT_FLAGS = {"split": "--split", "format": "--format", "file": "--src", "out": "--output"}
