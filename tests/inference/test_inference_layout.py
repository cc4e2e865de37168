"""qkv.inference.layout: a run folder's names in one place, which the trainer writes and every
reader (finding, loading, the lock checks) reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qkv.inference import best_checkpoint, find_checkpoints, resolve_model_dir
from qkv.inference.layout import (
    BEST_POINTER,
    CHECKPOINTS_DIR,
    FINAL_DIR,
    LOCK_NAME,
    STEP_DIR,
    TENSORBOARD_DIR,
    RunLayout,
    step_name,
    step_of,
)


def test_the_paths_of_a_run_folder(tmp_path):
    run = RunLayout(tmp_path / "run")
    out = tmp_path / "run"
    assert run.out == out
    assert run.checkpoints == out / "checkpoints" == out / CHECKPOINTS_DIR
    assert run.step_dir(1200) == out / "checkpoints" / "step-00001200"
    assert run.best_pointer == out / "checkpoints" / "best.json" == run.checkpoints / BEST_POINTER
    assert run.final == out / "final" == out / FINAL_DIR
    assert run.lock == out / ".lock" == out / LOCK_NAME
    assert run.tensorboard == out / "tensorboard" == out / TENSORBOARD_DIR
    assert RunLayout(str(out)) == run  # a str is a path too
    assert not out.exists()  # naming creates nothing


@pytest.mark.parametrize("step", [0, 7, 1200, 99_999_999, 123_456_789])
def test_a_step_and_its_folder_name_round_trip(step):
    name = step_name(step)
    assert STEP_DIR.match(name) and len(name) >= len("step-") + 8
    assert step_of(name) == step
    assert step_of(Path("/runs/x/checkpoints") / name) == step


@pytest.mark.parametrize(
    "name",
    ["final", "step-1200", "step-00001200.superseded", "step-00001200.corrupt", ".qkv-tmp-step-00001200-42",
     "best.json", "step-0000120x"],
)  # fmt: skip
def test_other_names_are_no_checkpoints(name):
    assert step_of(name) is None


@pytest.mark.parametrize("bad", [-1, True, 1.0, "12", None])
def test_step_name_names_its_argument_when_refusing(bad):
    with pytest.raises(ValueError, match=rf"^step: expected an update number .*got {bad!r}$"):
        step_name(bad)


def _model_folder(folder: Path, step: int) -> Path:
    """What the readers below look at: a folder with its manifest (a complete one)."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"step": step}))
    return folder


def test_the_readers_find_what_the_layout_names(tmp_path):
    run = RunLayout(tmp_path)
    first, last = _model_folder(run.step_dir(3), 3), _model_folder(run.step_dir(12), 12)
    run.step_dir(20).mkdir()  # no manifest: never complete, never a checkpoint
    (run.checkpoints / "step-00000030.superseded").mkdir()
    assert find_checkpoints(run.checkpoints) == [first, last]
    assert resolve_model_dir(run.out) == last  # no best pointer: the newest
    run.best_pointer.write_text(json.dumps({"step": 3, "path": step_name(3), "bleu": 1.0}))
    assert best_checkpoint(run.checkpoints) == first
    assert resolve_model_dir(run.out) == first
    _model_folder(run.final, 12)
    assert resolve_model_dir(run.out) == run.final


def test_the_trainer_writes_where_the_readers_look(tmp_path):
    from qkv.train.checkpoint import run_lock_in_use, write_best_pointer
    from qkv.train.runlock import RunLock

    run = RunLayout(tmp_path)
    best = _model_folder(run.step_dir(5), 5)
    write_best_pointer(run.checkpoints, 5, 2.5)
    assert json.loads(run.best_pointer.read_text()) == {"step": 5, "path": best.name, "bleu": 2.5}
    assert best_checkpoint(run.checkpoints) == best
    with RunLock(run.out) as lock:
        assert lock.path == run.lock and run.lock.is_file()
        in_use = run_lock_in_use(run.checkpoints)  # the lock held here is found from below
        assert in_use is not None and in_use(os.getpid()) and not in_use(os.getpid() + 1)
    assert not run.lock.exists()
