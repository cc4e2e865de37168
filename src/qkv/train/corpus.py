"""Prepare a corpus once (``qkv prepare``), and a run's data read from the prepared folder.

:func:`prepare_corpus` does what a run does to its file before the first update -- read it,
find its languages, split it, choose the normaliser and the tokenizers (trained on a seeded
sample of at most :data:`~qkv.train.run_data.TOKENIZER_SAMPLE` pairs and
:data:`~qkv.train.run_data.TOKENIZER_CHARS` characters) -- then encodes the
training pairs with every core and writes the token arrays of
:mod:`qkv.data.prepared`. The pairs, the tokens and therefore the batches are the ones a run
reading the file itself gets, for the same settings and seed.

It reads in a stream, holding at most a chunk of :data:`CHUNK` pairs of text: a first pass
writes the pairs to ``OUT/.work`` as raw text (:class:`~qkv.data.prepared.RawPairsWriter`) with
two hashes per source, the split is made from those arrays
(:func:`~qkv.data.splits.split_parts`, which is :func:`~qkv.data.splits.split_pairs`'s split),
and the languages' sample, the held-out parts, the tokenizers' sample and each worker's chunk
are read back by row.

It is resumable: the work goes into ``OUT/.work`` (the raw pairs, the tokenizers, then one file
per chunk of encoded pairs), and a prepare killed and started again with the same sources and
settings keeps what was done. A second prepare of unchanged data is a no-op.

:func:`prepare_reason` is when ``qkv train --data FILE`` prepares its file into its own folder
first (``prepare_data``, :data:`PREPARE_ABOVE`).

:func:`prepared_run_data` is a run's :class:`~qkv.train.run_data.RunData` from such a folder:
the source files checked (a changed one is named), the settings checked against the ones the
folder was made with, the held-out parts read as text, the training pairs left on disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import atomic_file, is_no_space, no_space_error, replace
from .._errors import SettingError, keyed
from .._machine import threads_running
from ..data import load_tokenizers, save_tokenizers
from ..data.languages import detect_languages
from ..data.prepared import (
    CLEAN_REASONS,
    CORPUS_FILES,
    MANIFEST,
    PREPARED_VERSION,
    REPORT,
    WORK_DIR,
    Cleaning,
    PreparedCorpus,
    RawPairs,
    RawPairsWriter,
    TokenArraysWriter,
    check_sources,
    encode_rows,
    is_prepared,
    prepare_command,
    read_manifest,
    source_record,
    token_dtype,
    tree_digests,
)
from ..data.splits import TEST, TRAIN, VALID, group_hashes, split_parts
from .checkpoint import atomic_write_json
from .config import TrainConfig
from .presets import TIERS, OneMeasurement, Preset, resolve_config, tier_vocab
from .run_data import (
    DETECT_SAMPLE,
    RunData,
    describe_data,
    iter_run_files,
    run_data_format,
    run_languages,
    run_normalizer,
    run_tokenizers,
    tokenizer_sample_indices,
    within_characters,
)
from .runlock import RunLock, check_corpus_out

__all__ = [
    "DATA_KEYS",
    "PREPARE_ABOVE",
    "RUN_DATA_DIR",
    "TOKENIZER_KEYS",
    "Sizing",
    "data_bytes",
    "open_prepared",
    "prepare_command",
    "prepare_corpus",
    "prepare_reason",
    "prepared_run_data",
    "prepared_settings",
]

#: the settings that decide a prepared corpus's content (``data`` aside): a run on the folder
#: takes them from it, and may not give other values
DATA_KEYS = (
    "valid_data",
    "test_data",
    "data_format",
    "src_column",
    "tgt_column",
    "max_pairs",
    "max_skipped",
    "valid",
    "test",
    "split_seed",
    "normalizer",
    "tokenizer",
    "min_freq",
    "vocab_size",
    "joint_vocab",
    "subword_model",
    "byte_fallback",
    "character_coverage",
    "tokenizer_model",
    "src_lang",
    "tgt_lang",
)
#: the resolved settings the tokenizers were made with; a run's must resolve to the same
TOKENIZER_KEYS = (
    "normalizer",
    "tokenizer",
    "joint_vocab",
    "vocab_size",
    "min_freq",
    "tokenizer_model",
)
#: pairs one worker encodes at a time (one file of ``OUT/.work`` each)
CHUNK = 20_000
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}

Say = Callable[[str], None]


def _absolute(config: TrainConfig) -> TrainConfig:
    changes: dict[str, Any] = {}
    for key in ("data", "valid_data", "test_data", "tokenizer_model"):
        v = getattr(config, key)
        if isinstance(v, str):
            changes[key] = str(Path(v).resolve())
        elif isinstance(v, list):
            changes[key] = [str(Path(p).resolve()) for p in v]
    return config.updated(changes) if changes else config


def _sources(config: TrainConfig) -> list[dict[str, Any]]:
    records = []
    for key in ("data", "valid_data", "test_data"):
        v = getattr(config, key)
        for p in [v] if isinstance(v, str) else (v or []):
            try:
                records.append(source_record(key, p))
            except OSError as e:
                raise keyed(FileNotFoundError, key, f"{p!r} cannot be read: {e.strerror}") from None
    return records


def _settings(config: TrainConfig) -> dict[str, Any]:
    d = config.to_dict()
    return {"data": d["data"], **{k: d[k] for k in DATA_KEYS}}


def _progress(total: int, say: Say, stream: Any) -> Callable[[int], None]:
    """A progress line with the rate and the time left: redrawn in place on a terminal,
    else said every 10 seconds."""
    t0 = time.monotonic()
    last = [0.0]
    tty = stream is not None and getattr(stream, "isatty", lambda: False)()

    def update(done: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < (0.5 if tty else 10.0):
            return
        last[0] = now
        rate = done / max(now - t0, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        line = (
            f"encoding: {done:,}/{total:,} pairs ({done / max(total, 1):.0%}), "
            f"{rate:,.0f} pairs/s, ETA {eta:.0f} s"
        )
        if tty:
            stream.write("\r" + line + ("\n" if done >= total else ""))
            stream.flush()
        else:
            say(line)

    return update


def _encode(
    train: np.ndarray, work: Path, pool: Any, say: Say, stream: Any, cleaning: Cleaning | None
) -> None:
    """Encode the training pairs (``train``: their rows in ``work``'s raw pairs) in chunks of
    :data:`CHUNK` into ``work/chunk-N.npz``, in ``pool`` (or here when None), skipping the
    chunks a killed prepare finished. A worker reads its chunk's text from the raw pairs: only
    row numbers travel."""
    n_chunks = -(-len(train) // CHUNK)
    todo = [i for i in range(n_chunks) if not (work / f"chunk-{i:06d}.npz").is_file()]
    if len(todo) < n_chunks:
        say(f"resuming: {n_chunks - len(todo)} of {n_chunks} chunks encoded before")
    progress = _progress(len(train), say, stream)
    done = (n_chunks - len(todo)) * CHUNK
    tasks = (
        (str(work / "tokenizers"), cleaning, str(work), train[i * CHUNK : (i + 1) * CHUNK])
        for i in todo
    )
    results = pool.imap(encode_rows, tasks) if pool is not None else map(encode_rows, tasks)
    for i, arrays in zip(todo, results):
        with atomic_file(work / f"chunk-{i:06d}.npz", temp=f".chunk-{i:06d}.tmp.npz") as f:
            np.savez(f, *arrays)
        done += len(arrays[0])
        progress(min(done, len(train)))


def _duplicates(work: Path, n_chunks: int) -> np.ndarray:
    """Per training pair, whether an earlier pair has its hash (kept or not): the chunks'
    hashes read as one array, the first of each value found by sorting."""
    hashes = []
    for i in range(n_chunks):
        with np.load(work / f"chunk-{i:06d}.npz") as z:
            hashes.append(z["arr_5"])
    every = np.concatenate(hashes)
    del hashes
    _, first = np.unique(every, return_index=True)
    later = np.ones(len(every), dtype=bool)
    later[first] = False
    return later


def _assemble(
    work: Path, n: int, dtype: np.dtype, dedup: bool
) -> tuple[dict, int, dict, list[int]]:
    """The chunks of ``work`` joined into the training columns, the pairs that cleaning
    dropped left out: the token statistics, the pairs kept, the pairs dropped by reason, the
    largest id of each side (-1 for none)."""
    writers = [TokenArraysWriter(work, name, dtype) for name in ("train.src", "train.tgt")]
    n_chunks = -(-n // CHUNK)
    hist = [np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)]
    dropped = dict.fromkeys(CLEAN_REASONS, 0)
    top = [-1, -1]
    later = _duplicates(work, n_chunks) if dedup else None
    start = 0
    for i in range(n_chunks):
        with np.load(work / f"chunk-{i:06d}.npz") as z:
            arrays = [z[f"arr_{k}"] for k in range(len(z.files))]
        keep = None
        if len(arrays) == 6:  # cleaned: the reasons, then the hashes
            reasons = arrays[4]
            if later is not None:
                dup = later[start : start + len(reasons)] & (reasons == 0)
                reasons[dup] = len(CLEAN_REASONS)
            for code, name in enumerate(CLEAN_REASONS, start=1):
                dropped[name] += int(np.count_nonzero(reasons == code))
            keep = reasons == 0
        for side, w in enumerate(writers):
            lengths, tokens = arrays[2 * side], arrays[2 * side + 1]
            if keep is not None:
                tokens = tokens[np.repeat(keep, lengths)]
                lengths = lengths[keep]
            w.append(lengths, tokens)
            if len(tokens):
                top[side] = max(top[side], int(tokens.max()))
            counts = np.bincount(lengths)
            if len(counts) > len(hist[side]):
                hist[side] = np.pad(hist[side], (0, len(counts) - len(hist[side])))
            hist[side][: len(counts)] += counts
        start += len(arrays[0])
    for w in writers:
        w.close()
    kept = writers[0].count
    stats = {}
    for side, name in enumerate(("src", "tgt")):
        h = hist[side]
        total = int((h * np.arange(len(h))).sum())
        cum = np.cumsum(h)
        stats[name] = {
            "tokens": total,
            "mean_length": round(total / max(kept, 1), 2),
            "p99_length": int(np.searchsorted(cum, 0.99 * kept)) if kept else 0,
            "max_length": int(len(h) - 1),
        }
    return stats, kept, dropped, top


def _held_out(path: Path, raw: list, norm: list) -> None:
    with atomic_file(path, "w", encoding="utf-8") as f:
        for (rs, rt), (ns, nt) in zip(raw, norm):
            f.write(json.dumps([rs, rt, ns, nt], ensure_ascii=False) + "\n")


def _is_done(out: Path, sources: list, settings: dict) -> bool:
    """Does ``out`` already hold this very preparation (same sources and settings)?"""
    if not (out / MANIFEST).is_file():
        return False
    try:
        m = read_manifest(out)
    except ValueError:
        return False
    return m.get("settings") == settings and m.get("sources") == sources


def _work_folder(out: Path, state: dict, say: Say) -> Path:
    """``OUT/.work``, kept when a killed prepare of the same sources and settings left it."""
    work = out / WORK_DIR
    state_file = work / "state.json"
    if state_file.is_file():
        try:
            same = json.loads(state_file.read_text(encoding="utf-8")) == state
        except ValueError:
            same = False
        if same:
            return work
        say(f"{work}: left by a prepare of other data or settings; starting over")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    atomic_write_json(state_file, state)
    return work


def _spill(config: TrainConfig, work: Path, say: Say, pool: Any) -> dict[str, Any]:
    """The first pass: the run's files read as a stream (:func:`iter_run_files`: every format,
    the same checks and errors) into ``work``'s raw pairs, a chunk of :data:`CHUNK` pairs at a
    time, with each source's split hashes (:func:`qkv.data.splits.group_hashes`, in ``pool``)
    and the fingerprint of all. Kept once done (``rows.json``): a resumed prepare reads no
    text again.

    Returns:
        ``{"sizes": [data, valid_data, test_data], "fingerprint": ..., "data_format": ...}``.
    """
    done = work / "rows.json"
    if done.is_file():
        say("reading: done before, kept")
        return json.loads(done.read_text(encoding="utf-8"))
    writer = RawPairsWriter(work)
    fp = hashlib.blake2b(digest_size=16)
    sizes = dict.fromkeys(("data", "valid_data", "test_data"), 0)
    t0 = last = time.monotonic()
    seed = config.split_seed

    def chunks() -> Iterator[list]:
        nonlocal last
        chunk: list = []
        for key, pair in iter_run_files(config):
            sizes[key] += 1
            chunk.append(pair)
            if len(chunk) == CHUNK:
                fp.update(writer.append(chunk))
                yield [p[0] for p in chunk]
                chunk = []
                if time.monotonic() - last >= 10:
                    last = time.monotonic()
                    n = writer.count
                    say(f"reading: {n:,} pairs, {n / (last - t0):,.0f} pairs/s")
        if chunk:
            fp.update(writer.append(chunk))
            yield [p[0] for p in chunk]

    task = functools.partial(group_hashes, seed=seed)
    hashed = pool.imap(task, chunks()) if pool is not None else map(task, chunks())
    with open(work / "split.keys", "wb") as fk, open(work / "split.ranks", "wb") as fr:
        for keys, ranks in hashed:
            fk.write(keys.tobytes())
            fr.write(ranks.tobytes())
    writer.close()
    meta = {
        "sizes": [sizes["data"], sizes["valid_data"], sizes["test_data"]],
        "fingerprint": fp.hexdigest(),
        "data_format": run_data_format(config),
    }
    atomic_write_json(done, meta)
    return meta


def _smallest_sources(raw: RawPairs, groups: list[np.ndarray]) -> list[str]:
    """Each group's smallest raw source (the groups' rows read in one pass)."""
    sources = raw.sources(np.concatenate(groups))
    ends = np.cumsum([len(g) for g in groups]).tolist()
    return [min(sources[a:b]) for a, b in zip([0, *ends[:-1]], ends)]


def _split(config: TrainConfig, work: Path, sizes: list[int], raw: RawPairs) -> np.ndarray:
    """Per raw pair its part (:data:`~qkv.data.splits.TRAIN`, ``VALID``, ``TEST``): the split
    a run makes (:func:`~qkv.train.run_data.run_split`), from the hashes of the first pass."""
    n, n_valid, n_test = sizes
    keys = np.fromfile(work / "split.keys", dtype=np.uint64, count=2 * n).reshape(n, 2)
    ranks = np.fromfile(work / "split.ranks", dtype=np.uint64, count=n)
    given_valid, given_test = config.valid_data is not None, config.test_data is not None
    parts = split_parts(
        keys,
        ranks,
        0 if given_valid else config.valid,
        0 if given_test else config.test,
        config.split_seed,
        lambda groups: _smallest_sources(raw, groups),
    )
    del keys, ranks
    return np.concatenate([parts, np.full(n_valid, VALID, np.int8), np.full(n_test, TEST, np.int8)])


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The runs a corpus is prepared for, whose preset sizes its vocabulary when the settings
    leave it to the preset (:func:`~qkv.train.presets.resolve_config`): their ``device`` type
    and processes (``world_size``), and ``probe``, the one measurement of this machine's speed
    a timed run's preset is chosen from (made when first asked). ``in_run``: prepared inside a
    run, which says its preset itself. ``runs``: the settings of the runs a ``qkv prepare``
    was given (``max_minutes``, ``preset``, ``device``), recorded with the corpus's settings:
    part of what the corpus is, so a folder prepared for other runs is prepared again."""

    device: str = "cpu"
    world_size: int = 1
    probe: OneMeasurement = dataclasses.field(default_factory=OneMeasurement)
    in_run: bool = False
    runs: dict[str, Any] | None = None

    #: the settings that say which runs a ``qkv prepare`` is for
    RUN_KEYS = ("max_minutes", "preset", "device")

    @classmethod
    def of_runs(cls, config: TrainConfig) -> Sizing:
        """The runs ``config`` describes: without a :data:`RUN_KEYS` setting off its default,
        any (a CPU process's preset, nothing measured, no GPU looked for); else one process on
        its device, with those settings recorded."""
        runs = {k: getattr(config, k) for k in cls.RUN_KEYS if getattr(config, k) != _DEFAULTS[k]}
        if not runs:
            return cls()
        from ..inference.device import pick_device

        return cls(device=pick_device(config.device).type, runs=runs)


