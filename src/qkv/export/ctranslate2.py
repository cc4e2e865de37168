"""A qkv Transformer as a CTranslate2 model, and text translated through it as qkv translates.

:func:`export_ctranslate2` fills CTranslate2's own ``TransformerSpec`` with a qkv model's weights
and writes ``OUT/ctranslate2/`` (``model.bin``, ``config.json``, the vocabularies, qkv's
tokenizers and ``qkv.json``: the decoding options) inside an inference-only qkv model folder
``OUT`` (see :func:`qkv.inference.save_model`), so ``OUT`` serves both engines.
:class:`Ct2Translator` reads that folder and translates text with the same tokenization and the
options that make CTranslate2's greedy search equal qkv's (``beam_size``, per-sentence length
limit, ``<pad>``/``<bos>`` suppressed, ``<unk>`` never emitted under byte fallback, no repeated
n-grams).

The mapping (qkv -> CTranslate2): each self-attention's ``W_q``, ``W_k``, ``W_v`` fused into one
projection, the cross-attention's ``W_k``/``W_v`` fused; ``addnorm`` LayerNorms as the
sublayers' norms (post-norm reads them as ``LN(x + f(x))``, pre-norm as input norms, plus each
stack's final norm); embeddings scaled by ``sqrt(D)``; qkv's *interleaved* sinusoidal table (or
the learned one, or zeros for rotary and none) given explicitly; ``<eos>`` appended to sources.
The Bahdanau (GRU) model has no CTranslate2 spec and is refused.

>>> from qkv.export.ctranslate2 import export_ctranslate2, Ct2Translator
>>> export_ctranslate2("runs/en-fr", "deploy/en-fr")               # needs qkv[ct2]
>>> Ct2Translator("deploy/en-fr").translate(["Go."])                # a TextTranslator
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._deps import require
from .._errors import SettingError
from .._folder import CT2_DIR, CT2_OPTIONS, CT2_WEIGHTS, WEIGHTS
from ..data import Tokenizer, load_tokenizers, save_tokenizers
from ..inference import (
    CheckpointError,
    Decoding,
    SavedModel,
    TranslatorBase,
    load_model,
    never_generated,
    verify_checkpoint,
)
from ..inference.batches import SourceBatch
from ..inference.bounds import LIMITS, check_decoding
from ..inference.limits import PositionBounds
from ..inference.saved import CT2_FOLDER_FORMAT, MANIFEST, VerifiedFolder
from ..inference.writing import write_manifest
from ..nn.position import sinusoidal_encoding
from ..text import Alignment
from ..viz.display import CardDisplay
from . import export_model
from .readme import ct2_readme, ct2_use, write_readme

__all__ = ["CT2_DIR", "QUANTIZATIONS", "Ct2Translator", "export_ctranslate2", "to_spec"]

log = logging.getLogger(__name__)

#: ``quantize`` values (CTranslate2's weight types); None keeps float32
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16")
#: rows of the positional table exported at least (CTranslate2 refuses positions past it)
MIN_POSITIONS = 1024


def _np(t: torch.Tensor) -> Any:
    return t.detach().to(device="cpu", dtype=torch.float32).numpy().copy()


def _linear(spec: Any, *linears: nn.Linear) -> None:
    """One CTranslate2 LinearSpec from one or more ``nn.Linear`` (stacked along the outputs)."""
    import numpy as np

    spec.weight = np.concatenate([_np(m.weight) for m in linears])
    if any(m.bias is not None for m in linears):
        spec.bias = np.concatenate(
            [
                _np(m.bias) if m.bias is not None else np.zeros(m.out_features, np.float32)
                for m in linears
            ]
        )


def _norm(spec: Any, ln: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(ln.weight), _np(ln.bias)


def _inputs(spec: Any, stack: nn.Module, rows: int, kind: str) -> None:
    emb = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    emb.weight = _np(stack.embedding.weight)
    # qkv: embedding * sqrt(D) (scale_embedding, the default), then + positions
    spec.scale_embeddings = bool(getattr(stack, "scale_embedding", True))
    if not hasattr(spec, "position_encodings"):  # a rotary decoder spec has no table
        return
    if kind == "sinusoidal":  # interleaved: sin at 2j, cos at 2j+1 (not CTranslate2's own)
        table = sinusoidal_encoding(torch.arange(rows), stack.num_hiddens)
    elif kind == "learned":
        table = stack.pos_encoding.embedding.weight
    else:  # rotary, none: nothing added (unset, CTranslate2 would add its own sinusoids)
        table = torch.zeros(rows, stack.num_hiddens)
    spec.position_encodings.encodings = _np(table)


def positions_of(config: Any) -> int:
    """The rows of the positional table a model exports: its learned table's, else at least
    :data:`MIN_POSITIONS` (qkv's sinusoids extrapolate, CTranslate2's table does not)."""
    return (
        config.max_len if config.pos_encoding == "learned" else max(config.max_len, MIN_POSITIONS)
    )


def to_spec(model: nn.Module) -> Any:
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights (vocabularies not
    registered yet).

    Raises:
        ValueError: a model that is not a qkv Transformer (the Bahdanau model).
    """
    from ctranslate2.specs import common_spec, transformer_spec

    c = getattr(model, "config", None)
    if c is None or c.kind != "transformer":
        kind = None if c is None else c.kind
        raise ValueError(
            f"model: CTranslate2 takes a Transformer; this is a {kind!r} model (the Bahdanau "
            "GRU model has no CTranslate2 spec): translate it with qkv itself"
        )
    act = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "swish": common_spec.Activation.SWISH,
    }
    kw: dict[str, Any] = {"pre_norm": c.norm_first, "activation": act[c.activation]}
    if c.pos_encoding == "rotary":  # qkv rotates halves ("rotate half"), self-attention only
        rotary = model.decoder.blks[0].attention1.rotary
        kw.update(rotary_dim=0, rotary_interleave=False, rotary_base=float(rotary.base))
    enc, dec = model.encoder, model.decoder
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(c.num_enc_layers, c.num_heads, **kw),
        transformer_spec.TransformerDecoderSpec(c.num_dec_layers, c.num_heads, **kw),
    )
    rows = positions_of(c)
    _inputs(spec.encoder, enc, rows, c.pos_encoding)
    _inputs(spec.decoder, dec, rows, c.pos_encoding)
    for ls, blk in zip(spec.encoder.layer, enc.blks):
        a = blk.attention
        _linear(ls.self_attention.linear[0], a.W_q, a.W_k, a.W_v)
        _linear(ls.self_attention.linear[1], a.W_o)
        _norm(ls.self_attention.layer_norm, blk.addnorm1.ln)
        _norm(ls.ffn.layer_norm, blk.addnorm2.ln)
        _linear(ls.ffn.linear_0, blk.ffn.dense1)
        _linear(ls.ffn.linear_1, blk.ffn.dense2)
    for ls, blk in zip(spec.decoder.layer, dec.blks):
        a, x = blk.attention1, blk.attention2
        _linear(ls.self_attention.linear[0], a.W_q, a.W_k, a.W_v)
        _linear(ls.self_attention.linear[1], a.W_o)
        _norm(ls.self_attention.layer_norm, blk.addnorm1.ln)
        _linear(ls.attention.linear[0], x.W_q)
        _linear(ls.attention.linear[1], x.W_k, x.W_v)
        _linear(ls.attention.linear[2], x.W_o)
        _norm(ls.attention.layer_norm, blk.addnorm2.ln)
        _norm(ls.ffn.layer_norm, blk.addnorm3.ln)
        _linear(ls.ffn.linear_0, blk.ffn.dense1)
        _linear(ls.ffn.linear_1, blk.ffn.dense2)
    if c.norm_first:
        _norm(spec.encoder.layer_norm, enc.norm)
        _norm(spec.decoder.layer_norm, dec.norm)
    _linear(spec.decoder.projection, dec.dense)
    cfg = spec.config
    cfg.unk_token, cfg.bos_token, cfg.eos_token = "<unk>", "<bos>", "<eos>"
    cfg.decoder_start_token = "<bos>"
    cfg.add_source_eos = True  # qkv appends <eos> to every source
    cfg.layer_norm_epsilon = float(enc.blks[0].addnorm1.ln.eps)
    return spec


