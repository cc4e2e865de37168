"""A run's text: read, split, normalised, tokenized; and the split of a saved run read back.

:func:`load_run_data` is what ``qkv train`` trains and validates on; :func:`saved_run_pairs` is
what ``qkv evaluate`` scores a saved model on by default (the run's own test split).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._deps import MissingDependency
from .._errors import SettingError, keyed, setting_of
from ..data import (
    Normalizer,
    ReadReport,
    SentencePieceTokenizer,
    Split,
    Tokenizer,
    VocabSentencePieceTokenizer,
    VocabTooSmall,
    build_tokenizers,
    bundled_pairs,
    fingerprint,
    guess_format,
    split_pairs,
)
from ..data.languages import (
    RICH_CHARACTER_SETS,
    base_language,
    detect_language,
    language_code,
    script_language,
)
from ..data.prepared import PreparedCorpus, PreparedSplit
from ..data.readers import iter_pairs
from ..inference import CheckpointError, load_checkpoint, resolve_model_dir
from .config import TrainConfig

__all__ = [
    "RUN_PARTS",
    "RunData",
    "RunFiles",
    "character_coverage",
    "load_run_data",
    "raw_run_pairs",
    "read_run_files",
    "read_run_pairs",
    "run_languages",
    "run_split",
    "saved_run_pairs",
]

log = logging.getLogger(__name__)


@dataclass
class RunData:
    """A run's text: the split, the three parts (normalised), the tokenizers.

    A run trained on a prepared corpus (``prepared``, a :class:`qkv.data.prepared.
    PreparedCorpus`) holds no training text: ``train`` is empty and its batches come from the
    corpus's token arrays on disk; ``split`` is then a :class:`PreparedSplit`.
    """

    split: Split | PreparedSplit
    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]
    test: list[tuple[str, str]]
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    source: str
    raw_valid: list[str] = field(default_factory=list)
    raw_test: list[str] = field(default_factory=list)
    prepared: PreparedCorpus | None = None

    @property
    def n_train(self) -> int:
        """Training pairs (before any is dropped for its length)."""
        return self.prepared.n_train if self.prepared is not None else len(self.train)


def _normalizer(name: str) -> Normalizer:
    return Normalizer.book() if name == "book" else Normalizer()


# ---------------------------------------------------------------------------- languages
#: pairs sampled to detect the languages of a data file (evenly spread over it)
DETECT_SAMPLE = 500
# the names Tatoeba/Anki downloads give their files: the target's ISO 639-3 code, English first
_ANKI_NAME = re.compile(r"^([a-z]{3})\.txt(?:\.gz)?$")


def _suffix_language(path: str) -> str | None:
    """The language an aligned file's suffix names: ``train.en`` -> ``en`` (``.gz`` aside)."""
    name = Path(path).name
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    return language_code(suffix[1:]) if suffix else None


def _given_languages(config: TrainConfig, data_format: str | None) -> tuple[list, str]:
    """``[source, target]`` (None where unknown) from what the run says of its data, and how."""
    langs = [config.src_lang, config.tgt_lang]
    how = "given"
    if langs[0] and langs[1]:
        return langs, how
    if config.data is None:  # the bundled corpus
        return [langs[0] or "en", langs[1] or "fr"], "the bundled English-French corpus"
    found: list[str | None] = [None, None]
    if config.src_column is not None or config.tgt_column is not None:
        found = [language_code(config.src_column), language_code(config.tgt_column)]
        how = "the column names"
    elif isinstance(config.data, list):
        found = [_suffix_language(p) for p in config.data]
        how = "the files' suffixes"
    elif data_format == "fra":
        m = _ANKI_NAME.match(Path(config.data).name.lower())
        target = language_code(m.group(1)) if m else None
        if target is not None and base_language(target) != "en":
            found = ["en", target]  # fra.txt, deu.txt, cmn.txt: English -> that language
            how = f"the name of the {Path(config.data).name} file (Tatoeba/Anki: English first)"
    return [g or f for g, f in zip(langs, found)], how


