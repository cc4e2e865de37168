"""Which checkpoint a resumed run continues: the newest intact one, or the one asked for."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest
from _train_helpers import ENDED

from qkv.cli import main
from qkv.train import CheckpointError, TrainConfig, load_checkpoint, train
from qkv.train.checkpoint import find_checkpoints, read_weights, resume_checkpoint


@pytest.fixture
def run(tmp_path, trained):
    """A copy of the tiny transformer run: checkpoints of updates 15 and 30, and a final model."""
    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    assert [p.name for p in find_checkpoints(out / "checkpoints")] == [
        "step-00000015",
        "step-00000030",
    ]
    return out


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _config(out):
    """The run's own settings (what `qkv train --resume` starts from)."""
    ckpt = find_checkpoints(out / "checkpoints")[0]
    return TrainConfig.from_dict(load_checkpoint(ckpt, with_tensors=False).train_config)


def test_resume_skips_a_truncated_newest_checkpoint(run, caplog):
    root = run / "checkpoints"
    _truncate(root / "step-00000030" / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="qkv"):
        assert (
            main(["train", "--out", str(run), "--resume", "--max-steps", "30", "--quiet"]) in ENDED
        )
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "step-00000030" in m
        and "model.safetensors" in m
        and "corrupt" in m
        and "step-00000015" in m
        for m in warned
    ), warned
    # kept, out of the way: nothing a user saved is lost, and no later step mixes it in
    damaged = root / "step-00000030.corrupt"
    assert (damaged / "manifest.json").is_file()
    assert (run / "final.superseded" / "manifest.json").is_file()
    # the run went on from update 15 and wrote update 30 again, intact
    assert load_checkpoint(root / "step-00000030").trainer_state["step"] == 30
    assert json.loads((run / "final" / "manifest.json").read_text())["step"] == 30


def test_resume_fails_naming_every_damaged_checkpoint(run, capsys):
    root, config = run / "checkpoints", _config(run)
    _truncate(root / "step-00000030" / "trainer.pt")
    (root / "step-00000015" / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="no intact checkpoint") as e:
        train(config, run, resume=True, progress=False)
    assert "step-00000030: checkpoint: trainer.pt" in str(e.value)
    assert "step-00000015: checkpoint: " in str(e.value) and "not JSON" in str(e.value)
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv train: error: resume: no intact checkpoint") and err.count("\n") == 1
    # nothing was renamed or removed when nothing could be resumed
    assert [p.name for p in find_checkpoints(root)] == ["step-00000015", "step-00000030"]


@pytest.mark.parametrize("form", ["step", "path"])
def test_resume_from_a_chosen_checkpoint(run, form):
    root = run / "checkpoints"
    before = read_weights(root / "step-00000030")
    chosen = 15 if form == "step" else root / "step-00000015"
    res = train(_config(run), run, resume_from=chosen, progress=False)
    assert res.resumed_from == 15 and res.step == 30
    # the newer checkpoint and final model are set aside, not lost, not mixed in
    assert (root / "step-00000030.superseded" / "manifest.json").is_file()
    assert (run / "final.superseded" / "manifest.json").is_file()
    # and resuming is exact: update 30 is written again with the same weights
    after = read_weights(root / "step-00000030")
    assert after.keys() == before.keys()
    assert all(after[k].equal(before[k]) for k in before)


def test_resume_from_through_the_cli(run, capsys):
    assert main(["train", "--out", str(run), "--resume-from", "15", "--quiet"]) in ENDED
    assert (run / "checkpoints" / "step-00000030.superseded").is_dir()
    path = run / "checkpoints" / "step-00000015"
    assert main(["train", "--out", str(run), "--resume-from", str(path), "--quiet"]) in ENDED
    # the one set aside before keeps its name; this one gets the next
    assert (run / "checkpoints" / "step-00000030.superseded-2").is_dir()
    capsys.readouterr()


@pytest.mark.parametrize(
    "given, match",
    [
        ("20", "no checkpoint of update 20 in .*: step-00000015, step-00000030"),
        ("nowhere", "'nowhere' is not a checkpoint folder .*no such folder.*step-00000015"),
        ("OTHER", "is not a checkpoint of the run being resumed"),
    ],
)
def test_resume_from_a_checkpoint_that_is_not_there_lists_those_that_are(
    run, trained, given, match, capsys
):
    if given == "OTHER":
        given = str(find_checkpoints(trained["bahdanau"] / "checkpoints")[-1])
    assert main(["train", "--out", str(run), "--resume-from", given, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv train: error: --resume-from: ") and err.count("\n") == 1
    assert re.search(match, err), err
    assert [p.name for p in find_checkpoints(run / "checkpoints")][-1] == "step-00000030"


def test_resume_from_in_an_empty_folder_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        resume_checkpoint(tmp_path / "checkpoints", 15)
    assert resume_checkpoint(tmp_path / "checkpoints") is None  # plain --resume: a new run


def test_a_damaged_chosen_checkpoint_is_an_error_not_skipped(run):
    _truncate(run / "checkpoints" / "step-00000015" / "trainer.pt")
    with pytest.raises(CheckpointError, match=r"trainer\.pt in .*step-00000015.* is corrupt"):
        resume_checkpoint(run / "checkpoints", 15)
    assert (run / "checkpoints" / "step-00000030").is_dir()  # nothing set aside


def test_a_stale_latest_json_is_neither_read_nor_kept(run):
    root = run / "checkpoints"
    (root / "latest.json").write_text(json.dumps({"step": 15, "path": "step-00000015"}))
    ckpt = resume_checkpoint(root)
    assert ckpt.path.name == "step-00000030"
    assert not (root / "latest.json").exists()


def test_resuming_a_finished_run_reads_its_final_model_verified(run):
    res = train(_config(run), run, resume=True, progress=False)
    assert res.step == 30 and res.final_bleu is not None and res.decoding.beam_size >= 1
    decoding = run / "final" / "decoding.json"
    decoding.write_text(decoding.read_text().replace("1", "7"))  # altered after it was written
    res = train(_config(run), run, resume=True, progress=False)
    assert res.final_model == run / "final" and res.decoding is None  # not taken unchecked
