"""The training configuration: one flat dataclass, layered defaults < file < flags.

:class:`TrainConfig` holds everything a run needs besides its output folder. It is saved in every
checkpoint (``train.json``), so ``--resume`` continues with exactly the settings the run started
with. A config file is YAML (``.yaml``/``.yml``) or TOML (``.toml``) with the same keys; the
model's own options (the fields of :class:`qkv.nn.Seq2SeqConfig` besides the vocabulary sizes) go
in a ``model`` table, whose ``kind`` is the model kind::

    # run.toml
    max_steps = 4000
    lr = 1e-3
    [model]
    kind = "transformer"
    num_hiddens = 128
    num_enc_layers = 2

Flags override the file; ``--set KEY=VALUE`` reaches any key (``--set model.dropout=0.2``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import SettingError
from ..data.languages import check_language
from ..inference.scores import BLEU_TOKENIZERS, bleu_tokenizer, tokenizer_modules
from ..nn.seq2seq import MODEL_KINDS, Seq2SeqConfig
from .schedules import SCHEDULES
from .tiers import TIERS

__all__ = [
    "RESUMABLE_KEYS",
    "TrainConfig",
    "load_config_file",
    "parse_assignment",
    "required_modules",
]

#: the update limit of a run with neither ``max_steps`` nor ``max_minutes``
DEFAULT_MAX_STEPS = 10_000
#: "no limit" for a run bounded by its clock alone
UNLIMITED_STEPS = 10**12

#: Keys that may change when a run is resumed: they stop, log or save, but do not change the
#: trajectory of the weights.
RESUMABLE_KEYS: frozenset[str] = frozenset(
    {
        "max_steps",
        "max_minutes",
        "patience",
        "eval_every",
        "save_every",
        "keep_last",
        "log_every",
        "tensorboard",
        "eval_sentences",
        "device",
        "threads",
        "dist_timeout_minutes",
        "average_last",
        "tune_decoding",
        "max_skipped",
        "prepare_data",
    }
)

_MODEL_FIELDS = {f.name for f in dataclasses.fields(Seq2SeqConfig)} - {
    "src_vocab_size",
    "tgt_vocab_size",
    "kind",
}
#: a setting's old name -> its name: read from config files, ``--set`` and older runs' train.json
#: (``max_len`` names a model's position table, ``model.max_len``, and nothing else)
_RENAMED_KEYS = {"max_len": "max_pair_len"}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class TrainConfig:
    """Everything that defines a training run (besides where it writes).

    Data:
        data: a parallel-text file in any :func:`qkv.data.read_pairs` format (``fra`` ``tsv``
            ``csv`` ``jsonl``, optionally ``.gz``), or two aligned files ``[source, target]``
            (``["train.en", "train.fr"]``: line i translates line i); None for the bundled
            English-French corpus.
        valid_data, test_data: a validation and a test set of their own, in any of those
            formats (a file or two aligned files); None: taken from ``data`` (``valid``,
            ``test``). The run's split is then these files, recorded in ``split.json``.
        src_lang, tgt_lang: the source and target languages (ISO 639-1/BCP-47 codes, checked);
            None: read from the data (named columns, aligned files' suffixes, a ``fra.txt``
            file's name) or detected from a sample of it, and recorded in the model.
        tokenize: sacreBLEU's BLEU tokenizer for validation, the average and the decoding
            choice; None: the target language's, as ``sacrebleu -l SRC-TGT`` picks it (``zh``,
            ``ja-mecab``, ``ko-mecab``, else ``13a``).
        character_coverage: SentencePiece's character coverage; None: 0.9995 when a side is
            Chinese, Japanese or Korean, else 1.0 (what SentencePiece's authors recommend).
        data_format: the file's format, or None to guess.
        src_column, tgt_column: the source and target columns of a tsv or csv file with a
            header row, or fields of a jsonl file; None: ``src``/``source`` and
            ``tgt``/``target``. Naming one reads a tab-separated file as tsv (its header row).
        max_pairs: use only the first N pairs of the file (quick experiments), or None.
        max_skipped: the largest fraction of the file's lines (blank lines aside) that may be
            unreadable (wrong columns, an empty side, bad UTF-8, ...); a file with more is
            refused, with the counts. 0: any unreadable line is an error (``--strict``).
        prepare_data: ``"auto"``: a data file larger than
            :data:`qkv.train.corpus.PREPARE_ABOVE` bytes (times the processes of a torchrun
            run) is prepared into ``OUT/data`` (:func:`qkv.train.prepare_corpus`: token arrays
            on disk) and trained from there, a smaller one read into memory (the same
            batches either way); ``"always"`` or ``"never"`` to choose. A resumed run keeps
            the data it started with.
        valid, test: held-out parts, a fraction (float) or a count (int); see
            :func:`qkv.data.split_pairs`.
        split_seed: the split's seed.
        normalizer: ``"auto"`` (``"plain"`` for user data, ``"book"`` for the bundled corpus),
            ``"book"`` (the book's ``preprocess_nmt``: lower case, space before punctuation) or
            ``"plain"`` (NFC and whitespace only: real, cased text). Saved with the tokenizers.
        tokenizer: ``"auto"`` (``"sentencepiece"`` for user data, ``"word"`` for the bundled
            corpus), ``"word"`` or ``"sentencepiece"``.
        min_freq: rarer words become ``<unk>`` (word tokenizer).
        vocab_size: subword vocabulary size (sentencepiece); None: the preset's, from the
            corpus size.
        joint_vocab: one vocabulary for both sides; None: joint for sentencepiece (and then
            shared, tied embeddings), separate for words.
        subword_model: ``"unigram"`` or ``"bpe"`` (sentencepiece).
        byte_fallback: unknown characters are spelled in bytes (sentencepiece), so no
            translation ever prints ``<unk>`` or `` ⁇ ``.
        tokenizer_model: an existing SentencePiece model used as it is instead of training one:
            a ``.model`` file for both sides (one vocabulary, shared and tied embeddings), or
            ``[source, target]`` two files; its special pieces are mapped onto qkv's ids
            (:class:`qkv.data.SentencePieceTokenizer`). None: trained on the data.
        subword_alpha: subword regularisation while training: every epoch draws a new
            segmentation of each training sentence, both sides, with SentencePiece's sampling
            (unigram: the smoothing ``alpha``: SentencePiece suggests 0.1, which over all
            segmentations doubled a real corpus's pieces per sentence, where 0.5 added 4%; BPE:
            the BPE-dropout probability). 0: off. Never at validation, evaluation or translation.
        subword_nbest_size: unigram sampling draws from the ``nbest_size`` best segmentations,
            or from all with -1 (SentencePiece's ``nbest_size``); BPE ignores it.
        max_pair_len: training examples longer than this (in tokens, with ``<eos>``) are dropped;
            translations during validation stop there too.

    Model:
        model: ``"transformer"`` or ``"bahdanau"``.
        model_options: other :class:`qkv.nn.Seq2SeqConfig` fields (``num_hiddens``, ...); the
            preset fills the fields not given.
        preset: ``"auto"`` (chosen from the corpus size, the budget and the device; see
            :mod:`qkv.train.presets`), a tier name of :data:`qkv.train.presets.TIERS`, or
            ``"none"`` (the plain defaults of every class).

    Optimisation:
        max_steps: the most optimizer updates; None: 10,000 without ``max_minutes``, and no
            limit but the clock with it (:attr:`step_limit`).
        max_minutes: the run's time budget: training, evaluations and the final averaging and
            decoding choice fit in it. It counts the whole run: a resumed run has what its
            earlier invocations left (a larger value goes on after the end); None: no limit.
        max_tokens: token budget of one micro-batch (padded positions, see
            :class:`qkv.data.TokenBatcher`), per process; None: the preset's.
        accum_steps: micro-batches per update (gradient accumulation).
        lr: the peak learning rate, reached after the warm-up; None: the preset's.
        warmup_steps: linear warm-up updates; None: 10% of the run's planned updates (re-planned
            as a time-bounded run measures its speed), at least 10.
        schedule: ``"auto"`` (``"linear"`` decay to the end of the run), ``"linear"``,
            ``"cosine"`` or ``"inverse_sqrt"`` (the 2017 paper's, which never ends).
        min_lr_ratio: the linear/cosine decay ends at this fraction of the peak.
        weight_decay: AdamW's decoupled weight decay (not applied to biases, norms, embeddings).
        betas, adam_eps: AdamW's.
        label_smoothing: epsilon of the label-smoothed cross-entropy; None: the preset's (0 for
            a run that sees its data only a few times, else 0.1; 0.1 with no preset and for
            fine-tuning).
        clip_norm: clip the global gradient norm to this; 0 disables clipping.
        bf16: run the forward pass under bfloat16 autocast (the loss's softmax and the weights
            stay float32); None: automatic, on where the speed probe runs (a timed CPU run of
            one process with the automatic preset) on a CPU with bfloat16 arithmetic and
            measures it at least ``BF16_GAIN`` times faster (:mod:`qkv.train.presets`), else off.
        seed: seeds the weights, dropout and batch order.

    Evaluation and checkpoints:
        eval_every: validation loss and sacreBLEU every N updates (and at the end); None: about
            six evaluations over the planned run.
        eval_sentences: validation sentences decoded for BLEU (0: all).
        eval_beam: beam size for the validation BLEU (1: greedy).
        save_every: checkpoint every N updates (and after every evaluation, and at the end);
            None: about twelve over the planned run, so the last ones can be averaged.
        keep_last: keep the newest N checkpoints (the best by validation BLEU is kept as well).
        average_last: at the end, average the weights of the newest N checkpoints and keep the
            average when it validates better (0 or 1: off).
        tune_decoding: at the end, choose the beam size and length penalty on the validation
            split; ``qkv translate``/``evaluate`` then use them by default.
        patience: stop after this many scheduled evaluations without a better BLEU (a final
            evaluation off the schedule does not count); 0 never stops early.
        log_every: a progress line every N updates.
        tensorboard: also write TensorBoard logs to ``OUT/tensorboard`` (needs ``tensorboard``).
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        threads: CPU threads for torch (0: leave torch's default).
        dist_timeout_minutes: under torchrun, how long a collective waits for the other
            processes before failing (``init_process_group(timeout=...)``); it must exceed the
            longest validation, which rank 0 runs alone while the others wait.
    """

    data: str | list[str] | None = None
    valid_data: str | list[str] | None = None
    test_data: str | list[str] | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    tokenize: str | None = None
    character_coverage: float | None = None
    data_format: str | None = None
    src_column: str | None = None
    tgt_column: str | None = None
    max_pairs: int | None = None
    max_skipped: float = 0.1
    prepare_data: str = "auto"
    valid: float | int = 0.05
    test: float | int = 0.05
    split_seed: int = 0
    normalizer: str = "auto"
    tokenizer: str = "auto"
    min_freq: int = 2
    vocab_size: int | None = None
    joint_vocab: bool | None = None
    subword_model: str = "unigram"
    byte_fallback: bool = True
    tokenizer_model: str | list[str] | None = None
    subword_alpha: float = 0.0
    subword_nbest_size: int = -1
    max_pair_len: int = 64
    model: str = "transformer"
    model_options: dict[str, Any] = field(default_factory=dict)
    preset: str = "auto"
    max_steps: int | None = None
    max_minutes: float | None = None
    max_tokens: int | None = None
    accum_steps: int = 1
    lr: float | None = None
    warmup_steps: int | None = None
    schedule: str = "auto"
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    label_smoothing: float | None = None
    clip_norm: float = 1.0
    bf16: bool | None = None
    seed: int = 0
    eval_every: int | None = None
    eval_sentences: int = 300
    eval_beam: int = 1
    save_every: int | None = None
    keep_last: int = 3
    average_last: int = 3
    tune_decoding: bool = True
    patience: int = 0
    log_every: int = 50
    tensorboard: bool = False
    device: str = "auto"
    threads: int = 0
    dist_timeout_minutes: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            self.betas = tuple(self.betas)
        for name in ("data", "valid_data", "test_data"):  # a JSON list of two files
            v = getattr(self, name)
            if isinstance(v, tuple):
                setattr(self, name, list(v))
        self.validate()
        for name in ("src_lang", "tgt_lang"):  # the canonical spelling (zh-cn -> zh-CN)
            if getattr(self, name) is not None:
                setattr(self, name, check_language(getattr(self, name), name))

    # -- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        """Check every field; ValueError/TypeError naming the field otherwise."""
        self._check_data()
        self._check_choices()
        self._check_counts()
        self._check_numbers()
        self._check_model_options()

    def _need(self, ok: bool, name: str, what: str) -> None:
        if not ok:
            raise SettingError(name, f"expected {what}, got {getattr(self, name)!r}")

    def _check_data(self) -> None:
        """The data fields: the file, its columns and split, the text's normaliser and
        tokenizer."""
        need = self._need
        for name in ("data", "valid_data", "test_data"):
            v = getattr(self, name)
            need(
                v is None
                or isinstance(v, str)
                or (isinstance(v, list) and len(v) == 2 and all(isinstance(p, str) for p in v)),
                name,
                "a path, two aligned files [source, target], or None",
            )
        for name in ("src_lang", "tgt_lang"):
            if getattr(self, name) is not None:
                check_language(getattr(self, name), name)
        self._check_subwords()
        if self.tokenize is not None and self.tokenize not in BLEU_TOKENIZERS:
            raise SettingError(
                "tokenize", f"expected one of {', '.join(BLEU_TOKENIZERS)}, got {self.tokenize!r}"
            )
        cc = self.character_coverage
        need(
            cc is None or (_is_num(cc) and 0.9 <= cc <= 1.0),
            "character_coverage",
            "a number in [0.9, 1] or None (auto)",
        )
        need(
            self.data_format is None or isinstance(self.data_format, str),
            "data_format",
            "a format name or None",
        )
        for name in ("src_column", "tgt_column"):
            v = getattr(self, name)
            need(
                v is None or (isinstance(v, str) and bool(v.strip())),
                name,
                "a column or field name, or None",
            )
        need(
            self.max_pairs is None or (_is_int(self.max_pairs) and self.max_pairs >= 10),
            "max_pairs",
            "an int >= 10 or None",
        )
        need(
            _is_num(self.max_skipped) and 0 <= self.max_skipped <= 1,
            "max_skipped",
            "a fraction of the lines in [0, 1]",
        )
        need(
            self.prepare_data in ("auto", "always", "never"),
            "prepare_data",
            "'auto', 'always' or 'never'",
        )
        for name in ("valid", "test"):
            v = getattr(self, name)
            need(
                (_is_int(v) and v >= 1) or (isinstance(v, float) and 0 < v < 1),
                name,
                "a fraction in (0, 1) or a count >= 1",
            )
        need(
            self.normalizer in ("auto", "book", "plain"), "normalizer", "'auto', 'book' or 'plain'"
        )
        need(
            self.tokenizer in ("auto", "word", "sentencepiece"),
            "tokenizer",
            "'auto', 'word' or 'sentencepiece'",
        )
        need(self.subword_model in ("unigram", "bpe"), "subword_model", "'unigram' or 'bpe'")

    def _check_subwords(self) -> None:
        """A SentencePiece model of the user's and subword sampling, against the tokenizer
        settings they override or need."""
        need, model = self._need, self.tokenizer_model
        need(
            model is None
            or (isinstance(model, str) and bool(model))
            or (
                isinstance(model, list)
                and len(model) == 2
                and all(isinstance(p, str) and p for p in model)
            ),
            "tokenizer_model",
            "a SentencePiece .model file, two files [source, target], or None",
        )
        if model is not None:
            one = isinstance(model, str)
            for name, ok, why in (
                (
                    "tokenizer",
                    self.tokenizer in ("auto", "sentencepiece"),
                    "'auto' or 'sentencepiece'",
                ),
                ("vocab_size", self.vocab_size is None, "None: the model's vocabulary is used"),
                (
                    "joint_vocab",
                    self.joint_vocab in (None, one),
                    f"None or {one} ({'one model: one vocabulary' if one else 'two models: two vocabularies'})",
                ),
            ):
                if not ok:
                    raise SettingError(
                        name,
                        f"expected {why} with tokenizer_model={model!r}, got {getattr(self, name)!r}",
                    )
        alpha = self.subword_alpha
        need(
            _is_num(alpha) and 0 <= alpha < math.inf,
            "subword_alpha",
            "a number >= 0 (0: no subword sampling)",
        )
        nbest = self.subword_nbest_size
        need(
            _is_int(nbest) and (nbest == -1 or nbest >= 2),
            "subword_nbest_size",
            "-1 (all segmentations) or an int >= 2",
        )
        words = self.tokenizer == "word" or (
            self.tokenizer == "auto" and self.data is None and model is None
        )
        if _is_num(alpha) and alpha > 0 and words:
            raise SettingError(
                "subword_alpha",
                f"expected 0 with the word tokenizer (tokenizer={self.tokenizer!r}"
                f"{', the bundled corpus' if self.data is None else ''}: words have one "
                f"segmentation), got {alpha!r}; sampling needs tokenizer='sentencepiece'",
            )

    def _check_choices(self) -> None:
        """The names chosen from a list: model kind, preset, schedule."""
        need = self._need
        need(self.model in MODEL_KINDS, "model", f"one of {MODEL_KINDS}")
        need(
            isinstance(self.preset, str) and self.preset in ("auto", "none", *TIERS),
            "preset",
            f"'auto', 'none' or one of {tuple(TIERS)}",
        )
        need(self.schedule in ("auto", *SCHEDULES), "schedule", f"'auto' or one of {SCHEDULES}")

    def _check_counts(self) -> None:
        """The integer fields (some None for auto) and the switches."""
        need = self._need
        for name, lo in (
            ("split_seed", 0),
            ("min_freq", 1),
            ("max_pair_len", 2),
            ("accum_steps", 1),
            ("seed", 0),
            ("eval_sentences", 0),
            ("eval_beam", 1),
            ("keep_last", 1),
            ("average_last", 0),
            ("patience", 0),
            ("log_every", 1),
            ("threads", 0),
        ):
            need(
                _is_int(getattr(self, name)) and getattr(self, name) >= lo, name, f"an int >= {lo}"
            )
        for name, lo in (
            ("max_steps", 1),
            ("vocab_size", 8),
            ("max_tokens", 2),
            ("warmup_steps", 0),
            ("eval_every", 1),
            ("save_every", 1),
        ):
            v = getattr(self, name)
            need(v is None or (_is_int(v) and v >= lo), name, f"an int >= {lo}, or None (auto)")
        need(
            self.joint_vocab is None or isinstance(self.joint_vocab, bool),
            "joint_vocab",
            "true, false or None (auto)",
        )
        for name in ("tensorboard", "byte_fallback", "tune_decoding"):
            need(isinstance(getattr(self, name), bool), name, "true or false")
        need(self.bf16 is None or isinstance(self.bf16, bool), "bf16", "true, false or None (auto)")

    def _check_numbers(self) -> None:
        """The real-valued fields (optimisation, time limits) and the device."""
        need = self._need
        need(
            self.max_minutes is None
            or (_is_num(self.max_minutes) and 0 < self.max_minutes < math.inf),
            "max_minutes",
            "a positive finite number of minutes, or None (no time limit)",
        )
        need(
            self.lr is None or (_is_num(self.lr) and 0 < self.lr < math.inf),
            "lr",
            "a positive finite number, or None (auto)",
        )
        need(
            _is_num(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1,
            "min_lr_ratio",
            "a number in [0, 1]",
        )
        need(
            _is_num(self.dist_timeout_minutes) and 0 < self.dist_timeout_minutes < math.inf,
            "dist_timeout_minutes",
            "a positive finite number of minutes",
        )
        need(_is_num(self.weight_decay) and self.weight_decay >= 0, "weight_decay", "a number >= 0")
        need(
            isinstance(self.betas, tuple)
            and len(self.betas) == 2
            and all(_is_num(b) and 0 <= b < 1 for b in self.betas),
            "betas",
            "two numbers in [0, 1)",
        )
        need(_is_num(self.adam_eps) and self.adam_eps > 0, "adam_eps", "a number > 0")
        need(
            self.label_smoothing is None
            or (_is_num(self.label_smoothing) and 0 <= self.label_smoothing < 1),
            "label_smoothing",
            "a number in [0, 1), or None (auto)",
        )
        need(
            _is_num(self.clip_norm) and self.clip_norm >= 0 and math.isfinite(self.clip_norm),
            "clip_norm",
            "a finite number >= 0 (0: off)",
        )
        need(isinstance(self.device, str) and bool(self.device), "device", "a device name")

    def _check_model_options(self) -> None:
        """``model_options``: known :class:`qkv.nn.Seq2SeqConfig` fields, whose values the
        model config checks now, not after the data has been read."""
        if not isinstance(self.model_options, dict):
            raise TypeError(
                f"model_options: expected a dict of Seq2SeqConfig fields, got "
                f"{type(self.model_options).__name__}"
            )
        unknown = sorted(set(self.model_options) - _MODEL_FIELDS)
        if unknown:
            raise ValueError(
                f"model_options: unknown model keys {unknown}; known: {sorted(_MODEL_FIELDS)}"
            )
        # let the model config check the values now, not after the data has been read
        Seq2SeqConfig(2, 2, kind=self.model, **self.model_options)

    @property
    def step_limit(self) -> int:
        """The update count that ends the run: ``max_steps``, else 10,000 without a clock, else
        none (a time-bounded run plans its own length)."""
        if self.max_steps is not None:
            return self.max_steps
        return DEFAULT_MAX_STEPS if self.max_minutes is None else UNLIMITED_STEPS

    # -- conversions ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (``betas`` as a list)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from :meth:`to_dict` or a config file's content (see :meth:`updated`)."""
        return cls().updated(data)

    def model_config(self, src_vocab_size: int, tgt_vocab_size: int) -> Seq2SeqConfig:
        """The :class:`qkv.nn.Seq2SeqConfig` of this run's model for these vocabularies."""
        return Seq2SeqConfig(src_vocab_size, tgt_vocab_size, kind=self.model, **self.model_options)

    def updated(self, changes: dict[str, Any]) -> TrainConfig:
        """A copy with ``changes`` applied.

        ``changes`` uses this class's keys; ``model`` may be a kind (``"bahdanau"``) or a table
        ``{"kind": ..., "num_hiddens": ...}``; ``model.NAME`` keys (from ``--set``) set one model
        option; ``model_options`` entries are merged into the current ones.

        Raises:
            ValueError: an unknown key or a bad value (the message names the key).
        """
        if not isinstance(changes, dict):
            raise TypeError(f"changes: expected a dict, got {type(changes).__name__}")
        known = {f.name for f in dataclasses.fields(self)}
        d = self.to_dict()
        options = dict(d["model_options"])
        for key, value in changes.items():
            if key == "model" and isinstance(value, dict):
                value = dict(value)
                if "kind" in value:
                    d["model"] = value.pop("kind")
                options.update(value)
            elif key == "model_options":
                if not isinstance(value, dict):
                    raise ValueError(f"model_options: expected a table, got {value!r}")
                options.update(value)
            elif key.startswith("model."):
                name = key[len("model.") :]
                if name == "kind":
                    d["model"] = value
                else:
                    options[name] = value
            elif key in known:
                d[key] = value
            elif key in _RENAMED_KEYS:  # a setting's old name (a config file, an older run)
                d[_RENAMED_KEYS[key]] = value
            else:
                raise ValueError(
                    f"config: unknown key {key!r}; known keys: {', '.join(sorted(known))} "
                    f"and model.<{'|'.join(sorted(_MODEL_FIELDS))}>"
                )
        d["model_options"] = options
        for name in (
            "lr",
            "max_skipped",
            "min_lr_ratio",
            "weight_decay",
            "adam_eps",
            "label_smoothing",
            "clip_norm",
            "dist_timeout_minutes",
            "character_coverage",
            "subword_alpha",
        ):
            if _is_int(d[name]) and d[name] is not None:  # 1 in a file means 1.0
                d[name] = float(d[name])
        if _is_int(d.get("max_minutes")):
            d["max_minutes"] = float(d["max_minutes"])
        if isinstance(d["betas"], list):
            d["betas"] = tuple(float(b) if _is_int(b) else b for b in d["betas"])
        return TrainConfig(**d)


def required_modules(config: TrainConfig) -> list[str]:
    """The optional modules a run of ``config`` imports, by their import names: checkpoints
    (``safetensors``), validation BLEU (``sacrebleu``), a subword tokenizer (``sentencepiece``,
    also the automatic choice for a user's data), TensorBoard when asked for; what
    :func:`qkv.train.train` checks (:func:`qkv._deps.require`) before anything is read."""
    modules = ["safetensors", "sacrebleu"]
    if config.tokenize is not None or config.tgt_lang is not None:  # MeCab for ja/ko
        modules += tokenizer_modules(config.tokenize or bleu_tokenizer(config.tgt_lang))
    if (
        config.tokenizer == "sentencepiece"
        or config.tokenizer_model is not None
        or (config.tokenizer == "auto" and config.data is not None)
    ):
        modules.append("sentencepiece")
    if config.tensorboard:
        modules.append("tensorboard")
    return modules


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) config file into a dict.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown extension, a syntax error (with the parser's message), or a file
            whose top level is not a table.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--config: no such file {str(p)!r}")
    suffix = p.suffix.lower()
    text = p.read_text(encoding="utf-8")
    if suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ImportError:
                raise ImportError(
                    "reading a TOML config on Python 3.10 needs tomli: pip install tomli"
                ) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"--config: {p} is not valid TOML: {e}") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError(
                "reading a YAML config needs pyyaml: pip install 'qkv[train]'"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"--config: {p} is not valid YAML: {e}") from None
        if data is None:
            data = {}
    else:
        raise ValueError(f"--config: expected a .toml, .yaml or .yml file, got {str(p)!r}")
    if not isinstance(data, dict):
        raise ValueError(f"--config: expected a table of settings at the top of {p}, got {data!r}")
    return _numbers_from_strings(data)


_INT_RE = re.compile(r"^[+-]?\d+$")


def _number(value: Any, kind: str) -> Any:
    """``value`` as a number of ``kind`` (``int``/``float``/``float | int``) if it is a string
    that spells one (PyYAML reads ``1e-3``, without a dot, as a string), else unchanged."""
    if not isinstance(value, str):
        return value
    text = value.strip().replace("_", "")
    if "int" in kind and _INT_RE.match(text):
        return int(text)
    if "float" in kind:
        try:
            f = float(text)
        except ValueError:
            return value
        return f if math.isfinite(f) else value
    return value


def _numbers_from_strings(data: dict[str, Any]) -> dict[str, Any]:
    """A config file's numeric strings in int/float fields (top level, ``betas``, the model
    table) turned into numbers; anything else is left to the validation."""
    types = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}
    model_types = {f.name: str(f.type) for f in dataclasses.fields(Seq2SeqConfig)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        kind = types.get(key, "")
        if key == "betas" and isinstance(value, list):
            value = [_number(v, "float") for v in value]
        elif key in ("model", "model_options") and isinstance(value, dict):
            value = {k: _number(v, model_types.get(k, "")) for k, v in value.items()}
        elif key.startswith("model."):
            value = _number(value, model_types.get(key[len("model.") :], ""))
        elif kind.startswith(("int", "float")):
            value = _number(value, kind)
        out[key] = value
    return out


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` -> ``(KEY, value)``; the value is read as JSON when it parses (numbers,
    ``true``/``false``, ``null``, lists), else kept as a string."""
    if "=" not in text:
        raise ValueError(f"--set: expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ValueError(f"--set: expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value
