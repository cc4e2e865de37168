"""Sane bounds on the sizes a model folder states, checked before anything is allocated.

A manifest vouches that a folder's files are the ones it lists, not that what they say is sane:
whoever can rewrite a file can rewrite the manifest too. So every size read from a folder
(``model.json``'s widths, layers, vocabularies and table, ``decoding.json``'s beam and budgets,
the sizes another engine's folder states) is checked here before a model is built or a beam
decoded: against a hard limit per field (:data:`LIMITS`), against the weight file it must
fill (a model cannot have more parameters than its weight file has bytes), and against the
memory available (:func:`available_memory`: ``MemAvailable``, the cgroups' limits and
``ulimit -v``, as :mod:`qkv._machine` reads them). A size out of bounds is a
:class:`~qkv._errors.SettingError` naming the field; the reader that read the file says which
file, in one line (``checkpoint: model.json in 'x' is refused: ...``).

The estimates are lower bounds (the weights' float32 bytes, the buffers that grow with the
position table, the logits of one decoding step): a folder is refused only when it certainly
cannot fit, never because an estimate was generous.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import SettingError
from .._machine import memory_available
from ..nn.seq2seq import Seq2SeqConfig
from .options import Decoding

__all__ = [
    "LIMITS",
    "available_memory",
    "check_decoding",
    "check_memory",
    "check_model_config",
    "min_model_bytes",
    "min_parameters",
]

#: the largest value qkv reads from a folder, per field (a model's and a decoding's): far above
#: any translation model (a width of 131,072; 1,024 layers; 4M tokens of vocabulary; a table of
#: a million positions; a beam of 1,024), far below what takes a machine down by itself
LIMITS: dict[str, int] = {
    "num_hiddens": 1 << 17,
    "ffn_num_hiddens": 1 << 17,
    "embed_size": 1 << 17,
    "num_heads": 1 << 12,
    "num_enc_layers": 1024,
    "num_dec_layers": 1024,
    "src_vocab_size": 1 << 22,
    "tgt_vocab_size": 1 << 22,
    "max_len": 1 << 20,
    "beam_size": 1024,
    "n_best": 1024,
    "no_repeat_ngram": 1 << 20,
    "max_output_len": 1 << 20,
    "output_len_cap": 1 << 20,
    "max_tokens": 1 << 24,
}

_FLOAT = 4  # bytes of a float32: a model is built in float32


def available_memory() -> int | None:
    """Bytes of memory this process can still take (:func:`qkv._machine.memory_available`:
    the kernel's ``MemAvailable``, less where a cgroup, v1 or v2, or ``ulimit -v`` leaves
    less); None where nothing says. The memory guard of attention reads the same answer."""
    return memory_available()


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_memory(need: int, key: str, what: str) -> None:
    """A SettingError keyed ``key`` when ``need`` bytes (``what`` needs them) are more than
    :func:`available_memory` (nothing is checked where it cannot be read)."""
    free = available_memory()
    if free is not None and need > free:
        raise SettingError(
            key,
            f"{what} needs at least {_gb(need)} of memory, and {_gb(free)} is available; "
            "qkv allocates nothing it cannot hold",
        )


def _limit(key: str, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value > LIMITS[key]:
        raise SettingError(key, f"{value:,} is more than qkv reads (at most {LIMITS[key]:,})")


def min_parameters(c: Seq2SeqConfig) -> int:
    """A lower bound on the parameters of the model ``c`` builds (shared weights once): its
    embeddings, output projection, and each layer's largest matrices."""
    D, Vs, Vt = c.num_hiddens, c.src_vocab_size, c.tgt_vocab_size
    if c.kind == "transformer":
        E = D
        layers = c.num_enc_layers * (4 * D * D + 2 * D * c.ffn_num_hiddens)
        layers += c.num_dec_layers * (8 * D * D + 2 * D * c.ffn_num_hiddens)
        if c.pos_encoding == "learned":
            layers += 2 * c.max_len * D
    else:  # the Bahdanau model: GRU layers (3 gates, input and hidden matrices), attention
        E = c.embed_size
        layers = 3 * D * (E + D) + (c.num_enc_layers - 1) * 6 * D * D  # the encoder's
        layers += 3 * D * (E + 2 * D) + (c.num_dec_layers - 1) * 6 * D * D  # context fed in
        layers += 2 * D * D  # the attention's W_q and W_k
    embeddings = Vs * E + (0 if c.share_embeddings else Vt * E)
    return embeddings + (0 if c.tie_embeddings else Vt * D) + layers


