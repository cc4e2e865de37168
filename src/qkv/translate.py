"""Using a trained translator: translate, score with sacreBLEU and chrF, look at its attention.

>>> from qkv.translate import Translator
>>> tr = Translator.load("runs/en-fr")             # a qkv train --out folder, or a checkpoint
>>> tr.translate(["I lost.", "He's calm."])        # the run's chosen beam and length penalty
["J'ai perdu.", 'Il est calme.']
>>> tr.translate("Go.", beam_size=4, n_best=2)     # [[(translation, score), ...]]
>>> att = tr.attention("He's calm.")               # SentenceAttention
>>> att.cross[-1].shape                            # last layer: (H, Lt, Ls)
>>> att.cross_mean()                               # (Lt, Ls), averaged over layers and heads
>>> att.save("calm.png")                           # or .svg / .pdf / .html (the viewer)
>>> tr.evaluate(pairs).bleu                        # corpus BLEU of [(source, reference), ...]

Inputs go through the normaliser saved with the model's tokenizers. Scores follow sacreBLEU's
convention: the detokenised translations against the references as given; scoring against
references normalised as the training data (``normalize_references=True``) is labelled as such.

Loading a saved model, batched decoding and scoring are :mod:`qkv.inference` (training validates
through the same functions); :class:`Translator` adds the conveniences of a user's session (one
text or many, the run's decoding by default, attention pictures). ``generate_ids``,
``never_generated``, ``corpus_scores`` and ``Evaluation`` stay importable from here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ._deps import require
from .data import Tokenizer
from .inference import (
    Evaluation,
    check_decoding,
    corpus_scores,
    decode_texts,
    generate_ids,
    load_model,
    never_generated,
    position_limits,
    run_card,
    save_model,
    verify_checkpoint,
)
from .inference.limits import SETTING as POSITION_SETTING
from .inference.limits import too_long
from .inference.quantize import check_quantize, quantize_model
from .nn.seq2seq import EncoderDecoder

log = logging.getLogger(__name__)

__all__ = [
    "Evaluation",
    "SentenceAttention",
    "Translator",
    "corpus_scores",
    "evaluate_pairs",
    "generate_ids",
    "never_generated",
]


# ---------------------------------------------------------------------------- attention
@dataclass
class SentenceAttention:
    """The attention of one translated sentence (``S`` source tokens, ``T`` decoder steps).

    The decoder's step ``t`` reads ``tgt_input_tokens[t]`` (``<bos>`` then the translation) and
    produces ``tgt_tokens[t]`` (the translation then ``<eos>``); cross-attention rows are labelled
    with what they produce, decoder self-attention with what the decoder reads.

    Attributes:
        source: the input text; ``translation``: the output text.
        kind: ``"transformer"`` or ``"bahdanau"``.
        src_tokens: ``S`` source tokens (``<eos>`` last, as the model saw them).
        tgt_tokens: ``T`` produced tokens (``<eos>`` last).
        tgt_input_tokens: ``T`` decoder inputs (``<bos>`` first).
        cross: per decoder layer ``(H, Lt, Ls)``; the Bahdanau model has one layer with one head.
        encoder_self: per encoder layer ``(H, S, S)``; None for the Bahdanau (GRU) encoder.
        decoder_self: per decoder layer ``(H, T, T)``; None for the Bahdanau decoder.
    """

    source: str
    translation: str
    kind: str
    src_tokens: list[str]
    tgt_tokens: list[str]
    tgt_input_tokens: list[str]
    cross: list[Tensor]
    encoder_self: list[Tensor] | None = None
    decoder_self: list[Tensor] | None = None

    def cross_mean(self, layer: int | None = None) -> Tensor:
        """The ``(Lt, Ls)`` alignment: cross-attention averaged over the heads of ``layer``, or
        over every layer and head when ``layer`` is None."""
        if layer is None:
            return torch.stack([w.mean(0) for w in self.cross]).mean(0)
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer: expected an int or None, got {layer!r}")
        n = len(self.cross)
        if not -n <= layer < n:
            raise ValueError(f"layer: expected an index in [{-n}, {n}), got {layer}")
        return self.cross[layer].mean(0)

    @property
    def bahdanau(self) -> Tensor | None:
        """The Bahdanau decoder's per-step weights ``(Lt, Ls)`` (None for a Transformer)."""
        return self.cross[0][0] if self.kind == "bahdanau" else None

    def kinds(self) -> list:
        """The :class:`qkv.viz.AttentionKind` list for :func:`qkv.viz.save_attention`."""
        from .viz import AttentionKind, translation_attention

        if self.kind == "bahdanau":
            return translation_attention(self.src_tokens, self.tgt_tokens, bahdanau=self.bahdanau)
        kinds = translation_attention(
            self.src_tokens, self.tgt_tokens, encoder=self.encoder_self, cross=self.cross
        )
        if self.decoder_self is not None:
            dec = AttentionKind(
                "decoder self-attention",
                self.decoder_self,
                self.tgt_input_tokens,
                self.tgt_input_tokens,
            )
            kinds.insert(1, dec)
        return kinds

    def save(self, path: str | Path, **kwargs: Any) -> Path:
        """Draw to ``path`` by its extension: ``.png``/``.svg``/``.pdf`` (every kind and layer,
        heads averaged) or ``.html`` (the interactive viewer)."""
        from .viz import save_attention

        title = kwargs.pop("title", f"{self.source}  ->  {self.translation}")
        p = Path(path)
        if p.suffix.lower() in (".html", ".htm"):
            kwargs["title"] = title
        return save_attention(p, self.kinds(), **kwargs)


