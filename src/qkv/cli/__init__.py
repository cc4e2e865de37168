"""The ``qkv`` command: ``prepare``, ``train``, ``translate``, ``evaluate``, ``average``,
``export``, ``import``, ``serve`` and ``demo``, one module each (``import_``: ``import`` is a
Python keyword).

A command module gives ``NAME``, ``add_parser(subparsers)`` (its sub-parser: flags, help) and
``run(args) -> int`` (checks the packages it needs before any work, then parses, calls the
library, prints, and turns a bad input into one line ``qkv NAME: error: --flag: ...``).
:func:`build_parser` assembles them; :func:`main` runs the one asked for with the library's
messages on stderr. What several commands share is in :mod:`qkv.cli._common`.

Building the parser imports no torch: defaults that ``--help`` shows from the library are read
when it shows them (``qkv --help`` starts without torch). Before a command that computes starts,
:func:`qkv.runtime.configure_threads` chooses torch's CPU threads and OpenMP's wait from the
machine's state (torch is not loaded yet, so the choice applies), and the command logs it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from .._deps import MissingDependency
from ..runtime import LOOK_S, ThreadChoice, configure_threads
from . import average, demo, evaluate, export, import_, prepare, serve, train, translate
from ._common import logging_to_stderr

__all__ = ["COMMANDS", "build_parser", "main"]

#: the commands, in the order ``qkv --help`` lists them
COMMANDS = {
    m.NAME: m for m in (prepare, train, translate, evaluate, average, export, import_, serve, demo)
}
#: the commands whose threads are chosen from the machine's state, and the level their choice
#: is logged at (``translate`` prints translations: its line is for --verbose readers; ``prepare``
#: times a model on them only with ``--max-minutes``)
THREADED = {
    "prepare": logging.DEBUG,
    "train": logging.INFO,
    "evaluate": logging.INFO,
    "serve": logging.INFO,
    "demo": logging.INFO,
    "translate": logging.DEBUG,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``qkv``: one sub-parser per command of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="qkv", description="Attention mechanisms and the Transformer on PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``qkv ARGV`` (default: ``sys.argv[1:]``); the exit status."""
    args = build_parser().parse_args(argv)
    # nothing imported so far loads torch: the threads and OpenMP's wait are still to choose
    choice = _choose_threads(args)
    first = None
    if choice is not None:  # said with the command's first message: an error stays one line
        first = _thread_lines(choice, THREADED[args.command] if choice.applied else logging.DEBUG)
    with logging_to_stderr(getattr(args, "quiet", False), first):
        try:
            return int(COMMANDS[args.command].run(args) or 0)
        except MissingDependency as e:  # one line, before any work
            print(e, file=sys.stderr)
            return 1


def _thread_lines(choice: ThreadChoice, level: int) -> Callable[[bool], list[tuple[int, str]]]:
    """The threads' line at ``level`` and a warning line for each count of the user's not used
    as given. Written with the command's first message (``working``: torch is loaded then, the
    command needs it next, so the count said is the one torch runs), or at its end."""

    def lines(working: bool) -> list[tuple[int, str]]:
        if working and choice.applied and "torch" not in sys.modules:
            import torch  # noqa: F401  (the choice is in the environment: torch starts with it)
        return [(level, choice.describe()), *((logging.WARNING, w) for w in choice.warnings())]

    return lines


def _choose_threads(args: argparse.Namespace) -> ThreadChoice | None:
    """The threads of a command of :data:`THREADED`, chosen before torch loads (None for the
    others). Where torch is loaded already (``main`` called by a program that uses torch), its
    threads are that program's: nothing is looked at or changed."""
    if args.command not in THREADED:
        return None
    threads = getattr(args, "threads", None)
    given = threads if isinstance(threads, int) and threads > 0 else None
    return configure_threads(given, look=0 if "torch" in sys.modules else LOOK_S)
