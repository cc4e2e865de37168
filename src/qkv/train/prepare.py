"""Where a run starts, up to its first update: the checkpoint it resumes (or none), its settings
resolved, its data read, its model, batches, optimizer and schedule built, their state put back.

:func:`open_run` chooses the checkpoint to resume and checks the given settings against the
ones it was started with; :func:`prepare` does the rest and returns a :class:`Setup`, what the
loop (:mod:`qkv.train.loop`) updates and the finish (:mod:`qkv.train.finish`) reads. The order
of the work is fixed so that a run draws the same random numbers on every start: the weights
from ``seed``, then the dropout generators (a fresh run's seeded per rank, a resumed run's put
back from its checkpoint, :mod:`qkv.train.rng`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._deps import require
from .._errors import SettingError
from .._folder import MODEL_CONFIG, TOKENIZERS
from ..data import Split, TokenBatcher, Tokenizer, encode_pairs, load_tokenizers, save_tokenizers
from ..data.languages import language_name
from ..data.prepared import PreparedSplit, is_prepared
from ..inference import Decoding, position_limits
from ..inference.layout import RunLayout
from ..inference.limits import SETTING as POSITION_SETTING
from ..inference.scores import bleu_tokenizer, tokenizer_modules
from ..nn.seq2seq import EncoderDecoder, Seq2SeqConfig, build_model
from . import distributed as D
from .checkpoint import (
    CheckpointError,
    LoadedCheckpoint,
    latest_checkpoint,
    load_model_weights,
    model_languages,
    read_json,
    remove_stale_temporaries,
    repair_best_pointer,
    resume_checkpoint,
)
from .config import RESUMABLE_KEYS, TrainConfig
from .corpus import (
    RUN_DATA_DIR,
    Sizing,
    open_prepared,
    prepare_corpus,
    prepare_reason,
    prepared_run_data,
    prepared_settings,
)
from .init_from import InitModel, load_init
from .plan import FIRST_GUESS, Plan
from .presets import LABEL_SMOOTHING, OneMeasurement, resolve_config
from .progress import Say
from .rng import set_rng_state
from .run_data import (
    RESUME_REMEDY,
    RunData,
    describe_data,
    load_run_data,
    read_run_files,
    run_languages,
    run_split,
)
from .schedules import Schedule
from .state import RunState
from .subwords import epoch_sampler
from .update import make_optimizer
from .validation import ValidationSet

__all__ = ["Resumed", "Setup", "check_resume_settings", "length_limit", "open_run", "prepare"]


@dataclass
class Resumed:
    """The checkpoint a run resumes from (verified and read, its training state included), and
    the settings the run was started with (its ``train.json``)."""

    checkpoint: LoadedCheckpoint
    saved: TrainConfig


@dataclass
class Setup:
    """Everything a run sets up before its first update.

    Attributes:
        config: the run's settings, resolved (a preset's choices filled in); the one
            configuration the loop reads. Saved as ``trainer.json``'s ``resolved_config``.
        settings: the settings the user gave (``data`` made absolute), as ``train.json`` holds
            them; what a resume is checked against.
        data: the run's split, text and tokenizers.
        model_config: the architecture (``model.json``).
        model: the model trained (not the DDP wrapper), on the run's device.
        batcher: this rank's training batches (its position is saved in checkpoints).
        optimizer, schedule: AdamW and the learning-rate schedule.
        validation: what the run validates on.
        plan: the run's length, warm-up and cadences.
        state: what the loop keeps between updates (restored when resuming).
        resumed_from: the checkpoint folder the run resumed from, or None.
        init: the model a new run started from (``init_from``), or None.
        stopped: why a resumed run already stopped (``"early_stopping"``, ``"max_minutes"``)
            when that still holds with the given settings, else None.
    """

    config: TrainConfig
    settings: dict[str, Any]
    data: RunData
    model_config: Seq2SeqConfig
    model: EncoderDecoder
    batcher: TokenBatcher
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    validation: ValidationSet
    plan: Plan
    state: RunState
    resumed_from: Path | None = None
    init: InitModel | None = None
    stopped: str | None = None

    def save_tokenizers(self, folder: Path) -> None:
        """Write the run's tokenizers into ``folder`` (of a checkpoint or the final model)."""
        save_tokenizers(folder, self.data.src_tokenizer, self.data.tgt_tokenizer)

    @property
    def languages(self) -> tuple[str, str] | None:
        """The run's ``(source, target)`` languages, recorded in every model folder it writes;
        None when one is unknown (a run started before languages were recorded)."""
        src, tgt = self.config.src_lang, self.config.tgt_lang
        return (src, tgt) if src and tgt else None


