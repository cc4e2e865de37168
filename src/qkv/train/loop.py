"""The training loop behind ``qkv train``: :func:`train`, and the run it drives update by update.

A run is prepared (:mod:`qkv.train.prepare`: the checkpoint to resume, settings, data, model,
optimizer, schedule), then updates (:mod:`qkv.train.update`) until its plan, its clock or its
patience says stop (:mod:`qkv.train.plan`). Every ``eval_every`` updates rank 0 computes the
validation loss and sacreBLEU (:mod:`qkv.train.validation`); a checkpoint follows every
evaluation and every ``save_every`` updates (:mod:`qkv.train.checkpoint`). At the end it writes
the model to use (:mod:`qkv.train.finish`).

Resuming is exact: a checkpoint holds the weights, the optimizer's moments, the schedule's step,
every rank's RNG states (dropout; :mod:`qkv.train.rng`), the data position and the run state
(:mod:`qkv.train.state`), so a run killed and resumed ends with bitwise the same weights as an
uninterrupted one (on the CPU with the same thread count; on GPUs as far as the kernels are
deterministic).

Around the loop: one trainer per run folder (:mod:`qkv.train.runlock`, taken before any data is
read), SIGINT/SIGTERM finish the update and save before stopping (:mod:`qkv.train.interrupt`),
and every message goes through :mod:`logging` (logger ``qkv.train.loop``); the progress line
(:mod:`qkv.train.progress`) is the only thing written to the stream directly.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from .._deps import require
from .._errors import SettingError
from ..data import Batch, TokenBatcher, Tokenizer, VocabSentencePieceTokenizer
from ..data.subwords import model_type
from ..inference import Decoding
from ..inference.layout import RunLayout, step_name
from ..inference.saved import MANIFEST
from ..runtime import LoadWatch, follow, thread_count
from . import distributed as D
from .checkpoint import (
    best_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    write_best_pointer,
)
from .config import TrainConfig, required_modules
from .finish import Final, read_final, write_final
from .interrupt import StopSignals, TrainingInterrupted, resume_command
from .plan import Clock, scheduled
from .prepare import Setup, length_limit, open_run, prepare
from .progress import Progress, Say, messages_on, sayer
from .rng import rng_state
from .run_data import RunData
from .runlock import RunLock, RunLockedError, check_out
from .subwords import LONG_SAMPLES, sampled_length_ratios
from .update import StepStats, TrainingError, train_update
from .verdict import SMALLEST, Verdict, fix_for, judge, stopped_early

__all__ = ["TrainResult", "train"]

log = logging.getLogger(__name__)


#: how far validation BLEU on the run's few hundred sentences moves by chance (points): a later
#: evaluation this close to the best BLEU so far, with a lower loss, is the better checkpoint
BLEU_NOISE = 1.0


def is_better(history: list[dict], best_step: int | None, bleu: float, loss: float) -> bool:
    """Whether an evaluation scoring ``bleu`` and ``loss`` makes a better checkpoint than the
    run's best so far (``best_step``, its evaluations in ``history``): a BLEU above every
    earlier one's, or one within :data:`BLEU_NOISE` of the highest with a lower validation loss
    than the best's. BLEU on 300 short sentences moves by about a point by chance, the loss
    over the whole validation split much less: a run whose rate decays to zero got its best
    weights last, and ranked them under an earlier checkpoint that was 0.4 BLEU luckier (and
    1.6 BLEU worse on the test set)."""
    evals = [h for h in history if "valid_bleu" in h]
    if best_step is None or not evals:
        return True
    top = max(h["valid_bleu"] for h in evals)
    if bleu > top:
        return True
    best_loss = next((h.get("valid_loss") for h in evals if h["step"] == best_step), None)
    return best_loss is not None and loss < best_loss and bleu >= top - BLEU_NOISE


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
        verdict: whether the model learned enough to use, against trivial baselines
            (:mod:`qkv.train.verdict`; rank 0; None on the other ranks, or when this
            invocation had nothing to train and validated nothing).
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
    verdict: Verdict | None = None


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
    require("training", required_modules(config))  # before anything is read or written
    config.validate()
    if init_from is not None and (resume or resume_from is not None):
        raise SettingError(
            "init_from",
            "a resumed run continues its own checkpoint; starting from another "
            "model's weights is a new run (drop resume, or init_from)",
        )
    layout = RunLayout(Path(out))
    # what to resume: nothing (False), the newest intact checkpoint (True), or the one named
    which = bool(resume) if resume_from is None else resume_from
    info = D.setup(config.device, timeout_minutes=config.dist_timeout_minutes)
    bar = Progress(config.step_limit, progress and info.is_main, stream)
    say = sayer(bar, log, is_main=info.is_main)
    run = None
    threads = torch.get_num_threads()  # config.threads is the run's, not the process's
    try:
        with messages_on(bar, stream_given=stream is not None), _lock_run(layout.out, info):
            t_start = time.monotonic()
            preparing = _Preparing(layout.out, say)
            with StopSignals(preparing.stop_now) as signals:
                if config.threads:
                    torch.set_num_threads(config.threads)
                settings, resumed = open_run(config, layout, info, which, say)
                preparing.checkpoint = resumed.checkpoint.path if resumed is not None else None
                setup = prepare(settings, resumed, layout, info, init_from=init_from, say=say)
                run = _Run(setup, layout, info, bar, say, signals, t_start)
                signals.stop_now = run.stop_now
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


def _stop(
    say: Say,
    out: Path,
    signum: int,
    *,
    step: int,
    where: str,
    checkpoint: Path | None,
    resumable: bool,
    since: str = "",
) -> NoReturn:
    """Say that signal ``signum`` stopped the run ``where`` it was, and how to resume it when
    it can be (``resumable``), and raise :class:`TrainingInterrupted`."""
    name = signal.Signals(signum).name
    if resumable:
        text = f"stopped by {name} {where}; resume with: {resume_command(out)}{since}"
    else:
        text = f"stopped by {name} {where}; nothing was saved"
    say(text, logging.WARNING)
    raise TrainingInterrupted(text, signum=signum, step=step, checkpoint=checkpoint)


class _Preparing:
    """Stops a run still preparing (a signal before its first update): nothing new to lose.

    Attributes:
        checkpoint: the checkpoint the run resumes from, once chosen (``--resume`` takes it
            again); None before, or for a new run.
    """

    def __init__(self, out: Path, say: Say) -> None:
        self.out, self.say = out, say
        self.checkpoint: Path | None = None

    def stop_now(self, signum: int) -> NoReturn:
        """Raise :class:`TrainingInterrupted` (update 0, the checkpoint being resumed)."""
        _stop(
            self.say,
            self.out,
            signum,
            step=0,
            where="before the first update",
            checkpoint=self.checkpoint,
            resumable=self.checkpoint is not None,
        )


def _subwords(config: TrainConfig) -> str:
    """What the greeting says of a user's SentencePiece model and of subword sampling."""
    text = f" from {config.tokenizer_model}" if config.tokenizer_model else ""
    if config.subword_alpha:
        nbest = config.subword_nbest_size
        text += f", subword sampling alpha {config.subword_alpha:g}"
        text += f" nbest {nbest}" if nbest != -1 else ""
    return text


