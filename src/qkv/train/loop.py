"""The training loop behind ``qkv train``.

One update: ``accum_steps`` micro-batches (each a :class:`qkv.data.Batch` under the token
budget), forward under optional bf16 autocast, label-smoothed cross-entropy summed over the real
target tokens, backward, the gradient scaled so that the update uses the mean loss per target
token of all micro-batches on all ranks, gradient-norm clipping, AdamW, and the inverse-square-root
schedule. Every ``eval_every`` updates rank 0 computes the validation loss and sacreBLEU; a
checkpoint follows every evaluation and every ``save_every`` updates.

Resuming is exact: a checkpoint holds the weights, the optimizer's moments, the schedule's step,
every rank's RNG states (dropout), and the data position, so a run killed and resumed ends with
bitwise the same weights as an uninterrupted one (on the CPU with the same thread count; on GPUs
as far as the kernels are deterministic).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data import (
    Batch,
    Normalizer,
    Split,
    TokenBatcher,
    Tokenizer,
    build_tokenizers,
    bundled_pairs,
    encode_pairs,
    load_tokenizers,
    read_pairs,
    save_tokenizers,
    split_pairs,
)
from ..inference import Evaluation, corpus_scores, decode_texts
from ..nn.seq2seq import EncoderDecoder, build_model
from . import distributed as D
from .checkpoint import (
    CheckpointError,
    LoadedCheckpoint,
    atomic_write_json,
    average_weights,
    best_checkpoint,
    find_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    prune_checkpoints,
    read_weights,
    remove_stale_temporaries,
    resolve_model_dir,
    save_checkpoint,
    write_model_folder,
)
from .config import RESUMABLE_KEYS, TrainConfig
from .losses import sequence_loss
from .presets import resolve_config
from .schedules import Schedule

__all__ = [
    "RunData",
    "StepStats",
    "TrainResult",
    "TrainingError",
    "load_run_data",
    "make_optimizer",
    "raw_run_pairs",
    "saved_run_pairs",
    "train",
    "train_update",
]


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN or infinite)."""


# ---------------------------------------------------------------------------- data
@dataclass
class RunData:
    """A run's text: the split, the three parts (normalised), the tokenizers."""

    split: Split
    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]
    test: list[tuple[str, str]]
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    source: str
    raw_valid: list[str] = field(default_factory=list)
    raw_test: list[str] = field(default_factory=list)


def _normalizer(name: str) -> Normalizer:
    return Normalizer.book() if name == "book" else Normalizer()


def read_run_pairs(config: TrainConfig) -> tuple[list[tuple[str, str]], str]:
    """The raw pairs of ``config.data`` (the bundled corpus when None), cut to ``max_pairs``."""
    if config.data is None:
        pairs, source = bundled_pairs(), "the bundled English-French corpus"
    else:
        pairs, report = read_pairs(config.data, config.data_format)
        source = config.data
        if report.n_skipped and os.environ.get("RANK", "0") == "0":  # said once under torchrun
            print(f"qkv: {report}", file=sys.stderr)
    if config.max_pairs is not None:
        pairs = pairs[: config.max_pairs]
    return pairs, source


