"""Training translation models: the loop, schedules, losses, checkpoints and DDP.

``qkv train`` is :func:`train` with a :class:`TrainConfig`; see ``docs/train.md``.
"""

from .checkpoint import (
    CheckpointError,
    load_checkpoint,
    resolve_model_dir,
    save_checkpoint,
    verify_checkpoint,
)
from .config import RESUMABLE_KEYS, TrainConfig, load_config_file, parse_assignment
from .interrupt import TrainingInterrupted
from .loop import (
    RunData,
    StepStats,
    TrainingError,
    TrainResult,
    load_run_data,
    make_optimizer,
    saved_run_pairs,
    train,
    train_update,
)
from .losses import sequence_loss
from .runlock import RunLockedError
from .schedules import InverseSqrtSchedule, inverse_sqrt_lr

__all__ = [
    "RESUMABLE_KEYS",
    "CheckpointError",
    "InverseSqrtSchedule",
    "RunData",
    "RunLockedError",
    "StepStats",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "TrainingInterrupted",
    "inverse_sqrt_lr",
    "load_checkpoint",
    "load_config_file",
    "load_run_data",
    "make_optimizer",
    "parse_assignment",
    "resolve_model_dir",
    "save_checkpoint",
    "saved_run_pairs",
    "sequence_loss",
    "train",
    "train_update",
    "verify_checkpoint",
]