# ---------------------------------------------------------------------------- the checkpoint
def check_resume_settings(saved: TrainConfig, given: TrainConfig) -> TrainConfig:
    """``given``, when it changes nothing of ``saved`` (a checkpoint's settings) but
    :data:`RESUMABLE_KEYS`.

    Raises:
        ValueError: other settings differ (the first six named, the checkpoint's and the given
            value of each).
    """
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


def open_run(
    config: TrainConfig,
    layout: RunLayout,
    info: D.DistInfo,
    resume: bool | int | str | Path,
    say: Say,
) -> tuple[TrainConfig, Resumed | None]:
    """The given settings (``data`` made absolute) and the checkpoint to resume, if any.

    ``resume`` is False (a new run: ``layout.out`` must hold no checkpoint), True (the newest
    intact checkpoint; a new run when there is none) or the update or checkpoint folder to resume
    from (:func:`~qkv.train.checkpoint.resume_checkpoint`). What a killed writer left in the
    checkpoints folder is removed first (rank 0).

    Raises:
        ValueError: a new run into a folder that holds one; settings that differ from the
            checkpoint's (:func:`check_resume_settings`).
        CheckpointError: the checkpoint cannot be resumed, or its ``train.json`` is invalid.
    """
    absolute = {}
    for key in ("data", "valid_data", "test_data", "tokenizer_model"):
        v = getattr(config, key)
        if isinstance(v, str):
            absolute[key] = str(Path(v).resolve())
        elif isinstance(v, list):  # two aligned files
            absolute[key] = [str(Path(p).resolve()) for p in v]
    if absolute:
        config = config.updated(absolute)
    if info.is_main:
        remove_stale_temporaries(layout.checkpoints)
    D.barrier()
    latest = latest_checkpoint(layout.checkpoints)
    if latest is not None and resume is False:
        raise SettingError(
            "out",
            f"{str(layout.out)!r} already holds a run (checkpoint {latest.name}); pass "
            "--resume to continue it, or choose another --out",
        )
    ckpt = None
    if resume is not False:
        chosen = None if resume is True else resume
        ckpt = resume_checkpoint(layout.checkpoints, chosen, act=info.is_main)
    if ckpt is not None:
        try:
            saved = TrainConfig.from_dict(ckpt.train_config)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint: train.json in {str(ckpt.path)!r} is invalid: {e}"
            ) from None
        return check_resume_settings(saved, config), Resumed(ckpt, saved)
    if resume:
        say(f"nothing to resume in {layout.out}; starting a new run")
    return config, None


# ---------------------------------------------------------------------------- settings and data
def _languages(config: TrainConfig, files: Any, say: Say) -> TrainConfig:
    """``config`` with the run's languages (given, read from the data or detected, and said)
    and the packages its BLEU tokenizer needs checked, before any training."""
    src, tgt, how = run_languages(config, files.pairs[: files.sizes[0]], files.data_format)
    named = [f"{language_name(c)} ({c})" if c else "not recorded" for c in (src, tgt)]
    tok = config.tokenize or bleu_tokenizer(tgt)
    say(f"languages: {named[0]} -> {named[1]}, {how}; BLEU tokenizer {tok}")
    # MeCab for a Japanese or Korean target: said now, not at the first evaluation
    require(f"BLEU for {named[1]} (tokenize={tok})", tokenizer_modules(tok))
    return config.updated({"src_lang": src, "tgt_lang": tgt})


def _prepared_in_run(
    settings: TrainConfig,
    layout: RunLayout,
    info: D.DistInfo,
    say: Say,
    reason: str,
    probe: OneMeasurement,
) -> TrainConfig:
    """``settings`` reading ``OUT/data``, where the data file is prepared first (by the first
    process, the others waiting; a no-op when it was, a killed prepare continued), its
    vocabulary sized by the preset of this run's device and processes, with ``probe``'s speed
    (the run asks it again for its own preset: one measurement, one choice)."""
    folder = (layout.out / RUN_DATA_DIR).resolve()
    if info.is_main:
        say(f"data: preparing {describe_data(settings.data)} into {folder} ({reason})")
        sizing = Sizing(
            device=info.device.type, world_size=info.world_size, probe=probe, in_run=True
        )
        prepare_corpus(settings, folder, say=say, sizing=sizing)
    D.barrier()
    return settings.updated({"data": str(folder)})


