"""Tokenizers: word-level (the book's) and SentencePiece (BPE or unigram), and an imported
model's SentencePiece with its own vocabulary.

Every tokenizer has the same surface and says its special ids (``pad_id``, ``bos_id``,
``eos_id``, ``unk_id``): qkv's own those of :mod:`qkv.data.vocab` (``<pad>``=0, ``<bos>``=1,
``<eos>``=2, ``<unk>``=3; a SentencePiece model trained elsewhere keeps its pieces and
segmentation, its special pieces mapped to those ids), an imported model's
(:class:`VocabSentencePieceTokenizer`) its vocabulary's:

* ``encode(text) -> list[int]`` normalises ``text`` with the tokenizer's :class:`Normalizer`
  (if any) and maps it to ids, without ``<bos>``/``<eos>`` (batching adds those);
* ``decode(ids) -> str`` maps ids back to text, dropping ``<pad>``/``<bos>``/``<eos>``;
* ``save(directory)`` writes ``tokenizer.json`` (type, normaliser, vocabulary) and, for
  SentencePiece, the model file ``spm.model`` beside it; ``load(directory)`` reads them back.
  :func:`load_tokenizer` loads either kind.

Train tokenizers on the training split only (:func:`build_tokenizers` takes the pairs you give
it), so validation and test text never shapes the vocabulary.
"""

from __future__ import annotations

import copy
import io
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .._errors import SettingError
from .languages import language_code
from .normalize import Normalizer
from .subwords import SubwordSampler, model_type
from .vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab

_SPECIAL_SET = frozenset(SPECIALS)

__all__ = [
    "SentencePieceTokenizer",
    "Tokenizer",
    "VocabSentencePieceTokenizer",
    "VocabTooSmall",
    "WordTokenizer",
    "build_tokenizers",
    "encode_pairs",
    "load_tokenizer",
    "load_tokenizers",
    "save_tokenizers",
]

_CONFIG = "tokenizer.json"


class Tokenizer(ABC):
    """Common interface of qkv tokenizers (see the module docstring)."""

    pad_id = Vocab.pad_id
    bos_id = Vocab.bos_id
    eos_id = Vocab.eos_id
    unk_id = Vocab.unk_id
    kind = "abstract"

    def __init__(self, normalizer: Normalizer | None = None) -> None:
        if normalizer is not None and not isinstance(normalizer, Normalizer):
            raise TypeError(
                f"normalizer must be a qkv.data.Normalizer or None, got {type(normalizer).__name__}"
            )
        self.normalizer = normalizer

    def normalize(self, text: str) -> str:
        """Apply this tokenizer's normaliser (identity when it has none)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.normalizer(text) if self.normalizer is not None else text

    def encode(self, text: str) -> list[int]:
        """Normalise and encode one string.

        Returns:
            token ids, ``(L,)`` as a list, without ``<bos>``/``<eos>``.
        """
        return self.encode_normalized(self.normalize(text))

    @abstractmethod
    def encode_normalized(self, text: str) -> list[int]:
        """Encode a string already normalised by this tokenizer's normaliser."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; ``<pad>``, ``<bos>`` and ``<eos>`` are dropped."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids (specials included); valid ids are ``range(vocab_size)``."""

    def tokens(self) -> list[str]:
        """The token string of every id, ``vocab_size`` of them (a word, or a SentencePiece
        piece such as ``"▁go"``); the specials first: ``<pad>``, ``<bos>``, ``<eos>``,
        ``<unk>``. What an exporter writes as the vocabulary."""
        raise NotImplementedError(f"{type(self).__name__} does not list its tokens")

    def to_tokens(self, text: str) -> list[str]:
        """Normalise ``text`` and split it into token strings of :meth:`tokens`, one per id of
        :meth:`encode` (a word the vocabulary lacks, or the text of a special token, is
        ``"<unk>"``), so that ``[tokens().index(t) for t in to_tokens(x)] == encode(x)``."""
        raise NotImplementedError(f"{type(self).__name__} does not split text into tokens")

    def sample_encode(
        self, texts: Sequence[str], *, alpha: float, nbest_size: int = -1, seed: int
    ) -> list[list[int]]:
        """Encode normalised ``texts`` with subword sampling (subword regularisation while
        training); only a subword tokenizer samples (see
        :meth:`SentencePieceTokenizer.sample_encode`)."""
        raise SettingError(
            "subword_alpha",
            f"a {self.kind} tokenizer does not sample its segmentation; subword regularisation "
            "needs a SentencePiece tokenizer",
        )

    @abstractmethod
    def _config(self, directory: Path) -> dict:
        """Write side files into ``directory`` and return the ``tokenizer.json`` content."""

    def save(self, directory: str | Path) -> Path:
        """Save into ``directory`` (created if needed).

        Returns:
            the path of the written ``tokenizer.json``.
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        cfg = {
            "type": self.kind,
            "normalizer": None if self.normalizer is None else self.normalizer.to_dict(),
            **self._config(d),
        }
        path = d / _CONFIG
        path.write_text(json.dumps(cfg, ensure_ascii=False, indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Load a tokenizer saved by :meth:`save` (of this class)."""
        d = Path(directory)
        cfg = _read_config(d)
        if cfg.get("type") != cls.kind:
            raise ValueError(
                f"directory holds a {cfg.get('type')!r} tokenizer, not a {cls.kind!r} one; "
                "use qkv.data.load_tokenizer to load any kind"
            )
        norm = cfg.get("normalizer")
        return cls._from_config(d, cfg, None if norm is None else Normalizer.from_dict(norm))

    @classmethod
    @abstractmethod
    def _from_config(cls, d: Path, cfg: dict, normalizer: Normalizer | None) -> Tokenizer: ...


