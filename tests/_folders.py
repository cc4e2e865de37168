"""What the tests of model folders share: a hostile edit (a file replaced and the manifest
rewritten to match), the modes of a folder's files, its size, a command run quietly in this
process, a command's one-line error, a figure that is not blank."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def tamper(folder: Path, rel: str, data: bytes) -> None:
    """Replace file ``rel`` of ``folder`` and rewrite the manifest to match (what a hostile
    edit does: the manifest then vouches for the new content)."""
    (folder / rel).write_bytes(data)
    m = json.loads((folder / "manifest.json").read_text())
    m["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(m))


def tamper_json(folder: Path, rel: str, **changes: object) -> None:
    """:func:`tamper` of JSON file ``rel``: its top-level ``changes`` applied."""
    data = json.loads((folder / rel).read_text())
    data.update(changes)
    tamper(folder, rel, json.dumps(data).encode())


def flip(path: Path, offset: int = 0, n: int = 4096) -> None:
    """Flip ``n`` bytes of ``path`` from ``offset`` (damage; the manifest left as it was)."""
    data = bytearray(path.read_bytes())
    end = min(len(data), offset + n)
    data[offset:end] = bytes(b ^ 0xFF for b in data[offset:end])
    path.write_bytes(bytes(data))


def modes(folder: Path) -> dict[str, int]:
    """``relative path -> permission bits`` of ``folder`` and everything in it (what ``ls -l``
    shows)."""
    found = {".": stat.S_IMODE(folder.stat().st_mode)}
    for p in folder.rglob("*"):
        found[p.relative_to(folder).as_posix()] = stat.S_IMODE(p.stat().st_mode)
    return found


def expected_modes(folder: Path, mask: int) -> dict[str, int]:
    """What :func:`modes` gives for a folder written under umask ``mask``."""
    return {rel: (0o777 if (folder / rel).is_dir() else 0o666) & ~mask for rel in modes(folder)}


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """Run with the process's umask set to ``mask`` (restored after)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def one_line(err: str, command: str) -> str:
    """``err`` (a command's stderr), checked to be one line ``qkv COMMAND: error: ...`` without
    a traceback; returned."""
    assert err.startswith(f"qkv {command}: error: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def folder_size(folder: Path) -> int:
    """The bytes of every file under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def cli_here(*args: str) -> tuple[int, str, str]:
    """``qkv ARGS`` in this process (``qkv.cli.main``): its exit status (argparse's usage
    errors included), stdout and stderr."""
    from qkv.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def quiet_cli(*args: str) -> tuple[int, str, str]:
    """``qkv ARGS --quiet`` in this process: its exit status, stdout and stderr."""
    return cli_here(*args, "--quiet")


def assert_not_blank_png(path: Path, min_side: int = 100):
    """``path`` is an image over ``min_side`` pixels a side whose pixels vary (a figure, not a
    blank); returns its RGB pixels, ``(H, W, 3)`` floats, for a caller's further checks."""
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(path).convert("RGB"), dtype=float)
    assert img.shape[0] > min_side and img.shape[1] > min_side, (path, img.shape)
    assert img.std() > 10, f"{path} looks blank (pixel std {img.std():.1f})"
    return img
