"""Marian (``transformers``' ``MarianMTModel``, the OPUS-MT models) and qkv's Transformer: one
table, read both ways.

A MarianMTModel is qkv's post-norm Transformer with biases everywhere, ``1/sqrt(d)`` attention,
LayerNorm eps 1e-5 and one output layer whose bias is ``final_logits_bias``; what differs:

* **positions**: Marian's sinusoids lay the sines of a row in its first ``ceil(D/2)`` features
  and the cosines after them; qkv's (the book's) interleave them (feature ``2k`` the sine,
  ``2k+1`` the cosine, of the same frequencies). The residual stream's features are
  permuted once, at import: qkv feature ``i`` is Marian feature ``p[i]``
  (:func:`residual_permutation`: ``[0, s, 1, s+1, ...]``, ``s = ceil(D/2)``). Every tensor
  that reads the stream has its columns permuted (the query/key/value and first feed-forward
  layers, the embeddings, the output layer), every tensor that writes it or normalises it its
  rows (the attentions' and the second feed-forward layer's outputs and biases, the layer
  norms). Attention heads, feed-forward units and the vocabulary are never permuted; layer
  norm and the residual additions commute with a permutation, so the model computes the same
  logits, with qkv's own position table. Export applies the inverse
  (:func:`~qkv.interop._table.inverse_permutation`).
* **the activation**: ``swish`` (SiLU) in OPUS-MT, or ``gelu``/``relu``: qkv's ``activation``.
* **the embedding scale**: ``scale_embedding`` (``sqrt(D)``, OPUS-MT) or none: qkv's
  ``scale_embedding``.
* **embeddings**: tied and shared as the tensors say (:func:`embedding_layout`).

:data:`PARAMS` names (:func:`parameter_table`) are the one truth of ``qkv import`` and of the
Hugging Face export: :func:`to_qkv` and :func:`to_transformers` read them in either direction;
:func:`qkv_config` and :func:`transformers_config` map the configs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .._errors import SettingError
from ..nn.seq2seq import Seq2SeqConfig
from . import _table
from ._table import COLUMNS, ROWS, Param

__all__ = [
    "ACTIVATIONS",
    "EMBEDDINGS",
    "MODEL_TYPE",
    "POSITIONS",
    "embedding_layout",
    "parameter_table",
    "qkv_config",
    "residual_permutation",
    "sinusoid_table",
    "to_qkv",
    "to_transformers",
    "transformers_config",
]

#: ``config.json``'s ``model_type`` of a Marian model
MODEL_TYPE = "marian"
#: ``activation_function`` -> qkv's ``activation`` (``silu`` is swish's other name)
ACTIVATIONS: dict[str, str] = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}
#: the embeddings' names in a Marian state dict (which of them a file holds depends on how the
#: model ties them and on the version of ``transformers`` that wrote it)
EMBEDDINGS = {
    "shared": "model.shared.weight",
    "encoder": "model.encoder.embed_tokens.weight",
    "decoder": "model.decoder.embed_tokens.weight",
    "output": "lm_head.weight",
    "bias": "final_logits_bias",
}
#: the position tables a checkpoint may carry (never read: qkv computes the same table; checked)
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def residual_permutation(D: int) -> Tensor:
    """``p`` ``(D,)``: qkv feature ``i`` is Marian feature ``p[i]``.

    qkv's column ``2k`` is the sine of frequency ``k`` (Marian's column ``k``), ``2k+1`` its
    cosine (Marian's column ``s + k``, ``s = ceil(D/2)``); an odd ``D`` ends with a sine."""
    if isinstance(D, bool) or not isinstance(D, int) or D < 1:
        raise ValueError(f"D: expected a positive int, got {D!r}")
    s = (D + 1) // 2
    order: list[int] = []
    for k in range(s):
        order.append(k)
        if s + k < D:
            order.append(s + k)
    return torch.tensor(order, dtype=torch.long)


def sinusoid_table(n: int, D: int) -> Tensor:
    """Marian's position table ``(n, D)`` (float32), from its definition: the angle of
    position ``t`` and feature ``j`` is ``t / 10000^(2 * (j // 2) / D)``; the sines of the
    even ``j`` fill the first ``ceil(D/2)`` features, the cosines of the odd ``j`` the rest."""
    t = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(D, dtype=torch.float64)
    angle = t / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / D)
    s = (D + 1) // 2
    out = torch.empty(n, D, dtype=torch.float64)
    out[:, :s] = torch.sin(angle[:, 0::2])
    out[:, s:] = torch.cos(angle[:, 1::2])
    return out.float()


