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
from ..nn.seq2seq import EncoderDecoder, build_model
from . import distributed as D
from .checkpoint import (
    CheckpointError,
    LoadedCheckpoint,
    atomic_write_json,
    best_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    prune_checkpoints,
    remove_stale_temporaries,
    save_checkpoint,
)
from .config import RESUMABLE_KEYS, TrainConfig
from .losses import sequence_loss
from .schedules import InverseSqrtSchedule

__all__ = [
    "RunData",
    "StepStats",
    "TrainResult",
    "TrainingError",
    "load_run_data",
    "make_optimizer",
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


def load_run_data(
    config: TrainConfig,
    *,
    split: Split | None = None,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
) -> RunData:
    """Read, split and normalise the run's pairs, and build (or take) the tokenizers.

    With ``split`` (a resumed run, or evaluation) the saved split is applied, which checks that
    the data is the data the run was trained on.
    """
    pairs, source = read_run_pairs(config)
    if split is None:
        split = split_pairs(pairs, valid=config.valid, test=config.test, seed=config.split_seed)
    train, valid, test = split.apply(pairs)
    if not train or not valid:
        raise ValueError(
            f"data: {source} gives {len(train)} training and {len(valid)} validation pairs; "
            "expected some of each (more data, or other valid/test sizes)"
        )
    # a resumed run keeps the normaliser saved with its tokenizers, even if the named one changed
    saved = tokenizers[0].normalizer if tokenizers is not None else None
    norm = saved if saved is not None else _normalizer(config.normalizer)
    train, valid, test = norm.pairs(train), norm.pairs(valid), norm.pairs(test)
    if tokenizers is None:
        opts: dict[str, Any] = (
            {"min_freq": config.min_freq}
            if config.tokenizer == "word"
            else {"vocab_size": config.vocab_size}
        )
        src_tok, tgt_tok = build_tokenizers(
            train,
            config.tokenizer,
            joint=config.joint_vocab,
            normalizer=norm,
            pre_normalized=True,
            **opts,
        )
    else:
        src_tok, tgt_tok = tokenizers
    return RunData(split, train, valid, test, src_tok, tgt_tok, source)


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
    schedule: InverseSqrtSchedule,
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
) -> Any:
    """sacreBLEU (and chrF) of ``model``'s translations of normalised ``pairs``."""
    from ..translate import corpus_scores, generate_ids

    src = [[*src_tok.encode_normalized(s), src_tok.eos_id] for s, _ in pairs]
    out = generate_ids(
        model,
        src,
        bos_id=tgt_tok.bos_id,
        eos_id=tgt_tok.eos_id,
        device=device,
        beam_size=beam_size,
    )
    return corpus_scores([tgt_tok.decode(ids) for ids in out], [t for _, t in pairs])


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
    bar = Progress(config.max_steps, show and info.is_main, stream)
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

    # -- data and model -----------------------------------------------------------------------
    if ckpt is not None:
        try:
            split = Split.from_dict(ckpt.split)
            toks = load_tokenizers(ckpt.path / "tokenizers")
        except (ValueError, KeyError, OSError) as e:
            raise CheckpointError(f"checkpoint: {str(ckpt.path)!r} is unusable: {e}") from None
        data = load_run_data(config, split=split, tokenizers=toks)
    else:
        data = load_run_data(config)
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
    torch.manual_seed(config.seed)
    model_config = config.model_config(src_tok.vocab_size, tgt_tok.vocab_size)
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
    batcher = TokenBatcher(
        src_ids,
        tgt_ids,
        max_tokens=config.max_tokens,
        max_len=config.max_len,
        shuffle=True,
        seed=config.seed,
        rank=info.rank,
        world_size=info.world_size,
    )
    vs, vt = encode_pairs(data.valid, src_tok, tgt_tok, pre_normalized=True)
    valid_batches = TokenBatcher(
        vs,
        vt,
        max_tokens=max(config.max_tokens, 256),
        shuffle=False,
        rank=0,
        world_size=1,
        max_len=max(config.max_len, 2),
        truncate=True,
    )
    bleu_pairs = data.valid if not config.eval_sentences else data.valid[: config.eval_sentences]

    optimizer = make_optimizer(model, config)
    schedule = InverseSqrtSchedule(optimizer, peak_lr=config.lr, warmup_steps=config.warmup_steps)
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
        if "grid_best_bleu" not in ckpt.trainer_state:  # written before it was kept apart
            state["grid_best_bleu"] = state["best_bleu"]
        if info.is_main:
            _repair_best_pointer(ckroot, state)
    else:
        # dropout differs per rank; the weights were drawn from config.seed on every rank
        torch.manual_seed(config.seed * 1009 + 1 + info.rank)
    start_step = int(state["step"])
    already_stopped = (
        ckpt is not None
        and state["stopped"] == "early_stopping"
        and saved.patience == config.patience
        and saved.max_steps == config.max_steps
    )
    if not already_stopped:
        state["stopped"] = None
    if start_step != schedule.last_step:
        raise CheckpointError(
            f"checkpoint: inconsistent state (step {start_step}, schedule {schedule.last_step})"
        )

    wrapped: nn.Module = model
    if info.distributed:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    writer = None
    if config.tensorboard and info.is_main:
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
            f"qkv train: {what}; {config.model} model, {n_params / 1e6:.2f}M parameters, "
            f"{len(data.train)} training pairs ({batcher.n_dropped} longer than {config.max_len} "
            f"dropped), {len(data.valid)} valid, {len(data.test)} test, vocab "
            f"{src_tok.vocab_size}/{tgt_tok.vocab_size}; device {device}"
            + (f", {info.world_size} processes ({info.backend})" if info.distributed else "")
            + f", {torch.get_num_threads()} threads"
        )

    # -- the loop -------------------------------------------------------------------------------
    stream_of_batches = _infinite(batcher)
    last_ckpt: Path | None = ckpt.path if ckpt else None
    saved_step: int | None = start_step if ckpt else None  # known on every rank
    stopped = "early_stopping" if already_stopped else "max_steps"
    step = start_step
    window_tokens, window_t0 = 0, time.monotonic()
    model.train()

    def save(step: int) -> Path | None:
        rng_all = D.all_gather_objects(_rng_state(device))
        sums = D.all_gather_objects(D.param_checksum(model) if info.distributed else "")
        if info.distributed and len(set(sums)) != 1:
            raise TrainingError(f"the replicas diverged at update {step}: checksums {sums}")
        path = None
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
            prune_checkpoints(ckroot, config.keep_last, best_step=state["best_step"])
        D.barrier()
        return path

    if already_stopped and info.is_main:
        say(
            f"qkv train: the run already stopped early at update {step} (patience "
            f"{config.patience}); nothing to do (a larger --patience or --max-steps goes on)"
        )
    while step < config.max_steps and not already_stopped:
        micro = [next(stream_of_batches) for _ in range(config.accum_steps)]
        try:
            stats = train_update(
                wrapped,
                optimizer,
                schedule,
                micro,
                label_smoothing=config.label_smoothing,
                clip_norm=config.clip_norm,
                device=device,
                bf16=config.bf16,
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
        log_now = step % config.log_every == 0 or step == config.max_steps
        done_steps = step - start_step
        eta = elapsed / done_steps * (config.max_steps - step)
        if config.max_minutes is not None:
            eta = min(eta, max(config.max_minutes * 60 - elapsed, 0.0))
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

        # stop conditions, agreed by all ranks
        over_time = config.max_minutes is not None and elapsed >= config.max_minutes * 60
        flag = D.all_reduce_sum(torch.tensor([1.0 if over_time else 0.0], device=device))
        if float(flag) > 0 and step < config.max_steps:
            stopped = "max_minutes"
        final = step >= config.max_steps or stopped != "max_steps"

        evaluated = False
        if step % config.eval_every == 0 or final:
            evaluated = True
            stop = 0.0
            if info.is_main:
                t0 = time.monotonic()
                vloss = validation_loss(model, valid_batches, device, bf16=config.bf16)
                scores = validation_bleu(
                    model, bleu_pairs, src_tok, tgt_tok, device, beam_size=config.eval_beam
                )
                # patience counts only evaluations on the eval_every grid: a final one off the
                # grid (at max_steps or max_minutes) depends on where this invocation stopped,
                # and counting it would make a resumed run stop at another update. It may still
                # become the best checkpoint (its weights are the same in either run).
                if step % config.eval_every == 0:
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
                say(
                    f"  valid @ {step}: loss {vloss:.3f} (ppl {math.exp(min(vloss, 50)):.2f}), "
                    f"BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f} on {scores.n} sentences "
                    f"({time.monotonic() - t0:.1f} s)" + ("  *best*" if better else "")
                )
                if config.patience and state["evals_since_best"] >= config.patience:
                    stop = 1.0
                window_t0 = time.monotonic()  # the evaluation is not training time
            flag = D.all_reduce_sum(torch.tensor([stop], device=device))
            if float(flag) > 0 and not final:
                stopped = state["stopped"] = "early_stopping"
                final = True
        if evaluated or step % config.save_every == 0 or final:
            last_ckpt = save(step) or last_ckpt
            saved_step = step
        if final:
            break
    if step >= config.max_steps and start_step >= config.max_steps and info.is_main:
        say(f"qkv train: the run is already at update {step} (max_steps {config.max_steps})")

    minutes = (time.monotonic() - t_start) / 60
    if writer is not None:
        writer.close()
    best = best_checkpoint(ckroot) if info.is_main else None
    if info.is_main:
        say(
            f"qkv train: stopped ({stopped}) at update {step} after {minutes:.1f} min; best "
            f"valid BLEU {state['best_bleu'] if state['best_bleu'] is None else round(state['best_bleu'], 2)}"
            f" at update {state['best_step']}; checkpoints in {ckroot}"
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
    )
