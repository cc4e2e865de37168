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
* ``onnx.json``: the sizes and special ids the runner needs; ``tokenizers/``: the model's own;
* ``README.md`` and ``card.json``: the model card (as a qkv model folder's); ``manifest.json``:
  the size and SHA-256 of every other file (format ``qkv.onnx``), written last.

The folder is written by qkv's one folder writer (:func:`qkv.inference.writing.write_folder`:
under a temporary name, renamed when complete, files with the user's umask modes), and
:class:`OnnxTranslator` verifies every file against the manifest before it reads one: a
missing, altered, added or linked file is refused in one line naming it.

``B``, ``Ls`` and ``T`` are dynamic; positions stay inside the model's table (``config.max_len``:
sources of at most that many tokens, at most that many target tokens).  :class:`OnnxTranslator`
runs the folder with onnxruntime alone (and qkv's tokenizers): greedy decoding, the same ids as
qkv's own greedy search.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._deps import require
from .._folder import CARD, CARD_DATA, ONNX_CONFIG, ONNX_FILES
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
from ..inference.batches import SourceBatch, decode_sorted
from ..inference.bounds import LIMITS
from ..inference.engine import one_best_or_all
from ..inference.limits import PositionBounds
from ..inference.saved import MANIFEST, ONNX_FOLDER_FORMAT, VerifiedFolder
from ..inference.writing import check_out, model_card, run_card, write_folder
from ..viz.display import CardDisplay
from .readme import onnx_use

__all__ = ["ONNX_FILES", "OnnxTranslator", "export_onnx"]

logger = logging.getLogger(__name__)

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
    for program, name in ((encoder, "encoder.onnx"), (step, "decoder_step.onnx")):
        _without_stack_traces(program.model)
        program.save(str(folder / name))


#: the exporter's metadata of each node that names files of the exporting machine
_LOCAL_METADATA = ("pkg.torch.onnx.stack_trace",)


def _without_stack_traces(model: Any) -> None:
    """Drop the stack traces the exporter records on every node (the paths of this machine's
    qkv, Python and home folder): an export publishes nothing local."""
    for graph in (*model.graphs(), *model.functions.values()):
        for node in graph.all_nodes() if hasattr(graph, "all_nodes") else graph:
            for key in _LOCAL_METADATA:
                node.metadata_props.pop(key, None)


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


def _meta(saved: SavedModel, config: Any) -> dict[str, Any]:
    """``onnx.json``: the sizes and special ids the runner needs."""
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
    return meta


def export_onnx(
    model: SavedModel | str | os.PathLike, out: str | os.PathLike, *, force: bool = False
) -> Path:
    """Write ``model`` as ONNX graphs into the folder ``out`` (see the module's notes), with a
    ``README.md`` model card (the run's data, scores and settings when ``model`` is read from a
    folder) and a manifest.

    Args:
        model: a :class:`~qkv.inference.SavedModel` or a model folder
            (:func:`~qkv.inference.load_model` reads it).
        out: a folder that does not exist yet, or an empty one.  It is written whole or not at
            all: the files are made in a temporary folder beside it, then moved in.
        force: replace a model folder exported before, of any format (never a run, a
            checkpoint, or files qkv did not write).

    Returns:
        ``out`` as a :class:`~pathlib.Path`.

    Raises:
        MissingDependency: onnx, onnxscript (the ``onnx`` extra) are not installed.
        ValueError: ``out`` holds files (without ``force``), is not a model folder, or is
            under a file; the model is not a Transformer translator.
    """
    require("exporting to ONNX", ["onnx", "onnxscript"])
    saved = _as_saved(model)
    config = _check_transformer(saved.model)
    source = None if saved.path is None else Path(saved.path)
    out = check_out(out, force, () if source is None else (source,))
    card = run_card(source) if source is not None else {}
    if saved.languages is not None:
        card["languages"] = list(saved.languages)
    step = int(verify_checkpoint(source, files=[]).get("step") or 0) if source else 0
    net = saved.model
    was_training = net.training
    device = next(net.parameters()).device
    dtype = next(net.parameters()).dtype

    def fill(folder: Path) -> None:
        _export_graphs(net, folder)
        text = json.dumps(_meta(saved, config), indent=1) + "\n"
        (folder / ONNX_CONFIG).write_text(text, encoding="utf-8")
        save_tokenizers(folder / "tokenizers", saved.src_tokenizer, saved.tgt_tokenizer)
        # greedy: the model's own decoding (a beam) is not the runner's
        use = onnx_use(saved.src_tokenizer, saved.tgt_tokenizer, folder)
        readme = model_card(card, net, None, use=use)
        (folder / CARD).write_text(readme, encoding="utf-8")
        (folder / CARD_DATA).write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")

    try:
        net.to(device="cpu", dtype=torch.float32).eval()
        write_folder(out, fill, fmt=ONNX_FOLDER_FORMAT, step=step)
    finally:
        net.to(device=device, dtype=dtype).train(was_training)
    logger.info("ONNX model written to %s", out)
    return out


def _verified(folder: Path) -> VerifiedFolder:
    """``folder``'s manifest read and every file of it verified (none unlisted, none a link),
    before anything is read; a one-line error naming the file otherwise."""
    if folder.is_dir() and not (folder / MANIFEST).is_file():
        if not (folder / ONNX_CONFIG).is_file():
            raise ValueError(
                f"folder: expected an ONNX model written by qkv export --format onnx, but "
                f"{str(folder)!r} has no onnx.json"
            )
        raise CheckpointError(
            f"folder: {str(folder)!r} has no {MANIFEST}: ONNX graphs qkv exports have one (the "
            "size and SHA-256 of every file, checked before loading); export them again with "
            "qkv export --format onnx"
        )
    v = VerifiedFolder(folder, formats=(ONNX_FOLDER_FORMAT,))
    for name in ONNX_FILES:
        v.file(name)
    v.whole()
    return v


def _check_meta(v: VerifiedFolder) -> dict[str, Any]:
    """``onnx.json``, verified, each size the runner uses an int in bounds."""
    meta = v.json(ONNX_CONFIG)
    if (
        not isinstance(meta, dict)
        or meta.get("format") != _FORMAT
        or meta.get("version") != _VERSION
    ):
        raise v.invalid(ONNX_CONFIG, ValueError(f"not a {_FORMAT} v{_VERSION} file"))
    bounds = {
        "layers": LIMITS["num_dec_layers"],
        "heads": LIMITS["num_heads"],
        "head_dim": LIMITS["num_hiddens"],
        "max_positions": LIMITS["max_len"],
        "tgt_vocab_size": LIMITS["tgt_vocab_size"],
    }
    for key in (*bounds, "pad_id", "bos_id", "eos_id", "src_eos_id"):
        value, top = meta.get(key), bounds.get(key, LIMITS["tgt_vocab_size"])
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise v.invalid(
                ONNX_CONFIG, ValueError(f"{key}: expected an int in [0, {top:,}], got {value!r}")
            )
    suppress = meta.get("suppress")
    if not isinstance(suppress, list) or not all(
        isinstance(i, int) and 0 <= i < meta["tgt_vocab_size"] for i in suppress
    ):
        raise v.invalid(ONNX_CONFIG, ValueError("suppress: expected a list of target ids"))
    return meta


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
        ValueError: ``folder`` holds no ONNX model written by :func:`export_onnx`, or a bad
            ``threads``.
        CheckpointError: one line naming the file: no manifest (graphs an older qkv exported),
            a file missing, altered, unlisted or reached through a link, sizes out of bounds in
            ``onnx.json``, a graph onnxruntime cannot load, unreadable tokenizers.
    """

    engine = "onnx"

    def __init__(self, folder: str | os.PathLike, *, threads: int | None = None) -> None:
        require("running an ONNX model", ["onnxruntime"])
        import onnxruntime as ort

        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(f"threads: expected an int >= 1 or None, got {threads!r}")
        self.folder = self.path = Path(folder)
        v = _verified(self.folder)
        self.meta = meta = _check_meta(v)
        langs = meta.get("languages")
        if isinstance(langs, list) and len(langs) == 2:
            self._languages = (str(langs[0]), str(langs[1]))
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        cpu = ["CPUExecutionProvider"]
        sessions = []
        for name in ("encoder.onnx", "decoder_step.onnx"):
            try:
                sessions.append(ort.InferenceSession(str(v.file(name)), options, providers=cpu))
            except Exception as e:  # onnxruntime's own errors on a graph it cannot load
                raise v.invalid(name, e) from None
        self._encoder, self._step = sessions
        self.src_tokenizer: Tokenizer
        self.tgt_tokenizer: Tokenizer
        try:
            self.src_tokenizer, self.tgt_tokenizer = load_tokenizers(v.tree("tokenizers"))
        except (OSError, ValueError, KeyError) as e:
            raise v.invalid("tokenizers", e) from None
        sizes = (self.src_tokenizer.vocab_size, self.tgt_tokenizer.vocab_size)
        if sizes != (meta.get("src_vocab_size"), meta["tgt_vocab_size"]):
            raise v.invalid(
                ONNX_CONFIG,
                ValueError(
                    f"vocabularies of {meta.get('src_vocab_size')} and {meta['tgt_vocab_size']} "
                    f"ids, the tokenizers have {sizes[0]} and {sizes[1]}"
                ),
            )
        eos = meta["eos_id"]
        self._banned = sorted(
            {i for i in (meta["pad_id"], meta["bos_id"], *meta["suppress"]) if i != eos}
        )

    def _positions(self) -> PositionBounds:
        """The graphs' positions (the model's ``max_len``) bound both sides."""
        P = self.meta["max_positions"]
        named = f"the ONNX graphs' {P} positions (the model's max_len)"
        return PositionBounds(source=P, target=P, named=named)

    def _check_decoding(self, decoding: Decoding) -> None:
        beyond = decoding.beyond_greedy()
        for done_here in ("forced_eos", "suppress"):  # what the greedy loop applies itself
            beyond.pop(done_here, None)
        if beyond:
            raise ValueError(
                f"{', '.join(beyond)}: the onnx engine decodes greedily (beam 1, one "
                f"translation, nothing blocked), got "
                f"{', '.join(f'{k}={v}' for k, v in beyond.items())}; use the qkv engine for that"
            )

    def _decode_batch(self, batch: SourceBatch, decoding: Decoding) -> list[list[Any]]:
        """Greedy search on one padded batch (:meth:`_greedy`); one unscored (NaN) hypothesis
        per source."""
        import numpy as np

        limits = np.array(batch.limits, dtype=np.int64)
        banned = sorted(set(self._banned) | (set(decoding.suppress) - {self.meta["eos_id"]}))
        rows = self._greedy(
            batch.ids.numpy(), batch.lengths.numpy(), limits, banned, decoding.forced_eos
        )
        return [[(ids, math.nan)] for ids in rows]

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
        dec = self.decoding.resolve(decoding, **overrides)
        self._check_decoding(dec)
        P = self.meta["max_positions"]
        for i, ids in enumerate(src_ids):
            if len(ids) > P:
                raise ValueError(
                    f"src_ids: sentence {i} has {len(ids)} tokens, more than the "
                    f"{P} positions of the exported model"
                )
        limits = [dec.output_limit(max(len(ids), 1), P) for ids in src_ids]
        hyps = decode_sorted(
            src_ids,
            limits,
            dec,
            self._decode_batch,
            eos_id=self.meta["src_eos_id"],
            progress=progress,
        )
        return one_best_or_all(hyps, 1)

    def _greedy(
        self, src: Any, src_len: Any, limits: Any, banned: list[int], forced_eos: bool = False
    ) -> list[list[int]]:
        """qkv's greedy search (:func:`qkv.decoding.greedy_search`) on one padded batch, the
        ``banned`` ids never chosen (and, with ``forced_eos``, EOS the last token allowed); a
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
            if banned:
                logits[:, banned] = -np.inf
            nxt = logits.argmax(-1)
            if forced_eos:
                nxt[limits[rows] == t + 1] = eos
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