def _new_run_data(
    settings: TrainConfig, init: InitModel | None, info: D.DistInfo, say: Say, layout: RunLayout
) -> tuple[TrainConfig, dict | None, RunData]:
    """A new run's resolved settings (a preset's choices filled in, its languages found), the
    preset's reasons, and its data, read and split (or prepared into the run's folder first:
    :func:`~qkv.train.corpus.prepare_reason`)."""
    reason = prepare_reason(settings, info.world_size) if init is None else None
    if reason is not None:
        probe = OneMeasurement()
        prepared = _prepared_in_run(settings, layout, info, say, reason, probe)
        return _prepared_data(prepared, init, info, say, probe)
    if is_prepared(settings.data):
        return _prepared_data(settings, init, info, say)
    config = init.settings(settings) if init is not None else settings  # before any data
    files = read_run_files(config)
    pairs, source = files.pairs, files.source
    config = _languages(config, files, say if info.is_main else (lambda _m: None))
    split = run_split(config, files)
    n_train = len(split.train)
    if n_train < 1:
        raise SettingError(
            "data",
            f"{source} gives no training pairs after the split ({len(pairs)} pairs "
            f"read); expected more data, or smaller valid/test sizes",
        )
    run_cfg, preset = resolve_config(
        config,
        n_train,
        device=info.device.type,
        world_size=info.world_size,
        fine_tuning=init is not None,
    )
    preset_info = preset.to_dict() if preset is not None else None
    if init is not None and preset_info is not None:  # the model is not the preset's
        preset_info["reason"] = (
            f"fine-tuning {init.describe()}: its architecture and vocabulary kept; preset "
            f"{preset.name} for the batches ({run_cfg.max_tokens} tokens), peak lr "
            f"{run_cfg.lr:g} (a fine-tuning rate), the starting weights validated as update 0"
        )
        # the model is the saved one; the rate and the smoothing a fine-tuning's
        preset_info.update(
            notes=[], model={}, lr=run_cfg.lr, label_smoothing=run_cfg.label_smoothing
        )
    toks = init.tokenizers if init is not None else None
    data = load_run_data(run_cfg, split=split, pairs=(pairs, source), tokenizers=toks,
                         vocab_given=config.vocab_size is not None)  # fmt: skip
    return run_cfg, preset_info, data


def _prepared_data(
    settings: TrainConfig,
    init: InitModel | None,
    info: D.DistInfo,
    say: Say,
    probe: OneMeasurement | None = None,
) -> tuple[TrainConfig, dict | None, RunData]:
    """A new run's settings, preset and data from a prepared corpus (``qkv prepare``), the
    preset chosen with ``probe``'s speed; the corpus's vocabulary is kept whatever the preset's
    (its tokenizers are trained: a short budget on a slow machine, whose tier would have a
    smaller one, still trains on it)."""
    if init is not None:
        raise SettingError(
            "init_from",
            "a prepared corpus holds its own tokenizers, the saved model others; "
            "train from the corpus's file (--data FILE) to keep the model's vocabulary",
        )
    corpus = open_prepared(str(settings.data))
    config = prepared_settings(settings, corpus)
    if info.is_main:
        langs = [f"{language_name(c)} ({c})" if c else "not recorded"
                 for c in (config.src_lang, config.tgt_lang)]  # fmt: skip
        say(f"data: the prepared corpus {corpus.folder}, {corpus.n_train:,} training pairs; "
            f"languages: {langs[0]} -> {langs[1]}")  # fmt: skip
    tok = config.tokenize or bleu_tokenizer(config.tgt_lang)
    require(f"BLEU for {config.tgt_lang} (tokenize={tok})", tokenizer_modules(tok))
    run_cfg, preset = resolve_config(
        config,
        corpus.n_train,
        device=info.device.type,
        world_size=info.world_size,
        probe=probe if probe is not None else OneMeasurement(),
        vocab=corpus.manifest["resolved"].get("vocab_size"),
    )
    return (
        run_cfg,
        preset.to_dict() if preset is not None else None,
        prepared_run_data(run_cfg, corpus),
    )


