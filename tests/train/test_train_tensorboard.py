"""TensorBoard after a resume: the events a killed invocation logged past the checkpoint it is
resumed from are purged, so every step shows once."""

from __future__ import annotations

import importlib.util
import shutil
from collections import Counter

import pytest
from _train_helpers import tiny_config

from qkv.train import train

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="tensorboard is not installed (pip install tensorboard): the purge cannot be read back",
)


def test_a_resumed_run_shows_every_step_once(tmp_path, corpus_file):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_config(
        data=str(corpus_file), max_steps=6, save_every=3, eval_every=100, log_every=1,
        tensorboard=True, tune_decoding=False, average_last=0,
    )  # fmt: skip
    train(config, tmp_path, progress=False)
    # as if killed after logging update 6 but before its checkpoint: resume from update 3
    ckroot = tmp_path / "checkpoints"
    shutil.rmtree(ckroot / "step-00000006")
    for pointer in ("best.json", "latest.json"):
        (ckroot / pointer).unlink(missing_ok=True)
    res = train(config, tmp_path, resume=True, progress=False)
    assert res.resumed_from == 3 and res.step == 6

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert sorted(steps) == [1, 2, 3, 4, 5, 6], steps
    assert not [s for s, n in Counter(steps).items() if n > 1]