def _read_config(d: Path) -> dict:
    path = d / _CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"directory: no {_CONFIG} in {str(d)!r}")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"directory: {str(path)!r} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"directory: {str(path)!r} holds {type(cfg).__name__}, not an object")
    return cfg


def _check_texts(texts: Iterable[str]) -> Iterable[str]:
    for t in texts:
        if not isinstance(t, str):
            raise TypeError(f"texts must yield str, got {type(t).__name__}")
        yield t


class WordTokenizer(Tokenizer):
    """The book's word-level tokenizer: split on spaces, look words up in a :class:`Vocab`.

    With ``Normalizer.book()`` punctuation is already a separate word (``"go ."``). Words not in
    the vocabulary encode to ``<unk>`` and decode as the string ``"<unk>"``. The text of a
    special token (``"<pad>"``, ``"<bos>"``, ``"<eos>"``, ``"<unk>"``) in the input is such a
    word too: it encodes to ``<unk>``, never to the special id (a literal ``<eos>`` must not end
    a sentence, nor a literal ``<pad>`` vanish from the loss), as SentencePiece does.

    Args:
        vocab: the vocabulary.
        normalizer: applied by :meth:`encode`; saved with the tokenizer.
    """

    kind = "word"

    def __init__(self, vocab: Vocab, normalizer: Normalizer | None = None) -> None:
        super().__init__(normalizer)
        if not isinstance(vocab, Vocab):
            raise TypeError(f"vocab must be a qkv.data.Vocab, got {type(vocab).__name__}")
        self.vocab = vocab

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        min_freq: int = 2,
        max_size: int | None = None,
        normalizer: Normalizer | None = None,
        pre_normalized: bool = False,
    ) -> WordTokenizer:
        """Build the vocabulary from ``texts`` (the training split only).

        Args:
            texts: training sentences.
            min_freq: words seen fewer times become ``<unk>`` (the book uses 2).
            max_size: keep at most this many words, the most frequent.
            normalizer: the normaliser to attach (and apply to ``texts`` unless
                ``pre_normalized``).
            pre_normalized: ``texts`` were already normalised with ``normalizer``.
        """
        tok = cls(Vocab(), normalizer)
        norm = tok.normalize if (normalizer is not None and not pre_normalized) else None
        lists = (tok.tokenize_normalized(norm(t) if norm else t) for t in _check_texts(texts))
        tok.vocab = Vocab.build(lists, min_freq=min_freq, max_size=max_size)
        return tok

    @staticmethod
    def tokenize_normalized(text: str) -> list[str]:
        """Split a normalised string into words (on spaces; empty words dropped)."""
        return [w for w in text.split(" ") if w]

    def tokenize(self, text: str) -> list[str]:
        """Normalise and split into words."""
        return self.tokenize_normalized(self.normalize(text))

    def encode_normalized(self, text: str) -> list[int]:
        get, unk, special = self.vocab._stoi.get, Vocab.unk_id, _SPECIAL_SET
        return [unk if w in special else get(w, unk) for w in text.split(" ") if w]

    def tokens(self) -> list[str]:
        return list(self.vocab.tokens)

    def to_tokens(self, text: str) -> list[str]:
        return self.vocab.decode(self.encode(text))

    def decode(self, ids: Iterable[int]) -> str:
        skip = (Vocab.pad_id, Vocab.bos_id, Vocab.eos_id)
        return " ".join(self.vocab.decode(i for i in ids if int(i) not in skip))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _config(self, directory: Path) -> dict:
        return {"vocab": self.vocab.to_dict()}

    @classmethod
    def _from_config(cls, d: Path, cfg: dict, normalizer: Normalizer | None) -> WordTokenizer:
        return cls(Vocab.from_dict(cfg["vocab"]), normalizer)

    def __repr__(self) -> str:
        return f"WordTokenizer(vocab_size={self.vocab_size}, normalizer={self.normalizer})"


