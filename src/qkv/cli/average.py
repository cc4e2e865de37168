"""``qkv average``: the element-wise mean of the weights of a run's newest checkpoints (or of
the checkpoint folders given), written as a model folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._deps import require
from ._common import check_positive, fail, named_by_flag, user_errors

NAME = "average"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv average``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="average the weights of a run's last checkpoints into a model folder",
        description="Checkpoint averaging (as fairseq's): the element-wise mean of the weights "
        "of the newest --last checkpoints of --model-dir, or of the checkpoint folders given, "
        "written to --out as a model folder that qkv translate and evaluate accept.",
    )
    p.add_argument("--model-dir", help="a qkv train --out folder (or its checkpoints/)")
    p.add_argument("--last", type=int, default=3, help="how many newest checkpoints (default 3)")
    p.add_argument("--out", required=True, help="the folder to write (new or empty)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a model folder qkv wrote to --out before (an average, an export); never "
        "a run, a checkpoint or a run's final/",
    )
    p.add_argument("checkpoints", nargs="*", help="checkpoint folders (instead of --model-dir)")
    p.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    return p


def run(args: argparse.Namespace) -> int:
    """Average the checkpoints the command line names; print what was written."""
    require(f"qkv {NAME}", ["safetensors"])
    from ..inference import RunLayout
    from ..train import CheckpointError
    from ..train.checkpoint import average_checkpoints, find_checkpoints

    try:
        check_positive(args, "last")
        if args.checkpoints:
            folders = [Path(c) for c in args.checkpoints]
        else:
            if args.model_dir is None:
                raise ValueError("--model-dir: expected a run folder (or give checkpoint folders)")
            root = Path(args.model_dir)
            run = RunLayout(root)
            root = run.checkpoints if run.checkpoints.is_dir() else root
            found = find_checkpoints(root)
            if not found:
                raise CheckpointError(f"--model-dir: no checkpoints in {str(root)!r}")
            folders = found[-args.last :]
        path = average_checkpoints(folders, args.out, force=args.force)
    except user_errors() as e:
        return fail(NAME, named_by_flag(e, {"out": "--out"}))
    print(f"averaged {len(folders)} checkpoints ({', '.join(f.name for f in folders)}) -> {path}")
    return 0