def _long_samples(config: TrainConfig, data: RunData) -> str:
    """A note when subword sampling makes the training sentences much longer than their best
    segmentation (:data:`qkv.train.subwords.LONG_SAMPLES`), with the settings that sample closer
    to it for the long side's model (unigram: a larger alpha, fewer best segmentations; BPE: a
    smaller dropout probability); "" otherwise."""
    ratios = sampled_length_ratios(config, data)
    if ratios is None or max(ratios) <= LONG_SAMPLES:
        return ""
    alpha, nbest = config.subword_alpha, config.subword_nbest_size
    toks = (data.src_tokenizer, data.tgt_tokenizer)
    kinds = {model_type(toks[i].model) for i in (0, 1) if ratios[i] > LONG_SAMPLES}
    how, fixes = f"subword sampling alpha {alpha:g}", []
    if "bpe" in kinds:
        how = f"subword sampling (BPE-dropout {alpha:g})" if kinds == {"bpe"} else how
        fixes.append("a smaller --subword-alpha (BPE-dropout's 0.1) drops fewer merges")
    if kinds - {"bpe"}:  # unigram
        how += " over all segmentations" if nbest == -1 else f" over the {nbest} best"
        closer = ["a larger --subword-alpha (0.5)"] if alpha < 0.5 else []
        closer += ["--subword-nbest-size 64"] if nbest == -1 or nbest > 64 else []
        fixes += [" or ".join(closer) + " samples closer to the best"] if closer else []
    return (
        f"{how} gives the training sentences {ratios[0]:.2f} (source) and {ratios[1]:.2f} "
        "(target) times the pieces of their best segmentation: each batch holds that many "
        "times fewer sentences, and the model learns far slower"
        + "".join(f"; {fix}" for fix in fixes)
    )