def _resumed_data(
    settings: TrainConfig, resumed: Resumed
) -> tuple[TrainConfig, dict | None, RunData]:
    """A resumed run's resolved settings, preset and data (its saved split and tokenizers)."""
    ckpt, saved = resumed.checkpoint, resumed.saved
    try:
        prepared = PreparedSplit.describes(ckpt.split)
        split = PreparedSplit.from_dict(ckpt.split) if prepared else Split.from_dict(ckpt.split)
        toks = load_tokenizers(ckpt.path / TOKENIZERS)
    except (ValueError, KeyError, OSError) as e:
        raise CheckpointError(f"checkpoint: {str(ckpt.path)!r} is unusable: {e}") from None
    resolved = ckpt.trainer_state.get("resolved_config")
    try:
        if resolved:
            run_cfg = TrainConfig.from_dict(resolved)
        else:  # written before runs were planned: the schedule was the inverse square root
            old = "inverse_sqrt" if saved.schedule == "auto" else saved.schedule
            # and label smoothing was always the usual (a None is this version's "auto")
            given = saved.label_smoothing
            smoothing = LABEL_SMOOTHING if given is None else given
            run_cfg = saved.updated(
                {"schedule": old, "preset": "none", "label_smoothing": smoothing}
            )
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint: the resolved settings in {str(ckpt.path)!r} are invalid: {e}"
        ) from None
    # what may change on resume comes from the invocation; the rest is the run's own
    run_cfg = run_cfg.updated({k: getattr(settings, k) for k in sorted(RESUMABLE_KEYS)})
    langs = model_languages(read_json(ckpt.path, MODEL_CONFIG), ckpt.path)
    if langs is not None and not (run_cfg.src_lang and run_cfg.tgt_lang):
        # settings saved before they held the languages: the checkpoint's model records them
        run_cfg = run_cfg.updated({"src_lang": langs[0], "tgt_lang": langs[1]})
    if isinstance(split, PreparedSplit):
        corpus = open_prepared(str(run_cfg.data))
        if corpus.fingerprint != split.fingerprint:
            raise SettingError(
                "data",
                f"the prepared corpus {str(corpus.folder)!r} is not the one the run was "
                f"trained on (fingerprint {corpus.fingerprint}, the run's {split.fingerprint}): "
                f"{RESUME_REMEDY}",
            )
        return run_cfg, ckpt.trainer_state.get("preset"), prepared_run_data(run_cfg, corpus, toks)
    data = load_run_data(run_cfg, split=split, tokenizers=toks)
    return run_cfg, ckpt.trainer_state.get("preset"), data


# ---------------------------------------------------------------------------- the model
def length_limit(model: nn.Module, pair_limit: int) -> tuple[int, str]:
    """The longest pair (in tokens, ``<eos>`` counted) a run trains on: ``pair_limit`` (the
    run's ``max_pair_len`` setting), or the model's learned positional table when it is smaller
    (pairs longer than it could not be encoded: dropped before the first update, and counted),
    with its name."""
    table = min((n for n in position_limits(model) if n is not None), default=None)
    if table is not None and table < pair_limit:
        return table, f"the model's learned positions ({POSITION_SETTING}={table})"
    return pair_limit, f"max_pair_len={pair_limit}"


def _model(
    config: TrainConfig,
    data: RunData,
    resumed: Resumed | None,
    init: InitModel | None,
    device: torch.device,
) -> tuple[Seq2SeqConfig, EncoderDecoder]:
    """The architecture and the model, on ``device``: initialised from ``config.seed``, then
    the checkpoint's weights (resuming) or the ``init_from`` model's."""
    torch.manual_seed(config.seed)
    model_config = config.model_config(data.src_tokenizer.vocab_size, data.tgt_tokenizer.vocab_size)
    ckpt = resumed.checkpoint if resumed is not None else None
    if ckpt is not None and ckpt.model_config != model_config.to_dict():
        raise CheckpointError(
            f"checkpoint: model.json in {str(ckpt.path)!r} does not match the run's settings"
        )
    model = build_model(model_config)
    if ckpt is not None:
        load_model_weights(ckpt.path, model)
    elif init is not None:
        init.load_into(model)
    model.to(device)
    return model_config, model