def run_languages(
    config: TrainConfig, pairs: list[tuple[str, str]], data_format: str | None = None
) -> tuple[str | None, str | None, str]:
    """A new run's ``(source, target)`` languages and how they were found, in words.

    In order: ``src_lang``/``tgt_lang`` when given; the bundled corpus's (en, fr); named
    columns (``--src-column en --tgt-column zh``); aligned files' suffixes (``train.en`` and
    ``train.zh``); a Tatoeba/Anki file's name (``fra.txt``: English -> French); else detected
    from :data:`DETECT_SAMPLE` pairs spread over the data with :func:`qkv.data.detect_language`
    (the words say the confidence), or, when py3langid is not installed, recognised from its
    script alone (:func:`qkv.data.languages.script_language`: Chinese, Japanese, Korean, Thai,
    Cyrillic, Greek, ...). A language still unknown (a sample with no letters, or Latin script
    without py3langid) is None, and the words say how to give it.
    """
    langs, how = _given_languages(config, data_format)
    if all(langs):
        return langs[0], langs[1], how
    step = max(1, len(pairs) // DETECT_SAMPLE)
    sample = pairs[::step][:DETECT_SAMPLE]
    try:
        found = [detect_language([p[side] for p in sample]) for side in (0, 1)]
        by, note = "detected", ""
    except MissingDependency:  # the script alone names zh, ja, ko, th, ru, el, ...
        found = [script_language([p[side] for p in sample]) for side in (0, 1)]
        by, note = (
            "recognised by its script",
            " (py3langid is not installed: pip install 'qkv[train]')",
        )
    known = any(langs)
    said = []
    for i, name in enumerate(("source", "target")):
        code, confidence = found[i]
        if langs[i] is None and code:
            langs[i] = code
            said.append(f"{name} {code} (confidence {confidence:.2f})")
    missing = " and ".join(n for n, v in zip(("source", "target"), langs) if v is None)
    unknown = (
        f"the {missing} language could not be {by} in the data{note}: give --src-lang/--tgt-lang"
    )
    if not said:
        return langs[0], langs[1], f"{how}; {unknown}"
    words = f"{by} in {len(sample)} sampled pairs{note}: {', '.join(said)}"
    if missing:
        words += f"; {unknown}"
    return langs[0], langs[1], words + (f"; the other from {how}" if known else "")


def character_coverage(config: TrainConfig) -> float:
    """SentencePiece's character coverage for the run: ``character_coverage`` when given, else
    0.9995 when the source or the target is Chinese, Japanese or Korean (a large character
    set), else 1.0, as SentencePiece's authors recommend."""
    if config.character_coverage is not None:
        return float(config.character_coverage)
    langs = [lang for lang in (config.src_lang, config.tgt_lang) if lang]
    return 0.9995 if any(base_language(x) in RICH_CHARACTER_SETS for x in langs) else 1.0


@dataclass
class RunFiles:
    """What a run's data files hold: every pair (the data file's, then the validation file's,
    then the test file's), what they are in words, how many each file gave, and the format
    the data file was read as."""

    pairs: list[tuple[str, str]]
    source: str
    sizes: tuple[int, int, int]
    data_format: str | None = None


def describe_data(data: str | list[str] | None) -> str:
    """A run's data in words: a file, ``a + b`` for aligned files, or the bundled corpus."""
    if data is None:
        return "the bundled English-French corpus"
    return " + ".join(data) if isinstance(data, list) else data


def _file_pairs(config: TrainConfig, key: str, path: str | list[str]) -> Iterator[tuple[str, str]]:
    """The pairs of one of the run's files (``key``: ``data``, ``valid_data``, ``test_data``)
    as a stream, its skipped lines checked at its end; errors named by ``key``."""
    aligned = isinstance(path, list)
    fmt = "aligned" if aligned else config.data_format
    if fmt == "aligned" and not aligned:
        fmt = None  # the format of the two files of --data, not of this one
    named = not aligned and fmt not in ("fra", "aligned")
    source = describe_data(path)
    try:
        stream, report = iter_pairs(
            tuple(path) if aligned else path,
            fmt,
            src_column=config.src_column if named else None,
            tgt_column=config.tgt_column if named else None,
        )
        yield from stream
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise _as_data_error(e, source, key) from None
    _check_skipped(report, config.max_skipped, key)


def _read_file(config: TrainConfig, key: str, path: str | list[str]) -> list[tuple[str, str]]:
    """The pairs of one of the run's files, as a list (:func:`_file_pairs`)."""
    return list(_file_pairs(config, key, path))


def run_data_format(config: TrainConfig) -> str | None:
    """The format the run's data file is read as (guessed when not given and no column is
    named): what :func:`run_languages` reads a Tatoeba/Anki name by."""
    if config.data is None:
        return None
    fmt = "aligned" if isinstance(config.data, list) else config.data_format
    if fmt is None and config.src_column is None and config.tgt_column is None:
        fmt = guess_format(config.data)
    return fmt


def iter_run_files(config: TrainConfig) -> Iterator[tuple[str, tuple[str, str]]]:
    """The pairs of :func:`read_run_files` as a stream of ``(key, pair)``, ``key`` the file's
    setting (``data``, ``valid_data``, ``test_data``): the data file's cut to ``max_pairs``
    (the file still read to its end, for its count of unreadable lines), then the others'."""
    if config.data is None:
        raise SettingError("data", "expected a corpus file (or two aligned files), got None")
    limit = config.max_pairs
    for i, pair in enumerate(_file_pairs(config, "data", config.data)):
        if limit is None or i < limit:
            yield "data", pair
    for key in ("valid_data", "test_data"):
        path = getattr(config, key)
        if path is not None:
            for pair in _file_pairs(config, key, path):
                yield key, pair


def read_run_files(config: TrainConfig) -> RunFiles:
    """The raw pairs of the run: ``config.data`` (the bundled corpus when None, cut to
    ``max_pairs``), then ``valid_data`` and ``test_data`` when given (see :class:`RunFiles`).

    Skipped lines are reported through :mod:`logging` (a WARNING with the counts by reason and
    the first line numbers); a file whose unreadable lines (blank ones aside) are more than
    ``config.max_skipped`` of its lines is refused.

    Raises:
        ValueError, FileNotFoundError: a file cannot be read, or is mostly unreadable; the
            message starts with the setting (``data:``, ``valid_data:``, ``test_data:``;
            ``data_format:`` for an unknown format).
    """
    pairs = bundled_pairs() if config.data is None else _read_file(config, "data", config.data)
    fmt = run_data_format(config)
    if config.max_pairs is not None:
        pairs = pairs[: config.max_pairs]
    n = len(pairs)
    extra = [
        _read_file(config, key, path) if path is not None else []
        for key, path in (("valid_data", config.valid_data), ("test_data", config.test_data))
    ]
    source = describe_data(config.data)
    return RunFiles(pairs + extra[0] + extra[1], source, (n, len(extra[0]), len(extra[1])), fmt)


def read_run_pairs(config: TrainConfig) -> tuple[list[tuple[str, str]], str]:
    """Every raw pair of the run and what the data is in words (:func:`read_run_files`)."""
    files = read_run_files(config)
    return files.pairs, files.source


def run_split(config: TrainConfig, files: RunFiles) -> Split:
    """A new run's split: the validation and test files when given, and the parts not given
    split off the data file (``valid``, ``test``, ``split_seed``; see
    :func:`qkv.data.split_pairs`)."""
    n, n_valid, n_test = files.sizes
    given_valid, given_test = config.valid_data is not None, config.test_data is not None
    if not given_valid and not given_test:
        return split_pairs(
            files.pairs, valid=config.valid, test=config.test, seed=config.split_seed
        )
    inner = split_pairs(
        files.pairs[:n],
        valid=0 if given_valid else config.valid,
        test=0 if given_test else config.test,
        seed=config.split_seed,
    )
    valid = tuple(range(n, n + n_valid)) if given_valid else inner.valid
    test = tuple(range(n + n_valid, n + n_valid + n_test)) if given_test else inner.test
    return Split(
        n=len(files.pairs),
        seed=config.split_seed,
        fingerprint=fingerprint(files.pairs),
        train=inner.train,
        valid=valid,
        test=test,
    )


def _as_data_error(err: BaseException, source: str, key: str = "data") -> BaseException:
    """A reader's error (``err``) as the run's setting names it, of the same type: ``data``
    (the file), not ``path``; ``data_format``, not ``format``; a column named as its setting
    and flag; an error about no setting of the reader's as one about the file ``key``."""
    setting = setting_of(err)
    name, problem = setting if setting is not None else ("", str(err))
    if name == "path":
        return keyed(type(err), key, problem)
    if name == "format":
        return keyed(type(err), "data_format", problem)
    if name in ("src_column", "tgt_column"):  # named as the setting and its flag
        flag = "--" + name.replace("_", "-")
        problem = problem.replace(f"pass {name}= to choose one", f"pass {flag} NAME ({name})")
        return keyed(type(err), name, f"{problem} (data {source!r})")
    return keyed(type(err), key, f"{source!r}: {err!s}")


def apply_split(split: Split, pairs: list[tuple[str, str]], source: str, remedy: str) -> tuple:
    """``split.apply(pairs)``, or a ValueError that names the data file, what changed and
    ``remedy`` (what to run instead) when the pairs are not the ones the run was split from."""
    try:
        return split.apply(pairs)
    except ValueError:
        if len(pairs) != split.n:
            what = f"it gives {len(pairs)} pairs, the run was split from {split.n}"
        else:
            what = f"its {len(pairs)} pairs are not the text the run was split from"
        raise SettingError(
            "data",
            f"{source!r} changed since the run was split ({what}; split.json "
            f"fingerprint {split.fingerprint}): {remedy}",
        ) from None


#: what to do when a resumed run's data changed
RESUME_REMEDY = (
    "put back the file the run was trained on, or start a new run in a new folder "
    "(qkv train --data FILE --out NEW_DIR; add --init-from OLD_RUN to keep its weights)"
)
#: what to do when the data of a run being scored changed
EVALUATE_REMEDY = (
    "put back the file the run was trained on, or score another file with "
    "qkv evaluate --model-dir RUN --data FILE"
)


def _check_skipped(report: ReadReport, max_skipped: float, key: str = "data") -> None:
    """Refuse a mostly unreadable file; report the skipped lines of an accepted one."""
    bad, frac = report.n_unreadable, report.unreadable_fraction
    if bad and frac > max_skipped:
        allowed = (
            "none may be (max_skipped=0, --strict)"
            if max_skipped == 0
            else f"at most {max_skipped:.1%} may be (max_skipped={max_skipped:g}, --max-skipped)"
        )
        raise SettingError(
            key,
            f"{bad} of the {report.pairs + bad} lines of {report.path} ({frac:.1%}) "
            f"cannot be read, {allowed}; blank lines are not counted: "
            f"{report.summary(blank=False)}",
        )
    if report.n_skipped and os.environ.get("RANK", "0") == "0":  # said once under torchrun
        log.warning(
            "%s (%s): %d of %d lines skipped: %s",
            report.path,
            report.format,
            report.n_skipped,
            report.lines,
            report.summary(),
        )


def raw_run_pairs(
    config: TrainConfig, split: Split
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """The run's train, valid and test pairs exactly as the data file holds them (not
    normalised): what translations are scored against."""
    pairs, source = read_run_pairs(config)
    train, valid, test = apply_split(split, pairs, source, EVALUATE_REMEDY)
    return list(train), list(valid), list(test)


#: the parts of a run's data, in the order :meth:`qkv.data.Split.apply` returns them
RUN_PARTS = ("train", "valid", "test")


def saved_run_pairs(model_dir: str | Path, part: str = "test") -> tuple[list[tuple[str, str]], str]:
    """One part of the data a saved model was trained on, as the data file holds it (not
    normalised: what ``qkv evaluate`` scores against), and what it is in words.

    Args:
        model_dir: a ``qkv train --out`` folder or one of its checkpoint or model folders (see
            :func:`qkv.inference.resolve_model_dir`).
        part: ``"train"``, ``"valid"`` or ``"test"``.

    Returns:
        ``(pairs, description)``, e.g. ``"the test split of data/en-fr.tsv"``; no pairs
        when that part of the run is empty.

    Raises:
        ValueError: an unknown ``part``, or data that is not the data the run was split from.
        CheckpointError: no usable checkpoint there.
    """
    if part not in RUN_PARTS:
        raise ValueError(f"part: expected one of {RUN_PARTS}, got {part!r}")
    ckpt = load_checkpoint(resolve_model_dir(model_dir), with_tensors=False)
    if PreparedSplit.describes(ckpt.split):
        return _prepared_pairs(ckpt, part)
    try:
        config = TrainConfig.from_dict(ckpt.train_config)
        split = Split.from_dict(ckpt.split)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint: {str(ckpt.path)!r} is unusable: {e}") from None
    pairs = dict(zip(RUN_PARTS, raw_run_pairs(config, split)))[part]
    given = {"valid": config.valid_data, "test": config.test_data}.get(part)
    if given is not None:
        return pairs, f"the {part} set of the run ({describe_data(given)})"
    return pairs, f"the {part} split of {describe_data(config.data)}"


#: the most training pairs the tokenizers are trained on: a seeded sample of a larger corpus
#: (SentencePiece learns its pieces from a sample as well as from all: its own
#: ``input_sentence_size`` exists for this)
TOKENIZER_SAMPLE = 200_000
#: the most characters (both sides) of that sample the tokenizers are trained on: what
#: SentencePiece's trainer holds grows with them (its suffix array, about 20 bytes a
#: character, measured in ``benchmarks/big_file.py``), so a corpus of long sentences is
#: sampled further; 20M characters are about 130,000 pairs of Europarl-length sentences
TOKENIZER_CHARS = 20_000_000


def tokenizer_sample(pairs: list, seed: int) -> list:
    """``pairs`` when there are at most :data:`TOKENIZER_SAMPLE`, else that many of them drawn
    without replacement from ``seed`` (the split's), in their order, then cut to
    :data:`TOKENIZER_CHARS` characters (:func:`within_characters`): what the tokenizers learn
    from. The same for a run that reads its file and for ``qkv prepare``."""
    if len(pairs) > TOKENIZER_SAMPLE:
        pairs = [pairs[i] for i in tokenizer_sample_indices(len(pairs), seed).tolist()]
    return within_characters(pairs, seed)


def within_characters(pairs: list, seed: int) -> list:
    """``pairs`` when their sides hold at most :data:`TOKENIZER_CHARS` characters in all,
    else the pairs of a seeded random order (``seed``) up to that many characters, in their
    order."""
    chars = TOKENIZER_CHARS
    lengths = np.fromiter((len(s) + len(t) for s, t in pairs), np.int64, len(pairs))
    if int(lengths.sum()) <= chars:
        return pairs
    order = np.random.default_rng([seed, 7927]).permutation(len(pairs))
    n = int(np.searchsorted(np.cumsum(lengths[order]), chars, side="right"))
    return [pairs[i] for i in np.sort(order[: max(n, 1)]).tolist()]


def tokenizer_sample_indices(n: int, seed: int) -> np.ndarray:
    """The sorted positions among ``n`` training pairs that :func:`tokenizer_sample` draws
    (before :func:`within_characters`)."""
    limit = TOKENIZER_SAMPLE
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, 7919]).choice(n, limit, replace=False))


