"""Using a trained translator: translate, score with sacreBLEU and chrF, look at its attention.

>>> from qkv.translate import Translator
>>> tr = Translator.load("runs/en-fr")             # a qkv train --out folder, or a checkpoint
>>> tr.translate(["I lost.", "He's calm."])        # the run's chosen decoding (tr.decoding)
["J'ai perdu.", 'Il est calme.']
>>> tr.translate("Go.", beam_size=4, n_best=2)     # [[(translation, score), ...]]
>>> tr.with_decoding(beam_size=1).translate("Go.") # another default, the same model
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
text or many, the run's decoding by default, attention pictures); it is the qkv engine of
:class:`qkv.inference.TextTranslator`, as CTranslate2's and ONNX's engines are.
``generate_ids``, ``never_generated``, ``corpus_scores``, ``evaluate_pairs`` and
``Evaluation`` stay importable from here.
"""

from __future__ import annotations

import html as _html
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .data import Tokenizer
from .inference import (
    Decoding,
    Evaluation,
    corpus_scores,
    evaluate_pairs,
    generate_ids,
    load_model,
    never_generated,
    position_limits,
    run_card,
    save_model,
    verify_checkpoint,
)
from .inference.decode import ModelEngine
from .inference.limits import SETTING as POSITION_SETTING
from .inference.quantize import check_quantize, quantize_model
from .nn.seq2seq import EncoderDecoder
from .text import DEFAULT_SPLIT
from .viz.display import CardDisplay
from .viz.vectors import record_queries_keys

log = logging.getLogger(__name__)

__all__ = [
    "Evaluation",
    "ParagraphAttention",
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
        vectors: the queries and keys behind the weights, for the viewer's neuron view:
            ``{"encoder" | "decoder" | "cross": (queries, keys, scale)}`` with per-layer
            ``(H, L, d)`` tensors (:func:`qkv.viz.vectors.record_queries_keys`); empty for the
            Bahdanau model, whose additive scores have no dot product.
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
    vectors: dict[str, Any] = field(default_factory=dict)

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
        vectors = {k: v for k, v in self.vectors.items() if k != "decoder"}
        kinds = translation_attention(
            self.src_tokens,
            self.tgt_tokens,
            encoder=self.encoder_self,
            cross=self.cross,
            vectors=vectors,
        )
        if self.decoder_self is not None:
            q_k = self.vectors.get("decoder")
            dec = AttentionKind(
                "decoder self-attention",
                self.decoder_self,
                self.tgt_input_tokens,
                self.tgt_input_tokens,
                **({} if q_k is None else dict(zip(("queries", "keys", "scale"), q_k))),
            )
            kinds.insert(1, dec)
        return kinds

    def _repr_html_(self) -> str:
        """In a notebook: the interactive viewer of every kind, layer and head, inline
        (:class:`qkv.viz.AttentionViewer`)."""
        from .viz import AttentionViewer

        title = f"{self.source}  \u2192  {self.translation}"
        return AttentionViewer(self.kinds(), title=title)._repr_html_()

    def __repr__(self) -> str:
        layers = f"{len(self.cross)} cross-attention layer{'s' if len(self.cross) != 1 else ''}"
        return (
            f"SentenceAttention({self.source!r} -> {self.translation!r}, {self.kind}, "
            f"{len(self.src_tokens)} source x {len(self.tgt_tokens)} target tokens, {layers})"
        )

    def save(self, path: str | Path, **kwargs: Any) -> Path:
        """Draw to ``path`` by its extension: ``.png``/``.svg``/``.pdf`` (every kind and layer,
        heads averaged) or ``.html`` (the interactive viewer)."""
        from .viz import save_attention

        title = kwargs.pop("title", f"{self.source}  ->  {self.translation}")
        p = Path(path)
        if p.suffix.lower() in (".html", ".htm"):
            kwargs["title"] = title
        return save_attention(p, self.kinds(), **kwargs)


@dataclass
class ParagraphAttention:
    """The attention of a paragraph, translated sentence by sentence: one
    :class:`SentenceAttention` per sentence (``paragraph[i]``, ``len(paragraph)``, in order).

    Attributes:
        source: the paragraph; ``translation``: its translation, the sentences' joined.
        sentences: each sentence's attention.
    """

    source: str
    translation: str
    sentences: list[SentenceAttention]

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, i: int) -> SentenceAttention:
        return self.sentences[i]

    def __iter__(self) -> Any:
        return iter(self.sentences)

    def _fragments(self) -> str:
        from .viz import attention_fragment

        return "\n".join(
            attention_fragment(sa.kinds(), title=f"{k + 1}. {sa.source}  \u2192  {sa.translation}")
            for k, sa in enumerate(self.sentences)
        )

    def _repr_html_(self) -> str:
        """In a notebook: one viewer per sentence, in order."""
        return self._fragments()

    def save(self, path: str | Path, *, sentence: int | None = None, **kwargs: Any) -> Path:
        """Draw to ``path`` by its extension: ``.html``, one page with every sentence's viewer
        (or sentence ``sentence``'s alone); ``.png``/``.svg``/``.pdf``: sentence ``sentence``'s
        figure (needed when the paragraph has more than one)."""
        p = Path(path)
        if sentence is not None:
            if not -len(self) <= sentence < len(self):
                raise ValueError(
                    f"sentence: expected an index in [{-len(self)}, {len(self)}), got {sentence}"
                )
            return self.sentences[sentence].save(p, **kwargs)
        if len(self) == 1:
            return self.sentences[0].save(p, **kwargs)
        if p.suffix.lower() not in (".html", ".htm"):
            raise ValueError(
                f"sentence: a figure shows one sentence of {len(self)}: give sentence=, or "
                f"save to .html, got {str(path)!r}"
            )
        title = _html.escape(f"{self.source}  \u2192  {self.translation}")
        page = (
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>'
            f'<body><h1 style="font: 600 16px sans-serif">{title}</h1>\n'
            f"{self._fragments()}\n</body></html>\n"
        )
        p.write_text(page, encoding="utf-8")
        return p

    def __repr__(self) -> str:
        return (
            f"ParagraphAttention({self.source!r} -> {self.translation!r}, "
            f"{len(self)} sentence{'s' if len(self) != 1 else ''})"
        )


