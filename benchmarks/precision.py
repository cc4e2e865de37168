"""Training updates in float32 against bfloat16 autocast on the CPU: what ``qkv train`` chooses.

Where the CPU computes in bfloat16 (AVX-512 BF16 or AMX, :func:`qkv.train.speed.native_bf16`),
``qkv train``'s speed probe measures the reference model both ways and trains under autocast
when that is ``BF16_GAIN`` times faster (:mod:`qkv.train.presets`). This benchmark measures the
same choice for every CPU tier's model, side by side in one process:

* **peer**: ``qkv.train.train_update`` in float32, the model of a tier of
  :data:`qkv.train.presets.TIERS` (its shape, its tokens per batch, its vocabulary for a
  20,000-pair corpus, tied embeddings, dropout 0.1), AdamW as ``qkv train`` builds it;
* **qkv**: the same update under bfloat16 autocast (``bf16=True``), a copy of the same model.

Each call is ``--updates`` updates on the same synthetic batches (sentences of 24 target tokens,
as the probe's). The ratio is float32's time over bfloat16's (> 1: bfloat16 is faster); on a
CPU without bfloat16 arithmetic torch emulates it and the ratio falls under 1, which is why
``qkv train`` only measures it where :func:`~qkv.train.speed.native_bf16` is true.

Run: ``python -m benchmarks.precision [--quick] [--repeats N] [--updates N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

import torch

from qkv.nn.seq2seq import build_model
from qkv.train import TrainConfig, make_optimizer, train_update
from qkv.train.presets import TIERS, tier_vocab
from qkv.train.schedules import Schedule
from qkv.train.speed import native_bf16, probe_batch

from .machine import gemm_rate
from .runner import Case, add_arguments, print_table, run_cases, write_json

#: the CPU tiers measured, smallest first
CPU_TIERS = ("cpu-micro", "cpu-tiny", "cpu-small", "cpu-minutes", "cpu-hour")
#: the corpus size the tiers' vocabularies are read for
PAIRS = 20_000


def _updates(tier: str, updates: int) -> tuple[Callable[[], None], Callable[[], None], int]:
    """``(float32 call, bfloat16 call, target tokens per call)`` for ``tier``'s model."""
    _, _, options, max_tokens, lr = TIERS[tier]
    vocab = tier_vocab(tier, PAIRS)
    torch.manual_seed(0)
    spec = {"kind": "transformer", "src_vocab_size": vocab, "tgt_vocab_size": vocab,
            "share_embeddings": True, "tie_embeddings": True, **options, "dropout": 0.1}  # fmt: skip
    base = build_model(spec).train()
    batches = [probe_batch(vocab, max_tokens, seed=i) for i in range(updates)]
    config = TrainConfig(lr=lr, clip_norm=1.0)

    def runner(bf16: bool) -> Callable[[], None]:
        model = copy.deepcopy(base)
        opt = make_optimizer(model, config)
        sched = Schedule(opt, peak_lr=lr, warmup_steps=10, kind="linear", total_steps=10**9)
        dev = torch.device("cpu")

        def call() -> None:
            for b in batches:
                train_update(model, opt, sched, [b], label_smoothing=0.1, clip_norm=1.0,
                             device=dev, bf16=bf16)  # fmt: skip

        return call

    tokens = sum(int(b.tgt_out.numel()) for b in batches)
    return runner(False), runner(True), tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--updates", type=int, default=5, help="updates per timed call (5)")
    args = ap.parse_args(argv)
    tiers = ("cpu-micro", "cpu-minutes") if args.quick else CPU_TIERS
    repeats = 3 if args.quick else args.repeats
    updates = 2 if args.quick else args.updates
    gemm = gemm_rate(torch.get_num_threads())
    native = native_bf16()
    print(f"fp32 GEMM {gemm:.1f} GFLOP/s on {torch.get_num_threads()} threads; bfloat16 "
          f"arithmetic on this CPU: {'yes' if native else 'no (torch emulates it)'}")  # fmt: skip
    cases, tokens = [], {}
    for tier in tiers:
        fp32, bf16, tokens[tier] = _updates(tier, updates)
        note = f"{updates} updates, {tokens[tier]} target tokens"
        cases.append(Case(tier, "float32", fp32, bf16, note=note))
    results = run_cases(cases, repeats=repeats, warmup=1, min_sample_ms=0)
    print_table(results, "training updates, CPU (ratio = float32 time / bfloat16 autocast time)")
    for r in results:
        n = tokens[r.name]
        print(f"{r.name}: float32 {n / r.peer_ms * 1e3:,.0f} tok/s, bfloat16 "
              f"{n / r.qkv_ms * 1e3:,.0f} tok/s, ratio {r.ratio:.2f}x")  # fmt: skip
    if args.json:
        write_json(results, args.json, {"gemm_fp32_gflops": round(gemm, 1), "native_bf16": native})


if __name__ == "__main__":
    main()