def _linear(hf: str, qkv: str, reads: bool) -> list[Param]:
    """A linear layer's weight and bias: one that reads the residual stream permutes its
    weight's columns (its bias is per output unit, untouched); one that writes it permutes the
    rows of its weight and its bias."""
    if reads:
        return [Param(f"{hf}.weight", f"{qkv}.weight", COLUMNS), Param(f"{hf}.bias", f"{qkv}.bias")]
    return [Param(f"{hf}.weight", f"{qkv}.weight", ROWS), Param(f"{hf}.bias", f"{qkv}.bias", ROWS)]


def _norm(hf: str, qkv: str, kind: str = ROWS) -> list[Param]:
    return [Param(f"{hf}.weight", f"{qkv}.weight", kind), Param(f"{hf}.bias", f"{qkv}.bias", kind)]


def _attention(hf: str, qkv: str) -> list[Param]:
    params = []
    for a in ("q", "k", "v"):
        params += _linear(f"{hf}.{a}_proj", f"{qkv}.W_{a}", reads=True)
    return params + _linear(f"{hf}.out_proj", f"{qkv}.W_o", reads=False)


def parameter_table(encoder_layers: int, decoder_layers: int) -> list[Param]:
    """Every parameter of the blocks of a Marian model of ``encoder_layers`` and
    ``decoder_layers`` layers, with its qkv name and its permutation (the embeddings, the
    output layer and its bias are :func:`embedding_layout`'s)."""
    params: list[Param] = []
    for i in range(encoder_layers):
        h, q = f"model.encoder.layers.{i}", f"encoder.blks.block{i}"
        params += _attention(f"{h}.self_attn", f"{q}.attention")
        params += _norm(f"{h}.self_attn_layer_norm", f"{q}.addnorm1.ln")
        params += _linear(f"{h}.fc1", f"{q}.ffn.dense1", reads=True)
        params += _linear(f"{h}.fc2", f"{q}.ffn.dense2", reads=False)
        params += _norm(f"{h}.final_layer_norm", f"{q}.addnorm2.ln")
    for i in range(decoder_layers):
        h, q = f"model.decoder.layers.{i}", f"decoder.blks.block{i}"
        params += _attention(f"{h}.self_attn", f"{q}.attention1")
        params += _norm(f"{h}.self_attn_layer_norm", f"{q}.addnorm1.ln")
        params += _attention(f"{h}.encoder_attn", f"{q}.attention2")
        params += _norm(f"{h}.encoder_attn_layer_norm", f"{q}.addnorm2.ln")
        params += _linear(f"{h}.fc1", f"{q}.ffn.dense1", reads=True)
        params += _linear(f"{h}.fc2", f"{q}.ffn.dense2", reads=False)
        params += _norm(f"{h}.final_layer_norm", f"{q}.addnorm3.ln")
    return params


