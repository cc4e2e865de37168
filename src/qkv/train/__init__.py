"""Training translation models: the loop, schedules, losses, checkpoints and DDP.

``qkv train`` is :func:`train` with a :class:`TrainConfig`; see ``docs/train.md``. The package
holds one idea a module: the settings (:mod:`~qkv.train.config`, :mod:`~qkv.train.presets`), the
run's data (:mod:`~qkv.train.run_data`), its preparation (:mod:`~qkv.train.prepare`,
:mod:`~qkv.train.init_from`), its plan (:mod:`~qkv.train.plan`), one update
(:mod:`~qkv.train.update`, :mod:`~qkv.train.losses`, :mod:`~qkv.train.schedules`), validation
(:mod:`~qkv.train.validation`), the loop (:mod:`~qkv.train.loop`) and what it keeps
(:mod:`~qkv.train.state`, :mod:`~qkv.train.rng`, :mod:`~qkv.train.checkpoint`), its end
(:mod:`~qkv.train.finish`), and around it the progress line (:mod:`~qkv.train.progress`), the
lock (:mod:`~qkv.train.runlock`), signals (:mod:`~qkv.train.interrupt`) and several processes
(:mod:`~qkv.train.distributed`).
"""

from .checkpoint import (
    CheckpointError,
    load_checkpoint,
    resolve_model_dir,
    save_checkpoint,
    verify_checkpoint,
)
from .config import (
    RESUMABLE_KEYS,
    TrainConfig,
    load_config_file,
    parse_assignment,
    required_modules,
)
from .interrupt import TrainingInterrupted
from .loop import TrainResult, train
from .losses import sequence_loss
from .plan import Plan
from .run_data import RunData, load_run_data, saved_run_pairs
from .runlock import RunLockedError
from .schedules import InverseSqrtSchedule, inverse_sqrt_lr
from .update import StepStats, TrainingError, make_optimizer, train_update

__all__ = [
    "RESUMABLE_KEYS",
    "CheckpointError",
    "InverseSqrtSchedule",
    "Plan",
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
    "required_modules",
    "resolve_model_dir",
    "save_checkpoint",
    "saved_run_pairs",
    "sequence_loss",
    "train",
    "train_update",
    "verify_checkpoint",
]
