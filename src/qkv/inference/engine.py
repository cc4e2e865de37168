"""One interface for every engine that turns text into text: qkv's own, CTranslate2, ONNX.

:class:`TextTranslator` is what the command line, the server and evaluation rely on; each
engine implements it by subclassing :class:`TranslatorBase`, which holds what they share (the
default :class:`~qkv.inference.Decoding`, text in and text out, scoring, the languages a model
records) and the one policy of decoding many texts: encode each, set aside those the engine's
positions cannot read (a warning naming them) and those that normalise to nothing, sort by
length, batch, place on the device, put the results back in input order, and name once the
translations its positions stopped. The engine implements one method,
``_decode_batch(batch, decoding)``: the hypotheses of one :class:`~qkv.inference.batches.
SourceBatch`.

Text goes through :mod:`qkv.text` at the edge: :meth:`TranslatorBase.translate` cuts each
line of its texts into sentences of the model's source language (:meth:`~TranslatorBase.plan`),
decodes the sentences of all texts in one plan, and rebuilds each text with its layout;
:meth:`~TranslatorBase.hypotheses`, :meth:`~TranslatorBase.generate`,
:meth:`~TranslatorBase.translate_segments` and :meth:`~TranslatorBase.evaluate` take each text
as one segment, as given.

Inside, results are always n-best lists, as CTranslate2's ``TranslationResult`` and fairseq's
hypotheses are: per text a list of ``(target ids, score)``, best first
(:meth:`TranslatorBase.hypotheses`). The plain shape of one best translation per text
(``n_best=1``) is made once, at the edge: :meth:`~TranslatorBase.translate` and
:meth:`~TranslatorBase.generate`.

>>> tr = Translator.load("runs/en-fr")                       # or Ct2Translator, OnnxTranslator
>>> tr.translate(["I lost."])                                # the model's decoding
>>> tr.translate("I am home. He is calm.")                   # a paragraph: two sentences
>>> tr.translate(lines, split="none")                        # one line, one sentence
>>> tr.translate("Go.", beam_size=4, n_best=2)               # overrides for one call
>>> greedy = tr.with_decoding(beam_size=1)                   # a translator with other defaults
>>> tr.evaluate(pairs).bleu

An engine that cannot honour an option (the ONNX runner decodes greedily; CTranslate2 returns
one translation) refuses it with a ``ValueError`` naming it, never ignores it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .._deps import require
from ..data import Tokenizer
from ..decoding.search import Hypothesis
from ..text import DEFAULT_SPLIT, Alignment, Plan, clean, plan_texts
from .batches import SourceBatch, decode_sorted
from .limits import PositionBounds, cut_by_positions, skip_too_long, too_long, warn_cut
from .options import Decoding
from .scores import (
    Evaluation,
    bleu_tokenizer,
    check_tokenize,
    corpus_scores,
    tokenizer_modules,
)
from .writing import BUNDLED_DATA, BUNDLED_LANGUAGES, run_card

__all__ = [
    "Hypothesis",
    "TextTranslator",
    "TranslatorBase",
    "evaluate_pairs",
    "one_best_or_all",
    "recorded_languages",
]

log = logging.getLogger(__name__)

#: ``progress(done)``: called with the number of texts done so far
Progress = Callable[[int], None]


@runtime_checkable
class TextTranslator(Protocol):
    """What every engine offers (see the module's notes); :class:`TranslatorBase` implements
    everything but the decoding itself."""

    path: Path | None
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    #: ``"qkv"``, ``"ctranslate2"`` or ``"onnx"``
    engine: str

    @property
    def decoding(self) -> Decoding: ...

    @property
    def languages(self) -> tuple[str, str] | None: ...

    @property
    def kind(self) -> str: ...

    @property
    def device(self) -> Any: ...

    @property
    def has_attention(self) -> bool: ...

    @property
    def aligns(self) -> bool: ...

    def with_decoding(self, decoding: Decoding | None = None, **overrides: Any) -> Any: ...

    def encode(self, text: str) -> list[int]: ...

    def hypotheses(
        self,
        texts: Sequence[str],
        decoding: Decoding | None = None,
        *,
        progress: Progress | None = None,
        **overrides: Any,
    ) -> list[list[Hypothesis]]: ...

    def generate(
        self,
        texts: Sequence[str],
        decoding: Decoding | None = None,
        *,
        progress: Progress | None = None,
        **overrides: Any,
    ) -> list[Any]: ...

    def translate(
        self,
        texts: str | Sequence[str],
        decoding: Decoding | None = None,
        *,
        split: str = DEFAULT_SPLIT,
        **overrides: Any,
    ) -> Any: ...

    def plan(self, texts: Sequence[str], *, split: str = DEFAULT_SPLIT) -> Plan: ...

    def plan_hypotheses(
        self,
        plan: Plan,
        decoding: Decoding | None = None,
        *,
        progress: Progress | None = None,
        **overrides: Any,
    ) -> list[list[Hypothesis]]: ...

    def shown(self, segments: Sequence[str], hyps: Sequence[Sequence[Hypothesis]]) -> list[str]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    def translate_segments(
        self, segments: Sequence[str], decoding: Decoding | None = None, **overrides: Any
    ) -> list[str]: ...

    def align_segments(
        self, segments: Sequence[str], translations: Sequence[str]
    ) -> list[Alignment | None]: ...

    def translate_ids(
        self, text: str, decoding: Decoding | None = None, **overrides: Any
    ) -> list[int]: ...

    def evaluate(
        self,
        pairs: Sequence[tuple[str, str]],
        decoding: Decoding | None = None,
        *,
        normalize_references: bool = False,
        tokenize: str | None = None,
        **overrides: Any,
    ) -> Evaluation: ...

    def attention(
        self,
        text: str,
        decoding: Decoding | None = None,
        *,
        ids: Sequence[int] | None = None,
        **overrides: Any,
    ) -> Any: ...

    def attention_shapes(self, src_len: int, tgt_len: int) -> list[tuple[int, int, int]] | None: ...


def recorded_languages(folder: str | Path | None) -> tuple[str, str] | None:
    """``(source, target)`` codes when a saved model records them: its ``model.json`` (what
    ``qkv train --src-lang/--tgt-lang``, or the languages read from the data, wrote; kept by
    every export), else its model card; a model trained on the bundled English-French corpus
    before languages were recorded is ``("en", "fr")``. None when nothing says (an older model,
    or a card that cannot be read)."""
    if folder is None:
        return None
    try:
        card = run_card(folder)
    except Exception:  # an unreadable card: the languages are simply not known
        return None
    langs = card.get("languages")
    if isinstance(langs, (list, tuple)) and len(langs) == 2:
        return str(langs[0]), str(langs[1])
    return BUNDLED_LANGUAGES if card.get("data") == BUNDLED_DATA else None


def _texts(texts: object) -> Sequence[str]:
    if isinstance(texts, (str, bytes, bytearray)) or not isinstance(texts, Sequence):
        raise TypeError(f"texts: expected a sequence of str, got {type(texts).__name__}")
    for t in texts:
        if not isinstance(t, str):
            raise TypeError(f"text: expected a str, got {type(t).__name__}")
    return texts


def one_best_or_all(
    hyps: Sequence[Sequence[Hypothesis]], n_best: int, show: Callable[[list[int]], Any] = list
) -> list[Any]:
    """The public shape of many texts' hypotheses (the edge; inside they are always n-best
    lists): per text ``show(ids)`` of its best (``n_best=1``), else its ``(show(ids), score)``
    pairs, best first."""
    if n_best == 1:
        return [show(h[0][0]) if h else show([]) for h in hyps]
    return [[(show(ids), float(score)) for ids, score in h] for h in hyps]


class TranslatorBase:
    """What every engine shares; an engine sets :attr:`src_tokenizer`, :attr:`tgt_tokenizer`,
    :attr:`path`, its default decoding (``self._decoding``) and implements
    :meth:`_decode_batch`; it says what bounds its positions (:meth:`_positions`), refuses what
    it cannot do (:meth:`_check_decoding`), and, if it batches by sentences rather than by
    tokens, how many (:attr:`batch_sentences`).

    Results follow one convention everywhere: per text its hypotheses ``(ids, score)``, best
    first, the ids without ``<bos>``/``<eos>`` (:meth:`hypotheses`; :meth:`generate` gives the
    ids alone for ``n_best=1``). A text that normalises to nothing is not decoded: ``([], 0.0)``
    (the log-probability of a certainty: nothing translates to nothing), then ``n_best - 1``
    times ``([], -inf)`` (there is no other translation); a text longer than the engine's
    positions is not decoded either: ``n_best`` times ``([], -inf)``, with a warning naming it.
    """

    engine: str = "qkv"
    path: Path | None = None
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    _decoding: Decoding = Decoding()
    #: None: batches of ``decoding.max_tokens`` source tokens times the beam; an int: batches of
    #: that many sentences (an engine with its own memory policy, as CTranslate2)
    batch_sentences: int | None = None
    #: True: a beam search stops a whole batch at one length, so a batch holds one output limit
    one_limit_per_batch: bool = False

    # -------------------------------------------------------------- what the engine is
    @property
    def decoding(self) -> Decoding:
        """The decoding of a call that gives no other: the model's (a trained run's final
        model carries the one chosen on its validation split), else greedy."""
        return self._decoding

    #: the languages an engine read with its model (None: read them from its card folder)
    _languages: tuple[str, str] | None = None

    @property
    def languages(self) -> tuple[str, str] | None:
        """``(source, target)`` language codes when the model records them (its
        ``model.json``, its card), else None; read once per translator."""
        if self._languages is None:
            found = recorded_languages(self._card_folder())
            if found is None:
                return None
            self._languages = found
        return self._languages

    def _card_folder(self) -> Path | None:
        """The folder whose model card says what the model is (its languages)."""
        return self.path

    @property
    def kind(self) -> str:
        """The model's kind: ``"transformer"`` or ``"bahdanau"``."""
        return "transformer"

    @property
    def device(self) -> Any:
        """Where the model runs."""
        return "cpu"

    @property
    def has_attention(self) -> bool:
        """Whether :meth:`attention` can show the weights this engine decodes with."""
        return False

    @property
    def aligns(self) -> bool:
        """Whether :meth:`align_segments` gives cross-attention (what places inline HTML
        markup): engines with :attr:`has_attention`, and CTranslate2's."""
        return self.has_attention

    def with_decoding(self, decoding: Decoding | None = None, **overrides: Any) -> Any:
        """This translator with another default decoding (the same model, not copied):
        ``decoding`` (or the current one) with ``overrides`` (see :meth:`Decoding.replace`)."""
        new = copy.copy(self)
        new._decoding = self.decoding.resolve(decoding, **overrides)
        return new

    # -------------------------------------------------------------- what the engine implements
    def _decode_batch(self, batch: SourceBatch, decoding: Decoding) -> list[list[Hypothesis]]:
        """Per source of ``batch`` (shortest first, each with its output limit) its
        hypotheses, best first: at most ``decoding.n_best``, the ids at most the source's
        limit, without ``<bos>``/``<eos>``."""
        raise NotImplementedError

    def _positions(self) -> PositionBounds:
        """What bounds the engine's positions (default: nothing)."""
        return PositionBounds()

    def _check_decoding(self, decoding: Decoding) -> None:
        """Refuse, with a ``ValueError`` naming the option, what the engine cannot honour."""

    # -------------------------------------------------------------- the policy
    def _decode(
        self,
        texts: Sequence[str],
        decoding: Decoding,
        progress: Progress | None = None,
        *,
        normalized: bool = False,
        warn: bool = True,
        labels: Sequence[str] | None = None,
    ) -> list[list[Hypothesis]]:
        """Every text's hypotheses (the class's convention), in input order: the one policy
        of every engine. ``normalized``: the texts went through the source normaliser already;
        ``warn``: log what the positions skip or stop (training's validation says it once,
        before its run); ``progress(done)`` after every batch, the texts not decoded counted
        first; ``labels``: how a warning names each text (default: its number)."""
        self._check_decoding(decoding)
        tok = self.src_tokenizer
        encode = tok.encode_normalized if normalized else tok.encode
        src = [[*encode(t), tok.eos_id] for t in texts]
        bounds = self._positions()
        asked = decoding.max_output_len or 0
        if warn and bounds.announced is not None and bounds.target and asked > bounds.target:
            log.warning(
                "max_output_len (--max-output-len) %d is more than %s: translations stop at %d tokens",
                asked, bounds.announced, bounds.target,
            )  # fmt: skip
        lengths = [len(ids) for ids in src]
        if warn:
            skip = set(skip_too_long(lengths, bounds.source, bounds.named, labels))
        else:
            skip = set(too_long(lengths, bounds.source))
        todo = [i for i, n in enumerate(lengths) if n > 1 and i not in skip]
        k = decoding.n_best
        out: list[list[Hypothesis]] = [[([], 0.0)] + [([], -math.inf)] * (k - 1) for _ in src]
        for i in skip:
            out[i] = [([], -math.inf)] * k
        limits = [decoding.output_limit(lengths[i], bounds.target) for i in todo]
        undone = len(src) - len(todo)
        decoded = decode_sorted(
            [src[i] for i in todo],
            limits,
            decoding,
            self._decode_batch,
            device=self.device,
            eos_id=tok.eos_id,
            sentences=self.batch_sentences,
            one_limit=self.one_limit_per_batch,
            progress=None if progress is None else (lambda n: progress(undone + n)),
        )
        for i, hyps in zip(todo, decoded):
            out[i] = hyps
        if warn and bounds.announced is None and bounds.target is not None:
            cut = [
                i
                for i, limit in zip(todo, limits)
                if cut_by_positions(out[i][0][0], lengths[i], limit, decoding)
            ]
            warn_cut(cut, bounds.target, bounds.named, labels)
        return out

    # -------------------------------------------------------------- decoding
    def encode(self, text: str) -> list[int]:
        """Normalise and encode ``text``, with the ``<eos>`` the model was trained with."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        return [*self.src_tokenizer.encode(text), self.src_tokenizer.eos_id]

    def hypotheses(
        self,
        texts: Sequence[str],
        decoding: Decoding | None = None,
        *,
        progress: Progress | None = None,
        **overrides: Any,
    ) -> list[list[Hypothesis]]:
        """Every text's hypotheses ``(target ids, score)``, best first (see the class's
        convention), decoded with ``decoding`` (default: :attr:`decoding`) changed by
        ``overrides`` (``beam_size=4``, ...): always a list per text, whatever ``n_best``.
        Greedy search scores nothing (NaN). ``progress`` is called with the number of texts
        done after each batch."""
        texts = _texts(texts)
        return self._decode(texts, self.decoding.resolve(decoding, **overrides), progress)

    def generate(
        self,
        texts: Sequence[str],
        decoding: Decoding | None = None,
        *,
        progress: Progress | None = None,
        **overrides: Any,
    ) -> list[Any]:
        """Target ids of many texts: per text its best ids (``n_best=1``) or its ``n_best``
        ``(ids, score)`` pairs, best first (:meth:`hypotheses`, shaped by
        :func:`one_best_or_all`)."""
        texts = _texts(texts)
        dec = self.decoding.resolve(decoding, **overrides)
        return one_best_or_all(self._decode(texts, dec, progress), dec.n_best)

    def translate(
        self,
        texts: str | Sequence[str],
        decoding: Decoding | None = None,
        *,
        split: str = DEFAULT_SPLIT,
        **overrides: Any,
    ) -> Any:
        """Translate one text or a sequence of texts, each line a paragraph cut into
        sentences of the model's source language (``split="sentences"``) or taken as one
        sentence (``split="none"``, for text already cut into sentences): the sentences of
        all texts decoded in one batching plan, each text rebuilt with its layout (line
        breaks, blank lines, indentation, the whitespace between sentences;
        :class:`qkv.text.Plan`).

        Returns:
            For a string: its translation (``n_best=1``) or a list of ``(translation, score)``,
            best first (a paragraph's ``k``-th: its sentences' ``k``-th joined, their scores
            summed). For a sequence: a list of those, in order. A blank text comes back as
            it is (with n-best: scored 0, then ``-inf``); a sentence that normalises to
            nothing (a line of symbols) keeps its source.

        Raises:
            SettingError: ``split`` is not ``"sentences"`` or ``"none"``.
        """
        single = isinstance(texts, str)
        items = [texts] if single else texts
        if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence):
            raise TypeError(
                f"texts: expected a str or a sequence of str, got {type(texts).__name__}"
            )
        dec = self.decoding.resolve(decoding, **overrides)
        plan = self.plan(_texts(items), split=split)
        hyps = self.plan_hypotheses(plan, dec)
        if dec.n_best == 1:
            out: list[Any] = plan.join(self.shown(plan.segments, hyps))
        else:
            out = plan.join_hypotheses(self.shown_n_best(plan.segments, hyps), dec.n_best)
        return out[0] if single else out

    def plan_hypotheses(
        self,
        plan: Plan,
        decoding: Decoding | None = None,
        *,
        progress: Progress | None = None,
        **overrides: Any,
    ) -> list[list[Hypothesis]]:
        """The hypotheses of every segment of ``plan`` (:meth:`hypotheses`), decoded in one
        batching plan; a warning about a segment names the text it is in (``input 3``) and,
        in a text of several, which sentence (``input 3 (sentence 2)``)."""
        dec = self.decoding.resolve(decoding, **overrides)
        return self._decode(list(plan.segments), dec, progress, labels=plan.labels())

    def shown(self, segments: Sequence[str], hyps: Sequence[Sequence[Hypothesis]]) -> list[str]:
        """Each segment's best translation as text (:meth:`detokenize`); a segment that
        normalises to nothing (a line of symbols, ``***``), which no engine decodes, shows as
        it is."""
        return [self._shown(s, h[0][0] if h else []) for s, h in zip(segments, hyps)]

    def shown_n_best(
        self, segments: Sequence[str], hyps: Sequence[Sequence[Hypothesis]]
    ) -> list[list[tuple[str, float]]]:
        """:meth:`shown` for every hypothesis: ``(text, score)`` pairs, best first."""
        return [[(self._shown(s, ids), float(sc)) for ids, sc in h] for s, h in zip(segments, hyps)]

    def _shown(self, segment: str, ids: Sequence[int]) -> str:
        if not ids and not self.src_tokenizer.encode(segment):
            return segment
        return self.detokenize(ids)

    def plan(self, texts: Sequence[str], *, split: str = DEFAULT_SPLIT) -> Plan:
        """The :class:`qkv.text.Plan` of ``texts`` in this model's languages (their lines cut
        into sentences, or ``split="none"``: one segment per line): translate
        ``plan.segments`` (:meth:`hypotheses`, :meth:`translate_segments`) and
        ``plan.join`` the translations."""
        langs = self.languages or (None, None)
        return plan_texts(_texts(texts), source=langs[0], target=langs[1], split=split)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Target ids as the text shown: the tokenizer's decoding without doubled or end
        spaces (:func:`qkv.text.clean`)."""
        return clean(self.tgt_tokenizer.decode(ids))

    def translate_segments(
        self, segments: Sequence[str], decoding: Decoding | None = None, **overrides: Any
    ) -> list[str]:
        """One translation per segment, each decoded as one sentence (no splitting; shown as
        :meth:`shown` shows it): the "segments in, segments out" call of :mod:`qkv.text`'s
        documents."""
        dec = dataclasses.replace(self.decoding.resolve(decoding, **overrides), n_best=1)
        return self.shown(segments, self._decode(_texts(segments), dec))

    def align_segments(
        self, segments: Sequence[str], translations: Sequence[str]
    ) -> list[Alignment | None]:
        """Per segment, how its translation's tokens attend to its tokens (cross-attention
        averaged over layers and heads, ``<eos>`` left out), for an engine that
        :attr:`aligns`; None where a pair cannot be shown (too long, or an engine without
        attention)."""
        if len(segments) != len(translations):
            raise ValueError(
                f"translations: expected one per segment ({len(segments)}), got {len(translations)}"
            )
        out: list[Alignment | None] = []
        for src, tgt in zip(segments, translations):
            ids = self.tgt_tokenizer.encode(tgt)
            try:
                sa = self.attention(src, ids=ids)
            except ValueError:  # longer than the positions: placed without weights
                out.append(None)
                continue
            weights = sa.cross_mean()[: len(ids), :-1]
            out.append(
                Alignment(
                    tuple(sa.src_tokens[:-1]),
                    tuple(sa.tgt_tokens[: len(ids)]),
                    tuple(tuple(float(w) for w in row) for row in weights.tolist()),
                )
            )
        return out

    def translate_ids(
        self, text: str, decoding: Decoding | None = None, **overrides: Any
    ) -> list[int]:
        """The target ids of ``text``'s best translation, as ``translate(text, ...)`` decodes
        it; none for a text that normalises to nothing."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        hyps = self._decode([text], self.decoding.resolve(decoding, **overrides))
        return one_best_or_all(hyps, 1)[0]

    def attention(
        self,
        text: str,
        decoding: Decoding | None = None,
        *,
        ids: Sequence[int] | None = None,
        **overrides: Any,
    ) -> Any:
        """The attention weights of ``text``'s translation (engines with :attr:`has_attention`)."""
        raise ValueError(
            f"attention: the {self.engine} engine returns no attention weights; translate with "
            "the qkv engine to see them"
        )

    def attention_shapes(self, src_len: int, tgt_len: int) -> list[tuple[int, int, int]] | None:
        """The ``(H, Lq, Lk)`` of every weight matrix :meth:`attention` gives for a source of
        ``src_len`` tokens and ``tgt_len`` decoder positions (``<bos>`` and the translation;
        0: the encoder's alone), known before anything is decoded; None where the engine does
        not know them beforehand or shows none."""
        return None

    # -------------------------------------------------------------- scoring
    def evaluate(
        self,
        pairs: Sequence[tuple[str, str]],
        decoding: Decoding | None = None,
        *,
        normalize_references: bool = False,
        tokenize: str | None = None,
        **overrides: Any,
    ) -> Evaluation:
        """Translate every source of ``pairs`` and score against its reference with sacreBLEU
        (see :func:`evaluate_pairs`)."""
        tok = check_tokenize(tokenize) if tokenize is not None else self._bleu_tokenizer()
        # before translating, not after
        require("evaluating", ["sacrebleu", *tokenizer_modules(tok)])
        return evaluate_pairs(
            self,
            pairs,
            decoding,
            normalize_references=normalize_references,
            tokenize=tokenize,
            **overrides,
        )

    def _bleu_tokenizer(self) -> str:
        langs = self.languages
        return bleu_tokenizer(langs[1] if langs else None)

    # -------------------------------------------------------------- what a notebook shows
    def card_rows(self) -> list[tuple[str, str]]:
        """The translator's card as ``(label, value)`` rows: engine, model (where the engine
        knows it), languages, decoding, the scores its run recorded, device, path."""
        langs, d = self.languages, self.decoding
        how = d.describe() + (f" (chosen on {d.chosen_on})" if d.chosen_on else "")
        rows = [("engine", self.engine)]
        model = self._model_summary()
        if model is not None:
            rows.append(("model", model))
        rows += [
            ("languages", f"{langs[0]} \u2192 {langs[1]}" if langs else "not recorded"),
            ("decoding", how),
        ]
        scores: dict[str, Any] = {}
        folder = self._card_folder()
        if folder is not None:
            try:
                scores = run_card(folder).get("scores") or {}
            except Exception:  # an unreadable card: a card without scores
                scores = {}
        rows += [(name, f"{value:.2f}") for name, value in scores.items()]
        return [*rows, ("device", str(self.device)), ("path", str(self.path))]

    def _model_summary(self) -> str | None:
        """One line on the model (kind, size, shape), where the engine knows it."""
        return None

    def __repr__(self) -> str:
        where = None if self.path is None else str(self.path)
        return f"{type(self).__name__}(engine={self.engine!r}, path={where!r})"


