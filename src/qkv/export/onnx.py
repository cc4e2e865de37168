"""A qkv Transformer translator as two ONNX graphs, and greedy translation with onnxruntime.

:func:`export_onnx` traces the model with ``torch.onnx.export(dynamo=True)`` (through
``torch.export``: qkv's attention then takes its tensor-only ``"export"`` backend) and writes a
folder:

* ``encoder.onnx``: ``src`` ``(B, Ls)`` int64 token ids (the source's ``<eos>`` included, padding
  after it), ``src_len`` ``(B,)`` int64 -> ``cross_k``, ``cross_v`` ``(layers, B, H, Ls, d)``
  float32: every decoder layer's cross-attention keys and values, projected once;
* ``decoder_step.onnx``: one decoding step with its KV cache: ``tok`` ``(B, 1)`` int64,
  ``src_len`` ``(B,)``, ``past_k``/``past_v`` ``(layers, B, H, T, d)`` (``T`` tokens decoded so
  far, 0 at the first step), ``cross_k``/``cross_v`` -> ``logits`` ``(B, V)`` of the next token,
  ``new_k``/``new_v`` ``(layers, B, H, T + 1, d)``;
* ``onnx.json``: the sizes and special ids the runner needs; ``tokenizers/``: the model's own.

``B``, ``Ls`` and ``T`` are dynamic; positions stay inside the model's table (``config.max_len``:
sources of at most that many tokens, at most that many target tokens).  :class:`OnnxTranslator`
runs the folder with onnxruntime alone (and qkv's tokenizers): greedy decoding, the same ids as
qkv's own greedy search.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._deps import require
from ..data import Tokenizer, load_tokenizers, save_tokenizers
from ..inference import Decoding, SavedModel, TranslatorBase, load_model, never_generated
from ..inference.writing import is_no_space, no_space_error
from ..viz.display import CardDisplay

__all__ = ["ONNX_FILES", "OnnxTranslator", "export_onnx"]

logger = logging.getLogger(__name__)

#: The files :func:`export_onnx` writes (besides ``tokenizers/``).
ONNX_FILES: tuple[str, ...] = ("encoder.onnx", "decoder_step.onnx", "onnx.json")
_FORMAT = "qkv-onnx"
_VERSION = 1


# ---------------------------------------------------------------------------- the two graphs
class _EncoderGraph(nn.Module):
    """``(src (B, Ls), src_len (B,))`` -> ``cross_k, cross_v`` ``(layers, B, H, Ls, d)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.decoder.cross_kv(self.model.encode(src, src_len))