@dataclasses.dataclass
class _Read:
    """The corpus read and split, the settings resolved for its size (languages included):
    the training pairs as rows of the raw pairs, the held-out ones as text."""

    how: str
    split: dict[str, Any]
    train: np.ndarray
    valid: list
    test: list
    resolved: TrainConfig
    cleaning: Cleaning | None
    raw: RawPairs
    preset: Preset | None = None


def _read(
    config: TrainConfig,
    cleaning: Cleaning | None,
    work: Path,
    say: Say,
    pool: Any,
    sizing: Sizing,
) -> _Read:
    """Read the run's files, find the languages, split, resolve the settings for ``sizing``'s
    runs: what a run does before its tokenizers, with at most a chunk of the training text in
    memory."""
    meta = _spill(config, work, say, pool)
    raw = RawPairs(work)
    n = meta["sizes"][0]
    step = max(1, n // DETECT_SAMPLE)  # the pairs run_languages samples from all n
    sample = raw.pairs(np.arange(0, n, step)[:DETECT_SAMPLE])
    src, tgt, how = run_languages(config, sample, meta["data_format"])
    config = config.updated({"src_lang": src, "tgt_lang": tgt})
    parts = _split(config, work, meta["sizes"], raw)
    train = np.flatnonzero(parts == TRAIN)
    valid = raw.pairs(np.flatnonzero(parts == VALID))
    test = raw.pairs(np.flatnonzero(parts == TEST))
    del parts
    if not len(train) or not valid:
        raise SettingError(
            "data",
            f"{describe_data(config.data)} gives {len(train)} training and {len(valid)} "
            "validation pairs; expected some of each (more data, or other valid/test sizes)",
        )
    resolved, preset = resolve_config(
        config,
        len(train),
        device=sizing.device,
        world_size=sizing.world_size,
        probe=sizing.probe,
    )
    if cleaning is not None and cleaning.languages is not None:
        if not (src and tgt):
            raise ValueError(
                "check_languages: the source and target languages are not known; give "
                "--src-lang and --tgt-lang (or --pair)"
            )
        cleaning = dataclasses.replace(cleaning, languages=(src, tgt))
        detect_languages(["a sentence"])  # py3langid is installed: said before any work
    split = {"n": len(raw), "seed": config.split_seed, "fingerprint": meta["fingerprint"],
             "grouping": "normalized"}  # fmt: skip
    return _Read(how, split, train, valid, test, resolved, cleaning, raw, preset)


def _vocabulary_line(
    config: TrainConfig, resolved: TrainConfig, preset: Preset | None, n: int
) -> str:
    """What a prepare of ``n`` training pairs says of its SentencePiece vocabulary's size: the
    user's, that of the preset of the runs it is for (a budget, a named preset), or the corpus
    size's, with how to size it for short runs when a CPU tier would choose fewer pieces."""
    size = f"{resolved.vocab_size:,} pieces"
    if config.vocab_size is not None:
        return f"vocabulary: {size}, as given"
    if preset is None:
        return f"vocabulary: {size}"
    if config.max_minutes is not None or config.max_steps is not None or config.preset != "auto":
        return f"vocabulary: {size}, for the runs' {preset.reason}"
    fewest = min(tier_vocab(t, n) for t, row in TIERS.items() if row[0] == "cpu")
    line = f"vocabulary: {size}, for {n:,} training pairs and runs of any budget"
    if fewest < resolved.vocab_size:
        line += (
            f" (a CPU run of a few minutes would choose {fewest:,}: --max-minutes M sizes it "
            "for runs of M minutes)"
        )
    return line


def _tokenizers(tokdir: Path, resolved: TrainConfig, r: _Read, say: Say, given: bool) -> tuple:
    """The tokenizers a killed prepare trained already, else trained on the seeded sample of the
    training pairs (saved into ``tokdir``, marked done), and the pairs they were trained on;
    ``given``: the vocabulary size is the user's (:func:`~qkv.train.run_data.run_tokenizers`)."""
    if (tokdir / "done").is_file():
        say("tokenizers: trained before, kept")
        return load_tokenizers(tokdir), int((tokdir / "done").read_text(encoding="utf-8") or 0)
    norm = run_normalizer(resolved)
    rows = r.train[tokenizer_sample_indices(len(r.train), resolved.split_seed)]
    sample = within_characters(norm.pairs(r.raw.pairs(rows)), resolved.split_seed)
    del rows
    n = len(sample)
    say(f"training the {resolved.tokenizer} tokenizers on {n:,} pairs")
    toks = run_tokenizers(resolved, norm, sample, vocab_given=given)
    del sample
    if tokdir.exists():
        shutil.rmtree(tokdir)
    save_tokenizers(tokdir, *toks)
    (tokdir / "done").write_text(str(n), encoding="utf-8")
    return toks, n


def _install(work: Path, out: Path) -> None:
    """Move the finished files of ``work`` into ``out`` (replacing older ones; a link the user
    put in their place is replaced, never what it points to)."""
    for name in CORPUS_FILES:
        target = out / name
        if target.is_symlink():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        replace(work / name, target)


def prepare_corpus(
    config: TrainConfig,
    out: str | Path,
    *,
    workers: int | None = None,
    say: Say | None = None,
    stream: Any = None,
    cleaning: Cleaning | None = None,
    sizing: Sizing | None = None,
) -> Path:
    """Prepare the corpus ``config.data`` (and ``valid_data``/``test_data``) into ``out``.

    Args:
        config: a run's settings; those of :data:`DATA_KEYS` decide the folder's content
            (format, columns, split, normaliser, tokenizers), as they decide a run's.
        out: the folder to write: new, empty, or a prepared corpus (one of other data is
            replaced); locked while written (:class:`~qkv.train.runlock.RunLock`).
        workers: processes that encode (default: every core).
        say: where progress messages go (default: nowhere).
        stream: a terminal to redraw the progress line on (default: messages via ``say``).
        cleaning: filters for the training pairs (:class:`qkv.data.prepared.Cleaning`), or
            None; with any, the training pairs are no longer the ones a run reading the file
            trains on.
        sizing: the runs the corpus is for (:class:`Sizing`), whose preset sizes the
            vocabulary when ``config`` leaves it to the preset (default: a CPU process of its
            own, its speed measured when ``config.max_minutes`` is set); a run that prepares
            its file passes its device, processes and the measurement it asks again after.

    Returns:
        the folder, absolute.

    Raises:
        ValueError, FileNotFoundError: no data file, or one that cannot be read (the message
            names the setting); an ``out`` that is not a folder a prepare wrote (a model, a
            run, other files: :func:`~qkv.train.runlock.check_corpus_out`).
        RunLockedError: another process prepares or trains into ``out`` (named).
    """
    say = say or (lambda _m: None)
    config = _absolute(config)
    if config.data is None:
        raise SettingError(
            "data", "expected a corpus file (or two aligned files) to prepare, got None"
        )
    t0 = time.monotonic()
    out = Path(out).resolve()
    created = check_corpus_out(out)
    with RunLock(out, created_out=created, role="qkv process"):  # one prepare per folder
        try:
            kept = _prepare_locked(
                config, out, workers, say, stream, cleaning, t0, sizing or Sizing()
            )
        except OSError as e:
            if not is_no_space(e):
                raise
            raise no_space_error(
                e,
                out,
                "a prepared corpus",
                "then run the same qkv prepare again: it continues from there",
                kept=f"what it had done is kept in {WORK_DIR}",
            ) from None
    if kept is None:
        say(f"{out}: already prepared from these files with these settings; nothing to do")
        return out
    say(f"prepared {kept:,} training pairs into {out} in {time.monotonic() - t0:.1f} s")
    return out


def _prepare_locked(
    config: TrainConfig,
    out: Path,
    workers: int | None,
    say: Say,
    stream: Any,
    cleaning: Cleaning | None,
    t0: float,
    sizing: Sizing,
) -> int | None:
    """:func:`prepare_corpus` once ``out`` is locked (started at ``t0``): the training pairs
    kept, None when ``out`` already holds this very preparation."""
    cleaning = cleaning if cleaning is not None and cleaning.active else None
    sources, settings = _sources(config), _settings(config)
    settings["cleaning"] = cleaning.to_dict() if cleaning is not None else None
    if sizing.runs:
        settings["runs"] = sizing.runs
    if _is_done(out, sources, settings):
        return None
    (out / MANIFEST).unlink(missing_ok=True)  # the folder is not a corpus until it is again
    work = _work_folder(out, {"sources": sources, "settings": settings}, say)
    n_workers = workers or os.cpu_count() or 1
    # the workers start now, while this process is small: they share its pages, not the
    # split's arrays or the tokenizers' sample it holds later
    with _pool(n_workers) as pool:
        kept = _prepare(config, out, work, pool, n_workers, (sources, settings), cleaning,
                        say, stream, time.monotonic() - t0, sizing)  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    return kept


def start_method() -> str:
    """How the workers start: forked where the system can and this process runs one thread; a
    fork of a process with other threads (a notebook's kernel, a server, a test runner, a
    library's) copies locks those threads may hold, and a worker can wait on one for ever:
    then a fork server (started clean), else spawned. The threads are the kernel's count
    (``/proc``), which sees threads Python's ``threading`` does not; else Python's."""
    methods = multiprocessing.get_all_start_methods()
    alone = (threads_running() or threading.active_count()) == 1
    if "fork" in methods and alone:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


@contextlib.contextmanager
def _pool(workers: int) -> Iterator[Any]:
    """``workers`` processes (:func:`start_method`), or None for one."""
    if workers <= 1:
        yield None
        return
    method = start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        _preload_in_fork_server(context)
    with context.Pool(workers, _worker_signals) as pool:
        yield pool


def _preload_in_fork_server(context: Any) -> None:
    """Have the fork server import this module (and so torch and qkv) once when it starts: its
    workers, forked from it, then start at once, where each would import them itself (about 2 s
    of CPU per worker, per pool). The modules already asked for stay asked for; a fork server
    already running keeps what it imported."""
    from multiprocessing import forkserver

    asked = getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None)
    asked = list(asked) if isinstance(asked, list | tuple) else ["__main__"]
    if __name__ not in asked:
        context.set_forkserver_preload([*asked, __name__])