def _special_tokens(spec: Any, src: Tokenizer, tgt: Tokenizer) -> None:
    """The special tokens' strings CTranslate2 reads, from the tokenizers' own ids (qkv's
    ``<unk>``, ``<bos>``, ``<eos>``; an imported Marian model's ``<unk>``, ``</s>``, and
    ``<pad>`` as the decoder's start, with its own embedding row)."""
    tokens = tgt.tokens()
    cfg = spec.config
    cfg.unk_token, cfg.eos_token = tokens[tgt.unk_id], tokens[tgt.eos_id]
    cfg.bos_token = cfg.decoder_start_token = tokens[tgt.bos_id]
    if src.tokens()[src.eos_id] != cfg.eos_token:
        raise ValueError(
            f"tokenizers: the source's end token {src.tokens()[src.eos_id]!r} is not the "
            f"target's {cfg.eos_token!r}, which CTranslate2 appends to every source"
        )


def ct2_decoding(decoding: Decoding) -> Decoding:
    """``decoding`` as the CTranslate2 model's default: its beam search ends a sentence at
    ``beam_size`` finished translations (``early_stopping=True``, qkv's rule), so a model
    whose decoding said otherwise (an imported one: ``transformers``' rule) gets that, said
    once in the log; its beam translations may then differ from ``transformers``' on a few
    sentences (greedy ones do not)."""
    if decoding.early_stopping is True:
        return decoding
    log.warning(
        "CTranslate2 ends a beam search at %d finished translations (early_stopping=True); "
        "the model's early_stopping=%r is not kept in its CTranslate2 export",
        decoding.beam_size,
        decoding.early_stopping,
    )
    return decoding.replace(early_stopping=True)