def evaluate_pairs(
    translator: TextTranslator,
    pairs: Sequence[tuple[str, str]],
    decoding: Decoding | None = None,
    *,
    normalize_references: bool = False,
    tokenize: str | None = None,
    **overrides: Any,
) -> Evaluation:
    """Translate every source of ``pairs`` with ``translator`` (any engine) and score the
    detokenised translations against the references with sacreBLEU's BLEU and chrF.

    BLEU's tokenizer is ``tokenize``, else the one sacreBLEU's ``-l`` gives the target language
    the translator records (``zh`` for Chinese, ``ja-mecab``, ``ko-mecab``, else ``13a``).

    The references are scored as given (sacreBLEU's convention), so the number means what
    sacreBLEU's number means. With ``normalize_references=True`` they first get the target
    tokenizer's normaliser (a lower-casing model scored against lower-cased references); the
    result says so in ``references_normalized`` and its signatures. A blank source counts, with
    the empty translation.
    """
    if not pairs:
        raise ValueError("pairs: expected at least one (source, reference) pair, got none")
    # one translation per source is scored, whatever n-best the translator's default holds
    dec = dataclasses.replace(translator.decoding.resolve(decoding, **overrides), n_best=1)
    found = translator.hypotheses([s for s, _ in pairs], dec)
    tok = translator.tgt_tokenizer
    hyps = [translator.detokenize(h[0][0]) for h in found]
    refs = [tok.normalize(t) if normalize_references else t for _, t in pairs]
    langs = translator.languages
    ev = corpus_scores(hyps, refs, tokenize=tokenize, target_lang=langs[1] if langs else None)
    if normalize_references:
        ev.references_normalized = True
        ev.signatures = {
            k: f"{v} [references normalised as the training data]" for k, v in ev.signatures.items()
        }
    return ev
