"""`qkv average` and ``average_checkpoints``: what they may replace (a model folder only with
--force, never a run's final/), and which checkpoints they may average (one model: its config,
its tokenizers, its languages). Issue 27 rows 1 and 2."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from _folders import one_line

from qkv.cli import main
from qkv.data import Normalizer, WordTokenizer, bundled_pairs, save_tokenizers
from qkv.export import save_model
from qkv.inference import CheckpointError
from qkv.nn import Seq2SeqConfig, build_model
from qkv.train.checkpoint import average_checkpoints, average_weights, save_checkpoint

PAIRS = bundled_pairs()[:300]


def _tokenizer(texts: list[str]) -> WordTokenizer:
    return WordTokenizer.train(texts, normalizer=Normalizer.book(), min_freq=1, max_size=60)


EN = _tokenizer([s for s, _ in PAIRS])
FR = _tokenizer([t for _, t in PAIRS])
OTHER = _tokenizer([s for s, _ in PAIRS[::-1]][:150] + ["zz yy xx"] * 3)  # other words


def _run(root: Path, tgt: WordTokenizer, languages=("en", "fr"), steps=(2, 4)) -> list[Path]:
    """Checkpoints of a tiny model (random weights) at ``steps`` under ``root/checkpoints``."""
    cfg = Seq2SeqConfig(src_vocab_size=EN.vocab_size, tgt_vocab_size=tgt.vocab_size,
                        num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_enc_layers=1,
                        num_dec_layers=1)  # fmt: skip
    found = []
    for step in steps:
        torch.manual_seed(step)
        model = build_model(cfg)
        found.append(
            save_checkpoint(
                root / "checkpoints",
                step,
                model=model,
                model_config=cfg.to_dict(),
                train_config={},
                split={},
                trainer_state={"step": step},
                tensors={},
                write_tokenizers=lambda d: save_tokenizers(d, EN, tgt),
                languages=languages,
            )
        )
    return found


def _cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["average", *args, "--quiet"])
    return rc, err.getvalue()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_an_existing_model_folder_is_replaced_only_with_force(tmp_path):
    folders = _run(tmp_path / "run", FR)
    avg = average_checkpoints(folders, tmp_path / "avg")
    with pytest.raises(ValueError, match="exists and is not empty"):
        average_checkpoints(folders, avg)
    assert average_checkpoints(folders, avg, force=True) == avg  # its own output, with force
    # an exported folder: its card is not lost without --force
    config = json.loads((folders[0] / "model.json").read_text())["config"]
    model = build_model(Seq2SeqConfig.from_dict(config))
    export = save_model(model, EN, FR, tmp_path / "export", card={"title": "keep me"})
    before = _snapshot(export)
    rc, err = _cli(*map(str, folders), "--out", str(export))
    assert rc == 2 and "--out:" in one_line(err, "average") and "--force" in err
    assert _snapshot(export) == before
    rc, err = _cli(*map(str, folders), "--out", str(export), "--force")
    assert rc == 0, err
    assert not (export / "README.md").exists() and (export / "trainer.json").is_file()


def test_a_runs_own_final_model_is_never_replaced(tmp_path):
    folders = _run(tmp_path / "run", FR)
    final = average_checkpoints(folders[:1], tmp_path / "run" / "final")  # a run's final/
    (final / "decoding.json").write_text("{}")  # what the run chose, beside its weights
    before = _snapshot(final)
    for force in ([], ["--force"]):
        rc, err = _cli(*map(str, folders), "--out", str(final), *force)
        assert rc == 2 and "--out:" in one_line(err, "average"), err
    assert "final model of the run" in err
    assert _snapshot(final) == before


def test_checkpoints_with_other_tokenizers_are_not_averaged(tmp_path):
    fr = _run(tmp_path / "fr", FR)
    other = _run(tmp_path / "other", OTHER)
    assert FR.vocab_size == OTHER.vocab_size  # one architecture, one config: only words differ
    assert (fr[0] / "model.json").read_bytes() == (other[0] / "model.json").read_bytes()
    with pytest.raises(CheckpointError, match="other tokenizers"):
        average_weights([fr[-1], other[-1]])
    rc, err = _cli(str(fr[-1]), str(other[-1]), "--out", str(tmp_path / "avg"))
    assert rc == 2 and "other tokenizers" in one_line(err, "average")
    assert not (tmp_path / "avg").exists()


def test_checkpoints_of_other_languages_are_not_averaged(tmp_path):
    fr = _run(tmp_path / "fr", FR)
    other = _run(tmp_path / "de", FR, languages=("en", "de"))
    with pytest.raises(CheckpointError, match="other languages"):
        average_weights([fr[-1], other[-1]])
    assert average_weights(fr)  # one run's checkpoints still average


def test_a_checkpoint_given_twice_is_refused_in_one_line(tmp_path):
    """Issue 41 row 12: the same folder (another spelling, a link) or a copy of it, given
    twice, would weigh it double."""
    a, b = _run(tmp_path / "run", FR)
    copy = tmp_path / "copy"
    shutil.copytree(b, copy)
    link = tmp_path / "link"
    link.symlink_to(b)
    spelled = tmp_path / "run" / "checkpoints" / ".." / "checkpoints" / b.name
    for twice, why in (
        (b, "the same folder"),
        (spelled, "the same folder"),
        (link, "the same folder"),
        (copy, "a copy: its weights' SHA-256 "),
    ):
        out = tmp_path / f"avg-{twice.name}"
        rc, err = _cli(str(a), str(b), str(twice), "--out", str(out))
        line = one_line(err, "average")
        assert rc == 2 and f"checkpoints: {str(twice)!r} is {str(b)!r} again ({why}" in line
        assert "weighs it double" in line and not out.exists()
        with pytest.raises(ValueError, match="again"):
            average_weights([a, twice, b])
    rc, err = _cli(str(a), str(b), "--out", str(tmp_path / "avg"))
    assert rc == 0, err
