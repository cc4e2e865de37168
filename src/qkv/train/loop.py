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

Around the loop: one trainer per run folder (:mod:`qkv.train.runlock`, taken before any data is
read), SIGINT/SIGTERM finish the update and save before stopping (:mod:`qkv.train.interrupt`),
and every message goes through :mod:`logging` (logger ``qkv.train.loop``); the progress line
is the only thing written to the stream directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import random
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._deps import require
from ..data import (
    Batch,
    Normalizer,
    Split,
    TokenBatcher,
    Tokenizer,
    encode_pairs,
    load_tokenizers,
    save_tokenizers,
    split_pairs,
)
from ..inference import (
    CANDIDATES,
    Decoding,
    Evaluation,
    corpus_scores,
    decode_texts,
    load_model,
    position_limits,
)
from ..inference.limits import SETTING as POSITION_SETTING
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
    load_model_weights,
    prune_checkpoints,
    read_json,
    read_weights,
    remove_stale_temporaries,
    resume_checkpoint,
    run_lock_in_use,
    save_checkpoint,
    write_model_folder,
)
from .config import RESUMABLE_KEYS, TrainConfig
from .interrupt import StopSignals, TrainingInterrupted, resume_command
from .losses import sequence_loss
from .presets import resolve_config
from .run_data import (
    RunData,
    load_run_data,
    raw_run_pairs,
    read_run_pairs,
    saved_run_pairs,
)
from .runlock import RunLock, RunLockedError, check_out
from .schedules import Schedule

__all__ = [
    "RunData",
    "StepStats",
    "TrainResult",
    "TrainingError",
    "TrainingInterrupted",
    "load_run_data",
    "make_optimizer",
    "raw_run_pairs",
    "saved_run_pairs",
    "train",
    "train_update",
]

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN or infinite)."""


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
    decoding: Decoding | None = None,
    *,
    references: Sequence[str] | None = None,
) -> Evaluation:
    """sacreBLEU (and chrF) of ``model``'s translations of the normalised sources of ``pairs``.

    ``references`` are the raw reference texts (what sacreBLEU scores against); None scores
    against the normalised targets of ``pairs``. A run validates with ``decoding``'s
    ``output_len_cap`` set to its ``max_len`` (its model never saw longer targets), so an
    untrained model's validation does not decode every sentence to ``2 * source + 10`` tokens.
    The translations are decoded by :func:`qkv.inference.decode_texts`, as
    :class:`qkv.translate.Translator` decodes them, with its position-limit policy (a source
    longer than a learned table gets an empty hypothesis, never a crash in the middle of a
    run; nothing is logged: the run said before its first update what its table cannot hold).
    """
    hyps = decode_texts(
        model,
        [s for s, _ in pairs],
        src_tok,
        tgt_tok,
        decoding,
        device=device,
        pre_normalized=True,
        warn=False,
    )
    refs = list(references) if references is not None else [t for _, t in pairs]
    return corpus_scores([tgt_tok.decode(ids) for ids in hyps], refs)


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
    ``log_every`` updates; on stderr (rank 0 only). Messages are not its business: they go
    through :mod:`logging`, and :meth:`clear` wipes the line on a terminal first so that a
    message never lands in the middle of it."""

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
            self.clear()
            self.stream.write(line + "\n")
            self.stream.flush()

    def clear(self) -> None:
        """Wipe the line drawn in place (a terminal), so that what comes next starts clean."""
        if self._open:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._open = False