def _worker_signals() -> None:
    """A worker's signals: SIGTERM ends it (the pool's own end sends one to every worker; a
    forked worker would otherwise run the training run's handler and print its traceback), and
    Ctrl-C, which the terminal sends to every process of the group, is the parent's to handle."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prepare(
    config: TrainConfig,
    out: Path,
    work: Path,
    pool: Any,
    workers: int,
    identity: tuple[list, dict],
    cleaning: Cleaning | None,
    say: Say,
    stream: Any,
    hashing: float,
    sizing: Sizing,
) -> int:
    """The work of :func:`prepare_corpus` once the sources are known to need it: the training
    pairs kept."""
    sources, settings = identity
    times: dict[str, float] = {"hashing": hashing}
    t = time.monotonic()
    r = _read(config, cleaning, work, say, pool, sizing)
    cleaning, split, train, valid, test, resolved = (
        r.cleaning, r.split, r.train, r.valid, r.test, r.resolved)  # fmt: skip
    src, tgt = resolved.src_lang, resolved.tgt_lang
    times["reading"] = time.monotonic() - t
    say(f"read {len(train) + len(valid) + len(test):,} pairs ({len(train):,} train, "
        f"{len(valid):,} valid, {len(test):,} test); languages {src} -> {tgt} ({r.how})")  # fmt: skip

    if resolved.tokenizer == "sentencepiece" and not (resolved.tokenizer_model or sizing.in_run):
        say(_vocabulary_line(config, resolved, r.preset, len(train)))
    t = time.monotonic()
    toks, n_sample = _tokenizers(
        work / "tokenizers", resolved, r, say, config.vocab_size is not None
    )
    times["tokenizers"] = time.monotonic() - t
    norm = run_normalizer(resolved, toks)
    _held_out(work / "valid.jsonl", valid, norm.pairs(valid))
    _held_out(work / "test.jsonl", test, norm.pairs(test))

    t = time.monotonic()
    _encode(train, work, pool, say, stream, cleaning)
    times["encoding"] = time.monotonic() - t
    t = time.monotonic()
    dtype = token_dtype(max(toks[0].vocab_size, toks[1].vocab_size))
    stats, kept, dropped, top = _assemble(
        work, len(train), dtype, bool(cleaning and cleaning.dedup)
    )
    times["writing"] = time.monotonic() - t
    if kept == 0:
        raise ValueError(f"cleaning: every one of the {len(train)} training pairs was dropped "
                         f"({dropped}); relax the cleaning")  # fmt: skip
    counts = {"train": kept, "valid": len(valid), "test": len(test)}
    resolved_data = {k: getattr(resolved, k) for k in TOKENIZER_KEYS}
    fp = hashlib.blake2b(
        json.dumps([split["fingerprint"], resolved_data, counts, stats], sort_keys=True).encode(),
        digest_size=16,
    ).hexdigest()
    _install(work, out)  # everything into place, the manifest last
    (out / "tokenizers" / "done").unlink(missing_ok=True)
    times = {k: round(v, 2) for k, v in times.items()}
    report = {
        "pairs": counts,
        "read_train": len(train),
        "cleaning": settings["cleaning"],
        "dropped": dropped if cleaning is not None else None,
        "languages": [src, tgt],
        "languages_from": r.how,
        "vocab_size": [toks[0].vocab_size, toks[1].vocab_size],
        "tokenizer_trained_on": n_sample,
        "tokens": stats,
        "seconds": times,
        "workers": workers,
    }
    atomic_write_json(out / REPORT, report)
    manifest = {
        "type": "qkv.PreparedCorpus",
        "version": PREPARED_VERSION,
        "fingerprint": fp,
        "sources": sources,
        "settings": settings,
        "resolved": {**resolved_data, "src_lang": src, "tgt_lang": tgt},
        "split": split,
        "counts": counts,
        "token_dtype": dtype.name,
        "vocab_sizes": [toks[0].vocab_size, toks[1].vocab_size],
        "max_ids": top,
        "tokenizer_sha256": tree_digests(out / "tokenizers"),
    }
    atomic_write_json(out / MANIFEST, manifest)
    if cleaning is not None:
        say("cleaning dropped " + ", ".join(f"{v:,} ({k})" for k, v in dropped.items()))
    return kept


# ---------------------------------------------------------------------------- a run's data
#: ``prepare_data="auto"``: a data file of more bytes than this (times the run's processes) is
#: prepared into the run's folder. Read into memory (Python strings, token lists, the
#: tokenizers' training beside them), the benchmark's corpus peaked at 1.48 GiB for 27.7 MiB of
#: text (200k pairs) and 1.63 GiB for 41.6 MiB (300k); prepared first, at 1.19 GiB for 200k.
PREPARE_ABOVE = 32 * 2**20
#: where ``qkv train`` prepares a data file of its own, in its ``--out`` folder
RUN_DATA_DIR = "data"


def data_bytes(data: str | list[str]) -> int:
    """The bytes of text of a run's data file (the sum of two aligned files); a ``.gz`` file
    counted by the size its gzip trailer records (the larger of it and the file's)."""
    total = 0
    for path in [data] if isinstance(data, str) else data:
        size = os.stat(path).st_size
        if path.endswith(".gz") and size >= 4:
            with open(path, "rb") as f:
                f.seek(-4, os.SEEK_END)
                size = max(size, int.from_bytes(f.read(4), "little"))
        total += size
    return total


def prepare_reason(config: TrainConfig, world_size: int = 1) -> str | None:
    """Why a new run of ``config`` prepares its data file into its folder first, in words, or
    None when it reads the file into memory: ``prepare_data`` (``always``, ``never``; ``auto``:
    more than :data:`PREPARE_ABOVE` bytes of text per run, counting every process of a
    torchrun run, which each hold their copy). The bundled corpus and a prepared folder are
    never prepared."""
    if config.data is None or is_prepared(config.data) or config.prepare_data == "never":
        return None
    if config.subword_alpha and config.prepare_data == "auto":
        return None  # sampling needs the text in memory (prepare_data=always is refused)
    if config.prepare_data == "always":
        return "prepare_data=always"
    try:
        size = data_bytes(config.data)
    except OSError:
        return None  # reading it says what is wrong
    held = size * max(world_size, 1)
    if held <= PREPARE_ABOVE:
        return None
    per = f" x {world_size} processes" if world_size > 1 else ""
    return (f"{size / 2**20:,.0f} MiB of text{per}, above the {PREPARE_ABOVE // 2**20} MiB a "
            "run reads into memory; --prepare-data never to read it anyway")  # fmt: skip


def prepared_settings(config: TrainConfig, corpus: PreparedCorpus) -> TrainConfig:
    """``config`` with the data settings of the prepared corpus it names.

    Raises:
        ValueError: a data setting given (not at its default) that differs from the one the
            corpus was made with (named, with both values).
    """
    m = corpus.manifest
    made = {**m["settings"], "src_lang": m["resolved"]["src_lang"],
            "tgt_lang": m["resolved"]["tgt_lang"]}  # fmt: skip
    made = {k: made.get(k, _DEFAULTS[k]) for k in DATA_KEYS}  # a key it predates: the default
    for key in DATA_KEYS:
        given = getattr(config, key)
        if given != _DEFAULTS[key] and given != made[key] and made[key] is not None:
            raise SettingError(
                key,
                f"the prepared corpus {str(corpus.folder)!r} was made with {made[key]!r}, "
                f"given {given!r}; drop the setting, or prepare again with it "
                f"({prepare_command(corpus.folder, m)} ...)",
            )
    return config.updated({k: made[k] for k in DATA_KEYS})


def prepared_run_data(
    config: TrainConfig,
    corpus: PreparedCorpus,
    tokenizers: tuple[Any, Any] | None = None,
) -> RunData:
    """A run's data from a prepared corpus: its tokenizers (or the checkpoint's, ``tokenizers``),
    its held-out parts as text; the training pairs stay in the token arrays on disk.

    Raises:
        ValueError: the resolved tokenizer settings differ from the corpus's.
    """
    resolved = corpus.manifest["resolved"]
    for key in TOKENIZER_KEYS:
        if getattr(config, key) != resolved.get(key):  # a key it predates: None
            raise SettingError(
                key,
                f"the prepared corpus {str(corpus.folder)!r} was made with "
                f"{resolved.get(key)!r}, the run resolves it to {getattr(config, key)!r}; prepare "
                f"again with the run's settings",
            )
    toks = tokenizers if tokenizers is not None else load_tokenizers(corpus.folder / "tokenizers")
    corpus.check_vocabulary(toks[0].vocab_size, toks[1].vocab_size)
    raw_valid, valid = corpus.held_out("valid")
    raw_test, test = corpus.held_out("test")
    data = [r["path"] for r in corpus.manifest["sources"] if r["key"] == "data"]
    return RunData(
        split=corpus.split(),
        train=[],
        valid=valid,
        test=test,
        src_tokenizer=toks[0],
        tgt_tokenizer=toks[1],
        source=f"{corpus.folder} (prepared from {' + '.join(data)})",
        raw_valid=[t for _, t in raw_valid],
        raw_test=[t for _, t in raw_test],
        prepared=corpus,
    )


def open_prepared(folder: str | Path) -> PreparedCorpus:
    """The prepared corpus in ``folder``, its source files checked unchanged.

    Raises:
        ValueError: a source file changed or is gone (named), or the folder is damaged.
    """
    corpus = PreparedCorpus(folder)
    remedy = (
        f"prepare again ({prepare_command(corpus.folder, corpus.manifest)}), or put back "
        "the file it was prepared from"
    )
    check_sources(corpus.manifest["sources"], corpus.folder, remedy)
    return corpus
