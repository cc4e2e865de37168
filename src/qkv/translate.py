"""Using a trained translator: translate, score with sacreBLEU and chrF, look at its attention.

>>> from qkv.translate import Translator
>>> tr = Translator.load("runs/en-fr")             # a qkv train --out folder, or a checkpoint
>>> tr.translate(["I lost.", "He's calm."])        # the run's chosen beam and length penalty
["J'ai perdu.", 'Il est calme.']
>>> tr.translate("Go.", beam_size=4, n_best=2)     # [[(translation, score), ...]]
>>> att = tr.attention("He's calm.")               # SentenceAttention
>>> att.cross[-1].shape                            # last layer: (H, T, S)
>>> att.cross_mean()                               # (T, S), averaged over layers and heads
>>> att.save("calm.png")                           # or .svg / .pdf / .html (the viewer)
>>> tr.evaluate(pairs).bleu                        # corpus BLEU of [(source, reference), ...]

Inputs go through the normaliser saved with the model's tokenizers. Scores follow sacreBLEU's
convention: the detokenised translations against the references as given; scoring against
references normalised as the training data (``normalize_references=True``) is labelled as such.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .data import Tokenizer, load_tokenizers
from .nn.seq2seq import EncoderDecoder, build_model
from .train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model_weights,
    resolve_model_dir,
)

__all__ = [
    "Evaluation",
    "SentenceAttention",
    "Translator",
    "corpus_scores",
    "generate_ids",
    "never_generated",
]


# ---------------------------------------------------------------------------- batched decoding
def _default_max_len(src_len: int) -> int:
    return 2 * src_len + 10


def generate_ids(
    model: nn.Module,
    src_ids: Sequence[Sequence[int]],
    *,
    bos_id: int,
    eos_id: int,
    device: torch.device | str = "cpu",
    beam_size: int = 1,
    n_best: int = 1,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    max_tokens: int = 4096,
    max_len_cap: int | None = None,
    no_repeat_ngram: int = 0,
    suppress: Sequence[int] = (),
) -> list[Any]:
    """Decode many sources, batched by length, returned in input order.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder`.
        src_ids: one id list per sentence, ``<eos>`` already appended.
        bos_id, eos_id: the target's special ids.
        device: where to run.
        beam_size, n_best, length_penalty: as :func:`qkv.decoding.generate`.
        max_len: the most tokens per translation; None: ``2 * source length + 10`` per batch.
        max_tokens: a batch holds at most this many source positions (times the beam).
        max_len_cap: with ``max_len=None``, the default length is capped at this.
        no_repeat_ngram, suppress: as :func:`qkv.decoding.generate`.

    Returns:
        Per sentence its ids (``n_best=1``) or its ``[(ids, score), ...]``, in input order.
    """
    from .decoding import generate

    n = len(src_ids)
    out: list[Any] = [None] * n
    order = sorted(range(n), key=lambda i: len(src_ids[i]))
    start = 0
    while start < n:
        longest = max(len(src_ids[order[start]]), 1)
        stop = start + 1
        while stop < n:
            longest_next = max(longest, len(src_ids[order[stop]]))
            if (stop - start + 1) * longest_next * beam_size > max_tokens:
                break
            longest, stop = longest_next, stop + 1
        rows = order[start:stop]
        lens = [max(len(src_ids[i]), 1) for i in rows]
        L = max(lens)
        src = torch.zeros(len(rows), L, dtype=torch.long)
        for r, i in enumerate(rows):
            ids = list(src_ids[i]) or [eos_id]
            src[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        valid = torch.tensor(lens, dtype=torch.long)
        limit = max_len if max_len is not None else _default_max_len(L)
        if max_len is None and max_len_cap is not None:
            limit = min(limit, max_len_cap)
        res = generate(
            model,
            src.to(device),
            valid.to(device),
            max_len=limit,
            bos_id=bos_id,
            eos_id=eos_id,
            beam_size=beam_size,
            length_penalty=length_penalty,
            n_best=n_best,
            no_repeat_ngram=no_repeat_ngram,
            suppress=suppress,
        )
        for r, i in enumerate(rows):
            out[i] = res[r]
        start = stop
    return out


def never_generated(tok: Tokenizer) -> list[int]:
    """Ids a translation never needs: ``<unk>`` for a tokenizer that spells unknown characters
    in bytes (its training text never held ``<unk>``, so an emitted one is a model's error and
    would print as `` ⁇ ``)."""
    return [tok.unk_id] if getattr(tok, "byte_fallback", False) else []


# ---------------------------------------------------------------------------- scores
@dataclass
class Evaluation:
    """Corpus scores of a set of translations.

    Attributes:
        bleu: sacreBLEU's corpus BLEU (0-100).
        chrf: sacreBLEU's chrF2 (0-100).
        n: sentences scored.
        signatures: ``{"bleu": ..., "chrf": ...}``, sacreBLEU's reproducibility signatures.
        bleu_detail: sacreBLEU's full BLEU line (n-gram precisions, brevity penalty, ...).
        hypotheses, references: the texts that were scored.
        references_normalized: the references were normalised as the training data (not
            sacreBLEU's convention; labelled in the signatures).
    """

    bleu: float
    chrf: float
    n: int
    signatures: dict[str, str]
    bleu_detail: str = ""
    hypotheses: list[str] = field(default_factory=list, repr=False)
    references: list[str] = field(default_factory=list, repr=False)
    references_normalized: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``bleu``, ``chrf``, ``n``, ``signatures`` and ``bleu_detail`` (JSON-ready)."""
        return {
            "bleu": round(self.bleu, 4),
            "chrf": round(self.chrf, 4),
            "n": self.n,
            "signatures": dict(self.signatures),
            "bleu_detail": self.bleu_detail,
            "references_normalized": self.references_normalized,
        }


def _sacrebleu() -> Any:
    try:
        import sacrebleu
    except ImportError:
        raise ImportError("scoring needs sacrebleu: pip install 'qkv[train]'") from None
    return sacrebleu


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Evaluation:
    """sacreBLEU's corpus BLEU and chrF of ``hypotheses`` against one reference each.

    Raises:
        ValueError: the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypotheses: expected one per reference ({len(references)}), got {len(hypotheses)}"
        )
    if not hypotheses:
        raise ValueError("hypotheses: expected at least one sentence to score, got none")
    sb = _sacrebleu()
    # force: book-normalised text ends in " ." on purpose; sacreBLEU would warn about it
    bleu, chrf = sb.metrics.BLEU(force=True), sb.metrics.CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return Evaluation(
        bleu=float(b.score),
        chrf=float(c.score),
        n=len(hypotheses),
        signatures={"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
        bleu_detail=str(b),
        hypotheses=list(hypotheses),
        references=list(references),
    )


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
        cross: per decoder layer ``(H, T, S)``; the Bahdanau model has one layer with one head.
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
        """The ``(T, S)`` alignment: cross-attention averaged over the heads of ``layer``, or
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
        """The Bahdanau decoder's per-step weights ``(T, S)`` (None for a Transformer)."""
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
def _check_decoding(decoding: Any) -> dict[str, Any]:
    """``{"beam_size": int >= 1, "length_penalty": float, "no_repeat_ngram": int >= 0}`` (other
    keys kept); None: greedy, nothing blocked."""
    if decoding is None:
        return {"beam_size": 1, "length_penalty": 1.0, "no_repeat_ngram": 0}
    if not isinstance(decoding, dict):
        raise TypeError(f"decoding: expected a dict, got {type(decoding).__name__}")
    beam, lp = decoding.get("beam_size", 1), decoding.get("length_penalty", 1.0)
    nr = decoding.get("no_repeat_ngram", 0)
    if isinstance(nr, bool) or not isinstance(nr, int) or nr < 0:
        raise ValueError(f"decoding: no_repeat_ngram: expected an int >= 0, got {nr!r}")
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ValueError(f"decoding: beam_size: expected an int >= 1, got {beam!r}")
    if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
        raise ValueError(f"decoding: length_penalty: expected a finite number, got {lp!r}")
    return {**decoding, "beam_size": beam, "length_penalty": float(lp), "no_repeat_ngram": nr}


def _token_strings(tok: Tokenizer, ids: Sequence[int]) -> list[str]:
    vocab = getattr(tok, "vocab", None)
    if vocab is not None:
        return vocab.decode(ids)
    sp = getattr(tok, "_sp", None)  # SentencePieceTokenizer: pieces by id
    if sp is not None:
        return [sp.id_to_piece(int(i)) for i in ids]
    return [str(int(i)) for i in ids]


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
        self.decoding = _check_decoding(decoding)

    def resolve_decoding(
        self, beam_size: int | None, length_penalty: float | None
    ) -> tuple[int, float]:
        """The given beam size and length penalty, or the model's chosen ones."""
        beam = self.decoding["beam_size"] if beam_size is None else beam_size
        lp = self.decoding["length_penalty"] if length_penalty is None else length_penalty
        return beam, lp

    @classmethod
    def load(cls, model_dir: str | Path, *, device: torch.device | str = "cpu") -> Translator:
        """Load from a ``qkv train --out`` folder (its best checkpoint by validation BLEU, else
        its newest) or from one checkpoint folder.

        ``device`` is picked as ``qkv train`` picks it (``"auto"``, ``"cpu"``, ``"cuda"``,
        ``"cuda:N"``).

        Raises:
            CheckpointError: no checkpoint there, or a corrupt or foreign one.
            ValueError: a bad device name, or CUDA asked for where it is not available.
        """
        from .train.distributed import pick_device

        device = pick_device(device)
        folder = resolve_model_dir(model_dir)
        ckpt = load_checkpoint(folder, with_tensors=False)
        try:
            model = build_model(ckpt.model_config)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint: model.json in {str(folder)!r} is invalid: {e}"
            ) from None
        load_model_weights(folder, model)
        try:
            src, tgt = load_tokenizers(folder / "tokenizers")
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(
                f"checkpoint: the tokenizers in {str(folder)!r} cannot be loaded: {e}"
            ) from None
        cfg = model.config
        if (src.vocab_size, tgt.vocab_size) != (cfg.src_vocab_size, cfg.tgt_vocab_size):
            raise CheckpointError(
                f"checkpoint: the tokenizers in {str(folder)!r} have vocabularies of "
                f"{src.vocab_size} and {tgt.vocab_size} ids, the model expects "
                f"{cfg.src_vocab_size} and {cfg.tgt_vocab_size}"
            )
        decoding = None
        if (folder / "decoding.json").is_file():
            try:
                decoding = json.loads((folder / "decoding.json").read_text(encoding="utf-8"))
                _check_decoding(decoding)
            except (ValueError, TypeError) as e:
                raise CheckpointError(
                    f"checkpoint: decoding.json in {str(folder)!r} is invalid: {e}"
                ) from None
        return cls(model, src, tgt, device=device, path=folder, decoding=decoding)

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
            max_len: the most tokens per translation (default ``2 * source length + 10``).

        Returns:
            For a string: its translation (``n_best=1``) or a list of ``(translation, score)``,
            best first. For a sequence: a list of those, in order. A text that normalises to
            nothing (blank, whitespace) is not decoded: its translation is ``""`` (n-best:
            ``[("", 0.0)]``).
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
    ) -> list[Any]:
        """Target ids of :meth:`translate` (same arguments, a sequence of texts): per text its
        ids (``n_best=1``) or its ``[(ids, score), ...]``, without ``<bos>``/``<eos>``.

        A text that normalises to nothing is not decoded: ``[]`` (n-best: ``[([], 0.0)]``);
        the model would otherwise make a sentence up from ``<eos>`` alone.
        """
        if isinstance(texts, (str, bytes, bytearray)) or not isinstance(texts, Sequence):
            raise TypeError(f"texts: expected a sequence of str, got {type(texts).__name__}")
        beam_size, length_penalty = self.resolve_decoding(beam_size, length_penalty)
        src = [self.encode(t) for t in texts]
        todo = [i for i, ids in enumerate(src) if len(ids) > 1]
        res = generate_ids(
            self.model,
            [src[i] for i in todo],
            bos_id=self.tgt_tokenizer.bos_id,
            eos_id=self.tgt_tokenizer.eos_id,
            device=self.device,
            beam_size=beam_size,
            n_best=n_best,
            length_penalty=length_penalty,
            max_len=max_len,
            no_repeat_ngram=self.decoding["no_repeat_ngram"],
            suppress=never_generated(self.tgt_tokenizer),
        )
        out: list[Any] = [[] if n_best == 1 else [([], 0.0)] for _ in src]
        for i, r in zip(todo, res):
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
        translation's target ids already (e.g. from :meth:`generate` over a batch of texts, whose
        default ``max_len`` follows the batch's longest source). Then one teacher-forced pass
        over ``<bos>`` + its tokens materialises the weights, which are exactly those of the
        incremental decoding.
        """
        if ids is None:
            ids = self.translate_ids(
                text, beam_size=beam_size, length_penalty=length_penalty, max_len=max_len
            )
        ids = [int(i) for i in ids]
        src = torch.tensor([self.encode(text)], dtype=torch.long, device=self.device)
        bos, eos = self.tgt_tokenizer.bos_id, self.tgt_tokenizer.eos_id
        dec_in = torch.tensor([[bos, *ids]], dtype=torch.long, device=self.device)
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
        out_tokens = _token_strings(self.tgt_tokenizer, [*ids, eos])
        in_tokens = _token_strings(self.tgt_tokenizer, [bos, *ids])
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
    ) -> Evaluation:
        """Translate every source of ``pairs`` and score against its reference with sacreBLEU.

        The references are scored as given (sacreBLEU's convention: detokenised output against
        the raw references), so the number means what sacreBLEU's number means. With
        ``normalize_references=True`` they first get the target tokenizer's normaliser (a
        lower-casing model scored against lower-cased references); the result says so in
        ``references_normalized`` and its signatures. Returns an :class:`Evaluation`. A blank
        source counts, with the empty translation :meth:`translate` gives it.
        """
        if not pairs:
            raise ValueError("pairs: expected at least one (source, reference) pair, got none")
        hyps = self.translate(
            [s for s, _ in pairs], beam_size=beam_size, length_penalty=length_penalty
        )
        if normalize_references:
            refs = [self.tgt_tokenizer.normalize(t) for _, t in pairs]
        else:
            refs = [t for _, t in pairs]
        ev = corpus_scores(hyps, refs)
        if normalize_references:
            ev.references_normalized = True
            ev.signatures = {
                k: f"{v} [references normalised as the training data]"
                for k, v in ev.signatures.items()
            }
        return ev

    def __repr__(self) -> str:
        return f"Translator(kind={self.kind!r}, path={str(self.path)!r}, device={self.device})"
