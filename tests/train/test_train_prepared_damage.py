"""A prepared corpus checked when it is opened (issue 41 rows 4 and 5): each file damaged as a
careless user or an attacker would (offsets, lengths, the token type, another corpus's
tokenizers, an id beyond the vocabulary, a held-out file or manifest that is not JSON) is one
line naming the file and the `qkv prepare` command that rebuilds the folder."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _folders import one_line
from _train_helpers import tiny_config

from qkv.cli import main
from qkv.data import bundled_pairs, write_pairs
from qkv.data.prepared import DamagedCorpusError, PreparedCorpus
from qkv.train.corpus import open_prepared, prepare_corpus, prepared_run_data, prepared_settings
from qkv.train.presets import resolve_config

VOCAB = 120


def _config(data: Path, vocab_size: int = VOCAB):
    return tiny_config(
        data=str(data), tokenizer="sentencepiece", vocab_size=vocab_size, byte_fallback=False
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path]:
    """A corpus prepared from 400 bundled pairs, and one of 400 other pairs whose tokenizers
    have the same sizes (SentencePiece's, of :data:`VOCAB` pieces)."""
    root = tmp_path_factory.mktemp("prepared")
    pairs = bundled_pairs()
    folders = []
    for name, part in (("a", pairs[:400]), ("b", pairs[3000:3400])):
        write_pairs(root / f"{name}.txt", part)
        config = _config(root / f"{name}.txt")
        folders.append(prepare_corpus(config, root / name, workers=1))
    return folders[0], folders[1]


@pytest.fixture
def corpus(tmp_path, prepared) -> Path:
    """A copy of the first prepared corpus, to damage."""
    return Path(shutil.copytree(prepared[0], tmp_path / "bin"))


def _run_data(folder: Path):
    """A run's data from the corpus ``folder``, read as ``qkv train --data FOLDER`` reads it."""
    corpus = open_prepared(folder)
    config, _ = resolve_config(prepared_settings(_config(folder), corpus), 1)
    return prepared_run_data(config, corpus)


def _damaged(folder: Path, name: str) -> str:
    """Open ``folder`` as a run does; the one-line error, checked to name ``name`` and the
    command that rebuilds the folder."""
    with pytest.raises(DamagedCorpusError) as e:
        _run_data(folder)
    msg = str(e.value)
    assert msg.startswith(f"data: {str(folder / name)!r} "), msg
    assert "\n" not in msg and "rebuild it with qkv prepare --data " in msg, msg
    assert msg.endswith(f"--out {folder}"), msg
    return msg


def _array(path: Path, dtype) -> np.ndarray:
    return np.fromfile(path, dtype=dtype).copy()


def test_an_intact_corpus_records_what_it_is_checked_against(corpus):
    m = PreparedCorpus(corpus).manifest
    assert m["vocab_sizes"] == [VOCAB, VOCAB] and m["token_dtype"] == "uint16"
    for side in (0, 1):
        tok = _array(corpus / f"train.{('src', 'tgt')[side]}.tok", np.uint16)
        assert m["max_ids"][side] == int(tok.max()) < VOCAB
    assert set(m["tokenizer_sha256"]) == {
        p.relative_to(corpus / "tokenizers").as_posix()
        for p in (corpus / "tokenizers").rglob("*")
        if p.is_file()
    }
    _run_data(corpus)


def test_an_offset_that_goes_backwards_is_named(corpus):
    idx = _array(corpus / "train.src.idx", np.int64)
    idx[10], idx[11] = idx[11], idx[10]
    idx.tofile(corpus / "train.src.idx")
    msg = _damaged(corpus, "train.src.idx")
    assert "goes backwards at sentence 10" in msg


def test_an_offset_moved_within_the_order_is_found_by_the_lengths(corpus):
    idx = _array(corpus / "train.tgt.idx", np.int64)
    idx[5] = idx[6]  # still in order: sentence 4 reads sentences 4 and 5, sentence 5 nothing
    idx.tofile(corpus / "train.tgt.idx")
    msg = _damaged(corpus, "train.tgt.len")
    lengths = _array(corpus / "train.tgt.len", np.uint16)
    assert f"gives sentence 4 {lengths[4]} tokens where train.tgt.idx gives it" in msg


def test_an_offset_past_the_token_file_is_named(corpus):
    idx = _array(corpus / "train.src.idx", np.int64)
    idx[-1] += 21_846
    idx.tofile(corpus / "train.src.idx")
    _damaged(corpus, "train.src.len")  # the last sentence's length contradicts it first
    lengths = _array(corpus / "train.src.len", np.uint16)
    lengths[-1] += 21_846
    lengths.tofile(corpus / "train.src.len")
    msg = _damaged(corpus, "train.src.tok")
    assert "should hold" in msg


def test_lengths_all_set_to_one_are_named(corpus):
    lengths = _array(corpus / "train.src.len", np.uint16)
    np.ones_like(lengths).tofile(corpus / "train.src.len")
    msg = _damaged(corpus, "train.src.len")
    assert "such sentences" in msg


def _manifest(folder: Path, **changes) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    for k, v in changes.items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"token_dtype": "float16"}, "records token_dtype 'float16'; expected one of uint16"),
        ({"token_dtype": "int32"}, "are written as uint16"),
        ({"max_ids": [VOCAB, 3]}, f"records largest ids [{VOCAB}, 3], not below the vocabul"),
        ({"vocab_sizes": [VOCAB, 0]}, f"records vocab_sizes [{VOCAB}, 0]; expected two ints"),
        ({"counts": {"train": -1, "valid": 1, "test": 0}}, "records -1 training pairs"),
    ],
)
def test_a_manifest_that_contradicts_the_arrays_is_named(corpus, changes, said):
    _manifest(corpus, **changes)
    assert said in _damaged(corpus, "manifest.json")