class VocabTooSmall(ValueError):
    """A SentencePiece vocabulary asked smaller than the text's characters need: ``need``
    pieces at least (the specials, byte pieces and one per character kept), ``vocab_size``
    asked."""

    def __init__(self, message: str, vocab_size: int, need: int) -> None:
        super().__init__(message)
        self.vocab_size, self.need = vocab_size, need


def _spm():
    try:
        import sentencepiece
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "SentencePieceTokenizer needs the sentencepiece package: pip install 'qkv[data]'"
        ) from e
    return sentencepiece


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece subword tokenizer (BPE or unigram) with qkv's special ids.

    SentencePiece's own normalisation is turned off (``identity``): the attached
    :class:`Normalizer` is the one normalisation, shared with the word tokenizer. Pieces never
    seen in training decode as `` ⁇ ``; with ``byte_fallback=True`` they are spelled in bytes
    instead and every string round-trips.

    A model trained elsewhere (:meth:`from_file`) is used as it is, its own normalisation rule
    included; if its special pieces are not qkv's ``<pad> <bos> <eos> <unk>`` at ids 0-3 (as
    ``spm_train``'s defaults: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, no pad), its pad, bos, eos and
    unk pieces take ids 0-3 (a role it lacks gets its id all the same, never produced) and its
    other pieces follow in its order: the same segmentation, renumbered.

    Args:
        model: the serialized SentencePiece model (the bytes of a ``.model`` file).
        normalizer: applied by :meth:`encode`; saved with the tokenizer.
    """

    kind = "sentencepiece"
    model_file = "spm.model"

    def __init__(self, model: bytes, normalizer: Normalizer | None = None) -> None:
        super().__init__(normalizer)
        if not isinstance(model, (bytes, bytearray)):
            raise TypeError(f"model must be the bytes of a .model file, got {type(model).__name__}")
        spm = _spm()
        self.model = bytes(model)
        self._sp = spm.SentencePieceProcessor(model_proto=self.model)
        self._to_qkv, self._to_spm = _special_ids_mapped(self._sp)
        self._sampler: SubwordSampler | None = None

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int = 8000,
        model_type: str = "bpe",
        character_coverage: float = 1.0,
        byte_fallback: bool = False,
        normalizer: Normalizer | None = None,
        pre_normalized: bool = False,
        num_threads: int = 1,
    ) -> SentencePieceTokenizer:
        """Train in memory on ``texts`` (the training split only); no file, no network.

        Args:
            texts: training sentences.
            vocab_size: target number of pieces, specials included; a soft limit, so a small
                corpus gives a smaller vocabulary instead of an error.
            model_type: ``"bpe"`` or ``"unigram"``.
            character_coverage: fraction of characters covered (1.0 for European languages;
                SentencePiece accepts 0.98 to 1).
            byte_fallback: spell unseen characters as UTF-8 bytes (adds 256 pieces).
            normalizer: the normaliser to attach (and apply to ``texts`` unless
                ``pre_normalized``).
            pre_normalized: ``texts`` were already normalised with ``normalizer``.
            num_threads: trainer threads.
        """
        if model_type not in ("bpe", "unigram"):
            raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}")
        if not isinstance(vocab_size, int) or vocab_size < 8:
            raise ValueError(f"vocab_size must be an int >= 8, got {vocab_size!r}")
        if (
            isinstance(character_coverage, bool)
            or not isinstance(character_coverage, (int, float))
            or not 0.0 < character_coverage <= 1.0
        ):
            raise ValueError(
                f"character_coverage must be a fraction in (0, 1], got {character_coverage!r}"
            )
        spm = _spm()
        norm = normalizer if (normalizer is not None and not pre_normalized) else None
        sentences = [norm(t) if norm else t for t in _check_texts(texts)]
        sentences = [s for s in sentences if s.strip()]
        if not sentences:
            raise ValueError("texts must hold at least one non-empty sentence, got none")
        buf = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=buf,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                byte_fallback=byte_fallback,
                hard_vocab_limit=False,
                normalization_rule_name="identity",
                pad_id=0,
                bos_id=1,
                eos_id=2,
                unk_id=3,
                pad_piece=PAD,
                bos_piece=BOS,
                eos_piece=EOS,
                unk_piece=UNK,
                num_threads=num_threads,
                minloglevel=2,
            )
        except RuntimeError as e:
            # SentencePiece's checks fail as RuntimeError("INTERNAL: ...trainer_interface.cc...")
            cov = re.search(r"character_coverage\(\) >= ([\d.]+)\D+([\d.]+)", str(e))
            if cov is not None:
                raise ValueError(
                    f"character_coverage must lie in [{cov.group(1)}, {cov.group(2)}] for "
                    f"SentencePiece, got {character_coverage!r}"
                ) from None
            # "Vocabulary size is smaller than required_chars. 40 vs 279."
            m = re.search(r"smaller than required_chars\D*(\d+) vs (\d+)", str(e))
            if m is None:
                raise
            need = int(m.group(2))
            extra = ", 256 byte pieces" if byte_fallback else ""
            raise VocabTooSmall(
                f"vocab_size={vocab_size} is too small for these texts: SentencePiece needs at "
                f"least {need} pieces (the {len(SPECIALS)} specials{extra} and one per distinct "
                f"character kept by character_coverage={character_coverage}); pass "
                f"vocab_size >= {need}",
                vocab_size,
                need,
            ) from None
        return cls(buf.getvalue(), normalizer)

    @property
    def byte_fallback(self) -> bool:
        """Does the model spell unknown characters in UTF-8 byte pieces (``<0x41>``)?"""
        return self._sp.piece_to_id("<0x00>") != self._sp.unk_id()

    @property
    def model_type(self) -> str:
        """SentencePiece's model type: ``"unigram"``, ``"bpe"``, ``"word"`` or ``"char"``."""
        return model_type(self.model)

    def encode_normalized(self, text: str) -> list[int]:
        ids = self._sp.encode(text, out_type=int)
        return ids if self._to_qkv is None else [self._to_qkv[i] for i in ids]

    def sample_encode(
        self, texts: Sequence[str], *, alpha: float, nbest_size: int = -1, seed: int
    ) -> list[list[int]]:
        """Encode normalised ``texts`` with SentencePiece's subword sampling (subword
        regularisation), the same segmentations for the same ``seed``.

        Args:
            texts: strings already normalised by this tokenizer's normaliser.
            alpha: unigram: the smoothing of the segmentations' probabilities (Kudo, 2018;
                SentencePiece suggests 0.1); BPE: the probability of dropping a merge
                (BPE-dropout, Provilkov et al., 2020), in ``(0, 1)``.
            nbest_size: unigram: sample from the ``nbest_size`` best segmentations, or from all
                of them with -1; BPE ignores it.
            seed: seeds SentencePiece's generator for this call.

        Returns:
            one id list per text, without ``<bos>``/``<eos>``.
        """
        if self._sampler is None:
            self._sampler = SubwordSampler(self._sp, self.model)
        out = _sampled(self._sampler, model_type(self.model), texts, alpha, nbest_size, seed)
        if self._to_qkv is not None:
            table = self._to_qkv
            out = [[table[i] for i in ids] for ids in out]
        return out

    def pieces(self, text: str) -> list[str]:
        """Normalise and split into subword pieces (for inspection)."""
        return self._sp.encode(self.normalize(text), out_type=str)

    def tokens(self) -> list[str]:
        if self._to_spm is None:
            return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
        return [*SPECIALS, *(self._sp.id_to_piece(i) for i in self._to_spm[len(SPECIALS) :])]

    def to_tokens(self, text: str) -> list[str]:
        if self._to_spm is None:
            return self.pieces(text)
        names = self.tokens()
        return [names[i] for i in self.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        n = self.vocab_size
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < n:
                raise ValueError(f"ids must lie in [0, {n}), got {i}")
            if i not in (self.pad_id, self.bos_id, self.eos_id):
                out.append(i)
        if self._to_spm is not None:
            out = [self._to_spm[i] for i in out]
        return self._sp.decode(out)

    @property
    def vocab_size(self) -> int:
        if self._to_spm is not None:
            return len(self._to_spm)
        return self._sp.get_piece_size()

    @classmethod
    def from_file(
        cls, path: str | Path, normalizer: Normalizer | None = None, *, key: str = "tokenizer_model"
    ) -> SentencePieceTokenizer:
        """An existing SentencePiece model (a ``.model`` file trained by ``spm_train`` or
        another toolkit) used as it is: its pieces, its segmentation and its own normalisation
        rule; its special pieces take qkv's roles (see :func:`_special_ids_mapped`).

        Raises:
            SettingError: (named ``key``) no such file, or not a SentencePiece model.
        """
        p = Path(path)
        if not p.is_file():
            raise SettingError(
                key, f"expected a SentencePiece .model file, got {str(p)!r} (no such file)"
            )
        try:
            return cls(p.read_bytes(), normalizer)
        except RuntimeError as e:  # SentencePiece's parser: "could not parse ModelProto"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SettingError(
                key, f"expected a SentencePiece .model file, got {str(p)!r} ({first})"
            ) from None

    def _config(self, directory: Path) -> dict:
        (directory / self.model_file).write_bytes(self.model)
        return {"model_file": self.model_file, "vocab_size": self.vocab_size}

    @classmethod
    def _from_config(
        cls, d: Path, cfg: dict, normalizer: Normalizer | None
    ) -> SentencePieceTokenizer:
        path = _side_file(d, cfg.get("model_file", cls.model_file), "the SentencePiece model")
        try:
            return cls(path.read_bytes(), normalizer)
        except RuntimeError as e:  # SentencePiece's parser: "could not parse ModelProto"
            raise _corrupt(path, e) from None

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size}, normalizer={self.normalizer})"


