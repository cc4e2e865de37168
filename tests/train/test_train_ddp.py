"""Two processes on the CPU under torchrun (gloo): the replicas stay in sync, the loss falls,
and only rank 0 writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from qkv.train.checkpoint import find_checkpoints


def _torchrun_train(corpus_file, out, *args: str) -> subprocess.CompletedProcess:
    """``qkv train`` of a tiny model under torchrun, two CPU processes of one thread each;
    asserts it ended well: exit 0, or a model too little trained to use (rank 0 then exits 3,
    which torchrun reports as a failed child with that exit code: qkv.train.verdict)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "qkv.cli", "train", "--data", str(corpus_file), "--out", str(out),
        "--max-tokens", "256", "--lr", "3e-3", "--device", "cpu", "--set", "test=40",
        "--set", "model.num_hiddens=32", "--set", "model.ffn_num_hiddens=64",
        "--set", "model.num_heads=2", "--set", "model.num_enc_layers=1",
        "--set", "model.num_dec_layers=1", *args,
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    not_usable = "the model is not usable" in res.stderr and "exitcode: 3" in res.stderr
    assert res.returncode == 0 or not_usable, res.stdout + res.stderr
    return res


@pytest.mark.slow  # two Python processes under torchrun, 40 updates
def test_two_processes_stay_in_sync_and_learn(tmp_path, corpus_file):
    out = tmp_path / "ddp"
    res = _torchrun_train(corpus_file, out, "--max-steps", "40", "--save-every", "20",
                          "--eval-every", "40", "--log-every", "5", "--warmup-steps", "5",
                          "--set", "valid=40", "--set", "eval_sentences=10")  # fmt: skip
    assert "2 processes (gloo)" in res.stderr
    # rank 0 alone reports: one start line, not two
    assert res.stderr.count("qkv: new run") == 1

    ckpts = find_checkpoints(out / "checkpoints")
    assert [c.name for c in ckpts][-1] == "step-00000040"
    for c in ckpts:  # every checkpoint compared both replicas' parameters
        state = json.loads((c / "trainer.json").read_text())
        sums = state["replica_checksums"]
        assert state["world_size"] == 2 and len(sums) == 2 and sums[0] == sums[1]
        assert len(__import__("torch").load(c / "trainer.pt", weights_only=True)["rng"]) == 2
    history = json.loads((ckpts[-1] / "trainer.json").read_text())["history"]
    losses = [h["loss"] for h in history if "loss" in h]
    assert len(losses) == 8
    assert losses[-1] < 0.8 * losses[0], losses
    # nothing but rank 0's files: no stray temporaries from the other rank
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


@pytest.mark.slow  # two Python processes under torchrun, a 9-second budget
def test_a_timed_run_whose_evaluations_cost_much_keeps_its_ranks_in_step(tmp_path, corpus_file):
    """Rank 0 alone measures what an evaluation costs and plans fewer of them (Plan.fit_evals):
    the other rank, still on the first plan, thought one due that rank 0 did not and entered
    its collective out of step (gloo failed the run after its first evaluation). Every rank
    now takes rank 0's plan after each evaluation."""
    out = tmp_path / "ddp"
    res = _torchrun_train(corpus_file, out, "--max-minutes", "0.15", "--preset", "none",
                          "--set", "valid=300", "--set", "eval_sentences=300",
                          "--set", "dist_timeout_minutes=1")  # fmt: skip
    assert "stopped (max_minutes)" in res.stderr and res.stderr.count("valid @") >= 2
    assert (out / "final" / "manifest.json").is_file()


def test_the_process_group_gets_the_configured_timeout(monkeypatch):
    import datetime

    import pytest

    from qkv.train import TrainConfig
    from qkv.train import distributed as D

    seen = {}
    monkeypatch.setattr(D.dist, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setattr(D.dist, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    info = D.setup("cpu", timeout_minutes=90)
    assert info.backend == "gloo" and info.rank == 1
    assert seen["timeout"] == datetime.timedelta(minutes=90) and seen["backend"] == "gloo"
    assert TrainConfig().dist_timeout_minutes == 30.0
    assert TrainConfig().updated({"dist_timeout_minutes": 5}).dist_timeout_minutes == 5.0
    with pytest.raises(ValueError, match="dist_timeout_minutes"):
        TrainConfig().updated({"dist_timeout_minutes": 0})