def _write_ct2(saved: SavedModel, folder: Path, quantize: str | None) -> None:
    spec = to_spec(saved.model)
    _special_tokens(spec, saved.src_tokenizer, saved.tgt_tokenizer)
    spec.register_source_vocabulary(saved.src_tokenizer.tokens())
    spec.register_target_vocabulary(saved.tgt_tokenizer.tokens())
    spec.validate()
    spec.optimize(quantization=quantize)  # aliases tied weights; quantizes
    folder.mkdir(parents=True)
    spec.save(str(folder))
    save_tokenizers(folder / "tokenizers", saved.src_tokenizer, saved.tgt_tokenizer)
    options = {
        "format": "qkv.ctranslate2",
        "version": 1,
        "quantize": quantize,
        "positions": positions_of(saved.model.config),
        "decoding": ct2_decoding(Decoding.coerce(saved.decoding)).to_dict(),
        "disable_unk": bool(never_generated(saved.tgt_tokenizer)),
    }
    if saved.languages is not None:  # the languages travel with the CTranslate2 model too
        options["languages"] = list(saved.languages)
    (folder / CT2_OPTIONS).write_text(json.dumps(options, indent=1) + "\n", encoding="utf-8")
    readme = ct2_readme(
        saved.src_tokenizer,
        saved.tgt_tokenizer,
        Decoding.from_dict(options["decoding"]),
        positions=options["positions"],
        disable_unk=options["disable_unk"],
        quantize=quantize,
        languages=saved.languages,
    )
    write_readme(folder, readme)  # the plain CTranslate2 use, listed in its manifest
    # its own manifest: the folder checks itself when copied out alone (the manifest of the
    # qkv model folder around it lists it too)
    step = int(verify_checkpoint(saved.path, files=[]).get("step") or 0) if saved.path else 0
    write_manifest(folder, CT2_FOLDER_FORMAT, step)


