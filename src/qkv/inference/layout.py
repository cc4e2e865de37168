"""Where things are in a run folder (the ``--out`` of ``qkv train``): every name in one place.

A run folder ``OUT`` holds::

    OUT/.lock                          the running trainer's lock file (qkv.train.runlock)
    OUT/checkpoints/step-00001200/     one checkpoint (a model folder with training state)
    OUT/checkpoints/best.json          which checkpoint has the best validation BLEU
    OUT/final/                         the model to use (averaged, decoding chosen)
    OUT/tensorboard/                   TensorBoard's event files (``tensorboard=true``)

Training writes these and everything that uses a run (loading, averaging, exporting, the lock
checks) reads them through this module: :class:`RunLayout` for a run folder, and, for a
checkpoints folder met on its own (``qkv average`` of a bare folder of ``step-*``),
:func:`step_name`, :func:`step_of` and :data:`BEST_POINTER`. The names of what one model folder
holds inside (``manifest.json``, the weights, ...) are :mod:`qkv._folder`'s, and reading them is
:mod:`qkv.inference.saved`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BEST_POINTER",
    "CHECKPOINTS_DIR",
    "FINAL_DIR",
    "LOCK_NAME",
    "STEP_DIR",
    "TENSORBOARD_DIR",
    "RunLayout",
    "step_name",
    "step_of",
]

#: the folder of a run's checkpoints
CHECKPOINTS_DIR = "checkpoints"
#: the pointer, inside the checkpoints folder, to the checkpoint of the best validation BLEU
BEST_POINTER = "best.json"
#: a run's final model folder
FINAL_DIR = "final"
#: the lock file a running trainer holds in its run folder
LOCK_NAME = ".lock"
#: TensorBoard's folder in a run folder
TENSORBOARD_DIR = "tensorboard"
#: the name of a checkpoint folder: ``step-`` and the update, 8 digits at least
STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_name(step: int) -> str:
    """The folder name of the checkpoint of update ``step`` (``step-00001200``).

    Raises:
        ValueError: ``step`` is not an int >= 0.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step: expected an update number (an int >= 0), got {step!r}")
    return f"step-{step:08d}"


def step_of(path: str | Path) -> int | None:
    """The update a checkpoint folder's name says (``.../step-00001200`` -> 1200), or None
    when the name is not a checkpoint's (its manifest, not its name, is what a reader trusts
    for the step of a folder it was handed)."""
    m = STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RunLayout:
    """The paths of run folder ``out`` (nothing is read or created here).

    Attributes:
        out: the run folder.
    """

    out: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))

    @property
    def checkpoints(self) -> Path:
        """``OUT/checkpoints``: the ``step-*`` folders and ``best.json``."""
        return self.out / CHECKPOINTS_DIR

    def step_dir(self, step: int) -> Path:
        """``OUT/checkpoints/step-XXXXXXXX``, the checkpoint of update ``step``."""
        return self.checkpoints / step_name(step)

    @property
    def best_pointer(self) -> Path:
        """``OUT/checkpoints/best.json``."""
        return self.checkpoints / BEST_POINTER

    @property
    def final(self) -> Path:
        """``OUT/final``, the model to use."""
        return self.out / FINAL_DIR

    @property
    def lock(self) -> Path:
        """``OUT/.lock``, the running trainer's lock file."""
        return self.out / LOCK_NAME

    @property
    def tensorboard(self) -> Path:
        """``OUT/tensorboard``."""
        return self.out / TENSORBOARD_DIR