def _special_ids(src: Tokenizer, tgt: Tokenizer) -> dict[str, int]:
    """The batches' padding, start and end ids: the target tokenizer's (qkv's 0, 1, 2; an
    imported Marian model's ``<pad>`` as padding and start, ``</s>`` as end). The source's end
    token is appended to every source: it must be the target's id.

    Raises:
        SettingError: the two tokenizers end a sentence with different ids (keyed
            ``init_from``: only an imported model's vocabularies can).
    """
    if src.eos_id != tgt.eos_id:
        raise SettingError(
            "init_from",
            f"the source vocabulary ends a sentence with id {src.eos_id} and the target's with "
            f"{tgt.eos_id}; qkv trains with one end id for both",
        )
    return {"pad_id": tgt.pad_id, "bos_id": tgt.bos_id, "eos_id": tgt.eos_id}


def _batches(
    config: TrainConfig, data: RunData, model: nn.Module, info: D.DistInfo
) -> tuple[TokenBatcher, TokenBatcher]:
    """This rank's training batches (pairs longer than :func:`length_limit` dropped; each
    epoch's segmentation sampled with ``subword_alpha``) and the validation split's batches
    (never sampled).

    Raises:
        ValueError: every training pair is too long.
    """
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
    if data.prepared is not None:  # the columns on disk: lengths read, tokens when padded
        src_ids, tgt_ids = data.prepared.src, data.prepared.tgt
        longest = np.maximum(src_ids.lengths, tgt_ids.lengths)
    else:
        src_ids, tgt_ids = encode_pairs(data.train, src_tok, tgt_tok, pre_normalized=True)
        longest = np.fromiter((max(len(a), len(b)) for a, b in zip(src_ids, tgt_ids)), np.int64)
    if config.max_tokens is None:  # pragma: no cover - resolve_config always sets it
        raise ValueError("max_tokens: expected a resolved token budget, got None")
    limit, why = length_limit(model, config.max_pair_len)
    kept = int(np.count_nonzero(longest < limit))  # with <eos>: longest + 1 <= limit
    del longest
    if kept == 0:
        raise SettingError(
            "data", f"every one of the {data.n_train} training pairs is longer than "
            f"{why} ({limit} tokens with <eos>); nothing to train on: raise it "
            f"({'--set max_pair_len=N' if limit == config.max_pair_len else '--set ' + POSITION_SETTING + '=N, or another pos_encoding'}) "
            "or check the data"
        )  # fmt: skip
    ids = _special_ids(src_tok, tgt_tok)
    batcher = TokenBatcher(
        src_ids,
        tgt_ids,
        max_tokens=config.max_tokens,
        max_pair_len=limit,
        shuffle=True,
        seed=config.seed,
        rank=info.rank,
        world_size=info.world_size,
        resample=epoch_sampler(config, data),
        **ids,
    )
    vs, vt = encode_pairs(data.valid, src_tok, tgt_tok, pre_normalized=True)
    valid_batches = TokenBatcher(
        vs,
        vt,
        max_tokens=max(config.max_tokens, 256),
        shuffle=False,
        rank=0,
        world_size=1,
        max_pair_len=max(limit, 2),
        truncate=True,
        **ids,
    )
    return batcher, valid_batches


def _build(
    config: TrainConfig,
    settings: TrainConfig,
    data: RunData,
    resumed: Resumed | None,
    init: InitModel | None,
    info: D.DistInfo,
    state: RunState,
) -> Setup:
    """The model, the batches, the optimizer and the schedule, in the order that draws the
    same random numbers on every start, with the run's ``state``."""
    model_config, model = _model(config, data, resumed, init, info.device)
    batcher, valid_batches = _batches(config, data, model, info)
    n_bleu = config.eval_sentences or len(data.valid)
    optimizer = make_optimizer(model, config)
    plan = Plan(config, timed=config.max_minutes is not None)
    limit = config.step_limit
    total = min(limit, FIRST_GUESS) if plan.timed else limit
    schedule = Schedule(
        optimizer,
        peak_lr=config.lr,
        kind=config.schedule,
        warmup_steps=plan.warmup(total),
        total_steps=total,
        min_lr_ratio=config.min_lr_ratio,
    )
    validation = ValidationSet(
        batches=valid_batches,
        pairs=data.valid[:n_bleu],
        references=data.raw_valid[:n_bleu],
        src_tokenizer=data.src_tokenizer,
        tgt_tokenizer=data.tgt_tokenizer,
        device=info.device,
        decoding=Decoding(beam_size=config.eval_beam, output_len_cap=config.max_pair_len),
        tokenize=config.tokenize or bleu_tokenizer(config.tgt_lang),
    )
    return Setup(
        config=config,
        settings=settings.to_dict(),
        data=data,
        model_config=model_config,
        model=model,
        batcher=batcher,
        optimizer=optimizer,
        schedule=schedule,
        validation=validation,
        plan=plan,
        state=state,
        resumed_from=resumed.checkpoint.path if resumed is not None else None,
        init=init,
    )