def min_model_bytes(c: Seq2SeqConfig) -> int:
    """A lower bound on the memory of the model ``c`` builds, in float32: its parameters and
    the position tables it precomputes (a sinusoidal or rotary table of ``max_len`` rows)."""
    tables = 0
    if c.kind == "transformer" and c.pos_encoding == "sinusoidal":
        tables = 2 * c.max_len * c.num_hiddens  # one per stack
    elif c.kind == "transformer" and c.pos_encoding == "rotary":
        tables = 2 * c.max_len * (c.num_hiddens // c.num_heads)  # cos and sin
    return _FLOAT * (min_parameters(c) + tables)


def check_model_config(
    config: Mapping[str, Any] | Seq2SeqConfig,
    weights_bytes: int | None = None,
    *,
    built: bool = True,
) -> Seq2SeqConfig:
    """``config`` (``model.json``'s) as a :class:`~qkv.nn.Seq2SeqConfig`, every size in
    bounds, before the model is built.

    Args:
        config: the config, or its dict as ``model.json`` holds it.
        weights_bytes: the size of the weight file the model is to be filled from: a model
            needs at least a byte a parameter there (None: not checked).
        built: qkv builds the model (float32, beside the weights read: both must fit in
            memory); False: another engine runs the weight file as it is (it must fit).

    Raises:
        SettingError: a field over its :data:`LIMITS`, a model larger than its weight file
            can hold, or one the memory available cannot (keyed by the field that sizes it:
            ``num_hiddens``, or ``max_len`` for a table).
        ValueError, TypeError: a config :class:`~qkv.nn.Seq2SeqConfig` refuses.
    """
    for key in ("src_vocab_size", "tgt_vocab_size", "num_hiddens", "ffn_num_hiddens",
                "num_heads", "num_enc_layers", "num_dec_layers", "embed_size", "max_len"):  # fmt: skip
        _limit(key, config.get(key) if isinstance(config, Mapping) else getattr(config, key))
    c = config if isinstance(config, Seq2SeqConfig) else Seq2SeqConfig.from_dict(dict(config))
    params = min_parameters(c)
    if weights_bytes is not None and params > weights_bytes:
        raise SettingError(
            "num_hiddens",
            f"the model described ({c.kind}, width {c.num_hiddens}, {c.num_enc_layers}+"
            f"{c.num_dec_layers} layers, vocabularies {c.src_vocab_size} and "
            f"{c.tgt_vocab_size}) has at least {params:,} parameters, and its weight file holds "
            f"{weights_bytes:,} bytes: the sizes do not belong to these weights",
        )
    if built:
        table = min_model_bytes(c) - _FLOAT * params
        key = "max_len" if table > _FLOAT * params else "num_hiddens"
        check_memory(min_model_bytes(c) + (weights_bytes or 0), key, "the model described")
    elif weights_bytes is not None:
        check_memory(weights_bytes, "num_hiddens", "the model's weight file")
    return c


def check_decoding(dec: Decoding, tgt_vocab_size: int | None = None) -> Decoding:
    """``dec`` (a folder's default decoding) with every size in bounds: each field under its
    :data:`LIMITS`, and the logits of one sentence's beam (``beam_size`` hypotheses over the
    target vocabulary) within the memory available. Returns ``dec``.

    Raises:
        SettingError: the field out of bounds.
    """
    for key in ("beam_size", "n_best", "no_repeat_ngram", "max_output_len", "output_len_cap",
                "max_tokens"):  # fmt: skip
        _limit(key, getattr(dec, key))
    if tgt_vocab_size:
        need = 2 * _FLOAT * dec.beam_size * tgt_vocab_size  # the logits and their log-softmax
        check_memory(need, "beam_size", f"a beam of {dec.beam_size:,}")
    return dec
