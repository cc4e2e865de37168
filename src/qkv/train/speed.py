"""How fast this machine trains a model shape now: the speed probe behind the automatic preset.

:func:`measure_speed` builds a Transformer of the shape asked, and times the run's own update
(:func:`~qkv.train.update.train_update` with its fused AdamW, schedule and clipping: forward,
backward, optimizer step) on a synthetic batch of the planned token count (:func:`probe_batch`),
on the threads the run will use, in float32 or under bfloat16 autocast, for a bounded number of
seconds. The preset
(:mod:`qkv.train.presets`) sizes the model from what it measures instead of from a table of one
machine's speed, and trains under bfloat16 autocast where the CPU computes in it natively
(:func:`native_bf16`) and the probe measures it faster; tests pass a fake probe (any callable of
the same signature) to choose under speeds of their own.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from ..data import Batch
from ..nn.seq2seq import build_model
from .config import TrainConfig
from .schedules import Schedule
from .update import make_optimizer, train_update

__all__ = [
    "PROBE_SECONDS",
    "SpeedProbe",
    "measure_speed",
    "native_bf16",
    "probe_batch",
    "probe_seconds",
]

#: the seconds the probe takes, and its share of a timed budget when that is less (the chosen
#: tier's model may get a few seconds more within that share: presets.measure_tiers)
PROBE_SECONDS, PROBE_SHARE = 5.0, 0.02
#: the sentence length of the probe's synthetic batches (target tokens, ``<eos>`` counted): the
#: mean of a sentence-level corpus's subword lengths
PROBE_LENGTH = 24


class SpeedProbe(Protocol):
    """``probe(model_options, vocab_size, max_tokens, seconds, bf16=False) -> target tokens per
    second`` (``bf16``: the updates under bfloat16 autocast; passed only when true, so a probe
    without the keyword serves a CPU where bfloat16 is never measured)."""

    def __call__(
        self,
        model: dict[str, Any],
        vocab_size: int,
        max_tokens: int,
        seconds: float,
        *,
        bf16: bool = False,
    ) -> float: ...


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX-512 BF16 or AMX), where
    bfloat16 autocast can make an update faster; elsewhere torch emulates it, slower than
    float32. Measured on a 2-core AMD EPYC with AVX-512 BF16 (fp32 GEMM 218 GFLOP/s): a
    ``cpu-minutes`` update took 0.52 of its float32 time (``python -m benchmarks.precision``)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def probe_batch(vocab_size: int, max_tokens: int, seed: int = 0) -> Batch:
    """The probe's synthetic batch: ``max_tokens // PROBE_LENGTH`` sentence pairs (at least
    one) of :data:`PROBE_LENGTH` random ids in ``[4, vocab_size)`` a side, no padding (``src``,
    ``tgt_in``, ``tgt_out`` of shape ``(B, PROBE_LENGTH)``)."""
    gen = torch.Generator().manual_seed(seed)
    rows = max(1, max_tokens // PROBE_LENGTH)
    src = torch.randint(4, vocab_size, (rows, PROBE_LENGTH), generator=gen)
    tgt = torch.randint(4, vocab_size, (rows, PROBE_LENGTH + 1), generator=gen)
    lengths = torch.full((rows,), PROBE_LENGTH)
    return Batch(src=src, src_valid_lens=lengths, tgt_in=tgt[:, :-1], tgt_out=tgt[:, 1:],
                 tgt_valid_lens=lengths.clone(), indices=torch.arange(rows))  # fmt: skip


def probe_seconds(minutes: float | None) -> float:
    """The probe's time for a run of ``minutes`` (None: no clock): :data:`PROBE_SECONDS`, or
    :data:`PROBE_SHARE` of the budget when that is less."""
    if minutes is None:
        return PROBE_SECONDS
    return min(PROBE_SECONDS, PROBE_SHARE * minutes * 60)


def measure_speed(
    model: dict[str, Any],
    vocab_size: int,
    max_tokens: int,
    seconds: float,
    *,
    bf16: bool = False,
) -> float:
    """Target tokens per second of full training updates of a Transformer of ``model``'s
    options (a :class:`~qkv.nn.seq2seq.Seq2SeqConfig`'s, a joint ``vocab_size`` with tied
    embeddings) on batches of ``max_tokens`` positions a side (``B x PROBE_LENGTH`` each), on
    the CPU with torch's current threads, for about ``seconds`` (one untimed warm-up update
    first, then at least one timed one); ``bf16``: the forward pass under bfloat16 autocast, as
    :func:`qkv.train.update.train_update` runs it.

    Returns:
        tokens/s (a float > 0).
    """
    if seconds <= 0:
        raise ValueError(f"seconds: expected > 0, got {seconds!r}")
    options = {k: v for k, v in model.items() if k != "kind"}
    options.update(dropout=float(options.get("dropout", 0.1)))
    sizes = {"src_vocab_size": vocab_size, "tgt_vocab_size": vocab_size}
    tied = {"share_embeddings": True, "tie_embeddings": True}
    net = build_model({"kind": "transformer", **sizes, **tied, **options})
    net.train()
    # the run's own update: its optimizer (fused AdamW), schedule, clipping and precision
    config = TrainConfig(lr=1e-4)
    opt = make_optimizer(net, config)
    schedule = Schedule(opt, peak_lr=config.lr, warmup_steps=1, kind="linear", total_steps=10**9)
    batch = probe_batch(vocab_size, max_tokens)
    cpu = torch.device("cpu")

    def update() -> None:
        train_update(net, opt, schedule, [batch], label_smoothing=0.1,
                     clip_norm=config.clip_norm, device=cpu, bf16=bf16)  # fmt: skip

    t_start = time.monotonic()
    update()  # the first update allocates what the others reuse
    t0, done = time.monotonic(), 0
    deadline = t_start + seconds
    while done == 0 or time.monotonic() < deadline:
        update()
        done += 1
    took = max(time.monotonic() - t0, 1e-9)
    return done * batch.num_tokens / took