def export_ctranslate2(
    model: SavedModel | str | Path,
    out: str | Path,
    *,
    quantize: str | None = None,
    force: bool = False,
    keep_float_weights: bool | None = None,
) -> Path:
    """Export a qkv Transformer to CTranslate2: an inference-only model folder ``out`` (see
    :func:`qkv.inference.save_model`) holding ``out/ctranslate2/``, written atomically.

    A float32 export keeps qkv's weights beside CTranslate2's (``model.safetensors``: the folder
    runs on both engines). A quantized one holds only what CTranslate2 needs: its
    ``model.bin``, the tokenizers, the card; qkv's float32 weights (three times an int8
    ``model.bin``) are left out unless ``keep_float_weights``, and the folder then runs on the
    ``ctranslate2`` engine alone (:func:`qkv.engines.folder_engine` says so; qkv's engine and
    ``qkv translate --attention`` need the float weights).

    Args:
        model: a :class:`~qkv.inference.SavedModel`, or a folder :func:`~qkv.inference.
            load_model` reads (a run, a checkpoint, an exported model).
        out: the folder to write (new or empty).
        quantize: the weight type of ``model.bin``: one of :data:`QUANTIZATIONS`; None:
            float32. CTranslate2 may also quantize a float32 model when it loads it.
        force: replace a model folder exported before.
        keep_float_weights: keep qkv's float32 ``model.safetensors`` too; None: only when
            ``quantize`` is None.

    Returns:
        The CTranslate2 model folder ``out/ctranslate2``.

    Raises:
        MissingDependency: ctranslate2 is not installed (``pip install 'qkv[ct2]'``).
        ValueError: a Bahdanau model, an unknown ``quantize``, or an ``out`` that would lose
            something (see :func:`~qkv.inference.save_model`).
    """
    require("exporting to CTranslate2", ["ctranslate2"])
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize: expected one of {QUANTIZATIONS} or None, got {quantize!r}")
    saved = model if isinstance(model, SavedModel) else load_model(model)
    to_spec(saved.model)  # refuse a Bahdanau model before writing anything
    keep = quantize is None if keep_float_weights is None else bool(keep_float_weights)

    def extra(sm: SavedModel, folder: Path) -> None:
        _write_ct2(sm, folder / CT2_DIR, quantize)
        if not keep:  # CTranslate2 reads model.bin: qkv's float32 weights are not shipped
            (folder / WEIGHTS).unlink()

    export_model(saved, out, force=force, extra=extra, use=ct2_use(keep))
    return Path(out) / CT2_DIR


def find_ct2(path: str | Path) -> Path:
    """The CTranslate2 model folder of ``path``: ``path/ctranslate2`` or ``path`` itself.

    Raises:
        FileNotFoundError: neither holds a model that :func:`export_ctranslate2` wrote.
    """
    p = Path(path)
    for d in (p / CT2_DIR, p):
        if (d / CT2_OPTIONS).is_file() and (d / CT2_WEIGHTS).is_file():
            return d
    raise FileNotFoundError(
        f"model dir: {str(p)!r} holds no CTranslate2 model (expected {CT2_DIR}/model.bin "
        "written by qkv export --format ctranslate2); export it first"
    )


def verify_ct2(folder: Path) -> tuple[VerifiedFolder, str]:
    """Every file of the CTranslate2 model folder ``folder`` verified before one is read: by
    the manifest of the qkv model folder around it (``OUT/ctranslate2``), else by its own
    (a copy of ``ctranslate2/`` alone); none unlisted, missing, altered, or reached through a
    link. Returns the verified folder and the prefix of the model's files in it.

    Raises:
        CheckpointError: one line naming the file (or the folder without a manifest).
    """
    outer = folder.parent
    if folder.name == CT2_DIR and (outer / MANIFEST).is_file():
        v = VerifiedFolder(outer)
        if not any(rel.startswith(f"{CT2_DIR}/") for rel in v.files):
            raise CheckpointError(
                f"checkpoint: {CT2_DIR}/ in {str(outer)!r} is not listed in its {MANIFEST}, so "
                "it cannot be verified; qkv reads no file unchecked (export it again with qkv "
                "export --format ctranslate2)"
            )
        v.tree(CT2_DIR)
        return v, f"{CT2_DIR}/"
    if not (folder / MANIFEST).is_file():
        raise CheckpointError(
            f"model dir: {str(folder)!r} has no {MANIFEST}: a CTranslate2 model qkv exports has "
            "one (the size and SHA-256 of every file, checked before loading); export it again "
            "with qkv export --format ctranslate2"
        )
    v = VerifiedFolder(folder, formats=(CT2_FOLDER_FORMAT,))
    v.whole()
    return v, ""