def _sampled(
    sampler: SubwordSampler,
    kind: str,
    texts: Sequence[str],
    alpha: float,
    nbest_size: int,
    seed: int,
) -> list[list[int]]:
    """``texts`` sampled by ``sampler`` (a SentencePiece model of type ``kind``) with
    ``alpha``, ``nbest_size`` and ``seed`` checked: the model's own ids."""
    if kind not in ("unigram", "bpe"):
        raise SettingError(
            "subword_alpha",
            f"SentencePiece samples unigram and BPE models only; this model is {kind!r}",
        )
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool)) or not (
        0 < alpha < (1 if kind == "bpe" else math.inf)
    ):
        what = "a dropout probability in (0, 1)" if kind == "bpe" else "a number > 0"
        raise SettingError("subword_alpha", f"expected {what} for a {kind} model, got {alpha!r}")
    if not isinstance(nbest_size, int) or not (nbest_size == -1 or nbest_size >= 2):
        raise SettingError(
            "subword_nbest_size", f"expected -1 (all) or an int >= 2, got {nbest_size!r}"
        )
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    return sampler.sample(texts, alpha=alpha, nbest_size=nbest_size, rng=rng)


def _special_ids_mapped(sp) -> tuple[list[int] | None, list[int] | None]:
    """How a SentencePiece model's ids map onto qkv's, as ``(spm id -> qkv id, qkv id -> spm
    id)``; ``(None, None)`` when they are qkv's already (a model qkv trained).

    qkv's ids put ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>`` at 0-3: the model's own pad, bos,
    eos and unk pieces (whatever their ids and strings, e.g. ``spm_train``'s default ``<unk>``
    0, ``<s>`` 1, ``</s>`` 2) take those ids, the other pieces follow in the model's order. A
    role the model has no piece for (``spm_train`` makes no pad piece by default) gets its id all
    the same, which SentencePiece never produces (-1 in the qkv -> spm table).
    """
    roles = [sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()]
    if roles == [0, 1, 2, 3]:
        return None, None
    n = sp.get_piece_size()
    taken = {r for r in roles if 0 <= r < n}
    others = [i for i in range(n) if i not in taken]
    to_spm = [r if 0 <= r < n else -1 for r in roles] + others
    to_qkv = [0] * n
    for q, i in enumerate(to_spm):
        if i >= 0:
            to_qkv[i] = q
    return to_qkv, to_spm