class _MessageHandler(logging.StreamHandler):
    """Shows qkv's log records on the progress stream, the progress line wiped first."""

    def __init__(self, bar: Progress) -> None:
        super().__init__(bar.stream)
        self.bar = bar
        self.setFormatter(logging.Formatter("qkv: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.bar.clear()
        super().emit(record)


@contextlib.contextmanager
def _messages_on(bar: Progress, *, stream_given: bool) -> Iterator[None]:
    """While a run shows progress, show its messages (INFO and up) on the progress stream too:
    when a ``stream`` was given, or when logging is not configured at all (no handler on the
    ``qkv`` logger or above it). A configured application gets them through its own handlers;
    a ``qkv`` logger set to a level is obeyed."""
    top = logging.getLogger("qkv")
    if not bar.enabled or (not stream_given and top.hasHandlers()):
        yield
        return
    handler, level = _MessageHandler(bar), top.level
    top.addHandler(handler)
    if level == logging.NOTSET:
        top.setLevel(logging.INFO)
    try:
        yield
    finally:
        top.removeHandler(handler)
        top.setLevel(level)


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
    decoding: Decoding | None = None


def _infinite(batcher: TokenBatcher) -> Iterator[Batch]:
    while True:
        yield from batcher


def _repair_best_pointer(ckroot: Path, state: RunState) -> None:
    """Make ``best.json`` name the run state's best checkpoint: a crash right after a
    checkpoint's rename, before its ``best.json`` write, leaves the pointer stale."""
    best_step = state.best_step
    if best_step is None:
        return
    name = f"step-{int(best_step):08d}"
    if not (ckroot / name / "manifest.json").is_file():
        return
    current = best_checkpoint(ckroot)
    if current is None or current.name != name:
        atomic_write_json(
            ckroot / "best.json", {"step": int(best_step), "path": name, "bleu": state.best_bleu}
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
    state: RunState,
    pairs: Sequence[tuple[str, str]],
    refs: Sequence[str],
    device: torch.device,
    say: Any,
    time_left: float = math.inf,
    eval_cost: float = 0.0,
) -> tuple[Path, float, Decoding]:
    """Write ``OUT/final``: the best checkpoint's weights, or the average of the newest
    ``average_last`` checkpoints when it validates better, with the decoding (greedy, or beam 4
    with a length penalty) that validates best. Returns the folder, its validation BLEU and
    the decoding."""
    t0 = time.monotonic()
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer

    base = Decoding(output_len_cap=run_cfg.max_len)

    def score(decoding: Decoding) -> Any:
        return validation_bleu(model, pairs, src_tok, tgt_tok, device, decoding, references=refs)

    best_dir = ckroot / f"step-{int(state.best_step):08d}"
    weights = read_weights(best_dir)
    bleu = float(state.best_bleu)
    source: dict[str, Any] = {"kind": "best checkpoint", "steps": [int(state.best_step)]}
    found = find_checkpoints(ckroot)
    # the newest checkpoints only (pruning keeps keep_last of them, and the best)
    n_avg = min(run_cfg.average_last, run_cfg.keep_last)
    last = found[-n_avg:] if n_avg >= 2 else []
    # a timed run does only what its budget has room for (beam search costs ~2 validations)
    deadline = time.monotonic() + time_left
    if len(last) >= 2 and deadline - time.monotonic() < eval_cost:
        say("no time left to validate an average of the last checkpoints; skipped")
        last = []
    if len(last) >= 2:
        avg = average_weights(last)
        model.load_state_dict(avg)
        sc = score(base.replace(beam_size=run_cfg.eval_beam))  # as the checkpoints were scored
        steps = [int(p.name.split("-")[1]) for p in last]
        better = sc.bleu > bleu
        say(
            f"average of the checkpoints of updates {steps}: valid BLEU {sc.bleu:.2f} "
            f"({'better than' if better else 'not better than'} the best checkpoint's {bleu:.2f})"
        )
        if better:
            weights, bleu = avg, float(sc.bleu)
            source = {"kind": "average", "steps": steps}
    model.load_state_dict(weights)
    decoding = Decoding()
    tune = run_cfg.tune_decoding
    if tune and deadline - time.monotonic() < 5 * eval_cost:
        say("no time left to choose a beam on the validation split; greedy decoding kept")
        tune = False
    if tune:
        tried = []
        best_bleu = -math.inf
        for candidate in CANDIDATES:  # scored as the checkpoints were: capped at max_len
            sc = score(dataclasses.replace(candidate, output_len_cap=base.output_len_cap))
            tried.append(f"{candidate.describe()}: {sc.bleu:.2f}")
            if sc.bleu > best_bleu:
                best_bleu, decoding = float(sc.bleu), candidate
        bleu = best_bleu
        say(f"decoding chosen on validation: {decoding.describe()} (tried: {', '.join(tried)})")
    decoding = decoding.replace(chosen_on=f"{len(pairs)} validation sentences, BLEU {bleu:.2f}")
    folder = write_model_folder(
        out / "final",
        step=int(state.step),
        state_dict=model.state_dict(),
        model_config=model_config.to_dict(),
        write_tokenizers=lambda d: save_tokenizers(d, src_tok, tgt_tok),
        documents={
            "train.json": user_cfg.to_dict(),
            "split.json": data.split.to_dict(),
            "trainer.json": {
                "step": int(state.step),
                "weights": source,
                "valid_bleu": bleu,
                "resolved_config": run_cfg.to_dict(),
                "preset": state.preset,
                "history": state.history,
            },
            "decoding.json": decoding.to_dict(),
        },
        in_use=run_lock_in_use(out),
        remedy=f"then finish the run: {resume_command(out)}",
    )
    say(
        f"final model ({source['kind']} of updates {source['steps']}, "
        f"{decoding.describe()}) valid BLEU {bleu:.2f} in "
        f"{folder} ({time.monotonic() - t0:.1f} s)"
    )
    return folder, bleu, decoding


def _needs(config: TrainConfig) -> list[str]:
    """The optional modules a run of ``config`` imports: checkpoints (safetensors), validation
    BLEU (sacreBLEU), a subword tokenizer (sentencepiece, the automatic choice for a user's
    data), TensorBoard when asked for."""
    modules = ["safetensors", "sacrebleu"]
    if config.tokenizer == "sentencepiece" or (
        config.tokenizer == "auto" and config.data is not None
    ):
        modules.append("sentencepiece")
    if config.tensorboard:
        modules.append("tensorboard")
    return modules


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    resume_from: int | str | Path | None = None,
    init_from: str | Path | None = None,
    progress: bool = True,
    stream: Any = None,
) -> TrainResult:
    """Train a translation model as ``config`` says, writing into ``out``.

    Before anything is read, ``out`` is checked (a folder this process can write) and locked
    (``out/.lock``: one trainer per run folder). SIGINT and SIGTERM (in the main thread) finish
    the current update, write a checkpoint and raise :class:`TrainingInterrupted`; a second
    one stops at once. Messages go through :mod:`logging` (logger ``qkv.train.loop``, INFO;
    WARNING for what a user must see).

    Args:
        config: the run's settings.
        out: the run folder (checkpoints go to ``out/checkpoints``).
        resume: continue from the newest intact checkpoint in ``out`` (a fresh start when
            there is none; a damaged newer one is skipped with a warning and set aside, see
            :func:`~qkv.train.checkpoint.resume_checkpoint`). The settings must match the
            checkpoint's except :data:`RESUMABLE_KEYS`.
        resume_from: resume from this checkpoint instead (implies ``resume``): an update
            number, or a checkpoint folder of ``out``; the newer ones are set aside.
        init_from: start a new run (update 0, a fresh optimizer and schedule) from the weights
            of a saved model: a run folder, its ``final/``, or a checkpoint folder (see
            :func:`qkv.inference.resolve_model_dir`). Its architecture and tokenizers are kept
            (fine-tuning keeps the vocabulary): ``config`` may not set other model options
            than ``dropout``, nor another vocabulary. Not with ``resume``.
        progress: show the progress line on ``stream`` (rank 0 only), and the messages as well
            when a ``stream`` is given or logging is not configured; False shows nothing but
            what logging shows (warnings, when it is not configured).
        stream: where progress goes (stderr by default).

    Returns:
        A :class:`TrainResult`.

    Raises:
        ValueError: bad settings or data; ``out`` is not a writable folder, or already holds a
            run and ``resume`` is False; ``init_from`` with ``resume``, or settings that
            contradict the ``init_from`` model.
        RunLockedError: another process trains into ``out``.
        CheckpointError: the checkpoint to resume from (or the ``init_from`` model) is corrupt
            or foreign, or every checkpoint is; ``resume_from`` names no checkpoint of ``out``.
        TrainingError: the loss became non-finite.
        TrainingInterrupted: SIGINT or SIGTERM stopped the run (a checkpoint was written).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config: expected a TrainConfig, got {type(config).__name__}")
    require("training", _needs(config))  # before anything is read or written
    config.validate()
    if init_from is not None and (resume or resume_from is not None):
        raise ValueError(
            "init_from: a resumed run continues its own checkpoint; starting from another "
            "model's weights is a new run (drop resume, or init_from)"
        )
    out = Path(out)
    ckroot = out / "checkpoints"
    # what to resume: nothing (False), the newest intact checkpoint (True), or the one named
    which = bool(resume) if resume_from is None else resume_from
    info = D.setup(config.device, timeout_minutes=config.dist_timeout_minutes)
    bar = Progress(config.step_limit, progress and info.is_main, stream)
    run = None
    threads = torch.get_num_threads()  # config.threads is the run's, not the process's
    try:
        with _messages_on(bar, stream_given=stream is not None), _lock_run(out, info):
            run = _Run(config, out, ckroot, info, which, bar, init_from)
            with StopSignals(run.stop_now) as signals:
                run.signals = signals
                run.prepare()
                return run.run()
    finally:
        if run is not None:
            run.close()
        D.cleanup()
        torch.set_num_threads(threads)


def _lock_run(out: Path, info: D.DistInfo) -> contextlib.AbstractContextManager:
    """Check ``out`` and take its lock (rank 0; the other ranks raise rank 0's error too)."""
    lock, err = None, None
    if info.is_main:
        try:
            lock = RunLock(out, created_out=check_out(out))
            lock.acquire()
        except (ValueError, RunLockedError) as e:
            err = e
            if lock is not None and lock.created_out:
                with contextlib.suppress(OSError):
                    out.rmdir()
            lock = None
    D.raise_main_error(err)
    return lock if lock is not None else contextlib.nullcontext()


@dataclass
class RunState:
    """What the loop keeps between updates, saved in every checkpoint's ``trainer.json`` and
    restored on resume (with the data position, which the batcher keeps).

    Attributes:
        step: updates done.
        best_bleu, best_step: the best validation BLEU so far and its update.
        evals_since_best: scheduled evaluations since the best scheduled one (patience).
        grid_best_bleu: the best BLEU of the scheduled evaluations (patience compares to it).
        target_tokens: target tokens trained on.
        history: the logged training and validation figures.
        loss_window: losses of the updates since the last progress line (a resumed run logs
            the same means).
        stopped: ``"early_stopping"`` once patience ran out, ``"max_minutes"`` once the budget
            did: resuming with the same settings then does nothing.
        last_eval, last_save: the updates of the last scheduled evaluation and checkpoint
            (automatic cadence).
        resolved_config: the run's settings after the preset filled them in.
        preset: what the preset chose and why.
        train_seconds: seconds of the run's earlier invocations (``max_minutes`` is the whole
            run's budget).
        init_from: the model a fine-tuning run started from (``path`` and ``step``), or None.
    """

    step: int = 0
    best_bleu: float | None = None
    best_step: int | None = None
    evals_since_best: int = 0
    grid_best_bleu: float | None = None
    target_tokens: int = 0
    history: list[dict] = field(default_factory=list)
    loss_window: list[float] = field(default_factory=list)
    stopped: str | None = None
    last_eval: int = 0
    last_save: int = 0
    resolved_config: dict = field(default_factory=dict)
    preset: dict | None = None
    train_seconds: float = 0.0
    init_from: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready fields (what ``trainer.json`` holds besides the data position)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def restore(self, saved: dict[str, Any]) -> None:
        """Take every field ``saved`` (a checkpoint's ``trainer.json``) holds."""
        for f in dataclasses.fields(self):
            if f.name in saved:
                setattr(self, f.name, saved[f.name])
        if "grid_best_bleu" not in saved:  # written before it was kept apart
            self.grid_best_bleu = self.best_bleu


@dataclass
class _Model:
    """What the run trains and with what: built fresh, or restored from a checkpoint."""

    data: RunData
    model_config: Any
    model: EncoderDecoder
    batcher: TokenBatcher
    valid_batches: TokenBatcher
    bleu_pairs: list[tuple[str, str]]
    bleu_refs: list[str]
    optimizer: torch.optim.Optimizer
    schedule: Schedule


#: the model options a run started from another model's weights may change
_INIT_MAY_CHANGE = frozenset({"dropout"})


@dataclass
class _Init:
    """The saved model a new run starts from (``init_from``): its weights, architecture and
    tokenizers."""

    folder: Path
    step: int | None
    model_config: dict[str, Any]
    weights: dict[str, torch.Tensor]
    tokenizers: tuple[Tokenizer, Tokenizer]

    def describe(self) -> str:
        return str(self.folder) + (f" (update {self.step})" if self.step is not None else "")

    def record(self) -> dict[str, Any]:
        return {"path": str(self.folder), "step": self.step}

    def settings(self, config: TrainConfig) -> TrainConfig:
        """``config`` with this model's architecture and vocabulary.

        Raises:
            ValueError: ``config`` asks for another architecture or vocabulary (every
                difference listed), before any data is read.
        """
        mc, (src, tgt) = self.model_config, self.tokenizers
        own = {k: v for k, v in mc.items() if k not in ("src_vocab_size", "tgt_vocab_size", "kind")}
        joint = src is tgt
        norm = {Normalizer.book(): "book", Normalizer(): "plain"}.get(src.normalizer)
        conflicts = []
        # TrainConfig's default kind cannot be told from a choice: only another kind conflicts
        default_kind = TrainConfig.__dataclass_fields__["model"].default
        if config.model not in (mc["kind"], default_kind):
            conflicts.append(f"model: the model's {mc['kind']!r}, given {config.model!r}")
        conflicts += [
            f"model.{k}: the model's {own.get(k)!r}, given {v!r}"
            for k, v in sorted(config.model_options.items())
            if k not in _INIT_MAY_CHANGE and own.get(k) != v
        ]
        for key, given, theirs, unset in (
            ("tokenizer", config.tokenizer, src.kind, "auto"),
            ("normalizer", config.normalizer, norm, "auto"),
            ("joint_vocab", config.joint_vocab, joint, None),
            ("vocab_size", config.vocab_size, tgt.vocab_size, None),
        ):
            if given != unset and theirs is not None and given != theirs:
                conflicts.append(f"{key}: the model's {theirs!r}, given {given!r}")
        if conflicts:
            raise ValueError(
                f"init_from: the model in {str(self.folder)!r} fixes the architecture and the "
                f"vocabulary, and these settings differ: {'; '.join(conflicts)} (leave them "
                f"out; of the model options only {', '.join(sorted(_INIT_MAY_CHANGE))} may change)"
            )
        options = {**own, **{k: v for k, v in config.model_options.items() if k in own}}
        changes: dict[str, Any] = {
            "model": mc["kind"],
            "model_options": options,
            "tokenizer": src.kind,
            "joint_vocab": joint,
        }
        if norm is not None:
            changes["normalizer"] = norm
        return config.updated(changes)

    def load_into(self, model: nn.Module) -> None:
        """Copy the weights into ``model`` (built from :meth:`settings`' configuration)."""
        try:
            model.load_state_dict(self.weights)
        except RuntimeError as e:  # pragma: no cover - settings() keeps the shapes equal
            raise CheckpointError(
                f"init_from: the weights in {str(self.folder)!r} do not fit the model: {e}"
            ) from None


def _load_init(path: str | Path) -> _Init:
    """Read the model a run starts from (:func:`qkv.inference.load_model`, verified).

    Raises:
        CheckpointError: nothing usable there (the message names ``init_from``).
    """
    try:
        saved = load_model(path, device="cpu")
        manifest = json.loads((saved.path / "manifest.json").read_text(encoding="utf-8"))
    except (CheckpointError, OSError, ValueError) as e:
        text = str(e)
        for label in ("model dir: ", "checkpoint: "):  # init_from names it
            text = text.removeprefix(label)
        raise CheckpointError(f"init_from: {text}") from None
    step = manifest.get("step") if isinstance(manifest, dict) else None
    return _Init(
        folder=saved.path,
        step=step if isinstance(step, int) else None,
        model_config=saved.model.config.to_dict(),
        weights=saved.model.state_dict(),
        tokenizers=(saved.src_tokenizer, saved.tgt_tokenizer),
    )


class _Run:
    """One invocation of ``qkv train``, in phases a reader can find:

    * :meth:`_open` (where we start: a checkpoint to resume, or none), :meth:`_build` (data,
      model, batches, optimizer, schedule) and :meth:`_restore` (their state, the RNGs and the
      :class:`RunState` from the checkpoint);
    * then per update: :meth:`_step` (one optimizer update), :meth:`_replan` and :meth:`_log`,
      :meth:`_out_of_time` (the stop decision all ranks agree on), :meth:`_evaluate_if_due`
      (validation and early stopping) and :meth:`_checkpoint_if_due`;
    * and at the end :meth:`_final_model` (averaging, decoding chosen) and the result.

    A signal (:class:`StopSignals`) stops it between updates (:meth:`_stop_for_signal`) or at
    once (:meth:`stop_now`).
    """

    def __init__(
        self,
        config: TrainConfig,
        out: Path,
        ckroot: Path,
        info: D.DistInfo,
        resume: bool | int | str | Path,
        bar: Progress,
        init_from: str | Path | None = None,
    ) -> None:
        self.t_start = time.monotonic()
        self.out, self.ckroot, self.info, self.device = out, ckroot, info, info.device
        self.user_config, self.resume, self.init_from = config, resume, init_from
        self.bar = bar
        self.signals: StopSignals | None = None
        self.stop_signal: int | None = None  # a signal all ranks agreed to stop for
        self.writer: Any = None
        self.state: RunState | None = None
        self.ckpt: LoadedCheckpoint | None = None
        self.last_ckpt: Path | None = None
        self.saved_step: int | None = None
        self.start_step: int | None = None  # set once the run is ready (_restore)

    def say(self, text: str, level: int = logging.INFO) -> None:
        """Log a message of the run (rank 0 only), the progress line wiped first."""
        if self.info.is_main:
            self.bar.clear()
            log.log(level, text)

    def prepare(self) -> None:
        """Everything before the first update: the checkpoint or model to start from, the
        data, the model, the optimizer and their restored state."""
        config = self.user_config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config, self.ckpt, self.saved = self._open(config, self.resume)
        self.init = _load_init(self.init_from) if self.init_from is not None else None
        self.run_cfg, self.preset_info, data = self._settings_and_data()
        self.timed = self.run_cfg.max_minutes is not None
        self.limit = self.run_cfg.step_limit
        self.plan = _Plan(self.run_cfg, self.timed)
        self.m = self._build(data)
        self.state = RunState(
            resolved_config=self.run_cfg.to_dict(),
            preset=self.preset_info,
            init_from=self.init.record() if self.init is not None else None,
        )
        # the loop's own state (not saved): set by _restore
        self.final_bleu: float | None = None
        self.decoding: Decoding | None = None
        self._restore()

    # -- where we start -------------------------------------------------------------------------
    def _open(
        self, config: TrainConfig, resume: bool | int | str | Path
    ) -> tuple[TrainConfig, LoadedCheckpoint | None, TrainConfig | None]:
        """The settings, and the checkpoint to resume from (with its saved settings), if any."""
        if config.data is not None:
            config = config.updated({"data": str(Path(config.data).resolve())})
        if self.info.is_main:
            remove_stale_temporaries(self.ckroot)
        D.barrier()
        latest = latest_checkpoint(self.ckroot)
        if latest is not None and resume is False:
            raise ValueError(
                f"out: {str(self.out)!r} already holds a run (checkpoint {latest.name}); pass "
                "--resume to continue it, or choose another --out"
            )
        # resume: True (the newest intact checkpoint), or the update/folder to resume from
        ckpt = None
        if resume is not False:
            chosen = None if resume is True else resume
            ckpt = resume_checkpoint(self.ckroot, chosen, act=self.info.is_main)
        if ckpt is not None:
            try:
                saved = TrainConfig.from_dict(ckpt.train_config)
            except (TypeError, ValueError) as e:
                raise CheckpointError(
                    f"checkpoint: train.json in {str(ckpt.path)!r} is invalid: {e}"
                ) from None
            return _check_resume_config(saved, config), ckpt, saved
        if resume:
            self.say(f"nothing to resume in {self.out}; starting a new run")
        return config, None, None

    # -- data, the run's plan, the model ----------------------------------------------------------
    def _settings_and_data(self) -> tuple[TrainConfig, dict | None, RunData]:
        """The resolved settings (a preset's choices filled in), the preset's reasons, and the
        run's data: the checkpoint's for a resumed run."""
        config, ckpt, info = self.config, self.ckpt, self.info
        if ckpt is not None:
            return self._resumed_data(ckpt)
        if self.init is not None:  # checked before the data is read
            config = self.init.settings(config)
        pairs, source = read_run_pairs(config)
        split = split_pairs(pairs, valid=config.valid, test=config.test, seed=config.split_seed)
        n_train = len(split.train)
        if n_train < 1:
            raise ValueError(
                f"data: {source} gives no training pairs after the split ({len(pairs)} pairs "
                f"read); expected more data, or smaller valid/test sizes"
            )
        run_cfg, preset = resolve_config(
            config, n_train, device=self.device.type, world_size=info.world_size
        )
        preset_info = preset.to_dict() if preset is not None else None
        if self.init is not None and preset_info is not None:  # the model is not the preset's
            preset_info["reason"] = (
                f"preset {preset.name} for the batches and the learning rate: "
                f"{run_cfg.max_tokens} tokens per batch, peak lr {run_cfg.lr:g}"
            )
            preset_info["notes"] = []
        toks = self.init.tokenizers if self.init is not None else None
        data = load_run_data(run_cfg, split=split, pairs=(pairs, source), tokenizers=toks)
        return run_cfg, preset_info, data

    @staticmethod
    def _length_limit(model: nn.Module, max_len: int) -> tuple[int, str]:
        """The longest pair (in tokens, ``<eos>`` counted) the run trains on: ``max_len``, or
        the model's learned positional table when it is smaller (pairs longer than it could
        not be encoded: dropped before the first update, and counted), with its name."""
        table = min((n for n in position_limits(model) if n is not None), default=None)
        if table is not None and table < max_len:
            return table, f"the model's learned positions ({POSITION_SETTING}={table})"
        return max_len, f"max_len={max_len}"

    def _build(self, data: RunData) -> _Model:
        """The model (the checkpoint's weights when resuming), the batches, the optimizer and
        the schedule, in the order that draws the same random numbers on every start."""
        run_cfg, ckpt, info = self.run_cfg, self.ckpt, self.info
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
        elif self.init is not None:
            self.init.load_into(model)
        model.to(self.device)
        src_ids, tgt_ids = encode_pairs(data.train, src_tok, tgt_tok, pre_normalized=True)
        if run_cfg.max_tokens is None:  # pragma: no cover - resolve_config always sets it
            raise ValueError("max_tokens: expected a resolved token budget, got None")
        limit, why = self._length_limit(model, run_cfg.max_len)
        kept = sum(1 for a, b in zip(src_ids, tgt_ids) if max(len(a), len(b)) + 1 <= limit)
        if kept == 0:
            raise ValueError(
                f"data: every one of the {len(data.train)} training pairs is longer than "
                f"{why} ({limit} tokens with <eos>); nothing to train on: raise it "
                f"({'--set max_len=N' if limit == run_cfg.max_len else '--set ' + POSITION_SETTING + '=N, or another pos_encoding'}) "
                "or check the data"
            )  # fmt: skip
        batcher = TokenBatcher(
            src_ids,
            tgt_ids,
            max_tokens=run_cfg.max_tokens,
            max_len=limit,
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
            max_len=max(limit, 2),
            truncate=True,
        )
        n_bleu = run_cfg.eval_sentences or len(data.valid)
        optimizer = make_optimizer(model, run_cfg)
        limit, timed = self.limit, self.timed
        schedule = Schedule(
            optimizer,
            peak_lr=run_cfg.lr,
            kind=run_cfg.schedule,
            warmup_steps=self.plan.warmup(min(limit, _FIRST_GUESS) if timed else limit),
            total_steps=min(limit, _FIRST_GUESS) if timed else limit,
            min_lr_ratio=run_cfg.min_lr_ratio,
        )
        return _Model(
            data=data,
            model_config=model_config,
            model=model,
            batcher=batcher,
            valid_batches=valid_batches,
            bleu_pairs=data.valid[:n_bleu],
            bleu_refs=data.raw_valid[:n_bleu],
            optimizer=optimizer,
            schedule=schedule,
        )

    def _resumed_data(self, ckpt: LoadedCheckpoint) -> tuple[TrainConfig, dict | None, RunData]:
        """A resumed run's resolved settings, preset and data (its saved split and tokenizers)."""
        try:
            split = Split.from_dict(ckpt.split)
            toks = load_tokenizers(ckpt.path / "tokenizers")
        except (ValueError, KeyError, OSError) as e:
            raise CheckpointError(f"checkpoint: {str(ckpt.path)!r} is unusable: {e}") from None
        resolved = ckpt.trainer_state.get("resolved_config")
        saved = self.saved
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
        run_cfg = run_cfg.updated({k: getattr(self.config, k) for k in sorted(RESUMABLE_KEYS)})
        data = load_run_data(run_cfg, split=split, tokenizers=toks)
        return run_cfg, ckpt.trainer_state.get("preset"), data

    # -- restore ----------------------------------------------------------------------------------
    def _restore(self) -> None:
        """Put the checkpoint's optimizer, schedule, data position, RNGs and run state back (or
        seed a fresh run's dropout), decide whether a resumed run has nothing left to do, and
        set up the clock, the DDP wrapper, TensorBoard and the first messages."""
        ckpt, info, state, m = self.ckpt, self.info, self.state, self.m
        if ckpt is not None:
            tensors = ckpt.tensors or {}
            try:
                m.optimizer.load_state_dict(tensors["optimizer"])
                m.schedule.load_state_dict(tensors["schedule"])
                rngs = tensors["rng"]
                m.batcher.load_state_dict(ckpt.trainer_state["data"])
            except (KeyError, ValueError, TypeError, RuntimeError) as e:
                raise CheckpointError(
                    f"checkpoint: the training state in {str(ckpt.path)!r} cannot be restored: {e}"
                ) from None
            if len(rngs) != info.world_size:
                raise CheckpointError(
                    f"checkpoint: {str(ckpt.path)!r} was written by {len(rngs)} processes; resume "
                    f"it with the same number (this run has {info.world_size})"
                )
            _set_rng_state(rngs[info.rank], self.device)
            state.restore(ckpt.trainer_state)
            state.resolved_config = self.run_cfg.to_dict()
            if info.is_main:
                _repair_best_pointer(self.ckroot, state)
        else:
            # dropout differs per rank; the weights were drawn from config.seed on every rank
            torch.manual_seed(self.run_cfg.seed * 1009 + 1 + info.rank)
        self.start_step = int(state.step)
        self.already_stopped = self._stopped_before()
        resumed_stop = state.stopped if self.already_stopped else None
        if not self.already_stopped:
            state.stopped = None
        if self.start_step != m.schedule.last_step:
            raise CheckpointError(
                f"checkpoint: inconsistent state (step {self.start_step}, schedule "
                f"{m.schedule.last_step})"
            )
        if not self.timed and m.schedule.kind != "inverse_sqrt":
            # an update-bounded run ends at max_steps (which a resumed run may have changed)
            m.schedule.plan(total_steps=self.limit, warmup_steps=self.plan.warmup(self.limit))

        self.wrapped: nn.Module = m.model
        if info.distributed:
            self.wrapped = nn.parallel.DistributedDataParallel(
                m.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        if self.run_cfg.tensorboard and info.is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError(
                    "tensorboard=true needs the tensorboard package: pip install tensorboard"
                ) from None
            # events a killed or stopped invocation logged after this checkpoint are purged
            purge = self.start_step + 1 if ckpt is not None else None
            self.writer = SummaryWriter(str(self.out / "tensorboard"), purge_step=purge)
        if info.is_main:
            self._greet()

        self.stream_of_batches = _infinite(m.batcher)
        self.last_ckpt: Path | None = ckpt.path if ckpt else None
        self.saved_step: int | None = self.start_step if ckpt else None  # known on every rank
        self.stopped = resumed_stop or "max_steps"
        self.window_tokens, self.window_t0 = 0, time.monotonic()
        self.seconds_before = float(state.train_seconds or 0.0)
        self.budget_s = (
            self.run_cfg.max_minutes * 60 - self.seconds_before if self.timed else math.inf
        )
        if self.timed and self.budget_s <= 0 and not self.already_stopped:
            self.already_stopped, self.stopped = True, "max_minutes"
        if self.already_stopped and self.stopped == "max_minutes" and info.is_main:
            self.say(
                f"the run has used its {self.run_cfg.max_minutes:g}-minute budget "
                f"({self.seconds_before / 60:.1f} min of training); a larger --max-minutes goes on"
            )
        self.clock = _Clock(self.t_start)
        m.model.train()
        if self.already_stopped and self.stopped == "early_stopping" and info.is_main:
            self.say(
                f"the run already stopped early at update {state.step} (patience "
                f"{self.run_cfg.patience}); nothing to do (a larger --patience or --max-steps "
                "goes on)"
            )

    def _stopped_before(self) -> bool:
        """Did the resumed run stop for a reason that still holds with these settings?"""
        if self.ckpt is None or self.saved is None:
            return False
        saved, config, stopped = self.saved, self.config, self.state.stopped
        return (
            stopped == "early_stopping"
            and saved.patience == config.patience
            and saved.max_steps == config.max_steps
        ) or (  # a run that used its time budget (the final evaluation and averaging included)
            stopped == "max_minutes" and saved.max_minutes == config.max_minutes
        )

    def _greet(self) -> None:
        run_cfg, info, data, ckpt = self.run_cfg, self.info, self.m.data, self.ckpt
        src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
        n_params = sum(p.numel() for p in self.m.model.parameters())
        self.out.mkdir(parents=True, exist_ok=True)
        what = f"resumed at update {self.start_step} from {ckpt.path}" if ckpt else "new run"
        if self.init is not None:
            what += f" from the weights of {self.init.describe()}"
        self.say(
            f"{what}; {run_cfg.model} model, {n_params / 1e6:.2f}M parameters, "
            f"{len(data.train)} training pairs ({self.m.batcher.n_dropped} longer than "
            f"{self._length_limit(self.m.model, run_cfg.max_len)[1]} dropped), "
            f"{len(data.valid)} valid, {len(data.test)} test, "
            f"{run_cfg.tokenizer} vocab {src_tok.vocab_size}/{tgt_tok.vocab_size}"
            f"{' (joint)' if src_tok is tgt_tok else ''}, {run_cfg.normalizer} text; "
            f"device {self.device}"
            + (f", {info.world_size} processes ({info.backend})" if info.distributed else "")
            + f", {torch.get_num_threads()} threads"
        )
        if self.preset_info is not None and ckpt is None:
            self.say(self.preset_info["reason"])
            for note in self.preset_info.get("notes", []):
                self.say(f"note: {note}")
        self.say(self.plan.describe(self.m.schedule))

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Update until the plan, the clock or patience says stop; then the final model.

        A first SIGINT/SIGTERM lets the current update finish (with its scheduled evaluation
        and checkpoint), then a checkpoint is written and :class:`TrainingInterrupted` raised."""
        if self.signals is not None:
            self.signals.graceful = True
        while self.state.step < self.limit and not self.already_stopped:
            stats = self._step()
            elapsed = time.monotonic() - self.t_start
            self._replan(elapsed)
            self._log(stats, elapsed)
            final = self._out_of_time(elapsed)
            evaluated, final = self._evaluate_if_due(final)
            self._checkpoint_if_due(evaluated, final)
            if self.stop_signal is not None:
                self._stop_for_signal()
            if final:
                break
        if self.signals is not None:
            self.signals.graceful = False  # from here on a signal stops at once
            if self.signals.received is not None:  # it came after the last update's check
                self.stop_now(self.signals.received)
        if self.state.step >= self.limit and self.start_step >= self.limit and self.info.is_main:
            self.say(f"the run is already at update {self.state.step} (max_steps {self.limit})")
        final_model = self._final_model()
        return self._result(final_model)

    def _step(self) -> StepStats:
        """One optimizer update over ``accum_steps`` micro-batches (:func:`train_update`)."""
        micro = [next(self.stream_of_batches) for _ in range(self.run_cfg.accum_steps)]
        try:
            stats = train_update(
                self.wrapped,
                self.m.optimizer,
                self.m.schedule,
                micro,
                label_smoothing=self.run_cfg.label_smoothing,
                clip_norm=self.run_cfg.clip_norm,
                device=self.device,
                bf16=self.run_cfg.bf16,
                pad_id=self.m.data.tgt_tokenizer.pad_id,
            )
        except TrainingError as e:
            where = (
                f"the last checkpoint (step-{self.saved_step:08d} in {self.ckroot}) is intact"
                if self.saved_step is not None
                else "no checkpoint was written yet"
            )
            raise TrainingError(f"{e}; {where}") from None
        state = self.state
        state.step += 1
        state.target_tokens += stats.tokens
        self.window_tokens += stats.tokens
        state.loss_window.append(stats.loss)
        return stats

    def _replan(self, elapsed: float) -> None:
        """A time-bounded run re-plans its length from the measured speed (rank 0 decides)."""
        done_steps = self.state.step - self.start_step
        if not (self.timed and self.plan.due(done_steps)):
            return
        schedule, step = self.m.schedule, self.state.step
        current = schedule.total_steps or self.limit
        total = self.plan.estimate(step, done_steps, elapsed, self.budget_s, self.clock, current)
        mine = torch.tensor([float(total if self.info.is_main else 0)], device=self.device)
        total = int(D.all_reduce_sum(mine).item())
        total = max(min(total, self.limit), step)
        schedule.plan(total_steps=total, warmup_steps=self.plan.warmup(total))

    @property
    def _planned(self) -> int:
        """The update the run is planned to end at."""
        schedule = self.m.schedule
        return schedule.total_steps if self.timed and schedule.total_steps else self.limit

    def _log(self, stats: StepStats, elapsed: float) -> None:
        """The progress line, and every ``log_every`` updates the history and TensorBoard."""
        state, step, planned = self.state, self.state.step, self._planned
        self.bar.total = planned
        log_now = step % self.run_cfg.log_every == 0 or step >= planned
        eta = elapsed / (step - self.start_step) * (planned - step)
        if self.timed:
            eta = min(eta, max(self.budget_s - elapsed, 0.0))
        now = time.monotonic()
        tps = self.window_tokens / max(now - self.window_t0, 1e-9)
        if not log_now:
            self.bar.update(step, stats.loss, stats.lr, tps, elapsed, eta, False)
            return
        mean_loss = sum(state.loss_window) / len(state.loss_window)
        state.history.append(
            {"step": step, "loss": round(mean_loss, 5), "lr": stats.lr, "tok_s": round(tps)}
        )
        if self.writer is not None:
            self.writer.add_scalar("train/loss", mean_loss, step)
            self.writer.add_scalar("train/lr", stats.lr, step)
            self.writer.add_scalar("train/tokens_per_s", tps, step)
        self.bar.update(step, mean_loss, stats.lr, tps, elapsed, eta, True)
        state.loss_window, self.window_tokens, self.window_t0 = [], 0, now

    def _out_of_time(self, elapsed: float) -> bool:
        """The stop decision, agreed by all ranks: the planned end of a timed run, or its clock
        (keeping the time the final evaluation and the averaging need). Returns whether this
        update is the run's last (``max_steps`` reached, or out of time).

        A plan made from a few slow updates never ends a run early: it is re-made every 10
        updates, and the planned end counts only in the last fifth of the budget."""
        step, budget_s = self.state.step, self.budget_s
        over_time = self.timed and (
            (step >= self._planned and elapsed >= 0.8 * budget_s)
            or elapsed >= budget_s - self.plan.final_reserve(self.clock, budget_s)
        )
        got = self.signals.received if self.signals is not None else None
        flags = torch.tensor(
            [float(over_time), float(got == signal.SIGINT), float(got == signal.SIGTERM)],
            device=self.device,
        )
        over, sigint, sigterm = D.all_reduce_sum(flags).tolist()  # a signal to one rank stops all
        if sigint > 0 or sigterm > 0:
            self.stop_signal = signal.SIGTERM if sigterm > 0 else signal.SIGINT
        if over > 0 and step < self.limit:
            self.stopped = self.state.stopped = "max_minutes"
        return step >= self.limit or self.stopped != "max_steps"

    def _cadence(self) -> tuple[int, int]:
        """``(eval_every, save_every)``: the fixed ones, or the plan's."""
        eval_every = self.run_cfg.eval_every or self.plan.eval_every(self._planned)
        save_every = self.run_cfg.save_every or self.plan.save_every(self._planned, eval_every)
        return eval_every, save_every

    def _evaluate_if_due(self, final: bool) -> tuple[bool, bool]:
        """Validate when the cadence or the end says so (rank 0), and stop early when patience
        ran out (all ranks agree). Returns ``(evaluated, final)``."""
        state, step = self.state, self.state.step
        eval_every, _ = self._cadence()
        scheduled = _due(step, state.last_eval, eval_every, self.run_cfg.eval_every is not None)
        if not (scheduled or final):
            return False, final
        stop = 0.0
        if scheduled:
            state.last_eval = step
        if self.info.is_main:
            stop = self._evaluate(step, scheduled=scheduled)
            self.window_t0 = time.monotonic()  # the evaluation is not training time
        flag = D.all_reduce_sum(torch.tensor([stop], device=self.device))
        if float(flag) > 0 and not final:
            self.stopped = state.stopped = "early_stopping"
            final = True
        return True, final

    def _evaluate(self, step: int, *, scheduled: bool) -> float:
        """Validation loss and BLEU (rank 0); returns 1.0 when patience ran out.

        Patience counts only scheduled evaluations: a final one off the schedule (at
        max_steps or max_minutes) depends on where this invocation stopped, and counting it
        would make a resumed run stop at another update. It may still become the best
        checkpoint (its weights are the same in either run)."""
        t0 = time.monotonic()
        m, run_cfg, state = self.m, self.run_cfg, self.state
        vloss = validation_loss(m.model, m.valid_batches, self.device, bf16=run_cfg.bf16)
        scores = validation_bleu(
            m.model,
            m.bleu_pairs,
            m.data.src_tokenizer,
            m.data.tgt_tokenizer,
            self.device,
            Decoding(beam_size=run_cfg.eval_beam, output_len_cap=run_cfg.max_len),
            references=m.bleu_refs,
        )
        if scheduled:
            if state.grid_best_bleu is None or scores.bleu > state.grid_best_bleu:
                state.grid_best_bleu, state.evals_since_best = scores.bleu, 0
            else:
                state.evals_since_best += 1
        better = state.best_bleu is None or scores.bleu > state.best_bleu
        if better:
            state.best_bleu, state.best_step = scores.bleu, step
        state.history.append(
            {
                "step": step,
                "valid_loss": round(vloss, 5),
                "valid_bleu": round(scores.bleu, 3),
                "valid_chrf": round(scores.chrf, 3),
            }
        )
        if self.writer is not None:
            self.writer.add_scalar("valid/loss", vloss, step)
            self.writer.add_scalar("valid/bleu", scores.bleu, step)
            self.writer.add_scalar("valid/chrf", scores.chrf, step)
        took = time.monotonic() - t0
        self.clock.evals.append(took)
        self.say(
            f"valid @ {step}: loss {vloss:.3f} (ppl {math.exp(min(vloss, 50)):.2f}), "
            f"BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f} on {scores.n} sentences "
            f"({took:.1f} s)" + ("  *best*" if better else "")
        )
        out_of_patience = run_cfg.patience and state.evals_since_best >= run_cfg.patience
        return 1.0 if out_of_patience else 0.0

    def _checkpoint_if_due(self, evaluated: bool, final: bool) -> None:
        """A checkpoint after every evaluation, at the end, and every ``save_every`` updates."""
        state, step = self.state, self.state.step
        _, save_every = self._cadence()
        fixed = self.run_cfg.save_every is not None
        if evaluated or final or _due(step, state.last_save, save_every, fixed):
            state.last_save = step
            self.last_ckpt = self._checkpoint(step) or self.last_ckpt
            self.saved_step = step
            self.window_t0 = time.monotonic()

    def _checkpoint(self, step: int) -> Path | None:
        """Write checkpoint ``step`` (rank 0; every rank's RNG state gathered, the replicas
        checked to agree); returns its folder on rank 0."""
        t0 = time.monotonic()
        info, m, state = self.info, self.m, self.state
        rng_all = D.all_gather_objects(_rng_state(self.device))
        sums = D.all_gather_objects(D.param_checksum(m.model) if info.distributed else "")
        if info.distributed and len(set(sums)) != 1:
            raise TrainingError(f"the replicas diverged at update {step}: checksums {sums}")
        path = None
        state.train_seconds = round(self.seconds_before + time.monotonic() - self.t_start, 3)
        if info.is_main:
            src_tok, tgt_tok = m.data.src_tokenizer, m.data.tgt_tokenizer
            trainer_state = {
                **state.to_dict(),
                "step": step,
                "data": m.batcher.state_dict(),
                "world_size": info.world_size,
                "replica_checksums": sums if info.distributed else None,
            }
            path = save_checkpoint(
                self.ckroot,
                step,
                model=m.model,
                model_config=m.model_config.to_dict(),
                train_config=self.config.to_dict(),
                write_tokenizers=lambda d: save_tokenizers(d, src_tok, tgt_tok),
                split=m.data.split.to_dict(),
                trainer_state=trainer_state,
                tensors={
                    "optimizer": m.optimizer.state_dict(),
                    "schedule": m.schedule.state_dict(),
                    "rng": rng_all,
                },
            )
            if state.best_step == step:
                atomic_write_json(
                    self.ckroot / "best.json",
                    {"step": step, "path": path.name, "bleu": state.best_bleu},
                )
            prune_checkpoints(self.ckroot, self.run_cfg.keep_last, best_step=state.best_step)
        D.barrier()
        self.clock.saving += time.monotonic() - t0
        return path

    # -- stopped by a signal -------------------------------------------------------------------
    def _stop_for_signal(self) -> None:
        """After the update a signal interrupted: its checkpoint (unless just written), the
        line that says how to resume, and :class:`TrainingInterrupted` (every rank)."""
        step = self.state.step
        if self.saved_step != step:
            # not a scheduled checkpoint: the cadence (last_save) stays the uninterrupted run's
            self.last_ckpt = self._checkpoint(step) or self.last_ckpt
            self.saved_step = step
        name = signal.Signals(self.stop_signal).name
        text = f"stopped by {name} at update {step}; resume with: {resume_command(self.out)}"
        self.say(text, logging.WARNING)
        raise TrainingInterrupted(
            text, signum=int(self.stop_signal), step=step, checkpoint=self.last_ckpt
        )

    def stop_now(self, signum: int) -> None:
        """Stop at once (a second signal, or one outside the loop): raise
        :class:`TrainingInterrupted` naming the newest checkpoint, which ``--resume`` takes."""
        name = signal.Signals(signum).name
        if self.start_step is None:  # still preparing: nothing new to lose
            step, ckpt = 0, self.ckpt.path if self.ckpt is not None else None
            where, since = "before the first update", ""
        else:
            step, ckpt = self.state.step, self.last_ckpt
            where = f"at update {step}"
            since = f" (from update {self.saved_step})" if self.saved_step != step else ""
        if ckpt is not None or (self.saved_step is not None and not self.info.is_main):
            text = f"stopped by {name} {where}; resume with: {resume_command(self.out)}{since}"
        else:
            text = f"stopped by {name} {where}; nothing was saved"
        self.say(text, logging.WARNING)
        raise TrainingInterrupted(text, signum=signum, step=step, checkpoint=ckpt)

    def close(self) -> None:
        """Close what the run opened (TensorBoard), however it ended."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # -- the end ----------------------------------------------------------------------------------
    def _final_model(self) -> Path | None:
        """``OUT/final``: averaged when that validates better, decoding chosen on validation;
        kept as it is when nothing was trained (rank 0)."""
        state, info, out = self.state, self.info, self.out
        final_model: Path | None = None
        trained = state.step > self.start_step
        have_final = (out / "final" / "manifest.json").is_file()
        if info.is_main and state.best_step is not None and (trained or not have_final):
            m = self.m
            final_model, self.final_bleu, self.decoding = _finish(
                out,
                self.ckroot,
                m.model,
                m.model_config,
                self.run_cfg,
                self.config,
                m.data,
                state,
                m.bleu_pairs,
                m.bleu_refs,
                self.device,
                self.say,
                time_left=self.budget_s - (time.monotonic() - self.t_start),
                eval_cost=self.clock.eval_cost(0.0) if self.clock.evals else 0.0,
            )
        elif info.is_main and have_final:  # nothing trained: the final model stands
            final_model = out / "final"
            try:
                meta = read_json(final_model, "trainer.json")  # verified, as every file read
                self.final_bleu = meta.get("valid_bleu")
                self.decoding = Decoding.from_dict(read_json(final_model, "decoding.json"))
            except (OSError, ValueError, AttributeError):  # CheckpointError is a ValueError
                pass
        D.barrier()
        return final_model

    def _result(self, final_model: Path | None) -> TrainResult:
        state, info = self.state, self.info
        minutes = (time.monotonic() - self.t_start) / 60
        self.close()
        best = best_checkpoint(self.ckroot) if info.is_main else None
        if info.is_main:
            bleu = state.best_bleu if state.best_bleu is None else round(state.best_bleu, 2)
            self.say(
                f"stopped ({self.stopped}) at update {state.step} after {minutes:.1f} "
                f"min; best valid BLEU {bleu} at update {state.best_step}; checkpoints in "
                f"{self.ckroot}"
                + (f"; the model to use: {final_model}" if final_model is not None else "")
            )
        return TrainResult(
            out=self.out,
            step=state.step,
            stopped=self.stopped,
            best_bleu=state.best_bleu,
            best_step=state.best_step,
            last_checkpoint=self.last_ckpt,
            best_checkpoint=best,
            resumed_from=self.start_step if self.ckpt is not None else None,
            minutes=minutes,
            history=list(state.history),
            final_model=final_model,
            final_bleu=self.final_bleu,
            decoding=self.decoding,
        )