class _StepGraph(nn.Module):
    """One decoder step: see the module's notes for the shapes."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.decoder = model.decoder

    def forward(
        self,
        tok: Tensor,
        src_len: Tensor,
        past_k: Tensor,
        past_v: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        logits, k, v = self.decoder.step(tok, src_len, past_k, past_v, cross_k, cross_v)
        return logits[:, -1], k, v


def _as_saved(model: SavedModel | str | os.PathLike) -> SavedModel:
    if isinstance(model, SavedModel):
        return model
    if isinstance(model, (str, os.PathLike)):
        return load_model(model)
    raise TypeError(
        f"model: expected a qkv.inference.SavedModel or a model folder, got {type(model).__name__}"
    )


def _check_transformer(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None or getattr(config, "kind", None) != "transformer":
        kind = getattr(config, "kind", None)
        raise ValueError(
            f"model: expected a Transformer translator (Seq2SeqConfig kind 'transformer'), got "
            f"{'a model without a config' if config is None else f'kind {kind!r}'}"
        )
    return config


def _export_graphs(model: nn.Module, folder: Path) -> None:
    """Trace ``model`` (eval mode, float32, CPU) into ``folder``'s two graphs."""
    from torch.export import Dim

    c = model.config
    n, H = c.num_dec_layers, c.num_heads
    d = c.num_hiddens // H
    # positions come from the model's table: a graph cannot extend it as eager qkv does
    B = Dim("B", min=1, max=1 << 16)
    Ls = Dim("Ls", min=1, max=c.max_len)
    T = Dim("T", min=0, max=c.max_len - 1)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, max(5, c.src_vocab_size), (2, 5), generator=g) % c.src_vocab_size
    lens = torch.tensor([5, 3])
    with torch.no_grad():
        cross_k, cross_v = _EncoderGraph(model)(src, lens)
    # distinct tensors for every example input: two inputs given the same tensor object are
    # traced as one (the step graph would read its past values from its past keys)
    past_k = torch.randn(n, 2, H, 3, d, generator=g)
    past_v = torch.randn(n, 2, H, 3, d, generator=g)
    tok = torch.tensor([[1], [1]])
    with _quiet_exporter():
        encoder = torch.onnx.export(
            _EncoderGraph(model),
            (src, lens),
            dynamo=True,
            input_names=["src", "src_len"],
            output_names=["cross_k", "cross_v"],
            dynamic_shapes={"src": {0: B, 1: Ls}, "src_len": {0: B}},
            verbose=False,
        )
        step = torch.onnx.export(
            _StepGraph(model),
            (tok, lens, past_k, past_v, cross_k.clone(), cross_v.clone()),
            dynamo=True,
            input_names=["tok", "src_len", "past_k", "past_v", "cross_k", "cross_v"],
            output_names=["logits", "new_k", "new_v"],
            dynamic_shapes={
                "tok": {0: B},
                "src_len": {0: B},
                "past_k": {1: B, 3: T},
                "past_v": {1: B, 3: T},
                "cross_k": {1: B, 3: Ls},
                "cross_v": {1: B, 3: Ls},
            },
            verbose=False,
        )
    encoder.save(str(folder / "encoder.onnx"))
    step.save(str(folder / "decoder_step.onnx"))


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's warnings and its log chatter ("torchvision is not installed") hidden."""
    chatter = logging.getLogger("torch.onnx")
    level = chatter.level
    chatter.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        chatter.setLevel(level)