def raw_run_pairs(
    config: TrainConfig, split: Split
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """The run's train, valid and test pairs exactly as the data file holds them (not
    normalised): what translations are scored against."""
    pairs, _ = read_run_pairs(config)
    train, valid, test = split.apply(pairs)
    return list(train), list(valid), list(test)


#: the parts of a run's data, in the order :meth:`qkv.data.Split.apply` returns them
RUN_PARTS = ("train", "valid", "test")


def saved_run_pairs(model_dir: str | Path, part: str = "test") -> tuple[list[tuple[str, str]], str]:
    """One part of the data a saved model was trained on, as the data file holds it (not
    normalised: what ``qkv evaluate`` scores against), and what it is in words.

    Args:
        model_dir: a ``qkv train --out`` folder or one of its checkpoint or model folders (see
            :func:`qkv.inference.resolve_model_dir`).
        part: ``"train"``, ``"valid"`` or ``"test"``.

    Returns:
        ``(pairs, description)``, e.g. ``"the test split of data/en-fr.tsv"``; no pairs
        when that part of the run is empty.

    Raises:
        ValueError: an unknown ``part``, or data that is not the data the run was split from.
        CheckpointError: no usable checkpoint there.
    """
    if part not in RUN_PARTS:
        raise ValueError(f"part: expected one of {RUN_PARTS}, got {part!r}")
    ckpt = load_checkpoint(resolve_model_dir(model_dir), with_tensors=False)
    try:
        config = TrainConfig.from_dict(ckpt.train_config)
        split = Split.from_dict(ckpt.split)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint: {str(ckpt.path)!r} is unusable: {e}") from None
    pairs = dict(zip(RUN_PARTS, raw_run_pairs(config, split)))[part]
    source = config.data or "the bundled English-French corpus"
    return pairs, f"the {part} split of {source}"


def load_run_data(
    config: TrainConfig,
    *,
    split: Split | None = None,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    pairs: tuple[list[tuple[str, str]], str] | None = None,
) -> RunData:
    """Read, split and normalise the run's pairs, and build (or take) the tokenizers.

    With ``split`` (a resumed run, or evaluation) the saved split is applied, which checks that
    the data is the data the run was trained on. ``pairs`` gives the ``(pairs, source)`` that
    :func:`read_run_pairs` returned, when they were read already. The references of the
    validation and test parts are also kept as they were read (``raw_valid``, ``raw_test``):
    translations are scored against those, as sacreBLEU scores.
    """
    pairs_read, source = pairs if pairs is not None else read_run_pairs(config)
    if split is None:
        split = split_pairs(
            pairs_read, valid=config.valid, test=config.test, seed=config.split_seed
        )
    train, valid, test = split.apply(pairs_read)
    if not train or not valid:
        raise ValueError(
            f"data: {source} gives {len(train)} training and {len(valid)} validation pairs; "
            "expected some of each (more data, or other valid/test sizes)"
        )
    raw_valid, raw_test = [t for _, t in valid], [t for _, t in test]
    bundled = config.data is None
    # a resumed run keeps the normaliser saved with its tokenizers, even if the named one changed
    saved = tokenizers[0].normalizer if tokenizers is not None else None
    name = config.normalizer if config.normalizer != "auto" else ("book" if bundled else "plain")
    norm = saved if saved is not None else _normalizer(name)
    train, valid, test = norm.pairs(train), norm.pairs(valid), norm.pairs(test)
    if tokenizers is None:
        kind = config.tokenizer
        if kind == "auto":
            kind = "word" if bundled else "sentencepiece"
        joint = config.joint_vocab if config.joint_vocab is not None else kind == "sentencepiece"
        opts: dict[str, Any] = (
            {"min_freq": config.min_freq}
            if kind == "word"
            else {
                "vocab_size": config.vocab_size or 8000,
                "model_type": config.subword_model,
                "byte_fallback": config.byte_fallback,
            }
        )
        src_tok, tgt_tok = build_tokenizers(
            train, kind, joint=joint, normalizer=norm, pre_normalized=True, **opts
        )
    else:
        src_tok, tgt_tok = tokenizers
    return RunData(split, train, valid, test, src_tok, tgt_tok, source, raw_valid, raw_test)


# ---------------------------------------------------------------------------- optimisation
def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices of linear layers only (not on biases, norms or
    embeddings, as nanoGPT and fairseq do)."""
    decay, no_decay, seen = [], [], set()
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=config.betas,
        eps=config.adam_eps,
        foreach=False,  # the same arithmetic whatever the parameter layout
    )


@dataclass
class StepStats:
    """What one update did: summed losses and token counts over every rank."""

    loss_sum: float
    nll_sum: float
    tokens: int
    grad_norm: float
    lr: float

    @property
    def loss(self) -> float:
        """Mean label-smoothed loss per target token."""
        return self.loss_sum / max(self.tokens, 1)


def train_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: Schedule,
    micro_batches: Sequence[Batch],
    *,
    label_smoothing: float,
    clip_norm: float,
    device: torch.device,
    bf16: bool = False,
    pad_id: int = 0,
) -> StepStats:
    """One optimizer update over ``micro_batches`` (this rank's part of it).

    The gradient is that of the summed loss divided by the number of real target tokens of the
    whole update on all ranks; under DDP, which averages gradients over ranks, each rank scales its
    loss by ``world_size / tokens`` so that the average is exactly that.

    Shapes: every batch's ``src`` ``(B, Ls)``, ``tgt_in``/``tgt_out`` ``(B, Lt)``.
    """
    world = (
        torch.distributed.get_world_size()
        if torch.distributed.is_available() and torch.distributed.is_initialized()
        else 1
    )
    local_tokens = sum(b.num_tokens for b in micro_batches)
    count = D.all_reduce_sum(torch.tensor([float(local_tokens)], device=device))
    total_tokens = int(count.item())
    scale = world / max(total_tokens, 1)
    lr = schedule.step()
    loss_acc = torch.zeros((), device=device)
    nll_acc = torch.zeros((), device=device)
    is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    autocast = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if bf16
        else contextlib.nullcontext()
    )
    for i, batch in enumerate(micro_batches):
        b = batch.to(device, non_blocking=True)
        sync = not is_ddp or i == len(micro_batches) - 1
        ctx = contextlib.nullcontext() if sync else model.no_sync()
        with ctx:
            with autocast:
                logits = model(b.src, b.tgt_in, b.src_valid_lens)
            loss_sum, nll_sum, _ = sequence_loss(
                logits, b.tgt_out, pad_id=pad_id, label_smoothing=label_smoothing
            )
            (loss_sum * scale).backward()
        loss_acc += loss_sum.detach()
        nll_acc += nll_sum
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else math.inf)
    stats = D.all_reduce_sum(torch.stack([loss_acc, nll_acc]).double())
    loss_sum, nll_sum = (float(x) for x in stats.tolist())
    grad_norm = float(norm)
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        raise TrainingError(
            f"the loss became non-finite at update {schedule.last_step} (loss sum {loss_sum}, "
            f"gradient norm {grad_norm}); nothing was updated. Lower lr, keep clip_norm > 0, or "
            "check the data"
        )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepStats(loss_sum, nll_sum, total_tokens, grad_norm, lr)


# ---------------------------------------------------------------------------- evaluation
@torch.no_grad()
def validation_loss(
    model: nn.Module, batcher: TokenBatcher, device: torch.device, *, bf16: bool = False
) -> float:
    """Mean negative log-likelihood per target token over every batch of ``batcher`` (no
    label smoothing, eval mode)."""
    training = model.training
    model.eval()
    nll, tokens = 0.0, 0
    autocast = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if bf16
        else contextlib.nullcontext()
    )
    try:
        batcher.set_epoch(0)
        for batch in batcher:
            b = batch.to(device)
            with autocast:
                logits = model(b.src, b.tgt_in, b.src_valid_lens)
            _, s, n = sequence_loss(logits, b.tgt_out)
            nll += float(s)
            tokens += n
    finally:
        model.train(training)
    return nll / max(tokens, 1)


def validation_bleu(
    model: EncoderDecoder,
    pairs: Sequence[tuple[str, str]],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    device: torch.device,
    *,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    references: Sequence[str] | None = None,
    max_len: int | None = None,
    no_repeat_ngram: int = 0,
) -> Evaluation:
    """sacreBLEU (and chrF) of ``model``'s translations of the normalised sources of ``pairs``.

    ``references`` are the raw reference texts (what sacreBLEU scores against); None scores
    against the normalised targets of ``pairs``. ``max_len`` caps every translation (a run's
    ``max_len``: its model never saw longer targets), so an untrained model's validation does
    not decode every sentence to ``2 * source + 10`` tokens. The translations are decoded by
    :func:`qkv.inference.decode_texts`, as :class:`qkv.translate.Translator` decodes them.
    """
    out = decode_texts(
        model,
        [s for s, _ in pairs],
        src_tok,
        tgt_tok,
        device=device,
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_len_cap=max_len,
        no_repeat_ngram=no_repeat_ngram,
        pre_normalized=True,
    )
    refs = list(references) if references is not None else [t for _, t in pairs]
    return corpus_scores([tgt_tok.decode(ids) for ids in out], refs)


# ---------------------------------------------------------------------------- RNG state
def _rng_state(device: torch.device) -> dict:
    """The generators training may draw from: torch's (dropout), CUDA's, Python's and NumPy's
    global ones (the batch order has its own seeded generator and is restored from the data
    position)."""
    np_state = np.random.get_state()  # noqa: NPY002 - the legacy global state is what is saved
    py_version, py_state, _ = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "python": list(py_state),
        "python_version": py_version,
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((int(state["python_version"]), tuple(int(x) for x in state["python"]), None))
    np_state = (
        "MT19937",
        state["numpy"].numpy().astype(np.uint32),
        int(state["numpy_pos"]),
        0,
        0.0,
    )
    np.random.set_state(np_state)  # noqa: NPY002
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# ---------------------------------------------------------------------------- progress
class Progress:
    """The progress display: a line rewritten in place on a terminal, else a line every
    ``log_every`` updates; everything on stderr (rank 0 only)."""

    def __init__(self, total: int, enabled: bool, stream: Any = None) -> None:
        self.total, self.enabled = total, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_draw = 0.0
        self._open = False

    def _fmt(self, step: int, loss: float, lr: float, tps: float, elapsed: float, eta: float):
        width = 20
        done = int(width * step / self.total)
        bar = "#" * done + "-" * (width - done)
        return (
            f"[{bar}] {step}/{self.total} loss {loss:.3f} lr {lr:.2e} "
            f"{tps / 1000:.1f}k tok/s {_clock(elapsed)} eta {_clock(eta)}"
        )

    def update(
        self, step: int, loss: float, lr: float, tps: float, elapsed: float, eta: float, log: bool
    ) -> None:
        if not self.enabled:
            return
        line = self._fmt(step, loss, lr, tps, elapsed, eta)
        now = time.monotonic()
        if self.tty and not log:
            if now - self._last_draw >= 0.25:
                self.stream.write("\r" + line + "\x1b[K")
                self.stream.flush()
                self._last_draw, self._open = now, True
            return
        if log:
            self.message(line)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._open:
            self.stream.write("\r\x1b[K")
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


# ---------------------------------------------------------------------------- the run
@dataclass
class TrainResult:
    """How a run ended.

    Attributes:
        out: the run folder.
        step: updates done.
        stopped: ``"max_steps"``, ``"max_minutes"`` or ``"early_stopping"``.
        best_bleu, best_step: the best validation BLEU and its update (None before any eval).
        last_checkpoint: the newest checkpoint folder; ``best_checkpoint`` the best one.
        resumed_from: the update the run was resumed at (None for a fresh run).
        minutes: wall-clock minutes of this invocation.
        history: logged training and validation figures.
        final_model: ``OUT/final``, the model to use: the best checkpoint's weights, or the
            average of the last checkpoints when that validates better, with the decoding
            settings chosen on the validation split (None before any evaluation).
        final_bleu: its validation BLEU with those settings; ``decoding`` the settings.
    """

    out: Path
    step: int
    stopped: str
    best_bleu: float | None
    best_step: int | None
    last_checkpoint: Path | None
    best_checkpoint: Path | None
    resumed_from: int | None
    minutes: float
    history: list[dict] = field(default_factory=list)
    final_model: Path | None = None
    final_bleu: float | None = None
    decoding: dict | None = None


def _infinite(batcher: TokenBatcher) -> Iterator[Batch]:
    while True:
        yield from batcher


def _repair_best_pointer(ckroot: Path, state: dict) -> None:
    """Make ``best.json`` name the run state's best checkpoint: a crash right after a
    checkpoint's rename, before its ``best.json`` write, leaves the pointer stale."""
    best_step = state.get("best_step")
    if best_step is None:
        return
    name = f"step-{int(best_step):08d}"
    if not (ckroot / name / "manifest.json").is_file():
        return
    current = best_checkpoint(ckroot)
    if current is None or current.name != name:
        atomic_write_json(
            ckroot / "best.json", {"step": int(best_step), "path": name, "bleu": state["best_bleu"]}
        )


def _check_resume_config(saved: TrainConfig, given: TrainConfig) -> TrainConfig:
    a, b = saved.to_dict(), given.to_dict()
    # "auto" (None) given for a setting the checkpoint holds a value of is no change: a run
    # written before the setting was automatic, resumed from a script with the defaults
    for k in a:
        if b.get(k) in (None, "auto") and a[k] not in (None, "auto"):
            b[k] = a[k]
    # the model options compare as the model they resolve to: an option given at its default
    # value (--set model.dropout=0.1) is no change
    ma, mb = saved.model_config(2, 2).to_dict(), given.model_config(2, 2).to_dict()
    changed = [k for k in ma if ma[k] != mb.get(k)]
    a["model_options"] = {k: ma[k] for k in changed}
    b["model_options"] = {k: mb.get(k) for k in changed}
    diff = sorted(k for k in a if k not in RESUMABLE_KEYS and a[k] != b[k])
    if diff:
        shown = ", ".join(f"{k}: checkpoint {a[k]!r}, given {b[k]!r}" for k in diff[:6])
        raise ValueError(
            f"resume: the run was started with other settings ({shown}); only "
            f"{', '.join(sorted(RESUMABLE_KEYS))} may change when resuming"
        )
    return given


# ---------------------------------------------------------------------------- the run's plan
@dataclass
class _Clock:
    """Where this invocation's time went: evaluations and checkpoint writes are not training."""

    t_start: float
    evals: list[float] = field(default_factory=list)
    saving: float = 0.0
    t_first: float | None = None  # when the speed began to be measured
    steps_at_first: int = 0
    busy_at_first: float = 0.0

    def eval_cost(self, per_update: float) -> float:
        """Seconds one validation takes: measured, or guessed before the first one."""
        if self.evals:
            return sum(self.evals[-3:]) / len(self.evals[-3:])
        return max(1.0, 10 * per_update)


#: the provisional length of a timed run, until its speed is measured (after 6 updates)
_FIRST_GUESS = 10_000

#: the n-grams a run's chosen decoding never repeats (see :func:`qkv.decoding.generate`)
NO_REPEAT_NGRAM = 3


class _Plan:
    """How long the run will be, and the warm-up and cadences that follow from it.

    A run bounded by ``max_steps`` alone knows its length. A run with a clock
    (``max_minutes``) measures the time of its updates (without evaluations and checkpoint
    writes) and of its evaluations, and plans the updates that fit in the budget, keeping time
    for the evaluations still to come and the final averaging and decoding choice (about
    :attr:`FINAL_EVALS` validations). It re-plans after 3, 6 and 10 updates and then every 10,
    so the learning rate decays to the end of the budget on any machine.
    """

    EVALS = 6  # scheduled evaluations over a run whose eval_every is automatic
    SAVES = 12  # checkpoints over a run whose save_every is automatic
    WARMUP_FRACTION = 0.1
    MIN_WARMUP = 10
    FINAL_EVALS = 7.0  # the final evaluation, the averaged model's, greedy and two beams (~2x)

    def __init__(self, config: TrainConfig, timed: bool) -> None:
        self.config, self.timed = config, timed

    def warmup(self, total: int) -> int:
        if self.config.warmup_steps is not None:
            return self.config.warmup_steps
        return min(max(self.MIN_WARMUP, round(self.WARMUP_FRACTION * total)), max(total, 1))

    def eval_every(self, total: int) -> int:
        return max(1, math.ceil(total / self.EVALS))

    def save_every(self, total: int, eval_every: int | None = None) -> int:
        """Half the evaluation interval (rounded up, so a checkpoint never falls one update
        before an evaluation's), or ``total / SAVES`` when evaluations are not automatic."""
        if eval_every is not None and self.config.eval_every is None:
            return max(1, math.ceil(eval_every / 2))
        return max(1, math.ceil(total / self.SAVES))

    @staticmethod
    def due(done_steps: int) -> bool:
        return done_steps in (3, 6) or (done_steps >= 10 and done_steps % 10 == 0)

    def final_reserve(self, clock: _Clock, budget_s: float) -> float:
        """Seconds kept at the end of a timed run for its final evaluation and averaging."""
        if not clock.evals:
            return 0.05 * budget_s
        return min(self.FINAL_EVALS * clock.eval_cost(0.0), budget_s / 6) + 2 * clock.saving / max(
            len(clock.evals), 1
        )

    def estimate(
        self,
        step: int,
        done_steps: int,
        elapsed: float,
        budget_s: float,
        clock: _Clock,
        current: int,
    ) -> int:
        """The number of updates (in all) this run can make within ``budget_s`` (``current``:
        the plan so far, kept until something is measured)."""
        now = clock.t_start + elapsed
        if clock.t_first is None:
            clock.t_first, clock.steps_at_first = now, done_steps
            clock.busy_at_first = sum(clock.evals) + clock.saving
            return current  # nothing measured yet: keep the plan
        n = done_steps - clock.steps_at_first
        busy = sum(clock.evals) + clock.saving - clock.busy_at_first
        per_update = max((now - clock.t_first - busy) / max(n, 1), 1e-6)
        eval_cost = clock.eval_cost(per_update)
        save_cost = clock.saving / max(len(clock.evals), 1) if clock.evals else 0.0
        # evaluations may take at most a quarter of the budget, the final ones a sixth
        remaining = budget_s - elapsed - min(self.FINAL_EVALS * eval_cost, budget_s / 6)
        total = float(step + max(remaining, 0.0) / per_update)
        for _ in range(3):  # the evaluations and saves still to come shorten the run
            left = max(total - step, 0.0) / max(total, 1.0)
            busy_left = left * (self.EVALS * eval_cost + self.SAVES * save_cost)
            busy_left = min(busy_left, 0.25 * max(remaining, 0.0))
            total = step + max(remaining - busy_left, 0.0) / per_update
        return max(int(total), step)

    def describe(self, schedule: Schedule) -> str:
        c = self.config
        end = (
            f"the planned end of a {c.max_minutes:g}-minute budget (re-planned from the "
            f"measured speed{f'; at most {c.max_steps} updates' if c.max_steps else ''})"
            if self.timed
            else f"update {c.step_limit}"
        )
        if schedule.kind == "inverse_sqrt":
            shape = "then 1/sqrt(step) decay"
        else:
            shape = f"then {schedule.kind} decay to {c.min_lr_ratio:g} x peak at {end}"
        cadence = (
            f"evaluation every {c.eval_every} updates"
            if c.eval_every
            else f"about {self.EVALS} evaluations"
        )
        saves = (
            f"a checkpoint every {c.save_every}"
            if c.save_every
            else f"about {self.SAVES} checkpoints"
        )
        warm = (
            f"{c.warmup_steps} warm-up updates"
            if c.warmup_steps is not None
            else f"warm-up over {self.WARMUP_FRACTION:.0%} of the run"
        )
        return (
            f"schedule: peak lr {c.lr:g}, {warm}, {shape}; {cadence} and {saves}; "
            f"{c.max_tokens} tokens per batch"
            + (f" x {c.accum_steps} micro-batches" if c.accum_steps > 1 else "")
        )


def _due(step: int, last: int, every: int, fixed: bool) -> bool:
    """Is a scheduled evaluation/checkpoint due at ``step``? A fixed cadence is a grid
    (multiples of ``every``); an automatic one counts from the last."""
    return step % every == 0 if fixed else step - last >= every


def _finish(
    out: Path,
    ckroot: Path,
    model: EncoderDecoder,
    model_config: Any,
    run_cfg: TrainConfig,
    user_cfg: TrainConfig,
    data: RunData,
    state: dict,
    pairs: Sequence[tuple[str, str]],
    refs: Sequence[str],
    device: torch.device,
    say: Any,
    time_left: float = math.inf,
    eval_cost: float = 0.0,
) -> Path:
    """Write ``OUT/final``: the best checkpoint's weights, or the average of the newest
    ``average_last`` checkpoints when it validates better, with the decoding (greedy, or beam 4
    with a length penalty) that validates best. Returns the folder."""
    t0 = time.monotonic()
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer

    def score(beam: int = 1, lp: float = 1.0, nr: int = 0) -> Any:
        return validation_bleu(
            model, pairs, src_tok, tgt_tok, device, beam_size=beam, length_penalty=lp,
            references=refs, max_len=run_cfg.max_len, no_repeat_ngram=nr,
        )  # fmt: skip

    best_dir = ckroot / f"step-{int(state['best_step']):08d}"
    weights = read_weights(best_dir)
    bleu = float(state["best_bleu"])
    source: dict[str, Any] = {"kind": "best checkpoint", "steps": [int(state["best_step"])]}
    found = find_checkpoints(ckroot)
    # the newest checkpoints only (pruning keeps keep_last of them, and the best)
    n_avg = min(run_cfg.average_last, run_cfg.keep_last)
    last = found[-n_avg:] if n_avg >= 2 else []
    # a timed run does only what its budget has room for (beam search costs ~2 validations)
    deadline = time.monotonic() + time_left
    if len(last) >= 2 and deadline - time.monotonic() < eval_cost:
        say("  no time left to validate an average of the last checkpoints; skipped")
        last = []
    if len(last) >= 2:
        avg = average_weights(last)
        model.load_state_dict(avg)
        sc = score(run_cfg.eval_beam)  # as the checkpoints were scored
        steps = [int(p.name.split("-")[1]) for p in last]
        better = sc.bleu > bleu
        say(
            f"  average of the checkpoints of updates {steps}: valid BLEU {sc.bleu:.2f} "
            f"({'better than' if better else 'not better than'} the best checkpoint's {bleu:.2f})"
        )
        if better:
            weights, bleu = avg, float(sc.bleu)
            source = {"kind": "average", "steps": steps}
    model.load_state_dict(weights)
    # the candidates never repeat a 3-gram of pieces: an undertrained model's loops
    # ("autre autre autre autre") cost little BLEU but make a translation unusable
    nr = NO_REPEAT_NGRAM
    decoding: dict[str, Any] = {"beam_size": 1, "length_penalty": 1.0, "no_repeat_ngram": 0}
    tune = run_cfg.tune_decoding
    if tune and deadline - time.monotonic() < 5 * eval_cost:
        say("  no time left to choose a beam on the validation split; greedy decoding kept")
        tune = False
    if tune:
        tried = []
        best_bleu = -math.inf
        for beam, lp in ((1, 1.0), (4, 0.6), (4, 1.0)):
            sc = score(beam, lp, nr)
            tried.append(f"{'greedy' if beam == 1 else f'beam {beam} lp {lp:g}'} {sc.bleu:.2f}")
            if sc.bleu > best_bleu:
                best_bleu = float(sc.bleu)
                decoding = {"beam_size": beam, "length_penalty": lp, "no_repeat_ngram": nr}
        bleu = best_bleu
        say(
            f"  decoding chosen on validation (no {nr}-gram repeated): {decoding} "
            f"(tried: {', '.join(tried)})"
        )
    decoding["chosen_on"] = f"{len(pairs)} validation sentences, BLEU {bleu:.2f}"
    folder = write_model_folder(
        out / "final",
        step=int(state["step"]),
        state_dict=model.state_dict(),
        model_config=model_config.to_dict(),
        write_tokenizers=lambda d: save_tokenizers(d, src_tok, tgt_tok),
        documents={
            "train.json": user_cfg.to_dict(),
            "split.json": data.split.to_dict(),
            "trainer.json": {
                "step": int(state["step"]),
                "weights": source,
                "valid_bleu": bleu,
                "resolved_config": run_cfg.to_dict(),
                "preset": state.get("preset"),
                "history": state["history"],
            },
            "decoding.json": decoding,
        },
    )
    state["final_bleu"], state["decoding"] = bleu, decoding
    say(
        f"qkv train: final model ({source['kind']} of updates {source['steps']}, "
        f"{'greedy' if decoding['beam_size'] == 1 else 'beam 4'}) valid BLEU {bleu:.2f} in "
        f"{folder} ({time.monotonic() - t0:.1f} s)"
    )
    return folder


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stream: Any = None,
) -> TrainResult:
    """Train a translation model as ``config`` says, writing into ``out``.

    Args:
        config: the run's settings.
        out: the run folder (checkpoints go to ``out/checkpoints``).
        resume: continue from the newest checkpoint in ``out`` (a fresh start when there is
            none). The settings must match the checkpoint's except :data:`RESUMABLE_KEYS`.
        progress: show progress and messages on ``stream`` (stderr by default; rank 0 only).
        stream: where progress goes.

    Returns:
        A :class:`TrainResult`.

    Raises:
        ValueError: bad settings or data; ``out`` already holds a run and ``resume`` is False.
        CheckpointError: the checkpoint to resume from is corrupt or foreign.
        TrainingError: the loss became non-finite.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config: expected a TrainConfig, got {type(config).__name__}")
    config.validate()
    out = Path(out)
    ckroot = out / "checkpoints"
    info = D.setup(config.device, timeout_minutes=config.dist_timeout_minutes)
    try:
        return _run(config, out, ckroot, info, resume, progress, stream)
    finally:
        D.cleanup()


def _run(
    config: TrainConfig,
    out: Path,
    ckroot: Path,
    info: D.DistInfo,
    resume: bool,
    show: bool,
    stream: Any,
) -> TrainResult:
    t_start = time.monotonic()
    device = info.device
    if config.threads:
        torch.set_num_threads(config.threads)
    bar = Progress(config.step_limit, show and info.is_main, stream)
    say = bar.message

    # -- where we start -----------------------------------------------------------------------
    if config.data is not None:
        config = config.updated({"data": str(Path(config.data).resolve())})
    ckpt: LoadedCheckpoint | None = None
    if info.is_main:
        remove_stale_temporaries(ckroot)
    D.barrier()
    latest = latest_checkpoint(ckroot)
    if latest is not None and not resume:
        raise ValueError(
            f"out: {str(out)!r} already holds a run (checkpoint {latest.name}); pass --resume to "
            "continue it, or choose another --out"
        )
    if resume and latest is not None:
        ckpt = load_checkpoint(latest)
        try:
            saved = TrainConfig.from_dict(ckpt.train_config)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint: train.json in {str(latest)!r} is invalid: {e}"
            ) from None
        config = _check_resume_config(saved, config)
    elif resume:
        say(f"qkv train: nothing to resume in {out}; starting a new run")

    # -- data, the run's plan, the model ------------------------------------------------------
    if ckpt is not None:
        try:
            split = Split.from_dict(ckpt.split)
            toks = load_tokenizers(ckpt.path / "tokenizers")
        except (ValueError, KeyError, OSError) as e:
            raise CheckpointError(f"checkpoint: {str(ckpt.path)!r} is unusable: {e}") from None
        resolved = ckpt.trainer_state.get("resolved_config")
        try:
            if resolved:
                run_cfg = TrainConfig.from_dict(resolved)
            else:  # written before runs were planned: the schedule was the inverse square root
                old = "inverse_sqrt" if saved.schedule == "auto" else saved.schedule
                run_cfg = saved.updated({"schedule": old, "preset": "none"})
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint: the resolved settings in {str(ckpt.path)!r} are invalid: {e}"
            ) from None
        # what may change on resume comes from the invocation; the rest is the run's own
        run_cfg = run_cfg.updated({k: getattr(config, k) for k in sorted(RESUMABLE_KEYS)})
        preset_info = ckpt.trainer_state.get("preset")
        data = load_run_data(run_cfg, split=split, tokenizers=toks)
    else:
        pairs, source = read_run_pairs(config)
        split = split_pairs(pairs, valid=config.valid, test=config.test, seed=config.split_seed)
        n_train = len(split.train)
        if n_train < 1:
            raise ValueError(
                f"data: {source} gives no training pairs after the split ({len(pairs)} pairs "
                f"read); expected more data, or smaller valid/test sizes"
            )
        run_cfg, preset = resolve_config(
            config, n_train, device=device.type, world_size=info.world_size
        )
        preset_info = preset.to_dict() if preset is not None else None
        data = load_run_data(run_cfg, split=split, pairs=(pairs, source))
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
    torch.manual_seed(run_cfg.seed)
    model_config = run_cfg.model_config(src_tok.vocab_size, tgt_tok.vocab_size)
    if ckpt is not None and ckpt.model_config != model_config.to_dict():
        raise CheckpointError(
            f"checkpoint: model.json in {str(ckpt.path)!r} does not match the run's settings"
        )
    model = build_model(model_config)
    if ckpt is not None:
        load_model_weights(ckpt.path, model)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    src_ids, tgt_ids = encode_pairs(data.train, src_tok, tgt_tok, pre_normalized=True)
    assert run_cfg.max_tokens is not None  # resolved
    kept = sum(1 for a, b in zip(src_ids, tgt_ids) if max(len(a), len(b)) + 1 <= run_cfg.max_len)
    if kept == 0:
        raise ValueError(
            f"data: every one of the {len(data.train)} training pairs is longer than max_len="
            f"{run_cfg.max_len} tokens (with <eos>); nothing to train on: raise max_len "
            "(--set max_len=N) or check the data"
        )
    batcher = TokenBatcher(
        src_ids,
        tgt_ids,
        max_tokens=run_cfg.max_tokens,
        max_len=run_cfg.max_len,
        shuffle=True,
        seed=run_cfg.seed,
        rank=info.rank,
        world_size=info.world_size,
    )
    vs, vt = encode_pairs(data.valid, src_tok, tgt_tok, pre_normalized=True)
    valid_batches = TokenBatcher(
        vs,
        vt,
        max_tokens=max(run_cfg.max_tokens, 256),
        shuffle=False,
        rank=0,
        world_size=1,
        max_len=max(run_cfg.max_len, 2),
        truncate=True,
    )
    n_bleu = run_cfg.eval_sentences or len(data.valid)
    bleu_pairs = data.valid[:n_bleu]
    bleu_refs = data.raw_valid[:n_bleu]

    optimizer = make_optimizer(model, run_cfg)
    timed = run_cfg.max_minutes is not None
    limit = run_cfg.step_limit
    plan = _Plan(run_cfg, timed)
    schedule = Schedule(
        optimizer,
        peak_lr=run_cfg.lr,
        kind=run_cfg.schedule,
        warmup_steps=plan.warmup(min(limit, _FIRST_GUESS) if timed else limit),
        total_steps=min(limit, _FIRST_GUESS) if timed else limit,
        min_lr_ratio=run_cfg.min_lr_ratio,
    )
    state: dict[str, Any] = {
        "step": 0,
        "best_bleu": None,
        "best_step": None,
        "evals_since_best": 0,
        "grid_best_bleu": None,
        "target_tokens": 0,
        "history": [],
        # losses of the updates since the last progress line: a resumed run logs the same means
        "loss_window": [],
        # "early_stopping" once patience ran out: resuming with the same patience and
        # max_steps then does nothing
        "stopped": None,
        # the updates of the last scheduled evaluation and checkpoint (auto cadence)
        "last_eval": 0,
        "last_save": 0,
        "resolved_config": run_cfg.to_dict(),
        "preset": preset_info,
        # seconds of the run's earlier invocations: max_minutes is the whole run's budget
        "train_seconds": 0.0,
    }
    if ckpt is not None:
        tensors = ckpt.tensors or {}
        try:
            optimizer.load_state_dict(tensors["optimizer"])
            schedule.load_state_dict(tensors["schedule"])
            rngs = tensors["rng"]
            batcher.load_state_dict(ckpt.trainer_state["data"])
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise CheckpointError(
                f"checkpoint: the training state in {str(ckpt.path)!r} cannot be restored: {e}"
            ) from None
        if len(rngs) != info.world_size:
            raise CheckpointError(
                f"checkpoint: {str(ckpt.path)!r} was written by {len(rngs)} processes; resume it "
                f"with the same number (this run has {info.world_size})"
            )
        _set_rng_state(rngs[info.rank], device)
        state.update({k: ckpt.trainer_state[k] for k in state if k in ckpt.trainer_state})
        state["resolved_config"] = run_cfg.to_dict()
        if "grid_best_bleu" not in ckpt.trainer_state:  # written before it was kept apart
            state["grid_best_bleu"] = state["best_bleu"]
        if info.is_main:
            _repair_best_pointer(ckroot, state)
    else:
        # dropout differs per rank; the weights were drawn from config.seed on every rank
        torch.manual_seed(run_cfg.seed * 1009 + 1 + info.rank)
    start_step = int(state["step"])
    already_stopped = ckpt is not None and (
        (
            state["stopped"] == "early_stopping"
            and saved.patience == config.patience
            and saved.max_steps == config.max_steps
        )
        # a run that used its time budget (the final evaluation and averaging included)
        or (state["stopped"] == "max_minutes" and saved.max_minutes == config.max_minutes)
    )
    resumed_stop = state["stopped"] if already_stopped else None
    if not already_stopped:
        state["stopped"] = None
    if start_step != schedule.last_step:
        raise CheckpointError(
            f"checkpoint: inconsistent state (step {start_step}, schedule {schedule.last_step})"
        )
    if not timed and schedule.kind != "inverse_sqrt":
        # an update-bounded run ends at max_steps (which a resumed run may have changed)
        schedule.plan(total_steps=limit, warmup_steps=plan.warmup(limit))

    wrapped: nn.Module = model
    if info.distributed:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    writer = None
    if run_cfg.tensorboard and info.is_main:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError(
                "tensorboard=true needs the tensorboard package: pip install tensorboard"
            ) from None
        writer = SummaryWriter(str(out / "tensorboard"))

    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        what = f"resumed at update {start_step} from {ckpt.path}" if ckpt else "new run"
        say(
            f"qkv train: {what}; {run_cfg.model} model, {n_params / 1e6:.2f}M parameters, "
            f"{len(data.train)} training pairs ({batcher.n_dropped} longer than "
            f"{run_cfg.max_len} dropped), {len(data.valid)} valid, {len(data.test)} test, "
            f"{run_cfg.tokenizer} vocab {src_tok.vocab_size}/{tgt_tok.vocab_size}"
            f"{' (joint)' if src_tok is tgt_tok else ''}, {run_cfg.normalizer} text; "
            f"device {device}"
            + (f", {info.world_size} processes ({info.backend})" if info.distributed else "")
            + f", {torch.get_num_threads()} threads"
        )
        if preset_info is not None and ckpt is None:
            say(f"qkv train: {preset_info['reason']}")
            for note in preset_info.get("notes", []):
                say(f"qkv train: note: {note}")
        say("qkv train: " + plan.describe(schedule))

    # -- the loop -------------------------------------------------------------------------------
    stream_of_batches = _infinite(batcher)
    last_ckpt: Path | None = ckpt.path if ckpt else None
    saved_step: int | None = start_step if ckpt else None  # known on every rank
    stopped = resumed_stop or "max_steps"
    step = start_step
    window_tokens, window_t0 = 0, time.monotonic()
    seconds_before = float(state.get("train_seconds") or 0.0)
    budget_s = run_cfg.max_minutes * 60 - seconds_before if timed else math.inf
    if timed and budget_s <= 0 and not already_stopped:
        already_stopped, stopped = True, "max_minutes"
    if already_stopped and stopped == "max_minutes" and info.is_main:
        say(
            f"qkv train: the run has used its {run_cfg.max_minutes:g}-minute budget "
            f"({seconds_before / 60:.1f} min of training); a larger --max-minutes goes on"
        )
    clock = _Clock(t_start)
    model.train()

    def save(step: int) -> Path | None:
        t0 = time.monotonic()
        rng_all = D.all_gather_objects(_rng_state(device))
        sums = D.all_gather_objects(D.param_checksum(model) if info.distributed else "")
        if info.distributed and len(set(sums)) != 1:
            raise TrainingError(f"the replicas diverged at update {step}: checksums {sums}")
        path = None
        state["train_seconds"] = round(seconds_before + time.monotonic() - t_start, 3)
        if info.is_main:
            trainer_state = {
                **state,
                "step": step,
                "data": batcher.state_dict(),
                "world_size": info.world_size,
                "replica_checksums": sums if info.distributed else None,
            }
            path = save_checkpoint(
                ckroot,
                step,
                model=model,
                model_config=model_config.to_dict(),
                train_config=config.to_dict(),
                write_tokenizers=lambda d: save_tokenizers(d, src_tok, tgt_tok),
                split=data.split.to_dict(),
                trainer_state=trainer_state,
                tensors={
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(),
                    "rng": rng_all,
                },
            )
            if state["best_step"] == step:
                atomic_write_json(
                    ckroot / "best.json",
                    {"step": step, "path": path.name, "bleu": state["best_bleu"]},
                )
            prune_checkpoints(ckroot, run_cfg.keep_last, best_step=state["best_step"])
        D.barrier()
        clock.saving += time.monotonic() - t0
        return path

    def evaluate(step: int, *, scheduled: bool) -> float:
        """Validation loss and BLEU (rank 0); returns 1.0 when patience ran out."""
        t0 = time.monotonic()
        vloss = validation_loss(model, valid_batches, device, bf16=run_cfg.bf16)
        scores = validation_bleu(
            model,
            bleu_pairs,
            src_tok,
            tgt_tok,
            device,
            beam_size=run_cfg.eval_beam,
            references=bleu_refs,
            max_len=run_cfg.max_len,
        )
        # patience counts only scheduled evaluations: a final one off the schedule (at
        # max_steps or max_minutes) depends on where this invocation stopped, and counting it
        # would make a resumed run stop at another update. It may still become the best
        # checkpoint (its weights are the same in either run).
        if scheduled:
            grid_best = state["grid_best_bleu"]
            if grid_best is None or scores.bleu > grid_best:
                state.update(grid_best_bleu=scores.bleu, evals_since_best=0)
            else:
                state["evals_since_best"] += 1
        better = state["best_bleu"] is None or scores.bleu > state["best_bleu"]
        if better:
            state.update(best_bleu=scores.bleu, best_step=step)
        state["history"].append(
            {
                "step": step,
                "valid_loss": round(vloss, 5),
                "valid_bleu": round(scores.bleu, 3),
                "valid_chrf": round(scores.chrf, 3),
            }
        )
        if writer is not None:
            writer.add_scalar("valid/loss", vloss, step)
            writer.add_scalar("valid/bleu", scores.bleu, step)
            writer.add_scalar("valid/chrf", scores.chrf, step)
        took = time.monotonic() - t0
        clock.evals.append(took)
        say(
            f"  valid @ {step}: loss {vloss:.3f} (ppl {math.exp(min(vloss, 50)):.2f}), "
            f"BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f} on {scores.n} sentences "
            f"({took:.1f} s)" + ("  *best*" if better else "")
        )
        return 1.0 if run_cfg.patience and state["evals_since_best"] >= run_cfg.patience else 0.0

    if already_stopped and stopped == "early_stopping" and info.is_main:
        say(
            f"qkv train: the run already stopped early at update {step} (patience "
            f"{run_cfg.patience}); nothing to do (a larger --patience or --max-steps goes on)"
        )
    while step < limit and not already_stopped:
        micro = [next(stream_of_batches) for _ in range(run_cfg.accum_steps)]
        try:
            stats = train_update(
                wrapped,
                optimizer,
                schedule,
                micro,
                label_smoothing=run_cfg.label_smoothing,
                clip_norm=run_cfg.clip_norm,
                device=device,
                bf16=run_cfg.bf16,
                pad_id=tgt_tok.pad_id,
            )
        except TrainingError as e:
            where = (
                f"the last checkpoint (step-{saved_step:08d} in {ckroot}) is intact"
                if saved_step is not None
                else "no checkpoint was written yet"
            )
            raise TrainingError(f"{e}; {where}") from None
        step += 1
        state["step"] = step
        state["target_tokens"] += stats.tokens
        window_tokens += stats.tokens
        state["loss_window"].append(stats.loss)
        elapsed = time.monotonic() - t_start
        done_steps = step - start_step

        # a time-bounded run re-plans its length from the measured speed (rank 0 decides)
        if timed and plan.due(done_steps):
            current = schedule.total_steps or limit
            total = plan.estimate(step, done_steps, elapsed, budget_s, clock, current)
            total = int(D.all_reduce_sum(torch.tensor([float(total if info.is_main else 0)],
                                                      device=device)).item())  # fmt: skip
            total = max(min(total, limit), step)
            schedule.plan(total_steps=total, warmup_steps=plan.warmup(total))
        planned = schedule.total_steps if timed and schedule.total_steps else limit
        bar.total = planned
        log_now = step % run_cfg.log_every == 0 or step >= planned
        eta = elapsed / done_steps * (planned - step)
        if timed:
            eta = min(eta, max(budget_s - elapsed, 0.0))
        now = time.monotonic()
        tps = window_tokens / max(now - window_t0, 1e-9)
        if log_now:
            mean_loss = sum(state["loss_window"]) / len(state["loss_window"])
            state["history"].append(
                {"step": step, "loss": round(mean_loss, 5), "lr": stats.lr, "tok_s": round(tps)}
            )
            if writer is not None:
                writer.add_scalar("train/loss", mean_loss, step)
                writer.add_scalar("train/lr", stats.lr, step)
                writer.add_scalar("train/tokens_per_s", tps, step)
            bar.update(step, mean_loss, stats.lr, tps, elapsed, eta, True)
            state["loss_window"], window_tokens, window_t0 = [], 0, now
        else:
            bar.update(step, stats.loss, stats.lr, tps, elapsed, eta, False)

        # stop conditions, agreed by all ranks: the planned end of a timed run, or its clock
        # (keeping the time the final evaluation and the averaging need)
        # (a plan made from a few slow updates never ends a run early: it is re-made every
        # 10 updates, and the planned end counts only in the last fifth of the budget)
        over_time = timed and (
            (step >= planned and elapsed >= 0.8 * budget_s)
            or elapsed >= budget_s - plan.final_reserve(clock, budget_s)
        )
        flag = D.all_reduce_sum(torch.tensor([1.0 if over_time else 0.0], device=device))
        if float(flag) > 0 and step < limit:
            stopped = state["stopped"] = "max_minutes"
        final = step >= limit or stopped != "max_steps"

        eval_every = run_cfg.eval_every or plan.eval_every(planned)
        save_every = run_cfg.save_every or plan.save_every(planned, eval_every)
        scheduled = _due(step, state["last_eval"], eval_every, run_cfg.eval_every is not None)
        evaluated = False
        if scheduled or final:
            evaluated = True
            stop = 0.0
            if scheduled:
                state["last_eval"] = step
            if info.is_main:
                stop = evaluate(step, scheduled=scheduled)
                window_t0 = time.monotonic()  # the evaluation is not training time
            flag = D.all_reduce_sum(torch.tensor([stop], device=device))
            if float(flag) > 0 and not final:
                stopped = state["stopped"] = "early_stopping"
                final = True
        if (
            evaluated
            or final
            or _due(step, state["last_save"], save_every, run_cfg.save_every is not None)
        ):
            state["last_save"] = step
            last_ckpt = save(step) or last_ckpt
            saved_step = step
            window_t0 = time.monotonic()
        if final:
            break
    if step >= limit and start_step >= limit and info.is_main:
        say(f"qkv train: the run is already at update {step} (max_steps {limit})")

    # -- the final model: averaged when that validates better, decoding chosen on valid -----------
    final_model: Path | None = None
    trained = step > start_step
    have_final = (out / "final" / "manifest.json").is_file()
    if info.is_main and state["best_step"] is not None and (trained or not have_final):
        final_model = _finish(
            out,
            ckroot,
            model,
            model_config,
            run_cfg,
            config,
            data,
            state,
            bleu_pairs,
            bleu_refs,
            device,
            say,
            time_left=budget_s - (time.monotonic() - t_start),
            eval_cost=clock.eval_cost(0.0) if clock.evals else 0.0,
        )
    elif info.is_main and have_final:  # nothing trained: the final model stands
        final_model = out / "final"
        try:
            meta = json.loads((final_model / "trainer.json").read_text(encoding="utf-8"))
            state["final_bleu"] = meta.get("valid_bleu")
            state["decoding"] = json.loads(
                (final_model / "decoding.json").read_text(encoding="utf-8")
            )
        except (OSError, ValueError):
            pass
    D.barrier()

    minutes = (time.monotonic() - t_start) / 60
    if writer is not None:
        writer.close()
    best = best_checkpoint(ckroot) if info.is_main else None
    if info.is_main:
        say(
            f"qkv train: stopped ({stopped}) at update {step} after {minutes:.1f} min; best "
            f"valid BLEU {state['best_bleu'] if state['best_bleu'] is None else round(state['best_bleu'], 2)}"
            f" at update {state['best_step']}; checkpoints in {ckroot}"
            + (f"; the model to use: {final_model}" if final_model is not None else "")
        )
    return TrainResult(
        out=out,
        step=step,
        stopped=stopped,
        best_bleu=state["best_bleu"],
        best_step=state["best_step"],
        last_checkpoint=last_ckpt,
        best_checkpoint=best,
        resumed_from=start_step if ckpt is not None else None,
        minutes=minutes,
        history=list(state["history"]),
        final_model=final_model,
        final_bleu=state.get("final_bleu"),
        decoding=state.get("decoding"),
    )
