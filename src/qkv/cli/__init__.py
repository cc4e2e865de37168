"""The ``qkv`` command: ``train``, ``translate``, ``evaluate``, ``average``, ``export``, ``serve``
and ``demo``, one module each.

A command module gives ``NAME``, ``add_parser(subparsers)`` (its sub-parser: flags, help) and
``run(args) -> int`` (checks the packages it needs before any work, then parses, calls the
library, prints, and turns a bad input into one line ``qkv NAME: error: --flag: ...``).
:func:`build_parser` assembles them; :func:`main` runs the one asked for with the library's
messages on stderr. What several commands share is in :mod:`qkv.cli._common`.

Building the parser imports no torch: defaults that ``--help`` shows from the library are read
when it shows them (``qkv --help`` starts without torch).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from .._deps import MissingDependency
from . import average, demo, evaluate, export, serve, train, translate
from ._common import logging_to_stderr

__all__ = ["COMMANDS", "build_parser", "main"]

#: the commands, in the order ``qkv --help`` lists them
COMMANDS = {m.NAME: m for m in (train, translate, evaluate, average, export, serve, demo)}


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
    # OpenMP's wait policy stays libgomp's (threads spin a while, then sleep): PASSIVE sped
    # small-model loops up beside a busy process but slowed decoding down as much when the
    # machine was not that busy (benchmarks/threads.py, docs/train.md); a user's
    # OMP_WAIT_POLICY applies because nothing imported before this point loads torch
    args = build_parser().parse_args(argv)
    with logging_to_stderr(getattr(args, "quiet", False)):
        try:
            return int(COMMANDS[args.command].run(args) or 0)
        except MissingDependency as e:  # one line, before any work
            print(e, file=sys.stderr)
            return 1