# ---------------------------------------------------------------------------- configs
def _get(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = config.get(key, default)
    return default if value is None else value


def _int_of(config: Mapping[str, Any], key: str, default: Any = None) -> int:
    value = _get(config, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingError(key, f"expected a positive int in config.json, got {value!r}")
    return value


def _one_of_each(config: Mapping[str, Any], enc: str, dec: str, default: int) -> int:
    a, b = _int_of(config, enc, default), _int_of(config, dec, default)
    if a != b:
        raise SettingError(
            dec,
            f"expected the same value as {enc} ({a}): qkv's Transformer has one for both "
            f"stacks, got {b}",
        )
    return a


def qkv_config(
    config: Mapping[str, Any], *, share_embeddings: bool, tie_embeddings: bool
) -> Seq2SeqConfig:
    """The :class:`~qkv.nn.Seq2SeqConfig` of the Marian model ``config`` (``config.json``'s
    content) describes; whether its embeddings are shared and tied is the tensors' to say
    (:func:`embedding_layout`).

    ``max_len`` is ``max_position_embeddings`` (qkv's sinusoids go on past it where
    ``transformers``' table stops), ``dropout`` is ``dropout`` (qkv has one rate; Marian's
    ``attention_dropout`` and ``activation_dropout`` matter only to training).

    Raises:
        SettingError: keyed by the ``config.json`` field qkv cannot express: another
            ``model_type``, an activation qkv lacks, different heads or feed-forward widths
            in the encoder and the decoder.
    """
    kind = config.get("model_type")
    if kind != MODEL_TYPE:
        raise SettingError("model_type", f"expected {MODEL_TYPE!r}, got {kind!r}")
    act = _get(config, "activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise SettingError(
            "activation_function", f"expected one of {sorted(ACTIVATIONS)}, got {act!r}"
        )
    heads = _one_of_each(config, "encoder_attention_heads", "decoder_attention_heads", 16)
    ffn = _one_of_each(config, "encoder_ffn_dim", "decoder_ffn_dim", 4096)
    V = _int_of(config, "vocab_size", 58101)
    Vt = V if _get(config, "share_encoder_decoder_embeddings", True) else None
    Vt = Vt or _int_of(config, "decoder_vocab_size", V)
    dropout = _get(config, "dropout", 0.1)
    scale = _get(config, "scale_embedding", False)
    if not isinstance(scale, bool):
        raise SettingError("scale_embedding", f"expected true or false, got {scale!r}")
    try:
        return Seq2SeqConfig(
            src_vocab_size=V,
            tgt_vocab_size=Vt,
            num_hiddens=_int_of(config, "d_model", 1024),
            ffn_num_hiddens=ffn,
            num_heads=heads,
            num_enc_layers=_int_of(config, "encoder_layers", 12),
            num_dec_layers=_int_of(config, "decoder_layers", 12),
            dropout=dropout,
            use_bias=True,
            pos_encoding="sinusoidal",
            norm_first=False,
            activation=ACTIVATIONS[act],
            max_len=_int_of(config, "max_position_embeddings", 1024),
            tie_embeddings=tie_embeddings,
            share_embeddings=share_embeddings,
            scale_embedding=scale,
        )
    except ValueError as e:  # the config's own checks, e.g. d_model not a multiple of heads
        raise SettingError(str(e).partition(":")[0], str(e).partition(": ")[2]) from None


def _why_not_marian(c: Seq2SeqConfig) -> str | None:
    if c.kind != "transformer":
        return f"a {c.kind!r} model, not a Transformer"
    if c.norm_first:
        return "pre-norm blocks (Marian's are post-norm)"
    if c.pos_encoding != "sinusoidal":
        return f"{c.pos_encoding!r} positions (Marian's are sinusoidal)"
    return None


def transformers_config(
    c: Seq2SeqConfig,
    *,
    pad_id: int,
    eos_id: int,
    decoder_start_id: int | None = None,
    max_length: int | None = None,
) -> dict[str, Any]:
    """The ``MarianConfig`` fields (``config.json``'s) of the model ``c`` describes, with
    the target vocabulary's ``pad_id`` and ``eos_id`` (``decoder_start_id``: the id the
    decoder starts from, ``pad_id`` by default as in every Marian model; ``max_length``: the
    generation length, ``transformers``' default when None).

    Raises:
        ValueError: ``c`` is not a model Marian expresses (pre-norm, other positions, a
            Bahdanau model), naming why.
    """
    why = _why_not_marian(c)
    if why is not None:
        raise ValueError(f"config: not a Marian model: {why}")
    start = pad_id if decoder_start_id is None else decoder_start_id
    out: dict[str, Any] = {
        "model_type": MODEL_TYPE,
        "architectures": ["MarianMTModel"],
        "vocab_size": c.src_vocab_size,
        "decoder_vocab_size": c.tgt_vocab_size,
        "d_model": c.num_hiddens,
        "encoder_layers": c.num_enc_layers,
        "decoder_layers": c.num_dec_layers,
        "encoder_attention_heads": c.num_heads,
        "decoder_attention_heads": c.num_heads,
        "encoder_ffn_dim": c.ffn_num_hiddens,
        "decoder_ffn_dim": c.ffn_num_hiddens,
        "activation_function": c.activation,
        "max_position_embeddings": c.max_len,
        "scale_embedding": c.scale_embedding,
        "share_encoder_decoder_embeddings": c.share_embeddings,
        "tie_word_embeddings": c.tie_embeddings,
        "dropout": c.dropout,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "pad_token_id": pad_id,
        "eos_token_id": eos_id,
        "decoder_start_token_id": start,
        "forced_eos_token_id": eos_id,
        "is_encoder_decoder": True,
    }
    if max_length is not None:
        out["max_length"] = max_length
    return out


# ---------------------------------------------------------------------------- weights
def _first(tensors: Callable[[str], Tensor | None], *names: str) -> Tensor | None:
    for name in names:
        t = tensors(name)
        if t is not None:
            return t
    return None


def embedding_layout(
    config: Mapping[str, Any], tensors: Callable[[str], Tensor | None]
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The source embedding, the target embedding, the output layer's weight (each ``(V, D)``
    as Marian lays them out) and ``final_logits_bias`` ``(1, V)`` (None when absent) of a
    Marian checkpoint, read by ``tensors(name)`` (None for a name it lacks) as
    ``transformers`` 5 reads them.

    With ``share_encoder_decoder_embeddings`` and ``tie_word_embeddings`` (Marian's
    defaults) all three are ``model.shared``; without ``tie_word_embeddings`` each stack has
    its own tensor (``transformers`` 5 trains them apart) and ``lm_head`` its own; an older
    file that holds ``model.shared`` alone gives it to every one. Whether qkv then shares and
    ties them is whether the tensors are equal.

    Raises:
        SettingError: a tensor the model needs is missing (keyed by its name).
    """
    share = bool(_get(config, "share_encoder_decoder_embeddings", True))
    tie = bool(_get(config, "tie_word_embeddings", True))
    shared, enc_name, dec_name = EMBEDDINGS["shared"], EMBEDDINGS["encoder"], EMBEDDINGS["decoder"]
    if share and tie:
        enc = dec = _first(tensors, shared, dec_name, enc_name, EMBEDDINGS["output"])
    else:
        enc = _first(tensors, enc_name, *([shared] if share else []))
        dec = _first(tensors, dec_name, *([shared] if share else []))
    out = dec if tie else tensors(EMBEDDINGS["output"])
    for name, t in (
        (enc_name, enc),
        (dec_name, dec),
        (EMBEDDINGS["output"], out),
    ):
        if t is None:
            raise SettingError(name, "missing from the checkpoint: the model cannot be built")
    return enc, dec, out, tensors(EMBEDDINGS["bias"])


def _same(a: Tensor, b: Tensor) -> bool:
    return a is b or (a.shape == b.shape and bool(torch.equal(a, b)))


def to_qkv(
    config: Mapping[str, Any], tensors: Callable[[str], Tensor | None]
) -> tuple[Seq2SeqConfig, dict[str, Tensor]]:
    """qkv's config and state dict of the Marian model of ``config`` (``config.json``) whose
    tensors ``tensors(name)`` reads (None for a name the checkpoint lacks): the model built
    from the config and given the state dict computes the same logits.

    A position table the checkpoint carries must be Marian's (:func:`sinusoid_table`): a
    model with another table is refused, never imported wrong.

    Raises:
        SettingError: a config qkv cannot express (:func:`qkv_config`), a missing tensor, a
            tensor of the wrong shape, or a position table that is not Marian's (keyed by
            the tensor's name).
    """
    enc, dec, out, bias = embedding_layout(config, tensors)
    share = _same(enc, dec)
    c = qkv_config(config, share_embeddings=share, tie_embeddings=_same(out, dec))
    D = c.num_hiddens
    for name, t, rows in (
        (EMBEDDINGS["encoder"], enc, c.src_vocab_size),
        (EMBEDDINGS["decoder"], dec, c.tgt_vocab_size),
        (EMBEDDINGS["output"], out, c.tgt_vocab_size),
    ):
        _shape(name, t, (rows, D))
    for name in POSITIONS:
        table = tensors(name)
        if table is not None:
            _check_positions(name, table, D)
    p = residual_permutation(D)
    params = parameter_table(c.num_enc_layers, c.num_dec_layers)
    shapes = {param.hf: _qkv_shape(param.qkv, c) for param in params}

    def read(name: str) -> Tensor:
        t = tensors(name)
        if t is None:
            raise SettingError(name, "missing from the checkpoint: the model cannot be built")
        _shape(name, t, shapes[name])
        return t

    sd = _table.to_qkv(params, read, p)
    sd["encoder.embedding.weight"] = _table.permuted(enc, COLUMNS, p)
    sd["decoder.embedding.weight"] = (
        sd["encoder.embedding.weight"] if share else _table.permuted(dec, COLUMNS, p)
    )
    sd["decoder.dense.weight"] = (
        sd["decoder.embedding.weight"] if c.tie_embeddings else _table.permuted(out, COLUMNS, p)
    )
    if bias is None:
        sd["decoder.dense.bias"] = torch.zeros(c.tgt_vocab_size, dtype=dec.dtype)
    else:
        _shape(EMBEDDINGS["bias"], bias.reshape(1, -1), (1, c.tgt_vocab_size))
        sd["decoder.dense.bias"] = bias.reshape(-1).clone()
    return c, sd


def _shape(name: str, t: Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != expected:
        raise SettingError(name, f"expected shape {expected}, got {tuple(t.shape)}")


def _check_positions(name: str, table: Tensor, D: int) -> None:
    if table.dim() != 2 or table.shape[1] != D:
        raise SettingError(name, f"expected a table (positions, {D}), got {tuple(table.shape)}")
    ref = sinusoid_table(table.shape[0], D)
    if not torch.allclose(table.float(), ref, atol=1e-4, rtol=0):
        raise SettingError(
            name,
            "is not Marian's sinusoid table (sines then cosines): a model with other "
            "positions would be imported wrong, so it is refused",
        )


def _qkv_shape(name: str, c: Seq2SeqConfig) -> tuple[int, ...]:
    """The shape of the block parameter ``name`` (qkv's) in the model ``c`` describes."""
    D, F = c.num_hiddens, c.ffn_num_hiddens
    weight = name.endswith(".weight")
    if ".ffn.dense1." in name:
        return (F, D) if weight else (F,)
    if ".ffn.dense2." in name:
        return (D, F) if weight else (D,)
    return (D, D) if weight and ".W_" in name else (D,)


def to_transformers(
    c: Seq2SeqConfig, state_dict: Mapping[str, Tensor], *, positions: bool = False
) -> dict[str, Tensor]:
    """The Marian state dict of the qkv model of config ``c`` and ``state_dict``: what
    :func:`to_qkv` reads, made from qkv's tensors (the permutation undone). Every embedding
    name ``transformers`` reads is written (``model.shared.weight`` when the embeddings are
    shared; ``save_pretrained`` keeps one copy of tied tensors); attention biases qkv's model
    lacks (``use_bias=False``) are zeros. ``positions=True`` adds the position tables
    (``transformers`` computes them and does not save them).

    Raises:
        ValueError: ``c`` is not a model Marian expresses (:func:`transformers_config`).
    """
    why = _why_not_marian(c)
    if why is not None:
        raise ValueError(f"config: not a Marian model: {why}")
    D = c.num_hiddens
    p = residual_permutation(D)
    q = _table.inverse_permutation(p)
    like = state_dict["decoder.embedding.weight"]

    def read(name: str) -> Tensor:
        t = state_dict.get(name)
        if t is None and name.endswith(".bias") and ".W_" in name:  # use_bias=False
            return torch.zeros(D, dtype=like.dtype, device=like.device)
        if t is None:
            raise KeyError(f"state_dict: no {name!r}")
        return t

    sd = _table.to_transformers(parameter_table(c.num_enc_layers, c.num_dec_layers), read, p)
    enc = _table.permuted(state_dict["encoder.embedding.weight"], COLUMNS, q)
    dec = enc if c.share_embeddings else _table.permuted(like, COLUMNS, q)
    out = dec if c.tie_embeddings else _table.permuted(read("decoder.dense.weight"), COLUMNS, q)
    sd[EMBEDDINGS["encoder"]], sd[EMBEDDINGS["decoder"]], sd[EMBEDDINGS["output"]] = enc, dec, out
    if c.share_embeddings:
        sd[EMBEDDINGS["shared"]] = enc
    bias = state_dict.get("decoder.dense.bias")
    if bias is None:
        bias = torch.zeros(c.tgt_vocab_size, dtype=like.dtype, device=like.device)
    sd[EMBEDDINGS["bias"]] = bias.reshape(1, -1).clone()
    if positions:
        table = sinusoid_table(c.max_len, D).to(like.dtype)
        for name in POSITIONS:
            sd[name] = table
    return sd