def _read_options(v: VerifiedFolder, rel: str) -> tuple[dict, Decoding, int]:
    """``qkv.json`` (verified): the options, the model's decoding and its positions, each in
    bounds (a one-line error naming the file otherwise)."""
    options = v.json(rel)
    if not isinstance(options, dict):
        raise v.invalid(rel, ValueError("expected a JSON object"))
    try:
        decoding = check_decoding(Decoding.from_dict(options.get("decoding")))
    except (ValueError, TypeError) as e:
        raise v.invalid(rel, e) from None
    positions = options.get("positions")
    top = LIMITS["max_len"]
    if isinstance(positions, bool) or not isinstance(positions, int) or not 2 <= positions <= top:
        raise v.invalid(
            rel, ValueError(f"positions: expected an int in [2, {top:,}], got {positions!r}")
        )
    return options, decoding, positions


class Ct2Translator(TranslatorBase, CardDisplay):
    """Translate text through a CTranslate2 model exported by :func:`export_ctranslate2`, with
    qkv's tokenizers and the options that make its search equal qkv's: the ``ctranslate2``
    engine of :class:`~qkv.inference.TextTranslator` (``qkv translate --engine ctranslate2``).

    Args:
        path: the exported folder (or its ``ctranslate2/`` subfolder).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).
        compute_type: CTranslate2's compute type (``"default"``: the saved weights' type;
            ``"int8"`` quantizes a float32 model on load).
        threads: CPU threads for one translation (0: CTranslate2's default).

    Its default decoding is the exported model's. It gives one translation per text
    (``n_best=1``) and batches :attr:`batch_sentences` sentences, sorted by length (a beam's
    batch: sentences of one decode length, which CTranslate2 sets per batch).

    Raises:
        MissingDependency: ctranslate2 is not installed (the ``ct2`` extra).
        FileNotFoundError: ``path`` holds no exported CTranslate2 model.
        CheckpointError: one line naming the file (see :func:`verify_ct2`): no manifest, a
            file missing, altered, unlisted or reached through a link; ``qkv.json`` out of
            bounds, vocabularies that are not the tokenizers', a ``model.bin`` CTranslate2
            cannot load.
        ValueError: a device CTranslate2 does not run on (a
            :class:`~qkv._errors.SettingError` keyed ``device``).
    """

    engine = "ctranslate2"
    #: sentences per ``translate_batch`` call
    batch_sentences = 32
    #: CTranslate2 stops a batch's beams at one ``max_decoding_length``
    one_limit_per_batch = True

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "cpu",
        compute_type: str = "default",
        threads: int = 0,
    ) -> None:
        require("translating with CTranslate2", ["ctranslate2"])
        import ctranslate2

        if device not in ("cpu", "cuda", "auto"):
            raise SettingError("device", f"CTranslate2 runs on cpu or cuda, got {device!r}")
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        self.path = find_ct2(path)
        v, prefix = verify_ct2(self.path)
        self.options, self._decoding, self.positions = _read_options(v, prefix + CT2_OPTIONS)
        langs = self.options.get("languages")
        if isinstance(langs, list) and len(langs) == 2:
            self._languages = (str(langs[0]), str(langs[1]))
        try:
            src, tgt = load_tokenizers(v.tree(prefix + "tokenizers"))
        except (OSError, ValueError, KeyError) as e:
            raise v.invalid(prefix + "tokenizers", e) from None
        self.src_tokenizer: Tokenizer = src
        self.tgt_tokenizer: Tokenizer = tgt
        for side, tok in (("source", src), ("target", tgt)):  # CTranslate2's, qkv's: one list
            rel = f"{prefix}{side}_vocabulary.json"
            if rel in v.files and v.json(rel) != tok.tokens():
                raise v.invalid(rel, ValueError(f"not the {side} tokenizer's vocabulary"))
        self._src_tokens = src.tokens()  # what CTranslate2 reads for each source id
        self._tgt_ids = {t: i for i, t in enumerate(tgt.tokens())}
        self._device = device
        try:
            self.translator = ctranslate2.Translator(
                str(self.path),
                device=device,
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=threads,
            )
        except ValueError as e:  # a compute type or device CTranslate2 refuses
            raise SettingError("compute_type", str(e).splitlines()[0]) from None
        except RuntimeError as e:  # a model.bin (or vocabulary) it cannot read
            raise v.invalid(prefix + CT2_WEIGHTS, e) from None

    @property
    def device(self) -> str:
        return self._device

    def _card_folder(self) -> Path | None:
        # the qkv model folder around ctranslate2/ holds the card
        return self.path.parent if self.path.name == CT2_DIR else self.path

    def source_tokens(self, text: str) -> list[str]:
        """``text`` normalised and split as the qkv model reads it (``<eos>`` is added by
        CTranslate2)."""
        return self.src_tokenizer.to_tokens(text)

    def _positions(self) -> PositionBounds:
        """The model's positional table bounds both sides, as a learned table bounds qkv's."""
        named = f"the CTranslate2 model's {self.positions} positions (its positional table)"
        return PositionBounds(source=self.positions, target=self.positions, named=named)

    def _check_decoding(self, decoding: Decoding) -> None:
        if decoding.n_best != 1:
            raise ValueError(
                f"n_best: the ctranslate2 engine gives one translation per text, got "
                f"{decoding.n_best}"
            )
        if decoding.beam_size > 1 and decoding.early_stopping is not True:
            raise SettingError(
                "early_stopping",
                "the ctranslate2 engine ends a beam search at beam_size finished translations "
                f"(True), got {decoding.early_stopping!r}",
            )

    def _suppressed(self, decoding: Decoding) -> list[list[str]]:
        """The tokens never generated, as CTranslate2's ``suppress_sequences``: the target's
        padding and start tokens (qkv never generates them) and ``decoding.suppress``."""
        tok = self.tgt_tokenizer
        tokens = tok.tokens()
        ids = {tok.pad_id, tok.bos_id, *decoding.suppress} - {tok.eos_id}
        return [[tokens[i]] for i in sorted(ids)]

    def _decode_batch(self, batch: SourceBatch, decoding: Decoding) -> list[list[Any]]:
        """One ``translate_batch`` call: the sources as qkv's token strings (CTranslate2 adds
        ``<eos>``), ``decoding``'s options, the batch's longest limit (a greedy row is cut to its
        own, which a shorter limit only cuts); one hypothesis per source, unscored (NaN).
        ``forced_eos`` (``<eos>`` the last token a translation may have) is a limit one token
        shorter: the same tokens in greedy search; a beam that reaches the limit may differ
        (CTranslate2 scores and length-normalises that hypothesis without the forced ``<eos>``)."""
        vocab = self._src_tokens
        cut = 1 if decoding.forced_eos else 0
        res = self.translator.translate_batch(
            [[vocab[i] for i in row[:-1]] for row in batch.rows],
            beam_size=decoding.beam_size,
            length_penalty=decoding.length_penalty,
            max_decoding_length=max(max(batch.limits) - cut, 1),
            min_decoding_length=0,
            max_input_length=0,
            no_repeat_ngram_size=decoding.no_repeat_ngram,
            suppress_sequences=self._suppressed(decoding),
            disable_unk=bool(self.options.get("disable_unk")),
            return_scores=False,
        )
        return [
            [([self._tgt_ids[t] for t in r.hypotheses[0]][: limit - cut], math.nan)]
            for r, limit in zip(res, batch.limits)
        ]

    @property
    def aligns(self) -> bool:
        """CTranslate2 returns the attention of a translation forced as its target prefix."""
        return True

    def align_segments(
        self, segments: Sequence[str], translations: Sequence[str]
    ) -> list[Alignment | None]:
        """Per segment, CTranslate2's attention (``return_attention``: its alignment head,
        the last layer's first) of its translation forced as the target prefix; see
        :meth:`TranslatorBase.align_segments`."""
        src = [self.src_tokenizer.to_tokens(s) for s in segments]
        tgt = [self.tgt_tokenizer.to_tokens(t) for t in translations]
        res = self.translator.translate_batch(
            src,
            target_prefix=tgt,
            beam_size=1,
            max_decoding_length=max((len(t) for t in tgt), default=0) + 1,
            max_input_length=0,
            return_attention=True,
        )
        return [
            Alignment(
                tuple(s), tuple(t), tuple(tuple(row[: len(s)]) for row in r.attention[0][: len(t)])
            )
            for s, t, r in zip(src, tgt, res)
        ]

    def __repr__(self) -> str:
        return f"Ct2Translator({str(self.path)!r}, decoding={self.decoding})"