def test_another_corpuss_tokenizers_of_the_same_size_are_named(corpus, prepared):
    shutil.rmtree(corpus / "tokenizers")
    shutil.copytree(prepared[1] / "tokenizers", corpus / "tokenizers")
    with pytest.raises(DamagedCorpusError, match=r"tokenizers/.*' is not the file the corpus"):
        open_prepared(corpus)


def test_tokenizers_of_other_sizes_are_named_even_in_a_corpus_without_hashes(corpus, tmp_path):
    _manifest(corpus, tokenizer_sha256=None)
    other = prepare_corpus(_config(corpus_source(corpus), 100), tmp_path / "o", workers=1)
    shutil.rmtree(corpus / "tokenizers")
    shutil.copytree(other / "tokenizers", corpus / "tokenizers")
    msg = _damaged(corpus, "tokenizers")
    assert (
        f"holds vocabularies of 100 and 100 pieces; the corpus was encoded with {VOCAB} and {VOCAB}"
        in msg
    )


def corpus_source(folder: Path) -> Path:
    return Path(json.loads((folder / "manifest.json").read_text())["sources"][0]["path"])


@pytest.mark.parametrize("recorded", [True, False])
def test_an_id_beyond_the_vocabulary_is_named_when_read(corpus, recorded):
    if not recorded:  # a corpus prepared before the vocabulary was recorded
        _manifest(corpus, vocab_sizes=None, max_ids=None, tokenizer_sha256=None)
    tok = _array(corpus / "train.tgt.tok", np.uint16)
    lengths = _array(corpus / "train.tgt.len", np.uint16)
    at = int(np.flatnonzero(lengths)[3])
    start = int(lengths[:at].astype(np.int64).sum())
    tok[start] = VOCAB
    tok.tofile(corpus / "train.tgt.tok")
    data = _run_data(corpus)
    column = data.prepared.tgt
    assert column[at - 1] is not None  # the sentences around it read
    with pytest.raises(
        DamagedCorpusError, match=rf"holds id {VOCAB} in sentence {at}, beyond the vo"
    ):
        column[at]


def test_an_id_beyond_the_vocabulary_stops_qkv_train_in_one_line(corpus, tmp_path):
    tok = _array(corpus / "train.src.tok", np.uint16)
    tok[::7] = VOCAB + 1
    tok.tofile(corpus / "train.src.tok")
    err = io.StringIO()
    argv = ["train", "--quiet", "--data", str(corpus), "--out", str(tmp_path / "run")]
    argv += ["--preset", "none", "--max-steps", "2", "--set", "tune_decoding=false"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    line = one_line(err.getvalue(), "train")
    assert rc == 2 and f"train.src.tok' is damaged: it holds id {VOCAB + 1} in sentence" in line, (
        line
    )


def test_a_held_out_file_that_is_not_json_is_named_with_its_line(corpus):
    lines = (corpus / "valid.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2][:-5] + "\n"
    (corpus / "valid.jsonl").write_text("".join(lines), encoding="utf-8")
    msg = _damaged(corpus, "valid.jsonl")
    assert "line 3 is not a row [source, target" in msg


def test_a_manifest_that_is_not_json_is_named(corpus):
    (corpus / "manifest.json").write_text('{"type": "qkv.PreparedCorpus", ', encoding="utf-8")
    with pytest.raises(DamagedCorpusError, match=r"manifest\.json' is not valid JSON \("):
        PreparedCorpus(corpus)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"resolved": None}, "lacks 'resolved'"),
        ({"sources": "train.tsv"}, "holds a str as 'sources', not a list"),
        ({"resolved": {"normalizer": "plain"}}, "lacks 'resolved.src_lang'"),
    ],
)
def test_a_manifest_without_what_its_readers_need_stops_qkv_train_in_one_line(
    corpus, tmp_path, changes, said
):
    _manifest(corpus, **changes)
    err = io.StringIO()
    argv = ["train", "--quiet", "--data", str(corpus), "--out", str(tmp_path / "run")]
    argv += ["--preset", "none", "--max-steps", "2"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    line = one_line(err.getvalue(), "train")
    assert rc == 2 and f"manifest.json' {said}; rebuild it with qkv prepare --data" in line, line


def test_a_corpus_prepared_before_the_checks_still_opens(corpus):
    _manifest(corpus, vocab_sizes=None, max_ids=None, tokenizer_sha256=None)
    data = _run_data(corpus)
    n = data.prepared.n_train
    assert all(len(data.prepared.src[i]) == data.prepared.src.lengths[i] for i in range(n))
    lengths = _array(corpus / "train.src.len", np.uint16)
    np.ones_like(lengths).tofile(corpus / "train.src.len")
    _damaged(corpus, "train.src.len")  # what it records is still checked
