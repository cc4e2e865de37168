"""The ``qkv`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__


def _cmd_demo(args: argparse.Namespace) -> int:
    from . import demos

    registry = demos.load()
    name = args.name or demos.DEFAULT
    if name not in registry:
        print(
            f"qkv demo: unknown demo {name!r}; choose one of: {', '.join(sorted(registry))}",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    registry[name].run(out, args.quick)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qkv", description="Attention mechanisms and the Transformer on PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    demo = sub.add_parser("demo", help="run a demo (`qkv demo --list` shows them)")
    demo.add_argument("name", nargs="?", help="which demo (default: the main one)")
    demo.add_argument("--out", default="demo-out", help="folder for figures (default: demo-out)")
    demo.add_argument("--quick", action="store_true", help="a fast, smaller run (for tests)")
    demo.add_argument("--list", action="store_true", help="list the demos and exit")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "list", False):
        from . import demos

        for d in sorted(demos.load().values(), key=lambda d: d.name):
            print(f"{d.name:>20}  {d.help}")
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
