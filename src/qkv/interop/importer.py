"""``qkv import``: a Hugging Face translation model made an ordinary qkv model folder.

:func:`import_model` reads a ``MarianMTModel`` folder (OPUS-MT's layout: ``config.json``,
``generation_config.json``, the weights, ``source.spm``/``target.spm`` and ``vocab.json``) or
a Hub name from ``huggingface_hub``'s cache, maps it through the architecture's table
(:mod:`qkv.interop.marian`), and writes a qkv model folder through
:func:`qkv.inference.save_model`: the weights, ``model.json`` with the languages,
the tokenizers (:class:`~qkv.data.VocabSentencePieceTokenizer`: the SentencePiece models with the
model's own vocabulary and special ids), ``decoding.json`` from the generation settings, and a
card naming the source and its license. Every size is checked before anything is allocated
(:func:`qkv.inference.bounds.check_model_config`, then each tensor's header).

The folder then works with every qkv command as it is: ``translate``, ``evaluate``, the
attention viewer, ``serve``, ``export`` and ``train --init-from``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import SettingError
from ..data import VocabSentencePieceTokenizer
from ..data.languages import check_language, language_code
from ..inference import Decoding, save_model
from ..inference.bounds import check_decoding, check_model_config
from ..nn import build_model
from ..nn.seq2seq import Seq2SeqConfig
from . import marian
from .huggingface import SourceFolder, read_source, resolve_source

__all__ = ["Imported", "generation_decoding", "import_model"]

log = logging.getLogger(__name__)

#: why an architecture close to Marian's is not imported (yet): what qkv would need
_NOT_YET = {
    kind: (
        ": an M2M100/NLLB model needs a fixed position table counted from 2 and its target "
        "language forced as the first generated token, which qkv's Transformer and search do "
        "not have"
    )
    for kind in ("m2m_100", "nllb_moe")
}

#: generation settings qkv does not apply, with the value that changes nothing
_IGNORED_DEFAULTS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "min_length": 0,
    "min_new_tokens": None,
    "do_sample": False,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "encoder_no_repeat_ngram_size": 0,
    "forced_bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "encoder_repetition_penalty": 1.0,
}


@dataclass
class Imported:
    """What :func:`import_model` wrote.

    Attributes:
        path: the qkv model folder.
        source: the model's name (a Hub name, or the folder as given).
        config: the model's :class:`~qkv.nn.Seq2SeqConfig`.
        languages: ``(source, target)`` codes recorded, or None when nothing said them.
        targets: a multi-target model's target languages (code -> its ``>>xxx<<`` token);
            empty for a model of one target.
        decoding: the default decoding written (``decoding.json``).
        notes: what the import could not keep as the source had it (generation settings qkv
            does not apply), one line each.
    """

    path: Path
    source: str
    config: Seq2SeqConfig
    languages: tuple[str, str] | None
    targets: dict[str, str]
    decoding: Decoding
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- decoding
def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def generation_decoding(
    gen: Mapping[str, Any], *, eos_id: int, banned: tuple[int, ...] = ()
) -> tuple[Decoding, list[str]]:
    """The :class:`~qkv.inference.Decoding` that decodes as ``transformers``' ``generate``
    with the generation settings ``gen`` (``generation_config.json``), and one note per
    setting qkv does not apply.

    ``num_beams`` is the beam; ``length_penalty``, ``early_stopping`` and
    ``no_repeat_ngram_size`` as they are; ``max_new_tokens``, else ``max_length - 1``
    (``transformers`` counts the decoder's start token; 20 when unset, as ``transformers``),
    the decode length; ``forced_eos_token_id`` = ``eos_id`` forces ``<eos>`` at it;
    ``renormalize_logits`` normalises again; each single-token ``bad_words_ids`` entry is
    suppressed (``banned``: ids qkv never generates anyway: the pad and start tokens).
    """
    notes = []
    beam = gen.get("num_beams") or 1
    max_new = gen.get("max_new_tokens")
    limit = max_new if max_new else (gen.get("max_length") or 20) - 1
    bad = gen.get("bad_words_ids") or []
    suppress = sorted(
        {ids[0] for ids in bad if isinstance(ids, list) and len(ids) == 1} - set(banned)
    )
    longer = [ids for ids in bad if not (isinstance(ids, list) and len(ids) == 1)]
    if longer:
        notes.append(f"bad_words_ids of several tokens are not applied: {longer}")
    for key, default in _IGNORED_DEFAULTS.items():
        value = gen.get(key)
        if value is not None and value != default:
            notes.append(f"{key}={value!r} is not applied (qkv decodes without it)")
    early = gen.get("early_stopping", False)
    try:
        decoding = Decoding(
            beam_size=int(beam),
            length_penalty=gen.get("length_penalty", 1.0),
            no_repeat_ngram=gen.get("no_repeat_ngram_size") or 0,
            max_output_len=max(int(limit), 1),
            early_stopping=early,
            forced_eos=eos_id in _as_ids(gen.get("forced_eos_token_id")),
            renormalize=bool(gen.get("renormalize_logits", False)),
            suppress=tuple(suppress),
        )
    except (SettingError, TypeError, ValueError) as e:
        raise SettingError("source", f"generation_config.json: {e}") from None
    return decoding, notes


# ---------------------------------------------------------------------------- tokenizers
def _token(tcfg: Mapping[str, Any], key: str, default: str) -> str:
    value = tcfg.get(key, default)
    if isinstance(value, dict):  # an AddedToken as transformers saves it
        value = value.get("content", default)
    return value if isinstance(value, str) else default


def _vocab(sf: SourceFolder, name: str) -> dict[str, int]:
    vocab = sf.json(name)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
        raise SettingError("source", f"{name} in {str(sf.path)!r}: expected piece -> id")
    return vocab


def _special(vocab: Mapping[str, int], token: str, name: str, sf: SourceFolder) -> int:
    if token not in vocab:
        raise SettingError("source", f"{name} in {str(sf.path)!r} has no {token!r}")
    return vocab[token]


def marian_tokenizers(
    sf: SourceFolder, c: Seq2SeqConfig
) -> tuple[VocabSentencePieceTokenizer, VocabSentencePieceTokenizer, dict[str, str]]:
    """The source and target tokenizers of a Marian folder, as ``MarianTokenizer`` reads it
    (``source.spm``, ``target.spm``, ``vocab.json``, and ``target_vocab.json`` with
    ``separate_vocabs``), and the target-language tokens of a multi-target model (code ->
    ``>>xxx<<``, :attr:`~qkv.data.VocabSentencePieceTokenizer.targets`).

    The target's start token is the config's ``decoder_start_token_id`` (Marian's ``<pad>``),
    its ``<eos>`` the config's ``eos_token_id``: they must be the vocabulary's.

    Raises:
        SettingError: keyed ``source``: a file missing, vocabularies that do not fit the
            model, or special ids the tokenizer and the config disagree on.
    """
    tcfg = sf.tokenizer
    separate = bool(tcfg.get("separate_vocabs", False))
    vocab = _vocab(sf, "vocab.json")
    tvocab = _vocab(sf, "target_vocab.json") if separate else vocab
    eos, unk, pad = (_token(tcfg, k, d) for k, d in
                     (("eos_token", "</s>"), ("unk_token", "<unk>"), ("pad_token", "<pad>")))  # fmt: skip
    src_model = sf.file("source.spm").read_bytes()
    tgt_model = sf.file("target.spm").read_bytes()
    cfg = sf.config
    t_eos = _special(tvocab, eos, "the target vocabulary", sf)
    t_pad = _special(tvocab, pad, "the target vocabulary", sf)
    start = cfg.get("decoder_start_token_id", t_pad)
    for key, want in (("eos_token_id", t_eos), ("pad_token_id", t_pad)):
        got = cfg.get(key)
        if isinstance(got, int) and got != want:
            raise SettingError(
                "source",
                f"config.json's {key} is {got}, and the tokenizer's {key[:-9]} token is id "
                f"{want}: the model and its tokenizer disagree",
            )
    src = VocabSentencePieceTokenizer(
        src_model,
        vocab,
        pad_id=_special(vocab, pad, "vocab.json", sf),
        bos_id=_special(vocab, pad, "vocab.json", sf),
        eos_id=_special(vocab, eos, "vocab.json", sf),
        unk_id=_special(vocab, unk, "vocab.json", sf),
        language_codes=True,
    )
    tgt = VocabSentencePieceTokenizer(
        tgt_model,
        tvocab,
        pad_id=t_pad,
        bos_id=start,
        eos_id=t_eos,
        unk_id=_special(tvocab, unk, "the target vocabulary", sf),
        decode_model=None if separate else src_model,
        language_codes=True,
    )
    for side, tok, n in (("source", src, c.src_vocab_size), ("target", tgt, c.tgt_vocab_size)):
        if tok.vocab_size != n:
            raise SettingError(
                "source",
                f"the {side} vocabulary has {tok.vocab_size} ids and the model {n}: they do "
                "not belong together",
            )
    return src, tgt, src.targets


# ---------------------------------------------------------------------------- languages
def _code(word: object) -> str | None:
    code = language_code(word) if isinstance(word, str) else None
    try:
        return None if code is None else check_language(code)
    except ValueError:
        return None


def model_languages(
    sf: SourceFolder,
    targets: Mapping[str, str],
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> tuple[str, str] | None:
    """``(source, target)`` of an imported model: the flags first, then the tokenizer
    config's ``source_lang``/``target_lang``, then a multi-target model's first target, then
    the name (``opus-mt-SRC-TGT``); None when nothing says both."""
    src = _code(src_lang) if src_lang else None
    tgt = _code(tgt_lang) if tgt_lang else None
    if src_lang and src is None:
        raise SettingError("src_lang", f"expected a language code, got {src_lang!r}")
    if tgt_lang and tgt is None:
        raise SettingError("tgt_lang", f"expected a language code, got {tgt_lang!r}")
    src = src or _code(sf.tokenizer.get("source_lang"))
    if tgt is None:
        named = _code(sf.tokenizer.get("target_lang"))
        tgt = named if named in targets or not targets else None
        tgt = tgt or next((c for c in targets if _code(c)), None)
    name = Path(sf.name.rstrip("/")).name
    parts = name.split("-")
    if (src is None or tgt is None) and name.startswith("opus-mt-") and len(parts) >= 4:
        src, tgt = src or _code(parts[-2]), tgt or _code(parts[-1])
    return (src, tgt) if src and tgt else None


# ---------------------------------------------------------------------------- the import
def _check_sizes(sf: SourceFolder) -> tuple[Seq2SeqConfig, int]:
    """The model's config as ``config.json`` says it, every size in bounds against the memory
    and the weight files (before anything is read), and the most numbers any of its tensors
    holds."""
    cfg = sf.config
    share = bool(cfg.get("share_encoder_decoder_embeddings", True))
    tie = bool(cfg.get("tie_word_embeddings", True))
    try:
        c = marian.qkv_config(cfg, share_embeddings=share, tie_embeddings=tie and share)
        check_model_config(c, sum(p.stat().st_size for p in sf.weight_files))
    except SettingError as e:
        raise SettingError("source", f"config.json in {str(sf.path)!r}: {e}") from None
    rows = max(c.src_vocab_size, c.tgt_vocab_size, c.max_len, c.ffn_num_hiddens)
    return c, rows * c.num_hiddens


def import_model(
    source: str | Path,
    out: str | Path,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    force: bool = False,
    resolve: Callable[[str | Path], tuple[Path, str]] = resolve_source,
) -> Imported:
    """Import the Hugging Face model ``source`` (a folder, or a Hub name) as the qkv model
    folder ``out``.

    Args:
        source: a ``MarianMTModel`` folder, or a Hub name (``Helsinki-NLP/opus-mt-en-de``) in
            ``huggingface_hub``'s cache (fetched when the Hub can be reached).
        out: the qkv model folder to write (new or empty; ``force`` replaces a model folder).
        src_lang, tgt_lang: the languages to record when the source does not say them (or
            says them otherwise); a multi-target model's ``tgt_lang`` picks its default target.
        force: replace an existing model folder ``out``.
        resolve: how ``source`` becomes a local folder (:func:`resolve_source`).

    Returns:
        What was written (:class:`Imported`).

    Raises:
        SettingError: keyed ``source`` (a folder qkv cannot read: another architecture, a
            setting it cannot express, a file missing or inconsistent), ``src_lang`` or
            ``tgt_lang``.
        HubUnreachable: a Hub name not cached while the Hub cannot be reached.
    """
    sf = read_source(source, resolve)
    kind = sf.config.get("model_type")
    if kind != marian.MODEL_TYPE:
        why = _NOT_YET.get(str(kind), "")
        raise SettingError(
            "source",
            f"config.json in {str(sf.path)!r} is a {kind!r} model; qkv imports Marian "
            f"(MarianMTModel, the OPUS-MT models){why}",
        )
    _, max_numel = _check_sizes(sf)
    weights = sf.weights(max_numel)
    try:
        c, state = marian.to_qkv(sf.config, weights)
    except SettingError as e:
        raise SettingError("source", f"{str(sf.path)!r}: {e}") from None
    model = build_model(c)
    model.load_state_dict(state, strict=True)
    src, tgt, targets = marian_tokenizers(sf, c)
    languages = model_languages(sf, targets, src_lang, tgt_lang)
    if targets and languages is not None and languages[1] in targets:
        src = src.with_target(targets[languages[1]])
    elif targets and tgt_lang:
        raise SettingError(
            "tgt_lang", f"expected one of the model's targets {sorted(targets)}, got {tgt_lang!r}"
        )
    decoding, notes = generation_decoding(
        sf.generation_settings(), eos_id=tgt.eos_id, banned=(tgt.pad_id, tgt.bos_id)
    )
    check_decoding(decoding, c.tgt_vocab_size)
    for note in notes:
        log.warning("qkv import: %s", note)
    card: dict[str, Any] = {
        "title": f"{sf.name} (imported)",
        "source": sf.name,
        "data": "as its source's card says (not recorded by qkv)",
        "notes": [f"Generation setting not kept: {n}" for n in notes],
    }
    if sf.license:
        card["license"] = sf.license
    if targets:
        card["notes"].append(
            "Targets: " + ", ".join(f"{code} ({tok})" for code, tok in targets.items())
        )
    path = save_model(
        model.eval(), src, tgt, out, decoding=decoding, card=card, force=force,
        source=sf.path, languages=languages,
    )  # fmt: skip
    return Imported(Path(path), sf.name, c, languages, targets, decoding, notes)