def run_normalizer(
    config: TrainConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None = None
) -> Normalizer:
    """The run's normaliser: the one saved with its tokenizers when given (none for an
    imported model's, whose SentencePiece models normalise: the text goes to them as it is),
    else the one ``config.normalizer`` names (``auto``: the book's for the bundled corpus, else
    plain)."""
    saved = tokenizers[0].normalizer if tokenizers is not None else None
    if saved is not None:
        return saved
    if tokenizers is not None and tokenizers[0].kind == VocabSentencePieceTokenizer.kind:
        return Normalizer(unicode_form=None, collapse_whitespace=False)
    bundled = config.data is None
    name = config.normalizer if config.normalizer != "auto" else ("book" if bundled else "plain")
    return _normalizer(name)


def vocab_above(need: int) -> int:
    """The vocabulary qkv takes when the size it chose is below the ``need`` pieces of the
    text's characters: a quarter more (at least 64), so that pieces join characters too."""
    return need + max(64, need // 4)


def run_tokenizers(
    config: TrainConfig,
    norm: Normalizer,
    train: list[tuple[str, str]],
    *,
    vocab_given: bool = True,
) -> tuple[Tokenizer, Tokenizer]:
    """The run's tokenizers trained on ``train`` (normalised pairs) as ``config`` says, or the
    SentencePiece model(s) it names (``tokenizer_model``), used as they are.

    A ``vocab_size`` below what SentencePiece needs for the text's characters (one piece each,
    as Chinese or Japanese text has thousands) is raised to :func:`vocab_above` of that
    minimum, said in one line, when qkv chose it (``vocab_given=False``: the preset's or the
    default); one the user gave is a :class:`~qkv._errors.SettingError` naming ``--set
    vocab_size=N`` and the minimum.
    """
    model = config.tokenizer_model
    if model is not None:
        if isinstance(model, str):
            tok = SentencePieceTokenizer.from_file(model, norm)
            return tok, tok
        return (
            SentencePieceTokenizer.from_file(model[0], norm),
            SentencePieceTokenizer.from_file(model[1], norm),
        )
    kind = config.tokenizer
    if kind == "auto":
        kind = "word" if config.data is None else "sentencepiece"
    joint = config.joint_vocab if config.joint_vocab is not None else kind == "sentencepiece"
    opts: dict[str, Any] = (
        {"min_freq": config.min_freq}
        if kind == "word"
        else {
            "vocab_size": config.vocab_size or 8000,
            "model_type": config.subword_model,
            "byte_fallback": config.byte_fallback,
            "character_coverage": character_coverage(config),
        }
    )
    try:
        return build_tokenizers(
            train, kind, joint=joint, normalizer=norm, pre_normalized=True, **opts
        )
    except VocabTooSmall as e:
        if vocab_given:
            raise SettingError(
                "vocab_size",
                f"{e.vocab_size} pieces are too few for this data: SentencePiece needs at least "
                f"{e.need} (the specials and one per distinct character); pass --set "
                f"vocab_size={e.need} or more, or leave it out for qkv to choose",
            ) from None
        opts["vocab_size"] = vocab_above(e.need)
        log.info(
            "vocab_size: %d pieces are too few for this data's characters (SentencePiece needs "
            "%d); using %d",
            e.vocab_size,
            e.need,
            opts["vocab_size"],
        )
    return build_tokenizers(train, kind, joint=joint, normalizer=norm, pre_normalized=True, **opts)


def _prepared_pairs(ckpt: Any, part: str) -> tuple[list[tuple[str, str]], str]:
    """One held-out part of a run trained on a prepared corpus, as its files held it."""
    split = PreparedSplit.from_dict(ckpt.split)
    if part == "train":
        raise ValueError(
            f"part: the run trained on the prepared corpus {split.corpus!r}, which keeps its "
            "training pairs as tokens, not text; score its valid or test part, or a file"
        )
    try:
        corpus = PreparedCorpus(split.corpus)
    except ValueError as e:
        raise ValueError(f"{e} (the corpus the run in {str(ckpt.path)!r} trained on)") from None
    if corpus.fingerprint != split.fingerprint:
        raise SettingError(
            "data",
            f"the prepared corpus {split.corpus!r} was prepared again since the run "
            f"trained on it (fingerprint {corpus.fingerprint}, the run's {split.fingerprint}): "
            f"{EVALUATE_REMEDY}",
        )
    return corpus.held_out(part)[0], f"the {part} split of the prepared corpus {split.corpus}"


def load_run_data(
    config: TrainConfig,
    *,
    split: Split | None = None,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    pairs: tuple[list[tuple[str, str]], str] | None = None,
    vocab_given: bool = True,
) -> RunData:
    """Read, split and normalise the run's pairs, and build (or take) the tokenizers.

    With ``split`` (a resumed run, or evaluation) the saved split is applied, which checks that
    the data is the data the run was trained on. ``pairs`` gives the ``(pairs, source)`` that
    :func:`read_run_pairs` returned, when they were read already. The references of the
    validation and test parts are also kept as they were read (``raw_valid``, ``raw_test``):
    translations are scored against those, as sacreBLEU scores. ``vocab_given``: the run's
    ``vocab_size`` is the user's, not qkv's choice (:func:`run_tokenizers`).
    """
    pairs_read, source = pairs if pairs is not None else read_run_pairs(config)
    if split is None:
        split = split_pairs(
            pairs_read, valid=config.valid, test=config.test, seed=config.split_seed
        )
    train, valid, test = apply_split(split, pairs_read, source, RESUME_REMEDY)
    if not train or not valid:
        raise SettingError(
            "data",
            f"{source} gives {len(train)} training and {len(valid)} validation pairs; "
            "expected some of each (more data, or other valid/test sizes)",
        )
    raw_valid, raw_test = [t for _, t in valid], [t for _, t in test]
    # a resumed run keeps the normaliser saved with its tokenizers, even if the named one changed
    norm = run_normalizer(config, tokenizers)
    train, valid, test = norm.pairs(train), norm.pairs(valid), norm.pairs(test)
    if tokenizers is None:
        sample = tokenizer_sample(train, config.split_seed)
        src_tok, tgt_tok = run_tokenizers(config, norm, sample, vocab_given=vocab_given)
    else:
        src_tok, tgt_tok = tokenizers
    return RunData(split, train, valid, test, src_tok, tgt_tok, source, raw_valid, raw_test)