def _text_kind(config: TrainConfig, tok: Tokenizer) -> str:
    """How the run's text is normalised, for its first line: the config's normaliser, or the
    tokenizer's own SentencePiece normalisation (an imported model's)."""
    if tok.normalizer is None and tok.kind == VocabSentencePieceTokenizer.kind:
        return "raw (its SentencePiece normalises)"
    return config.normalizer


def _infinite(batcher: TokenBatcher) -> Iterator[Batch]:
    while True:
        yield from batcher


def _tensorboard(setup: Setup, layout: RunLayout, info: D.DistInfo) -> Any:
    """TensorBoard's writer (rank 0, ``tensorboard=true``), else None. A resumed run purges the
    events a killed or stopped invocation logged after its checkpoint."""
    if not (setup.config.tensorboard and info.is_main):
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError(
            "tensorboard=true needs the tensorboard package: pip install tensorboard"
        ) from None
    purge = int(setup.state.step) + 1 if setup.resumed_from is not None else None
    return SummaryWriter(str(layout.tensorboard), purge_step=purge)


class _Run:
    """One invocation of ``qkv train`` from its first update on, in phases a reader can find:

    * per update: :meth:`_step` (one optimizer update), :meth:`_replan` and :meth:`_log`,
      :meth:`_out_of_time` (the stop decision all ranks agree on), :meth:`_evaluate_if_due`
      (validation and early stopping) and :meth:`_checkpoint_if_due`;
    * and at the end :meth:`_final_model` (:mod:`qkv.train.finish`) and the result.

    What it trains and with what is its :class:`~qkv.train.prepare.Setup`; the rest is the
    loop's own bookkeeping, none of it saved but through ``setup.state``. A signal
    (:class:`StopSignals`) stops it between updates (:meth:`_stop_for_signal`) or at once
    (:meth:`stop_now`).
    """

    def __init__(
        self,
        setup: Setup,
        layout: RunLayout,
        info: D.DistInfo,
        bar: Progress,
        say: Say,
        signals: StopSignals | None,
        t_start: float,
    ) -> None:
        self.setup, self.layout, self.info, self.device = setup, layout, info, info.device
        self.bar, self.say, self.signals = bar, say, signals
        config, state = setup.config, setup.state
        self.limit = config.step_limit  # the update that ends the run at the latest
        self.start_step = int(state.step)
        # the clock: this invocation's time, the run's earlier invocations', and its budget
        self.t_start, self.clock = t_start, Clock(t_start)
        self.seconds_before = float(state.train_seconds or 0.0)
        self.budget_s = (
            config.max_minutes * 60 - self.seconds_before if setup.plan.timed else math.inf
        )
        # how it ends: "max_steps" unless the clock, patience or a signal says otherwise
        self.stopped = setup.stopped or "max_steps"
        self.already_stopped = setup.stopped is not None
        self.skip_save = False  # a checkpoint due now is left out (agreed by all ranks)
        if setup.plan.timed and self.budget_s <= 0 and not self.already_stopped:
            self.already_stopped, self.stopped = True, "max_minutes"
        self.stop_signal: int | None = None  # a signal all ranks agreed to stop for
        # the newest checkpoint (rank 0's folder) and its update (known on every rank)
        self.last_ckpt: Path | None = setup.resumed_from
        self.saved_step: int | None = self.start_step if setup.resumed_from else None
        self.batches = _infinite(setup.batcher)
        self.wrapped: nn.Module = setup.model
        if info.distributed:
            self.wrapped = nn.parallel.DistributedDataParallel(
                setup.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.writer = _tensorboard(setup, layout, info)
        # the thread count follows the machine's load when it is qkv's choice (not --threads)
        self.watch = LoadWatch.for_this_process(bool(config.threads) or info.distributed)
        # the tokens trained on since the last progress line, and since when (not counting
        # evaluations and checkpoint writes)
        self.window_tokens, self.window_t0 = 0, time.monotonic()
        self.slower_said = False  # the warning that the machine slowed down, said once
        setup.model.train()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Update until the plan, the clock or patience says stop; then the final model.

        A first SIGINT/SIGTERM lets the current update finish (with its scheduled evaluation
        and checkpoint), then a checkpoint is written and :class:`TrainingInterrupted` raised."""
        if self.info.is_main:
            self._greet()
        self._say_if_stopped_before()
        if self.signals is not None:
            self.signals.graceful = True
        state = self.setup.state
        self._evaluate_start()
        # the first progress line counts from the first update (not the greeting's work)
        self.window_tokens, self.window_t0 = 0, time.monotonic()
        while state.step < self.limit and not self.already_stopped:
            stats = self._step()
            elapsed = time.monotonic() - self.t_start
            self._replan(elapsed)
            self._log(stats, elapsed)
            final = self._out_of_time(elapsed)
            evaluated, final = self._evaluate_if_due(final)
            self._checkpoint_if_due(evaluated, final)
            follow(self.watch, self.say)
            if self.stop_signal is not None:
                self._stop_for_signal()
            if final:
                break
        if self.signals is not None:
            self.signals.graceful = False  # from here on a signal stops at once
            if self.signals.received is not None:  # it came after the last update's check
                self.stop_now(self.signals.received)
        if state.step >= self.limit and self.start_step >= self.limit and self.info.is_main:
            self.say(f"the run is already at update {state.step} (max_steps {self.limit})")
        return self._result(self._final_model())

    def _greet(self) -> None:
        """What the run is: where it starts, the model, the data, the device, the plan."""
        setup, info = self.setup, self.info
        config, data = setup.config, setup.data
        src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
        n_params = sum(p.numel() for p in setup.model.parameters())
        self.layout.out.mkdir(parents=True, exist_ok=True)
        what = (
            f"resumed at update {self.start_step} from {setup.resumed_from}"
            if setup.resumed_from
            else "new run"
        )
        if setup.init is not None:
            what += f" from the weights of {setup.init.describe()}"
        self.say(
            f"{what}; {config.model} model, {n_params / 1e6:.2f}M parameters, "
            f"{data.n_train} training pairs ({setup.batcher.n_dropped} longer than "
            f"{length_limit(setup.model, config.max_pair_len)[1]} dropped), "
            f"{len(data.valid)} valid, {len(data.test)} test, "
            f"{config.tokenizer} vocab {src_tok.vocab_size}/{tgt_tok.vocab_size}"
            f"{' (joint)' if src_tok is tgt_tok else ''}{_subwords(config)}, "
            f"{_text_kind(config, src_tok)} text; "
            f"device {self.device}"
            + (f", {info.world_size} processes ({info.backend})" if info.distributed else "")
            + f", {thread_count(torch.get_num_threads())}"
        )
        preset = setup.state.preset
        if preset is not None and setup.resumed_from is None:
            self.say(preset["reason"])
            for note in preset.get("notes", []):
                self.say(f"note: {note}")
        long_samples = _long_samples(config, data) if setup.resumed_from is None else ""
        if long_samples:  # a resumed run keeps its sampling settings: no advice to act on
            self.say(f"note: {long_samples}")
        self.say(setup.plan.describe(setup.schedule))

    def _say_if_stopped_before(self) -> None:
        """Say why a resumed run has nothing to do (its budget used, or its patience)."""
        config = self.setup.config
        if self.already_stopped and self.stopped == "max_minutes":
            self.say(
                f"the run has used its {config.max_minutes:g}-minute budget "
                f"({self.seconds_before / 60:.1f} min of training); a larger --max-minutes goes on"
            )
        if self.already_stopped and self.stopped == "early_stopping":
            self.say(
                f"the run already stopped early at update {self.setup.state.step} (patience "
                f"{config.patience}); nothing to do (a larger --patience or --max-steps goes on)"
            )

    def _step(self) -> StepStats:
        """One optimizer update over ``accum_steps`` micro-batches (:func:`train_update`)."""
        setup, config = self.setup, self.setup.config
        micro = [next(self.batches) for _ in range(config.accum_steps)]
        try:
            stats = train_update(
                self.wrapped,
                setup.optimizer,
                setup.schedule,
                micro,
                label_smoothing=config.label_smoothing,
                clip_norm=config.clip_norm,
                device=self.device,
                bf16=config.bf16,
                pad_id=setup.data.tgt_tokenizer.pad_id,
            )
        except TrainingError as e:
            where = (
                f"the last checkpoint ({step_name(self.saved_step)} in "
                f"{self.layout.checkpoints}) is intact"
                if self.saved_step is not None
                else "no checkpoint was written yet"
            )
            raise TrainingError(f"{e}; {where}") from None
        state = setup.state
        state.step += 1
        state.target_tokens += stats.tokens
        self.window_tokens += stats.tokens
        state.loss_window.append(stats.loss)
        return stats

    def _replan(self, elapsed: float) -> None:
        """A time-bounded run re-plans its length from the measured speed (rank 0 decides)."""
        plan, schedule, step = self.setup.plan, self.setup.schedule, self.setup.state.step
        done_steps = step - self.start_step
        current = schedule.total_steps or self.limit
        # an update that reaches the plan re-plans at once (every rank: the step is theirs all):
        # when the machine sped up, a linear schedule past its planned end would train at its
        # floor rate until the next re-plan; at the true end the estimate stays where it is
        if not (plan.timed and (plan.due(done_steps) or step >= current)):
            return
        total = plan.estimate(step, done_steps, elapsed, self.budget_s, self.clock, current)
        mine = torch.tensor([float(total if self.info.is_main else 0)], device=self.device)
        total = int(D.all_reduce_sum(mine).item())
        total = max(min(total, self.limit), step)
        schedule.plan(total_steps=total, warmup_steps=plan.warmup(total))
        self._say_if_slower(total, done_steps)

    def _say_if_slower(self, total: int, done_steps: int) -> None:
        """Say once when the re-planned run makes under half the updates the preset sized its
        model for: the machine slowed down since the probe (other work started). The model
        cannot change once trained; the schedule follows the speed measured now."""
        preset = self.setup.state.preset or {}
        expected = preset.get("updates")
        if self.slower_said or not expected or done_steps < 10 or not self.info.is_main:
            return
        if total < 0.5 * expected and self.setup.resumed_from is None:
            self.slower_said = True
            self.say(
                f"this machine trains slower now than when the model was chosen: {total} "
                f"updates fit in the budget, the preset planned about {expected}; the model "
                f"stays, the schedule follows the speed measured now",
                logging.WARNING,
            )

    @contextlib.contextmanager
    def _not_training(self) -> Iterator[None]:
        """Time that is not training (an evaluation, a checkpoint's write): left out of the
        progress line's tokens/s, whose window started before it and goes on after."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.window_t0 += time.monotonic() - t0

    @property
    def _planned(self) -> int:
        """The update the run is planned to end at."""
        schedule = self.setup.schedule
        return (
            schedule.total_steps if self.setup.plan.timed and schedule.total_steps else self.limit
        )

    def _log(self, stats: StepStats, elapsed: float) -> None:
        """The progress line, and every ``log_every`` updates the history and TensorBoard."""
        state = self.setup.state
        step = state.step
        # a timed run may pass its plan before the next re-plan: it shows as due now
        planned = max(self._planned, step)
        self.bar.total = planned
        log_now = step % self.setup.config.log_every == 0 or step >= self._planned
        eta = elapsed / (step - self.start_step) * (planned - step)
        if self.setup.plan.timed:
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
        """The stop decision, agreed by all ranks: the planned end of a timed run, its clock
        (keeping the time the final evaluation and the averaging need), or an evaluation due
        just before the planned end (:meth:`~qkv.train.plan.Plan.ends_at_evaluation`); and
        whether a checkpoint due now is left out there (:meth:`~qkv.train.plan.Plan.skips_save`,
        ``self.skip_save``). Neither end rule applies to a plan that ``max_steps`` caps: that
        run ends at its ``max_steps``. Returns whether this update is the run's last
        (``max_steps`` reached, or out of time).

        A plan made from a few slow updates never ends a run early: it is re-made every 10
        updates, and the planned end counts only in the last fifth of the budget."""
        state, plan, budget_s = self.setup.state, self.setup.plan, self.budget_s
        step, planned = state.step, self._planned
        end_rules = planned < self.limit  # a plan max_steps caps ends at max_steps
        over_time = plan.timed and (
            (step >= planned and elapsed >= 0.8 * budget_s)
            or elapsed >= budget_s - plan.final_reserve(self.clock, budget_s)
            or (
                end_rules
                and plan.ends_at_evaluation(step, planned, state.last_eval, elapsed, budget_s)
            )
        )
        skip_save = end_rules and plan.skips_save(step, planned, elapsed, budget_s)
        got = self.signals.received if self.signals is not None else None
        flags = torch.tensor(
            [
                float(over_time),
                float(got == signal.SIGINT),
                float(got == signal.SIGTERM),
                float(skip_save),
            ],
            device=self.device,
        )
        # a signal to one rank stops all; every rank follows one clock's reading
        over, sigint, sigterm, skip = D.all_reduce_sum(flags).tolist()
        self.skip_save = skip > 0
        if sigint > 0 or sigterm > 0:
            self.stop_signal = signal.SIGTERM if sigterm > 0 else signal.SIGINT
        if over > 0 and step < self.limit:
            self.stopped = state.stopped = "max_minutes"
        return step >= self.limit or self.stopped != "max_steps"

    def _evaluate_start(self) -> None:
        """A new run from a trained model's weights (``init_from``) validates them first, as
        update 0, and keeps them as checkpoint 0: the starting point is what fine-tuning must
        beat, and the final model may be it (not counted against patience)."""
        setup, state = self.setup, self.setup.state
        if setup.init is None or setup.resumed_from is not None or state.step != 0:
            return
        if self.already_stopped:
            return
        with self._not_training():  # every rank waits for rank 0's evaluation
            if self.info.is_main:
                self._evaluate(0, scheduled=False)
            self._share_evaluation()
        state.last_eval = 0
        self._checkpoint_if_due(True, False)

    def _evaluate_if_due(self, final: bool) -> tuple[bool, bool]:
        """Validate when the cadence or the end says so (rank 0), and stop early when patience
        ran out (all ranks agree). Returns ``(evaluated, final)``."""
        state = self.setup.state
        step = state.step
        eval_every, _ = self.setup.plan.cadence(self._planned)
        fixed = self.setup.config.eval_every is not None
        due = scheduled(step, state.last_eval, eval_every, fixed)
        if not (due or final):
            return False, final
        stop = 0.0
        if due:
            state.last_eval = step
        with self._not_training():  # every rank waits for rank 0's evaluation
            if self.info.is_main:
                stop = self._evaluate(step, scheduled=due)
            out_of_patience = self._share_evaluation(stop)
        if out_of_patience and not final:
            self.stopped = state.stopped = "early_stopping"
            final = True
        return True, final

    def _share_evaluation(self, stop: float = 0.0) -> bool:
        """After an evaluation (every rank calls this): whether rank 0's patience ran out, and
        rank 0's planned number of evaluations (:meth:`~qkv.train.plan.Plan.fit_evals`, from
        the evaluation cost only it measures) made every rank's, so that all ranks agree on
        when the next one is due."""
        plan = self.setup.plan
        mine = [stop, float(plan.evals) if self.info.is_main else 0.0]
        stop_sum, evals = D.all_reduce_sum(torch.tensor(mine, device=self.device)).tolist()
        plan.evals = int(evals)
        return stop_sum > 0

    def _evaluate(self, step: int, *, scheduled: bool) -> float:
        """Validation loss and BLEU (rank 0); returns 1.0 when patience ran out.

        Patience counts only scheduled evaluations: a final one off the schedule (at
        max_steps or max_minutes) depends on where this invocation stopped, and counting it
        would make a resumed run stop at another update. It may still become the best
        checkpoint (its weights are the same in either run)."""
        t0 = time.monotonic()
        setup, config, state = self.setup, self.setup.config, self.setup.state
        vloss = setup.validation.loss(setup.model, bf16=config.bf16)
        scores = setup.validation.bleu(setup.model)
        if scheduled:
            if state.grid_best_bleu is None or scores.bleu > state.grid_best_bleu:
                state.grid_best_bleu, state.evals_since_best = scores.bleu, 0
            else:
                state.evals_since_best += 1
        better = is_better(state.history, state.best_step, scores.bleu, vloss)
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
        if config.eval_every is None:  # a timed run's evaluations fit in a tenth of its budget
            setup.plan.fit_evals(self.budget_s + self.seconds_before, self.clock.eval_cost(0.0))
        self.say(
            f"valid @ {step}: loss {vloss:.3f} (ppl {math.exp(min(vloss, 50)):.2f}), "
            f"BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f} on {scores.n} sentences "
            f"({took:.1f} s)" + ("  *best*" if better else "")
        )
        out_of_patience = config.patience and state.evals_since_best >= config.patience
        return 1.0 if out_of_patience else 0.0

    def _checkpoint_if_due(self, evaluated: bool, final: bool) -> None:
        """A checkpoint after every evaluation, at the end, and every ``save_every`` updates
        (but just before the planned end, :meth:`~qkv.train.plan.Plan.skips_save`, or just
        before an evaluation, :meth:`~qkv.train.plan.Plan.leaves_save_to_evaluation`)."""
        state, plan = self.setup.state, self.setup.plan
        step = state.step
        _, save_every = plan.cadence(self._planned)
        fixed = self.setup.config.save_every is not None
        due = (
            scheduled(step, state.last_save, save_every, fixed)
            and not self.skip_save
            and not plan.leaves_save_to_evaluation(step, self._planned, state.last_eval)
        )
        if evaluated or final or due:
            state.last_save = step
            with self._not_training():
                self.last_ckpt = self._checkpoint(step) or self.last_ckpt
            self.saved_step = step

    def _checkpoint(self, step: int) -> Path | None:
        """Write checkpoint ``step`` (rank 0; every rank's RNG state gathered, the replicas
        checked to agree); returns its folder on rank 0."""
        t0 = time.monotonic()
        info, setup, state = self.info, self.setup, self.setup.state
        rng_all = D.all_gather_objects(rng_state(self.device))
        sums = D.all_gather_objects(D.param_checksum(setup.model) if info.distributed else "")
        if info.distributed and len(set(sums)) != 1:
            raise TrainingError(f"the replicas diverged at update {step}: checksums {sums}")
        path = None
        state.train_seconds = round(self.seconds_before + time.monotonic() - self.t_start, 3)
        if info.is_main:
            root = self.layout.checkpoints
            trainer_state = {
                **state.to_dict(),
                "step": step,
                "data": setup.batcher.state_dict(),
                "world_size": info.world_size,
                "replica_checksums": sums if info.distributed else None,
            }
            path = save_checkpoint(
                root,
                step,
                model=setup.model,
                model_config=setup.model_config.to_dict(),
                train_config=setup.settings,
                write_tokenizers=setup.save_tokenizers,
                split=setup.data.split.to_dict(),
                trainer_state=trainer_state,
                languages=setup.languages,
                tensors={
                    "optimizer": setup.optimizer.state_dict(),
                    "schedule": setup.schedule.state_dict(),
                    "rng": rng_all,
                },
            )
            if state.best_step == step:
                write_best_pointer(root, step, state.best_bleu)
            prune_checkpoints(root, setup.config.keep_last, best_step=state.best_step)
        D.barrier()
        self.clock.saving += time.monotonic() - t0
        return path

    # -- stopped by a signal -------------------------------------------------------------------
    def _stop_for_signal(self) -> None:
        """After the update a signal interrupted: its checkpoint (unless just written), the
        line that says how to resume, and :class:`TrainingInterrupted` (every rank)."""
        step = self.setup.state.step
        if self.saved_step != step:
            # not a scheduled checkpoint: the cadence (last_save) stays the uninterrupted run's
            self.last_ckpt = self._checkpoint(step) or self.last_ckpt
            self.saved_step = step
        name = signal.Signals(self.stop_signal).name
        text = f"stopped by {name} at update {step}; resume with: {resume_command(self.layout.out)}"
        self.say(text, logging.WARNING)
        raise TrainingInterrupted(
            text, signum=int(self.stop_signal), step=step, checkpoint=self.last_ckpt
        )

    def stop_now(self, signum: int) -> NoReturn:
        """Stop at once (a second signal, or one outside the loop): raise
        :class:`TrainingInterrupted` naming the newest checkpoint, which ``--resume`` takes."""
        step = self.setup.state.step
        _stop(
            self.say,
            self.layout.out,
            signum,
            step=step,
            where=f"at update {step}",
            checkpoint=self.last_ckpt,
            resumable=self.last_ckpt is not None
            or (self.saved_step is not None and not self.info.is_main),
            since=f" (from update {self.saved_step})" if self.saved_step != step else "",
        )

    def close(self) -> None:
        """Close what the run opened (TensorBoard), however it ended."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # -- the end ----------------------------------------------------------------------------------
    def _final_model(self) -> Final:
        """``OUT/final``: averaged when that validates better, decoding chosen on validation,
        the run's verdict on it recorded; kept as it is when nothing was trained (rank 0)."""
        state, folder = self.setup.state, self.layout.final
        final = Final()
        trained = state.step > self.start_step
        have_final = (folder / MANIFEST).is_file()
        if self.info.is_main and state.best_step is not None and (trained or not have_final):
            final = write_final(
                self.setup,
                self.layout,
                self.say,
                time_left=self.budget_s - (time.monotonic() - self.t_start),
                eval_cost=self.clock.eval_cost(0.0) if self.clock.evals else 0.0,
                verdict=self._recorded_verdict,
            )
        elif self.info.is_main and have_final:  # nothing trained: the final model stands
            final = read_final(folder)
        D.barrier()
        return final

    def _result(self, final: Final) -> TrainResult:
        state, info = self.setup.state, self.info
        minutes = (time.monotonic() - self.t_start) / 60
        self.close()
        best = best_checkpoint(self.layout.checkpoints) if info.is_main else None
        if info.is_main:
            bleu = state.best_bleu if state.best_bleu is None else round(state.best_bleu, 2)
            self.say(
                f"stopped ({self.stopped}) at update {state.step} after {minutes:.1f} "
                f"min; best valid BLEU {bleu} at update {state.best_step}; checkpoints in "
                f"{self.layout.checkpoints}"
                + (f"; the model to use: {final.folder}" if final.folder is not None else "")
            )
        return TrainResult(
            out=self.layout.out,
            step=state.step,
            stopped=self.stopped,
            best_bleu=state.best_bleu,
            best_step=state.best_step,
            last_checkpoint=self.last_ckpt,
            best_checkpoint=best,
            resumed_from=self.start_step if self.setup.resumed_from is not None else None,
            minutes=minutes,
            history=list(state.history),
            final_model=final.folder,
            final_bleu=final.bleu,
            decoding=final.decoding,
            verdict=self._say_verdict() if info.is_main else None,
        )

    def _recorded_verdict(self) -> dict | None:
        """The verdict as ``OUT/final/trainer.json`` records it (with its fix), judged once the
        final model's averaging and decoding choice have validated it (``write_final`` calls
        this just before it writes the folder)."""
        judged = self._judged_once
        if judged is None:
            return None
        verdict, fix = judged
        return {**verdict.to_dict(), "fix": fix}

    def _say_verdict(self) -> Verdict | None:
        """The run's last line: the verdict (judged now unless the final model's writing did),
        and the fix when the model is not usable (a warning then)."""
        judged = self._judged_once
        if judged is None:
            return None
        verdict, fix = judged
        self.say(verdict.line(fix), logging.INFO if verdict.usable else logging.WARNING)
        return verdict

    @functools.cached_property
    def _judged_once(self) -> tuple[Verdict, str] | None:
        """:meth:`_judge`, once a run: what is recorded is what is said."""
        return self._judge()

    def _judge(self) -> tuple[Verdict, str] | None:
        """Did the model learn? Its best validation translations of this invocation against
        the trivial baselines, and what to do when it did not: ``(verdict, fix)``; None when
        this invocation validated nothing (the verdict was said when it was)."""
        state, validation = self.setup.state, self.setup.validation
        preset = state.preset or {}
        planned = preset.get("updates")
        best = validation.best
        if state.best_step is None:
            verdict = stopped_early(int(state.step), planned)
        elif best is None:  # nothing validated now: the verdict was said when it was
            return None
        else:
            verdict = judge(
                best.hypotheses,
                [s for s, _ in validation.pairs],
                validation.references,
                bleu=best.bleu,
                steps=int(state.step),
                planned=planned,
                tokenize=validation.tokenize,
            )
        config = self.setup.config
        tier = preset.get("name") if config.preset != "none" else SMALLEST
        # the reference model's measured speed says whether the machine was slow or busy (a
        # run saved before it was recorded: the preset's own speed)
        speed = preset.get("reference_speed", preset.get("speed"))
        # the user's update cap, not the clock, ended it: more updates is the fix
        capped = config.max_steps is not None and int(state.step) >= config.max_steps
        fix = fix_for(self.layout.out, config.max_minutes, int(state.step), planned, tier, speed,
                      capped, (state.train_seconds or 0.0) / 60)  # fmt: skip
        return verdict, fix
