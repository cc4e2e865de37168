"""``qkv demo [NAME]``: run one of the demos of :mod:`qkv.demos` (``--list`` shows them); each
demo checks the packages it needs itself."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

NAME = "demo"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv demo``'s sub-parser."""
    p = subparsers.add_parser(NAME, help="run a demo (`qkv demo --list` shows them)")
    p.add_argument("name", nargs="?", help="which demo (default: the main one)")
    p.add_argument("--out", default="demo-out", help="folder for figures (default: demo-out)")
    p.add_argument("--quick", action="store_true", help="a fast, smaller run (for tests)")
    p.add_argument("--list", action="store_true", help="list the demos and exit")
    p.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    return p


def run(args: argparse.Namespace) -> int:
    """List the demos, or run the one named (its exit status)."""
    from .. import demos

    registry = demos.load()
    if args.list:
        for d in sorted(registry.values(), key=lambda d: d.name):
            mark = " (default)" if d.name == demos.DEFAULT else ""
            print(f"{d.name:>20}  {d.help}{mark}")
        return 0
    name = args.name or demos.DEFAULT
    if name not in registry:
        print(
            f"qkv demo: unknown demo {name!r}; choose one of: {', '.join(sorted(registry))}",
            file=sys.stderr,
        )
        return 2
    return int(registry[name].run(Path(args.out), args.quick) or 0)