# ---------------------------------------------------------------------------- the translator
def _token_strings(tok: Tokenizer, ids: Sequence[int]) -> list[str]:
    try:
        strings = tok.tokens()
    except NotImplementedError:  # a user's own Tokenizer that lists no tokens
        return [str(int(i)) for i in ids]
    return [strings[int(i)] for i in ids]


class Translator(ModelEngine, CardDisplay):
    """A trained model with its tokenizers, ready to translate: the qkv engine of
    :class:`~qkv.inference.TextTranslator` (:class:`~qkv.inference.decode.ModelEngine`, whose
    position-limit policy it follows), moved to its device in evaluation mode.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder` with its ``config``.
        src_tokenizer, tgt_tokenizer: the tokenizers it was trained with (their normaliser is
            applied to the inputs).
        device: where the model runs.
        path: the checkpoint folder it came from (informational).
        decoding: the default :class:`~qkv.inference.Decoding` (or its dict) of
            :meth:`translate`, :meth:`evaluate` and :meth:`attention`; a trained run's
            ``final`` model carries the one chosen on its validation split. None: greedy,
            nothing blocked. Read it as :attr:`decoding`; :meth:`with_decoding` gives a
            translator with another.
    """

    engine = "qkv"

    def __init__(
        self,
        model: EncoderDecoder,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        *,
        device: torch.device | str = "cpu",
        path: Path | None = None,
        decoding: Decoding | Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, EncoderDecoder):
            raise TypeError(f"model: expected an EncoderDecoder, got {type(model).__name__}")
        for name, tok in (("src_tokenizer", src_tokenizer), ("tgt_tokenizer", tgt_tokenizer)):
            if not isinstance(tok, Tokenizer):
                raise TypeError(f"{name}: expected a qkv.data Tokenizer, got {type(tok).__name__}")
        dev = torch.device(device)
        super().__init__(
            model.to(dev).eval(),
            src_tokenizer,
            tgt_tokenizer,
            device=dev,
            decoding=Decoding.coerce(decoding),
        )
        self.path = path

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
        tr = cls(
            model,
            saved.src_tokenizer,
            saved.tgt_tokenizer,
            device=saved.device,
            path=saved.path,
            decoding=saved.decoding,
        )
        tr._languages = saved.languages  # None: read from the card when asked
        return tr

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
        step = 0
        if self.path is not None:
            step = int(verify_checkpoint(self.path, files=[]).get("step") or 0)
        return save_model(
            self.model,
            self.src_tokenizer,
            self.tgt_tokenizer,
            out,
            decoding=self.decoding if self.decoding != Decoding() else None,
            card=card,
            force=force,
            step=step,
            source=self.path,
            languages=self.languages,
        )

    @property
    def kind(self) -> str:
        """``"transformer"`` or ``"bahdanau"``."""
        return self.model.config.kind if self.model.config is not None else "transformer"

    @property
    def has_attention(self) -> bool:
        return True

    def attention_shapes(self, src_len: int, tgt_len: int) -> list[tuple[int, int, int]] | None:
        """The ``(H, Lq, Lk)`` of every weight matrix :meth:`attention` gives a Transformer for
        ``src_len`` source tokens and ``tgt_len`` decoder positions (0: the encoder's alone;
        a translation the learned table cuts is shown up to the table); None for the Bahdanau
        model (one small ``(Lt, Ls)`` picture)."""
        c = self.model.config
        if c is None or self.kind != "transformer":
            return None
        S, T, H = src_len, tgt_len, c.num_heads
        tgt_limit = position_limits(self.model)[1]
        if tgt_limit is not None:
            T = min(T, tgt_limit)
        shapes = [(H, S, S)] * c.num_enc_layers
        if T:
            shapes += [(H, T, T), (H, T, S)] * c.num_dec_layers
        return shapes

    def attention(
        self,
        text: str,
        decoding: Decoding | None = None,
        *,
        ids: Sequence[int] | None = None,
        split: str = DEFAULT_SPLIT,
        **overrides: Any,
    ) -> SentenceAttention | ParagraphAttention:
        """Translate ``text`` and return every attention weight the model used for it.

        The translation is decoded first, exactly as ``translate(text, decoding,
        **overrides)`` decodes it, unless ``ids`` gives the translation's target ids already
        (e.g. from :meth:`generate` over many texts; ``text`` is then one sentence). Then one
        teacher-forced pass over ``<bos>`` + its tokens materialises the weights, which are
        exactly those of the incremental decoding.

        Returns:
            A :class:`SentenceAttention` for one sentence; for a paragraph of several
            (``split="sentences"``, as :meth:`translate` cuts it), a
            :class:`ParagraphAttention`: each sentence's, in order.
        """
        if ids is None:
            plan = self.plan([text], split=split)
            slots = plan.slots(0)
            if len(slots) > 1:
                found = self.generate(list(plan.segments), decoding, **{**overrides, "n_best": 1})
                parts = [self._attention(plan.segments[s.segment], found[s.segment]) for s in slots]
                joined = plan.join([self.detokenize(i) for i in found])[0]
                return ParagraphAttention(text, joined, parts)
            ids = self.translate_ids(text, decoding, **overrides)
        return self._attention(text, ids)

    def _attention(self, text: str, ids: Sequence[int]) -> SentenceAttention:
        """The weights of ``text`` translated into ``ids`` (see :meth:`attention`)."""
        src_ids = self.encode(text)
        src_limit, tgt_limit = position_limits(self.model)

        def check(what: str, n: int, limit: int | None) -> None:
            if limit is not None and n > limit:
                raise ValueError(
                    f"text: its {what} has {n} tokens (<eos> counted), more than the model's "
                    f"{limit} learned positions ({POSITION_SETTING}): it cannot be shown"
                )

        check("source", len(src_ids), src_limit)
        ids = [int(i) for i in ids]
        check("translation", len(ids), tgt_limit)
        src = torch.tensor([src_ids], dtype=torch.long, device=self._device)
        bos, eos = self.tgt_tokenizer.bos_id, self.tgt_tokenizer.eos_id
        # a translation cut at the learned table ends without <eos>: its rows are those that
        # produced its tokens (the row after them, which would need one more position, is not)
        cut = tgt_limit is not None and len(ids) == tgt_limit
        produced = ids if cut else [*ids, eos]
        read = [bos, *ids[:-1]] if cut else [bos, *ids]
        dec_in = torch.tensor([read], dtype=torch.long, device=self._device)
        S, T = src.shape[1], dec_in.shape[1]
        training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), record_queries_keys(self.model) as seen:
                _, maps = self.model(
                    src, dec_in, torch.tensor([S], device=self._device), return_attention=True
                )
        finally:
            self.model.train(training)
        one = maps.sentence(0, src_len=S, tgt_len=T)
        vectors = {}
        if self.kind != "bahdanau":
            enc, dec = list(self.model.encoder.blks), list(self.model.decoder.blks)
            attends = {
                "encoder": [b.attention for b in enc],
                "decoder": [b.attention1 for b in dec],
                "cross": [b.attention2 for b in dec],
            }
            for what, modules in attends.items():
                got = seen.layers(modules)
                if got is not None:
                    vectors[what] = got
        return SentenceAttention(
            source=text,
            translation=self.tgt_tokenizer.decode(ids),
            kind=self.kind,
            src_tokens=_token_strings(self.src_tokenizer, src[0].tolist()),
            tgt_tokens=_token_strings(self.tgt_tokenizer, produced),
            tgt_input_tokens=_token_strings(self.tgt_tokenizer, read),
            cross=one["cross"],
            encoder_self=one.get("encoder_self"),
            decoder_self=one.get("decoder_self"),
            vectors=vectors,
        )

    def __repr__(self) -> str:
        return f"Translator(kind={self.kind!r}, path={str(self.path)!r}, device={self.device})"

    def _model_summary(self) -> str:
        c = self.model.config
        size = sum(p.numel() for p in self.model.parameters())
        model = f"{self.kind}, {size / 1e6:.2f} M parameters"
        if c is not None and c.kind == "transformer":
            model += (
                f", {c.num_enc_layers}+{c.num_dec_layers} layers, width {c.num_hiddens}, "
                f"{c.num_heads} heads"
            )
        return model
