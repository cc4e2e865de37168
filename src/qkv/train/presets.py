"""The automatic preset: model size, batch, vocabulary and learning rate from the corpus, the
time budget and the device.

Most users never change a setting, so ``qkv train --data X --max-minutes M`` must pick what a
practitioner would pick for ``X`` on this machine in ``M`` minutes. :func:`choose_preset` does it
from four facts: the number of training pairs, the budget (minutes, or updates when no clock is
set), the device type, and the number of processes. The table lives in :data:`TIERS` and in
``docs/train.md``; every value is a default only: a setting the user gave wins, key by key.

The numbers come from a sweep on a real 23k-pair English-French corpus (``benchmarks/real.py``;
the sweep is in the closing note of issue 11): on two CPU cores a 10-minute run makes a few
thousand small updates, and what wins there is *more updates*: a 2+2-layer pre-norm Transformer
(width 256) on batches of 512 tokens beat 3+3 and 4+4 layers and batches of 1,024-4,096 tokens
by 2-20 BLEU; a peak learning rate of 1.5e-3 beat 7e-4, 1e-3 and 2e-3 (3e-3 diverged); a 10%
warm-up and a linear decay to zero at the end of the budget beat cosine and the inverse square
root; dropout helps only once the data is seen many times (0.05 at ~10 epochs, 0.1-0.2 at ~35).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .speed import PROBE_SHARE, SpeedProbe, measure_speed, native_bf16, probe_seconds
from .tiers import TIERS, transformer_shape

__all__ = [
    "BF16_GAIN",
    "FEW_EPOCHS",
    "FINE_TUNING_LR",
    "LABEL_SMOOTHING",
    "MAX_EPOCHS",
    "REFERENCE_TIER",
    "TIERS",
    "VOCAB_CAPS",
    "OneMeasurement",
    "Preset",
    "Speed",
    "choose_preset",
    "cost_per_token",
    "estimated_speed",
    "label_smoothing_for",
    "measure_tiers",
    "tier_vocab",
    "vocab_size_for",
]

#: the peak learning rate of a run that starts from a trained model's weights (``init_from``,
#: an imported model): an order of magnitude under a from-scratch run's, so the model moves
#: towards the new data without forgetting what it knew (``benchmarks/finetune.py`` measured
#: it against 3e-5 and 3e-4 on an imported Marian model)
FINE_TUNING_LR = 1e-4

#: the label smoothing of a run that sees its data often enough (Szegedy et al. 2016, the
#: Transformer's 0.1), of fine-tuning, and of a run with no preset
LABEL_SMOOTHING = 0.1


@dataclass(frozen=True)
class Preset:
    """What the automatic preset chose, and why.

    Attributes:
        name: the tier's name (``"cpu-minutes"``, ...).
        model: :class:`qkv.nn.Seq2SeqConfig` options.
        max_tokens: padded positions per micro-batch per process.
        lr: peak learning rate.
        vocab_size: subword vocabulary size (joint SentencePiece).
        reason: one sentence for the run's first lines.
        notes: extra remarks (a small corpus, a model shrunk to fit it, ...).
        label_smoothing: epsilon of the training loss (:func:`label_smoothing_for`).
        speed: target tokens per second the choice assumed (measured, or the reference
            machine's); None: not known (a run bounded by updates only).
        updates: the updates the budget allows at that speed (None: not known).
        reference_speed: the reference tier's tokens/s as the probe measured it on this
            machine now (None: not measured), what says whether the machine was slow or busy.
    """

    name: str
    model: dict[str, Any]
    max_tokens: int
    lr: float
    vocab_size: int
    reason: str
    notes: tuple[str, ...] = field(default=())
    label_smoothing: float = LABEL_SMOOTHING
    speed: float | None = None
    updates: int | None = None
    reference_speed: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": dict(self.model),
            "max_tokens": self.max_tokens,
            "lr": self.lr,
            "vocab_size": self.vocab_size,
            "reason": self.reason,
            "notes": list(self.notes),
            "label_smoothing": self.label_smoothing,
            "speed": self.speed,
            "updates": self.updates,
            "reference_speed": self.reference_speed,
        }


@dataclass(frozen=True)
class Speed:
    """What the speed probe measured: target tokens per second of a tier's model on this
    machine now, per tier name, on ``threads`` threads; ``bf16``: measured (and to be trained)
    under bfloat16 autocast, which the probe found faster here than float32."""

    tokens_per_s: dict[str, float]
    threads: int
    bf16: bool = False

    def describe(self, tier: str, tokens_per_s: float | None = None) -> str:
        """``"measured 5,300 tokens/s on 2 threads"`` (the tier's; ``"... on 2 threads in
        bfloat16"`` under autocast); for a tier not measured, ``tokens_per_s`` (its estimate)
        and the reference's measurement it comes from."""
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        threads += " in bfloat16" if self.bf16 else ""
        if tier in self.tokens_per_s or tokens_per_s is None:
            name = tier if tier in self.tokens_per_s else REFERENCE_TIER
            return f"measured {self.tokens_per_s[name]:,.0f} tokens/s on {threads}"
        ref = self.tokens_per_s[REFERENCE_TIER]
        return (
            f"an estimated {tokens_per_s:,.0f} tokens/s (measured {ref:,.0f} tokens/s for the "
            f"{REFERENCE_TIER} model on {threads})"
        )


#: a run bounded by updates only is sized as if one update took this many seconds
_SECONDS_PER_UPDATE = {"cpu": 0.5, "cuda": 0.15}
#: target tokens per second a tier's model trains at on the reference machine (2 CPU threads
#: of ~170 GFLOP/s fp32 GEMM; one recent GPU): the speed the tiers' bounds assume, and what the
#: probe's measurement of the reference tier is compared with; and target tokens per training
#: pair, to guess how many epochs a budget allows
_TOKENS_PER_SECOND = {"cpu": 3000.0, "cuda": 60000.0}
_TOKENS_PER_PAIR = 10.0
#: a measured speed under this many times the reference's counts as the reference's
_FASTER = 1.5
#: the most epochs (estimated from the tier's speed) a budget may show the corpus to a tier's
#: model: beyond, capacity limits it, not updates, and the next tier is chosen. Measured:
#: cpu-tiny won at 24 estimated epochs (18,638 pairs, 5 minutes: 16.4 BLEU against cpu-small's
#: 10.7) and lost at 91 (3,483 pairs, 5 minutes: 23.3 against 30.0); 40 lies between, on a log
#: scale
MAX_EPOCHS = {"cpu-micro": 40.0, "cpu-tiny": 40.0}
#: below this many epochs (estimated from the budget, as the preset line prints them) a run
#: regularises nothing: no dropout, no label smoothing. A model that sees its data a few times
#: has not fitted it yet; both slow its learning, and dropout's random masks cost 8% of an update.
#: Measured on benchmarks/real.py's corpora, the same updates with and without (test BLEU and
#: chrF of one run per seed): cpu-micro on English-German, 2,560 updates (the busy 3-minute run,
#: estimated 6 epochs): with dropout 0.05 and smoothing 0.1 8.38 and 7.63 (chrF 30.1, 30.5),
#: without 9.58 and 9.69 (33.6, 33.7), and 13-18% more updates a minute; cpu-minutes, the
#: 10-minute runs (estimated 8 epochs): English-German 2,798 updates 27.79 without against
#: 26.96 with, English-French 2,749 updates 36.47 against 37.59: a point either way at the
#: same updates, and 8% more updates a minute without dropout's masks; a 30-minute run
#: (estimated 18) keeps both
FEW_EPOCHS = 10.0
#: the largest vocabulary of the smallest tiers: few updates train few embeddings well (a
#: 1,000-piece vocabulary scored 2.2 BLEU where 2,000 scored 4.8, the 3-minute busy run)
VOCAB_CAPS = {"cpu-micro": 2_000, "cpu-tiny": 2_000, "cpu-small": 4_000}
#: the share of a timed budget that trains (the rest validates, saves and chooses the final
#: model), to guess the updates a run will make
_TRAINING_SHARE = 0.85
#: the updates (a warm-up and the timed ones) the speed probe gives the chosen tier's model
#: when the probe's own seconds are spent, in at least CHOSEN_MIN and at most CHOSEN_SECONDS
#: more, within the budget's share or at most CHOSEN_GRACE (:func:`measure_tiers`): a tier
#: whose updates are slower keeps its estimate. The grace is for short budgets: the
#: reference model's first measurement takes 2-4 s where a 2-minute budget's probe has 2.4
#: (building the model, torch's threads starting: measured 4.2 s for 2 asked), and the
#: chosen small model's few updates a fraction of a second more
CHOSEN_UPDATES, CHOSEN_MIN, CHOSEN_SECONDS, CHOSEN_GRACE = 5, 0.5, 10.0, 1.0
#: the tier whose model the speed probe measures first (the reference machine's tiers are
#: bounded by its speed)
REFERENCE_TIER = "cpu-minutes"
#: a run trains under bfloat16 autocast when the probe measures the reference model at least
#: this many times faster in it than in float32 (only on a CPU with bfloat16 arithmetic,
#: :func:`qkv.train.speed.native_bf16`: elsewhere torch emulates it, slower). Measured on a
#: 2-core AMD EPYC with AVX-512 BF16 (fp32 GEMM 218 GFLOP/s): 1.25 (cpu-micro) to 2.07
#: (cpu-hour) times float32's speed (benchmarks/results/precision.json), and on
#: benchmarks/real.py's English-French 10-minute run (scaled to 8.2 minutes by the GEMM rate)
#: 6,317 updates against 3,623, test BLEU 41.93 against 37.57 (docs/train.md); the margin
#: keeps a gain within the probe's noise from choosing it
BF16_GAIN = 1.15


def speed_factor(tokens_per_s: float, kind: str = "cpu") -> float:
    """How many minutes of the reference machine one minute here is worth, from the reference
    tier's measured ``tokens_per_s``: the ratio to :data:`_TOKENS_PER_SECOND`, except that a
    machine up to :data:`_FASTER` times faster counts as the reference (the probe's noise must
    not move a quiet reference machine to a larger tier)."""
    factor = tokens_per_s / _TOKENS_PER_SECOND[kind]
    return 1.0 if 1.0 < factor < _FASTER else factor


def dropout_for(epochs: float) -> float:
    """Dropout for a run that will see its data about ``epochs`` times: regularise only what
    repeats (measured: none below :data:`FEW_EPOCHS`, 0.05 best at ~10 epochs, 0.1-0.2 at ~35;
    0.2 cost 8 BLEU at ~10)."""
    if epochs < FEW_EPOCHS:
        return 0.0
    if epochs < 15:
        return 0.05
    if epochs < 60:
        return 0.1
    return 0.2


def label_smoothing_for(epochs: float) -> float:
    """Label smoothing for a run that will see its data about ``epochs`` times: none below
    :data:`FEW_EPOCHS` (a model that has not fitted its data yet has no over-confidence to
    correct, and a smoothed target slows its learning), else the usual 0.1."""
    return 0.0 if epochs < FEW_EPOCHS else LABEL_SMOOTHING


def vocab_size_for(n_pairs: int) -> int:
    """The joint subword vocabulary for ``n_pairs`` training pairs: small corpora get small
    vocabularies (every piece must be seen often enough to be learned)."""
    if n_pairs < 2_000:
        return 1_000
    if n_pairs < 10_000:
        return 4_000
    if n_pairs < 100_000:
        return 8_000
    if n_pairs < 1_000_000:
        return 16_000
    return 32_000


def tier_vocab(tier: str, n_pairs: int) -> int:
    """The joint vocabulary of ``tier``'s preset for ``n_pairs`` training pairs: the corpus's
    (:func:`vocab_size_for`), at most the tier's cap (:data:`VOCAB_CAPS`)."""
    return min(vocab_size_for(n_pairs), VOCAB_CAPS.get(tier, vocab_size_for(n_pairs)))


def cost_per_token(tier: str, n_pairs: int) -> int:
    """Multiply-adds per target token of ``tier``'s model in a forward pass (as many source
    tokens as target ones; the backward pass is a constant multiple): its layers' matrix
    products and the output layer over the tier's vocabulary for ``n_pairs`` pairs. What a CPU's
    speed is inversely proportional to, to estimate a tier the probe did not measure."""
    m = TIERS[tier][2]
    d, f = m["num_hiddens"], m["ffn_num_hiddens"]
    enc = m["num_enc_layers"] * (4 * d * d + 2 * d * f)
    dec = m["num_dec_layers"] * (8 * d * d + 2 * d * f)  # self- and cross-attention
    return enc + dec + d * tier_vocab(tier, n_pairs)


def estimated_speed(tokens_per_s: dict[str, float], tier: str, n_pairs: int) -> float:
    """``tier``'s tokens/s on this machine from ``tokens_per_s`` (tier name -> measured, the
    reference tier's at least): as measured, else the reference tier's scaled by their
    :func:`cost_per_token` (an estimate: a small model's fixed costs per operation make it a
    little slower than that, measured 0.6-0.9 of it)."""
    if tier in tokens_per_s:
        return tokens_per_s[tier]
    ref = tokens_per_s[REFERENCE_TIER]
    return ref * cost_per_token(REFERENCE_TIER, n_pairs) / cost_per_token(tier, n_pairs)


def choose_preset(
    n_pairs: int,
    *,
    minutes: float | None,
    max_steps: int | None,
    device: str = "cpu",
    world_size: int = 1,
    tier: str | None = None,
    speed: Speed | None = None,
) -> Preset:
    """The preset for a run of ``n_pairs`` training pairs.

    Args:
        n_pairs: training pairs (after the split).
        minutes: the run's time budget, or None.
        max_steps: the run's update budget, or None.
        device: ``"cpu"`` or ``"cuda"`` (any other device type is sized as a CPU).
        world_size: processes training together (their throughput adds up).
        tier: a name of :data:`TIERS` to use instead of choosing one (a small corpus still
            shrinks it).
        speed: what the probe measured on this machine now (:func:`measure_tiers`): the
            budget counts in minutes of the reference machine, scaled by the reference tier's
            measured speed; None: this machine is taken as the reference.

    Returns:
        A :class:`Preset`.
    """
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs < 1:
        raise ValueError(f"n_pairs: expected an int >= 1, got {n_pairs!r}")
    kind = "cuda" if device == "cuda" else "cpu"
    if minutes is not None:
        budget, how = float(minutes), f"a {minutes:g}-minute budget"
    elif max_steps is not None:
        budget = max_steps * _SECONDS_PER_UPDATE[kind] / 60
        how = f"{max_steps} updates (about {budget:.0f} minutes on this device type)"
    else:
        budget, how = float("inf"), "no budget"
    # several processes do the work of several devices in the same minutes
    effective = budget * max(world_size, 1)
    if speed is not None and REFERENCE_TIER in speed.tokens_per_s:
        effective *= speed_factor(speed.tokens_per_s[REFERENCE_TIER], kind)
    notes: list[str] = []
    seconds = budget * 60 * max(world_size, 1)
    measured = speed.tokens_per_s if speed is not None and speed.tokens_per_s else {}
    pair_tokens = max(n_pairs * _TOKENS_PER_PAIR, 1.0)  # target tokens of one epoch
    if tier is not None:
        if tier not in TIERS:
            raise ValueError(f"tier: expected one of {tuple(TIERS)}, got {tier!r}")
        name = tier
    else:
        # the first tier of this device whose bound holds the budget, unless the budget would
        # show the corpus to its model more often than its capacity can use (MAX_EPOCHS)
        at = measured or {REFERENCE_TIER: _TOKENS_PER_SECOND[kind]}
        fits = [
            n for n, (dev, bound, *_rest) in TIERS.items() if dev == kind and effective <= bound
        ]
        name = fits[-1]  # the largest that fits, when every other shows the corpus too often
        for n in fits:
            seen = seconds * estimated_speed(at, n, n_pairs) / pair_tokens
            if seen <= MAX_EPOCHS.get(n, math.inf):
                name = n
                break
            notes.append(f"this budget shows the {n_pairs} training pairs about {seen:.0f} "
                         f"times to {n}'s model: a larger one instead")  # fmt: skip
    _, _, model, max_tokens, lr = TIERS[name]
    model = dict(model)
    tps = estimated_speed(measured, name, n_pairs) if measured else _TOKENS_PER_SECOND[kind]
    epochs = seconds * tps / pair_tokens
    # bounded by updates (or by nothing): the updates are known; else what the speed fits
    timed = minutes is not None
    updates = int(_TRAINING_SHARE * seconds * tps / max_tokens) if timed else max_steps
    model["dropout"], smoothing = dropout_for(epochs), label_smoothing_for(epochs)
    # a small corpus cannot feed a large model: cap it, and regularise more
    if n_pairs < 5_000 and (model["num_hiddens"] > 256 or model["num_enc_layers"] > 2):
        model.update(transformer_shape(256, 1024, 4, 2), dropout=max(model["dropout"], 0.1))
        smoothing = LABEL_SMOOTHING
        max_tokens = min(max_tokens, 1024)
        notes.append(
            f"the corpus has only {n_pairs} training pairs: a 2+2-layer, 256-wide model on "
            f"{max_tokens}-token batches instead of the tier's"
        )
    elif n_pairs < 50_000 and model["num_hiddens"] > 256:
        model.update(transformer_shape(256, 1024, 4, model["num_enc_layers"]))
        notes.append(f"{n_pairs} training pairs: width 256 instead of the tier's")
    vocab = tier_vocab(name, n_pairs)
    assumed = speed.describe(name, tps) if speed is not None else None
    if minutes is not None:
        how += f" (about {updates:,} updates at {assumed or f'{tps:,.0f} tokens/s'})"
    reason = (
        f"preset {name}: {n_pairs} training pairs, {how}, device {kind}"
        + (f" x {world_size}" if world_size > 1 else "")
        + f" -> {model['num_enc_layers']}+{model['num_dec_layers']}-layer pre-norm Transformer, "
        f"width {model['num_hiddens']}, dropout {model['dropout']:g} and label smoothing "
        f"{smoothing:g} (about {epochs:.1f} epochs), {max_tokens} tokens per batch, peak lr "
        f"{lr:g}, joint SentencePiece vocabulary of up to {vocab}"
    )
    reference = speed.tokens_per_s.get(REFERENCE_TIER) if speed is not None else None
    return Preset(name, model, max_tokens, lr, vocab, reason, tuple(notes),
                  label_smoothing=smoothing, speed=tps if minutes is not None else None,
                  updates=updates, reference_speed=reference)  # fmt: skip


def measure_tiers(
    n_pairs: int,
    minutes: float,
    probe: SpeedProbe,
    *,
    seconds: float | None = None,
    vocab: int | None = None,
    bf16: bool | None = False,
) -> Speed:
    """Measure the speed of this machine now for the preset of a ``minutes`` budget: the
    reference tier's model first, then the model of the tier that speed chooses, with
    ``probe`` (:func:`qkv.train.speed.measure_speed`, or a test's fake) in
    :func:`~qkv.train.speed.probe_seconds` in all (``seconds`` overrides it). The reference
    model, which measures the machine against the reference one, has its tier's vocabulary;
    the chosen model has ``vocab`` when given (the one the data has already: a prepared
    corpus's, or the user's), the vocabulary the run will train. ``bf16``: measure in float32
    (False), under bfloat16 autocast (True), or None: the reference model in both, half its
    time each, and the rest in bfloat16 when that was :data:`BF16_GAIN` times faster
    (:attr:`Speed.bf16` says which).

    The chosen model gets the time of :data:`CHOSEN_UPDATES` of its updates (estimated from the
    reference's speed; :data:`CHOSEN_MIN` to :data:`CHOSEN_SECONDS`) even past those seconds,
    within :data:`~qkv.train.speed.PROBE_SHARE` of the budget, or at most
    :data:`CHOSEN_GRACE` (``seconds`` given: within those), and only when that holds three of
    them: the estimate scaled by :func:`cost_per_token` misses what an update costs
    beyond its products, and the plan's epochs (hence dropout and label smoothing) come from
    this speed. Measured on benchmarks/real.py's corpora on a GEMM-67 machine: a 74-minute
    English-French budget, cpu-hour estimated at 839 tokens/s from cpu-minutes' 1,108, its run
    made 4,737 updates where 3,090 were planned (measured: 965 tokens/s, 3,556 planned); a
    2-minute English-Chinese budget, cpu-micro estimated at 9,542 tokens/s, its run made 2,084
    updates where 3,801 were planned (the probe reads 5,000-5,200 for it)."""
    total = probe_seconds(minutes) if seconds is None else seconds
    room = PROBE_SHARE * minutes * 60 if seconds is None else total
    grace = CHOSEN_GRACE if seconds is None else 0.0
    t0 = time.monotonic()

    def measure(tier: str, share: float, size: int, half: bool) -> float:
        _, _, model, max_tokens, _ = TIERS[tier]
        # bf16 only when asked: a probe of the plain four-argument form still measures float32
        extra = {"bf16": True} if half else {}
        return float(probe(dict(model, dropout=0.1), size, max_tokens, share, **extra))

    first, size = 0.6 * total, tier_vocab(REFERENCE_TIER, n_pairs)
    if bf16 is None:  # both precisions, the faster one kept
        single = measure(REFERENCE_TIER, first / 2, size, False)
        halved = measure(REFERENCE_TIER, first / 2, size, True)
        bf16 = halved >= BF16_GAIN * single
        reference = halved if bf16 else single
    else:
        reference = measure(REFERENCE_TIER, first, size, bf16)
    speed = Speed({REFERENCE_TIER: reference}, torch.get_num_threads(), bf16)
    chosen = choose_preset(n_pairs, minutes=minutes, max_steps=None, speed=speed).name
    used = max(time.monotonic() - t0, first)
    per_update = TIERS[chosen][3] / max(estimated_speed(speed.tokens_per_s, chosen, n_pairs), 1e-9)
    # the chosen model's own speed: the seconds left, or those of a few of its updates when
    # the budget's share holds them, or the grace does (the reference's measurement ran over)
    want = min(max(CHOSEN_UPDATES * per_update, CHOSEN_MIN), CHOSEN_SECONDS)
    left = max(total - used, min(want, max(room - used, grace)))
    if chosen != REFERENCE_TIER and left > 3 * per_update:
        size = tier_vocab(chosen, n_pairs) if vocab is None else vocab
        speed.tokens_per_s[chosen] = measure(chosen, left, size, bf16)
    return speed


class OneMeasurement:
    """This machine's speed measured once (:func:`measure_tiers`) for a run that resolves its
    preset twice: a run that prepares its data file sizes the prepared vocabulary by the preset
    (:func:`qkv.train.corpus.prepare_corpus`), then chooses its preset from the prepared
    corpus; both get the one measurement (the probe's share of the budget spent once, one
    choice). Pass it as :func:`resolve_config`'s ``probe``; ``probe`` here: what measures
    (None: :func:`~qkv.train.speed.measure_speed`, looked up when first asked)."""

    def __init__(self, probe: SpeedProbe | None = None) -> None:
        self.probe = probe
        self.speeds: dict[tuple[int, float, bool | None], Speed] = {}

    def measure(
        self, n_pairs: int, minutes: float, vocab: int | None = None, bf16: bool | None = False
    ) -> Speed:
        """:func:`measure_tiers` of ``n_pairs``, ``minutes`` and ``bf16``, measured the first
        time (with that call's ``vocab``: a run that prepares its file asks first for the
        corpus it sizes, then with the vocabulary that measurement gave it)."""
        key = (n_pairs, float(minutes), bf16)
        if key not in self.speeds:
            probe = self.probe if self.probe is not None else measure_speed
            self.speeds[key] = measure_tiers(n_pairs, minutes, probe, vocab=vocab, bf16=bf16)
        return self.speeds[key]


def _speed(
    config: Any,
    n_pairs: int,
    probe: SpeedProbe | OneMeasurement | None,
    vocab: int | None,
    measured: bool,
) -> Speed | None:
    """:func:`resolve_config`'s measurement: None unless ``measured`` (a CPU run of one
    process, not a fine-tuning), the preset is chosen (``auto``) for a timed run whose model's
    shape is not the user's, and a ``probe`` is given. The precision measured is the run's
    (``config.bf16``), or when that is None (automatic) both where the CPU has bfloat16
    arithmetic (:func:`~qkv.train.speed.native_bf16`), else float32."""
    shape = {"num_hiddens", "num_enc_layers", "num_dec_layers", "ffn_num_hiddens"}
    if (
        not measured
        or probe is None
        or config.preset != "auto"
        or config.max_minutes is None
        or shape & set(config.model_options)
    ):
        return None
    bf16 = config.bf16 if config.bf16 is not None else (None if native_bf16() else False)
    if isinstance(probe, OneMeasurement):
        return probe.measure(n_pairs, config.max_minutes, vocab, bf16)
    return measure_tiers(n_pairs, config.max_minutes, probe, vocab=vocab, bf16=bf16)


def resolve_config(
    config: Any,
    n_pairs: int,
    *,
    device: str = "cpu",
    world_size: int = 1,
    fine_tuning: bool = False,
    probe: SpeedProbe | OneMeasurement | None = measure_speed,
    vocab: int | None = None,
) -> tuple[Any, Preset | None]:
    """``config`` (a :class:`qkv.train.TrainConfig`) with its automatic settings decided.

    ``normalizer``/``tokenizer``/``joint_vocab`` follow the data (real text for a user's file,
    the book's for the bundled corpus); ``vocab_size``, ``max_tokens``, ``lr``,
    ``label_smoothing`` and the model options the user did not give come from
    :func:`choose_preset` (Transformer runs only; ``label_smoothing`` is 0.1 with no preset and
    for fine-tuning);
    ``schedule="auto"`` becomes ``"linear"``, ``bf16=None`` the probe's choice (:class:`Speed`;
    False where nothing is measured). ``warmup_steps``, ``eval_every`` and ``save_every`` stay
    None when not given: the loop sets them from the run's planned length.
    ``fine_tuning`` (a run from a trained model's weights, whose model options are set
    already): the peak learning rate is :data:`FINE_TUNING_LR` unless given. ``probe``
    measures this machine's speed first (:func:`measure_tiers`) when the preset is chosen
    (``preset="auto"``) for a timed CPU run of one process whose model is not the user's or a
    saved one's; None never measures (the reference machine's speed is assumed); a
    :class:`OneMeasurement` measures once for all the calls it is given to. ``vocab``: the
    vocabulary size the data has already (a prepared corpus's tokenizers), kept instead of the
    preset's unless ``config`` gives one (its preset's notes say so).

    Returns:
        ``(resolved config, the preset or None)``.
    """
    changes: dict[str, Any] = {}
    bundled = config.data is None
    if config.normalizer == "auto":
        changes["normalizer"] = "book" if bundled else "plain"
    user_model = config.tokenizer_model  # the user's SentencePiece model (or one per side)
    if config.tokenizer == "auto":
        changes["tokenizer"] = "word" if bundled and user_model is None else "sentencepiece"
    tokenizer = changes.get("tokenizer", config.tokenizer)
    if config.joint_vocab is None:
        changes["joint_vocab"] = isinstance(user_model, str) or (
            user_model is None and tokenizer == "sentencepiece"
        )
    joint = changes.get("joint_vocab", config.joint_vocab)
    if config.schedule == "auto":
        changes["schedule"] = "linear"
    preset, speed = None, None
    if config.preset != "none" and config.model != "transformer":
        # the tiers are tuned for the Transformer: another model keeps its own defaults and
        # gets only the vocabulary sized to the corpus
        if config.vocab_size is None:
            changes["vocab_size"] = vocab_size_for(n_pairs)
    elif config.preset != "none":
        fixed = vocab if config.vocab_size is None else config.vocab_size
        measured = device != "cuda" and world_size == 1 and not fine_tuning
        speed = _speed(config, n_pairs, probe, fixed, measured)
        preset = choose_preset(
            n_pairs,
            minutes=config.max_minutes,
            max_steps=config.step_limit if config.max_minutes is None else config.max_steps,
            device=device,
            world_size=world_size,
            tier=None if config.preset == "auto" else config.preset,
            speed=speed,
        )
    options = dict(config.model_options)
    if preset is not None:
        given = [
            k
            for k in ("vocab_size", "max_tokens", "lr", "label_smoothing")
            if getattr(config, k) is not None
        ]
        given += [f"model.{k}" for k in preset.model if k in config.model_options]
        if given:
            preset = dataclasses.replace(
                preset, notes=(*preset.notes, f"your settings win: {', '.join(given)}")
            )
        if config.vocab_size is None and vocab is not None and vocab != preset.vocab_size:
            tier = f"the tier's: {preset.vocab_size}"
            if vocab > preset.vocab_size and config.max_minutes is not None and world_size == 1:
                named = f" --preset {config.preset}" if config.preset != "auto" else ""
                tier += (
                    f", which qkv prepare --max-minutes {config.max_minutes:g}{named} gives a "
                    "corpus"
                )
            kept = f"the data's vocab_size {vocab} kept ({tier})"
            preset = dataclasses.replace(preset, notes=(*preset.notes, kept))
        if config.vocab_size is None:
            changes["vocab_size"] = preset.vocab_size if vocab is None else vocab
        if config.max_tokens is None:
            changes["max_tokens"] = preset.max_tokens
        if config.lr is None:
            changes["lr"] = FINE_TUNING_LR if fine_tuning else preset.lr
        if config.label_smoothing is None and not fine_tuning:
            changes["label_smoothing"] = preset.label_smoothing
        if config.model == "transformer":
            for key, value in preset.model.items():
                options.setdefault(key, value)
    if joint and tokenizer == "sentencepiece":
        # one vocabulary: one embedding table for both sides and the output layer (Press & Wolf)
        options.setdefault("share_embeddings", True)
        options.setdefault("tie_embeddings", config.model == "transformer")
    changes["model_options"] = options
    defaults = {
        "vocab_size": 8000,
        "max_tokens": 4096,
        "lr": 1e-3,
        "label_smoothing": LABEL_SMOOTHING,
    }
    for key, value in defaults.items():  # preset "none": the plain defaults
        if getattr(config, key) is None and key not in changes:
            changes[key] = value
    if user_model is not None:  # the user's SentencePiece model has its vocabulary
        changes.pop("vocab_size", None)
    if config.bf16 is None:  # automatic: bfloat16 autocast where the probe found it faster
        changes["bf16"] = speed is not None and speed.bf16
    resolved = config.updated(changes)
    # updated() merges model options, so the explicit ones are still there
    return resolved, preset