def export_onnx(model: SavedModel | str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write ``model`` as ONNX graphs into the folder ``out`` (see the module's notes).

    Args:
        model: a :class:`~qkv.inference.SavedModel` or a model folder
            (:func:`~qkv.inference.load_model` reads it).
        out: a folder that does not exist yet, or an empty one.  It is written whole or not at
            all: the files are made in a temporary folder beside it, then moved in.

    Returns:
        ``out`` as a :class:`~pathlib.Path`.

    Raises:
        MissingDependency: onnx, onnxscript (the ``onnx`` extra) are not installed.
        ValueError: ``out`` holds files, or the model is not a Transformer translator.
    """
    require("exporting to ONNX", ["onnx", "onnxscript"])
    saved = _as_saved(model)
    config = _check_transformer(saved.model)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(
            f"out: expected a new or empty folder for the ONNX model, got {str(out)!r}, which "
            f"{'is a file' if not out.is_dir() else 'holds files'}"
        )
    net = saved.model
    was_training = net.training
    device = next(net.parameters()).device
    dtype = next(net.parameters()).dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        net.to(device="cpu", dtype=torch.float32).eval()
        _export_graphs(net, tmp)
        H = config.num_heads
        meta = {
            "format": _FORMAT,
            "version": _VERSION,
            "layers": config.num_dec_layers,
            "heads": H,
            "head_dim": config.num_hiddens // H,
            "max_positions": config.max_len,
            "src_vocab_size": config.src_vocab_size,
            "tgt_vocab_size": config.tgt_vocab_size,
            "pad_id": saved.tgt_tokenizer.pad_id,
            "bos_id": saved.tgt_tokenizer.bos_id,
            "eos_id": saved.tgt_tokenizer.eos_id,
            "src_eos_id": saved.src_tokenizer.eos_id,
            "suppress": never_generated(saved.tgt_tokenizer),
            "config": config.to_dict(),
        }
        if saved.languages is not None:  # (source, target), as model.json records them
            meta["languages"] = list(saved.languages)
        (tmp / "onnx.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        save_tokenizers(tmp / "tokenizers", saved.src_tokenizer, saved.tgt_tokenizer)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and is_no_space(e):
            raise no_space_error(e, out.parent, out.name) from None
        raise
    finally:
        net.to(device=device, dtype=dtype).train(was_training)
    logger.info("ONNX model written to %s", out)
    return out


# ---------------------------------------------------------------------------- the runner
class OnnxTranslator(TranslatorBase, CardDisplay):
    """Greedy translation with the graphs :func:`export_onnx` wrote, run by onnxruntime: the
    ``onnx`` engine of :class:`~qkv.inference.TextTranslator`.

    ``OnnxTranslator(folder, threads=None)``: ``threads`` sets onnxruntime's intra-op threads
    (None: its default).  :meth:`translate` takes texts (qkv's tokenizers, as
    :class:`qkv.translate.Translator`), :meth:`generate_ids` source ids; both give what qkv's
    greedy search gives (``<pad>``, ``<bos>`` and, for a byte-fallback target tokenizer,
    ``<unk>`` never emitted; at most ``2 * len + 10`` tokens per sentence by default). Its
    decoding is greedy with nothing blocked; a beam, n-best or blocked n-grams are refused.

    Raises:
        MissingDependency: onnxruntime is not installed.
        ValueError: ``folder`` holds no ONNX model written by :func:`export_onnx`.
    """

    engine = "onnx"

    def __init__(self, folder: str | os.PathLike, *, threads: int | None = None) -> None:
        require("running an ONNX model", ["onnxruntime"])
        import onnxruntime as ort

        self.folder = self.path = Path(folder)
        absent = [f for f in ONNX_FILES if not (self.folder / f).is_file()]
        if absent:
            raise ValueError(
                f"folder: expected an ONNX model written by qkv export --format onnx, but "
                f"{str(self.folder)!r} has no {', '.join(absent)}"
            )
        meta = json.loads((self.folder / "onnx.json").read_text(encoding="utf-8"))
        if meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
            raise ValueError(
                f"folder: onnx.json in {str(self.folder)!r} is not a {_FORMAT} v{_VERSION} file"
            )
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(f"threads: expected an int >= 1 or None, got {threads!r}")
        self.meta = meta
        langs = meta.get("languages")
        if isinstance(langs, list) and len(langs) == 2:
            self._languages = (str(langs[0]), str(langs[1]))
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        cpu = ["CPUExecutionProvider"]
        self._encoder = ort.InferenceSession(
            str(self.folder / "encoder.onnx"), options, providers=cpu
        )
        self._step = ort.InferenceSession(
            str(self.folder / "decoder_step.onnx"), options, providers=cpu
        )
        self.src_tokenizer: Tokenizer
        self.tgt_tokenizer: Tokenizer
        self.src_tokenizer, self.tgt_tokenizer = load_tokenizers(self.folder / "tokenizers")
        eos = meta["eos_id"]
        self._banned = sorted(
            {i for i in (meta["pad_id"], meta["bos_id"], *meta["suppress"]) if i != eos}
        )

    def _generate(self, texts: Sequence[str], decoding: Decoding, progress: Any) -> list[Any]:
        """Greedy target ids per text; a text that normalises to nothing gives ``[]``."""
        src = [self.encode(t) for t in texts]
        todo = [i for i, ids in enumerate(src) if len(ids) > 1]
        undone = len(src) - len(todo)
        ids = self.generate_ids(
            [src[i] for i in todo],
            decoding,
            progress=None if progress is None else (lambda k: progress(undone + k)),
        )
        out: list[Any] = [[] for _ in texts]
        for i, row in zip(todo, ids):
            out[i] = row
        return out

    def generate_ids(
        self,
        src_ids: Sequence[Sequence[int]],
        decoding: Decoding | None = None,
        *,
        progress: Any = None,
        **overrides: Any,
    ) -> list[list[int]]:
        """Greedy target ids (without ``<bos>``/``<eos>``) per source (``<eos>`` appended),
        in input order, decoded in batches of at most ``decoding.max_tokens`` source positions
        sorted by length; each translation at most ``decoding``'s decode length (the rule:
        ``2 * len + 10``) and the model's ``max_positions``.

        Raises:
            ValueError: a decoding this runner cannot do (a beam, n-best, blocked n-grams), or
                a source longer than the model's positions.
        """
        import numpy as np

        dec = self.decoding.resolve(decoding, **overrides)
        beyond = dec.beyond_greedy()
        if beyond:
            raise ValueError(
                f"{', '.join(beyond)}: the onnx engine decodes greedily (beam 1, one "
                f"translation, nothing blocked), got "
                f"{', '.join(f'{k}={v}' for k, v in beyond.items())}; use the qkv engine for that"
            )
        P = self.meta["max_positions"]
        for i, ids in enumerate(src_ids):
            if len(ids) > P:
                raise ValueError(
                    f"src_ids: sentence {i} has {len(ids)} tokens, more than the "
                    f"{P} positions of the exported model"
                )
        order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
        out: list[list[int]] = [[] for _ in src_ids]
        start = 0
        while start < len(order):
            stop = start + 1
            while (
                stop < len(order)
                and (stop - start + 1) * max(len(src_ids[order[stop]]), 1) <= dec.max_tokens
            ):
                stop += 1
            rows = order[start:stop]
            lens = [max(len(src_ids[i]), 1) for i in rows]
            src = np.zeros((len(rows), max(lens)), dtype=np.int64)
            for r, i in enumerate(rows):
                ids = list(src_ids[i]) or [self.meta["src_eos_id"]]
                src[r, : len(ids)] = ids
            limits = np.array([dec.output_limit(n, P) for n in lens], dtype=np.int64)
            for r, ids in zip(rows, self._greedy(src, np.array(lens, dtype=np.int64), limits)):
                out[r] = ids
            start = stop
            if progress is not None:
                progress(stop)
        return out

    def _greedy(self, src: Any, src_len: Any, limits: Any) -> list[list[int]]:
        """qkv's greedy search (:func:`qkv.decoding.greedy_search`) on one padded batch; a
        sentence leaves the batch when it ends (its EOS or its limit)."""
        import numpy as np

        m = self.meta
        eos = m["eos_id"]
        cross_k, cross_v = self._encoder.run(None, {"src": src, "src_len": src_len})
        B = src.shape[0]
        past_k = np.zeros((m["layers"], B, m["heads"], 0, m["head_dim"]), dtype=np.float32)
        past_v = past_k.copy()
        tok = np.full((B, 1), m["bos_id"], dtype=np.int64)
        out: list[list[int]] = [[] for _ in range(B)]
        rows = np.arange(B)  # the batch's rows still decoding
        t = 0
        while rows.size:
            logits, past_k, past_v = self._step.run(
                None,
                {
                    "tok": tok,
                    "src_len": src_len,
                    "past_k": past_k,
                    "past_v": past_v,
                    "cross_k": cross_k,
                    "cross_v": cross_v,
                },
            )
            if self._banned:
                logits[:, self._banned] = -np.inf
            nxt = logits.argmax(-1)
            t += 1
            ended = nxt == eos
            for r, i in zip(rows[~ended].tolist(), nxt[~ended].tolist()):
                out[r].append(i)
            ended |= limits[rows] <= t
            if ended.any():
                keep = ~ended
                rows, nxt, src_len = rows[keep], nxt[keep], src_len[keep]
                past_k, past_v = past_k[:, keep], past_v[:, keep]
                cross_k, cross_v = cross_k[:, keep], cross_v[:, keep]
            tok = nxt[:, None].astype(np.int64)
        return out