def _side_file(d: Path, name: object, what: str) -> Path:
    """The file ``name`` beside ``tokenizer.json`` in ``d``, nothing else: never an absolute
    path, a path out of the folder (``../``), or a link leading out of it."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or Path(name).is_absolute()
    ):
        raise ValueError(
            f"directory: {_CONFIG} in {str(d)!r} names {what} {name!r}; expected a file name "
            "in that folder (never a path out of it)"
        )
    path = d / name
    if path.is_symlink() or (path.exists() and not path.resolve().is_relative_to(d.resolve())):
        raise ValueError(
            f"directory: {what} {str(path)!r} is a link; expected the file itself (a tokenizer "
            "folder reads nothing out of itself)"
        )
    if not path.is_file():
        raise FileNotFoundError(f"directory: {what} {str(path)!r} is missing")
    return path


def _corrupt(path: Path, e: Exception) -> ValueError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ValueError(f"directory: the SentencePiece model {str(path)!r} is corrupt ({first})")


class VocabSentencePieceTokenizer(Tokenizer):
    """A SentencePiece model whose pieces are numbered by a vocabulary of its own (Marian's and
    M2M100's ``vocab.json``), with that vocabulary's special ids: an imported model's
    tokenizer (``qkv import``).

    ``encode`` splits the text with the SentencePiece model (its own normalisation, e.g.
    ``nmt_nfkc``; no qkv :class:`Normalizer`) and maps each piece through ``vocab``, a piece the
    vocabulary lacks to ``unk_id``, as ``transformers``' ``MarianTokenizer`` does; with
    ``language_codes`` a text that starts with a target-language token (``>>fra<<``, the first
    ``>>`` up to the first ``<<``) gives that token's id first, as Marian's rule has it, and a
    text that starts with none gives ``target_token``'s (a multi-target model's chosen target,
    :meth:`with_target`; None: none). ``prefix`` ids come first in every encoding (M2M100's
    source language). The text of a
    special token (``"</s>"``) is text, as with every qkv tokenizer: it never encodes to the
    special id (``transformers``' tokenizer splits it out; a documented difference).

    ``decode`` drops ``<pad>``, the decoder's start, ``<eos>`` and ``<unk>`` (what
    ``transformers``' ``decode(..., skip_special_tokens=True)`` drops), joins the pieces with
    ``decode_model`` (the SentencePiece model that joins them: Marian's source one, unless its
    vocabularies are separate) and strips the ends.

    Args:
        model: the serialized SentencePiece model that splits the text.
        vocab: piece -> id, every id once (``vocab_size`` is the largest id plus one).
        pad_id, bos_id, eos_id, unk_id: the vocabulary's special ids; ``bos_id`` is the token
            the decoder starts from (Marian's ``<pad>``, M2M100's ``</s>``).
        decode_model: the SentencePiece model that joins pieces (None: ``model``).
        language_codes: read a leading ``>>xxx<<`` as one token.
        target_token: with ``language_codes``, the target-language token given to a text
            that names none (a token of ``vocab``).
        prefix: ids put before every encoding.
    """

    kind = "sentencepiece-vocab"
    model_file = "spm.model"
    vocab_file = "vocab.json"
    decode_file = "decode.model"

    def __init__(
        self,
        model: bytes,
        vocab: dict[str, int],
        *,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        unk_id: int,
        decode_model: bytes | None = None,
        language_codes: bool = False,
        target_token: str | None = None,
        prefix: Sequence[int] = (),
    ) -> None:
        super().__init__(None)
        spm = _spm()
        self.model = bytes(model)
        self._sp = spm.SentencePieceProcessor(model_proto=self.model)
        self.decode_model = None if decode_model is None else bytes(decode_model)
        self._joiner = (
            self._sp
            if decode_model is None
            else spm.SentencePieceProcessor(model_proto=self.decode_model)
        )
        if not isinstance(vocab, dict) or not vocab:
            raise ValueError("vocab: expected a non-empty dict of piece -> id")
        ids = list(vocab.values())
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ValueError("vocab: expected non-negative int ids")
        if len(set(ids)) != len(ids):
            raise ValueError("vocab: two pieces share an id")
        self.vocab = dict(vocab)
        self._itos = {i: p for p, i in vocab.items()}
        n = max(ids) + 1
        for name, i in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id),
                        ("unk_id", unk_id)):  # fmt: skip
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise ValueError(f"{name}: expected an id of the vocabulary [0, {n}), got {i!r}")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = pad_id, bos_id, eos_id, unk_id
        self.language_codes = bool(language_codes)
        self.prefix = [int(i) for i in prefix]
        if any(not 0 <= i < n for i in self.prefix):
            raise ValueError(f"prefix: expected ids of the vocabulary [0, {n}), got {prefix!r}")
        if target_token is not None and target_token not in self.vocab:
            raise ValueError(
                f"target_token: expected a token of the vocabulary, got {target_token!r}"
            )
        self.target_token = target_token
        self._sampler: SubwordSampler | None = None

    #: transformers never keeps an imported model from emitting ``<unk>``
    byte_fallback = False

    @property
    def targets(self) -> dict[str, str]:
        """A multi-target model's target languages (with ``language_codes``): each
        ``>>xxx<<`` token of the vocabulary whose ``xxx`` names a language qkv knows, by that
        language's code (``{"fr": ">>fra<<", "zh-Hans": ">>cmn_Hans<<"}``; the first token of a
        code kept); empty for a model of one target. Tokens of other codes are reached by
        starting the text with them."""
        if not self.language_codes:
            return {}
        out: dict[str, str] = {}
        for token in sorted(self.vocab, key=self.vocab.__getitem__):
            if token.startswith(">>") and token.endswith("<<") and len(token) > 4:
                code = language_code(token[2:-2])
                if code is not None:
                    out.setdefault(code, token)
        return out

    def with_target(self, token: str | None) -> VocabSentencePieceTokenizer:
        """This tokenizer giving ``token`` (``>>fra<<``; None: no token) to a text that names
        no target; the model files shared, not copied."""
        new = copy.copy(self)
        if token is not None and token not in self.vocab:
            raise ValueError(
                f"token: expected a target-language token of the vocabulary, got {token!r}"
            )
        new.target_token = token
        return new

    def _pieces(self, text: str) -> list[str]:
        code: list[str] = []
        if self.language_codes and text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        elif self.language_codes and self.target_token is not None:
            code = [self.target_token]
        return code + self._sp.encode(text, out_type=str)

    def encode_normalized(self, text: str) -> list[int]:
        get, unk = self.vocab.get, self.unk_id
        return self.prefix + [get(p, unk) for p in self._pieces(text)]

    def sample_encode(
        self, texts: Sequence[str], *, alpha: float, nbest_size: int = -1, seed: int
    ) -> list[list[int]]:
        """``texts`` encoded as :meth:`encode_normalized` does with the SentencePiece model's
        segmentation sampled (as :meth:`SentencePieceTokenizer.sample_encode`): each sampled
        piece through the vocabulary, a leading ``>>xxx<<`` and the prefix kept as they are."""
        if self._sampler is None:
            self._sampler = SubwordSampler(self._sp, self.model)
        heads, rests = [], []
        for text in texts:
            pieces = self._pieces(text[:0])  # the target token a text naming none gets
            if self.language_codes and text.startswith(">>") and (end := text.find("<<")) != -1:
                pieces, text = [text[: end + 2]], text[end + 2 :]
            heads.append(pieces)
            rests.append(text)
        kind = model_type(self.model)
        sampled = _sampled(self._sampler, kind, rests, alpha, nbest_size, seed)
        get, unk, piece = self.vocab.get, self.unk_id, self._sp.id_to_piece
        return [
            self.prefix + [get(p, unk) for p in head] + [get(piece(i), unk) for i in ids]
            for head, ids in zip(heads, sampled)
        ]

    def tokens(self) -> list[str]:
        return [self._itos.get(i, f"<unused{i}>") for i in range(self.vocab_size)]

    def to_tokens(self, text: str) -> list[str]:
        unk = self._itos[self.unk_id]
        pre = [self._itos.get(i, f"<unused{i}>") for i in self.prefix]
        return pre + [p if p in self.vocab else unk for p in self._pieces(text)]

    def decode(self, ids: Iterable[int]) -> str:
        n = self.vocab_size
        skip = {self.pad_id, self.bos_id, self.eos_id, self.unk_id}
        pieces = []
        for i in ids:
            i = int(i)
            if not 0 <= i < n:
                raise ValueError(f"ids must lie in [0, {n}), got {i}")
            if i in skip:
                continue
            piece = self._itos.get(i)
            if piece is None and i < self._joiner.get_piece_size():
                piece = self._joiner.id_to_piece(i)
            if piece:
                pieces.append(piece)
        return self._joiner.decode_pieces(pieces).replace("\u2581", " ").strip()

    @property
    def vocab_size(self) -> int:
        return max(self._itos) + 1

    def _config(self, directory: Path) -> dict:
        (directory / self.model_file).write_bytes(self.model)
        vocab = json.dumps(self.vocab, ensure_ascii=False, indent=0)
        (directory / self.vocab_file).write_text(vocab, encoding="utf-8")
        cfg = {
            "model_file": self.model_file,
            "vocab_file": self.vocab_file,
            "vocab_size": self.vocab_size,
            "special_ids": {
                "pad": self.pad_id,
                "bos": self.bos_id,
                "eos": self.eos_id,
                "unk": self.unk_id,
            },
            "language_codes": self.language_codes,
            "target_token": self.target_token,
            "prefix": self.prefix,
        }
        if self.decode_model is not None:
            (directory / self.decode_file).write_bytes(self.decode_model)
            cfg["decode_model_file"] = self.decode_file
        return cfg

    @classmethod
    def _from_config(
        cls, d: Path, cfg: dict, normalizer: Normalizer | None
    ) -> VocabSentencePieceTokenizer:
        if normalizer is not None:
            raise ValueError(
                f"directory: {_CONFIG} in {str(d)!r} gives a {cls.kind!r} tokenizer a "
                "normaliser; its SentencePiece model normalises"
            )
        model = _side_file(d, cfg.get("model_file"), "the SentencePiece model")
        vocab = _side_file(d, cfg.get("vocab_file"), "the vocabulary")
        joiner = cfg.get("decode_model_file")
        joiner = None if joiner is None else _side_file(d, joiner, "the SentencePiece model")
        try:
            pieces = json.loads(vocab.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"directory: {str(vocab)!r} is not valid JSON ({e})") from None
        special = cfg.get("special_ids")
        if not isinstance(special, dict) or set(special) != {"pad", "bos", "eos", "unk"}:
            raise ValueError(
                f"directory: {_CONFIG} in {str(d)!r} has no special_ids "
                '{"pad": ID, "bos": ID, "eos": ID, "unk": ID}'
            )
        try:
            return cls(
                model.read_bytes(),
                pieces,
                pad_id=special["pad"],
                bos_id=special["bos"],
                eos_id=special["eos"],
                unk_id=special["unk"],
                decode_model=None if joiner is None else joiner.read_bytes(),
                language_codes=bool(cfg.get("language_codes", False)),
                target_token=cfg.get("target_token"),
                prefix=cfg.get("prefix") or (),
            )
        except RuntimeError as e:  # SentencePiece's parser
            raise _corrupt(model, e) from None

    def __repr__(self) -> str:
        return (
            f"VocabSentencePieceTokenizer(vocab_size={self.vocab_size}, pad={self.pad_id}, "
            f"bos={self.bos_id}, eos={self.eos_id}, unk={self.unk_id})"
        )


_KINDS: dict[str, type[Tokenizer]] = {
    WordTokenizer.kind: WordTokenizer,
    SentencePieceTokenizer.kind: SentencePieceTokenizer,
    VocabSentencePieceTokenizer.kind: VocabSentencePieceTokenizer,
}


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load a tokenizer of any kind from a directory written by ``save``."""
    d = Path(directory)
    kind = _read_config(d).get("type")
    if kind not in _KINDS:
        raise ValueError(f"directory: unknown tokenizer type {kind!r}; known: {sorted(_KINDS)}")
    return _KINDS[kind].load(d)