# ---------------------------------------------------------------------------- restoring
def _restore(setup: Setup, resumed: Resumed, layout: RunLayout, info: D.DistInfo) -> None:
    """Put the checkpoint's optimizer, schedule, data position, RNGs and run state back."""
    ckpt = resumed.checkpoint
    tensors = ckpt.tensors or {}
    try:
        setup.optimizer.load_state_dict(tensors["optimizer"])
        setup.schedule.load_state_dict(tensors["schedule"])
        rngs = tensors["rng"]
        setup.batcher.load_state_dict(ckpt.trainer_state["data"])
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise CheckpointError(
            f"checkpoint: the training state in {str(ckpt.path)!r} cannot be restored: {e}"
        ) from None
    if len(rngs) != info.world_size:
        raise CheckpointError(
            f"checkpoint: {str(ckpt.path)!r} was written by {len(rngs)} processes; resume "
            f"it with the same number (this run has {info.world_size})"
        )
    set_rng_state(rngs[info.rank], info.device)
    state = setup.state
    state.restore(ckpt.trainer_state)
    state.resolved_config = setup.config.to_dict()
    if info.is_main:
        repair_best_pointer(layout.checkpoints, state.best_step, state.best_bleu)


def _stopped_before(settings: TrainConfig, resumed: Resumed, stopped: str | None) -> bool:
    """Did the resumed run stop (``stopped``) for a reason that still holds with these
    settings?"""
    saved = resumed.saved
    return (
        stopped == "early_stopping"
        and saved.patience == settings.patience
        and saved.max_steps == settings.max_steps
    ) or (  # a run that used its time budget (the final evaluation and averaging included)
        stopped == "max_minutes" and saved.max_minutes == settings.max_minutes
    )


def prepare(
    settings: TrainConfig,
    resumed: Resumed | None,
    layout: RunLayout,
    info: D.DistInfo,
    *,
    init_from: str | Path | None = None,
    say: Say | None = None,
) -> Setup:
    """Everything before the first update, from the given ``settings`` (as :func:`open_run`
    returns them) and the checkpoint to resume (None: a new run, from ``init_from``'s weights
    when given): settings resolved, data, model, optimizer, schedule and run state, restored
    from the checkpoint or freshly seeded.

    Raises:
        ValueError: bad data, or settings that contradict the ``init_from`` model.
        CheckpointError: the checkpoint's state or the ``init_from`` model cannot be used.
    """
    init = load_init(init_from) if init_from is not None else None
    if resumed is not None:
        config, preset, data = _resumed_data(settings, resumed)
    else:
        config, preset, data = _new_run_data(settings, init, info, say or (lambda _m: None), layout)
    state = RunState(
        resolved_config=config.to_dict(),
        preset=preset,
        init_from=init.record() if init is not None else None,
    )
    setup = _build(config, settings, data, resumed, init, info, state)
    if resumed is not None:
        _restore(setup, resumed, layout, info)
    else:
        # dropout differs per rank; the weights were drawn from config.seed on every rank
        torch.manual_seed(config.seed * 1009 + 1 + info.rank)
    if resumed is not None and _stopped_before(settings, resumed, state.stopped):
        setup.stopped = state.stopped
    else:
        state.stopped = None
    if int(state.step) != setup.schedule.last_step:
        raise CheckpointError(
            f"checkpoint: inconsistent state (step {int(state.step)}, schedule "
            f"{setup.schedule.last_step})"
        )
    if not setup.plan.timed and setup.schedule.kind != "inverse_sqrt":
        # an update-bounded run ends at max_steps (which a resumed run may have changed)
        limit = config.step_limit
        setup.schedule.plan(total_steps=limit, warmup_steps=setup.plan.warmup(limit))
    return setup