# ---------------------------------------------------------------------------- the translator
def _token_strings(tok: Tokenizer, ids: Sequence[int]) -> list[str]:
    try:
        strings = tok.tokens()
    except NotImplementedError:  # a user's own Tokenizer that lists no tokens
        return [str(int(i)) for i in ids]
    return [strings[int(i)] for i in ids]


class Translator:
    """A trained model with its tokenizers, ready to translate.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder` with its ``config``.
        src_tokenizer, tgt_tokenizer: the tokenizers it was trained with (their normaliser is
            applied to the inputs).
        device: where the model runs.
        path: the checkpoint folder it came from (informational).
        decoding: the default ``{"beam_size": ..., "length_penalty": ...}`` of
            :meth:`translate`, :meth:`evaluate` and :meth:`attention`, and ``no_repeat_ngram``
            (n-grams never repeated; see :func:`qkv.decoding.generate`); a trained run's
            ``final`` model carries the ones chosen on its validation split. None: greedy,
            nothing blocked. Kept in :attr:`decoding`, which may be changed.
    """

    def __init__(
        self,
        model: EncoderDecoder,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        *,
        device: torch.device | str = "cpu",
        path: Path | None = None,
        decoding: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, EncoderDecoder):
            raise TypeError(f"model: expected an EncoderDecoder, got {type(model).__name__}")
        for name, tok in (("src_tokenizer", src_tokenizer), ("tgt_tokenizer", tgt_tokenizer)):
            if not isinstance(tok, Tokenizer):
                raise TypeError(f"{name}: expected a qkv.data Tokenizer, got {type(tok).__name__}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.path = path
        self.decoding = check_decoding(decoding)

    def resolve_decoding(
        self, beam_size: int | None, length_penalty: float | None
    ) -> tuple[int, float]:
        """The given beam size and length penalty, or the model's chosen ones."""
        beam = self.decoding["beam_size"] if beam_size is None else beam_size
        lp = self.decoding["length_penalty"] if length_penalty is None else length_penalty
        return beam, lp

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        *,
        device: torch.device | str = "cpu",
        quantize: str | None = None,
    ) -> Translator:
        """Load from a ``qkv train --out`` folder (its best checkpoint by validation BLEU, else
        its newest) or from one checkpoint folder.

        ``device`` is picked as ``qkv train`` picks it (``"auto"``, ``"cpu"``, ``"cuda"``,
        ``"cuda:N"``). ``quantize="int8"``: every linear layer dynamically quantized to int8
        (faster on the CPU, translations may differ slightly; see
        :func:`qkv.inference.quantize_model`); CPU only.

        Raises:
            CheckpointError: no checkpoint there, or a corrupt or foreign one.
            ValueError: a bad device name, CUDA asked for where it is not available, an unknown
                ``quantize``, or ``quantize`` on CUDA.
        """
        if quantize is not None:  # refused before the model is read
            check_quantize(quantize, "cpu" if device == "auto" else device)
        saved = load_model(model_dir, device=device)
        model = saved.model
        if quantize is not None:
            check_quantize(quantize, saved.device)  # "auto" that picked CUDA
            model = quantize_model(model, quantize)
        return cls(
            model,
            saved.src_tokenizer,
            saved.tgt_tokenizer,
            device=saved.device,
            path=saved.path,
            decoding=saved.decoding,
        )

    def save(
        self, out: str | Path, *, card: dict[str, Any] | None = None, force: bool = False
    ) -> Path:
        """Save as an inference-only model folder (weights, config, tokenizers, this
        translator's :attr:`decoding`, a ``README.md`` model card; no training state) that
        :meth:`load`, ``qkv translate``, ``qkv evaluate`` and the viewer accept. See
        :func:`qkv.inference.save_model`.

        Args:
            out: the folder to write (atomically); it must be new or empty.
            card: the model card's content (:func:`qkv.inference.model_card`); None: what the
                folder this translator was loaded from recorded of its run, if anything.
            force: replace a model folder saved before (never a run or a checkpoint).

        Returns:
            ``out``.
        """
        if card is None and self.path is not None:
            card = run_card(self.path)
        default = check_decoding(None)
        changed = {k: v for k, v in self.decoding.items() if default.get(k) != v}
        step = 0
        if self.path is not None:
            step = int(verify_checkpoint(self.path, files=[]).get("step") or 0)
        return save_model(
            self.model,
            self.src_tokenizer,
            self.tgt_tokenizer,
            out,
            decoding=self.decoding if changed else None,
            card=card,
            force=force,
            step=step,
            source=self.path,
        )

    @property
    def kind(self) -> str:
        """``"transformer"`` or ``"bahdanau"``."""
        return self.model.config.kind if self.model.config is not None else "transformer"

    def encode(self, text: str) -> list[int]:
        """Normalise and encode ``text``, with the ``<eos>`` the model was trained with."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        return [*self.src_tokenizer.encode(text), self.src_tokenizer.eos_id]

    def translate(
        self,
        texts: str | Sequence[str],
        *,
        beam_size: int | None = None,
        n_best: int = 1,
        length_penalty: float | None = None,
        max_len: int | None = None,
    ) -> Any:
        """Translate one text or a list of texts.

        Args:
            texts: a string, or a sequence of strings.
            beam_size: 1 for greedy search.
            n_best: translations per text (at most ``beam_size``).
            length_penalty: beam score ``sum(log p) / length ** length_penalty``.
            max_len: the most tokens per translation (default: each text's own
                ``2 * source length + 10``, so a translation never depends on the texts
                translated with it).

        Returns:
            For a string: its translation (``n_best=1``) or a list of ``(translation, score)``,
            best first. For a sequence: a list of those, in order. A text that normalises to
            nothing (blank, whitespace) is not decoded: its translation is ``""``; with n-best,
            ``n_best`` pairs like any text's: ``("", 0.0)`` (nothing translates to nothing,
            with certainty) then ``("", -inf)`` (no other translation).
        """
        single = isinstance(texts, str)
        items = [texts] if single else texts
        if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence):
            raise TypeError(
                f"texts: expected a str or a sequence of str, got {type(texts).__name__}"
            )
        res = self.generate(
            items,
            beam_size=beam_size,
            n_best=n_best,
            length_penalty=length_penalty,
            max_len=max_len,
        )
        dec = self.tgt_tokenizer.decode
        if n_best == 1:
            out: list[Any] = [dec(ids) for ids in res]
        else:
            out = [[(dec(ids), float(score)) for ids, score in hyps] for hyps in res]
        return out[0] if single else out

    def generate(
        self,
        texts: Sequence[str],
        *,
        beam_size: int | None = None,
        n_best: int = 1,
        length_penalty: float | None = None,
        max_len: int | None = None,
        max_tokens: int = 4096,
        progress: Callable[[int], None] | None = None,
    ) -> list[Any]:
        """Target ids of :meth:`translate` (same arguments, a sequence of texts): per text its
        ids (``n_best=1``) or its ``[(ids, score), ...]``, without ``<bos>``/``<eos>``.

        The texts are decoded in batches of at most ``max_tokens`` source tokens (times the
        beam), sorted by length; ``progress`` is called with the number of texts done after
        each batch. A text that normalises to nothing is not decoded (the model would make a
        sentence up from ``<eos>`` alone): ``[]``, with n-best ``[([], 0.0), ([], -inf), ...]``.

        A model with learned positions (``model.max_len``) cannot read or write past its table:
        every translation stops at the table (``max_len`` included), and a text whose source is
        longer than the table is not translated: ``[]`` (n-best: ``n_best`` empty hypotheses
        scored ``-inf``), with a warning naming it (``input 3``, 1-based) and the setting; the
        other texts are translated as they would be alone.
        """
        if isinstance(texts, (str, bytes, bytearray)) or not isinstance(texts, Sequence):
            raise TypeError(f"texts: expected a sequence of str, got {type(texts).__name__}")
        beam_size, length_penalty = self.resolve_decoding(beam_size, length_penalty)
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"text: expected a str, got {type(t).__name__}")
        src_limit, tgt_limit = position_limits(self.model)
        if tgt_limit is not None and max_len is not None and max_len > tgt_limit:
            log.warning(
                "max_len (--max-len) %d is more than the model's %d learned target positions (%s): "
                "translations stop at %d tokens",
                max_len, tgt_limit, POSITION_SETTING, tgt_limit,
            )  # fmt: skip
            max_len = tgt_limit
        skip = too_long([len(self.encode(t)) for t in texts], src_limit) if src_limit else []
        if skip:
            shown = ", ".join(str(i + 1) for i in skip[:10]) + (", ..." if len(skip) > 10 else "")
            log.warning(
                "input%s %s: more source tokens than the model's %d learned positions (%s): "
                "not translated (empty)",
                "s" if len(skip) > 1 else "", shown, src_limit, POSITION_SETTING,
            )  # fmt: skip
        skipped = set(skip)
        todo = [i for i in range(len(texts)) if i not in skipped]
        done = decode_texts(
            self.model,
            [texts[i] for i in todo],
            self.src_tokenizer,
            self.tgt_tokenizer,
            device=self.device,
            beam_size=beam_size,
            n_best=n_best,
            length_penalty=length_penalty,
            max_len=max_len,
            max_len_cap=tgt_limit,
            no_repeat_ngram=self.decoding["no_repeat_ngram"],
            max_tokens=max_tokens,
            progress=None if progress is None else (lambda k: progress(k + len(skip))),
        )
        if not skip:
            return done
        out: list[Any] = [[] if n_best == 1 else [([], -math.inf)] * n_best for _ in texts]
        for i, r in zip(todo, done):
            out[i] = r
        return out

    def attention(
        self,
        text: str,
        *,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        max_len: int | None = None,
        ids: Sequence[int] | None = None,
    ) -> SentenceAttention:
        """Translate ``text`` and return every attention weight the model used for it.

        The translation is decoded first, exactly as ``translate(text, ...)`` with the same
        ``beam_size``, ``length_penalty`` and ``max_len`` decodes it, unless ``ids`` gives the
        translation's target ids already (e.g. from :meth:`generate` over many texts). Then one
        teacher-forced pass over ``<bos>`` + its tokens materialises the weights, which are
        exactly those of the incremental decoding.
        """
        src_ids = self.encode(text)
        src_limit, tgt_limit = position_limits(self.model)

        def check(what: str, n: int, limit: int | None) -> None:
            if limit is not None and n > limit:
                raise ValueError(
                    f"text: its {what} has {n} tokens (<eos> counted), more than the model's "
                    f"{limit} learned positions ({POSITION_SETTING}): it cannot be shown"
                )

        check("source", len(src_ids), src_limit)
        if ids is None:
            ids = self.translate_ids(
                text, beam_size=beam_size, length_penalty=length_penalty, max_len=max_len
            )
        ids = [int(i) for i in ids]
        check("translation", len(ids), tgt_limit)
        src = torch.tensor([src_ids], dtype=torch.long, device=self.device)
        bos, eos = self.tgt_tokenizer.bos_id, self.tgt_tokenizer.eos_id
        # a translation cut at the learned table ends without <eos>: its rows are those that
        # produced its tokens (the row after them, which would need one more position, is not)
        cut = tgt_limit is not None and len(ids) == tgt_limit
        produced = ids if cut else [*ids, eos]
        read = [bos, *ids[:-1]] if cut else [bos, *ids]
        dec_in = torch.tensor([read], dtype=torch.long, device=self.device)
        S, T = src.shape[1], dec_in.shape[1]
        training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                _, maps = self.model(
                    src, dec_in, torch.tensor([S], device=self.device), return_attention=True
                )
        finally:
            self.model.train(training)
        one = maps.sentence(0, src_len=S, tgt_len=T)
        src_tokens = _token_strings(self.src_tokenizer, src[0].tolist())
        out_tokens = _token_strings(self.tgt_tokenizer, produced)
        in_tokens = _token_strings(self.tgt_tokenizer, read)
        return SentenceAttention(
            source=text,
            translation=self.tgt_tokenizer.decode(ids),
            kind=self.kind,
            src_tokens=src_tokens,
            tgt_tokens=out_tokens,
            tgt_input_tokens=in_tokens,
            cross=one["cross"],
            encoder_self=one.get("encoder_self"),
            decoder_self=one.get("decoder_self"),
        )

    def translate_ids(
        self,
        text: str,
        *,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        max_len: int | None = None,
    ) -> list[int]:
        """The target ids of ``text``'s best translation (without ``<bos>``/``<eos>``), as
        ``translate(text, ...)`` decodes it; none for a text that normalises to nothing."""
        (ids,) = self.generate(
            [text], beam_size=beam_size, length_penalty=length_penalty, max_len=max_len
        )
        return ids

    def evaluate(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        normalize_references: bool = False,
        max_tokens: int = 4096,
    ) -> Evaluation:
        """Translate every source of ``pairs`` and score against its reference with sacreBLEU.

        The references are scored as given (sacreBLEU's convention: detokenised output against
        the raw references), so the number means what sacreBLEU's number means. With
        ``normalize_references=True`` they first get the target tokenizer's normaliser (a
        lower-casing model scored against lower-cased references); the result says so in
        ``references_normalized`` and its signatures. Returns an :class:`Evaluation`. A blank
        source counts, with the empty translation :meth:`translate` gives it. ``max_tokens``:
        as :meth:`generate`.
        """
        require("Translator.evaluate", ["sacrebleu"])  # before translating, not after
        return evaluate_pairs(
            self,
            pairs,
            beam_size=beam_size,
            length_penalty=length_penalty,
            normalize_references=normalize_references,
            max_tokens=max_tokens,
        )

    def __repr__(self) -> str:
        return f"Translator(kind={self.kind!r}, path={str(self.path)!r}, device={self.device})"


def evaluate_pairs(
    translator: Any,
    pairs: Sequence[tuple[str, str]],
    *,
    beam_size: int | None = None,
    length_penalty: float | None = None,
    normalize_references: bool = False,
    max_tokens: int = 4096,
) -> Evaluation:
    """:meth:`Translator.evaluate` for anything with a Translator's ``generate`` and
    ``tgt_tokenizer`` (``qkv evaluate --engine ctranslate2`` scores through it too)."""
    if not pairs:
        raise ValueError("pairs: expected at least one (source, reference) pair, got none")
    ids = translator.generate(
        [s for s, _ in pairs],
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_tokens=max_tokens,
    )
    tok = translator.tgt_tokenizer
    hyps = [tok.decode(i) for i in ids]
    refs = [tok.normalize(t) if normalize_references else t for _, t in pairs]
    ev = corpus_scores(hyps, refs)
    if normalize_references:
        ev.references_normalized = True
        ev.signatures = {
            k: f"{v} [references normalised as the training data]" for k, v in ev.signatures.items()
        }
    return ev