def build_tokenizers(
    pairs: Sequence[tuple[str, str]],
    kind: str = "word",
    *,
    joint: bool = False,
    normalizer: Normalizer | None = None,
    pre_normalized: bool = False,
    **options,
) -> tuple[Tokenizer, Tokenizer]:
    """Train source and target tokenizers on ``pairs`` (pass the training split only).

    Args:
        pairs: ``(source, target)`` training pairs.
        kind: ``"word"`` or ``"sentencepiece"``.
        joint: one tokenizer trained on both sides, returned twice (``src is tgt``); else one
            per side.
        normalizer: attached to both tokenizers.
        pre_normalized: the pairs were already normalised with ``normalizer``.
        **options: passed to ``WordTokenizer.train`` (``min_freq``, ``max_size``) or
            ``SentencePieceTokenizer.train`` (``vocab_size``, ``model_type``, ...).

    Returns:
        ``(src_tokenizer, tgt_tokenizer)``.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if not pairs:
        raise ValueError("pairs must hold at least one (source, target) pair, got none")
    cls = _KINDS[kind]
    kw = dict(normalizer=normalizer, pre_normalized=pre_normalized, **options)
    if joint:
        texts = [s for s, _ in pairs] + [t for _, t in pairs]
        tok = cls.train(texts, **kw)  # type: ignore[attr-defined]
        return tok, tok
    src = cls.train([s for s, _ in pairs], **kw)  # type: ignore[attr-defined]
    tgt = cls.train([t for _, t in pairs], **kw)  # type: ignore[attr-defined]
    return src, tgt


def save_tokenizers(directory: str | Path, src: Tokenizer, tgt: Tokenizer) -> None:
    """Save a source/target pair: ``directory/joint`` when ``src is tgt``, else ``src``/``tgt``."""
    d = Path(directory)
    if src is tgt:
        src.save(d / "joint")
    else:
        src.save(d / "src")
        tgt.save(d / "tgt")


def load_tokenizers(directory: str | Path) -> tuple[Tokenizer, Tokenizer]:
    """Load what :func:`save_tokenizers` wrote; a joint tokenizer comes back twice."""
    d = Path(directory)
    if (d / "joint" / _CONFIG).is_file():
        tok = load_tokenizer(d / "joint")
        return tok, tok
    return load_tokenizer(d / "src"), load_tokenizer(d / "tgt")


def encode_pairs(
    pairs: Iterable[tuple[str, str]],
    src: Tokenizer,
    tgt: Tokenizer,
    *,
    pre_normalized: bool = False,
) -> tuple[list[list[int]], list[list[int]]]:
    """Encode every pair.

    Returns:
        ``(src_ids, tgt_ids)``: two lists of id lists, aligned, without ``<bos>``/``<eos>``.
    """
    es = src.encode_normalized if pre_normalized else src.encode
    et = tgt.encode_normalized if pre_normalized else tgt.encode
    src_ids, tgt_ids = [], []
    for s, t in pairs:
        src_ids.append(es(s))
        tgt_ids.append(et(t))
    return src_ids, tgt_ids
