"""The plain data every attention picture is drawn from: named kinds of per-layer weights.

An :class:`AttentionKind` is one kind of attention of one example (say the encoder's
self-attention of one sentence): a list of per-layer weights ``(H, Lq, Lk)`` plus the query tokens
(rows) and key tokens (columns).  The viewer (:func:`qkv.viz.attention_html`) and the static figure
(:func:`qkv.viz.plot_attention`) take a list of kinds; :func:`translation_attention` builds the
usual three (encoder self, decoder self, cross) from source and target tokens, so a trained
translation model only has to hand over its weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["AttentionKind", "as_kinds", "to_numpy", "translation_attention"]


def _describe(x: object) -> str:
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"{type(x).__name__} of shape {tuple(shape)}"
    return type(x).__name__


def to_numpy(x: Any, name: str) -> np.ndarray:
    """A float64 numpy copy of a tensor, array or nested list; TypeError naming ``name`` if not."""
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", torch.float64).numpy()
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name}: expected a tensor or array of numbers, got {_describe(x)}")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name}: expected a tensor or array of numbers, got {_describe(x)}") from e
    return arr


def _tokens(tokens: Sequence[str] | None, n: int, name: str) -> tuple[str, ...]:
    if tokens is None:
        return tuple(str(i) for i in range(n))
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise TypeError(f"{name}: expected a sequence of {n} strings, got {_describe(tokens)}")
    if len(tokens) != n:
        raise ValueError(f"{name}: expected {n} tokens to match the weights, got {len(tokens)}")
    return tuple(str(t) for t in tokens)


@dataclass(frozen=True, eq=False)
class AttentionKind:
    """One kind of attention of one example, layer by layer.

    Args:
        name: what the kind is, e.g. ``"encoder self-attention"``; shown in the viewer's menu.
        layers: the weights, either one array ``(layers, H, Lq, Lk)`` or a sequence of per-layer
            arrays ``(H, Lq, Lk)`` (or ``(Lq, Lk)`` for a single head); torch tensors, numpy
            arrays or nested lists.  Layers may differ in their number of heads.  Values must be
            finite and non-negative (attention weights; a row may sum to 1 or, fully masked, to 0).
        query_tokens: the ``Lq`` row labels (queries), or None for positions ``0..Lq-1``.
        key_tokens: the ``Lk`` column labels (keys), or None for positions ``0..Lk-1``.
        queries: optional, the query vectors the weights were computed from, per layer
            ``(H, Lq, d)`` (or one ``(layers, H, Lq, d)``): with ``keys`` and ``scale``, what
            the viewer's neuron view shows (:func:`qkv.viz.vectors.record_queries_keys`
            records them from a model).
        keys: the key vectors, per layer ``(H, Lk, d)``; given with ``queries`` or not at all.
        scale: the factor the dot products were multiplied by (``1/√d`` for the scaled dot
            product); required with ``queries``.

    After construction ``layers`` is a tuple of float64 numpy arrays ``(H, Lq, Lk)``, the token
    lists are tuples of str, and ``queries``/``keys`` tuples of float64 arrays or None.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what was received.
    """

    name: str
    layers: Any
    query_tokens: Sequence[str] | None = None
    key_tokens: Sequence[str] | None = None
    queries: Any = None
    keys: Any = None
    scale: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name: expected a non-empty str, got {self.name!r}")
        raw = self.layers
        if isinstance(raw, (str, bytes)) or raw is None:
            raise TypeError(
                f"layers: expected an array (layers, H, Lq, Lk) or a sequence of (H, Lq, Lk) arrays, "
                f"got {_describe(raw)}"
            )
        if hasattr(raw, "shape"):
            if len(raw.shape) != 4:
                raise ValueError(
                    f"layers: expected one array (layers, H, Lq, Lk) or a list of per-layer arrays "
                    f"(H, Lq, Lk), got an array of shape {tuple(raw.shape)} (wrap a single "
                    f"layer in a list)"
                )
            arr = to_numpy(raw, "layers")
            per_layer = [arr[i] for i in range(arr.shape[0])]
        elif isinstance(raw, Sequence):
            per_layer = [to_numpy(x, f"layers[{i}]") for i, x in enumerate(raw)]
        else:
            raise TypeError(
                f"layers: expected an array (layers, H, Lq, Lk) or a sequence of (H, Lq, Lk) arrays, "
                f"got {_describe(raw)}"
            )
        if not per_layer:
            raise ValueError("layers: expected at least one layer, got none")
        out = []
        for i, w in enumerate(per_layer):
            if w.ndim == 2:
                w = w[None]
            if w.ndim != 3 or 0 in w.shape:
                raise ValueError(
                    f"layers[{i}]: expected weights of shape (H, Lq, Lk) or (Lq, Lk) with no "
                    f"empty axis, got shape {w.shape}"
                )
            if not np.isfinite(w).all():
                raise ValueError(f"layers[{i}]: expected finite weights, found NaN or inf")
            if (w < 0).any():
                raise ValueError(
                    f"layers[{i}]: expected non-negative attention weights, got a minimum of "
                    f"{w.min():.4g}"
                )
            if out and w.shape[1:] != out[0].shape[1:]:
                raise ValueError(
                    f"layers[{i}]: expected (Lq, Lk) = {out[0].shape[1:]} like layer 0, got "
                    f"{w.shape[1:]}"
                )
            out.append(np.ascontiguousarray(w, dtype=np.float64))
        Lq, Lk = out[0].shape[1:]
        object.__setattr__(self, "layers", tuple(out))
        object.__setattr__(self, "query_tokens", _tokens(self.query_tokens, Lq, "query_tokens"))
        object.__setattr__(self, "key_tokens", _tokens(self.key_tokens, Lk, "key_tokens"))
        self._check_vectors()

    def _check_vectors(self) -> None:
        """``queries``, ``keys`` and ``scale`` checked against the weights and stored."""
        if self.queries is None and self.keys is None:
            if self.scale is not None:
                raise ValueError("scale: given without queries and keys (it scales their dots)")
            return
        if self.queries is None or self.keys is None:
            missing = "keys" if self.keys is None else "queries"
            raise ValueError(f"{missing}: expected it with the other vectors, got None")
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)):
            raise TypeError(f"scale: expected a number with queries and keys, got {self.scale!r}")
        Lq, Lk = self.shape
        stored = {}
        for name, rows in (("queries", Lq), ("keys", Lk)):
            raw = getattr(self, name)
            per_layer = [raw[i] for i in range(len(raw))] if hasattr(raw, "shape") else raw
            if isinstance(per_layer, (str, bytes)) or not isinstance(per_layer, Sequence):
                raise TypeError(
                    f"{name}: expected per-layer arrays (H, L, d), got {_describe(raw)}"
                )
            if len(per_layer) != self.num_layers:
                raise ValueError(
                    f"{name}: expected {self.num_layers} layers like the weights, got "
                    f"{len(per_layer)}"
                )
            out = []
            for i, x in enumerate(per_layer):
                v = to_numpy(x, f"{name}[{i}]")
                want = (self.heads(i), rows)
                if v.ndim != 3 or v.shape[:2] != want or not np.isfinite(v).all():
                    raise ValueError(
                        f"{name}[{i}]: expected finite vectors of shape ({want[0]}, {rows}, d), "
                        f"got shape {v.shape}"
                    )
                out.append(v)
            stored[name] = tuple(out)
        for i, (q, k) in enumerate(zip(stored["queries"], stored["keys"])):
            if q.shape[2] != k.shape[2]:
                raise ValueError(
                    f"keys[{i}]: expected the queries' width d = {q.shape[2]}, got {k.shape[2]}"
                )
        object.__setattr__(self, "queries", stored["queries"])
        object.__setattr__(self, "keys", stored["keys"])
        object.__setattr__(self, "scale", float(self.scale))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def shape(self) -> tuple[int, int]:
        """``(Lq, Lk)``."""
        return self.layers[0].shape[1], self.layers[0].shape[2]

    def heads(self, layer: int) -> int:
        """Number of heads of ``layer``."""
        return self.layers[layer].shape[0]

    def matrix(self, layer: int = -1, head: int | str = "mean") -> np.ndarray:
        """The ``(Lq, Lk)`` weights of one head of ``layer``, or the mean over its heads.

        Args:
            layer: layer index (negative counts from the last).
            head: a head index, or ``"mean"`` for the average over all heads.
        """
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer: expected an int, got {_describe(layer)}")
        if not -self.num_layers <= layer < self.num_layers:
            raise ValueError(
                f"layer: expected an index in [{-self.num_layers}, {self.num_layers}), got {layer}"
            )
        w = self.layers[layer]
        if head == "mean":
            return w.mean(axis=0)
        if isinstance(head, bool) or not isinstance(head, int):
            raise TypeError(f"head: expected an int or 'mean', got {head!r}")
        if not -w.shape[0] <= head < w.shape[0]:
            raise ValueError(
                f"head: expected an index in [{-w.shape[0]}, {w.shape[0]}), got {head}"
            )
        return w[head]


def translation_attention(
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    *,
    encoder: Any = None,
    decoder: Any = None,
    cross: Any = None,
    bahdanau: Any = None,
    vectors: dict[str, Any] | None = None,
) -> list[AttentionKind]:
    """The attention kinds of one translated sentence, ready for the viewer or a figure.

    Args:
        src_tokens: the ``Ls`` source tokens.
        tgt_tokens: the ``Lt`` target tokens (the decoder's inputs or outputs, one per step).
        encoder: encoder self-attention, per layer ``(H, Ls, Ls)`` (or one
            ``(layers, H, Ls, Ls)``).
        decoder: decoder self-attention, per layer ``(H, Lt, Lt)``.
        cross: cross-attention (decoder queries, encoder keys), per layer ``(H, Lt, Ls)``.
        bahdanau: the Bahdanau decoder's per-step weights ``(Lt, Ls)`` (one layer, one head).
        vectors: optional, for the neuron view: ``{"encoder" | "decoder" | "cross": (queries,
            keys, scale)}``, per-layer queries ``(H, Lq, d)`` and keys ``(H, Lk, d)`` of that
            kind (see :class:`AttentionKind`).

    Returns:
        The kinds that were given, in the order encoder, decoder, cross, Bahdanau.
    """
    kinds = []
    vectors = {} if vectors is None else dict(vectors)
    unknown = set(vectors) - {"encoder", "decoder", "cross"}
    if unknown:
        raise ValueError(f"vectors: expected keys among encoder, decoder, cross, got {unknown}")

    def qks(what: str) -> dict[str, Any]:
        got = vectors.get(what)
        return {} if got is None else dict(zip(("queries", "keys", "scale"), got))

    if encoder is not None:
        kinds.append(
            AttentionKind(
                "encoder self-attention", encoder, src_tokens, src_tokens, **qks("encoder")
            )
        )
    if decoder is not None:
        kinds.append(
            AttentionKind(
                "decoder self-attention", decoder, tgt_tokens, tgt_tokens, **qks("decoder")
            )
        )
    if cross is not None:
        kinds.append(
            AttentionKind("cross-attention", cross, tgt_tokens, src_tokens, **qks("cross"))
        )
    if bahdanau is not None:
        w = to_numpy(bahdanau, "bahdanau")
        if w.ndim != 2:
            raise ValueError(f"bahdanau: expected per-step weights (Lt, Ls), got shape {w.shape}")
        kinds.append(AttentionKind("Bahdanau attention", [w], tgt_tokens, src_tokens))
    if not kinds:
        raise ValueError(
            "translation_attention: expected at least one of encoder, decoder, cross, bahdanau"
        )
    return kinds


def as_kinds(data: AttentionKind | Sequence[AttentionKind], name: str = "kinds") -> list:
    """``data`` as a non-empty list of :class:`AttentionKind` with distinct names."""
    if isinstance(data, AttentionKind):
        return [data]
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        raise TypeError(
            f"{name}: expected an AttentionKind or a sequence of them, got {_describe(data)}"
        )
    kinds = list(data)
    if not kinds:
        raise ValueError(f"{name}: expected at least one AttentionKind, got an empty sequence")
    for i, k in enumerate(kinds):
        if not isinstance(k, AttentionKind):
            raise TypeError(f"{name}[{i}]: expected an AttentionKind, got {_describe(k)}")
    names = [k.name for k in kinds]
    if len(set(names)) != len(names):
        raise ValueError(f"{name}: expected distinct kind names, got {names}")
    return kinds
